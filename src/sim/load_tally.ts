/**
 * What a world's loads did, summed over seeds: the heterogeneous-geometry tests (block_size.test.ts,
 * hetero_tp.test.ts) check with it that KV really moved (READs or WRITEs posted, none failed) and which
 * decode pages got their clipped tails zeroed.
 */
import type { OneSidedConnectorWorker } from '../connector/one_sided_worker.ts';
import { judgeEnd } from './oracles.ts';
import { SimWorld, type WorldOptions } from './world.ts';

export interface LoadTally {
  violations: number;
  reads: number;
  writes: number;
  failed: number;
  tails: number;
}

/**
 * Create, run, judge and shut down one world per seed (options from `optionsOf(seed)`), summing what each
 * counted; `onWorld` sees each world once it is over.
 */
export async function tallyWorlds(
  seeds: readonly number[],
  optionsOf: (seed: number) => WorldOptions,
  onWorld: (w: SimWorld) => void = () => {},
): Promise<LoadTally> {
  const sum: LoadTally = { violations: 0, reads: 0, writes: 0, failed: 0, tails: 0 };
  for (const seed of seeds) {
    const w = await SimWorld.create(optionsOf(seed));
    await w.run();
    await judgeEnd(w);
    await w.shutdown();
    const worker = w.D.engine.connector?.worker as OneSidedConnectorWorker;
    sum.violations += w.violations.length;
    sum.reads += worker.reads.stats.readsPosted;
    sum.writes += (w.P.engine.connector?.worker as OneSidedConnectorWorker).saves.stats.writesPosted;
    sum.failed += w.D.engine.scheduler.stats.loadFailures;
    sum.tails += worker.reads.stats.tailsZeroed + worker.recvs.stats.tailsZeroed;
    onWorld(w);
  }
  return sum;
}
