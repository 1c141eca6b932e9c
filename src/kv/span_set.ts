/**
 * Byte spans per slab inside one page: sorted, disjoint, touching spans merged. What the page lifecycle
 * oracle keeps of a page filled only in part (which bytes a transfer landed, a zeroing cleared or a
 * forward wrote), to tell whether a read covers stale bytes.
 */
export type SlabSpans = Map<number, Array<[number, number]>>;

interface Span {
  slab: number;
  start: number;
  end: number;
}

export function addSpan(set: SlabSpans, s: Span): void {
  const list = set.get(s.slab) ?? [];
  let [start, end] = [s.start, s.end];
  const kept: Array<[number, number]> = [];
  for (const [a, b] of list) {
    if (b < start || a > end) kept.push([a, b]);
    else [start, end] = [Math.min(a, start), Math.max(b, end)];
  }
  kept.push([start, end]);
  kept.sort((x, y) => x[0] - y[0]);
  set.set(s.slab, kept);
}

/** The first run of bytes of `s` outside the set, or null when the set covers `s`. */
export function firstGap(set: SlabSpans, s: Span): [number, number] | null {
  let at = s.start;
  for (const [a, b] of set.get(s.slab) ?? []) {
    if (b <= at) continue;
    if (a > at) return [at, Math.min(a, s.end)];
    at = b;
    if (at >= s.end) return null;
  }
  return at < s.end ? [at, s.end] : null;
}

/** Some byte of `s` lies in the set. */
export function overlaps(set: SlabSpans, s: Span): boolean {
  return (set.get(s.slab) ?? []).some(([a, b]) => a < s.end && s.start < b);
}
