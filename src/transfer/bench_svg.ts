/**
 * The sweep's plot as a hand-written SVG (no dependency): one panel per backend, GB/s against page size
 * (log scale), one colour per (layout, READ size); the backend solid with dots, its baseline measured in
 * the same run dashed in the same colour.
 */
import { NUM_SLABS, type BenchPoint } from './bench.ts';
import { sizeLabel } from './bench_sweep.ts';

const PANEL_W = 470;
const PANEL_H = 400;
const M = { left: 56, right: 16, top: 44, bottom: 96 };
const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b'];

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

/** A round upper bound for the y axis and its tick step. */
function niceMax(x: number): { max: number; step: number } {
  const raw = Math.max(x, 0.1) / 5;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((k) => k * mag).find((s) => s >= raw) ?? 10 * mag;
  return { max: step * Math.ceil(x / step), step };
}

function seriesKey(p: BenchPoint): string {
  return `${p.scatter ? 'scattered' : 'contiguous'}, ${sizeLabel(p.pages * NUM_SLABS * p.pageBytes)} READ`;
}

function polyline(pts: Array<[number, number]>, color: string, dashed: boolean): string {
  const d = pts.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(' ');
  return `<polyline fill="none" stroke="${color}" stroke-width="2"${dashed ? ' stroke-dasharray="6 4"' : ''} points="${d}"/>`;
}

function panel(backend: string, points: readonly BenchPoint[], x0: number): string {
  const w = PANEL_W - M.left - M.right;
  const h = PANEL_H - M.top - M.bottom;
  const sizes = [...new Set(points.map((p) => p.pageBytes))].sort((a, b) => a - b);
  const [lo, hi] = [Math.log2(sizes[0] as number), Math.log2(sizes[sizes.length - 1] as number)];
  const px = (bytes: number): number => x0 + M.left + (hi === lo ? w / 2 : ((Math.log2(bytes) - lo) / (hi - lo)) * w);
  const { max, step } = niceMax(Math.max(...points.flatMap((p) => [p.gbps, p.baselineGbps])));
  const py = (gbps: number): number => M.top + h - (gbps / max) * h;
  const out: string[] = [];
  out.push(`<text x="${x0 + PANEL_W / 2}" y="22" text-anchor="middle" font-weight="bold">${esc(backend)}</text>`);
  for (let v = 0; v <= max + 1e-9; v += step) {
    out.push(`<line x1="${x0 + M.left}" x2="${x0 + M.left + w}" y1="${py(v)}" y2="${py(v)}" stroke="#ddd"/>`);
    out.push(`<text x="${x0 + M.left - 6}" y="${py(v) + 4}" text-anchor="end">${+v.toFixed(2)}</text>`);
  }
  for (const s of sizes) {
    out.push(`<line x1="${px(s)}" x2="${px(s)}" y1="${M.top}" y2="${M.top + h}" stroke="#eee"/>`);
    out.push(`<text x="${px(s)}" y="${M.top + h + 16}" text-anchor="middle">${esc(sizeLabel(s))}</text>`);
  }
  out.push(`<text x="${x0 + M.left + w / 2}" y="${M.top + h + 34}" text-anchor="middle">page size</text>`);
  out.push(`<text transform="translate(${x0 + 14},${M.top + h / 2}) rotate(-90)" text-anchor="middle">GB/s</text>`);
  const keys = [...new Set(points.map(seriesKey))];
  keys.forEach((key, i) => {
    const color = COLORS[i % COLORS.length] as string;
    const series = points.filter((p) => seriesKey(p) === key).sort((a, b) => a.pageBytes - b.pageBytes);
    out.push(
      polyline(
        series.map((p) => [px(p.pageBytes), py(p.baselineGbps)]),
        color,
        true,
      ),
    );
    out.push(
      polyline(
        series.map((p) => [px(p.pageBytes), py(p.gbps)]),
        color,
        false,
      ),
    );
    for (const p of series) out.push(`<circle cx="${px(p.pageBytes)}" cy="${py(p.gbps)}" r="3" fill="${color}"/>`);
    const ly = M.top + h + 52 + Math.floor(i / 2) * 16;
    const lx = x0 + M.left + (i % 2) * (w / 2);
    out.push(`<line x1="${lx}" x2="${lx + 18}" y1="${ly - 4}" y2="${ly - 4}" stroke="${color}" stroke-width="2"/>`);
    out.push(`<text x="${lx + 22}" y="${ly}">${esc(key)}</text>`);
  });
  return out.join('\n');
}

/** The SVG document for a sweep's points; `title` goes on top. */
export function sweepSvg(points: readonly BenchPoint[], title: string): string {
  const backends = [...new Set(points.map((p) => p.backend))];
  const width = PANEL_W * Math.max(1, backends.length);
  const body = backends
    .map((b, i) =>
      panel(
        b,
        points.filter((p) => p.backend === b),
        i * PANEL_W,
      ),
    )
    .join('\n');
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${PANEL_H + 44}" font-family="sans-serif" font-size="11">`,
    `<rect width="100%" height="100%" fill="white"/>`,
    `<g transform="translate(0,24)">`,
    body,
    `</g>`,
    `<text x="${width / 2}" y="16" text-anchor="middle" font-size="12">${esc(title)}</text>`,
    `<text x="${width - 8}" y="${PANEL_H + 38}" text-anchor="end" fill="#666">solid: backend; dashed: its baseline, same run</text>`,
    `</svg>`,
    '',
  ].join('\n');
}
