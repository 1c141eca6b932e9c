/**
 * Byte-level BPE (tiktoken's algorithm) in O(n log n) per pretokenized piece, over tiktoken's rank
 * files (js-tiktoken ships GPT-2's). js-tiktoken's own merge loop rescans every adjacent pair after
 * each merge and joins byte arrays into string keys: quadratic, so a 20k-character word took 39 s on
 * the event loop. This one gives exactly the same ids (tested against js-tiktoken) in near linear time.
 *
 * The merge rule we must reproduce: while some adjacent pair of parts concatenates to a known token,
 * merge the pair with the LOWEST rank, the LEFTMOST one on a tie. A min-heap keyed by (rank, start)
 * yields exactly that pair; entries made stale by earlier merges are recognised and dropped:
 *
 *   piece "abab", rank(ab) < rank(ba)       end[s] = end of the part starting at s (-1: merged away)
 *   parts [a][b][a][b]    heap (ab,0) (ab,2) (ba,1)
 *   pop (ab,0) → [ab][a][b]    push (aba,0) if "aba" is a token
 *   pop (ab,2) → [ab][ab]      push (abab,0) if "abab" is a token
 *   pop (ba,1)   stale: 1 is no longer a part start → dropped
 *   pop (aba,0)  stale: the part right of 0 now ends at 4, not 3 → dropped
 *
 * A token is at most `maxTokenBytes` long (128 for GPT-2), so pairs longer than that are never looked
 * up and every lookup costs O(1).
 */
import { assert } from '../util/assert.ts';

/** The shape of js-tiktoken's rank modules (`js-tiktoken/ranks/gpt2`). */
export interface TiktokenRanks {
  pat_str: string;
  special_tokens: Record<string, number>;
  bpe_ranks: string;
}

/** Bits of a heap key: rank (< 2^16) · start (< 2^28) · pair length (< 2^8) = 52 bits, exact in a double. */
const START_LIMIT = 2 ** 28;
const LEN_LIMIT = 256;

export class BytePairEncoder {
  /** Token bytes as a latin1 string (one char per byte) → rank. */
  private readonly ranks = new Map<string, number>();
  private readonly bytesOf: Uint8Array[] = [];
  private readonly specialBytes = new Map<number, Uint8Array>();
  private readonly pattern: RegExp;
  readonly maxTokenBytes: number;
  readonly vocabSize: number;
  private readonly utf8 = new TextEncoder();
  // ignoreBOM: a U+FEFF the model generated is text; by default TextDecoder drops one that starts the
  // bytes, and the incremental detokenizer decodes every token on its own.
  private readonly utf8Decoder = new TextDecoder('utf-8', { ignoreBOM: true });
  // Scratch reused across pieces (grown on demand): part ends, previous part starts, the heap.
  private end = new Int32Array(64);
  private prev = new Int32Array(64);
  private heap: Float64Array<ArrayBuffer> = new Float64Array(64);

  constructor(spec: TiktokenRanks) {
    let maxLen = 0;
    // Lines look like "<ignored> <first rank> <base64 token> <base64 token> ..." (js-tiktoken's compact form).
    for (const line of spec.bpe_ranks.split('\n')) {
      if (line.length === 0) continue;
      const fields = line.split(' ');
      const first = Number.parseInt(fields[1] ?? '', 10);
      assert(Number.isInteger(first), 'a rank line starts with its first rank');
      for (let i = 2; i < fields.length; i++) {
        const bytes = new Uint8Array(Buffer.from(fields[i] ?? '', 'base64'));
        const rank = first + i - 2;
        this.ranks.set(latin1(bytes, 0, bytes.length), rank);
        this.bytesOf[rank] = bytes;
        maxLen = Math.max(maxLen, bytes.length);
      }
    }
    for (let b = 0; b < 256; b++)
      assert(this.ranks.has(String.fromCharCode(b)), `every single byte is a token (byte ${b})`);
    assert(maxLen < LEN_LIMIT && this.ranks.size < 2 ** 16, 'ranks fit the heap key');
    for (const [text, rank] of Object.entries(spec.special_tokens)) this.specialBytes.set(rank, this.utf8.encode(text));
    this.maxTokenBytes = maxLen;
    this.vocabSize = Math.max(this.bytesOf.length, ...[...this.specialBytes.keys()].map((r) => r + 1));
    this.pattern = new RegExp(whiteSpaceAsUnicode(spec.pat_str), 'gu');
  }

  /** Token ids of `text`; special-token text is ordinary text (js-tiktoken's encode(text, [], [])). */
  encode(text: string): number[] {
    const out: number[] = [];
    this.pattern.lastIndex = 0;
    for (let m = this.pattern.exec(text); m !== null; m = this.pattern.exec(text)) {
      const piece = m[0];
      // Invariant: the pattern never matches the empty string (else exec would not advance).
      assert(piece.length > 0, 'pretokenizer matched an empty piece');
      // ASCII text is its own latin1 byte string; anything else goes through UTF-8.
      const key = isAscii(piece) ? piece : utf8Latin1(this.utf8.encode(piece));
      const whole = this.ranks.get(key);
      if (whole !== undefined) out.push(whole);
      else this.mergePiece(key, out);
    }
    return out;
  }

