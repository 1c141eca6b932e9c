/**
 * Where pages live in memory and which byte ranges a transfer copies.
 *
 * Our slabs (DESIGN.md §4): one per layer index, numBlocks pages of config.pageBytes each; a transfer
 * copies whole pages, so a READ destination is a byte copy of the source page.
 *
 *   slab s:  | page 0 (null) | page 1 | page 2 | ... |      page b at b * pageBytes
 *
 * Generic tensors (vLLM's layouts, for peers that lay out K/V differently), row-major, es = element size:
 *
 *   mla          [NB, bs, latent]        one slab per block: block b at es*b*blockStride
 *   separated    [2, NB, bs, H, D]       K region then V region: K of b at es*b*blockStride,
 *                                        V of b at es*(kvStride + b*blockStride), kvStride = NB*blockStride
 *   interleaved  [NB, 2, bs, H, D]       K and V of a block side by side: V at es*(kvStride + b*blockStride)
 *
 * A transfer list is coalesced: sorted by local offset, runs contiguous on BOTH sides merged.
 */
import { assert } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import type { KVCacheConfig } from './spec.ts';

export interface PageRange {
  slab: number;
  offset: number;
  length: number;
}

/** Byte offset of page `blockId` inside any slab. */
export function pageOffset(config: KVCacheConfig, blockId: number): number {
  assert(
    Number.isInteger(blockId) && blockId >= 0 && blockId < config.numBlocks,
    `block id ${blockId} out of range [0, ${config.numBlocks})`,
  );
  return blockId * config.pageBytes;
}

export function pageRange(config: KVCacheConfig, slab: number, blockId: number): PageRange {
  assert(
    Number.isInteger(slab) && slab >= 0 && slab < config.numSlabs,
    `slab ${slab} out of range [0, ${config.numSlabs})`,
  );
  return { slab, offset: pageOffset(config, blockId), length: config.pageBytes };
}

export function slabBytes(config: KVCacheConfig): number {
  return config.numBlocks * config.pageBytes;
}

export type KvTensorLayout = 'mla' | 'separated' | 'interleaved';

export interface LayerTransferGeometry {
  layout: KvTensorLayout;
  numBlocks: number;
  /** Remote blocks assumed when none are given to computeBlockTransferOffsets. */
  remoteNumBlocks: number;
  /** Tokens per block. */
  blockSize: number;
  /** Bytes copied per block per transfer (one K or V slab, or the MLA block). */
  blockLen: number;
  slotBytes: number;
  /** Elements between consecutive blocks. */
  blockStride: number;
  /** Elements from a block's K to its V, locally / remotely (null: key only). */
  localKvStride: number | null;
  remoteKvStride: number | null;
  transfersPerBlock: 1 | 2;
  /** K and V are registered as separate regions (the separated layout). */
  splitKvRegions: boolean;
}

function badShape(layout: string, shape: readonly number[], why: string): HandoffError {
  return new HandoffError('BAD_CONFIG', `Unsupported ${layout} cache shape [${shape.join(', ')}]: ${why}`, {
    shape: [...shape],
  });
}

