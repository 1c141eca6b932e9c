/**
 * Shared plumbing of the end-to-end tests that drive real `handoff` processes: posting completions with a
 * hang bound, reading token ids, scraping /metrics, and bounded polling. No assertions of their own
 * beyond "the request was answered" and "the metric exists".
 */
import assert from 'node:assert/strict';
import type { Env } from '../../src/util/env.ts';
import type { ChildServer } from '../../src/cli/children.ts';

export type Extra = Record<string, unknown>;

export interface Reply {
  status: number;
  json: Extra & { error?: { code: string; message: string; type: string }; choices?: Array<{ token_ids: number[] }> };
}

/** POST a JSON body; a request still unanswered after `hangMs` fails the test as a hang. */
export async function post(url: string, body: unknown, hangMs: number, path = '/v1/completions'): Promise<Reply> {
  let r: Response;
  try {
    r = await fetch(`${url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(hangMs),
    });
  } catch (e) {
    if ((e as Error).name === 'TimeoutError') assert.fail(`request to ${url} hung (no answer after ${hangMs} ms)`);
    throw e;
  }
  return { status: r.status, json: (await r.json()) as Reply['json'] };
}

/** The token ids of a 200 completion (`return_token_ids: true`). */
export const tokens = (r: Reply): number[] => {
  assert.equal(r.status, 200, JSON.stringify(r.json).slice(0, 300));
  return r.json.choices?.[0]?.token_ids ?? assert.fail('no token_ids');
};

/** Sum of every sample of `name` in the child's /metrics (labels folded). */
export async function metric(c: ChildServer, name: string): Promise<number> {
  let sum: number | undefined;
  for (const line of (await (await fetch(`${c.url}/metrics`)).text()).split('\n')) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})? (\S+)$/.exec(line);
    if (m && m[1] === name) sum = (sum ?? 0) + Number(m[2]);
  }
  assert.ok(sum !== undefined, `${name} in /metrics of ${c.url}`);
  return sum;
}

/** Poll until `cond` holds (bounded: a liveness check, not a speed check). A throwing probe counts as false. */
export async function waitFor(env: Env, what: string, cond: () => Promise<boolean>, boundMs = 20_000): Promise<void> {
  const deadline = env.nowMs() + boundMs;
  while (!(await cond().catch(() => false))) {
    if (env.nowMs() > deadline) assert.fail(`${what}: still not true after ${boundMs} ms`);
    await env.sleep(25);
  }
}

/** Every page of the child back in its pool and nothing running. */
export const allPagesFree = (env: Env, c: ChildServer, totalPages: number): Promise<void> =>
  waitFor(
    env,
    `free pages of ${String(c.ready['role'])} ${c.url} back to ${totalPages}`,
    async () =>
      (await metric(c, 'handoff_kv_free_pages')) === totalPages &&
      (await metric(c, 'handoff_num_requests_running')) === 0,
  );

/** Whether process `pid` still exists (signal 0 delivers nothing, it only checks). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    // catch-ok: ESRCH means the process is gone, which is the answer
    return false;
  }
}
