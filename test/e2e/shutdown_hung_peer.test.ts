/**
 * SIGTERM of a decode whose READ waits on a hung prefill host (SIGSTOP): `--drain-timeout-ms` bounds the
 * shutdown. Proves that once the drain runs out the process closes at once (exit 0 well within the drain
 * plus a few seconds) instead of waiting for the READ's step deadline (transfer_timeout_ms, 30 s by default):
 * before the fix, closing the engine waited for the step blocked on that READ, the 10 s stop bound past the
 * drain fired first, and the process exited 1 ("shutdown took too long"). The prefill, continued, keeps
 * serving and gets its pages back.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../../src/util/env.ts';
import { spawnHandoff, type ChildServer } from '../../src/cli/children.ts';
import { metric, post, tokens, waitFor } from './kit.ts';

const env = new RealEnv(23);
const NUM_BLOCKS = 128;
const HANG_MS = 45_000;
const DRAIN_MS = 1000;
const children: ChildServer[] = [];

after(async () => {
  for (const c of children) if (!c.exited) process.kill(c.pid, 'SIGCONT');
  await Promise.all(children.map((c) => c.stop(2000)));
});

async function serve(role: 'prefill' | 'decode', flags: string[] = []): Promise<ChildServer> {
  const config = JSON.stringify({ kv_connector: 'OneSidedConnector', kv_connector_extra_config: { read_mode: true } });
  const args = ['serve', '--role', role, '--port', '0', '--num-blocks', String(NUM_BLOCKS), '--max-model-len', '512'];
  const c = await spawnHandoff([...args, '--kv-transfer-config', config, ...flags], env, {
    env: { HANDOFF_LOG_LEVEL: 'error' },
  });
  children.push(c);
  return c;
}

const body = {
  model: 'dsv4-mini',
  prompt: 'A decode shutting down while its prefill host hangs must still exit within its drain bound. '.repeat(2),
  max_tokens: 4,
  temperature: 0,
  ignore_eos: true,
  return_token_ids: true,
};

async function prefillParams(prefill: ChildServer): Promise<Record<string, unknown>> {
  const r = await post(
    prefill.url,
    { ...body, max_tokens: 1, kv_transfer_params: { do_remote_decode: true } },
    HANG_MS,
  );
  assert.equal(r.status, 200, JSON.stringify(r.json));
  return r.json['kv_transfer_params'] as Record<string, unknown>;
}

test('decode SIGTERMed while its READ waits on a SIGSTOPped prefill exits 0 soon after its drain bound', async () => {
  const [prefill, decode] = await Promise.all([
    serve('prefill'),
    serve('decode', ['--drain-timeout-ms', String(DRAIN_MS)]),
  ]);
  // Warm up: decode has handshaken with this prefill (its READs go straight to the data connection).
  const ref = tokens(await post(decode!.url, body, HANG_MS));
  assert.deepEqual(
    tokens(await post(decode!.url, { ...body, kv_transfer_params: await prefillParams(prefill!) }, HANG_MS)),
    ref,
  );
  const reads = await metric(decode!, 'handoff_transfer_reads_total');

  const params = await prefillParams(prefill!);
  process.kill(prefill!.pid, 'SIGSTOP'); // a hung host: its sockets stay open, nothing answers
  const pending = post(decode!.url, { ...body, kv_transfer_params: params }, HANG_MS).then(
    (r) => `answered ${r.status}`,
    () => 'connection closed',
  );
  await waitFor(
    env,
    'decode posted its READ',
    async () => (await metric(decode!, 'handoff_transfer_reads_total')) > reads,
  );

  const exited = new Promise<number | null>((resolve) => decode!.child.once('exit', (code) => resolve(code)));
  const t0 = env.nowMs();
  decode!.child.kill('SIGTERM');
  const bound = env.setTimer(HANG_MS, () => decode!.child.kill('SIGKILL'));
  const code = await exited;
  bound.cancel();
  const tookMs = env.nowMs() - t0;
  assert.equal(code, 0, `decode exited ${code} after ${tookMs} ms (1 = its stop bound ran out)`);
  assert.ok(tookMs < DRAIN_MS + 6000, `decode exited ${tookMs} ms after SIGTERM (drain bound ${DRAIN_MS} ms)`);
  await pending;

  // The host comes back: prefill serves again and its pages come back (released or by the lease).
  process.kill(prefill!.pid, 'SIGCONT');
  assert.equal((await post(prefill!.url, { ...body, max_tokens: 2 }, HANG_MS)).status, 200);
});
