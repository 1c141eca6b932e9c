/**
 * Review finding: a client that goes away while sending its body is not a server bug. readJsonBody threw
 * the socket's plain "aborted" Error, which toHandoffError turns into INTERNAL (logged as "unexpected
 * error while serving a request", counted as handoff_http_errors_total{code="INTERNAL"}).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { connect } from 'node:net';
import type { AddressInfo } from 'node:net';
import { readJsonBody, toHandoffError } from './http_io.ts';

test('a body cut off by the client leaving is REQUEST_ABORTED, not INTERNAL', async () => {
  let caught: unknown = null;
  const done = new Promise<void>((resolve) => {
    const server = createServer((req, res) => {
      readJsonBody(req)
        .catch((e: unknown) => {
          caught = e;
        })
        .finally(() => {
          res.destroy();
          server.close();
          resolve();
        });
    });
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as AddressInfo;
      const s = connect(port, '127.0.0.1', () => {
        s.write('POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{"prompt":');
        setTimeout(() => s.destroy(), 50);
      });
    });
  });
  await done;
  assert.notEqual(caught, null, 'readJsonBody failed');
  const logged: unknown[] = [];
  const log = { error: (o: unknown) => logged.push(o) } as never;
  assert.equal(toHandoffError(caught, log).code, 'REQUEST_ABORTED');
  assert.deepEqual(logged, [], 'not logged as an unexpected error');
});
