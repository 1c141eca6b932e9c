/**
 * What every role of the connector's worker side shares: the transfer engine, the device, the peer
 * directory (whose `readyEngine` never handshakes on the step path), and the byte ranges a transfer moves
 * per transfer group in token space (the peer's block size and page size may differ from ours) and per
 * tensor parallel rank pair (its degree may differ from ours: kv/tp_map.ts), with the clipped tails they
 * leave. A range's slab on each side is rank * numLayerSlabs + layer slab of that side.
 */
import { assert } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import type { Logger } from '../util/log.ts';
import type { Mutations } from '../util/mutants.ts';
import type { Device, PageAccess, PageSpan } from '../device/types.ts';
import { everyRankSlabs, wholeSpec, type KVCacheConfig, type KVCacheGroupSpec } from '../kv/spec.ts';
import { pageFormatOf, tailSpans, type PagedSide } from '../kv/token_map.ts';
import { tpRunRanges } from '../kv/tp_map.ts';
import { HandoffError } from '../util/errors.ts';
import { DESCRIPTORS_MAX } from '../transfer/core/handle_wait.ts';
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
   * Entries about a transfer this side has no save or hold of (a destination, an early release) that came
   * before this time are forgotten: its request will not finish here within the longer of the lease and the
   * transfer timeout (it was aborted, refused, or never came).
   */
  staleBeforeMs(): number {
    return this.env.nowMs() - Math.max(this.config.leaseMs, this.config.transferTimeoutMs);
  }

  /** Our tokens per page in a transfer group. */
  blockSizeOf(transferGroup: number): number {
    return this.groupOf(transferGroup).spec.blockSize;
  }

  /** Device slabs holding a transfer group's layers, on every tensor parallel rank (its clipped tails). */
  private slabsOf(transferGroup: number): number[] {
    return everyRankSlabs(
      this.kvConfig,
      this.groupOf(transferGroup).layerNames.map((_, i) => i),
    );
  }

  private groupOf(transferGroup: number): KVCacheGroupSpec {
    const g = this.kvConfig.groups[this.transferGroupIds[transferGroup] ?? -1];
    assert(g !== undefined, `transfer group ${transferGroup} has no KV group`);
    return g;
  }

  /**
   * A peer's geometry from its handshake: its page size and tokens per page per transfer group. A peer
   * without page formats had to match ours exactly (transfer/core/metadata.ts), so its sizes are ours.
   */
  peerGeometry(peerEngineId: string): PeerGeometry {
    const meta = this.transfer.peerMetadata(peerEngineId);
    if (meta === null)
      throw new HandoffError('PEER_UNAVAILABLE', `no handshake with ${peerEngineId}: its page geometry is unknown`);
    const tp = meta.layout.tensorParallelSize;
    return {
      pageBytes: meta.layout.pageBytes,
      numBlocks: meta.layout.numBlocks,
      blockSizes: this.transferGroupIds.map((g) => meta.layout.blockSizes[g] ?? 0),
      tensorParallelSize: tp,
      numLayerSlabs: meta.layout.numSlabs / tp,
    };
  }

  /**
   * Byte ranges moving tokens [start, end) of each transfer group between our pages `local` and the
   * peer's pages `remote` (token t <-> token t, a state group's page whole; kv/token_map.ts), between each
   * rank pair (kv/tp_map.ts), in every layer slab of the group; and the footprint of our pages: exactly
   * the bytes moved (`write`: a READ writes them, a WRITE reads them).
   */
  rangesFor(
    plan: TransferPlan,
    peer: PeerGeometry,
    write: boolean,
  ): { ranges: TransferRange[]; footprint: PageAccess[] } {
    const ranges: TransferRange[] = [];
    const footprint: PageAccess[] = [];
    const ours = this.kvConfig;
    plan.local.forEach((ids, tg) => {
      if (ids.length === 0) return;
      const [start, end] = plan.runs[tg] ?? [0, 0];
      const group = this.groupOf(tg);
      const theirs = {
        ...sideAt(peer.blockSizes[tg] ?? 0, start),
        pageBytes: peer.pageBytes,
        blockIds: plan.remote[tg] ?? [],
        tp: peer.tensorParallelSize,
      };
      const pieces = tpRunRanges(
        wholeSpec(group.spec, ours.tensorParallelSize),
        { ...this.side(tg, ids, start), tp: ours.tensorParallelSize },
        theirs,
        { start, end, localIsDestination: write },
        this.mutations.tpMapFaults,
      );
      group.layerNames.forEach((_, layer) => {
        for (const { localRank, remoteRank, ...r } of pieces) {
          const slab = localRank * ours.numLayerSlabs + layer;
          const remoteSlab = remoteRank * peer.numLayerSlabs + layer;
          ranges.push(remoteSlab === slab ? { ...r, slab } : { ...r, slab, remoteSlab });
          footprint.push(...pagesOf(slab, r.localOffset, r.length, ours.pageBytes, write));
        }
      });
    });
    return { ranges, footprint };
  }

  /**
   * rangesFor cut into work requests of at most DESCRIPTORS_MAX ranges each (what one work request may
   * carry; the simulator's split-transfer fault: fewer), each with the footprint of its own ranges. Between
   * degrees a slot costs one range per region, rank pair and layer, so a long prompt needs several (a GQA
   * model of two layers: past 8,192 tokens).
   */
  workRequestsFor(
    plan: TransferPlan,
    peer: PeerGeometry,
    write: boolean,
  ): Array<{ ranges: TransferRange[]; footprint: PageAccess[] }> {
    const { ranges } = this.rangesFor(plan, peer, write);
    const max = Math.min(this.config.rangesPerWorkRequest ?? DESCRIPTORS_MAX, DESCRIPTORS_MAX);
    assert(Number.isInteger(max) && max > 0, 'rangesPerWorkRequest must be a positive integer');
    const out: Array<{ ranges: TransferRange[]; footprint: PageAccess[] }> = [];
    // Mutant split-tail-dropped: work requests counted as floor(ranges / max), a partial last one lost.
    const end = this.mutations.postPartialWorkRequest ? ranges.length : Math.floor(ranges.length / max) * max;
    for (let at = 0; at === 0 || at < end; at += max) {
      const part = ranges.slice(at, at + max);
      const footprint = part.flatMap((r) => pagesOf(r.slab, r.localOffset, r.length, this.kvConfig.pageBytes, write));
      out.push({ ranges: part, footprint });
    }
    return out;
  }

  /**
   * The clipped tails of a load into our pages: per attention group, the slots of the last destination
   * page past the transferred tokens (a page larger than the peer's pages it received), in every slab of
   * the group. Empty when the cache needs no zeroing (one precision, no Mamba: stale bytes are harmless).
   */
  clippedTails(plan: Pick<TransferPlan, 'local' | 'runs'>): PageSpan[] {
    if (!this.kvConfig.needsKvCacheZeroing) return [];
    const out: PageSpan[] = [];
    plan.local.forEach((ids, tg) => {
      const [start, end] = plan.runs[tg] ?? [0, 0];
      if (tg >= this.numAttnGroups || ids.length === 0) return;
      const tail = tailSpans(pageFormatOf(this.groupOf(tg).spec), this.side(tg, ids, start), end);
      if (tail === null) return;
      for (const slab of this.slabsOf(tg))
        for (const [s, e] of tail.spans) out.push({ slab, block: tail.block, start: s, end: e });
    });
    return out;
  }

  /** Our pages `ids` of a transfer group, the first holding token `start` (checked: real pages of this cache). */
  private side(tg: number, ids: readonly number[], start: number): PagedSide {
    for (const b of ids)
      if (!Number.isInteger(b) || b < 1 || b >= this.kvConfig.numBlocks)
        throw new HandoffError('BAD_TRANSFER_PARAMS', `local block id ${b} outside [1, ${this.kvConfig.numBlocks})`);
    return { ...sideAt(this.groupOf(tg).spec.blockSize, start), pageBytes: this.kvConfig.pageBytes, blockIds: ids };
  }
}

