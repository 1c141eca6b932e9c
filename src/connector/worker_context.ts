/**
 * What every role of the connector's worker side shares: the transfer engine, the device, the peer
 * directory (whose `readyEngine` never handshakes on the step path) and the byte ranges of pages per
 * transfer group.
 */
import { assert } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import type { Logger } from '../util/log.ts';
import type { Mutations } from '../util/mutants.ts';
import type { Device, PageAccess } from '../device/types.ts';
import { slabTransferRanges } from '../kv/layout.ts';
import { everyRankSlabs, type KVCacheConfig } from '../kv/spec.ts';
import type { TransferEngine, TransferRange } from '../transfer/core/types.ts';
import type { OneSidedConfig } from './config.ts';
import type { PeerDirectory } from './peer_directory.ts';

export class WorkerContext {
  /** Transfer groups before the first Mamba group. */
  readonly numAttnGroups: number;

  constructor(
    readonly config: OneSidedConfig,
    readonly kvConfig: KVCacheConfig,
    readonly transfer: TransferEngine,
    readonly device: Device,
    /** Transfer group → KV group id (attention groups first, then Mamba). */
    readonly transferGroupIds: number[],
    readonly env: Env,
    readonly peers: PeerDirectory,
    readonly mutations: Mutations,
    readonly log: Logger | undefined,
  ) {
    const n = transferGroupIds.findIndex((g) => kvConfig.groups[g]?.spec.type === 'mamba');
    this.numAttnGroups = n < 0 ? transferGroupIds.length : n;
  }

  /**
   * Device slabs holding a transfer group's layers, on every tensor parallel rank: with equal TP on both
   * sides, slab i (rank r's layer j) is copied to slab i, so each rank's pages reach the same rank.
   */
  private slabsOf(transferGroup: number): number[] {
    const g = this.kvConfig.groups[this.transferGroupIds[transferGroup] ?? -1];
    assert(g !== undefined, `transfer group ${transferGroup} has no KV group`);
    return everyRankSlabs(
      this.kvConfig,
      g.layerNames.map((_, i) => i),
    );
  }

  /** Byte ranges moving `local[g][i]` ⇄ `remote[g][i]` and the local pages' footprint (written). */
  rangesFor(local: number[][], remote: number[][]): { ranges: TransferRange[]; footprint: PageAccess[] } {
    const ranges: TransferRange[] = [];
    const footprint: PageAccess[] = [];
    local.forEach((ids, tg) => {
      if (ids.length === 0) return;
      const slabs = this.slabsOf(tg);
      ranges.push(...slabTransferRanges(this.kvConfig, slabs, ids, remote[tg] ?? []));
      for (const slab of slabs)
        for (const block of ids) footprint.push({ slab, block, start: 0, end: this.kvConfig.pageBytes, write: true });
    });
    return { ranges, footprint };
  }
}
