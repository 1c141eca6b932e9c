/**
 * Token-space mapping between two paged layouts of one KV cache group whose block sizes differ (issue 14;
 * vLLM PR 26759: heterogeneous block sizes; PR 49612: hybrids). A page format does not depend on the
 * block size, so a run of tokens [start, end) of a request lives at known byte ranges on each side:
 *
 *   format `tokens`: regions r = 0..R-1 (mla, compressor: one; full_attention: K then V); region r of a
 *                    page starts at blockSize * (bytes per token of the regions before r); token slot s of
 *                    region r sits at regionStart + s * regionTokenBytes[r]
 *   format `state`:  one indivisible state of stateBytes at the page start (Mamba: one per request, not
 *                    per token), moved whole whatever the block sizes
 *
 *   local  (bs 8):   | p0: t0-7 | p1: t8-15 | p2: t16-23 | p3: t24-31 |
 *   remote (bs 32):  | q0: t0-31                                       |
 *   tokens [8, 28):  p1 <- q0[8,16)   p2 <- q0[16,24)   p3 <- q0[24,28)   (one range per region each),
 *                    then coalesced; p3's slots 28-31 are not written (a clipped tail: see tailSpans).
 *
 * Offsets are slab-relative (page b at b * pageBytes). Both sides must hold every page the run touches.
 */
import { assert } from '../util/assert.ts';
import { coalesce, type TransferRange } from './layout.ts';
import { realPageBytes, tokenBytes, type KVCacheSpec } from './spec.ts';

export type PageFormat = { kind: 'tokens'; regionTokenBytes: number[] } | { kind: 'state'; stateBytes: number };

/** A spec's page format, independent of its block size. */
export function pageFormatOf(spec: KVCacheSpec): PageFormat {
  if (spec.type === 'mamba') return { kind: 'state', stateBytes: realPageBytes(spec) };
  if (spec.type === 'full_attention') {
    const slot = spec.numKvHeads * spec.headSize * 2;
    return { kind: 'tokens', regionTokenBytes: [slot, slot] };
  }
  return { kind: 'tokens', regionTokenBytes: [tokenBytes(spec)] };
}

/** Bytes of a page holding `blockSize` tokens (or the state) in this format, padding excluded. */
export function formatPageBytes(format: PageFormat, blockSize: number): number {
  if (format.kind === 'state') return format.stateBytes;
  return blockSize * format.regionTokenBytes.reduce((a, b) => a + b, 0);
}

/** One side of a transfer: the request's pages from page `firstPage` on (blockIds[i] is page firstPage + i). */
export interface PagedSide {
  blockSize: number;
  pageBytes: number;
  blockIds: readonly number[];
  firstPage: number;
}

function checkSide(format: PageFormat, s: PagedSide, start: number, end: number, what: string): void {
  assert(
    Number.isInteger(s.blockSize) && s.blockSize > 0 && formatPageBytes(format, s.blockSize) <= s.pageBytes,
    () => `${what}: ${s.blockSize} tokens of this format do not fit a page of ${s.pageBytes} bytes`,
  );
  if (format.kind === 'state') return;
  assert(
    s.firstPage * s.blockSize <= start && (s.firstPage + s.blockIds.length) * s.blockSize >= end,
    () =>
      `${what}: pages ${s.firstPage}..${s.firstPage + s.blockIds.length} of ${s.blockSize} tokens do not cover [${start}, ${end})`,
  );
}

/** Byte spans [start, end) inside one page of the slots [fromSlot, toSlot), one per region. */
export function slotSpans(
  format: PageFormat,
  blockSize: number,
  fromSlot: number,
  toSlot: number,
): Array<[number, number]> {
  assert(format.kind === 'tokens', 'a state page has no token slots');
  assert(0 <= fromSlot && fromSlot <= toSlot && toSlot <= blockSize, `bad slots [${fromSlot}, ${toSlot})`);
  if (fromSlot === toSlot) return [];
  const out: Array<[number, number]> = [];
  let regionStart = 0;
  for (const tb of format.regionTokenBytes) {
    out.push([regionStart + fromSlot * tb, regionStart + toSlot * tb]);
    regionStart += blockSize * tb;
  }
  return out;
}

