/**
 * WRITE mode, a decode that allocates after prefill's lease ended (the request waited in decode's queue:
 * decode busy, pool full): prefill dropped the save at its lease end, so no push will ever come. Before,
 * prefill kept decode's `remote_blocks` as an orphan destination and said nothing: decode waited its whole
 * transferTimeoutMs before recomputing. Proves: prefill answers at once that it will not push, decode
 * recomputes well before its deadline, and the answer equals colocated's token for token.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { decodeParamsWrite, prefillAsk } from '../serve/pd_flow.ts';
import { PdPair } from './pd_pair.ts';

const env = new RealEnv(4);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test('WRITE: a load asked for after prefill dropped the save at its lease end recomputes at once', async () => {
  const leaseMs = 150;
  const transferTimeoutMs = 20_000;
  const pair = await PdPair.create(
    {
      preset: 'llama-mini',
      modelSeed: 3,
      numBlocks: 128,
      decode: { mode: 'write', transferTimeoutMs },
      prefill: { leaseMs },
      raceCheck: false,
      name: 'write-lease',
    },
    env,
  );
  try {
    const promptTokenIds = Array.from({ length: 40 }, (_, k) => (k * 37 + 5) % 1000);
    const sampling = { maxTokens: 4, ignoreEos: true };
    const colocated = await pair.decode.generate({ promptTokenIds, sampling });
    const ask = prefillAsk('lease-gone');
    await pair.prefill.generate({
      promptTokenIds,
      sampling: { ...sampling, maxTokens: ask.maxTokens },
      kvTransferParams: ask.kvTransferParams,
    });
    // The request waited in decode's queue past prefill's lease: prefill frees its pages, drops the save.
    const deadline = Date.now() + 5_000;
    while (pair.prefillConnector.scheduler.numHeld > 0 && Date.now() < deadline) await sleep(20);
    await sleep(4 * leaseMs);
    assert.equal(pair.prefillConnector.scheduler.numHeld, 0, 'the lease ended');
    const addr = pair.prefillConnector.transfer.address();
    const identity = {
      engineId: pair.prefillConnector.transfer.engineId,
      sideChannelHost: addr.host,
      sideChannelPort: addr.port,
      transferMode: 'write',
    };
    const started = Date.now();
    const timer = sleep(8 * leaseMs + 2_000).then(() => 'stalled');
    const load = pair.decode.generate({
      promptTokenIds,
      sampling,
      kvTransferParams: decodeParamsWrite(identity, 'lease-gone'),
    });
    const first = await Promise.race([load.then(() => 'done'), timer]);
    assert.equal(first, 'done', `decode waited for a push that will never come (${Date.now() - started} ms so far)`);
    assert.deepEqual((await load).tokenIds, colocated.tokenIds, 'recomputed answer equals colocated');
  } finally {
    await pair.close();
  }
});
