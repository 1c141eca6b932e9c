/**
 * `bench serve --target xpyd` plumbing without starting a deployment: the prefix-cache counters summed
 * over instances' /metrics (labels and all), and flag errors refused before any instance starts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { HANDOFF_BIN } from './children.ts';
import { prefixCounters } from './bench_xpyd.ts';

test('prefixCounters sums hits and queries over every instance', async () => {
  const bodies = [
    'handoff_prefix_cache_queries_total{role="prefill",model="m"} 100\nhandoff_prefix_cache_hits_total{role="prefill",model="m"} 40\n',
    '# HELP x\nhandoff_prefix_cache_queries_total{role="decode",model="m"} 50\nhandoff_prefix_cache_hits_total{role="decode",model="m"} 45\n',
  ];
  const servers = bodies.map((b) => createServer((_, res) => res.end(b)));
  await Promise.all(servers.map((s) => new Promise<void>((r) => s.listen(0, '127.0.0.1', r))));
  try {
    const urls = servers.map((s) => `http://127.0.0.1:${(s.address() as AddressInfo).port}`);
    assert.deepEqual(await prefixCounters(urls, null), { hits: 85, queries: 150 });
  } finally {
    await Promise.all(servers.map((s) => new Promise<void>((r) => s.close(() => r()))));
  }
});

test('bad xpyd flags exit 1 with one BAD_CONFIG line, before anything starts', () => {
  const run = (...args: string[]) =>
    spawnSync(process.execPath, [HANDOFF_BIN, 'bench', 'serve', '--target', 'xpyd', ...args], {
      encoding: 'utf8',
      timeout: 30_000,
    });
  for (const [args, why] of [
    [['--json'], /one --policy/],
    [['--policy', 'fastest'], /--policy must be one of/],
    [['--workload', 'mixed'], /--workload must be one of/],
    [['--prefill', '0'], /--prefill must be an integer/],
  ] as const) {
    const r = run(...args);
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, /^handoff: BAD_CONFIG: /);
    assert.match(r.stderr, why);
  }
});
