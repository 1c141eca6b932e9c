/**
 * Proves: DumpScanner, which reads a KV event dump a slice at a time, accepts exactly the bodies that
 * `JSON.parse` plus a check of each hash accepted (the feed's parser before session 19), and reads the
 * same epoch, seq and hashes, whatever the slice size: on well-formed dumps with any JSON whitespace and
 * key order, and on each of them broken by one character changed, inserted or removed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { DumpScanner } from './dump_scan.ts';

const HASH_RE = /^[0-9a-f]{64}$/;

/** The parser DumpScanner replaced: null where it refused the body. */
function reference(text: string): { epoch: string; seq: number; hashes: Set<string> } | null {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return null;
  }
  const o = v as Record<string, unknown> | null;
  if (o === null || typeof o !== 'object' || Array.isArray(o)) return null;
  const { epoch, seq, block_hashes: hashes } = o;
  if (typeof epoch !== 'string' || epoch.length === 0 || epoch.length > 128) return null;
  if (typeof seq !== 'number' || !Number.isSafeInteger(seq) || seq < 0) return null;
  if (!Array.isArray(hashes) || hashes.some((h) => typeof h !== 'string' || !HASH_RE.test(h))) return null;
  return { epoch, seq, hashes: new Set(hashes as string[]) };
}

function scan(text: string, slice: number, max = 1 << 20): ReturnType<typeof reference> | 'over' {
  let s: DumpScanner;
  try {
    s = new DumpScanner(text, max);
    while (!s.step(slice));
  } catch (e) {
    assert.equal((e as { code?: string }).code, 'BAD_REQUEST', String(e));
    return null;
  }
  return s.overBound ? 'over' : { epoch: s.epoch, seq: s.seq, hashes: s.hashes };
}

const hex = fc.constantFrom(...'0123456789abcdef'.split(''));
const hash = fc.array(hex, { minLength: 64, maxLength: 64 }).map((a) => a.join(''));
const ws = fc.array(fc.constantFrom(' ', '\t', '\n', '\r'), { maxLength: 2 }).map((a) => a.join(''));

/** A dump body: hashes (some repeated), whitespace between tokens, the three keys in any order. */
const body = fc
  .record({
    hashes: fc.array(hash, { maxLength: 12 }),
    repeat: fc.boolean(),
    seq: fc.nat(),
    epoch: fc.string({ minLength: 1, maxLength: 20 }),
    order: fc.constantFrom([0, 1, 2], [2, 0, 1], [1, 2, 0], [0, 2, 1]),
    gaps: fc.array(ws, { minLength: 40, maxLength: 40 }),
  })
  .map(({ hashes, repeat, seq, epoch, order, gaps }) => {
    const g = (i: number): string => gaps[i % gaps.length] as string;
    const list = repeat && hashes.length > 0 ? [...hashes, hashes[0] as string] : hashes;
    const arr = `[${g(1)}${list.map((h, i) => `"${h}"${g(i + 2)}`).join(`,${g(3)}`)}]`;
    const fields = [
      `"epoch"${g(4)}:${g(5)}${JSON.stringify(epoch)}`,
      `"seq"${g(6)}:${seq}`,
      `"block_hashes"${g(7)}:${g(8)}${arr}`,
    ];
    return `${g(9)}{${g(10)}${order.map((i) => fields[i]).join(`${g(11)},`)}${g(12)}}${g(13)}`;
  });

test('well-formed dumps: the same epoch, seq and hashes as JSON.parse, in slices of any size', () => {
  fc.assert(
    fc.property(body, fc.integer({ min: 1, max: 5 }), (text, slice) => {
      const want = reference(text);
      assert.notEqual(want, null, text);
      assert.deepEqual(scan(text, slice), want);
    }),
    { numRuns: 500 },
  );
});

test('each dump broken by one character: refused or accepted exactly as JSON.parse would', () => {
  const junk = fc.constantFrom(...'",[]{}: \\0aFx-.9'.split(''));
  fc.assert(
    fc.property(body, fc.nat(), junk, fc.constantFrom('set', 'insert', 'delete'), (text, at, c, how) => {
      const i = at % text.length;
      const broken =
        how === 'set'
          ? text.slice(0, i) + c + text.slice(i + 1)
          : how === 'insert'
            ? text.slice(0, i) + c + text.slice(i)
            : text.slice(0, i) + text.slice(i + 1);
      assert.deepEqual(scan(broken, 3), reference(broken), broken);
    }),
    { numRuns: 3000 },
  );
});

test('broken arrays the one-character mutations rarely reach: refused, like JSON.parse did', () => {
  const h = `"${'ab'.repeat(32)}"`;
  const wrap = (arr: string): string => `{"epoch":"e","seq":1,"block_hashes":${arr}}`;
  for (const arr of [`[${h},]`, `[${h} , ]`, `[,${h}]`, `[${h},,${h}]`, `[${h} ${h}]`, `[${h}`, `[${h}]]`, '[,]']) {
    assert.equal(reference(wrap(arr)), null, arr);
    assert.equal(scan(wrap(arr), 1), null, arr);
  }
  // An escaped hex digit: JSON.parse took it, no instance writes it, the scanner refuses it.
  assert.notEqual(reference(wrap(`["\\u0061${'b'.repeat(63)}"]`)), null);
  assert.equal(scan(wrap(`["\\u0061${'b'.repeat(63)}"]`), 1), null);
  // A second block_hashes key (JSON.parse keeps the last): refused, not read from the first.
  assert.equal(scan(`{"epoch":"e","seq":1,"block_hashes":[${h}],"block_hashes":[]}`, 1), null);
});

test('a dump with more elements than the bound is over it (duplicates count), not adopted in part', () => {
  const h = (i: number): string => i.toString(16).padStart(64, '0');
  const text = (n: number): string =>
    JSON.stringify({ epoch: 'e', seq: 3, block_hashes: [1, 2, 3, 1].slice(0, n).map(h) });
  assert.equal(scan(text(4), 2, 3), 'over');
  assert.equal((scan(text(3), 2, 3) as { hashes: Set<string> }).hashes.size, 3);
  assert.equal(scan(text(4), 1, 4) !== 'over', true);
  assert.deepEqual(scan('{"epoch":"e","seq":1,"block_hashes":[]}', 1), { epoch: 'e', seq: 1, hashes: new Set() });
  assert.equal(scan(`{"epoch":"e","seq":1,"block_hashes":["${'A'.repeat(64)}"]}`, 1), null, 'upper case refused');
});