/** A peer's pages: page size, tokens per page per transfer group, its degree and layer slabs per rank. */
export interface PeerGeometry {
  pageBytes: number;
  /** Pages per slab of the peer's pool: its page ids are in [1, numBlocks). */
  numBlocks: number;
  blockSizes: number[];
  tensorParallelSize: number;
  numLayerSlabs: number;
}

/**
 * A peer's page ids (a client's remote_block_ids, a decode's WRITE destination) must be pages of its pool
 * before they become byte offsets: BAD_TRANSFER_PARAMS if not.
 */
export function checkPeerPages(groups: unknown, peer: PeerGeometry, peerEngineId: string, param: string): void {
  const pool = `${peerEngineId} has pages [1, ${peer.numBlocks})`;
  const bad = (what: string): HandoffError =>
    new HandoffError('BAD_TRANSFER_PARAMS', `${param} ${what}; ${pool}`, { param });
  if (!Array.isArray(groups)) throw bad('is not a list of page lists');
  for (const ids of groups as unknown[]) {
    if (!Array.isArray(ids)) throw bad('is not a list of page lists');
    for (const b of ids as unknown[])
      if (!Number.isSafeInteger(b) || (b as number) < 1 || (b as number) >= peer.numBlocks)
        throw bad(`names page ${String(b).slice(0, 40)}`);
  }
}

/** A range of our slab as one access per page it runs over (a coalesced range may span several). */
function pagesOf(slab: number, offset: number, length: number, pageBytes: number, write: boolean): PageAccess[] {
  const out: PageAccess[] = [];
  for (let at = offset; at < offset + length;) {
    const block = Math.floor(at / pageBytes);
    const end = Math.min(offset + length, (block + 1) * pageBytes);
    out.push({ slab, block, start: at - block * pageBytes, end: end - block * pageBytes, write });
    at = end;
  }
  return out;
}

/** What moves: per transfer group our pages, the peer's pages (both in token order) and the tokens. */
export interface TransferPlan {
  local: number[][];
  remote: number[][];
  runs: Array<[number, number]>;
}

function sideAt(blockSize: number, start: number): { blockSize: number; firstPage: number } {
  return { blockSize, firstPage: blockSize > 0 ? Math.floor(start / blockSize) : 0 };
}
