/**
 * Faults with real threads (issue 8): READ errors at a rate, a NIC slower than the transfer timeout, and
 * lost release notifications. Every request still finishes with the colocated output (failed loads are
 * recomputed locally), nothing hangs past its deadline, and both sides get every page back.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { threadedDevice } from '../engine/devices.ts';
import { LLMEngine, type GenerateRequest } from '../engine/llm_engine.ts';
import type { OneSidedConfig } from '../connector/config.ts';
import { PdPair } from './pd_pair.ts';

const env = new RealEnv(8);
const prompts: GenerateRequest[] = Array.from({ length: 8 }, (_, i) => ({
  promptTokenIds: Array.from({ length: 10 + i * 9 }, (_, k) => (i * 313 + k * 17) % 50000),
  sampling: { maxTokens: 4, temperature: 0, ignoreEos: true },
}));

let refCache: string[] | null = null;
async function reference(): Promise<string[]> {
  if (refCache) return refCache;
  const e = await LLMEngine.create(
    {
      preset: 'dsv4-mini',
      modelSeed: 3,
      numBlocks: 128,
      asyncScheduling: true,
      scheduler: {},
      idlePollMs: 2,
      makeDevice: threadedDevice('dsv4-mini', 3),
    },
    env,
  );
  try {
    refCache = [];
    for (const p of prompts) refCache.push((await e.generate(p)).logitsHashes.join(','));
    return refCache;
  } finally {
    await e.close();
  }
}

async function run(name: string, decode: Partial<OneSidedConfig>, prefill: Partial<OneSidedConfig> = {}) {
  const ref = await reference();
  const pair = await PdPair.create(
    { preset: 'dsv4-mini', modelSeed: 3, numBlocks: 128, decode, prefill, raceCheck: true, name },
    env,
  );
  try {
    const t0 = env.nowMs();
    const got = await Promise.all(prompts.map((p) => pair.generate(p)));
    const elapsedMs = env.nowMs() - t0;
    got.forEach((r, i) => assert.equal(r.logitsHashes.join(','), ref[i], `request ${i} equals colocated`));
    for (let k = 0; k < 400 && !(pair.prefill.core.isIdle() && pair.decode.core.isIdle()); k++) await env.sleep(5);
    assert.equal(pair.prefill.kv.getNumFreeBlocks(), 127, 'prefill got every page back');
    assert.equal(pair.decode.kv.getNumFreeBlocks(), 127, 'decode got every page back');
    const races = (pair.decode.device.raceChecker as unknown as { races(): unknown[] }).races();
    assert.equal(races.length, 0, 'no race, even when READs fail or time out (aborted before pages are reused)');
    return { pair, elapsedMs };
  } finally {
    await pair.close();
  }
}

test('READ errors at rate 0.4: failed loads are recomputed, outputs equal colocated, no leak', async () => {
  const { pair } = await run('faults-rate', { faults: { readErrorRate: 0.4 } });
  assert.ok(pair.decode.scheduler.stats.loadFailures > 0, 'some READs failed');
});

test('a NIC slower than the transfer timeout: KV_READ_TIMEOUT, abort, local recompute; no request hangs', async () => {
  const { pair, elapsedMs } = await run('faults-slow', { faults: { readDelayMs: 400 }, transferTimeoutMs: 60 });
  assert.ok(
    pair.decode.scheduler.stats.loadFailures >= prompts.length - 1,
    `the READs timed out (${pair.decode.scheduler.stats.loadFailures} load failures, ${pair.decodeConnector.worker.stats.readsFailed} failed reads)`,
  );
  assert.ok(elapsedMs < 60_000, 'bounded: every request ended');
});

test('lost release notifications: the prefill lease frees the pages', async () => {
  const { pair } = await run('faults-drop', { faults: { dropNotificationRate: 1 } }, { leaseMs: 300 });
  assert.ok(
    pair.prefillConnector.scheduler.stats.leasesExpired >= prompts.length - 1,
    'freed by lease, not by release',
  );
});
