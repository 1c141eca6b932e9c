/**
 * A simulator seed thread: runs the seeds it is sent, one at a time, each in a world of its own, and
 * answers each with its SeedResult (plain data, no trace). A seed's result is a function of (options,
 * seed) alone, so it does not matter which thread runs it. A crash of the run itself (not a violation:
 * those are results) answers that seed with the error, and the thread goes on. One at a time also for
 * the crash oracle: a rejection nobody handled belongs to the one world running (crash_watch.ts).
 */
import { parentPort } from 'node:worker_threads';
import { assert } from '../util/assert.ts';
import { isHandoffError } from '../util/errors.ts';
import { runSeed } from './run_sim.ts';
import type { FromSimThread, ToSimThread } from './sim_threads.ts';

const port = parentPort;
assert(port !== null, 'sim_thread_worker must run in a worker thread');

const answer = (m: ToSimThread): Promise<void> =>
  runSeed(m.options, m.seed, false).then(
    (result) => port.postMessage({ seed: m.seed, result } satisfies FromSimThread),
    (e: unknown) =>
      port.postMessage({
        seed: m.seed,
        error: e instanceof Error ? (e.stack ?? e.message) : String(e),
        ...(isHandoffError(e) ? { code: e.code, message: e.message } : {}),
      } satisfies FromSimThread),
  );

let queue: Promise<void> = Promise.resolve();
port.on('message', (m: ToSimThread) => {
  queue = queue.then(() => answer(m));
});
