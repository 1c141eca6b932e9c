/**
 * upstreamRequestId: every upstream attempt gets an id of its own that is still a valid X-Request-Id (at
 * most 128 characters of [A-Za-z0-9._:@-]), also for a client id at the limit: cut after its 120th
 * character with a 17-character suffix, the old form reached 137 and the instance refused it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from './env.ts';
import { REQUEST_ID_MAX, upstreamRequestId } from './ids.ts';

const VALID = /^[A-Za-z0-9._:@-]+$/;

test('upstream ids: unique per attempt, the client id as prefix, valid ids at any client id length', () => {
  const env = new RealEnv(5);
  for (const client of ['c', 'client-1', 'x'.repeat(120), 'y'.repeat(REQUEST_ID_MAX)])
    for (const attempt of [1, 2, 12]) {
      const id = upstreamRequestId(client, env, attempt);
      assert.ok(id.length <= REQUEST_ID_MAX && VALID.test(id), `${id} (${id.length} characters)`);
      assert.match(id, attempt === 1 ? /\.[0-9a-f]{16}$/ : new RegExp(`\\.retry${attempt - 1}\\.[0-9a-f]{16}$`));
      assert.ok(id.startsWith(client.slice(0, 64)), 'the client id leads');
      assert.notEqual(id, upstreamRequestId(client, env, attempt), 'two attempts never share an id');
    }
});
