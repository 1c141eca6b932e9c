/**
 * A local P/D deployment: N prefill and M decode instances (default 1 and 1) as separate `handoff
 * serve` processes on free loopback ports (tcp transport), and the proxy in this process. `handoff up`
 * and `handoff bench serve` use it.
 */
import net from 'node:net';
import { assert, rethrowIfAssertion } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import { HandoffError, listenFailed } from '../util/errors.ts';
import type { Logger } from '../util/log.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from '../serve/proxy.ts';
import type { RoutingPolicy } from '../serve/instance_pool.ts';
import type { KvRouterOptions } from '../serve/kv_router.ts';
import { spawnHandoff, type ChildServer } from './children.ts';

export interface ClusterOptions {
  preset: ModelPreset;
  mode: 'read' | 'write';
  /** READ mode: decode loads asynchronously (kv_connector_extra_config.async_read; default true). */
  asyncRead?: boolean;
  host: string;
  /** Proxy port (0 = a free one). */
  proxyPort: number;
  policy?: RoutingPolicy;
  /** kv-aware scoring. */
  router?: KvRouterOptions;
  /** Instances per role (default 1 each). */
  numPrefill?: number;
  numDecode?: number;
  /** Extra `handoff serve` flags for both instances (e.g. --num-blocks). */
  serveArgs?: string[];
  /** Extra `handoff serve` flags for one role (e.g. its --block-size, --tensor-parallel-size), after serveArgs. */
  roleServeArgs?: { prefill?: string[]; decode?: string[] };
  apiKey?: string | null;
  log?: Logger;
  readyTimeoutMs?: number;
  /** HANDOFF_LOG_LEVEL of the instances (default: inherited). */
  childLogLevel?: string;
}

export interface LocalCluster {
  proxyUrl: string;
  /** The first prefill and decode (1P1D: the only ones). */
  prefill: ChildServer;
  decode: ChildServer;
  prefills: ChildServer[];
  decodes: ChildServer[];
  proxy: Proxy;
  stop(): Promise<void>;
}

/** A role's kv_transfer_config; a READ-mode decode names its loads (async_read) either way. */
export function kvTransferConfigFor(role: 'prefill' | 'decode', mode: 'read' | 'write', asyncRead = true): string {
  const extra = {
    read_mode: mode === 'read',
    ...(mode === 'read' && role === 'decode' ? { async_read: asyncRead } : {}),
  };
  return JSON.stringify({
    kv_connector: 'OneSidedConnector',
    kv_role: role === 'prefill' ? 'kv_producer' : 'kv_consumer',
    kv_connector_extra_config: extra,
  });
}

export function serveArgs(
  role: 'prefill' | 'decode' | 'both',
  o: Pick<ClusterOptions, 'preset' | 'mode' | 'host' | 'serveArgs' | 'roleServeArgs' | 'apiKey' | 'asyncRead'>,
): string[] {
  const own = role === 'both' ? [] : (o.roleServeArgs?.[role] ?? []);
  const args = [
    'serve',
    '--role',
    role,
    '--model',
    o.preset,
    '--host',
    o.host,
    '--port',
    '0',
    ...(o.serveArgs ?? []),
    ...own,
  ];
  if (role !== 'both') args.push('--kv-transfer-config', kvTransferConfigFor(role, o.mode, o.asyncRead));
  if (o.apiKey) args.push('--api-key', o.apiKey);
  return args;
}

/** Poll until the proxy sees every instance healthy (bounded; `checkChildren` throws once one died). */
async function waitHealthy(proxy: Proxy, env: Env, timeoutMs: number, checkChildren: () => void): Promise<void> {
  const deadline = env.nowMs() + timeoutMs;
  for (;;) {
    checkChildren();
    await proxy.checkHealth();
    if (
      proxy.prefill.numHealthy === proxy.prefill.members.length &&
      proxy.decode.numHealthy === proxy.decode.members.length
    )
      return;
    if (env.nowMs() > deadline) {
      const why = [...proxy.prefill.members, ...proxy.decode.members]
        .map((m) => `${m.url}: ${m.lastError ?? 'ok'}`)
        .join('; ');
      throw new HandoffError('PEER_UNAVAILABLE', `instances not healthy after ${timeoutMs} ms (${why})`);
    }
    await env.sleep(100);
  }
}

/**
 * Fail fast with `port P on HOST is already in use` when the proxy's port is taken, before any child
 * starts (a free port can still be taken before the proxy binds it; then the proxy's listen says so).
 */
