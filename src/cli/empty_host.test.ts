/**
 * An empty `--host` (e.g. `--host "$HOST"` with HOST unset) was taken as-is: Node's listen on '' binds
 * every interface, so `handoff serve` served on all of them (`*:port`, its KV side channel and data plane
 * too, since only '0.0.0.0' / '::' fell back to 127.0.0.1 for those) and printed `http://:PORT`; `handoff
 * up` started both children that way, then polled `http://:PORT/health` (ERR_INVALID_URL) until its 60 s
 * health bound ran out. `handoff proxy` listened on every interface too.
 *
 * This proves: an empty or blank --host / --transfer-host is BAD_CONFIG naming the flag, before anything
 * listens or any child starts. Before the fix: serve kept serving (killed by the test's timeout, status
 * null), up printed "starting" and hung, proxy kept serving.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { assertBadConfig, cli } from './cli_testkit.ts';

test('serve: an empty --host or --transfer-host is refused, not bound to every interface', () => {
  assertBadConfig(cli(['serve', '--port', '0', '--host', ''], 15_000), '--host');
  assertBadConfig(cli(['serve', '--port', '0', '--host', ' '], 15_000), '--host');
  assertBadConfig(cli(['serve', '--role', 'prefill', '--port', '0', '--transfer-host', ''], 15_000), '--transfer-host');
});

test('up: an empty --host is refused before any child starts', () => {
  const r = cli(['up', '--port', '0', '--host', ''], 15_000);
  assertBadConfig(r, '--host');
  assert.doesNotMatch(r.stdout, /starting/, 'no child was started');
});

test('proxy: an empty --host is refused', () => {
  const r = cli(
    ['proxy', '--port', '0', '--host', '', '--prefill', 'http://127.0.0.1:1', '--decode', 'http://127.0.0.1:2'],
    15_000,
  );
  assertBadConfig(r, '--host');
});
