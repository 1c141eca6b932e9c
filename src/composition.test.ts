/**
 * One composition root, one P/D flow (issue 12 items 1 and 2), checked on the source text like tidy:
 * the servers and the simulator build instances with the same function (engine/build_instance.ts) and
 * drive prefill → decode with the same function (serve/pd_flow.ts), so what the simulator explores is
 * what the servers run. A second way to wire an engine or a connector, or a second copy of the flow,
 * fails here.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const SRC = dirname(fileURLToPath(import.meta.url));

function walk(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? walk(p) : /\.(ts|mjs)$/.test(name) ? [p] : [];
  });
}

const sources = walk(SRC)
  .map((p) => relative(SRC, p).split('\\').join('/'))
  .filter((f) => !f.endsWith('.test.ts') && !f.endsWith('_testkit.ts'));
const code = (f: string): string =>
  readFileSync(join(SRC, f), 'utf8')
    .replace(/\/\*[\s\S]*?\*\//g, '')
    .replace(/(^|[^:'"`])\/\/.*$/gm, '$1');

/** Who may assemble what: the builder and the connector factory (plus one benchmark of the bare scheduler). */
const ASSEMBLY: Array<{ pattern: RegExp; allowed: string[] }> = [
  { pattern: /\bLLMEngine\.(create|fromParts)\s*\(/, allowed: ['engine/build_instance.ts', 'engine/llm_engine.ts'] },
  // bench_sched.ts times Scheduler.schedule() against a connector scheduler without any transfer engine.
  { pattern: /\bnew OneSidedConnectorScheduler\s*\(/, allowed: ['connector/factory.ts', 'engine/bench_sched.ts'] },
  { pattern: /\bnew OneSidedConnectorWorker\s*\(/, allowed: ['connector/factory.ts'] },
  { pattern: /\bnew PeerDirectory\s*\(/, allowed: ['connector/factory.ts'] },
  { pattern: /\boneSidedConnectorFactory\s*\(/, allowed: ['connector/factory.ts', 'engine/build_instance.ts'] },
];

test('composition: the servers, the simulator and the P/D pair build their instances with buildInstance', () => {
  for (const f of ['serve/instance.ts', 'sim/instance.ts', 'sim/pd_pair.ts', 'sim/ab.ts']) {
    assert.ok(/\bbuildInstance\s*(<[^>]*>)?\(/.test(code(f)), `${f} builds its engines with buildInstance`);
  }
});

test('composition: nobody but the builder and the connector factory assembles an engine or a connector (tests aside)', () => {
  const bad: string[] = [];
  for (const f of sources) {
    const text = code(f);
    for (const { pattern, allowed } of ASSEMBLY)
      if (pattern.test(text) && !allowed.includes(f)) bad.push(`${f}: ${pattern.source}`);
  }
  assert.deepEqual(bad, []);
});

test('composition: no mutable engine holder patched after construction (the ActivitySignal wakes the loop)', () => {
  const bad = sources.filter((f) => /engine\?\.core\.kick\(\)|\bbuilt\.(engine|connector)\s*=/.test(code(f)));
  assert.deepEqual(bad, []);
});

test('composition: the HTTP proxy, the sim proxy and the P/D pair run the one pdFlow; nobody else writes the flow', () => {
  for (const f of ['serve/proxy.ts', 'sim/proxy.ts', 'sim/pd_pair.ts'])
    assert.ok(/\bpdFlow\s*(<[^>]*>)?\(/.test(code(f)), `${f} calls pdFlow`);
  // The prefill ask (do_remote_decode: true) and the WRITE decode params are written only in pd_flow.ts.
  const writers = sources.filter((f) => /do_remote_decode:\s*true/.test(code(f)));
  assert.deepEqual(writers, ['serve/pd_flow.ts']);
  // Above the engine (where the proxies live), only pdFlow tells decode which prefill to wait for.
  const named = sources.filter((f) => /^(serve|sim|cli)\//.test(f) && /remote_engine_id:/.test(code(f)));
  assert.deepEqual(named, ['serve/pd_flow.ts']);
});

test('composition: the checks above can fail (each pattern catches a hand-wired copy)', () => {
  const handWired =
    'const e = await LLMEngine.create(cfg, env); const w = new OneSidedConnectorWorker(a); x = { do_remote_decode: true };';
  assert.ok(ASSEMBLY[0]?.pattern.test(handWired));
  assert.ok(ASSEMBLY[2]?.pattern.test(handWired));
  assert.ok(/do_remote_decode:\s*true/.test(handWired));
});
