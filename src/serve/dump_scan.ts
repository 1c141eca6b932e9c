/**
 * DumpScanner: a KV event dump's body, `{"epoch": E, "seq": N, "block_hashes": ["<64 hex>", ...]}`, read
 * a slice of hashes at a time, so that a router taking in an instance's dump of up to 1 Mi hashes (67 MB)
 * keeps serving between slices. `JSON.parse` of the whole body and a check of every hash, in one go, held
 * the router's event loop for 0.9-1.2 s at 1 Mi hashes (session 19), on top of applying them.
 *
 * The envelope (everything but the hash array) goes through `JSON.parse`, with the array cut out; the
 * array itself is scanned by hand, strictly: each element a string of exactly 64 lowercase hex digits,
 * JSON whitespace between tokens, no trailing comma. What the scanner accepts is what `JSON.parse`
 * followed by that check of each hash accepts, but for escapes inside a hash (`\u0061` for `a`), which
 * no instance writes and the scanner refuses (dump_scan.test.ts compares both on random and broken
 * bodies): an instance's dump means the same as before, only read in slices.
 */
import type { BlockHash } from '../kv/block_hash.ts';
import { HandoffError } from '../util/errors.ts';

const KEY = /"block_hashes"\s*:\s*\[/g;
const HASH_CHARS = 64;

const bad = (why: string): HandoffError => new HandoffError('BAD_REQUEST', `bad KV event dump: ${why}`);
/** A KV event seq (the feed's lines and the dump alike). */
export const isSeq = (n: unknown): n is number => typeof n === 'number' && Number.isSafeInteger(n) && n >= 0;
/** A KV event epoch (the feed's lines and the dump alike). */
export const isEpoch = (s: unknown): s is string => typeof s === 'string' && s.length > 0 && s.length <= 128;

/** JSON's insignificant whitespace: space, tab, line feed, carriage return. */
const isWs = (c: number): boolean => c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d;
/** The first position from `p` on that is not whitespace. */
function skipWs(t: string, p: number): number {
  while (p < t.length && isWs(t.charCodeAt(p))) p++;
  return p;
}
/** 0-9, a-f. */
const isHex = (c: number): boolean => (c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66);

export class DumpScanner {
  /** The dump's epoch and seq: set once the whole array is read (step returned true). */
  epoch = '';
  seq = 0;
  /** The hashes read so far (distinct). */
  readonly hashes = new Set<BlockHash>();
  /** Elements read so far (duplicates counted). */
  count = 0;
  /** More than `maxHashes` elements: the dump is not adopted in part (RouterIndex.adoptDump). */
  overBound = false;
  /** Just past the array's '['. */
  private readonly open: number;
  private pos: number;
  private done = false;

  /**
   * Finds the hash array (throws BAD_REQUEST if there is none). Nothing else is read here: the end of
   * the array is found by the scan, the envelope read once it is (a search for the ']' of a 67 MB body was
   * a turn of its own).
   */
  constructor(
    private readonly text: string,
    private readonly maxHashes: number,
  ) {
    KEY.lastIndex = 0;
    const m = KEY.exec(text);
    if (m === null) throw bad('no block_hashes array');
    this.open = m.index + m[0].length;
    this.pos = this.open;
  }

  /** Read up to `n` more elements; true once the whole array is read (or found over the bound). */
  step(n: number): boolean {
    const t = this.text;
    let p = this.pos;
    for (let k = 0; k < n && !this.done; k++) {
      // Here: just past '[', or just past a hash. Next: ']' (the end), or a comma (after a hash) and a hash.
      p = skipWs(t, p);
      if (p === t.length) throw bad('the block_hashes array is not closed');
      if (t.charCodeAt(p) === 0x5d) {
        this.envelope(p);
        break;
      }
      if (this.count > 0) {
        if (t.charCodeAt(p) !== 0x2c) throw bad('block_hashes elements must be separated by commas');
        p = skipWs(t, p + 1); // a ']' here (a trailing comma) is refused as a hash below
      }
      p = this.readHash(p);
      if (++this.count > this.maxHashes) {
        // Over the bound: the rest is not read, only skipped to the array's end (a hash holds no ']').
        this.overBound = true;
        const close = t.indexOf(']', p);
        if (close < 0) throw bad('the block_hashes array is not closed');
        this.envelope(close);
      }
    }
    this.pos = p;
    return this.done;
  }

  /** The array ends at `close`: read everything around it (JSON.parse, the array cut out) and check it. */
  private envelope(close: number): void {
    const t = this.text;
    // A second such array would be the one JSON.parse keeps: refused rather than read from the first.
    KEY.lastIndex = close;
    if (KEY.exec(t) !== null) throw bad('block_hashes twice');
    let envelope: unknown;
    try {
      envelope = JSON.parse(`${t.slice(0, this.open)}]${t.slice(close + 1)}`);
      // catch-ok: only JSON.parse runs in the try: a body that is not JSON is refused
    } catch {
      throw bad('not JSON');
    }
    const o = envelope as Record<string, unknown> | null;
    if (o === null || typeof o !== 'object' || Array.isArray(o)) throw bad('not an object');
    if (!isEpoch(o['epoch']) || !isSeq(o['seq'])) throw bad('epoch/seq');
    const arr = o['block_hashes'];
    if (!Array.isArray(arr) || arr.length !== 0) throw bad('block_hashes');
    this.epoch = o['epoch'];
    this.seq = o['seq'];
    this.done = true;
  }

  /** One element at `p`: a quoted 64-digit lowercase hex string; returns the position after it. */
  private readHash(p: number): number {
    const t = this.text;
    const from = p + 1;
    const to = from + HASH_CHARS;
    if (t.charCodeAt(p) !== 0x22 || to >= t.length || t.charCodeAt(to) !== 0x22)
      throw bad('every block hash is a string of 64 hex digits');
    for (let i = from; i < to; i++)
      if (!isHex(t.charCodeAt(i))) throw bad('every block hash is 64 lowercase hex digits');
    this.hashes.add(t.slice(from, to));
    return to + 1;
  }
}
