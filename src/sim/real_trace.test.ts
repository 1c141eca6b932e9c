/**
 * Traces of real runs. With real threads (dsv4-mini, 4 requests): the decode timeline of variant
 * `none` has host, compute and NIC lanes, every op ran forward in time, and a zero op and a kv-read
 * are highlighted as a racing pair (the race checker finds it from happens-before, not from this
 * run's timing); with `all-read-groups` nothing is highlighted. Without threads: the conversion maps
 * race reports through the checker's ids (not the ticket ids) and keeps ops that never ran off the
 * compute lane.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import type { RaceReport } from '../device/race/race_report.ts';
import type { TimedOp } from '../device/threaded_timeline.ts';
import type { WorkRequestRecord } from '../transfer/core/work_log.ts';
import { runAb, AB_VARIANTS } from './ab.ts';
import { realTrace } from './real_trace.ts';
import { toChromeTrace, type SimTrace } from './trace.ts';

const real = runAb(
  {
    preset: 'dsv4-mini',
    requests: 4,
    maxTokens: 4,
    seed: 2,
    arrivalGapMs: 2,
    trace: true,
    variants: AB_VARIANTS.filter((v) => v.name === 'none' || v.name === 'all-read-groups'),
  },
  new RealEnv(9),
);

async function traceOf(name: string): Promise<SimTrace> {
  const v = (await real).variants.find((x) => x.name === name);
  assert.ok(v?.trace, `variant ${name} returned a trace`);
  return v.trace;
}

test('real run, variant none: host, compute and NIC lanes; ops forward in time; a zero op and a kv-read highlighted as a racing pair', async () => {
  const t = await traceOf('none');
  const compute = t.spans.filter((s) => s.lane === 'compute');
  const nic = t.spans.filter((s) => s.lane === 'nic');
  assert.ok(
    compute.some((s) => s.name === 'zero') && compute.some((s) => s.name === 'forward'),
    'zero and forward ops on the compute lane',
  );
  assert.ok(
    nic.length >= 4 && nic.every((s) => s.name === 'kv-read'),
    'one READ work request per request at least, on the NIC lane',
  );
  assert.ok(
    t.instants.some((i) => i.lane === 'host' && i.name === 'enqueue zero') &&
      t.instants.some((i) => i.lane === 'host' && i.name === 'post read kv-read'),
  );
  assert.ok(
    t.spans.every((s) => s.process === 'D' && s.startMs >= 0 && s.durMs >= 0),
    'every slice starts in the run and ends after it starts',
  );
  assert.equal(t.requests.length, 4);
  const racing = t.spans.filter((s) => s.race !== null);
  assert.ok(
    racing.some((s) => s.name === 'zero') && racing.some((s) => s.name === 'kv-read'),
    'both accesses of the race are highlighted',
  );
  const pair = t.races.find((r) => r.a !== null && r.b !== null && /zero/.test(r.text) && /kv-read/.test(r.text));
  assert.ok(pair, 'a reported pair names the zero op and the READ, both found in the timeline');
  const ct = toChromeTrace(t);
  const threads = new Set(
    ct.traceEvents.filter((e) => e['name'] === 'thread_name').map((e) => (e['args'] as { name: string }).name),
  );
  assert.deepEqual(threads, new Set(['proxy', 'host', 'compute', 'nic']));
  assert.ok(
    ct.traceEvents.some((e) => e['ph'] === 's') && ct.traceEvents.some((e) => e['cname'] === 'terrible'),
    'flow arrow and highlight in the Chrome trace',
  );
});

test('real run, variant all-read-groups: the same lanes and no racing pair highlighted', async () => {
  const t = await traceOf('all-read-groups');
  assert.ok(t.spans.some((s) => s.lane === 'compute') && t.spans.some((s) => s.lane === 'nic'));
  assert.equal(t.races.length, 0);
  assert.equal(t.spans.filter((s) => s.race !== null).length, 0);
  assert.ok(
    t.requests.every((r) => r.outcome === 'ok'),
    'every request matched the colocated reference',
  );
});

const label = (what: string) => ({ what, requestIds: ['r1'], step: 3 });
const op = (o: Partial<TimedOp> & Pick<TimedOp, 'opId' | 'checkerOpId'>): TimedOp => ({
  stream: 'compute',
  label: label('zero'),
  kind: 'zero',
  blockIds: [5],
  enqueuedMs: 1000,
  startMs: 1002,
  endMs: 1003,
  state: 'done',
  ...o,
});
const wr: WorkRequestRecord = {
  wrId: 1,
  checkerWrId: 40,
  kind: 'read',
  label: label('kv-read'),
  transferId: 'x',
  bytes: 64,
  blockIds: [5],
  postedMs: 1001,
  doneMs: 1004,
  state: 'done',
};
const access = (source: 'op' | 'nic' | 'host', id: number, what: string): RaceReport['a'] => ({
  agent: source === 'op' ? 'compute' : source,
  source,
  id,
  label: label(what),
  write: true,
  start: 0,
  end: 8,
});

test('conversion: races map through the checker ids, times start at the earliest event, an op that never ran has no slice', () => {
  const t = realTrace({
    title: 't',
    process: 'D',
    // Ticket ids and checker ids differ on purpose: a report names the checker's.
    ops: [
      op({ opId: 1, checkerOpId: 7 }),
      op({
        opId: 2,
        checkerOpId: 8,
        label: label('forward'),
        kind: 'kernel step',
        startMs: null,
        endMs: null,
        state: 'queued',
      }),
    ],
    workRequests: [wr],
    requests: [{ index: 0, startMs: 999, endMs: 1010, outcome: 'ok' }],
    races: [
      { a: access('op', 7, 'zero'), b: access('nic', 40, 'kv-read'), slab: 0, block: 5, range: { start: 0, end: 8 } },
      { a: access('op', 7, 'zero'), b: access('nic', 40, 'kv-read'), slab: 1, block: 5, range: { start: 0, end: 8 } },
      {
        a: access('op', 1, 'other'),
        b: access('host', 1, 'host read'),
        slab: 0,
        block: 9,
        range: { start: 0, end: 8 },
      },
    ],
  });
  assert.deepEqual(
    t.spans.map((s) => [s.key, s.lane, s.startMs, s.durMs]),
    [
      ['D.op#1', 'compute', 3, 1],
      ['D.wr#1', 'nic', 2, 3],
    ],
  );
  assert.equal(
    t.instants.filter((i) => i.lane === 'host').length,
    3,
    'two enqueues and one post, including the op that never ran',
  );
  assert.deepEqual(t.requests, [{ index: 0, startMs: 0, endMs: 11, outcome: 'ok' }]);
  assert.equal(t.races.length, 2, 'one entry per racing pair, not per slab');
  assert.deepEqual([t.races[0]?.a, t.races[0]?.b], ['D.op#1', 'D.wr#1']);
  assert.deepEqual(
    [t.races[1]?.a, t.races[1]?.b],
    [null, null],
    'checker op 1 is not in the log, a host access has no slice',
  );
  assert.ok(t.spans.every((s) => s.race !== null && s.race.includes('zero') && s.race.includes('kv-read')));
});
