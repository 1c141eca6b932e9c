/**
 * A POST body declared as something other than JSON (`text/plain`, a form, multipart) is refused (400)
 * by the instance server and the proxy, as vLLM's FastAPI refuses it; an undeclared body, and
 * `application/json` (with parameters) or `application/<x>+json`, are still taken.
 *
 * Why: those three types are what a web page may make a browser POST cross-origin without a CORS
 * preflight (`fetch(url, {method: 'POST', mode: 'no-cors', body: '{"prompt": ...}'})` sends
 * `text/plain;charset=UTF-8`). Both servers parsed any body as JSON, so any page their user visited ran
 * completions (and cancels and releases) on a server without an API key (the default): FastAPI's
 * CVE-2021-32677. Before the fix the instance answered these with 200 and a generated completion, and the
 * proxy routed them (here: no healthy instance, 502) instead of refusing them.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { smallInstances } from './small_instances_testkit.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(7);
const start = smallInstances(env);
const BODY = JSON.stringify({ prompt: 'hello', max_tokens: 2 });
const CROSS_SITE = ['text/plain;charset=UTF-8', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x'];

async function post(url: string, path: string, contentType: string | null): Promise<{ status: number; json: any }> {
  const headers: Record<string, string> = contentType === null ? {} : { 'content-type': contentType };
  // A Blob without a type: fetch then sends no Content-Type of its own.
  const r = await fetch(`${url}${path}`, { method: 'POST', headers, body: new Blob([BODY]) });
  return { status: r.status, json: JSON.parse(await r.text()) };
}

test('instance: a body declared text/plain, form or multipart is refused; JSON and undeclared are served', async () => {
  const inst = await start({ device: 'sim' });
  for (const type of CROSS_SITE) {
    for (const path of ['/v1/completions', '/tokenize', '/handoff/cancel']) {
      const r = await post(inst.url, path, type);
      assert.equal(r.status, 400, `${path} ${type}: ${JSON.stringify(r.json)}`);
      assert.equal(r.json.error.code, 'BAD_REQUEST');
    }
  }
  for (const type of [null, 'application/json', 'Application/JSON; charset=utf-8', 'application/vnd.api+json']) {
    const r = await post(inst.url, '/v1/completions', type);
    assert.equal(r.status, 200, `${String(type)}: ${JSON.stringify(r.json)}`);
  }
});

test('proxy: a completion declared text/plain is refused before it is routed', async () => {
  const proxy = new Proxy(
    { ...DEFAULT_PROXY_OPTIONS, prefillUrls: ['http://127.0.0.1:9'], decodeUrls: ['http://127.0.0.1:9'] },
    env,
  );
  const port = await proxy.listen(0, '127.0.0.1');
  try {
    const r = await post(`http://127.0.0.1:${port}`, '/v1/completions', 'text/plain;charset=UTF-8');
    assert.equal(r.status, 400, JSON.stringify(r.json));
    assert.match(r.json.error.message, /Content-Type/);
  } finally {
    await proxy.close();
  }
});
