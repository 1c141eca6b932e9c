/**
 * The fp8 e4m3fn and bf16 encoders equal an independent exact reference: every finite
 * value is compared, in exact integer arithmetic (BigInt), with every code's value, the nearest one wins and
 * ties go to the even code; fp8 saturates to ±448, bf16 overflows to ±Infinity; NaN, ±0 and subnormals keep
 * their meaning. Inputs are f32 values (what a kernel stores), drawn from raw bit patterns and from near the
 * fp8 range. No bug found here: this guards the codecs against the reference rather than against themselves.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { bf16BitsToF32, decodeFp8E4m3, encodeFp8E4m3, f32ToBf16Bits } from './codecs.ts';

/** x as an exact integer multiple of 2^-1100 (every finite f64 of magnitude < 2^100 is one). */
function exact(x: number): bigint {
  const dv = new DataView(new ArrayBuffer(8));
  dv.setFloat64(0, Math.abs(x));
  const hi = dv.getUint32(0);
  const exp = (hi >>> 20) & 0x7ff;
  let mant = (BigInt(hi & 0xfffff) << 32n) | BigInt(dv.getUint32(4));
  if (exp !== 0) mant |= 1n << 52n;
  const e = exp === 0 ? -1074 : exp - 1075;
  return mant << BigInt(e + 1100);
}

/** Nearest of `codes` (non-negative values, ascending) to |x|, ties to the even code; null above the last. */
function nearestCode(a: bigint, codes: ReadonlyArray<[number, bigint]>): number {
  let best = -1;
  let bestD = 0n;
  for (const [c, v] of codes) {
    const d = a > v ? a - v : v - a;
    if (best < 0 || d < bestD || (d === bestD && (c & 1) === 0)) [best, bestD] = [c, d];
  }
  return best;
}

const FP8_CODES: Array<[number, bigint]> = Array.from({ length: 0x7f }, (_, c) => [c, exact(decodeFp8E4m3(c))]);

function refFp8(x: number): number {
  if (Number.isNaN(x)) return 0x7f;
  const sign = x < 0 || Object.is(x, -0) ? 0x80 : 0;
  if (Math.abs(x) >= 448) return sign | 0x7e;
  return sign | nearestCode(exact(x), FP8_CODES);
}

function refBf16(x: number): number {
  if (Number.isNaN(x)) return 0x7fc0;
  const sign = x < 0 || Object.is(x, -0) ? 0x8000 : 0;
  const a = Math.abs(x);
  // Past the largest finite bf16 plus half an ulp (2^127 * (2 - 2^-8)): infinity, as hardware rounds.
  if (a >= 2 ** 127 * (2 - 2 ** -8)) return sign | 0x7f80;
  const f = new Float32Array([a]);
  const bits = new Uint32Array(f.buffer)[0] as number;
  const lo = bits >>> 16;
  const cands: Array<[number, bigint]> = [lo, lo + 1].map((c) => [c, exact(bf16BitsToF32(c))]);
  return sign | nearestCode(exact(a), cands);
}

const f32 = (bits: number): number => new Float32Array(new Uint32Array([bits >>> 0]).buffer)[0] as number;

test('fp8 e4m3fn encode equals the exact reference on random f32 bit patterns and values near the range', () => {
  fc.assert(
    fc.property(
      fc.oneof(
        fc.integer({ min: 0, max: 0xffffffff }).map(f32),
        fc.double({ min: -500, max: 500, noNaN: true }).map(Math.fround),
        fc.double({ min: -(2 ** -5), max: 2 ** -5, noNaN: true }).map(Math.fround),
      ),
      (x) => {
        if (!Number.isFinite(x) && !Number.isNaN(x)) return;
        assert.equal(encodeFp8E4m3(x), refFp8(x), `x = ${x}`);
      },
    ),
    { numRuns: 20_000 },
  );
  // Every midpoint between neighbouring codes (the ties) and its f32 neighbours, both signs.
  const probes = [Infinity, 448, 464, 2 ** -10, 2 ** -11];
  for (let c = 0; c < 0x7e; c++) {
    const mid = (decodeFp8E4m3(c) + decodeFp8E4m3(c + 1)) / 2;
    probes.push(mid, Math.fround(mid * (1 + 2 ** -20)), Math.fround(mid * (1 - 2 ** -20)));
  }
  for (const v of probes) for (const x of [v, -v]) assert.equal(encodeFp8E4m3(x), refFp8(x), `x = ${x}`);
});

test('bf16 encode equals the exact reference on random f32 bit patterns (NaN quiet, overflow to infinity)', () => {
  fc.assert(
    fc.property(fc.integer({ min: 0, max: 0xffffffff }), (bits) => {
      const x = f32(bits);
      if (Number.isNaN(x)) return assert.ok(Number.isNaN(bf16BitsToF32(f32ToBf16Bits(x))));
      if (!Number.isFinite(x)) return assert.equal(f32ToBf16Bits(x), bits >>> 16);
      assert.equal(f32ToBf16Bits(x), refBf16(x), `bits ${bits.toString(16)}`);
    }),
    { numRuns: 50_000 },
  );
});
