/**
 * PeerDirectory: the consumer's view of its producers' side channels, shared by the connector's
 * scheduler side and worker side, so that no handshake ever runs on the step path.
 *
 *   absent ──ensure──> connecting ──handshake ok──> ready(engineId)
 *                          │                          │ forget (side channel lost)
 *                          └──fails / times out──> failed(error) ──retry after backoff──> connecting
 *
 * The scheduler side admits a READ request only once its peer is `ready` or `failed` (a failed peer
 * fails the load at once, and the request recomputes or fails by policy); while the peer is
 * `connecting` the request stays waiting and the batch goes on (vLLM's NIXL connector handshakes in a
 * background thread the same way). The worker side posts READs only to `ready` peers and never waits
 * for a handshake. Settling a handshake calls `onChange` so the engine schedules again at once.
 *
 * The allow-list (`--kv-peers`) is checked before any connection: a peer not on it is refused with
 * PEER_NOT_ALLOWED and never contacted.
 */
import type { Env } from '../util/env.ts';
import { HandoffError, isHandoffError } from '../util/errors.ts';
import type { PeerAddress, EngineMetadata } from '../transfer/core/types.ts';

export type PeerStatus =
  { state: 'connecting' } | { state: 'ready'; engineId: string } | { state: 'failed'; error: HandoffError };

interface Entry {
  status: PeerStatus;
  /** When it settled (failed entries are retried after FAILED_RETRY_MS). */
  settledMs: number;
  /** The expected engine id whose mismatch started this handshake (a peer restarted), or null. */
  refreshedFor: string | null;
  /** Resolves when this handshake settles (either way). */
  settled: Promise<void>;
  /** What the peer sent at the handshake (its geometry), once ready. */
  metadata: EngineMetadata | null;
  markSettled: () => void;
  /** A ready entry: the refresh handshake running for it (it stays usable until that one settles), or null. */
  refreshing: Entry | null;
  /** A refresh: the ready entry it replaces once it settles. */
  replaces: Entry | null;
}

/** A failed handshake is not retried before this: requests arriving meanwhile fail fast. */
export const FAILED_RETRY_MS = 1000;
/** Bound on remembered peers (a client can name many addresses; each costs one entry). */
export const PEERS_MAX = 4096;

/** Peer patterns: `host:port`, `host:*`, `loopback` (this machine, any port), or `*` (any peer). */
export type PeerAllowList = readonly string[];
/** The default allow-list: producers on this machine only (loopback addresses, in-process engines). */
export const LOOPBACK_PEERS: PeerAllowList = ['loopback'];

function isLocalHost(host: string): boolean {
  return (
    /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host) ||
    host === 'localhost' ||
    host === '::1' ||
    host === '[::1]' ||
    host.startsWith('inproc://')
  );
}

export function peerAllowed(allow: PeerAllowList, host: string, port: number): boolean {
  return allow.some((p) => {
    if (p === '*') return true;
    if (p === 'loopback') return isLocalHost(host);
    const i = p.lastIndexOf(':');
    const pp = p.slice(i + 1);
    return p.slice(0, i) === host && (pp === '*' || Number(pp) === port);
  });
}

/** Parse `--kv-peers`: comma-separated `host:port`, `host:*`, `loopback` or `*`; throws BAD_CONFIG on a bad entry. */
export function parsePeerAllowList(raw: string): PeerAllowList {
  const items = raw
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
  if (items.length === 0) throw new HandoffError('BAD_CONFIG', '--kv-peers is empty (use * to allow any peer)');
  for (const it of items) {
    if (it === '*' || it === 'loopback') continue;
    const i = it.lastIndexOf(':');
    const port = it.slice(i + 1);
    const portOk = port === '*' || (/^\d{1,5}$/.test(port) && Number(port) >= 1 && Number(port) <= 65535);
    if (i <= 0 || !portOk)
      throw new HandoffError('BAD_CONFIG', `--kv-peers entry '${it}' is not host:port, host:*, loopback or *`);
  }
  return items;
}

/** A handshake's engine id must be the one the request's params name. */
function expectEngine(engineId: string, host: string, port: number, expected: string): string {
  if (engineId !== expected)
    throw new HandoffError('BAD_TRANSFER_PARAMS', `peer at ${host}:${port} is ${engineId}, not ${expected}`);
  return engineId;
}

