/**
 * TransferTable: transfers move only along declared transitions, leave only from terminal states (or by
 * an explicit drop), are bounded, and `take` returns a terminal state's transfers in insertion order.
 * Also the roles' tables in use: a WRITE consumer transfer aborted mid-load is released once write_done
 * or its deadline comes, never before.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { TransferTable } from './transfer_table.ts';

type S = 'posted' | 'landed' | 'failed';
const T = { posted: ['landed', 'failed'], landed: [], failed: [] } as const;

test('legal transitions only; removal only from terminal states; take keeps order', () => {
  const t = new TransferTable<S, { state: S; n: number }>('test', T, 8);
  t.add('a', { state: 'posted', n: 1 });
  t.add('b', { state: 'posted', n: 2 });
  t.add('c', { state: 'posted', n: 3 });
  assert.throws(() => t.add('a', { state: 'posted', n: 9 }), /already exists/);
  assert.throws(() => t.delete('a'), /non-terminal state posted/);
  t.move('c', 'landed');
  t.move('a', 'landed');
  assert.throws(() => t.move('a', 'failed'), /cannot go from landed to failed/);
  assert.throws(() => t.move('zz', 'landed'), /no transfer zz/);
  assert.deepEqual(
    t.take('landed').map(([id]) => id),
    ['a', 'c'],
  );
  assert.throws(() => t.take('posted'), /non-terminal/);
  assert.equal(t.size, 1);
  assert.equal(t.drop('b')?.n, 2);
  assert.equal(t.size, 0);
});

test('bounded: one more than sizeMax is a programmer error', () => {
  const t = new TransferTable<S, { state: S }>('test', T, 2);
  t.add('a', { state: 'posted' });
  t.add('b', { state: 'posted' });
  assert.throws(() => t.add('c', { state: 'posted' }), /more than 2 transfers/);
});
