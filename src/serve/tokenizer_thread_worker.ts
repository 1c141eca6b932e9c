/**
 * A tokenizer thread: encodes the texts it is sent, one at a time, in arrival order, and answers each
 * with its ids (an Int32Array whose buffer is transferred, not copied). A failure answers that text
 * only; the thread goes on.
 */
import { parentPort } from 'node:worker_threads';
import { assert, rethrowIfAssertion } from '../util/assert.ts';
import { encode } from '../model/tokenizer.ts';
import type { FromTokenizerThread, ToTokenizerThread } from './tokenizer_threads.ts';

const port = parentPort;
assert(port !== null, 'tokenizer_thread_worker must run in a worker thread');

port.on('message', (m: ToTokenizerThread) => {
  try {
    const ids = Int32Array.from(encode(m.text));
    const reply: FromTokenizerThread = { id: m.id, ids };
    port.postMessage(reply, [ids.buffer]);
  } catch (e) {
    rethrowIfAssertion(e);
    const reply: FromTokenizerThread = { id: m.id, error: e instanceof Error ? e.message : String(e) };
    port.postMessage(reply);
  }
});
