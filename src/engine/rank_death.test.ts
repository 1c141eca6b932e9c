/**
 * TP=2 on the threaded device: a rank's compute thread that dies (it exits mid-step, dies of an exception thrown
 * outside the kernel while the other rank waits for it in the collective, or dies while the engine is idle)
 * stops the engine with the thread's reason: the step's requests fail with it, `crashed` names it (the health
 * check answers 503 with it), later requests are refused with it, there is no unhandled rejection and close()
 * resolves. Before the fix the engine loop's next enqueue hit `enqueue on closed stream 'compute.r0'`, an
 * AssertionFailure: it became an unhandled rejection (the serving process died with that message alone),
 * close() rejected with it (so the other rank's thread was never terminated), and a rank dying while idle went
 * unnoticed (`crashed` stayed null) until the next request.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import {
  CRASH_LAST_RANK_PREFIX,
  DIE_AFTER_LAST_RANK_PREFIX,
  EXIT_LAST_RANK_PREFIX,
  FAILING_KERNELS_URL,
} from '../worker/kernels_testkit.ts';
import { LLMEngine, type GenerateRequest } from './llm_engine.ts';
import { threadedDevice } from './devices.ts';

const env = new RealEnv(12);
/** Far below the collective's 60 s wait bound, far above these tiny requests. */
const DEADLINE_MS = 15_000;

const req = (id: string, n: number, maxTokens = 4): GenerateRequest => ({
  requestId: id,
  promptTokenIds: Array.from({ length: n }, (_, i) => (n * 131 + i * 7919) % 50000),
  sampling: { maxTokens, temperature: 0, ignoreEos: true },
});

/** `p`, or a rejection naming `what` when it is still unsettled after DEADLINE_MS. */
function bounded<T>(p: Promise<T>, what: string): Promise<T> {
  let timer: { cancel(): void } | null = null;
  const hung = new Promise<never>((_, reject) => {
    timer = env.setTimer(DEADLINE_MS, () => reject(new Error(`${what} still unsettled after ${DEADLINE_MS} ms`)));
  });
  return Promise.race([p, hung]).finally(() => timer?.cancel());
}

const tp2 = (): Promise<LLMEngine> =>
  LLMEngine.create(
    {
      preset: 'llama-mini',
      modelSeed: 5,
      numBlocks: 64,
      tensorParallelSize: 2,
      asyncScheduling: true,
      scheduler: { maxNumBatchedTokens: 64, maxNumSeqs: 8 },
      idlePollMs: 2,
      makeDevice: threadedDevice('llama-mini', 5, false, FAILING_KERNELS_URL),
    },
    env,
  );

/** Runs `body` with unhandled rejections collected (they would kill a serving process). */
async function collectingUnhandled(body: (unhandled: unknown[]) => Promise<void>): Promise<void> {
  const unhandled: unknown[] = [];
  const onUnhandled = (e: unknown): void => void unhandled.push(e);
  process.on('unhandledRejection', onUnhandled);
  try {
    await body(unhandled);
  } finally {
    process.off('unhandledRejection', onUnhandled);
  }
}

function assertLost(err: unknown, reason: RegExp, what: string): void {
  assert.ok(err instanceof HandoffError && err.code === 'INTERNAL', `${what}: ${String(err)}`);
  assert.match(err.message, reason, what);
  assert.doesNotMatch(err.message, /closed stream/, what);
}

const midStep = [
  { prefix: EXIT_LAST_RANK_PREFIX, reason: /compute thread 1 exited \(code 9\)/ },
  { prefix: CRASH_LAST_RANK_PREFIX, reason: /compute thread 1 died: rank thread crashed/ },
];

for (const { prefix, reason } of midStep) {
  test(`TP=2: rank 1's thread lost mid-step (${prefix}): the engine stops with its reason, no unhandled rejection`, async () => {
    await collectingUnhandled(async (unhandled) => {
      const e = await tp2();
      let closed = false;
      try {
        await e.generate(req('warm', 12));
        const [other, dying] = await bounded(
          Promise.allSettled([e.generate(req('other', 12, 16)), e.generate(req(`${prefix}1`, 9))]),
          'the requests of the failed step',
        );
        assert.equal(dying.status, 'rejected');
        assertLost((dying as PromiseRejectedResult).reason, reason, 'the dying request');
        assert.equal(other.status, 'rejected', 'the device is gone: its batch-mate cannot finish either');
        assertLost((other as PromiseRejectedResult).reason, reason, 'its batch-mate');
        for (let k = 0; k < 200 && e.core.crashed === null; k++) await env.sleep(10);
        assertLost(e.core.crashed, reason, 'the engine loop');
        await assert.rejects(bounded(e.generate(req('later', 12)), 'a later request'), (err) => {
          assertLost(err, reason, 'a later request');
          return true;
        });
        await bounded(e.close(), 'close()');
        closed = true;
        assert.deepEqual(unhandled.map(String), [], 'no unhandled rejection');
      } finally {
        if (!closed) {
          e.core.reportCrashesViaCrashed();
          await e.device.close();
        }
      }
    });
  });
}

test('TP=2: rank 1 thread dying while the engine is idle stops the engine at once (health 503), not at the next request', async () => {
  await collectingUnhandled(async (unhandled) => {
    const e = await tp2();
    let closed = false;
    try {
      await e.generate(req(`${DIE_AFTER_LAST_RANK_PREFIX}1`, 9, 1));
      for (let k = 0; k < 300 && e.core.crashed === null; k++) await env.sleep(10);
      assertLost(e.core.crashed, /compute thread 1 died: rank thread crashed while idle/, 'the idle engine');
      await bounded(e.close(), 'close()');
      closed = true;
      assert.deepEqual(unhandled.map(String), [], 'no unhandled rejection');
    } finally {
      if (!closed) {
        e.core.reportCrashesViaCrashed();
        await e.device.close();
      }
    }
  });
});
