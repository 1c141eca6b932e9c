/**
 * A small self-contained HTML timeline of a simulated run: one row per lane (proxy; host, compute
 * and NIC of each instance), ops and work requests as boxes on virtual time, host actions as ticks,
 * the racing pair outlined in red with the race named above. No network, no dependencies: the trace
 * is embedded as JSON and drawn by an inline script, so the file opens anywhere.
 */
import type { SimTrace } from './trace.ts';

/** JSON that is safe inside a <script> element. */
function embed(value: unknown): string {
  return JSON.stringify(value)
    .replace(/</g, '\\u003c')
    .replace(/\u2028/g, '\\u2028')
    .replace(/\u2029/g, '\\u2029');
}

function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

const STYLE = `
body{font:13px system-ui,sans-serif;margin:12px;color:#222}
h1{font-size:16px;margin:0 0 6px}
#races li{color:#b00}
#controls{margin:8px 0}
#chart{position:relative;overflow-x:auto;border:1px solid #ccc}
.row{position:relative;height:26px;border-bottom:1px solid #eee}
.label{position:sticky;left:0;z-index:2;display:inline-block;width:110px;height:26px;line-height:26px;background:#fafafa;border-right:1px solid #ddd;padding-left:4px;font-weight:600}
.span{position:absolute;top:4px;height:18px;border-radius:3px;overflow:hidden;white-space:nowrap;font-size:11px;line-height:18px;padding:0 2px;box-sizing:border-box;min-width:2px}
.k-compute{background:#8ab6e8}.k-nic{background:#a8d8a0}.k-proxy{background:#e8d28a}.k-host{background:#ccc}
.span.race{outline:3px solid #d00;z-index:1;background:#f4a0a0}
.tick{position:absolute;top:2px;width:1px;height:22px;background:#555}
.tick.violation{background:#d00;width:3px}
`;

const SCRIPT = `
const T = JSON.parse(document.getElementById('trace').textContent);
const rows = [['proxy','proxy']];
for (const p of [...new Set([...T.spans, ...T.instants].map(s => s.process))].filter(p => p !== 'proxy').sort())
  for (const lane of ['host','compute','nic']) rows.push([p, lane]);
const times = [...T.spans.map(s => s.startMs + s.durMs), ...T.instants.map(i => i.atMs), ...T.requests.map(r => r.endMs), 0.001];
const end = Math.max(...times);
const chart = document.getElementById('chart');
const scaleInput = document.getElementById('scale');
// Long (real-run) timelines start fitted to the window; the slider still zooms in.
const fit = Math.max(0.01, (document.documentElement.clientWidth - 160) / end);
if (Number(scaleInput.value) * end > 20000) scaleInput.value = String(fit);
function draw() {
  const width = Math.max(600, Number(scaleInput.value) * end);
  const x = ms => 110 + (ms / end) * width;
  chart.innerHTML = '';
  for (const [p, lane] of rows) {
    const row = document.createElement('div');
    row.className = 'row';
    row.dataset.lane = p + '/' + lane;
    row.style.width = (width + 120) + 'px';
    const label = document.createElement('span');
    label.className = 'label';
    label.textContent = p === 'proxy' ? 'proxy' : p + ' ' + lane;
    row.appendChild(label);
    const boxes = p === 'proxy'
      ? T.requests.map(r => ({ name: 'request ' + r.index + ' ' + r.outcome, startMs: r.startMs, durMs: r.endMs - r.startMs, race: null, key: 'request-' + r.index, lane: 'proxy' }))
      : T.spans.filter(s => s.process === p && s.lane === lane);
    for (const s of boxes) {
      const d = document.createElement('div');
      d.className = 'span k-' + s.lane + (s.race ? ' race' : '');
      d.style.left = x(s.startMs) + 'px';
      d.style.width = Math.max(2, x(s.startMs + s.durMs) - x(s.startMs)) + 'px';
      if (s.lane === 'proxy') {
        const h = Math.max(3, Math.floor(22 / Math.max(1, T.requests.length)));
        d.style.top = (2 + Number(s.key.slice(8)) * h) + 'px';
        d.style.height = (h - 1) + 'px';
        d.style.lineHeight = (h - 1) + 'px';
      }
      d.textContent = s.name;
      d.title = s.key + ': ' + s.name + ' @' + s.startMs.toFixed(3) + 'ms +' + s.durMs.toFixed(3) + 'ms' + (s.race ? '\\nRACE: ' + s.race : '');
      row.appendChild(d);
    }
    for (const i of T.instants.filter(i => i.process === p && i.lane === lane)) {
      const t = document.createElement('div');
      t.className = 'tick' + (i.name.startsWith('violation') ? ' violation' : '');
      t.style.left = x(i.atMs) + 'px';
      t.title = i.name + ' @' + i.atMs.toFixed(3) + 'ms';
      row.appendChild(t);
    }
    chart.appendChild(row);
  }
  document.body.dataset.rendered = String(chart.querySelectorAll('.span').length);
}
scaleInput.addEventListener('input', draw);
const list = document.getElementById('races');
for (const r of T.races) { const li = document.createElement('li'); li.textContent = r.text; list.appendChild(li); }
draw();
`;

export function timelineHtml(t: SimTrace): string {
  return [
    '<!doctype html>',
    '<html><head><meta charset="utf-8">',
    `<title>${escapeHtml(t.title)}</title>`,
    `<style>${STYLE}</style></head><body>`,
    `<h1>${escapeHtml(t.title)}</h1>`,
    `<div>${t.spans.length} actions, ${t.requests.length} requests, ${t.races.length} race(s) highlighted in red</div>`,
    '<ul id="races"></ul>',
    '<div id="controls">px per ms <input id="scale" type="range" min="0.01" max="400" step="any" value="40"></div>',
    '<div id="chart"></div>',
    `<script id="trace" type="application/json">${embed(t)}</script>`,
    `<script>${SCRIPT}</script>`,
    '</body></html>',
  ].join('\n');
}
