/**
 * Proves the sweep covers every (backend, page size, READ size, layout) point once, each measured and
 * verified by the bench, and that the table, the target lines and the SVG describe exactly those points
 * (one solid and one dashed line per series and panel). Speed itself is never a pass/fail.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { benchSweep, sweepHeader, sweepRow, targetLines } from './bench_sweep.ts';
import { sweepSvg } from './bench_svg.ts';

test('bench sweep: every point once, its table row, the targets it covers, and an SVG of the series', async () => {
  const seen: string[] = [];
  const points = await benchSweep({
    env: new RealEnv(3),
    backends: ['inproc', 'tcp'],
    pageSizes: [4096, 32 << 10, 256 << 10],
    readBytes: [1 << 20],
    layouts: ['scattered', 'contiguous'],
    repeats: 1,
    onPoint: (p) => void seen.push(sweepRow(p)),
  });
  assert.equal(points.length, 2 * 3 * 2);
  assert.equal(seen.length, points.length, 'each point reported as it is measured');
  const keys = new Set(points.map((p) => `${p.backend}/${p.pageBytes}/${p.scatter}`));
  assert.equal(keys.size, points.length, 'no point twice');
  for (const p of points) {
    assert.equal(p.bytes, 1 << 20, 'a READ moves the asked bytes (both slabs)');
    assert.ok(p.scatter ? p.descriptors === p.bytes / p.pageBytes : p.descriptors === 2, 'descriptors after merging');
    for (const x of [p.gbps, p.baselineGbps, p.ratio]) assert.ok(Number.isFinite(x) && x > 0);
  }
  assert.equal(
    sweepHeader().split(/\s{2,}/).length,
    sweepRow(points[0] as (typeof points)[0])
      .trim()
      .split(/\s{2,}/).length,
  );
  const targets = targetLines(points);
  assert.equal(targets.length, 3, 'tcp >= 256 KiB, tcp 32 KiB and inproc 32 KiB are all covered');
  for (const t of targets) assert.match(t, /^(met {4}|NOT met) {2}.+: \d+\/\d+ points, worst \d+\.\d\d/);
  // Per layout and READ size, the counts add up to the points each target covers.
  for (const t of targets) {
    const total = Number(/: \d+\/(\d+) points/.exec(t)?.[1]);
    const parts = [...t.matchAll(/(?:scattered|contiguous) \d+ [KM]iB (\d+)\/(\d+)/g)];
    assert.ok(parts.length > 0, t);
    assert.equal(
      parts.reduce((a, m) => a + Number(m[2]), 0),
      total,
      t,
    );
  }
  const svg = sweepSvg(points, 'title <&>');
  assert.match(svg, /^<svg [^>]*xmlns="http:\/\/www\.w3\.org\/2000\/svg"/);
  assert.ok(svg.trimEnd().endsWith('</svg>'));
  assert.ok(svg.includes('title &lt;&amp;&gt;'), 'text is escaped');
  // 2 panels x 2 series (layouts), each a solid backend line and a dashed baseline.
  assert.equal((svg.match(/<polyline /g) ?? []).length, 2 * 2 * 2);
  assert.equal((svg.match(/stroke-dasharray/g) ?? []).length, 2 * 2);
  assert.equal((svg.match(/<circle /g) ?? []).length, points.length);
});
