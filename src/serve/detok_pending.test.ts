/**
 * Proves that the answer's text is the decode of its tokens, also after a run of tokens whose text ends
 * in U+FFFD (a generated "�" is token 4210): the incremental detokenizer held such a run back and, at 8
 * held tokens, released it as text, cutting the bytes of a character that its 8th token began. The
 * character's last bytes, decoded on their own, became U+FFFD too: seven "�" and "’" (tokens 447 247)
 * came out as nine "�", streamed and not; vLLM (and a decode of the tokens) returns "�������’".
 */
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { decode, encode } from '../model/tokenizer.ts';
import { startFake, sse, EOS, type Fake } from './scripted_server_testkit.ts';

const FFFD_TOKEN = 4210;
const ANSWER = [...Array<number>(7).fill(FFFD_TOKEN), ...encode('’ ok')];
const TEXT = decode(ANSWER);

let f: Fake;
before(async () => {
  f = await startFake();
  f.script = [...ANSWER, EOS];
});
after(async () => f.close());

test('a run of "�" tokens followed by a split character: the text is the tokens’ decode, streamed and not', async () => {
  assert.equal(TEXT, '\uFFFD'.repeat(7) + '’ ok');
  const body = { prompt: 'x', max_tokens: 50 };
  const r = await fetch(`${f.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const j = (await r.json()) as any;
  assert.equal(j.choices[0].text, TEXT);
  const streamed = (await sse(f.url, '/v1/completions', { ...body, stream: true }))
    .filter((d) => d !== '[DONE]')
    .map((d) => JSON.parse(d).choices[0]?.text ?? '')
    .join('');
  assert.equal(streamed, TEXT);
});
