/**
 * NicHost.close past its grace: a NIC thread that does not answer 'closed' within CLOSE_GRACE_MS (a
 * wedged thread) is terminated, and a drainGrant() posted before the close settles then (callers free
 * pages in its .then(); it waited for an event that could no longer come). White box: the NIC thread is
 * a stand-in that never answers, passed to NicHost's private constructor.
 */
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { MessageChannel } from 'node:worker_threads';
import { test } from 'node:test';
import { NicHost } from './nic_host.ts';

test('NicHost.close past its grace settles a drainGrant posted before it', async () => {
  const wedged = Object.assign(new EventEmitter(), { terminate: async () => 1 });
  const { port1, port2 } = new MessageChannel();
  port2.on('message', () => {}); // the NIC thread receives commands and never answers
  const Ctor = NicHost as unknown as new (...a: unknown[]) => NicHost;
  const nic = new Ctor(wedged, port1, new SharedArrayBuffer(16), new SharedArrayBuffer(64), 2, 0);
  let drained: 'pending' | 'settled' = 'pending';
  void nic.drainGrant('t1').then(
    () => (drained = 'settled'),
    () => (drained = 'settled'),
  );
  await nic.close(); // resolves after the 2 s grace
  await new Promise((r) => setTimeout(r, 200));
  port2.close();
  assert.equal(drained, 'settled', 'drainGrant posted before close() is still pending after close() resolved');
});
