/**
 * P/D between tensor parallel instances with real threads (one compute thread per rank, each rank with
 * its own slabs; the inproc NIC thread copying between rank slabs): READ and WRITE at P TP=2 / D TP=2
 * (rank to same rank), P TP=2 / D TP=1 (the decode rank gathers each slot's heads from both prefill
 * ranks) and P TP=1 / D TP=2 (each decode rank reads its head slice of the one prefill rank's pages)
 * equal a colocated TP=1 engine token for token and logit for logit, with the race checker on and silent,
 * for the MLA (dsv4-mini) and Mamba (hybrid-mini) families. Degrees that cannot be mapped are refused at
 * the handshake (transfer/core/metadata.test.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
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

const pairOptions = (
  preset: PdPairOptions['preset'],
  name: string,
  mode: 'read' | 'write',
  [prefillTp, decodeTp]: readonly [number, number],
): PdPairOptions => ({
  preset,
  modelSeed: 3,
  numBlocks: 96,
  decode: { mode },
  raceCheck: true,
  name,
  prefillTp,
  decodeTp,
});

const DEGREES = [
  [2, 2],
  [2, 1],
  [1, 2],
] as const;

for (const preset of ['dsv4-mini', 'hybrid-mini'] as const) {
  const modes = preset === 'hybrid-mini' ? (['read'] as const) : (['read', 'write'] as const);
  test(`${preset}: P/D at P TP/D TP 2/2, 2/1 and 1/2 (${modes.join(' and ')}) equals colocated TP=1, logit for logit, no race`, async () => {
    const ref = await colocatedTp1(preset);
    for (const tp of DEGREES)
      for (const mode of modes) {
        const what = `${mode} P TP=${tp[0]} / D TP=${tp[1]}`;
        const pair = await PdPair.create(pairOptions(preset, `tp-${preset}-${mode}-${tp.join('')}`, mode, tp), env);
        try {
          const got = await Promise.all(
            prompts.map((p) => (mode === 'read' ? pair.generate(p) : pair.generateWrite(p))),
          );
          got.forEach((r, i) => assert.equal(run(r), ref[i], `${what}: request ${i}`));
          assert.ok(
            got.some((r) => r.numExternalTokens > 0),
            `${what}: KV came from prefill`,
          );
          assert.deepEqual(
            [pair.prefill.kvConfig.tensorParallelSize, pair.decode.kvConfig.tensorParallelSize],
            [...tp],
          );
          assert.deepEqual((pair.decode.device.raceChecker as RaceChecker).races(), [], `${what}: no race on any rank`);
          assert.equal(pair.decode.scheduler.stats.loadFailures, 0, `${what}: every load landed (none recomputed)`);
        } finally {
          await pair.close();
        }
      }
  });
}
