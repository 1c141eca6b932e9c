/**
 * P/D between different tensor parallel degrees with a long prompt. Between degrees a GQA
 * slot costs one byte range per region, rank pair and layer (they do not coalesce), so a prompt of a
 * little over 8,192 tokens on a two-layer GQA model needs more than the 65,536 descriptors one work
 * request may carry (transfer/core/handle_wait.ts DESCRIPTORS_MAX). Proves that such a prompt still moves
 * by READ (P TP 2 / D TP 1) and by WRITE (P TP 1 / D TP 2), cut into several work requests: the answer
 * equals a colocated TP=1 engine's, KV came from prefill and no load failed. Before the fix the READ was
 * refused whole and the client got a 400 BAD_TRANSFER_PARAMS ("66,... descriptors exceed 65536") for a
 * valid request; the WRITE push failed at once and decode waited for its transfer timeout, then
 * recomputed the whole prompt.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { threadedDevice } from '../engine/devices.ts';
import { LLMEngine, type GenerateRequest } from '../engine/llm_engine.ts';
import { PdPair } from './pd_pair.ts';

const env = new RealEnv(17);
const N = 8_250;
const NUM_BLOCKS = Math.ceil(N / 16) + 16;
const scheduler = { maxModelLen: N + 8, maxNumBatchedTokens: 2048 };
const prompt: GenerateRequest = {
  promptTokenIds: Array.from({ length: N }, (_, k) => (k * 37 + 5) % 60),
  sampling: { maxTokens: 2, temperature: 0, ignoreEos: true },
};
const run = (r: { tokenIds: number[]; logitsHashes: Array<string | null> }): string =>
  `${r.tokenIds.join(',')}|${r.logitsHashes.join(',')}`;

async function colocated(): Promise<string> {
  const e = await LLMEngine.create(
    {
      preset: 'llama-micro',
      modelSeed: 3,
      numBlocks: NUM_BLOCKS,
      asyncScheduling: true,
      scheduler,
      idlePollMs: 2,
      makeDevice: threadedDevice('llama-micro', 3),
    },
    env,
  );
  try {
    return run(await e.generate(prompt));
  } finally {
    await e.close();
  }
}

/** Rejects as soon as prefill's WRITE failed (decode would only notice at its deadline); bounded. */
async function failedPush(pair: PdPair, answered: { done: boolean }): Promise<never> {
  for (let k = 0; k < 6000 && !answered.done; k++) {
    await env.sleep(20);
    if (pair.prefillConnector.transfer.stats().writesFailed > 0) break;
  }
  throw new Error(`prefill's WRITE failed (or no answer in 120 s)`);
}

test(`a ${N}-token prompt between degrees (more ranges than one work request carries) moves by READ and WRITE`, async () => {
  const ref = await colocated();
  for (const [mode, prefillTp, decodeTp] of [
    ['read', 2, 1],
    ['write', 1, 2],
  ] as const) {
    const what = `${mode} P TP=${prefillTp} / D TP=${decodeTp}`;
    const pair = await PdPair.create(
      {
        preset: 'llama-micro',
        modelSeed: 3,
        numBlocks: NUM_BLOCKS,
        // Long enough for prefill's forward of the whole prompt under load (WRITE's deadline starts at admission).
        decode: { mode, transferTimeoutMs: 120_000 },
        raceCheck: false,
        name: `long-${mode}`,
        prefillTp,
        decodeTp,
        scheduler,
      },
      env,
    );
    try {
      const answered = { done: false };
      const r = await Promise.race([
        mode === 'read' ? pair.generate(prompt) : pair.generateWrite(prompt),
        failedPush(pair, answered),
      ]).finally(() => (answered.done = true));
      assert.equal(run(r), ref, `${what}: equals colocated TP=1`);
      assert.ok(r.numExternalTokens > 0, `${what}: KV came from prefill`);
      assert.equal(pair.decode.scheduler.stats.loadFailures, 0, `${what}: no load failed (none recomputed)`);
    } finally {
      await pair.close();
    }
  }
});
