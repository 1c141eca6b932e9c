/**
 * zeroBytes: the same bytes as `fill(0, start, end)` for any range (negative and out-of-range ends
 * clamped as fill clamps them), on shared and plain memory, across the copy path's chunk boundary and
 * below its threshold; bytes outside the range are untouched.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { zeroBytes } from './zero_bytes.ts';

const CHUNK = 256 * 1024;

function filled(shared: boolean, n: number): Uint8Array {
  const a = new Uint8Array(shared ? new SharedArrayBuffer(n) : new ArrayBuffer(n));
  for (let i = 0; i < n; i++) a[i] = (i * 7 + 1) & 0xff || 1;
  return a;
}

test('zeroBytes equals fill(0, start, end) on shared and plain memory, offsets included', () => {
  fc.assert(
    fc.property(
      fc.boolean(),
      fc.integer({ min: 0, max: 3 * CHUNK + 100 }),
      fc.integer({ min: -4 * CHUNK, max: 4 * CHUNK }),
      fc.integer({ min: -4 * CHUNK, max: 4 * CHUNK }),
      fc.integer({ min: 0, max: 64 }),
      (shared, n, start, end, offset) => {
        const whole = filled(shared, n + offset);
        const a = whole.subarray(offset); // a view that does not start at the buffer's first byte
        const want = filled(false, n + offset).subarray(offset);
        want.fill(0, start, end);
        zeroBytes(a, start, end);
        assert.deepEqual(a, want);
        assert.deepEqual(whole.subarray(0, offset), filled(false, offset), 'bytes before the view untouched');
      },
    ),
    { numRuns: 200 },
  );
});

test('zeroBytes zeroes a whole shared slab by default, and exactly a page run inside it', () => {
  const a = filled(true, 2 * CHUNK + 5);
  zeroBytes(a, 32768, 32768 * 5);
  assert.ok(a.subarray(32768, 32768 * 5).every((b) => b === 0));
  assert.ok(a[32767] !== 0 && a[32768 * 5] !== 0, 'the neighbours are kept');
  zeroBytes(a);
  assert.ok(a.every((b) => b === 0));
});
