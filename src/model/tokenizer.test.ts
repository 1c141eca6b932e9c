/**
 * Proves the tokenizer is GPT-2's (known ids), gives exactly js-tiktoken's ids (a corpus of prose,
 * code, unicode and whitespace, and fast-check strings) while staying near linear on one long word,
 * round-trips text, bounds tokens by characters (MAX_TOKEN_BYTES), and that the incremental decoder
 * streams exactly the full decode while never emitting a half character (U+FFFD).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import fc from 'fast-check';
import { Tiktoken } from 'js-tiktoken/lite';
import gpt2 from 'js-tiktoken/ranks/gpt2';
import { RealEnv } from '../util/env.ts';
import { decode, encode, EOS_TOKEN_ID, IncrementalDecoder, MAX_TOKEN_BYTES } from './tokenizer.ts';

/**
 * The reference: js-tiktoken's own (quadratic) merge, on inputs short enough for it, over GPT-2's pieces
 * (its pattern's `\s` read as Unicode White_Space, as GPT-2's Python `regex` does, not as JavaScript's).
 */
const reference = new Tiktoken({
  ...gpt2,
  pat_str: gpt2.pat_str.replaceAll('\\s', '\\p{White_Space}').replaceAll('\\S', '\\P{White_Space}'),
});
const refEncode = (text: string): number[] => reference.encode(text, [], []);

test('GPT-2 ids: known encodings, EOS is 50256, special-token text is plain text', () => {
  assert.deepEqual(encode('Hello world'), [15496, 995]);
  assert.equal(EOS_TOKEN_ID, 50256);
  assert.equal(decode([EOS_TOKEN_ID]), '<|endoftext|>');
  assert.ok(!encode('<|endoftext|>').includes(EOS_TOKEN_ID));
  assert.throws(() => decode([50257]), /out of the vocabulary/);
});

test('encode/decode round-trips any text', () => {
  fc.assert(
    fc.property(fc.string({ unit: 'grapheme', maxLength: 40 }), (text) => assert.equal(decode(encode(text)), text)),
  );
});

test('IncrementalDecoder: pieces concatenate to the full text and never end in a half character', () => {
  const text = 'naïve 🙂 café 日本語 🚀🚀 done';
  const ids = encode(text);
  assert.ok(
    ids.some((id) => decode([id]).includes('\uFFFD')),
    'the sample must split a character across tokens',
  );
  const dec = new IncrementalDecoder();
  const pieces = ids.map((id) => dec.push(id));
  assert.equal(pieces.join('') + dec.flush(), text);
  assert.ok(pieces.every((p) => !p.includes('\uFFFD')));
  assert.ok(pieces.includes(''), 'something was held back');
  fc.assert(
    fc.property(
      fc.string({ unit: 'grapheme', maxLength: 30 }).filter((s) => !s.includes('\uFFFD')),
      (t) => {
        const d = new IncrementalDecoder();
        const out = encode(t).map((id) => d.push(id));
        assert.equal(out.join('') + d.flush(), t);
        assert.ok(out.every((p) => !p.includes('\uFFFD')));
      },
    ),
  );
});

test('ids equal js-tiktoken on a corpus: prose, code, unicode, whitespace runs, long pieces', () => {
  const files = ['../../README.md', './bpe.ts', '../serve/openai_request.ts'].map((f) =>
    readFileSync(new URL(f, import.meta.url), 'utf8'),
  );
  const samples = [
    ...files,
    ...files.flatMap((f) => f.split('\n')),
    'Hello world',
    "It's 3:14 p.m. — we'll see; they'd've said 'no'.",
    'naïve café 日本語テキスト 한국어 Ελληνικά עברית العربية 🙂🚀👩‍👩‍👧 \u00a0nbsp \u200b zero-width',
    'def f(x):\n\treturn {"a": [1, 2, 3]}  # comment\n\n\n    \r\n',
    ' '.repeat(300) + 'x' + '\t'.repeat(50) + '\n'.repeat(40) + ' \n \n',
    'a'.repeat(700),
    'ab'.repeat(300),
    '1234567890'.repeat(40),
    '!?'.repeat(200) + '----'.repeat(100) + '===='.repeat(80),
    'Ã'.repeat(200),
    '🙂'.repeat(100),
    'x\uD800y\uDFFFz', // lone surrogates become U+FFFD's bytes in both
    '<|endoftext|> <|im_start|>user\nhi<|im_end|>\n',
  ];
  for (const s of samples) assert.deepEqual(encode(s), refEncode(s), JSON.stringify(s.slice(0, 60)));
});

test('property: ids equal js-tiktoken on random strings, including long runs that need many merges', () => {
  const runs = fc
    .array(
      fc.tuple(
        fc.constantFrom('a', 'e', 'ab', ' ', '\n', '1', '-', '=', 'é', '日', '🙂', "'s", ' the'),
        fc.integer({ min: 1, max: 60 }),
      ),
      { maxLength: 8 },
    )
    .map((parts) => parts.map(([p, k]) => p.repeat(k)).join(''));
  const text = fc.oneof(
    fc.string({ unit: 'grapheme', maxLength: 60 }),
    fc.string({ unit: 'binary', maxLength: 60 }),
    fc.string({ maxLength: 80 }),
    runs,
  );
  fc.assert(
    fc.property(text, (t) => assert.deepEqual(encode(t), refEncode(t))),
    { numRuns: 500 },
  );
});

test('MAX_TOKEN_BYTES: no text has fewer than ceil(length / MAX_TOKEN_BYTES) tokens (the edge refuses by length on it)', () => {
  // (That MAX_TOKEN_BYTES is the longest token of the ranks is asserted when the tokenizer is built.)
  fc.assert(
    fc.property(
      fc.oneof(
        fc.string({ unit: 'binary', maxLength: 400 }),
        fc.constantFrom('Ã'.repeat(500), ' '.repeat(900), 'a'.repeat(900)),
      ),
      (t) => {
        assert.ok(encode(t).length >= Math.ceil(t.length / MAX_TOKEN_BYTES));
      },
    ),
  );
});

test('one word of 1,000,000 characters tokenizes (near linear; js-tiktoken takes ~40 s at 20,000)', () => {
  const env = new RealEnv(1);
  for (const n of [20_000, 1_000_000]) {
    const text = 'a'.repeat(n);
    const t0 = env.nowMs();
    const ids = encode(text);
    const ms = env.nowMs() - t0;
    assert.equal(decode(ids), text);
    assert.equal(ids.length, n / 4, "'aaaa' is one token");
    console.log(`# encode('a' × ${n}): ${ids.length} tokens in ${ms.toFixed(0)} ms`);
  }
});