/** A run of tokens inside one page on each side: `count` slots from `localSlot` / `remoteSlot`. */
export interface TokenChunk {
  localBlock: number;
  localSlot: number;
  remoteBlock: number;
  remoteSlot: number;
  count: number;
}

/**
 * The tokens [start, end) cut where a page ends on either side (local token t <-> remote token t); both
 * sides are checked to hold every page the run touches (a token format's sides).
 */
export function tokenChunks(
  format: PageFormat,
  local: PagedSide,
  remote: PagedSide,
  start: number,
  end: number,
  remoteFormat: PageFormat = format,
): TokenChunk[] {
  assert(Number.isInteger(start) && Number.isInteger(end) && 0 <= start && start <= end, `bad run [${start}, ${end})`);
  assert(format.kind === 'tokens' && remoteFormat.kind === 'tokens', 'a state page has no token slots');
  checkSide(format, local, start, end, 'local');
  checkSide(remoteFormat, remote, start, end, 'remote');
  const out: TokenChunk[] = [];
  for (let t = start; t < end;) {
    const li = Math.floor(t / local.blockSize);
    const ri = Math.floor(t / remote.blockSize);
    const runEnd = Math.min(end, (li + 1) * local.blockSize, (ri + 1) * remote.blockSize);
    out.push({
      localBlock: local.blockIds[li - local.firstPage] as number,
      localSlot: t - li * local.blockSize,
      remoteBlock: remote.blockIds[ri - remote.firstPage] as number,
      remoteSlot: t - ri * remote.blockSize,
      count: runEnd - t,
    });
    t = runEnd;
  }
  return out;
}

/** The state pages of a state group: both sides hold exactly one page, or none (then null). */
export function statePages(
  format: PageFormat,
  local: PagedSide,
  remote: PagedSide,
  remoteFormat: PageFormat = format,
): [number, number] | null {
  assert(format.kind === 'state' && remoteFormat.kind === 'state', 'a token format has no single state page');
  checkSide(format, local, 0, 0, 'local');
  checkSide(remoteFormat, remote, 0, 0, 'remote');
  assert(local.blockIds.length === remote.blockIds.length, 'a state moves page to page');
  assert(local.blockIds.length <= 1, 'one state page per request');
  const [lb, rb] = [local.blockIds[0], remote.blockIds[0]];
  return lb === undefined || rb === undefined ? null : [lb, rb];
}

/**
 * The byte ranges moving tokens [start, end) between `local` and `remote` (local token t <-> remote token
 * t), coalesced. A state group moves its one page's state (both sides hold exactly one page, or none).
 */
export function tokenRunRanges(
  format: PageFormat,
  local: PagedSide,
  remote: PagedSide,
  start: number,
  end: number,
): TransferRange[] {
  if (format.kind === 'state') {
    const pages = statePages(format, local, remote);
    if (pages === null) return [];
    const [lb, rb] = pages;
    return [{ localOffset: lb * local.pageBytes, remoteOffset: rb * remote.pageBytes, length: format.stateBytes }];
  }
  const ranges: TransferRange[] = [];
  for (const c of tokenChunks(format, local, remote, start, end)) {
    const ls = slotSpans(format, local.blockSize, c.localSlot, c.localSlot + c.count);
    const rs = slotSpans(format, remote.blockSize, c.remoteSlot, c.remoteSlot + c.count);
    ls.forEach(([s, e], r) => {
      const [rs0] = rs[r] as [number, number];
      ranges.push({
        localOffset: c.localBlock * local.pageBytes + s,
        remoteOffset: c.remoteBlock * remote.pageBytes + rs0,
        length: e - s,
      });
    });
  }
  return coalesce(ranges);
}

/**
 * The clipped tail of a run ending at token `end` on `side`: the byte spans of the last page's slots from
 * `end` to the page end, which the run does not write. Null when `end` falls on a page boundary.
 */
export function tailSpans(
  format: PageFormat,
  side: PagedSide,
  end: number,
): { block: number; spans: Array<[number, number]> } | null {
  if (format.kind === 'state' || end % side.blockSize === 0 || side.blockIds.length === 0) return null;
  const page = Math.floor(end / side.blockSize);
  const block = side.blockIds[page - side.firstPage];
  assert(block !== undefined, () => `the run's last page ${page} is not among the side's pages`);
  return { block, spans: slotSpans(format, side.blockSize, end - page * side.blockSize, side.blockSize) };
}
