/**
 * TokenizerThreads: long texts are tokenized on a worker thread (the same ids as inline), so the event
 * loop keeps running meanwhile (a timer fires before a long encode returns, which an inline encode
 * could not allow); short texts stay inline (no thread is started); more than pendingMax long texts
 * at once are refused with OVERLOADED; close() fails what is pending and terminates the threads.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { encode } from '../model/tokenizer.ts';
import { TokenizerThreads } from './tokenizer_threads.ts';

const env = new RealEnv(3);

test('short texts inline, long ones on a thread; the same ids either way', async () => {
  const t = new TokenizerThreads({ inlineCharsMax: 64, threadsMax: 1, pendingMax: 4 });
  try {
    assert.deepEqual(await t.encode('Hello world'), encode('Hello world'));
    assert.equal(t.numThreads, 0, 'a short text starts no thread');
    const long = `${'naïve café 🙂 code(x) => y; '.repeat(40)}${'z'.repeat(3000)}`;
    assert.deepEqual(await t.encode(long), encode(long));
    assert.equal(t.numThreads, 1);
    assert.equal(t.numPending, 0);
  } finally {
    await t.close();
  }
});

test('the event loop keeps running while a long text is tokenized', async () => {
  const t = new TokenizerThreads({ inlineCharsMax: 64, threadsMax: 1, pendingMax: 4 });
  try {
    await t.encode('x'.repeat(100)); // the thread is up (its start is not what this test is about)
    const events: string[] = [];
    const text = 'a'.repeat(3_000_000); // ~1.5 s of BPE
    const t0 = env.nowMs();
    const done = t.encode(text).then((ids) => {
      events.push('encoded');
      return ids;
    });
    const ticks: number[] = [];
    await new Promise<void>((resolve) => {
      const tick = (): void => {
        ticks.push(env.nowMs() - t0);
        if (ticks.length < 5) env.setTimer(10, tick);
        else resolve();
      };
      env.setTimer(10, tick);
    });
    events.push('timers');
    const ids = await done;
    assert.equal(ids.length, text.length / 4);
    assert.deepEqual(events, ['timers', 'encoded'], 'five timers ran while the thread tokenized');
    console.log(
      `# timer ticks during a 3M-character encode (ms): ${ticks.map((x) => x.toFixed(0)).join(', ')}; encode took ${(env.nowMs() - t0).toFixed(0)} ms`,
    );
  } finally {
    await t.close();
  }
});

test('more than pendingMax long texts at once: OVERLOADED; close() fails the pending ones and refuses more', async () => {
  const t = new TokenizerThreads({ inlineCharsMax: 8, threadsMax: 1, pendingMax: 2 });
  const text = 'b'.repeat(200_000);
  const first = t.encode(text);
  const second = t.encode(text);
  await assert.rejects(t.encode(text), (e: HandoffError) => e.code === 'OVERLOADED' && e.httpStatus === 503);
  assert.deepEqual(await first, encode(text), 'the queued ones are unharmed');
  assert.deepEqual(await second, await first);
  const pending = assert.rejects(t.encode(text), (e: HandoffError) => e.code === 'OVERLOADED');
  await t.close();
  await pending;
  await assert.rejects(
    t.encode('short'),
    (e: HandoffError) => e.code === 'OVERLOADED',
    'closed: even inline work is refused',
  );
  assert.equal(t.numThreads, 0);
});
