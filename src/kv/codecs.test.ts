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

/** The encoder before the table search (log2 and powers of two), kept as the reference the search must equal. */
function encodeByBinade(x: number): number {
  if (Number.isNaN(x)) return 0x7f;
  const sign = x < 0 || Object.is(x, -0) ? 0x80 : 0;
  let a = Math.abs(x);
  if (a >= FP8_E4M3_MAX) return sign | 0x7e;
  let e = a === 0 ? -7 : Math.floor(Math.log2(a));
  if (a !== 0 && 2 ** e > a) e -= 1;
  if (a !== 0 && 2 ** (e + 1) <= a) e += 1;
  const step = e < -6 ? 2 ** -9 : 2 ** (e - 3);
  const q = a / step;
  let n = Math.floor(q);
  const frac = q - n;
  if (frac > 0.5 || (frac === 0.5 && n % 2 === 1)) n += 1;
  a = n * step;
  if (a > FP8_E4M3_MAX) return sign | 0x7e;
  if (a === 0) return sign;
  let exp = Math.floor(Math.log2(a));
  if (2 ** exp > a) exp -= 1;
  if (2 ** (exp + 1) <= a) exp += 1;
  if (exp < -6) return sign | Math.round(a / 2 ** -9);
  return sign | ((exp + 7) << 3) | Math.round((a / 2 ** exp - 1) * 8);
}

test('fp8 encode (table search) equals the binade arithmetic on every code, every midpoint and its neighbours, and random values', () => {
  const probes: number[] = [];
  for (let c = 0; c < 0x7e; c++) {
    const lo = decodeFp8E4m3(c);
    const hi = decodeFp8E4m3(c + 1);
    const mid = (lo + hi) / 2;
    probes.push(lo, mid, mid * (1 + 1e-12), mid * (1 - 1e-12), (lo + mid) / 2, (mid + hi) / 2);
  }
  probes.push(0, 447.9, 448, 464, 465, 1e-30, 2 ** -10, 2 ** -9.5);
  for (const v of probes) for (const x of [v, -v]) assert.equal(encodeFp8E4m3(x), encodeByBinade(x), `x = ${x}`);
  fc.assert(
    fc.property(fc.double({ noNaN: true, min: -500, max: 500 }), (x) => encodeFp8E4m3(x) === encodeByBinade(x)),
    { numRuns: 20_000 },
  );
});
