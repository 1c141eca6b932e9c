/**
 * WRITE mode through the real proxy, prefill host hung (SIGSTOP) for longer than the notify timeout, then
 * continued (SIGCONT). Decode's `remote_blocks` notice to the hung prefill times out and decode drops that
 * side channel. Proves that decode then handshakes again: once the prefill is back, WRITE loads succeed
 * again (no new KV load failure) and are answered without waiting for the transfer deadline. Before the
 * fix decode's peer directory kept the dropped channel as ready, every later notice failed at once with
 * "no handshake with peer", and every request to that decode waited for its whole transfer deadline and
 * was recomputed, for good.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../../src/util/env.ts';
import { spawnHandoff, type ChildServer } from '../../src/cli/children.ts';
import { allPagesFree, metric, post, tokens, waitFor } from './kit.ts';

const env = new RealEnv(29);
const NUM_BLOCKS = 128;
const HANG_MS = 60_000;
/** Decode's WRITE deadline: a load that fails is recomputed after this. */
const TRANSFER_TIMEOUT_MS = 4000;
const children: ChildServer[] = [];

after(async () => {
  for (const c of children) if (!c.exited) process.kill(c.pid, 'SIGCONT');
  await Promise.all(children.map((c) => c.stop(2000)));
});

async function spawn(args: string[]): Promise<ChildServer> {
  const c = await spawnHandoff(args, env, { env: { HANDOFF_LOG_LEVEL: 'error' } });
  children.push(c);
  return c;
}

function serve(role: 'prefill' | 'decode', extra: Record<string, unknown>): Promise<ChildServer> {
  const config = JSON.stringify({
    kv_connector: 'OneSidedConnector',
    kv_connector_extra_config: { read_mode: false, ...extra },
  });
  const args = ['serve', '--role', role, '--port', '0', '--num-blocks', String(NUM_BLOCKS), '--max-model-len', '512'];
  return spawn([...args, '--kv-transfer-config', config]);
}

const bodyFor = (prompt: string): Record<string, unknown> => ({
  model: 'dsv4-mini',
  prompt,
  max_tokens: 4,
  temperature: 0,
  ignore_eos: true,
  return_token_ids: true,
});

test('WRITE: after a hung prefill comes back, decode handshakes again and its loads succeed', async () => {
  const [prefill, decode] = await Promise.all([
    serve('prefill', { lease_ms: 3000 }),
    serve('decode', { transfer_timeout_ms: TRANSFER_TIMEOUT_MS }),
  ]);
  const proxy = await spawn([
    'proxy',
    '--mode',
    'write',
    '--prefill',
    prefill!.url,
    '--decode',
    decode!.url,
    '--port',
    '0',
  ]);
  const loadFailures = (): Promise<number> => metric(decode!, 'handoff_kv_load_failures_total');
  const warm = bodyFor('Warm up: prefill pushes its pages into the pages decode granted it.');
  assert.deepEqual(tokens(await post(proxy.url, warm, HANG_MS)), tokens(await post(decode!.url, warm, HANG_MS)));
  assert.equal(await loadFailures(), 0, 'the warm-up WRITE landed');

  // The prefill host hangs while a request is under way: decode's notice to it gets no answer.
  const failedBefore = await metric(decode!, 'handoff_transfer_notifications_failed_total');
  process.kill(prefill!.pid, 'SIGSTOP');
  const hung = post(proxy.url, bodyFor('Sent while the prefill host hangs.'), HANG_MS);
  await waitFor(
    env,
    "decode's remote_blocks notice to the hung prefill timed out",
    async () => (await metric(decode!, 'handoff_transfer_notifications_failed_total')) > failedBefore,
  );
  process.kill(prefill!.pid, 'SIGCONT');
  assert.equal((await hung).status, 200, 'the request under way is answered (recomputed)');
  await Promise.all([allPagesFree(env, prefill!, NUM_BLOCKS - 1), allPagesFree(env, decode!, NUM_BLOCKS - 1)]);
  await waitFor(env, 'the proxy sees both instances healthy', async () => (await fetch(`${proxy.url}/health`)).ok);

  // The host is back: the next requests load over a new side channel, none waits for the deadline.
  const failures = await loadFailures();
  for (const [i, prompt] of ['After the hang, the first.', 'After the hang, the second.'].entries()) {
    const body = bodyFor(prompt);
    const ref = tokens(await post(decode!.url, body, HANG_MS));
    const t0 = env.nowMs();
    assert.deepEqual(tokens(await post(proxy.url, body, HANG_MS)), ref);
    const tookMs = env.nowMs() - t0;
    // The first may still find the old channel (then it is recomputed once); from then on every load lands.
    if (i > 0) {
      assert.ok(
        (await loadFailures()) <= failures + 1,
        `WRITE loads fail again and again after the prefill came back (${(await loadFailures()) - failures} of ${i + 1})`,
      );
      assert.ok(tookMs < TRANSFER_TIMEOUT_MS, `answered in ${tookMs} ms: it waited for the transfer deadline`);
    }
  }
  await Promise.all([allPagesFree(env, prefill!, NUM_BLOCKS - 1), allPagesFree(env, decode!, NUM_BLOCKS - 1)]);
});
