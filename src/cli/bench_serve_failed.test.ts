/**
 * `bench serve --url` against a server that fails every request exits 1 with the first error, after its
 * summary (before, it exited 0 with a summary of nothing); one request answered keeps the exit at 0.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { HANDOFF_BIN } from './children.ts';

/** A /v1/completions that answers 503 JSON, except the first `good` requests: one streamed token each. */
async function fakeServer(good: number): Promise<{ server: Server; url: string }> {
  let n = 0;
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (n++ < good) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end('data: {"choices":[{"index":0,"text":"a"}]}\n\ndata: [DONE]\n\n');
        return;
      }
      res.writeHead(503, { 'content-type': 'application/json' });
      res.end('{"error":{"message":"no pages left","code":"OUT_OF_PAGES"}}');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

function bench(url: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const args = [HANDOFF_BIN, 'bench', 'serve', '--url', url, '--requests', '3', '--concurrency', '1', '--json'];
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((r) => child.on('close', (code) => r({ code, stdout, stderr })));
}

test('every request failed: the summary, then exit 1 naming the first error', async () => {
  const { server, url } = await fakeServer(0);
  try {
    const r = await bench(url);
    assert.equal(r.code, 1, r.stderr);
    assert.equal(JSON.parse(r.stdout.trim()).errors, 3);
    assert.match(r.stderr, /all 3 requests failed \(the first: HTTP 503: .*no pages left/);
  } finally {
    server.close();
  }
});

test('one request answered: exit 0, two errors counted', async () => {
  const { server, url } = await fakeServer(1);
  try {
    const r = await bench(url);
    assert.equal(r.code, 0, r.stderr);
    const j = JSON.parse(r.stdout.trim());
    assert.equal(j.requests, 3);
    assert.equal(j.errors, 2);
  } finally {
    server.close();
  }
});
