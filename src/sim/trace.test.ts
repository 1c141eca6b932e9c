/**
 * Traces of simulated runs: the Chrome trace-event JSON has a process per instance with host, compute
 * and NIC threads, one slice per action, and the racing pair of a zero-none run marked; the HTML
 * timeline draws every slice with the race outlined in headless Chromium (skipped, with the reason,
 * where /usr/bin/chromium or playwright-core is missing).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { toChromeTrace } from './trace.ts';
import { traceSim, writeTrace } from './trace_export.ts';

const CHROMIUM = '/usr/bin/chromium';

/** What the page functions touch (the project's type check has no DOM library). */
interface DomElement {
  textContent: string | null;
  getAttribute(name: string): string | null;
}
/** The part of playwright-core this test uses (typed here so type checking does not need the package). */
interface Browser {
  newPage(): Promise<{
    on(event: 'pageerror', fn: (e: Error) => void): void;
    goto(url: string): Promise<unknown>;
    waitForSelector(sel: string): Promise<unknown>;
    $$eval<R>(sel: string, fn: (els: DomElement[]) => R): Promise<R>;
  }>;
  close(): Promise<void>;
}
interface PlaywrightLike {
  chromium: { launch(o: { executablePath: string; args: string[] }): Promise<Browser> };
}

const racy = traceSim({ scenario: '1p1d', strategy: 'random', mutant: 'zero-none', faults: false }, 2);

test('chrome trace: processes P, D and proxy with named threads; every action a slice; the racing pair marked', async () => {
  const { trace, result } = await racy;
  assert.ok(
    result.violations.some((v) => v.oracle === 'race'),
    'zero-none races the zeroing with the READ',
  );
  const ct = toChromeTrace(trace);
  const names = ct.traceEvents
    .filter((e) => e['ph'] === 'M' && e['name'] === 'thread_name')
    .map((e) => (e['args'] as { name: string }).name);
  assert.deepEqual(new Set(names), new Set(['proxy', 'host', 'compute', 'nic']));
  const slices = ct.traceEvents.filter((e) => e['ph'] === 'X');
  assert.equal(slices.length, trace.spans.length);
  assert.ok(
    slices.every((e) => typeof e['ts'] === 'number' && typeof e['dur'] === 'number' && (e['dur'] as number) > 0),
  );
  const marked = slices.filter((e) => e['cname'] === 'terrible');
  assert.ok(
    marked.some((e) => e['name'] === 'zero') && marked.some((e) => String(e['name']).startsWith('read')),
    'zero op and READ are both highlighted',
  );
  assert.ok(
    ct.traceEvents.some((e) => e['ph'] === 's') && ct.traceEvents.some((e) => e['ph'] === 'f'),
    'a flow arrow joins the pair',
  );
  assert.equal(ct.traceEvents.filter((e) => e['ph'] === 'b').length, trace.requests.length);
});

test('trace files: <base>.json parses as the Chrome trace, <base>.html embeds the same run', async (t) => {
  const { trace } = await racy;
  const dir = mkdtempSync(join(tmpdir(), 'handoff-trace-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const out = writeTrace(trace, join(dir, 'run'));
  const parsed = JSON.parse(readFileSync(out.json, 'utf8')) as { traceEvents: unknown[] };
  assert.equal(parsed.traceEvents.length, toChromeTrace(trace).traceEvents.length);
  const html = readFileSync(out.html, 'utf8');
  assert.match(html, /^<!doctype html>/);
  assert.ok(!/<script[^>]+src=/.test(html) && !/<link/.test(html), 'self-contained: no external script or stylesheet');
});

test('HTML timeline renders in headless Chromium: one row per lane, every slice drawn, the race outlined', async (t) => {
  if (!existsSync(CHROMIUM)) return t.skip(`${CHROMIUM} not found (apt-get install -y chromium)`);
  let chromium: PlaywrightLike['chromium'];
  try {
    const name = 'playwright-core'; // not a dependency of the build: only this test needs it
    ({ chromium } = (await import(name)) as PlaywrightLike);
  } catch {
    return t.skip('playwright-core is not installed (npm install playwright-core@1.65.1)');
  }
  const { trace } = await racy;
  const dir = mkdtempSync(join(tmpdir(), 'handoff-html-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const out = writeTrace(trace, join(dir, 'run'));
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  try {
    const page = await browser.newPage();
    const errors: string[] = [];
    page.on('pageerror', (e) => errors.push(e.message));
    await page.goto(pathToFileURL(out.html).href);
    await page.waitForSelector('body[data-rendered]');
    assert.deepEqual(errors, []);
    const lanes = await page.$$eval('.row', (rows) => rows.map((r) => r.getAttribute('data-lane')));
    assert.deepEqual(lanes, ['proxy/proxy', 'D/host', 'D/compute', 'D/nic', 'P/host', 'P/compute', 'P/nic']);
    const drawn = await page.$$eval('.span', (s) => s.length);
    assert.equal(drawn, trace.spans.length + trace.requests.length);
    const raced = await page.$$eval('.span.race', (s) => s.map((e) => e.textContent));
    assert.ok(
      raced.includes('zero') && raced.some((x) => x?.startsWith('read')),
      `racing pair outlined: ${raced.join(', ')}`,
    );
    assert.ok((await page.$$eval('#races li', (l) => l.length)) > 0, 'the race is named above the chart');
  } finally {
    await browser.close();
  }
});
