/**
 * pdFlow with fake legs: what each side is asked, in which order, and which error is the answer. The
 * HTTP proxy, the sim proxy and the P/D pair all run this function, so these cases hold for all three.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { AssertionFailure } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import { pdFlow, type PdLegs, type PrefillIdentity, type TransferParams } from './pd_flow.ts';

const PREFILL: PrefillIdentity = {
  engineId: 'prefill-1',
  sideChannelHost: '10.0.0.1',
  sideChannelPort: 7000,
  transferMode: 'write',
};
const RETURNED = {
  do_remote_prefill: true,
  do_remote_decode: false,
  remote_engine_id: 'prefill-1',
  remote_block_ids: [[1, 2]],
  transfer_id: 'x-1',
  grant: 'ab',
};

interface Deferred<T> {
  promise: Promise<T>;
  resolve(v: T): void;
  reject(e: unknown): void;
}
function deferred<T>(): Deferred<T> {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => ((resolve = res), (reject = rej)));
  return { promise, resolve, reject };
}

/** Legs whose answers the test controls; `log` records calls and aborts in order. */
function fakeLegs() {
  const log: string[] = [];
  const pre = deferred<{ kvTransferParams: unknown }>();
  const dec = deferred<string>();
  const asked: { prefill: unknown; decode: TransferParams | null; release: TransferParams | null } = {
    prefill: null,
    decode: null,
    release: null,
  };
  const legs: PdLegs<string> = {
    prefill: (ask, signal) => {
      log.push('prefill');
      asked.prefill = ask;
      signal.addEventListener('abort', () => log.push('prefill aborted'));
      return pre.promise;
    },
    decode: (params, signal) => {
      log.push('decode');
      asked.decode = params;
      signal.addEventListener('abort', () => log.push('decode aborted'));
      return dec.promise;
    },
    releaseUnused: (params) => {
      log.push('release');
      asked.release = params;
    },
  };
  return { legs, log, pre, dec, asked };
}

const code = (c: string) => (e: unknown) => e instanceof HandoffError && e.code === c;

test('READ: prefill first (max_tokens 1, do_remote_decode), decode only after it, with its params flipped for decode', async () => {
  const f = fakeLegs();
  const out = pdFlow(f.legs, { mode: 'read', transferId: 'x-1' });
  assert.deepEqual(f.log, ['prefill'], 'decode waits for prefill');
  assert.deepEqual(f.asked.prefill, {
    maxTokens: 1,
    kvTransferParams: { do_remote_decode: true, do_remote_prefill: false, transfer_id: 'x-1' },
  });
  f.pre.resolve({ kvTransferParams: { ...RETURNED, do_remote_prefill: false } });
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(f.log, ['prefill', 'decode']);
  assert.deepEqual(f.asked.decode, { ...RETURNED, do_remote_prefill: true, do_remote_decode: false });
  f.dec.resolve('tokens');
  assert.equal(await out, 'tokens');
});

test('READ: prefill answering without kv_transfer_params is TRANSFER_FAILED; decode never runs', async () => {
  for (const answer of [null, undefined, 'params', [1]]) {
    const f = fakeLegs();
    f.pre.resolve({ kvTransferParams: answer });
    await assert.rejects(pdFlow(f.legs, { mode: 'read', transferId: 'x' }), code('TRANSFER_FAILED'));
    assert.deepEqual(f.log, ['prefill']);
  }
});

test('READ: a prefill error is the answer; a decode error is the answer', async () => {
  const a = fakeLegs();
  a.pre.reject(new HandoffError('OVERLOADED', 'full'));
  await assert.rejects(pdFlow(a.legs, { mode: 'read', transferId: 'x' }), code('OVERLOADED'));
  assert.deepEqual(a.log, ['prefill']);
  const b = fakeLegs();
  b.pre.resolve({ kvTransferParams: RETURNED });
  b.dec.reject(new HandoffError('KV_LOAD_FAILED', 'read failed'));
  await assert.rejects(pdFlow(b.legs, { mode: 'read', transferId: 'x' }), code('KV_LOAD_FAILED'));
});

