/**
 * handoff_http_errors_total{code} takes the code of a peer's error JSON. A code that is a name on
 * Object.prototype ("constructor", "toString", ...) passes `code in ERROR_CODES`: the label holds a value
 * that is no error code, and the error's HTTP status is a function (the answer cannot be written).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { ERROR_CODES, handoffErrorFromJSON } from '../util/errors.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance } from './instance.ts';

const env = new RealEnv(5);

test('a peer error code named like an Object.prototype member is not taken as a code', () => {
  for (const code of ['constructor', 'toString', '__proto__', 'hasOwnProperty']) {
    const e = handoffErrorFromJSON({ error: { code, message: 'm' } }, 'fallback');
    assert.ok(Object.hasOwn(ERROR_CODES, e.code), `code ${e.code} taken from a peer`);
    assert.equal(typeof e.httpStatus, 'number');
  }
});

test('sidecar: a prefiller answering with code "constructor" gives a known code label and an answer', async () => {
  const prefiller = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(400, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { code: 'constructor', message: 'x' } }));
    });
  });
  await new Promise<void>((r) => prefiller.listen(0, '127.0.0.1', r));
  const port = (prefiller.address() as AddressInfo).port;
  const d = await startInstance(
    { ...DEFAULT_INSTANCE_OPTIONS, role: 'decode', port: 0, numBlocks: 64, scheduler: { maxModelLen: 256 } },
    env,
  );
  try {
    const r = await fetch(`${d.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-prefiller-host-port': `127.0.0.1:${port}` },
      body: JSON.stringify({ prompt: 'hi', max_tokens: 2 }),
      signal: AbortSignal.timeout(10_000),
    }).then(
      (x) => x.status,
      (e: Error) => `no answer: ${e.message}`,
    );
    const text = (await d.server.metrics.text()).body;
    const codes = [...text.matchAll(/^handoff_http_errors_total\{code="([^"]+)"/gm)].map((m) => m[1] as string);
    assert.deepEqual(
      codes.filter((c) => !Object.hasOwn(ERROR_CODES, c)),
      [],
      `labels: ${codes.join(',')}`,
    );
    assert.equal(typeof r, 'number', String(r));
  } finally {
    await d.close();
    await new Promise((r) => (prefiller.closeAllConnections(), prefiller.close(() => r(null))));
  }
});
