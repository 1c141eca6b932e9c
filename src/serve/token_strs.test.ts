/**
 * /tokenize with return_token_strs answers each token's vocabulary string, as vLLM does
 * (serving_tokenization.py: tokenizer.convert_ids_to_tokens(input_ids)): for GPT-2's byte-level BPE a
 * leading space is "Ġ" and every byte has its own printable character, so a token holding part of an
 * emoji reads "ĠðŁĺ", not U+FFFD.
 *
 * Failed before: token_strs held each token decoded alone as text: " world" for "Ġworld" and
 * " \uFFFD" / "\uFFFD" for the two halves of an emoji (the halves' strings were indistinguishable).
 */
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { encode } from '../model/tokenizer.ts';
import { startFake, type Fake } from './scripted_server_testkit.ts';

let f: Fake;
before(async () => {
  f = await startFake();
});
after(async () => f.close());

test('/tokenize return_token_strs: GPT-2 convert_ids_to_tokens strings (byte-level), like vLLM', async () => {
  const prompt = 'Hello world 😀\n\tnaïve';
  const r = await fetch(`${f.url}/tokenize`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, return_token_strs: true }),
  });
  assert.equal(r.status, 200);
  const j = (await r.json()) as { tokens: number[]; token_strs: string[] };
  assert.deepEqual(j.tokens, encode(prompt));
  // What Hugging Face's GPT2TokenizerFast.convert_ids_to_tokens answers for these ids.
  assert.deepEqual(j.token_strs, ['Hello', 'Ġworld', 'ĠðŁĺ', 'Ģ', 'Ċ', 'ĉ', 'na', 'Ã¯ve']);
});