export function checkPortFree(host: string, port: number): Promise<void> {
  if (port === 0) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.once('error', (e) => reject(listenFailed(e, host, port)));
    probe.listen(port, host, () => probe.close(() => resolve()));
  });
}

export async function startLocalCluster(o: ClusterOptions, env: Env): Promise<LocalCluster> {
  const timeout = o.readyTimeoutMs ?? 60_000;
  const numPrefill = o.numPrefill ?? 1;
  const numDecode = o.numDecode ?? 1;
  assert(numPrefill >= 1 && numDecode >= 1, 'a cluster needs a prefill and a decode instance');
  await checkPortFree(o.host, o.proxyPort);
  const roles = [
    ...Array.from({ length: numPrefill }, () => 'prefill' as const),
    ...Array.from({ length: numDecode }, () => 'decode' as const),
  ];
  const startup = new StartupWatch();
  const spawned = await Promise.allSettled(
    roles.map((role) =>
      startup.watch(
        role,
        spawnHandoff(serveArgs(role, o), env, {
          readyTimeoutMs: timeout,
          signal: startup.signal,
          ...(o.childLogLevel ? { env: { HANDOFF_LOG_LEVEL: o.childLogLevel } } : {}),
        }),
      ),
    ),
  );
  const started = spawned.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  try {
    startup.check();
    const prefills = started.slice(0, numPrefill);
    const decodes = started.slice(numPrefill);
    const { proxy, proxyUrl } = await startProxy(o, prefills, decodes, env, timeout, () => startup.check());
    startup.done();
    return {
      proxyUrl,
      prefill: prefills[0] as ChildServer,
      decode: decodes[0] as ChildServer,
      prefills,
      decodes,
      proxy,
      stop: async () => {
        await proxy.close();
        await Promise.all(started.map((c) => c.stop()));
      },
    };
  } catch (e) {
    startup.done();
    await Promise.all(started.map((c) => c.stop(1000)));
    throw e;
  }
}

/**
 * The children from their spawn until the cluster is up: the first one that fails to start, or exits
 * after its ready line, fails the startup at once (its siblings still starting are cancelled), so a dead
 * instance is neither waited for until the health bound nor handed over to the caller as if alive.
 */
class StartupWatch {
  private readonly abort = new AbortController();
  private failure: unknown = null;
  private watching = true;

  get signal(): AbortSignal {
    return this.abort.signal;
  }

  watch(role: string, spawning: Promise<ChildServer>): Promise<ChildServer> {
    return spawning.then(
      (c) => {
        const onExit = (): void => {
          if (!this.watching) return;
          const why = `exited during startup (code ${c.child.exitCode}, signal ${c.child.signalCode})`;
          this.fail(new HandoffError('PEER_UNAVAILABLE', `${role} ${c.url} (pid ${c.pid}) ${why}`));
        };
        if (c.exited) onExit();
        else c.child.once('exit', onExit);
        return c;
      },
      (e: unknown) => {
        this.fail(e);
        throw e;
      },
    );
  }

  /** Throws the first failure, if any. */
  check(): void {
    if (this.failure !== null) throw this.failure;
  }

  /** The cluster is up (or given up): exits are the caller's to watch from now on. */
  done(): void {
    this.watching = false;
  }

  private fail(e: unknown): void {
    this.failure ??= e;
    this.abort.abort();
  }
}

/** The proxy over the started instances, listening and healthy (bounded), health checks running. */
async function startProxy(
  o: ClusterOptions,
  prefills: ChildServer[],
  decodes: ChildServer[],
  env: Env,
  timeout: number,
  checkChildren: () => void,
): Promise<{ proxy: Proxy; proxyUrl: string }> {
  const proxy = new Proxy(
    {
      ...DEFAULT_PROXY_OPTIONS,
      prefillUrls: prefills.map((c) => c.url),
      decodeUrls: decodes.map((c) => c.url),
      mode: o.mode,
      policy: o.policy ?? 'round-robin',
      router: o.router ?? DEFAULT_PROXY_OPTIONS.router,
      apiKey: o.apiKey ?? null,
    },
    env,
    o.log,
  );
  const port = await proxy.listen(o.proxyPort, o.host).catch(async (e: unknown) => {
    await proxy.close().catch((c: unknown) => rethrowIfAssertion(c));
    throw e;
  });
  const proxyUrl = `http://${o.host.includes(':') ? `[${o.host}]` : o.host}:${port}`;
  try {
    await waitHealthy(proxy, env, timeout, checkChildren);
    await proxy.start();
    checkChildren();
  } catch (e) {
    await proxy.close();
    throw e;
  }
  return { proxy, proxyUrl };
}
