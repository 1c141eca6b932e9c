/**
 * A work request may carry up to DESCRIPTORS_MAX (65,536) ranges of 5 doubles, more than
 * the NIC host's shared ring holds (1 << 18 doubles, about 52,000 ranges). Proves that the ring says "no
 * room" (null: the caller sends its own copy) for ranges larger than its capacity, empty or not, instead
 * of throwing a RangeError out of NicHost.post, which crashed the engine loop of the instance that posted
 * (a P/D READ or WRITE of a long prompt between tensor parallel degrees: 8 ranges per token on a two-layer
 * GQA model, so from about 6,600 tokens on).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RangeRing } from './range_ring.ts';

test('range ring: ranges larger than the whole ring are refused (null), never a RangeError', () => {
  const ring = new RangeRing(64);
  assert.equal(ring.alloc(new Float64Array(65)), null, 'empty ring, 65 doubles into 64');
  const small = ring.alloc(new Float64Array(10));
  assert.notEqual(small, null);
  assert.equal(ring.alloc(new Float64Array(200)), null, 'a ring in use');
  ring.release(small?.region as NonNullable<typeof small>['region']);
  const whole = ring.alloc(Float64Array.from({ length: 64 }, (_, i) => i));
  assert.deepEqual(
    Array.from(whole?.view ?? []),
    Array.from({ length: 64 }, (_, i) => i),
    'the whole capacity still fits',
  );
});
