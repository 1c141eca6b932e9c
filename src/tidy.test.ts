/**
 * Tidy: style rules that keep the architecture true, enforced as a test (TigerBeetle's tidy.zig).
 * - Determinism: only src/util/env.ts and the real backends (device, transfer, the serving edge's
 *   tokenizer threads) touch clocks, timers, threads or Math.random, so the simulator can run
 *   everything else.
 * - Layering: a folder imports only from folders below it (DESIGN.md §2).
 * - Size: no source file over 500 lines.
 * - Error discipline: no catch in production code swallows an AssertionFailure (CONVENTIONS.md §4):
 *   each one re-throws what it does not own, or says why not in a `// catch-ok:` comment.
 * - Function size: no production function over 70 lines, so each one fits on a screen.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const SRC = dirname(fileURLToPath(import.meta.url));

/** Bottom to top. */
export const LAYERS = [
  'util',
  'device',
  'kv',
  'transfer',
  'model',
  'worker',
  'connector',
  'engine',
  'serve',
  'sim',
  'cli',
];

/** Real backends: the only files besides env.ts allowed to touch time, timers, threads, sockets. */
const NONDETERMINISM_ALLOWED = [
  /^util\/env\.ts$/,
  /^device\/threaded[^/]*\.(ts|mjs)$/,
  /^device\/.*_thread\.(ts|mjs)$/,
  // The thread NIC and the backends that start it or open sockets (transfer/{nic,tcp,inproc}/).
  /^transfer\/(tcp|inproc|nic)\/[^/]*\.(ts|mjs)$/,
  // Prompts tokenized off the HTTP event loop (serve/tokenizer_threads.ts): threads, nothing else.
  /^serve\/tokenizer_thread[^/]*\.(ts|mjs)$/,
  // The serving process's own health on /metrics: its CPU time and event-loop delay sampler.
  /^serve\/process_metrics\.ts$/,
  // Simulator seeds across threads (sim/sim_threads.ts): a seed's result does not depend on its thread.
  /^sim\/sim_thread[^/]*\.(ts|mjs)$/,
];

function walk(dir: string): string[] {
  const out: string[] = [];
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...walk(p));
    else if (/\.(ts|mjs)$/.test(name)) out.push(p);
  }
  return out;
}

const files = walk(SRC).map((p) => relative(SRC, p).split('\\').join('/'));
const sources = files.filter((f) => !f.endsWith('.test.ts') && f !== 'tidy.test.ts');

