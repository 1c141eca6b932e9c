/**
 * Proves the tokenizer is GPT-2's (known ids), round-trips text, and that the incremental decoder
 * streams exactly the full decode while never emitting a half character (U+FFFD).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { decode, encode, EOS_TOKEN_ID, IncrementalDecoder } from './tokenizer.ts';

test('GPT-2 ids: known encodings, EOS is 50256, special-token text is plain text', () => {
  assert.deepEqual(encode('Hello world'), [15496, 995]);
  assert.equal(EOS_TOKEN_ID, 50256);
  assert.equal(decode([EOS_TOKEN_ID]), '<|endoftext|>');
  assert.ok(!encode('<|endoftext|>').includes(EOS_TOKEN_ID));
  assert.throws(() => decode([50257]), /out of the vocabulary/);
});

test('encode/decode round-trips any text', () => {
  fc.assert(fc.property(fc.string({ unit: 'grapheme', maxLength: 40 }), (text) => assert.equal(decode(encode(text)), text)));
});

test('IncrementalDecoder: pieces concatenate to the full text and never end in a half character', () => {
  const text = 'naïve 🙂 café 日本語 🚀🚀 done';
  const ids = encode(text);
  assert.ok(ids.some((id) => decode([id]).includes('\uFFFD')), 'the sample must split a character across tokens');
  const dec = new IncrementalDecoder();
  const pieces = ids.map((id) => dec.push(id));
  assert.equal(pieces.join('') + dec.flush(), text);
  assert.ok(pieces.every((p) => !p.includes('\uFFFD')));
  assert.ok(pieces.includes(''), 'something was held back');
  fc.assert(
    fc.property(fc.string({ unit: 'grapheme', maxLength: 30 }).filter((s) => !s.includes('\uFFFD')), (t) => {
      const d = new IncrementalDecoder();
      const out = encode(t).map((id) => d.push(id));
      assert.equal(out.join('') + d.flush(), t);
      assert.ok(out.every((p) => !p.includes('\uFFFD')));
    }),
  );
});