  /** The bytes of `ids` decoded as UTF-8 (invalid sequences become U+FFFD); unknown ids are skipped. */
  decode(ids: readonly number[]): string {
    const parts: Uint8Array[] = [];
    let length = 0;
    for (const id of ids) {
      const b = this.bytesOfToken(id);
      if (b === undefined) continue;
      parts.push(b);
      length += b.length;
    }
    const all = new Uint8Array(length);
    let at = 0;
    for (const b of parts) {
      all.set(b, at);
      at += b.length;
    }
    return this.utf8Decoder.decode(all);
  }

  /** The bytes of token `id` (a token may hold part of a character); undefined for an unknown id. */
  bytesOfToken(id: number): Uint8Array | undefined {
    return this.bytesOf[id] ?? this.specialBytes.get(id);
  }

  /** BPE of one piece given as a latin1 byte string; appends the ids to `out`. */
  private mergePiece(bytes: string, out: number[]): void {
    const n = bytes.length;
    assert(n < START_LIMIT, () => `a piece of ${n} bytes is beyond the merge's key range`);
    this.reserve(n);
    const end = this.end;
    const prev = this.prev;
    for (let s = 0; s < n; s++) {
      end[s] = s + 1;
      prev[s] = s - 1;
    }
    let size = 0;
    for (let s = 0; s + 1 < n; s++) {
      const r = this.ranks.get(bytes.slice(s, s + 2));
      if (r !== undefined) this.heap[size++] = heapKey(r, s, 2);
    }
    size = this.heapify(size);
    while (size > 0) {
      const top = this.heap[0] as number;
      size = this.pop(size);
      const len = top % LEN_LIMIT;
      const s = Math.floor(top / LEN_LIMIT) % START_LIMIT;
      const r = end[s] as number;
      // Stale: s stopped being a part start, or its right neighbour changed since the entry was pushed.
      if (r < 0 || r >= n || end[r] !== s + len) continue;
      const e = end[r] as number;
      end[s] = e;
      end[r] = -1;
      if (e < n) prev[e] = s;
      const p = prev[s] as number;
      if (p >= 0) size = this.pushPair(bytes, p, e, size);
      if (e < n) size = this.pushPair(bytes, s, end[e] as number, size);
    }
    for (let s = 0; s < n; s = end[s] as number) {
      const id = this.ranks.get(bytes.slice(s, end[s]));
      // Invariant: every part is a single byte or the result of a merge, so it has a rank.
      assert(id !== undefined, 'a BPE part without a rank');
      out.push(id);
    }
  }

  /** Push the pair [s, e) if it is a token (no token is longer than maxTokenBytes). */
  private pushPair(bytes: string, s: number, e: number, size: number): number {
    if (e - s > this.maxTokenBytes) return size;
    const r = this.ranks.get(bytes.slice(s, e));
    if (r === undefined) return size;
    if (size === this.heap.length) this.heap = grow(this.heap, size * 2);
    let i = size;
    const key = heapKey(r, s, e - s);
    const h = this.heap;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if ((h[parent] as number) <= key) break;
      h[i] = h[parent] as number;
      i = parent;
    }
    h[i] = key;
    return size + 1;
  }

  /** Move `v` down from slot `i` of a heap of `size` keys until both children are not smaller. */
  private siftDown(i: number, v: number, size: number): void {
    const h = this.heap;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= size) break;
      const c = l + 1 < size && (h[l + 1] as number) < (h[l] as number) ? l + 1 : l;
      if ((h[c] as number) >= v) break;
      h[i] = h[c] as number;
      i = c;
    }
    h[i] = v;
  }

  /** Remove the minimum (heap[0]); returns the new size. */
  private pop(size: number): number {
    const n = size - 1;
    if (n > 0) this.siftDown(0, this.heap[n] as number, n);
    return n;
  }

  private heapify(size: number): number {
    for (let start = (size >> 1) - 1; start >= 0; start--) this.siftDown(start, this.heap[start] as number, size);
    return size;
  }

  private reserve(n: number): void {
    if (this.end.length < n + 1) {
      this.end = new Int32Array(n + 1);
      this.prev = new Int32Array(n + 1);
    }
    if (this.heap.length < n) this.heap = new Float64Array(n);
  }
}

function heapKey(rank: number, start: number, len: number): number {
  return (rank * START_LIMIT + start) * LEN_LIMIT + len;
}

function grow(a: Float64Array, size: number): Float64Array<ArrayBuffer> {
  const b = new Float64Array(size);
  b.set(a);
  return b;
}

/**
 * The pattern with `\s` / `\S` as Unicode White_Space, as the regex engines of GPT-2's encoder.py
 * (Python `regex`), tiktoken and HF tokenizers read them. JavaScript's `\s` also matches U+FEFF and
 * misses U+0085, so text with either was split into other pieces, hence other ids, than GPT-2's.
 */
function whiteSpaceAsUnicode(pattern: string): string {
  return pattern.replaceAll('\\s', '\\p{White_Space}').replaceAll('\\S', '\\P{White_Space}');
}

function isAscii(s: string): boolean {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) > 0x7f) return false;
  return true;
}

function utf8Latin1(bytes: Uint8Array): string {
  return latin1(bytes, 0, bytes.length);
}

/** Bytes as a string of one char per byte (a Map key). */
function latin1(bytes: Uint8Array, from: number, to: number): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset + from, to - from).toString('latin1');
}
