/**
 * PdPair's WRITE flow (src/sim/pd_pair.ts) runs both legs at once, as the proxy does. When the prefill
 * leg fails, pdFlow aborts the decode leg through its AbortSignal; PdPair's legs ignored those signals.
 * Found under pool pressure with a smaller prefill block size: prefill refused a request (OUT_OF_PAGES),
 * decode kept it parked in WAITING_FOR_REMOTE_KVS holding its pages for transferTimeoutMs (30 s) while
 * the other requests on decode waited for those pages, and generateWrite rejected only after those 30 s.
 * Before the fix this test timed out (the rejection did not come within 15 s); after it, generateWrite
 * rejects with prefill's OUT_OF_PAGES at once and decode's pages are back in the pool.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { PdPair } from './pd_pair.ts';

const env = new RealEnv(4);

test(
  'WRITE pair: a prefill leg that fails aborts the decode leg (no 30 s park holding decode pages)',
  { timeout: 15_000 },
  async () => {
    const numBlocks = 12;
    const pair = await PdPair.create(
      {
        preset: 'dsv4-mini',
        modelSeed: 2,
        numBlocks,
        decode: { mode: 'write' },
        raceCheck: false,
        name: 'write-abort',
        prefillBlockSize: 8, // 60 tokens need 8 pages per group here: more than prefill has
        decodeBlockSize: 16, // 4 per group on decode: it accepts and parks for the WRITE
      },
      env,
    );
    try {
      const g = {
        promptTokenIds: Array.from({ length: 60 }, (_, k) => (k * 37) % 50000),
        sampling: { maxTokens: 4, temperature: 0, seed: 1, ignoreEos: true },
      };
      await assert.rejects(pair.generateWrite(g), (e: Error & { code?: string }) => e.code === 'OUT_OF_PAGES');
      for (let k = 0; k < 200 && !pair.decode.core.isIdle(); k++) await env.sleep(5);
      assert.equal(pair.decode.scheduler.numWaiting, 0, 'the decode leg was aborted');
      assert.equal(pair.decode.kv.getNumFreeBlocks(), numBlocks - 1, 'its pages are back in the pool');
    } finally {
      await pair.close();
    }
  },
);
