/**
 * Proves, on a real P/D pair (WRITE mode), that prefill's WRITE connector returns to its baseline after
 * transfers it never saves or holds:
 *  - a destination (`remote_blocks`) decode sent for a transfer prefill never computed (prefill's request
 *    aborted or refused, its leg never came: the client left, prefill answered 503), and
 *  - a `release` decode sent for such a transfer (decode refused its request or its client left first)
 * are forgotten once no timeout or lease can make them useful.
 * Before the fix: each stayed for the life of the process (20 loads: 20 destinations kept by the WRITE
 * producer, 20 releases kept by the producer, still there after every timeout and lease had passed);
 * they were dropped only all at once when 1024 had piled up (see connector/write_bounds.test.ts
 * for what that dropped).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { decodeParamsWrite } from '../serve/pd_flow.ts';
import { PdPair } from './pd_pair.ts';

const env = new RealEnv(13);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test('WRITE: destinations for transfers prefill never saves are forgotten (prefill returns to baseline)', async () => {
  const [leaseMs, transferTimeoutMs] = [200, 300];
  const pair = await PdPair.create(
    {
      preset: 'llama-mini',
      modelSeed: 3,
      numBlocks: 256,
      decode: { mode: 'write', transferTimeoutMs },
      prefill: { leaseMs, transferTimeoutMs },
      raceCheck: false,
      name: 'orphan-dest',
    },
    env,
  );
  try {
    const saves = pair.prefillConnector.worker.saves;
    const prompt = (k: number) => Array.from({ length: 40 }, (_, i) => (i * 37 + k * 11 + 5) % 1000);
    const sampling = { maxTokens: 2, ignoreEos: true };
    await pair.generateWrite({ promptTokenIds: prompt(0), sampling }); // warm: the pair has handshaken
    const baseline = saves.numDestinationsWithoutSave;
    const addr = pair.prefillConnector.transfer.address();
    const identity = {
      engineId: pair.prefillConnector.transfer.engineId,
      sideChannelHost: addr.host,
      sideChannelPort: addr.port,
      transferMode: 'write',
    };
    // 20 decode legs whose prefill leg never ran: decode tells prefill where to write, then recomputes.
    const N = 20;
    const loads = Array.from({ length: N }, (_, i) =>
      pair.decode
        .generate({
          promptTokenIds: prompt(i + 1),
          sampling,
          kvTransferParams: decodeParamsWrite(identity, `gone-${i}`),
        })
        .catch(() => null),
    );
    await Promise.all(loads);
    assert.ok(saves.numDestinationsWithoutSave > baseline, 'the destinations reached prefill');
    // Every timeout and lease has passed; prefill serves more requests (it steps).
    await sleep(3 * Math.max(leaseMs, transferTimeoutMs));
    for (let i = 0; i < 2; i++) await pair.generateWrite({ promptTokenIds: prompt(100 + i), sampling });
    assert.equal(
      saves.numDestinationsWithoutSave,
      baseline,
      `destinations of transfers prefill never saved are still kept: ${saves.numDestinationsWithoutSave}`,
    );
  } finally {
    await pair.close();
  }
});

test('WRITE: releases of transfers prefill never holds are forgotten (prefill returns to baseline)', async () => {
  const [leaseMs, transferTimeoutMs] = [200, 300];
  const pair = await PdPair.create(
    {
      preset: 'llama-mini',
      modelSeed: 3,
      numBlocks: 128,
      decode: { mode: 'write', transferTimeoutMs },
      prefill: { leaseMs, transferTimeoutMs },
      raceCheck: false,
      name: 'early-release',
    },
    env,
  );
  try {
    const producer = pair.prefillConnector.worker.producer;
    const prompt = (k: number) => Array.from({ length: 40 }, (_, i) => (i * 37 + k * 11 + 5) % 1000);
    const sampling = { maxTokens: 2, ignoreEos: true };
    await pair.generateWrite({ promptTokenIds: prompt(0), sampling }); // warm: the pair has handshaken
    const baseline = producer.numReleasedEarly;
    const addr = pair.prefillConnector.transfer.address();
    const identity = {
      engineId: pair.prefillConnector.transfer.engineId,
      sideChannelHost: addr.host,
      sideChannelPort: addr.port,
      transferMode: 'write',
    };
    // 20 decode legs that never start (their client left): decode releases prefill's transfer, which
    // prefill never held (its own leg was aborted too).
    const N = 20;
    for (let i = 0; i < N; i++) assert.ok(pair.decode.releaseUnused(decodeParamsWrite(identity, `gone-${i}`)));
    for (let k = 0; k < 100 && producer.numReleasedEarly < baseline + N; k++) await sleep(20);
    assert.equal(producer.numReleasedEarly, baseline + N, 'the releases reached prefill');
    await sleep(3 * Math.max(leaseMs, transferTimeoutMs));
    for (let i = 0; i < 2; i++) await pair.generateWrite({ promptTokenIds: prompt(100 + i), sampling });
    assert.equal(
      producer.numReleasedEarly,
      baseline,
      `releases of transfers prefill never held are still kept: ${producer.numReleasedEarly}`,
    );
  } finally {
    await pair.close();
  }
});
