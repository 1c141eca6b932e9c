/**
 * P/D between tensor parallel instances with real threads (two compute threads per instance, each
 * rank with its own slabs; the inproc NIC thread copying every rank's slabs to the same rank): READ and
 * WRITE at TP=2/TP=2 equal a colocated TP=1 engine token for token and logit for logit, with the race
 * checker on and silent, for the MLA (dsv4-mini) and Mamba (hybrid-mini) families; a pair of different
 * degrees is refused at the handshake with PEER_INCOMPATIBLE naming both degrees.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { isHandoffError } from '../util/errors.ts';
import type { RaceChecker } from '../device/race/race_checker.ts';
import { threadedDevice } from '../engine/devices.ts';
import { LLMEngine, type GenerateRequest } from '../engine/llm_engine.ts';
import { PdPair, type PdPairOptions } from './pd_pair.ts';

const env = new RealEnv(6);
const prompts: GenerateRequest[] = [9, 40, 71].map((n, i) => ({
  promptTokenIds: Array.from({ length: n }, (_, k) => (i * 613 + k * 37) % 50000),
  sampling: { maxTokens: 4, temperature: i === 1 ? 0.9 : 0, seed: 7 + i, ignoreEos: true },
}));

const run = (r: { tokenIds: number[]; logitsHashes: Array<string | null> }): string =>
  `${r.tokenIds.join(',')}|${r.logitsHashes.join(',')}`;

async function colocatedTp1(preset: PdPairOptions['preset']): Promise<string[]> {
  const e = await LLMEngine.create(
    {
      preset,
      modelSeed: 3,
      numBlocks: 96,
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

const pairOptions = (preset: PdPairOptions['preset'], name: string, mode: 'read' | 'write'): PdPairOptions => ({
  preset,
  modelSeed: 3,
  numBlocks: 96,
  decode: { mode },
  raceCheck: true,
  name,
  prefillTp: 2,
  decodeTp: 2,
});

for (const preset of ['dsv4-mini', 'hybrid-mini'] as const) {
  const modes = preset === 'hybrid-mini' ? (['read'] as const) : (['read', 'write'] as const);
  test(`${preset}: P/D at TP=2/TP=2 (${modes.join(' and ')}) equals colocated TP=1, logit for logit, no race`, async () => {
    const ref = await colocatedTp1(preset);
    for (const mode of modes) {
      const pair = await PdPair.create(pairOptions(preset, `tp-${preset}-${mode}`, mode), env);
      try {
        const got = await Promise.all(prompts.map((p) => (mode === 'read' ? pair.generate(p) : pair.generateWrite(p))));
        got.forEach((r, i) => assert.equal(run(r), ref[i], `${mode} request ${i}`));
        assert.ok(
          got.some((r) => r.numExternalTokens > 0),
          'KV came from prefill',
        );
        assert.equal(pair.decode.kvConfig.tensorParallelSize, 2);
        assert.deepEqual((pair.decode.device.raceChecker as RaceChecker).races(), [], `${mode}: no race on any rank`);
      } finally {
        await pair.close();
      }
    }
  });
}

test('prefill TP=2 and decode TP=1: the handshake refuses with PEER_INCOMPATIBLE naming both degrees', async () => {
  const pair = await PdPair.create({ ...pairOptions('llama-mini', 'tp-mismatch', 'read'), decodeTp: 1 }, env);
  try {
    await assert.rejects(
      pair.decodeConnector.transfer.handshake(pair.prefillConnector.transfer.address()),
      (e: unknown) =>
        isHandoffError(e) &&
        e.code === 'PEER_INCOMPATIBLE' &&
        /tensor parallel size 2 != 1 \(peer tp-mismatch-producer runs TP=2, engine tp-mismatch-consumer TP=1/.test(
          e.message,
        ),
    );
    // A request naming that prefill fails typed (its params name a peer that refused), the message says why.
    await assert.rejects(
      pair.generate(prompts[0] as GenerateRequest),
      (e: unknown) =>
        isHandoffError(e) && /tensor parallel size (2 != 1|1 != 2)/.test(e.message) && /TP=2/.test(e.message),
    );
  } finally {
    await pair.close();
  }
});
