/**
 * Proves: on llm-d's sidecar path, a prefiller that fails its answer (200 with a body that is not a JSON
 * object, or its connection reset mid-answer) is a 502 PEER_UNAVAILABLE from decode, as an unreachable
 * prefiller is and as the proxy answers the same failures (upstream.ts readAnswer). Before, decode parsed
 * the answer unchecked: a SyntaxError, a TypeError on `null`, or the broken body reached the client as a
 * 500 INTERNAL "internal error: ...", logged as a bug of ours.
 * Also: an empty `x-prefiller-host-port` is a decode-only request, as llm-d's sidecar takes it (its EPP
 * clears the header to "" when it picks no prefiller); before, decode refused it with 400.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance } from './instance.ts';

const env = new RealEnv(43);
let d: Instance;

before(async () => {
  const o = { ...DEFAULT_INSTANCE_OPTIONS, role: 'decode' as const, port: 0, numBlocks: 64 };
  d = await startInstance({ ...o, scheduler: { maxModelLen: 256 } }, env);
});

after(async () => {
  await d.close();
});

/** A prefiller whose completions are answered by `answer`. */
async function prefiller(answer: (res: ServerResponse) => void): Promise<{ hostPort: string; close(): Promise<void> }> {
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => (req.url === '/v1/completions' ? answer(res) : res.writeHead(404).end('{}')));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    hostPort: `127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise((r) => (server.closeAllConnections(), server.close(() => r()))),
  };
}

const cases: Record<string, (res: ServerResponse) => void> = {
  'not JSON': (res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<html>gateway</html>'),
  'JSON null': (res) => res.writeHead(200, { 'content-type': 'application/json' }).end('null'),
  'reset mid-answer': (res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write('{"choices":[{"text":"x"');
    void env.sleep(50).then(() => res.socket?.destroy());
  },
};

for (const [name, answer] of Object.entries(cases)) {
  test(`llm-d protocol: a prefiller answering ${name} is a 502 PEER_UNAVAILABLE, not a 500 INTERNAL`, async () => {
    const p = await prefiller(answer);
    try {
      const r = await fetch(`${d.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-prefiller-host-port': p.hostPort },
        body: JSON.stringify({ prompt: [1, 2, 3, 4, 5], max_tokens: 4 }),
        signal: AbortSignal.timeout(30_000),
      });
      const body = (await r.json()) as { error: { code: string } };
      assert.equal(body.error.code, 'PEER_UNAVAILABLE', JSON.stringify(body));
      assert.equal(r.status, 502);
    } finally {
      await p.close();
    }
  });
}

test('llm-d protocol: an empty x-prefiller-host-port (llm-d EPP: no prefill) is served decode-only, not refused', async () => {
  const r = await fetch(`${d.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-prefiller-host-port': '' },
    body: JSON.stringify({ prompt: [1, 2, 3, 4, 5], max_tokens: 4 }),
    signal: AbortSignal.timeout(30_000),
  });
  const text = await r.text();
  assert.equal(r.status, 200, text);
  assert.equal((JSON.parse(text) as { usage: { completion_tokens: number } }).usage.completion_tokens, 4);
});
