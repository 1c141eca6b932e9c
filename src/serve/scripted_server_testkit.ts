/**
 * For tests: the real InstanceServer (HTTP, validation, Generation, stop strings, sinks) over a scripted
 * engine that emits chosen token ids, one output per token, as the engine does: the text paths can be
 * driven with exactly the tokens a case needs (an EOS mid-answer, an emoji split over tokens).
 */
import { InstanceServer, type ServedEngine } from './instance_server.ts';
import { RealEnv } from '../util/env.ts';
import { LOOPBACK_PEERS } from '../connector/peer_directory.ts';
import type { EngineOutput } from '../engine/output.ts';
import type { GenerateRequest } from '../engine/llm_engine.ts';

export const EOS = 50256;

export interface Fake {
  url: string;
  /** The tokens the next requests generate (each request replays it from the start). */
  script: number[];
  close(): Promise<void>;
}

export async function startFake(opts: { apiKey?: string | null; maxModelLen?: number } = {}): Promise<Fake> {
  const env = new RealEnv(3);
  const fake = { script: [] as number[] } as Fake;
  const aborted = new Set<string>();
  const engine: ServedEngine = {
    submit(g: GenerateRequest, onOutput: (o: EngineOutput) => void) {
      const id = g.requestId ?? 'x';
      const tokens = [...fake.script];
      const s = g.sampling;
      let i = 0;
      const step = (): void => {
        if (aborted.has(id)) return;
        const t = tokens[i++ % Math.max(tokens.length, 1)] ?? 0;
        let finish: 'stop' | 'length' | null = null;
        if (!s.ignoreEos && t === EOS) finish = 'stop';
        else if ((s.stopTokenIds ?? []).includes(t)) finish = 'stop';
        else if (i >= s.maxTokens) finish = 'length';
        onOutput({
          requestId: id,
          newTokenIds: [t],
          newLogprobs: [-0.5],
          logitsHashes: [null],
          nanLogits: false,
          finishReason: finish,
          kvTransferParams: null,
          error: null,
          numPromptTokens: g.promptTokenIds.length,
          numCachedTokens: 0,
          numExternalTokens: 0,
        });
        if (finish === null) setImmediate(step);
      };
      setImmediate(step);
      return {};
    },
    abort(id: string) {
      aborted.add(id);
    },
    cancel(id: string) {
      aborted.add(id);
    },
    crashed: null,
    releaseUnused: () => false,
    kvEvents: {
      epoch: 'e',
      seq: 0,
      since: () => [],
      dump: () => ({}) as never,
      flush: () => null,
      subscribe: () => () => {},
    },
    load: () => ({
      running: 0,
      waiting: 0,
      held_for_send: 0,
      held_for_send_pages: 0,
      free_pages: 100,
      total_pages: 100,
    }),
    resetPrefixCache: () => true,
  };
  const maxModelLen = opts.maxModelLen ?? 512;
  const server = new InstanceServer(
    engine,
    {
      modelName: 'dsv4-mini',
      apiKey: opts.apiKey ?? null,
      maxModelLen,
      info: {
        engine_id: null,
        role: 'both',
        model: 'dsv4-mini',
        preset: 'dsv4-mini',
        kv_role: null,
        transfer_mode: null,
        side_channel_host: null,
        side_channel_port: null,
        data_port: null,
        max_model_len: maxModelLen,
        num_pages: 100,
        block_size: 16,
        prefix_cache_groups: [],
        kv_events_epoch: 'e',
      },
      prefillerPeers: LOOPBACK_PEERS,
    },
    env,
    () => ({}) as never,
  );
  const port = await server.listen(0, '127.0.0.1');
  fake.url = `http://127.0.0.1:${port}`;
  fake.close = () => server.close();
  return fake;
}

/** POST and read the SSE `data:` payloads (raw strings). */
export async function sse(url: string, path: string, body: unknown): Promise<string[]> {
  const r = await fetch(url + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = await r.text();
  if (r.status !== 200) throw new Error(`status ${r.status}: ${text}`);
  return text
    .split('\n\n')
    .filter((b) => b.startsWith('data: '))
    .map((b) => b.slice(6));
}