export class PeerDirectory {
  private readonly entries = new Map<string, Entry>();
  /** Engine ids some handshake returned (bounded): a failed handshake to one of them is a peer fault. */
  private readonly knownEngines = new Set<string>();
  stats = { handshakesStarted: 0, handshakesFailed: 0, refused: 0 };

  constructor(
    private readonly handshake: (peer: PeerAddress) => Promise<EngineMetadata>,
    private readonly env: Env,
    private readonly allow: PeerAllowList = LOOPBACK_PEERS,
    private readonly onChange: () => void = () => undefined,
  ) {}

  /** Throws PEER_NOT_ALLOWED (403) for a peer outside the allow-list; nothing is contacted. */
  checkAllowed(host: string, port: number): void {
    if (peerAllowed(this.allow, host, port)) return;
    this.stats.refused++;
    throw new HandoffError(
      'PEER_NOT_ALLOWED',
      `remote_host:remote_port ${host}:${port} is not an allowed KV peer of this instance (see --kv-peers)`,
      {
        param: 'kv_transfer_params.remote_host',
      },
    );
  }

  /** The peer's status for a request that expects `expectedEngineId` there; starts a handshake when needed. */
  statusFor(host: string, port: number, expectedEngineId: string): PeerStatus {
    const key = `${host}:${port}`;
    const e = this.entries.get(key);
    const now = this.env.nowMs();
    if (e === undefined || (e.status.state === 'failed' && now - e.settledMs >= FAILED_RETRY_MS))
      return this.start(host, port, null).status;
    // A cached answer naming another engine: the peer may have restarted on that address; ask once more
    // (once per expected engine id, so stale params cannot make it handshake on every step).
    // The ready entry stays for the requests of the engine there (their READs may be posting) until it answers.
    if (e.status.state === 'ready' && e.status.engineId !== expectedEngineId && e.refreshedFor !== expectedEngineId) {
      return (e.refreshing ?? this.start(host, port, expectedEngineId, e)).status;
    }
    return e.status;
  }

  /**
   * For work that is off the step path (a release notification): the peer's engine id once a
   * handshake settles, starting one if needed. Rejects with the handshake's error or PEER_NOT_ALLOWED.
   */
  async resolve(host: string, port: number, expectedEngineId: string): Promise<string> {
    let st = this.statusFor(host, port, expectedEngineId);
    if (st.state === 'connecting') {
      const e = this.entries.get(`${host}:${port}`);
      await (e?.refreshing ?? e)?.settled;
      st = this.peek(host, port) ?? {
        state: 'failed',
        error: new HandoffError('PEER_UNAVAILABLE', `the side channel to ${host}:${port} was dropped`),
      };
    }
    if (st.state === 'failed') throw st.error;
    if (st.state !== 'ready')
      throw new HandoffError('PEER_UNAVAILABLE', `the side channel to ${host}:${port} is being replaced`);
    return expectEngine(st.engineId, host, port, expectedEngineId);
  }

  /**
   * The step path's view: the engine at host:port as known now, never starting or waiting for a
   * handshake (the scheduler side admitted the request only once it settled). A failed handshake to an
   * engine this instance never reached means the params are wrong (400), unless it answered and refused as
   * incompatible (409: the pairing is wrong); to a known one, the peer is gone.
   */
  readyEngine(host: string, port: number, expectedEngineId: string): string {
    const st = this.peek(host, port);
    if (st?.state === 'failed') {
      // A known engine cannot have become incompatible: another process answers there now; that one is gone.
      if (this.knows(expectedEngineId) && st.error.code === 'PEER_INCOMPATIBLE')
        throw new HandoffError(
          'PEER_UNAVAILABLE',
          `${expectedEngineId} is gone: ${host}:${port} refused the handshake (${st.error.message})`,
        );
      if (this.knows(expectedEngineId)) throw st.error;
      // It answered and refused to pair (other model, --seed, layout): the deployment's fault, not the params'.
      if (st.error.code === 'PEER_INCOMPATIBLE')
        throw new HandoffError('PEER_INCOMPATIBLE', `${host}:${port} refused the handshake (${st.error.message})`);
      const how = st.error.code === 'UNAUTHORIZED' ? 'refused the handshake' : 'does not answer';
      const why = `remote_engine_id ${expectedEngineId} is unknown here and ${host}:${port} ${how} (${st.error.message})`;
      throw new HandoffError('BAD_TRANSFER_PARAMS', why, { param: 'kv_transfer_params.remote_host' });
    }
    if (st?.state !== 'ready') throw new HandoffError('PEER_UNAVAILABLE', `no side channel to ${host}:${port} yet`);
    // An engine that was handshaken and is replaced there (a restart): the peer is gone, not the params wrong.
    if (st.engineId !== expectedEngineId && this.knows(expectedEngineId))
      throw new HandoffError('PEER_UNAVAILABLE', `${expectedEngineId} is gone: ${host}:${port} is ${st.engineId} now`);
    return expectEngine(st.engineId, host, port, expectedEngineId);
  }

