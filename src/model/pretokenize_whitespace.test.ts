/**
 * Proves that text is split into pieces as GPT-2 splits it: the pattern's `\s` is Unicode White_Space
 * (GPT-2's encoder.py runs it with Python's `regex`, as tiktoken's and HF tokenizers' regex engines do),
 * not JavaScript's `\s`, which also matches U+FEFF (a BOM, not White_Space) and misses U+0085 (NEL,
 * White_Space). So " \uFEFF" (one piece for GPT-2: 27332 119 123) was split into " " and "\uFEFF"
 * (220 171 119 123), and " \u0085" (two pieces: 220, 126 227) was kept as one (1587 227): a prompt with
 * either got other ids than vLLM gives it (/tokenize counts, prompt tokens, the answer).
 *
 * The expected ids: Python `regex.findall` of GPT-2's pattern gives ['x', ' \ufeff', 'y'] and
 * ['a', ' ', '\x85', 'b']; each piece's BPE is the one this tokenizer gives for that piece alone.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { decode, encode } from './tokenizer.ts';

test('pretokenizing: U+FEFF is not whitespace and U+0085 is (GPT-2’s pieces, hence its ids)', () => {
  assert.deepEqual(encode('x \ufeffy'), [87, 27332, 119, 123, 88]);
  assert.deepEqual(encode('a \u0085b'), [64, 220, 126, 227, 65]);
  assert.deepEqual(encode('\ufeff \n'), [171, 119, 123, 220, 198]); // '\ufeff', ' \n' (GPT-2: not one whitespace run)
  for (const t of ['x \ufeffy', 'a \u0085b', '\ufeff \n', 'a\u0085\u0085 b\u00a0 \u3000c'])
    assert.equal(decode(encode(t)), t);
});
