/**
 * attendSlots with a tail bound (withTailBound) skips the masked slots after the query only when none of
 * them can change the result: the output is bit-identical to visiting every slot on finite data, and
 * a masked slot that would poison (NaN or infinite values, or a key large enough for the f32 score to
 * overflow) still poisons.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { attendSlots, withTailBound, type SlotSet } from './attention.ts';

const DIM = 4;

function attend(keys: number[], queryPos: number, q: number[], bounded: boolean): Float64Array {
  const numSlots = keys.length / DIM;
  const k = Float64Array.from(keys);
  const set: SlotSet = { numSlots, keys: k, kStride: DIM, kOff: 0, values: k, vStride: DIM, vOff: 0 };
  if (bounded) withTailBound(set, DIM, DIM, new Float64Array(numSlots + 1));
  const out = new Float64Array(DIM);
  attendSlots(Float64Array.from(q), 0, DIM, set, DIM, queryPos, 0.5, new Float64Array(numSlots), out, 0, {
    flops: 0,
  });
  return out;
}

const finite = fc.double({ min: -100, max: 100, noNaN: true });

test('tail bound: on finite slots the output is bit-identical to visiting every slot', () => {
  fc.assert(
    fc.property(
      fc
        .integer({ min: 1, max: 12 })
        .chain((n) =>
          fc.tuple(
            fc.array(finite, { minLength: n * DIM, maxLength: n * DIM }),
            fc.integer({ min: 0, max: n - 1 }),
            fc.array(finite, { minLength: DIM, maxLength: DIM }),
          ),
        ),
      ([keys, pos, q]) => {
        const a = attend(keys, pos, q, false);
        const b = attend(keys, pos, q, true);
        assert.deepEqual(
          [...b].map((x) => (Object.is(x, -0) ? 0 : x)),
          [...a].map((x) => (Object.is(x, -0) ? 0 : x)),
        );
      },
    ),
    { numRuns: 300 },
  );
});

test('tail bound: a masked slot with NaN, Infinity or an f32-overflowing key still poisons', () => {
  const base = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0, 0, 0, 0];
  const q = [1, 1, 1, 1];
  for (const [what, v] of [
    ['NaN', NaN],
    ['Infinity', Infinity],
    ['a huge finite key (score rounds to Infinity in f32)', 1e39],
  ] as const) {
    const keys = [...base];
    keys[9] = v; // slot 2, masked for a query at position 1
    const out = attend(keys, 1, q, true);
    assert.ok(
      out.some((x) => Number.isNaN(x)),
      `${what} in a masked slot poisons the output`,
    );
    assert.deepEqual([...attend(keys, 1, q, false)].map(Number.isNaN), [...out].map(Number.isNaN), what);
  }
});
