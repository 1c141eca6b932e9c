/**
 * One conformance suite for every Device implementation (Hono-style: the same tests against each
 * backend). `registerDeviceConformance('threaded', factory)` registers node:test tests that check
 * FIFO execution, exact zero/copy bytes, events (own, cross-device, foreign), synchronize, kernels
 * and their errors, close, and the race checker's wiring and verdicts (conformance_race.ts).
 *
 * Devices with autoRun semantics are expected (the sim factory passes `autoRun: true`), so the suite
 * never drives a simulator and never uses a clock: "let the device run" means awaiting a sleep op on
 * a second device.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { registerRaceConformance } from './conformance_race.ts';
import { registerRankConformance } from './conformance_ranks.ts';
import {
  gateEvent,
  letDevicesRun,
  page,
  TEST_GEOMETRY,
  TEST_KERNELS_URL,
  withDevice,
  type DeviceFactory,
} from './conformance_support.ts';
import { patternByte } from './test_kernels.ts';
import type { Device, OpTicket } from './types.ts';

export type { DeviceFactory } from './conformance_support.ts';

/** Fill every byte of every slab with a value that depends on its position (never 0 by accident). */
function fillDistinct(d: Device): Uint8Array[] {
  d.slabs.forEach((s, k) => {
    for (let i = 0; i < s.length; i++) s[i] = ((i * 31 + k * 17) % 255) + 1;
  });
  return d.slabs.map((s) => s.slice());
}

const kernel = (
  name: string,
  args: unknown = {},
): { op: { kind: 'kernel'; name: string; args: unknown }; label: { what: string } } => ({
  op: { kind: 'kernel', name, args },
  label: { what: name },
});

