/**
 * A prefill half (kv_transfer_params.do_remote_decode) whose client asked for more than one token. Our
 * proxy asks prefill for max_tokens 1, but the prefill instance took any max_tokens (the completions
 * endpoint defaults to 16; a chat request without it, to the room left), and each further token was
 * computed into the pages it then lent to decode:
 * - hybrid (Mamba): prefill computes the prompt less its last token, so that decode, which READs the state
 *   page and recomputes token N-1, starts from h(N-1). With more tokens the state page held h(N-1+k)
 *   while the params still said N-1 tokens; decode answered with wrong tokens and logits, no error
 *   anywhere (before the fix: the first request, 9 tokens, differed from colocated);
 * - attention-only models: the page list outgrew the prompt, and decode refused the request with 400
 *   BAD_TRANSFER_PARAMS "remote_block_ids group 0 has 2 blocks, the prompt needs at most 1" (a prompt of
 *   16 tokens, 2 more computed: a second page), the pages held at prefill for nothing until then.
 *
 * Proves: a prefill half samples one token whatever it was asked, so decode accepts its params and its
 * output equals colocated token for token and logit for logit; a bad max_tokens is still refused.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { threadedDevice } from '../engine/devices.ts';
import { LLMEngine, type GenerateRequest } from '../engine/llm_engine.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { decodeParamsRead, prefillAsk } from '../serve/pd_flow.ts';
import { PdPair } from './pd_pair.ts';

const env = new RealEnv(11);
const prompts: GenerateRequest[] = [9, 40, 16].map((n, i) => ({
  promptTokenIds: Array.from({ length: n }, (_, k) => (i * 613 + k * 37) % 50000),
  sampling: { maxTokens: 4, temperature: 0, seed: 7 + i, ignoreEos: true },
}));

const run = (r: { tokenIds: number[]; logitsHashes: Array<string | null> }): string =>
  `${r.tokenIds.join(',')}|${r.logitsHashes.join(',')}`;

async function colocated(preset: ModelPreset): Promise<string[]> {
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
    const out: string[] = [];
    for (const p of prompts) out.push(run(await e.generate(p)));
    return out;
  } finally {
    await e.close();
  }
}

for (const preset of ['hybrid-mini', 'llama-mini'] as const) {
  test(`${preset} READ: a prefill half asked for 3 tokens: decode accepts, P/D == colocated`, async () => {
    const ref = await colocated(preset);
    const pair = await PdPair.create(
      { preset, modelSeed: 3, numBlocks: 64, decode: { mode: 'read' }, raceCheck: false, name: `maxtok-${preset}` },
      env,
    );
    try {
      const sampledAtPrefill: number[] = [];
      for (const [i, p] of prompts.entries()) {
        // A proxy that leaves max_tokens to prefill (or asks for several): not our flow's 1.
        const pre = await pair.prefill.generate({
          promptTokenIds: p.promptTokenIds,
          sampling: { ...p.sampling, maxTokens: 3 },
          kvTransferParams: prefillAsk(`xfer-maxtok-${i}`).kvTransferParams,
        });
        const got = await pair.decode.generate({ ...p, kvTransferParams: decodeParamsRead(pre.kvTransferParams) });
        assert.ok(got.numExternalTokens > 0, `request ${i}: KV came from prefill`);
        assert.equal(run(got), ref[i], `request ${i}: P/D output equals colocated`);
        sampledAtPrefill.push(pre.tokenIds.length);
      }
      assert.deepEqual(sampledAtPrefill, [1, 1, 1], 'a prefill half samples one token');
      const bad = { ...prompts[0]!, sampling: { ...prompts[0]!.sampling, maxTokens: 0 } };
      assert.throws(
        () => pair.prefill.makeRequest({ ...bad, kvTransferParams: prefillAsk('xfer-bad').kvTransferParams }),
        (e: Error & { code?: string }) => e.code === 'BAD_REQUEST',
      );
    } finally {
      await pair.close();
    }
  });
}
