/**
 * The GPT-2 tokenizer (its 50k ranks parsed into the BPE tables, 0.4-0.8 s
 * on this machine) was built lazily by the first request that tokenized or detokenized anything, on the
 * event loop: the first completion a fresh instance (or proxy) served stalled every other request of
 * that process, /health included (a real `handoff serve` kept a concurrent /health waiting 0.8-1.7 s).
 * Proves: once an instance is started, the first request's inline tokenizing costs what any later
 * one does, because TokenizerThreads (which the proxy has too) builds the tables before the server
 * listens. (Timing the probe of a child process instead was at the mercy of the shared machine's load.)
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { encode } from '../model/tokenizer.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance } from './instance.ts';

const env = new RealEnv(5);

test('a started instance has built the tokenizer: its first request does not', async () => {
  const opts = { ...DEFAULT_INSTANCE_OPTIONS, port: 0, preset: 'llama-mini' as const, numBlocks: 64 };
  const inst = await startInstance({ ...opts, scheduler: { maxModelLen: 256 } }, env);
  try {
    const t0 = env.nowMs();
    const ids = encode('The KV cache moved'); // what the first request's inline tokenizing pays
    const firstMs = env.nowMs() - t0;
    console.log(`# first encode after startInstance: ${firstMs.toFixed(1)} ms`);
    assert.ok(ids.length > 0);
    assert.ok(
      firstMs < 200, // built: ~1 ms; not built: 400-800 ms here
      `the first request would build the tokenizer on the event loop (${firstMs.toFixed(0)} ms)`,
    );
  } finally {
    await inst.close();
  }
});
