/** ActivitySignal: every subscriber hears each notify until it unsubscribes; notifying with none is a no-op. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ActivitySignal } from './activity.ts';

test('ActivitySignal: notify reaches every subscriber; unsubscribe stops it', () => {
  const s = new ActivitySignal();
  s.notify();
  const heard: string[] = [];
  const offA = s.subscribe(() => heard.push('a'));
  s.subscribe(() => heard.push('b'));
  s.notify();
  offA();
  s.notify();
  assert.deepEqual(heard, ['a', 'b', 'b']);
});