/** Geometry of a contiguous (row-major) cache tensor of `shape` with `elemSize`-byte elements. */
export function layerTransferGeometry(
  shape: readonly number[],
  elemSize: number,
  opts: { remoteNumBlocks?: number; layout?: KvTensorLayout } = {},
): LayerTransferGeometry {
  if (!shape.every((d) => Number.isInteger(d) && d > 0))
    throw badShape('KV', shape, 'dimensions must be positive integers');
  if (!(Number.isInteger(elemSize) && elemSize > 0))
    throw new HandoffError('BAD_CONFIG', `element size must be a positive integer, got ${elemSize}`);
  const layout = opts.layout ?? inferLayout(shape);
  const numBlocks = layout === 'separated' ? (shape[1] as number) : (shape[0] as number);
  const remoteNumBlocks = opts.remoteNumBlocks ?? numBlocks;
  if (!(Number.isInteger(remoteNumBlocks) && remoteNumBlocks > 0))
    throw new HandoffError('BAD_CONFIG', `remoteNumBlocks must be a positive integer, got ${remoteNumBlocks}`);
  if (layout === 'mla') {
    if (shape.length !== 3) throw badShape('MLA', shape, 'expected [numBlocks, blockSize, latent]');
    const [, bs, latent] = shape as [number, number, number];
    const slotBytes = latent * elemSize;
    return {
      layout,
      numBlocks,
      remoteNumBlocks,
      blockSize: bs,
      blockLen: bs * slotBytes,
      slotBytes,
      blockStride: bs * latent,
      localKvStride: null,
      remoteKvStride: null,
      transfersPerBlock: 1,
      splitKvRegions: false,
    };
  }
  if (shape.length !== 5) throw badShape('K/V', shape, 'expected rank 5 [2, NB, bs, H, D] or [NB, 2, bs, H, D]');
  const [a, b, bs, h, d] = shape as [number, number, number, number, number];
  const slotElems = h * d;
  const blockElems = bs * slotElems; // one K (or V) block
  if (layout === 'separated') {
    if (a !== 2) throw badShape('K/V', shape, 'separated layout needs shape[0] == 2');
    return {
      layout,
      numBlocks,
      remoteNumBlocks,
      blockSize: bs,
      blockLen: blockElems * elemSize,
      slotBytes: slotElems * elemSize,
      blockStride: blockElems,
      localKvStride: b * blockElems,
      remoteKvStride: remoteNumBlocks * blockElems,
      transfersPerBlock: 2,
      splitKvRegions: true,
    };
  }
  if (b !== 2) throw badShape('K/V', shape, 'interleaved layout needs shape[1] == 2');
  return {
    layout,
    numBlocks,
    remoteNumBlocks,
    blockSize: bs,
    blockLen: blockElems * elemSize,
    slotBytes: slotElems * elemSize,
    blockStride: 2 * blockElems,
    localKvStride: blockElems,
    remoteKvStride: blockElems,
    transfersPerBlock: 2,
    splitKvRegions: false,
  };
}

function inferLayout(shape: readonly number[]): KvTensorLayout {
  if (shape.length === 3) return 'mla';
  if (shape.length !== 5) throw badShape('K/V', shape, `rank ${shape.length} is none of the three layouts`);
  if (shape[0] === 2 && shape[1] === 2)
    throw badShape('K/V', shape, 'ambiguous (2 blocks and 2 K/V): pass opts.layout');
  if (shape[0] === 2) return 'separated';
  if (shape[1] === 2) return 'interleaved';
  throw badShape('K/V', shape, 'neither shape[0] nor shape[1] is the K/V axis of size 2');
}

export interface TransferRange {
  localOffset: number;
  remoteOffset: number;
  length: number;
}

export interface BlockTransferOffsets {
  localOffsets: number[];
  remoteOffsets: number[];
  sizes: number[];
}

function checkIds(what: string, ids: readonly number[], min: number, limit: number): void {
  for (const id of ids) {
    if (!Number.isInteger(id) || id < min || id >= limit) {
      throw new HandoffError('BAD_TRANSFER_PARAMS', `${what} ${id} outside [${min}, ${limit})`);
    }
  }
}

function checkPairs(localIds: readonly number[], remoteIds: readonly number[]): void {
  if (localIds.length !== remoteIds.length) {
    throw new HandoffError(
      'BAD_TRANSFER_PARAMS',
      `local and remote block ids must have the same length (${localIds.length} vs ${remoteIds.length})`,
    );
  }
  if (new Set(localIds).size !== localIds.length) {
    throw new HandoffError(
      'BAD_TRANSFER_PARAMS',
      `local block ids must be distinct: two copies into one page (${localIds.join(',')})`,
    );
  }
}

