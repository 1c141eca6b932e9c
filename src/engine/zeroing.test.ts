/**
 * The NaN story end to end through the engine: a freed page keeps whatever its last owner wrote, and
 * slabs are shared by the fp8 MLA group and the f32 compressor group, so the next owner may read f32
 * bytes as fp8 (0x7f/0xff are NaN). Here every free page is filled with f32 values, as a compressor
 * would leave them. With zeroing (the scheduler's newBlockIdsToZero run by the runner's BlockZeroer) the
 * next request equals a fresh engine's output; with the zero list dropped, the stale bytes poison it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { NullConnector } from '../connector/base.ts';
import { simDevice } from './devices.ts';
import { LLMEngine, type EngineCreateConfig, type GenerateRequest } from './llm_engine.ts';

/** A colocated "connector" that drops the zero list: what a missing zeroing looks like. */
class DropZeroing extends NullConnector {
  override excludeReadDestinations(): number[] | null {
    return null;
  }
}

const env = new RealEnv(6);
const cfg = (numBlocks: number, dropZeroing: boolean): EngineCreateConfig => ({
  preset: 'dsv4-mini',
  modelSeed: 5,
  numBlocks,
  asyncScheduling: true,
  scheduler: { enablePrefixCaching: false },
  idlePollMs: 2,
  makeDevice: simDevice('dsv4-mini', 5),
  ...(dropZeroing ? { makeConnector: async () => ({ scheduler: new DropZeroing(), worker: null }) } : {}),
});
/** Fill every page except the null block with f32 normals (what a compressor page holds). */
function staleF32(engine: LLMEngine): void {
  const rng = env.rng;
  for (const slab of engine.device.slabs) {
    const f = new Float32Array(
      slab.buffer,
      slab.byteOffset + engine.kvConfig.pageBytes,
      (slab.byteLength - engine.kvConfig.pageBytes) / 4,
    );
    for (let i = 0; i < f.length; i++) f[i] = (rng.next() - 0.5) * 4;
  }
}

async function idle(e: LLMEngine): Promise<void> {
  for (let k = 0; k < 500 && !e.core.isIdle(); k++) await env.sleep(2);
  assert.ok(e.core.isIdle(), 'engine went idle');
}

const req = (n: number, base: number): GenerateRequest => ({
  promptTokenIds: Array.from({ length: n }, (_, i) => (base + i * 101) % 50000),
  sampling: { maxTokens: 4, ignoreEos: true },
});

test('reused pages across precisions: zeroed → equals a fresh run; not zeroed → corrupted', async () => {
  const a = req(60, 7);
  const b = req(40, 9);
  const fresh = await LLMEngine.create(cfg(64, false), env);
  const want = await fresh.generate(b);
  await fresh.close();

  const zeroing = await LLMEngine.create(cfg(9, false), env);
  await zeroing.generate(a);
  await idle(zeroing);
  assert.equal(zeroing.kv.getNumFreeBlocks(), 8, 'A is done: every page is free');
  staleF32(zeroing);
  const withZeroing = await zeroing.generate(b);
  assert.ok(zeroing.runner.stats.pagesZeroed >= 14, 'every new page of both requests was zeroed');
  assert.equal(withZeroing.nanLogits, false);
  await zeroing.close();
  assert.deepEqual(withZeroing.logitsHashes, want.logitsHashes);

  const dropping = await LLMEngine.create(cfg(9, true), env);
  await dropping.generate(a);
  await idle(dropping);
  staleF32(dropping);
  const without = await dropping.generate(b);
  assert.equal(dropping.runner.stats.pagesZeroed, 0);
  await dropping.close();
  assert.ok(without.nanLogits, 'f32 bytes read as fp8 are NaN somewhere, and masking by 0 keeps NaN');
  assert.notDeepEqual(without.logitsHashes, want.logitsHashes);
});
