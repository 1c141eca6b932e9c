/**
 * `handoff bench transfer --sweep`: bench.ts over page sizes x READ sizes x page layouts x backends,
 * each point against its own baseline measured in the same run, printed as a table (one row per point,
 * as it is measured), checked against the issue's targets, and drawn as an SVG of GB/s vs page size
 * with each series' baseline beside it (dashed). One pair of engines per (backend, page size).
 *
 *   layout 'scattered': remote page i -> a shuffled local page: nothing coalesces, one descriptor per page
 *   layout 'contiguous': remote page i -> local page i: the engine merges them into one range per slab
 */
import type { Env } from '../util/env.ts';
import { BenchRig, NUM_SLABS, type BenchPoint } from './bench.ts';
import type { TransferBackend } from './core/types.ts';

export const SWEEP_PAGE_SIZES = [4, 16, 32, 64, 256, 1024, 4096].map((k) => k << 10);
/** Bytes moved by one READ (both slabs). */
export const SWEEP_READ_BYTES = [8 << 20, 64 << 20];
export const SWEEP_LAYOUTS = ['scattered', 'contiguous'] as const;

export interface SweepOptions {
  env: Env;
  backends: readonly TransferBackend[];
  pageSizes?: readonly number[];
  readBytes?: readonly number[];
  layouts?: ReadonlyArray<(typeof SWEEP_LAYOUTS)[number]>;
  /** Timed rounds per point (after one warm-up). Default 3. */
  repeats?: number;
  /** Called with each point as soon as it is measured. */
  onPoint?: (p: BenchPoint) => void;
}

export async function benchSweep(o: SweepOptions): Promise<BenchPoint[]> {
  const pageSizes = o.pageSizes ?? SWEEP_PAGE_SIZES;
  const readBytes = o.readBytes ?? SWEEP_READ_BYTES;
  const layouts = o.layouts ?? SWEEP_LAYOUTS;
  const points: BenchPoint[] = [];
  for (const backend of o.backends) {
    for (const pageBytes of pageSizes) {
      const pagesOf = (bytes: number): number => Math.max(1, Math.floor(bytes / NUM_SLABS / pageBytes));
      const rig = await BenchRig.create(backend, o.env, pageBytes, Math.max(...readBytes.map(pagesOf)));
      try {
        for (const bytes of readBytes) {
          for (const layout of layouts) {
            const p = await rig.measure(pagesOf(bytes), layout === 'scattered', o.repeats ?? 3);
            points.push(p);
            o.onPoint?.(p);
          }
        }
      } finally {
        await rig.close();
      }
    }
  }
  return points;
}

export function sizeLabel(bytes: number): string {
  if (bytes >= 1 << 20 && bytes % (1 << 20) === 0) return `${bytes >> 20} MiB`;
  if (bytes >= 1 << 10 && bytes % (1 << 10) === 0) return `${bytes >> 10} KiB`;
  return `${bytes} B`;
}

const COLUMNS: Array<[string, number, (p: BenchPoint) => string]> = [
  ['backend', 7, (p) => p.backend],
  ['layout', 11, (p) => (p.scatter ? 'scattered' : 'contiguous')],
  ['page', 8, (p) => sizeLabel(p.pageBytes)],
  ['READ', 7, (p) => sizeLabel(p.bytes)],
  ['pages', 6, (p) => String(p.pages * NUM_SLABS)],
  ['descr', 6, (p) => String(p.descriptors)],
  ['GB/s', 6, (p) => p.gbps.toFixed(2)],
  ['base GB/s', 9, (p) => p.baselineGbps.toFixed(2)],
  ['ratio', 5, (p) => p.ratio.toFixed(2)],
  ['hot memcpy', 10, (p) => (p.hotMemcpyGbps === undefined ? '-' : p.hotMemcpyGbps.toFixed(2))],
  ['round trip', 10, (p) => (p.roundTripGbps === undefined ? '-' : p.roundTripGbps.toFixed(2))],
];

export function sweepHeader(): string {
  return `${COLUMNS.map(([h, w]) => h.padStart(w)).join('  ')}  baseline (the fastest on this READ)`;
}

export function sweepRow(p: BenchPoint): string {
  return `${COLUMNS.map(([, w, f]) => f(p).padStart(w)).join('  ')}  ${p.baseline}`;
}

/** The targets, as ratios measured in the same run. */
export const TARGETS: ReadonlyArray<{
  what: string;
  backend: TransferBackend;
  pages: (b: number) => boolean;
  min: number;
}> = [
  {
    what: 'tcp >= 0.9 of the tuned raw socket at >= 256 KiB pages',
    backend: 'tcp',
    pages: (b) => b >= 256 << 10,
    min: 0.9,
  },
  {
    what: 'tcp >= 0.7 of the tuned raw socket at 32 KiB pages',
    backend: 'tcp',
    pages: (b) => b === 32 << 10,
    min: 0.7,
  },
  { what: 'inproc >= 0.8 of memcpy at 32 KiB pages', backend: 'inproc', pages: (b) => b === 32 << 10, min: 0.8 },
];

/** Points at or above `min` per (layout, READ size): "contiguous 64 MiB 3/3, ...". */
function byLayout(points: readonly BenchPoint[], min: number): string {
  const groups = new Map<string, { met: number; n: number }>();
  for (const p of points) {
    const key = `${p.scatter ? 'scattered' : 'contiguous'} ${sizeLabel(p.bytes)}`;
    const g = groups.get(key) ?? { met: 0, n: 0 };
    g.n++;
    if (p.ratio >= min) g.met++;
    groups.set(key, g);
  }
  return [...groups].map(([k, g]) => `${k} ${g.met}/${g.n}`).join(', ');
}

/** One line per target: met or not, with the worst point it covers, and the count per layout and READ size. */
export function targetLines(points: readonly BenchPoint[]): string[] {
  const out: string[] = [];
  for (const t of TARGETS) {
    const covered = points.filter((p) => p.backend === t.backend && t.pages(p.pageBytes));
    if (covered.length === 0) continue;
    const worst = covered.reduce((a, b) => (b.ratio < a.ratio ? b : a));
    const met = covered.filter((p) => p.ratio >= t.min).length;
    const where = `${sizeLabel(worst.pageBytes)} ${worst.scatter ? 'scattered' : 'contiguous'}, ${sizeLabel(worst.bytes)} READ`;
    out.push(
      `${met === covered.length ? 'met    ' : 'NOT met'}  ${t.what}: ${met}/${covered.length} points, worst ${worst.ratio.toFixed(2)} (${where}); ${byLayout(covered, t.min)}`,
    );
  }
  return out;
}