/** Byte ranges for copying remote blocks into local ones in one layer tensor, coalesced. */
export function computeBlockTransferOffsets(
  geometry: LayerTransferGeometry,
  elemSize: number,
  localIds: readonly number[],
  remoteIds: readonly number[],
  remoteNumBlocks?: number,
): BlockTransferOffsets {
  checkPairs(localIds, remoteIds);
  const g = geometry;
  // Invariant: the geometry was derived with this element size (a K or V block is blockLen bytes).
  assert(
    g.blockLen === (g.layout === 'interleaved' ? (g.localKvStride as number) : g.blockStride) * elemSize,
    `element size ${elemSize} does not match the geometry`,
  );
  const remoteN = remoteNumBlocks ?? g.remoteNumBlocks;
  checkIds('local block id', localIds, 0, g.numBlocks);
  checkIds('remote block id', remoteIds, 0, remoteN);
  const remoteKvStride = g.layout === 'separated' ? g.blockStride * remoteN : g.remoteKvStride;
  const ranges: TransferRange[] = [];
  localIds.forEach((lb, i) => {
    const rb = remoteIds[i] as number;
    ranges.push({
      localOffset: elemSize * lb * g.blockStride,
      remoteOffset: elemSize * rb * g.blockStride,
      length: g.blockLen,
    });
    if (g.transfersPerBlock === 2) {
      ranges.push({
        localOffset: elemSize * ((g.localKvStride as number) + lb * g.blockStride),
        remoteOffset: elemSize * ((remoteKvStride as number) + rb * g.blockStride),
        length: g.blockLen,
      });
    }
  });
  const merged = coalesce(ranges);
  return {
    localOffsets: merged.map((r) => r.localOffset),
    remoteOffsets: merged.map((r) => r.remoteOffset),
    sizes: merged.map((r) => r.length),
  };
}

/** Sort by local offset and merge runs that are contiguous on both the local and the remote side. */
export function coalesce(ranges: readonly TransferRange[]): TransferRange[] {
  const sorted = [...ranges].sort((x, y) => x.localOffset - y.localOffset || x.remoteOffset - y.remoteOffset);
  const out: TransferRange[] = [];
  for (const r of sorted) {
    assert(r.length > 0 && r.localOffset >= 0 && r.remoteOffset >= 0, () => `bad transfer range ${JSON.stringify(r)}`);
    const last = out[out.length - 1];
    if (last !== undefined) {
      // Invariant: destinations never overlap (each local byte is written by one copy).
      assert(r.localOffset >= last.localOffset + last.length, () => `overlapping local ranges at ${r.localOffset}`);
      if (last.localOffset + last.length === r.localOffset && last.remoteOffset + last.length === r.remoteOffset) {
        last.length += r.length;
        continue;
      }
    }
    out.push({ localOffset: r.localOffset, remoteOffset: r.remoteOffset, length: r.length });
  }
  return out;
}

export interface SlabTransferRange extends TransferRange {
  slab: number;
}

/**
 * What the transfer engine posts to copy remote pages into local pages of our slabs: whole pages, per
 * slab in the order given, coalesced. Local ids must be real pages of this cache (1..numBlocks-1);
 * remote ids are checked against opts.remoteNumBlocks when the peer's size is known.
 */
export function slabTransferRanges(
  config: KVCacheConfig,
  slabs: readonly number[],
  localIds: readonly number[],
  remoteIds: readonly number[],
  opts: { remoteNumBlocks?: number } = {},
): SlabTransferRange[] {
  checkPairs(localIds, remoteIds);
  checkIds('local block id', localIds, 1, config.numBlocks);
  checkIds('remote block id', remoteIds, 1, opts.remoteNumBlocks ?? Number.MAX_SAFE_INTEGER);
  checkIds('slab', slabs, 0, config.numSlabs);
  if (new Set(slabs).size !== slabs.length)
    throw new HandoffError('BAD_TRANSFER_PARAMS', `slabs must be distinct (${slabs.join(',')})`);
  const pages = localIds.map((lb, i) => ({
    localOffset: lb * config.pageBytes,
    remoteOffset: (remoteIds[i] as number) * config.pageBytes,
    length: config.pageBytes,
  }));
  const merged = coalesce(pages);
  return slabs.flatMap((slab) => merged.map((r) => ({ slab, ...r })));
}
