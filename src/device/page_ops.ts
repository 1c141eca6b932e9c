/**
 * The page-level work both devices share: checking an op against the slab geometry, deriving the
 * footprint of zero/copy ops, and executing them on slab views (plain or shared memory alike).
 * A page is [block * pageBytes, (block + 1) * pageBytes) of a slab.
 */
import { assert, unreachable } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import { zeroBytes } from '../util/zero_bytes.ts';
import type { DeviceOptions, PageAccess, PageSpan, StreamOp } from './types.ts';

export interface SlabGeometry {
  numSlabs: number;
  numBlocks: number;
  pageBytes: number;
}

/** Slabs are addressed with 32-bit offsets; beyond this a typed array of one slab cannot be made. */
export const SLAB_BYTES_MAX = 2 ** 31 - 1;

/** Bad sizes are configuration, not code, so they are operating errors. */
export function checkGeometry(opts: DeviceOptions): SlabGeometry {
  const { numSlabs, numBlocks, pageBytes } = opts;
  for (const [name, v] of [
    ['numSlabs', numSlabs],
    ['numBlocks', numBlocks],
    ['pageBytes', pageBytes],
  ] as const) {
    if (!Number.isInteger(v) || v <= 0)
      throw new HandoffError('BAD_CONFIG', `device ${name} must be a positive integer, got ${v}`);
  }
  if (numBlocks * pageBytes > SLAB_BYTES_MAX) {
    throw new HandoffError('BAD_CONFIG', `slab of ${numBlocks} x ${pageBytes} bytes exceeds ${SLAB_BYTES_MAX}`);
  }
  return { numSlabs, numBlocks, pageBytes };
}

/** Ranks of a device: a positive integer dividing its slab count (BAD_CONFIG otherwise). */
export function deviceRanks(opts: DeviceOptions): number {
  const ranks = opts.tensorParallelSize ?? 1;
  if (!Number.isInteger(ranks) || ranks < 1 || opts.numSlabs % ranks !== 0)
    throw new HandoffError('BAD_CONFIG', `device ranks must divide its ${opts.numSlabs} slabs, got ${ranks}`);
  return ranks;
}

function checkSlabs(slabs: readonly number[], g: SlabGeometry): void {
  for (const s of slabs) assert(Number.isInteger(s) && s >= 0 && s < g.numSlabs, `slab ${s} out of [0, ${g.numSlabs})`);
}

function checkBlock(b: number, g: SlabGeometry): void {
  assert(Number.isInteger(b) && b >= 0 && b < g.numBlocks, `block ${b} out of [0, ${g.numBlocks})`);
}

/** Programmer errors in an op (ids out of range, a copy onto itself) fail at enqueue, on the host. */
export function validateOp(op: StreamOp, g: SlabGeometry): void {
  switch (op.kind) {
    case 'zero':
      checkSlabs(op.slabs, g);
      op.blockIds.forEach((b) => checkBlock(b, g));
      return;
    case 'zero-spans':
      assert(op.spans.length > 0, 'a zero-spans op needs at least one span');
      validateFootprint(
        op.spans.map((s) => ({ ...s, write: true })),
        g,
      );
      return;
    case 'copy':
      checkSlabs(op.slabs, g);
      for (const [src, dst] of op.pairs) {
        checkBlock(src, g);
        checkBlock(dst, g);
        assert(src !== dst, `copy of block ${src} onto itself`);
      }
      return;
    case 'sleep':
      assert(Number.isFinite(op.ms) && op.ms >= 0, `sleep needs a finite ms >= 0, got ${op.ms}`);
      return;
    case 'kernel':
      assert(typeof op.name === 'string' && op.name.length > 0, 'kernel op needs a name');
      return;
    default:
      unreachable(op, 'stream op');
  }
}

export function validateFootprint(footprint: readonly PageAccess[], g: SlabGeometry): void {
  for (const a of footprint) {
    checkSlabs([a.slab], g);
    checkBlock(a.block, g);
    assert(
      Number.isInteger(a.start) && Number.isInteger(a.end) && a.start >= 0 && a.start < a.end && a.end <= g.pageBytes,
      () => `access [${a.start},${a.end}) is not a non-empty range inside a page of ${g.pageBytes} bytes`,
    );
  }
}

/**
 * What the op touches. zero writes whole pages, zero-spans its spans, copy reads src and writes dst
 * (whole pages, every listed slab), sleep touches nothing; kernels declare theirs (`declared`).
 */
export function opFootprint(op: StreamOp, declared: readonly PageAccess[] | undefined, g: SlabGeometry): PageAccess[] {
  const out: PageAccess[] = [];
  const page = (slab: number, block: number, write: boolean): PageAccess => ({
    slab,
    block,
    start: 0,
    end: g.pageBytes,
    write,
  });
  if (op.kind === 'zero') {
    for (const slab of op.slabs) for (const b of op.blockIds) out.push(page(slab, b, true));
  } else if (op.kind === 'zero-spans') {
    for (const s of op.spans) out.push({ ...s, write: true });
  } else if (op.kind === 'copy') {
    for (const slab of op.slabs) {
      for (const [src, dst] of op.pairs) out.push(page(slab, src, false), page(slab, dst, true));
    }
  }
  if (declared !== undefined) {
    validateFootprint(declared, g);
    out.push(...declared);
  }
  return out;
}

export function zeroPages(
  slabs: readonly Uint8Array[],
  pageBytes: number,
  blockIds: readonly number[],
  slabIds: readonly number[],
): void {
  for (const s of slabIds) {
    const slab = slabs[s];
    assert(slab !== undefined, `slab ${s} missing`);
    for (const b of blockIds) zeroBytes(slab, b * pageBytes, (b + 1) * pageBytes);
  }
}

export function zeroSpans(slabs: readonly Uint8Array[], pageBytes: number, spans: readonly PageSpan[]): void {
  for (const s of spans) {
    const slab = slabs[s.slab];
    assert(slab !== undefined, `slab ${s.slab} missing`);
    zeroBytes(slab, s.block * pageBytes + s.start, s.block * pageBytes + s.end);
  }
}

/** Pairs are applied in order, so a chain (1->2, 2->3) behaves like sequential copies. */
export function copyPages(
  slabs: readonly Uint8Array[],
  pageBytes: number,
  pairs: ReadonlyArray<readonly [number, number]>,
  slabIds: readonly number[],
): void {
  for (const s of slabIds) {
    const slab = slabs[s];
    assert(slab !== undefined, `slab ${s} missing`);
    for (const [src, dst] of pairs) slab.copyWithin(dst * pageBytes, src * pageBytes, (src + 1) * pageBytes);
  }
}
