/**
 * Startup's capacity check and the engine's per-request check must agree: an instance that starts with
 * --max-model-len L must accept a request of prompt + max_tokens = L (a chat request without max_tokens
 * asks for exactly that). On a hybrid model every request also holds one Mamba state page, which the
 * startup check left out: with --num-blocks one short, startup passed and every such request was
 * refused 503 OUT_OF_PAGES. Either startup refuses the pool (BAD_CONFIG) or the request is admitted.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance } from './instance.ts';

test('hybrid: a pool that starts holds one request of max_model_len (Mamba state page counted)', async () => {
  const maxModelLen = 256;
  // 16 attention pages for 256 tokens + the null block: enough without the Mamba page, one short with it.
  const opts = { ...DEFAULT_INSTANCE_OPTIONS, preset: 'hybrid-mini' as const, port: 0, device: 'sim' as const };
  let inst: Instance;
  try {
    inst = await startInstance({ ...opts, numBlocks: 17, scheduler: { maxModelLen } }, new RealEnv(1));
  } catch (e) {
    assert.ok(e instanceof HandoffError && e.code === 'BAD_CONFIG', `refused at startup as BAD_CONFIG: ${String(e)}`);
    return;
  }
  try {
    const prompt = Array.from({ length: 10 }, (_, i) => 100 + i);
    const req = inst.engine.makeRequest({
      promptTokenIds: prompt,
      sampling: { maxTokens: maxModelLen - prompt.length },
    });
    assert.doesNotThrow(() => inst.engine.scheduler.addRequest(req), 'a request of max_model_len tokens is admitted');
    inst.engine.scheduler.abortRequest(req.requestId);
  } finally {
    await inst.close();
  }
});

test('hybrid: the smallest pool startup accepts serves a request of max_model_len', async () => {
  const maxModelLen = 256;
  const opts = { ...DEFAULT_INSTANCE_OPTIONS, preset: 'hybrid-mini' as const, port: 0, device: 'sim' as const };
  const inst = await startInstance({ ...opts, numBlocks: 18, scheduler: { maxModelLen } }, new RealEnv(1));
  try {
    const prompt = Array.from({ length: 10 }, (_, i) => 100 + i);
    const req = inst.engine.makeRequest({
      promptTokenIds: prompt,
      sampling: { maxTokens: maxModelLen - prompt.length },
    });
    inst.engine.scheduler.addRequest(req);
    inst.engine.scheduler.abortRequest(req.requestId);
  } finally {
    await inst.close();
  }
});
