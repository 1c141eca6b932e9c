/**
 * Zero a byte range fast, whatever memory backs it. On Node 20 (V8 11), `Uint8Array.prototype.fill` on
 * a SharedArrayBuffer takes a slow element-by-element path: 8 MiB in 2.5 ms (3.3 GB/s) on the dev VM,
 * against 0.15 ms for the same fill of a plain ArrayBuffer and 0.45 ms for copying zeros into the shared
 * one with `set` (a memcpy). Every slab of the real backends (the threaded device's pages, the NIC's
 * slabs) is shared, and zeroing pages is on the compute stream's path (the seed's zero op), so shared
 * memory is zeroed by copying from a plain zero buffer; anything else keeps `fill`.
 */

/** Copying zeros pays only from about this many bytes on (below it, `fill`'s setup is cheaper). */
const COPY_MIN_BYTES = 256;
/** The zeros copied from, one chunk at a time: 256 KiB stays in L2 and costs nothing to keep. */
const ZEROS = new Uint8Array(256 * 1024);

/** Set bytes [start, end) of `a` to 0, like `a.fill(0, start, end)` (the same clamping of negative ends). */
export function zeroBytes(a: Uint8Array, start = 0, end = a.length): void {
  const n = a.length;
  const from = start < 0 ? Math.max(n + start, 0) : Math.min(start, n);
  const to = end < 0 ? Math.max(n + end, 0) : Math.min(end, n);
  if (to - from < COPY_MIN_BYTES || !(a.buffer instanceof SharedArrayBuffer)) {
    a.fill(0, from, to);
    return;
  }
  for (let o = from; o < to; o += ZEROS.length) a.set(to - o >= ZEROS.length ? ZEROS : ZEROS.subarray(0, to - o), o);
}