  /**
   * True when a handshake ever returned this engine id (it existed; if it is gone now, that is not the client's fault).
   */
  knows(engineId: string): boolean {
    return this.knownEngines.has(engineId);
  }

  /** The worker's view: never starts or waits for a handshake. */
  peek(host: string, port: number): PeerStatus | undefined {
    return this.entries.get(`${host}:${port}`)?.status;
  }

  /** What the ready peer at host:port sent at its handshake (block sizes, page size), or null. */
  metadataOf(host: string, port: number): EngineMetadata | null {
    const e = this.entries.get(`${host}:${port}`);
    return e?.status.state === 'ready' ? e.metadata : null;
  }

  /** The side channel to this peer is gone or stuck: the next use handshakes again. */
  forget(host: string, port: number): void {
    this.entries.delete(`${host}:${port}`);
  }

  /**
   * A transfer to `engineId` found no side channel: forget it, unless another engine answers at that address
   * now (a restart): that one's channel is healthy, and forgetting it made every stale request handshake again.
   */
  forgetChannelOf(host: string, port: number, engineId: string): void {
    const st = this.peek(host, port);
    if (st?.state === 'ready' && st.engineId !== engineId) return;
    this.forget(host, port);
  }

  get size(): number {
    return this.entries.size;
  }

  private start(host: string, port: number, refreshedFor: string | null, replaces: Entry | null = null): Entry {
    const key = `${host}:${port}`;
    this.checkAllowed(host, port);
    if (replaces === null && this.entries.size >= PEERS_MAX && !this.entries.has(key)) this.evictOne();
    let markSettled = (): void => undefined;
    const settled = new Promise<void>((r) => (markSettled = r));
    const entry: Entry = {
      status: { state: 'connecting' },
      settledMs: 0,
      refreshedFor,
      settled,
      metadata: null,
      markSettled: () => markSettled(),
      refreshing: null,
      replaces,
    };
    if (replaces === null) this.entries.set(key, entry);
    else replaces.refreshing = entry;
    this.stats.handshakesStarted++;
    // A refresh asks the peer itself: a side channel to the old engine may still look open.
    this.handshake({ host, port, ...(refreshedFor !== null ? { fresh: true } : {}) }).then(
      (m) => {
        entry.metadata = m;
        this.settle(key, entry, { state: 'ready', engineId: m.engineId });
      },
      (err: unknown) => {
        if (!isHandoffError(err)) throw err;
        this.stats.handshakesFailed++;
        this.settle(key, entry, { state: 'failed', error: err });
      },
    );
    return entry;
  }

  private settle(key: string, entry: Entry, status: PeerStatus): void {
    // A refresh takes the place of the entry it refreshed, unless that one was forgotten or replaced meanwhile.
    if (entry.replaces !== null && this.entries.get(key) === entry.replaces) this.entries.set(key, entry);
    if (entry.replaces !== null) entry.replaces.refreshing = null;
    entry.replaces = null;
    entry.status = status;
    entry.settledMs = this.env.nowMs();
    entry.markSettled();
    if (status.state === 'ready') {
      if (this.knownEngines.size >= PEERS_MAX) this.knownEngines.clear();
      this.knownEngines.add(status.engineId);
    }
    if (this.entries.get(key) === entry) this.onChange(); // else forgotten or replaced meanwhile
  }

  /**
   * Drop the oldest failed entry (insertion order), else the oldest ready one; connecting ones are kept.
   * Addresses a client names that answer nothing (any loopback port passes the default allow-list) fail,
   * and they evict each other: they no longer push out a live producer, which was the oldest entry.
   */
  private evictOne(): void {
    for (const state of ['failed', 'ready'] as const) {
      for (const [k, e] of this.entries) {
        if (e.status.state === state) {
          this.entries.delete(k);
          return;
        }
      }
    }
  }
}
