/**
 * Number formats of the KV cache pages: fp8 e4m3fn (the fp8 MLA latent) and bf16 (rope part, GQA K/V).
 *
 * e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; NaN is 0x7f / 0xff; max 448;
 * smallest subnormal 2^-9. Encoding rounds to nearest, ties to even, and saturates to ±448
 * (NaN stays NaN). bf16: the top 16 bits of an f32, round to nearest even, NaN kept quiet.
 */
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

export const FP8_E4M3_MAX = 448;
export const FP8_E4M3_NAN = 0x7f;

/** Decode table of all 256 codes, built from the bit definition. */
const FP8_DECODE: Float32Array = (() => {
  const t = new Float32Array(256);
  for (let code = 0; code < 256; code++) {
    const sign = code & 0x80 ? -1 : 1;
    const exp = (code >> 3) & 0xf;
    const man = code & 0x7;
    if (exp === 0xf && man === 0x7) t[code] = NaN;
    else if (exp === 0) t[code] = sign * (man / 8) * 2 ** -6;
    else t[code] = sign * (1 + man / 8) * 2 ** (exp - 7);
  }
  return t;
})();

export function decodeFp8E4m3(code: number): number {
  return FP8_DECODE[code & 0xff] as number;
}

/**
 * Encode with round-to-nearest-even and saturation to ±448: a binary search over the 127 finite
 * non-negative codes, whose values increase with the code. Between codes c and c+1 the midpoint goes
 * to the even one (its mantissa's last bit is the code's).
 */
export function encodeFp8E4m3(x: number): number {
  if (Number.isNaN(x)) return FP8_E4M3_NAN;
  const sign = x < 0 || Object.is(x, -0) ? 0x80 : 0;
  const a = Math.abs(x);
  if (a >= FP8_E4M3_MAX) return sign | 0x7e; // saturate (also +-Infinity)
  // The largest code c in [0, 0x7e] with value(c) <= a.
  let lo = 0;
  let hi = 0x7e;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if ((FP8_DECODE[mid] as number) <= a) lo = mid;
    else hi = mid - 1;
  }
  const below = FP8_DECODE[lo] as number;
  if (below === a) return sign | lo;
  const above = FP8_DECODE[lo + 1] as number;
  const dLo = a - below;
  const dHi = above - a;
  return sign | (dLo < dHi || (dLo === dHi && (lo & 1) === 0) ? lo : lo + 1);
}

export function f32ToBf16Bits(x: number): number {
  f32[0] = x;
  const bits = u32[0] as number;
  if ((bits & 0x7f800000) === 0x7f800000 && (bits & 0x007fffff) !== 0) {
    return ((bits >>> 16) | 0x0040) & 0xffff; // quiet NaN
  }
  const lsb = (bits >>> 16) & 1;
  const rounded = (bits + 0x7fff + lsb) >>> 0;
  return (rounded >>> 16) & 0xffff;
}

export function bf16BitsToF32(bits: number): number {
  u32[0] = (bits & 0xffff) << 16;
  return f32[0] as number;
}

/** Round an f32 value through bf16 (what a bf16 store then load gives). */
export function roundBf16(x: number): number {
  return bf16BitsToF32(f32ToBf16Bits(x));
}
