/**
 * SSE framing: events are `data: <json>\n\n` and the stream ends with `data: [DONE]`; the parser gets
 * the same payloads back however the bytes are split (TCP may cut anywhere), CRLF included.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { SSE_DONE, SseParser, sseEvent } from './sse.ts';

test('format: one data line per event, a blank line after it, [DONE] last', () => {
  assert.equal(sseEvent({ a: 1, s: 'x\ny' }), 'data: {"a":1,"s":"x\\ny"}\n\n');
  assert.equal(SSE_DONE, 'data: [DONE]\n\n');
  assert.deepEqual(new SseParser().push('data: 1\r\n\r\n: comment\n\ndata: [DONE]\n\n'), ['1', '[DONE]']);
});

test('property: any split of a stream parses to the same payloads', () => {
  fc.assert(
    fc.property(fc.array(fc.jsonValue(), { maxLength: 8 }), fc.array(fc.nat(), { maxLength: 10 }), (payloads, cuts) => {
      const stream = payloads.map(sseEvent).join('') + SSE_DONE;
      const points = [...new Set(cuts.map((c) => c % (stream.length + 1)))].sort((a, b) => a - b);
      const parser = new SseParser();
      const got: string[] = [];
      let prev = 0;
      for (const p of [...points, stream.length]) {
        got.push(...parser.push(stream.slice(prev, p)));
        prev = p;
      }
      assert.deepEqual(got, [...payloads.map((p) => JSON.stringify(p)), '[DONE]']);
    }),
    { numRuns: 300 },
  );
});
