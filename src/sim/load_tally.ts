/**
 * What a world's loads did, summed over seeds: the heterogeneous-geometry tests (block_size.test.ts,
 * hetero_tp.test.ts) check with it that KV really moved (READs or WRITEs posted, none failed) and which
 * decode pages got their clipped tails zeroed.
 */
import type { OneSidedConnectorWorker } from '../connector/one_sided_worker.ts';
import { judgeEnd } from './oracles.ts';
import type { SimWorld } from './world.ts';

export interface LoadTally {
  violations: number;
  reads: number;
  writes: number;
  failed: number;
  tails: number;
}

export function emptyLoadTally(): LoadTally {
  return { violations: 0, reads: 0, writes: 0, failed: 0, tails: 0 };
}

/** Run `w` to its end, judge it, shut it down, and add what it counted to `sum`. */
export async function runAndTally(w: SimWorld, sum: LoadTally): Promise<void> {
  await w.run();
  await judgeEnd(w);
  await w.shutdown();
  const worker = w.D.engine.connector?.worker as OneSidedConnectorWorker;
  sum.violations += w.violations.length;
  sum.reads += worker.reads.stats.readsPosted;
  sum.writes += (w.P.engine.connector?.worker as OneSidedConnectorWorker).saves.stats.writesPosted;
  sum.failed += w.D.engine.scheduler.stats.loadFailures;
  sum.tails += worker.reads.stats.tailsZeroed + worker.recvs.stats.tailsZeroed;
}
