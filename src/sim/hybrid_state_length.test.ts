/**
 * A hybrid (Mamba) decode given prefill's params for a longer prompt than its own. Decode checked only
 * that prefill computed at least the N-1 tokens it loads (`remote_num_tokens >= n - 1`). That is right for
 * attention (the KV of a prompt's first N-1 tokens is the same whatever follows), but the Mamba state
 * page prefill lends is the state after all of its tokens, h(remote_num_tokens), and decode went on from
 * it as if it were h(N-1). A client (a retry with a trimmed prompt, a proxy that edits the decode leg)
 * whose decode prompt was a prefix of prefill's got a 200 with wrong tokens, while the params said what
 * the state held. Before the fix: decode of the first 17 tokens over prefill's 20 answered
 * 48024,20356,19884 where colocated answers 12761,13267,49426.
 *
 * Proves: such a request is refused with 400 BAD_TRANSFER_PARAMS naming remote_num_tokens on the hybrid
 * (never a wrong answer), while an attention-only model (llama) still accepts it and equals colocated.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { isHandoffError } from '../util/errors.ts';
import { threadedDevice } from '../engine/devices.ts';
import { LLMEngine, type GenerateResult } from '../engine/llm_engine.ts';
import { decodeParamsRead, prefillAsk } from '../serve/pd_flow.ts';
import { PdPair } from './pd_pair.ts';

const env = new RealEnv(13);
const long = Array.from({ length: 20 }, (_, k) => (k * 37) % 50000);
const short = long.slice(0, 17);
const sampling = { maxTokens: 3, temperature: 0, seed: 1, ignoreEos: true };

async function colocated(preset: 'hybrid-mini' | 'llama-mini'): Promise<string> {
  const e = await LLMEngine.create(
    {
      preset,
      modelSeed: 3,
      numBlocks: 64,
      asyncScheduling: true,
      scheduler: {},
      idlePollMs: 2,
      makeDevice: threadedDevice(preset, 3),
    },
    env,
  );
  try {
    return (await e.generate({ promptTokenIds: short, sampling })).tokenIds.join(',');
  } finally {
    await e.close();
  }
}

for (const preset of ['hybrid-mini', 'llama-mini'] as const) {
  test(`${preset}: decode of a prefix of prefill's prompt: refused (hybrid) or exact (llama)`, async () => {
    const ref = await colocated(preset);
    const pair = await PdPair.create(
      { preset, modelSeed: 3, numBlocks: 64, decode: { mode: 'read' }, raceCheck: false, name: `len-${preset}` },
      env,
    );
    try {
      const pre = await pair.prefill.generate({
        promptTokenIds: long,
        sampling: { ...sampling, maxTokens: 1 },
        kvTransferParams: prefillAsk('xfer-len').kvTransferParams,
      });
      const params = decodeParamsRead(pre.kvTransferParams);
      let got: GenerateResult | null = null;
      try {
        got = await pair.decode.generate({ promptTokenIds: short, sampling, kvTransferParams: params });
      } catch (e) {
        if (!isHandoffError(e)) throw e;
        assert.equal(preset, 'hybrid-mini', `${preset} refused it: ${e.message}`);
        assert.equal(e.code, 'BAD_TRANSFER_PARAMS');
        assert.match(e.message, /Mamba state of 19 tokens, decode goes on from 16/);
      }
      if (got !== null) {
        assert.equal(got.tokenIds.join(','), ref, 'decode accepted the KV: its answer equals colocated');
        assert.equal(preset, 'llama-mini', 'the hybrid refuses a state of another length');
      }
    } finally {
      await pair.close();
    }
  });
}