/** `ranks`: the factory's devices have that many tensor parallel ranks (every test must hold for any count). */
export function registerDeviceConformance(name: string, factory: DeviceFactory, ranks = 1): void {
  describe(`device conformance: ${name}`, () => {
    test('geometry: numSlabs slabs of numBlocks*pageBytes, zero-filled, each a view of its buffer', async () => {
      await withDevice(factory, async (d) => {
        assert.equal(d.kind, name.startsWith('threaded') ? 'threaded' : 'sim');
        assert.equal(d.slabs.length, TEST_GEOMETRY.numSlabs);
        d.slabs.forEach((s, i) => {
          assert.equal(s.length, TEST_GEOMETRY.numBlocks * TEST_GEOMETRY.pageBytes);
          assert.equal(s.buffer, d.buffers[i]);
          assert.ok(s.every((b) => b === 0));
        });
        assert.equal(d.buffers[0] instanceof SharedArrayBuffer, d.kind === 'threaded');
      });
    });

    test('FIFO: ops execute in enqueue order (stamps count up; a copy sees the pattern before the zero)', async () => {
      await withDevice(factory, async (d) => {
        const stamps: OpTicket[] = [];
        const order: number[] = [];
        for (let i = 0; i < 6; i++) {
          if (i % 2 === 0) d.compute.enqueue({ op: { kind: 'sleep', ms: 2 }, label: { what: 'sleep' } });
          const t = d.compute.enqueue(kernel('stamp', { slab: 0, block: i }));
          void t.done.then(() => order.push(i));
          stamps.push(t);
        }
        assert.deepEqual(await Promise.all(stamps.map((t) => t.done)), [1, 2, 3, 4, 5, 6]);
        assert.deepEqual(order, [0, 1, 2, 3, 4, 5]);
        d.compute.enqueue(kernel('pattern', { slab: 1, block: 2, seed: 9 }));
        d.compute.enqueue({ op: { kind: 'copy', pairs: [[2, 5]], slabs: [1] }, label: { what: 'copy' } });
        d.compute.enqueue({ op: { kind: 'zero', blockIds: [2], slabs: [1] }, label: { what: 'zero' } });
        const copied = d.compute.enqueue(kernel('sum', { slab: 1, block: 5 }));
        const zeroed = d.compute.enqueue(kernel('sum', { slab: 1, block: 2 }));
        let expected = 0;
        for (let i = 0; i < d.pageBytes; i++) expected += patternByte(9, i);
        assert.equal(await copied.done, expected);
        assert.equal(await zeroed.done, 0);
      });
    });

    test('zero: exactly the listed pages of the listed slabs become 0, every other byte is unchanged', async () => {
      await withDevice(factory, async (d) => {
        const before = fillDistinct(d);
        await d.compute.enqueue({ op: { kind: 'zero', blockIds: [1, 3, 7], slabs: [0, 2] }, label: { what: 'zero' } })
          .done;
        for (let s = 0; s < d.numSlabs; s++) {
          for (let b = 0; b < d.numBlocks; b++) {
            const want =
              [0, 2].includes(s) && [1, 3, 7].includes(b)
                ? new Uint8Array(d.pageBytes)
                : before[s]!.subarray(b * d.pageBytes, (b + 1) * d.pageBytes);
            assert.deepEqual(page(d, s, b), want, `slab ${s} block ${b}`);
          }
        }
      });
    });

    test('zero-spans: exactly the listed byte ranges become 0, every other byte is unchanged; bad spans fail at enqueue', async () => {
      await withDevice(factory, async (d) => {
        const before = fillDistinct(d);
        const spans = [
          { slab: 1, block: 2, start: 3, end: 10 },
          { slab: 1, block: 2, start: 20, end: d.pageBytes },
          { slab: 0, block: 5, start: 0, end: 1 },
        ];
        await d.compute.enqueue({ op: { kind: 'zero-spans', spans }, label: { what: 'zero-tail' } }).done;
        for (let s = 0; s < d.numSlabs; s++) {
          const want = before[s]!.slice(0, d.numBlocks * d.pageBytes);
          for (const z of spans.filter((x) => x.slab === s))
            want.fill(0, z.block * d.pageBytes + z.start, z.block * d.pageBytes + z.end);
          assert.deepEqual(d.slabs[s]!.subarray(0, d.numBlocks * d.pageBytes), want, `slab ${s}`);
        }
        const bad = (span: { slab: number; block: number; start: number; end: number }) => () =>
          d.compute.enqueue({ op: { kind: 'zero-spans', spans: [span] }, label: { what: 'zero-tail' } });
        assert.throws(bad({ slab: 0, block: 1, start: 4, end: 4 }), /not a non-empty range/);
        assert.throws(bad({ slab: 0, block: 1, start: 0, end: d.pageBytes + 1 }), /not a non-empty range/);
        assert.throws(bad({ slab: 0, block: d.numBlocks, start: 0, end: 1 }), /block/);
      });
    });

    test('copy: whole pages src->dst in the listed slabs, every other byte is unchanged', async () => {
      await withDevice(factory, async (d) => {
        const before = fillDistinct(d);
        const pairs: Array<[number, number]> = [
          [1, 4],
          [2, 6],
        ];
        await d.compute.enqueue({ op: { kind: 'copy', pairs, slabs: [1] }, label: { what: 'copy' } }).done;
        for (let s = 0; s < d.numSlabs; s++) {
          for (let b = 0; b < d.numBlocks; b++) {
            const src = s === 1 ? (pairs.find(([, dst]) => dst === b)?.[0] ?? b) : b;
            assert.deepEqual(
              page(d, s, b),
              before[s]!.subarray(src * d.pageBytes, (src + 1) * d.pageBytes),
              `slab ${s} block ${b}`,
            );
          }
        }
      });
    });

    test('events: reached at once on an idle stream; behind ops only after they ran (their writes visible)', async () => {
      await withDevice(factory, async (d) => {
        const idle = d.compute.recordEvent();
        assert.equal(idle.query(), true);
        await idle.wait();
        const gate = gateEvent();
        d.compute.waitEvent(gate);
        d.compute.enqueue(kernel('pattern', { slab: 2, block: 1, seed: 4 }));
        const ev = d.compute.recordEvent();
        assert.equal(ev.query(), false, 'an event behind a closed gate is not reached');
        gate.open();
        await ev.wait();
        assert.equal(ev.query(), true);
        assert.equal(page(d, 2, 1)[5], patternByte(4, 5));
        // A wait on the stream's own earlier event is satisfied by FIFO order.
        d.compute.waitEvent(ev);
        assert.equal(await d.compute.enqueue(kernel('sum', { slab: 2, block: 0 })).done, 0);
      });
    });

    test('waitEvent: an event from elsewhere holds later ops until it is reached', async () => {
      await withDevice(factory, async (d) => {
        const gate = gateEvent();
        d.compute.waitEvent(gate);
        const log: string[] = [];
        const t = d.compute.enqueue(kernel('pattern', { slab: 0, block: 4, seed: 1 }));
        void t.done.then(() => log.push('op'));
        await letDevicesRun(factory);
        assert.equal(log.length, 0, 'the op ran before the event was reached');
        assert.ok(page(d, 0, 4).every((b) => b === 0));
        log.push('open');
        gate.open();
        await t.done;
        assert.deepEqual(log, ['open', 'op']);
        assert.equal(page(d, 0, 4)[3], patternByte(1, 3));
      });
    });

    test('waitEvent: an event of another device of the same kind orders this stream behind it', async () => {
      await withDevice(factory, async (a) => {
        await withDevice(factory, async (b) => {
          b.compute.enqueue({ op: { kind: 'sleep', ms: 40 }, label: { what: 'long forward' } });
          const evB = b.compute.recordEvent();
          a.compute.waitEvent(evB);
          const reachedWhenRan = await a.compute
            .enqueue(kernel('sum', { slab: 0, block: 0 }))
            .done.then(() => evB.query());
          assert.equal(reachedWhenRan, true);
        });
      });
    });

    test('synchronize: every op enqueued before it has executed and its writes are visible', async () => {
      await withDevice(factory, async (d) => {
        fillDistinct(d);
        d.compute.enqueue({ op: { kind: 'sleep', ms: 10 }, label: { what: 'sleep' } });
        d.compute.enqueue(kernel('pattern', { slab: 0, block: 0, seed: 2 }));
        d.compute.enqueue({ op: { kind: 'copy', pairs: [[0, 1]], slabs: [0] }, label: { what: 'copy' } });
        d.compute.enqueue({ op: { kind: 'zero', blockIds: [5], slabs: [0, 1, 2] }, label: { what: 'zero' } });
        const ev = d.compute.recordEvent();
        await d.synchronize();
        assert.equal(ev.query(), true);
        assert.equal(page(d, 0, 1)[9], patternByte(2, 9));
        for (let s = 0; s < 3; s++) assert.ok(page(d, s, 5).every((x) => x === 0));
      });
    });

    test('kernels: createKernels got kernelInit, results come back, writes are exact', async () => {
      await withDevice(factory, async (d) => {
        assert.deepEqual(await d.compute.enqueue(kernel('echoInit')).done, { pageBytes: TEST_GEOMETRY.pageBytes });
        await d.compute.enqueue(kernel('pattern', { slab: 2, block: 6, seed: 200 })).done;
        assert.deepEqual(
          [...page(d, 2, 6)],
          Array.from({ length: d.pageBytes }, (_, i) => patternByte(200, i)),
        );
        assert.ok(page(d, 2, 5).every((x) => x === 0) && page(d, 2, 7).every((x) => x === 0));
        page(d, 1, 3).fill(2);
        assert.equal(await d.compute.enqueue(kernel('sum', { slab: 1, block: 3 })).done, 2 * d.pageBytes);
      });
    });

    test('kernel errors: a failing or unknown kernel rejects only its own ticket; the stream goes on', async () => {
      await withDevice(factory, async (d) => {
        const first = d.compute.enqueue(kernel('stamp', { slab: 0, block: 0 }));
        const bad = d.compute.enqueue(kernel('fail', { message: 'boom' }));
        const unknown = d.compute.enqueue(kernel('noSuchKernel'));
        const after = d.compute.enqueue(kernel('stamp', { slab: 0, block: 1 }));
        assert.equal(await first.done, 1);
        await assert.rejects(
          bad.done,
          (e: Error & { code?: string }) => /kernel 'fail' failed: boom/.test(e.message) && e.code === 'INTERNAL',
        );
        await assert.rejects(unknown.done, /kernel 'noSuchKernel' failed: unknown kernel/);
        assert.equal(await after.done, 2);
      });
    });

    test('close: pending tickets and events reject; enqueue after close is a programmer error', async () => {
      const d = await factory({
        ...TEST_GEOMETRY,
        kernelModuleUrl: TEST_KERNELS_URL,
        kernelInit: { pageBytes: TEST_GEOMETRY.pageBytes },
      });
      const gate = gateEvent();
      d.compute.waitEvent(gate);
      const pending = d.compute.enqueue({ op: { kind: 'zero', blockIds: [1], slabs: [0] }, label: { what: 'zero' } });
      const ev = d.compute.recordEvent();
      await d.close();
      await assert.rejects(pending.done, /device closed/);
      await assert.rejects(ev.wait(), /device closed/);
      assert.throws(() => d.compute.enqueue({ op: { kind: 'sleep', ms: 0 }, label: { what: 'late' } }), /closed/);
    });

    test('raceCheck: on wires a checker, off leaves raceChecker null', async () => {
      await withDevice(factory, async (d) => assert.equal(d.raceChecker, null));
      await withDevice(factory, async (d) => assert.notEqual(d.raceChecker, null), true);
    });

    registerRaceConformance(factory, ranks);
    if (ranks > 1) registerRankConformance(factory, ranks);
  });
}
