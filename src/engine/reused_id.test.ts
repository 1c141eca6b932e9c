/**
 * A request id reused right after its predecessor was aborted (a client that disconnects and retries with
 * the same X-Request-Id). With async scheduling the aborted request still has a step in flight; that step's
 * sampled token is matched to a request by id and epoch (Scheduler.updateFromOutput). Epochs are unique
 * across requests (request.ts nextEpoch), so the stale token is dropped and the retry gets its own tokens.
 * With epochs counted from 0 per request, the loop asserted "sampled token for X without a placeholder"
 * and died (every request on the instance failed), or the retry got the old request's token.
 * And close() with a request in flight settles it (it waited forever before).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { LLMEngine, type EngineCreateConfig, type GenerateRequest } from './llm_engine.ts';
import { threadedDevice } from './devices.ts';
import { smallEngineConfig, spreadPrompt } from './scheduler_testkit.ts';

const prompt = spreadPrompt;
const config = (): EngineCreateConfig => smallEngineConfig(threadedDevice('dsv4-mini', 1));

test('an id reused right after abort gets its own tokens and the engine survives', async () => {
  const env = new RealEnv(3);
  const ref = await LLMEngine.create(config(), env);
  const e = await LLMEngine.create(config(), env);
  try {
    const b: GenerateRequest = {
      requestId: 'X',
      promptTokenIds: prompt(30, 2),
      sampling: { maxTokens: 4, temperature: 0, ignoreEos: true },
    };
    const expected = await ref.generate({ ...b, requestId: 'ref' });

    // A: id X, long generation; after its 2nd token the client goes away (abort) and retries with the same id.
    let fired = false;
    let seen = 0;
    const retried = new Promise<{ p: Promise<unknown> }>((resolveRetry) => {
      e.submit(
        { requestId: 'X', promptTokenIds: prompt(25, 1), sampling: { maxTokens: 50, temperature: 0, ignoreEos: true } },
        (o) => {
          seen += o.newTokenIds.length;
          if (seen < 2 || fired) return;
          fired = true;
          // On a later macrotask, like the HTTP 'close' event and the client's retry.
          setImmediate(() => {
            e.abort('X');
            resolveRetry({ p: e.generate(b) });
          });
        },
      );
    });
    const { p } = await retried;
    const got = await Promise.race([
      p.then(
        (r) => r as { tokenIds: number[] },
        (err: unknown) => err as Error,
      ),
      env.sleep(5000).then(() => 'timeout' as const),
    ]);
    assert.equal(e.core.crashed, null, `the engine loop crashed: ${e.core.crashed?.message}`);
    assert.notEqual(got, 'timeout', 'the retried request never settled');
    assert.ok(!(got instanceof Error), `the retried request failed: ${(got as Error).message}`);
    assert.deepEqual((got as { tokenIds: number[] }).tokenIds, expected.tokenIds, 'the retry got its own tokens');
  } finally {
    await ref.close();
    await e.close();
  }
});

test('close() with a request in flight settles its generate() promise (rejected: the engine was closed)', async () => {
  const env = new RealEnv(3);
  const e = await LLMEngine.create(config(), env);
  const p = e.generate({
    promptTokenIds: prompt(20, 1),
    sampling: { maxTokens: 200, temperature: 0, ignoreEos: true },
  });
  const settled = p.then(
    () => 'resolved',
    (err: Error & { code?: string }) => `rejected ${err.code}`,
  );
  await env.sleep(50);
  await e.close();
  const r = await Promise.race([settled, env.sleep(2000).then(() => 'pending')]);
  assert.equal(r, 'rejected OVERLOADED', 'generate() settles when the engine closes');
});