function stripComments(text: string): string {
  return text.replace(/\/\*[\s\S]*?\*\//g, '').replace(/(^|[^:'"`])\/\/.*$/gm, '$1');
}

const FORBIDDEN = [
  /\bDate\.now\s*\(/,
  /\bMath\.random\s*\(/,
  /\bsetTimeout\s*\(/,
  /\bsetInterval\s*\(/,
  /\bperformance\.now\s*\(/,
  /\bnew Worker\s*\(/,
  /\bmonitorEventLoopDelay\s*\(/,
  /\bprocess\.cpuUsage\s*\(/,
];

export function determinismViolations(file: string, text: string): string[] {
  if (NONDETERMINISM_ALLOWED.some((re) => re.test(file))) return [];
  const code = stripComments(text);
  return FORBIDDEN.filter((re) => re.test(code)).map((re) => `${file}: ${re.source.replace(/\\/g, '')}`);
}

export function layerViolations(file: string, text: string): string[] {
  const layer = file.split('/')[0] ?? '';
  const mine = LAYERS.indexOf(layer);
  if (mine < 0) return [];
  const out: string[] = [];
  for (const m of text.matchAll(/(?:from|import)\s*\(?\s*['"](\.{1,2}\/[^'"]+)['"]/g)) {
    const target = relative(SRC, resolve(SRC, dirname(file), m[1] ?? ''))
      .split('\\')
      .join('/');
    const theirs = LAYERS.indexOf(target.split('/')[0] ?? '');
    if (theirs > mine) out.push(`${file} imports ${target} (${LAYERS[theirs]} is above ${layer})`);
  }
  return out;
}

/** Tests, their kits and the conformance suites may catch anything; production code may not. */
function isProduction(file: string): boolean {
  return !/\.test\.ts$|_testkit\.ts$|(^|\/)conformance[^/]*\.ts$/.test(file);
}

/** How far below a catch its re-throw must start: the first lines of the block, where a reader looks. */
const CATCH_WINDOW_LINES = 4;

/**
 * Every `catch (e)`, `catch {` and `.catch(` in a production file, unless it re-throws what it does not
 * own within its first lines — `throw e;` (also after a narrowing `if (!isHandoffError(e))`),
 * `rethrowIfAssertion(e)`, `reject(e)`, `toHandoffError(e)` (re-throws AssertionFailure), or
 * `throw new AssertionFailure` — or carries a `// catch-ok: <why>` comment on its line or in the three lines above.
 * A catch that binds nothing (`catch {`, `.catch(() => …)`) cannot re-throw, so it needs the comment.
 */
export function catchViolations(file: string, text: string): string[] {
  if (!isProduction(file)) return [];
  const lines = text.split('\n');
  const out: string[] = [];
  lines.forEach((line, i) => {
    const code = line.replace(/^\s*(\/\/|\*|\/\*).*$/, '').replace(/\s\/\/.*$/, '');
    const m = /\bcatch\s*\((\w+)|\.catch\(\s*(?:async\s+)?(?:\(\s*(\w+)[^)]*\)|(\w+))\s*=>|\bcatch\s*[({]/.exec(code);
    if (m === null) return;
    // The comment may wrap over a few lines just above the catch.
    if ([0, 1, 2, 3].some((k) => (lines[i - k] ?? '').includes('catch-ok:'))) return;
    const v = m[1] ?? m[2] ?? m[3];
    if (v !== undefined) {
      const block = lines.slice(i, i + 1 + CATCH_WINDOW_LINES).join('\n');
      const rethrows = [
        new RegExp(`\\bthrow ${v};`),
        new RegExp(`\\b(rethrowIfAssertion|reject|toHandoffError)\\(${v}\\b`),
        /\bthrow new AssertionFailure\b/,
      ];
      if (rethrows.some((re) => re.test(block))) return;
    }
    out.push(`${file}:${i + 1}: ${line.trim()}`);
  });
  return out;
}

/** Longest function body we accept, in lines from its first line to its last (TigerBeetle's limit). */
const FUNCTION_LINES_MAX = 70;

/**
 * A test-suite kit is one function that registers a suite's tests (`test(...)` calls in a row) so that
 * every backend runs the same suite: splitting it would scatter one suite over helpers without making
 * any test clearer. Production code has no such excuse.
 */
function isSuiteKit(file: string): boolean {
  return /(^|\/)conformance[^/]*\.ts$|_testkit\.ts$/.test(file);
}

/**
 * Every function with a body — declarations, methods, constructors, accessors, arrow functions and
 * function expressions — longer than FUNCTION_LINES_MAX, as `file:line: name is N lines`.
 * Length = end line − start line + 1, the start being the function's own first line (after leading comments).
 */
export function longFunctions(file: string, text: string): string[] {
  if (!isProduction(file) || isSuiteKit(file)) return [];
  const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const lineOf = (pos: number): number => source.getLineAndCharacterOfPosition(pos).line + 1;
  const out: string[] = [];
  const visit = (node: ts.Node): void => {
    if (ts.isFunctionLike(node) && 'body' in node && node.body !== undefined) {
      const start = lineOf(node.getStart(source));
      const lines = lineOf(node.getEnd()) - start + 1;
      if (lines > FUNCTION_LINES_MAX) out.push(`${file}:${start}: ${functionName(node)} is ${lines} lines`);
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return out;
}

function functionName(node: ts.Node): string {
  const named = node as ts.Node & { name?: ts.Node };
  if (named.name !== undefined) return named.name.getText();
  if (ts.isConstructorDeclaration(node)) return 'constructor';
  const parent = node.parent;
  if (ts.isVariableDeclaration(parent) || ts.isPropertyAssignment(parent) || ts.isPropertyDeclaration(parent)) {
    return parent.name.getText();
  }
  return '(anonymous)';
}

test('tidy: the rule checkers themselves catch what they must (a checker that cannot fail proves nothing)', () => {
  assert.equal(determinismViolations('kv/x.ts', 'const t = Date.now();').length, 1);
  assert.equal(determinismViolations('kv/x.ts', '// Date.now() in a comment').length, 0);
  assert.equal(determinismViolations('util/env.ts', 'Date.now()').length, 0);
  assert.equal(determinismViolations('serve/x.ts', 'const w = new Worker(url);').length, 1);
  assert.equal(determinismViolations('serve/tokenizer_threads.ts', 'const w = new Worker(url);').length, 0);
  assert.equal(layerViolations('kv/x.ts', "import { a } from '../engine/scheduler.ts';").length, 1);
  assert.equal(layerViolations('engine/x.ts', "import { a } from '../kv/block_pool.ts';").length, 0);
  assert.deepEqual(catchViolations('serve/x.ts', 'try {\n  f();\n} catch (e) {\n  log(e);\n}'), [
    'serve/x.ts:3: } catch (e) {',
  ]);
  assert.equal(catchViolations('serve/x.ts', '} catch (e) {\n  rethrowIfAssertion(e);\n  log(e);').length, 0);
  assert.equal(catchViolations('serve/x.ts', '} catch (err) {\n  if (!isHandoffError(err)) throw err;').length, 0);
  assert.equal(
    catchViolations('serve/x.ts', '} catch (e) {\n  throw e instanceof HandoffError ? e : wrap(e);').length,
    1,
  );
  assert.equal(catchViolations('serve/x.ts', '} catch {\n  throw e;').length, 1);
  assert.equal(catchViolations('serve/x.ts', 'p.catch(() => undefined);').length, 1);
  assert.equal(catchViolations('serve/x.ts', 'p.catch((e: unknown) => rethrowIfAssertion(e));').length, 0);
  assert.equal(
    catchViolations('serve/x.ts', 'p.catch(async (e: unknown) => {\n  await close();\n  throw e;\n});').length,
    0,
  );
  assert.equal(catchViolations('serve/x.ts', 'p.catch(onError);').length, 1);
  assert.equal(catchViolations('serve/x.ts', 'p.catch((e: unknown) => {\n  log(e);\n});').length, 1);
  assert.equal(catchViolations('serve/x.ts', '// catch-ok: the top-level handler\n} catch (e) {\n  log(e);').length, 0);
  assert.equal(catchViolations('serve/x.ts', '// a catch (e) in a comment is no catch').length, 0);
  assert.equal(catchViolations('serve/x.test.ts', '} catch (e) {\n  log(e);').length, 0);
  assert.equal(catchViolations('transfer/testing/conformance.ts', '} catch (e) {\n  log(e);').length, 0);
  const body = (n: number): string => Array.from({ length: n - 2 }, (_, i) => `  f(${i});`).join('\n');
  assert.deepEqual(longFunctions('kv/x.ts', `// c\nfunction big() {\n${body(71)}\n}`), ['kv/x.ts:2: big is 71 lines']);
  assert.equal(longFunctions('kv/x.ts', `function ok() {\n${body(70)}\n}`).length, 0);
  assert.deepEqual(longFunctions('kv/x.ts', `const g = () => {\n${body(71)}\n};`), ['kv/x.ts:1: g is 71 lines']);
  assert.deepEqual(longFunctions('kv/x.ts', `class C {\n  m() {\n${body(71)}\n  }\n}`), ['kv/x.ts:2: m is 71 lines']);
  assert.deepEqual(longFunctions('kv/x.ts', `class C {\n  constructor() {\n${body(71)}\n  }\n}`), [
    'kv/x.ts:2: constructor is 71 lines',
  ]);
  assert.deepEqual(longFunctions('kv/x.ts', `class C {\n  get v() {\n${body(71)}\n  }\n}`), [
    'kv/x.ts:2: v is 71 lines',
  ]);
  assert.deepEqual(longFunctions('kv/x.ts', `run(function () {\n${body(71)}\n});`), [
    'kv/x.ts:1: (anonymous) is 71 lines',
  ]);
  assert.equal(longFunctions('kv/x.ts', `interface I {\n${body(80)}\n}`).length, 0);
  assert.equal(longFunctions('kv/x.test.ts', `function big() {\n${body(71)}\n}`).length, 0);
  assert.equal(longFunctions('device/conformance_race.ts', `function big() {\n${body(71)}\n}`).length, 0);
  assert.equal(longFunctions('engine/scheduler_testkit.ts', `function big() {\n${body(71)}\n}`).length, 0);
});

test('tidy: no clock, timer, thread or Math.random outside env.ts and the real backends', () => {
  const bad = sources.flatMap((f) => determinismViolations(f, readFileSync(join(SRC, f), 'utf8')));
  assert.deepEqual(bad, []);
});

test('tidy: imports go down the layers of DESIGN.md §2 only', () => {
  const bad = files.flatMap((f) => layerViolations(f, readFileSync(join(SRC, f), 'utf8')));
  assert.deepEqual(bad, []);
});

test('tidy: no production catch swallows an AssertionFailure (re-throw it, or say why in // catch-ok:)', () => {
  const bad = sources.flatMap((f) => catchViolations(f, readFileSync(join(SRC, f), 'utf8')));
  assert.deepEqual(bad, [], `catches that may swallow an AssertionFailure:\n${bad.join('\n')}`);
});

test('tidy: no source file over 500 lines', () => {
  const long = files
    .map((f) => ({ f, n: readFileSync(join(SRC, f), 'utf8').split('\n').length }))
    .filter(({ n }) => n > 500)
    .map(({ f, n }) => `${f}: ${n} lines`);
  assert.deepEqual(long, []);
});

test(`tidy: no production function over ${FUNCTION_LINES_MAX} lines`, () => {
  const bad = sources.flatMap((f) => longFunctions(f, readFileSync(join(SRC, f), 'utf8')));
  assert.deepEqual(
    bad,
    [],
    `functions over ${FUNCTION_LINES_MAX} lines (split them into named helpers):\n${bad.join('\n')}`,
  );
});

/**
 * Lines over LINE_COLUMNS_MAX columns that the formatter could have broken. A line is excused when it
 * fits once its string, template and regex literals are counted as empty: prettier never splits a
 * literal, and keeps a long test name on the line of its `test(` call.
 */
export function longLines(file: string, text: string): string[] {
  const sf = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const literals: Array<[number, number]> = [];
  const visit = (n: ts.Node): void => {
    const literal =
      ts.isStringLiteral(n) ||
      ts.isNoSubstitutionTemplateLiteral(n) ||
      ts.isTemplateExpression(n) ||
      ts.isRegularExpressionLiteral(n);
    if (literal) literals.push([n.getStart(sf), n.getEnd()]);
    else ts.forEachChild(n, visit);
  };
  visit(sf);
  const out: string[] = [];
  let pos = 0;
  text.split('\n').forEach((line, i) => {
    const [start, end] = [pos, pos + line.length];
    pos = end + 1;
    if (line.length <= LINE_COLUMNS_MAX) return;
    const inLiterals = literals.reduce((n, [a, b]) => n + Math.max(0, Math.min(b, end) - Math.max(a, start)), 0);
    if (line.length - inLiterals > LINE_COLUMNS_MAX) out.push(`${file}:${i + 1}: ${line.length} columns`);
  });
  return out;
}
const LINE_COLUMNS_MAX = 120;

test(`tidy: no line over ${LINE_COLUMNS_MAX} columns that the formatter could break`, () => {
  assert.deepEqual(
    longLines('x.ts', `const a = 1;\nconst s = '${'x'.repeat(130)}';\n`),
    [],
    'a long string is excused',
  );
  assert.equal(longLines('x.ts', `// ${'x'.repeat(130)}\n`).length, 1, 'a long comment is not');
  assert.equal(longLines('x.ts', `f(${'a, '.repeat(50)}b);\n`).length, 1, 'long code is not');
  const bad = files.flatMap((f) => longLines(f, readFileSync(join(SRC, f), 'utf8')));
  assert.deepEqual(bad, []);
});

test('tidy: every folder of src/ is a known layer', () => {
  const unknown = [
    ...new Set(
      files
        .map((f) => f.split('/'))
        .filter((p) => p.length > 1)
        .map((p) => p[0]),
    ),
  ].filter((d) => !LAYERS.includes(d ?? ''));
  assert.deepEqual(unknown, []);
});