test('READ: the client going away during prefill is REQUEST_ABORTED; decode never runs, nothing to release', async () => {
  const f = fakeLegs();
  const client = new AbortController();
  const out = pdFlow(f.legs, { mode: 'read', transferId: 'x', signal: client.signal });
  client.abort();
  // Prefill aborted its request (its pages are freed there): no params came back.
  f.pre.reject(new HandoffError('REQUEST_ABORTED', 'aborted'));
  await assert.rejects(out, code('REQUEST_ABORTED'));
  assert.deepEqual(f.log, ['prefill', 'prefill aborted']);
});

test('READ: the client going away after prefill answered: decode is never asked, only told to release (dynamo #13855)', async () => {
  const f = fakeLegs();
  const client = new AbortController();
  const out = pdFlow(f.legs, { mode: 'read', transferId: 'x', signal: client.signal });
  client.abort();
  // Prefill had already finished: its answer (and its held pages) arrive after the client left.
  f.pre.resolve({ kvTransferParams: RETURNED });
  await assert.rejects(out, code('REQUEST_ABORTED'));
  assert.deepEqual(f.log, ['prefill', 'prefill aborted', 'release']);
  assert.deepEqual(f.asked.release, { ...RETURNED, do_remote_prefill: true, do_remote_decode: false });
  assert.equal(f.asked.decode, null);
});

test('WRITE: both legs start at once (prefill first); decode names prefill and shares the transfer id', async () => {
  const f = fakeLegs();
  const out = pdFlow(f.legs, { mode: 'write', transferId: 'x-2', prefill: PREFILL });
  assert.deepEqual(f.log, ['prefill', 'decode'], 'decode does not wait for prefill');
  assert.deepEqual(f.asked.decode, {
    do_remote_prefill: true,
    do_remote_decode: false,
    remote_engine_id: 'prefill-1',
    remote_host: '10.0.0.1',
    remote_port: 7000,
    transfer_id: 'x-2',
  });
  f.dec.resolve('tokens');
  f.pre.resolve({ kvTransferParams: null });
  assert.equal(await out, 'tokens', "decode's result is the answer; prefill's params are not needed");
});

test('WRITE: a prefill failure aborts decode and is the answer; a decode failure aborts prefill and is the answer', async () => {
  const a = fakeLegs();
  const outA = pdFlow(a.legs, { mode: 'write', transferId: 'x', prefill: PREFILL });
  a.pre.reject(new HandoffError('PEER_UNAVAILABLE', 'prefill died'));
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(a.log, ['prefill', 'decode', 'decode aborted']);
  a.dec.reject(new HandoffError('REQUEST_ABORTED', 'aborted'));
  await assert.rejects(outA, code('PEER_UNAVAILABLE'));
  const b = fakeLegs();
  const outB = pdFlow(b.legs, { mode: 'write', transferId: 'x', prefill: PREFILL });
  b.dec.reject(new HandoffError('BAD_REQUEST', 'too long'));
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(b.log, ['prefill', 'decode', 'prefill aborted']);
  b.pre.reject(new HandoffError('REQUEST_ABORTED', 'aborted'));
  await assert.rejects(outB, code('BAD_REQUEST'));
});

test('WRITE: an unknown prefill is PEER_UNAVAILABLE, a prefill in READ mode PEER_INCOMPATIBLE; neither leg runs', async () => {
  const a = fakeLegs();
  await assert.rejects(pdFlow(a.legs, { mode: 'write', transferId: 'x', prefill: null }), code('PEER_UNAVAILABLE'));
  await assert.rejects(
    pdFlow(a.legs, { mode: 'write', transferId: 'x', prefill: { ...PREFILL, sideChannelPort: null } }),
    code('PEER_UNAVAILABLE'),
  );
  await assert.rejects(
    pdFlow(a.legs, { mode: 'write', transferId: 'x', prefill: { ...PREFILL, transferMode: 'read' } }),
    code('PEER_INCOMPATIBLE'),
  );
  assert.deepEqual(a.log, []);
});

test('an assertion in a leg is never turned into a request error: it comes out as itself', async () => {
  const f = fakeLegs();
  const out = pdFlow(f.legs, { mode: 'write', transferId: 'x', prefill: PREFILL });
  f.pre.reject(new AssertionFailure('broken invariant'));
  f.dec.resolve('tokens');
  await assert.rejects(out, (e: unknown) => e instanceof AssertionFailure);
});
