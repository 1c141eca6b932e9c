/** Proves the fp8 e4m3fn and bf16 codecs are exact over every code, round ties to even and saturate. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { bf16BitsToF32, decodeFp8E4m3, encodeFp8E4m3, f32ToBf16Bits, FP8_E4M3_MAX } from './codecs.ts';

test('fp8 e4m3fn: every one of the 256 codes decodes and re-encodes to itself (NaN codes to 0x7f)', () => {
  for (let code = 0; code < 256; code++) {
    const v = decodeFp8E4m3(code);
    if ((code & 0x7f) === 0x7f) {
      assert.ok(Number.isNaN(v), `code ${code} must be NaN`);
      assert.equal(encodeFp8E4m3(v), 0x7f);
    } else {
      assert.equal(encodeFp8E4m3(v), code, `code ${code.toString(16)} value ${v}`);
    }
  }
});

test('fp8 e4m3fn: known values, max 448, smallest subnormal 2^-9, no infinities', () => {
  assert.equal(decodeFp8E4m3(0x7e), 448);
  assert.equal(decodeFp8E4m3(0x01), 2 ** -9);
  assert.equal(decodeFp8E4m3(0x38), 1);
  assert.equal(encodeFp8E4m3(Infinity), 0x7e);
  assert.equal(encodeFp8E4m3(-Infinity), 0xfe);
  assert.equal(encodeFp8E4m3(1e9), 0x7e);
  assert.equal(encodeFp8E4m3(500), 0x7e);
  assert.equal(encodeFp8E4m3(-0), 0x80);
});

test('fp8 e4m3fn: halfway points between neighbours round to the even code', () => {
  for (let code = 0; code < 0x7e; code++) {
    const lo = decodeFp8E4m3(code);
    const hi = decodeFp8E4m3(code + 1);
    const mid = (lo + hi) / 2;
    const even = code % 2 === 0 ? code : code + 1;
    assert.equal(encodeFp8E4m3(mid), even, `tie between ${lo} and ${hi}`);
    assert.equal(encodeFp8E4m3(-mid), 0x80 | even);
  }
});

test('fp8 e4m3fn: encoding any finite float picks a nearest code', () => {
  fc.assert(
    fc.property(fc.double({ min: -FP8_E4M3_MAX, max: FP8_E4M3_MAX, noNaN: true }), (x) => {
      const got = decodeFp8E4m3(encodeFp8E4m3(x));
      let best = Infinity;
      for (let c = 0; c < 256; c++) {
        const v = decodeFp8E4m3(c);
        if (!Number.isNaN(v)) best = Math.min(best, Math.abs(v - x));
      }
      assert.equal(Math.abs(got - x), best);
    }),
    { numRuns: 2000 },
  );
});

test('bf16: every one of the 65536 codes round-trips (NaN stays NaN)', () => {
  for (let bits = 0; bits < 65536; bits++) {
    const v = bf16BitsToF32(bits);
    if (Number.isNaN(v)) assert.ok(Number.isNaN(bf16BitsToF32(f32ToBf16Bits(v))));
    else assert.equal(f32ToBf16Bits(v), bits, `bits ${bits.toString(16)}`);
  }
});

test('bf16: ties round to even, overflow goes to infinity like hardware', () => {
  const one = bf16BitsToF32(0x3f80);
  const next = bf16BitsToF32(0x3f81);
  assert.equal(f32ToBf16Bits((one + next) / 2), 0x3f80); // tie -> even (0x3f80)
  const n2 = bf16BitsToF32(0x3f82);
  assert.equal(f32ToBf16Bits((next + n2) / 2), 0x3f82); // tie -> even (0x3f82)
  assert.equal(f32ToBf16Bits(3.4e38), 0x7f80);
});
