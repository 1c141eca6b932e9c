/**
 * Log format (issue 11 item 14): pretty lines for people (time, level, name, message, fields, an
 * error's stack), pino JSON for collectors; `--log-format` wins, then HANDOFF_LOG_FORMAT, then pretty
 * on a terminal and JSON elsewhere (the flag itself and up's hand-over: src/cli/flags.test.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { HandoffError } from './errors.ts';
import { spawnSync } from 'node:child_process';
import { pino } from 'pino';
import { prettyLine, prettyStream, resolveLogFormat, logLevelOf } from './log.ts';

const LOG_URL = new URL('./log.ts', import.meta.url).href;

/** What `createLogger('probe').warn(...)` writes to stderr in a fresh process (stderr is a pipe, not a terminal). */
function stderrOfChild(env: Record<string, string>): string {
  const script = `
    import { createLogger } from ${JSON.stringify(LOG_URL)};
    const log = createLogger('probe');
    log.warn({ peer: 'p-1' }, 'side channel silent');
    log.error({ err: new Error('boom') }, 'handler threw');
  `;
  const childEnv: NodeJS.ProcessEnv = { ...process.env, HANDOFF_LOG_LEVEL: 'info' };
  delete childEnv['NODE_TEST_CONTEXT'];
  delete childEnv['HANDOFF_LOG_FORMAT'];
  Object.assign(childEnv, env);
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
    encoding: 'utf8',
    env: childEnv,
    timeout: 30_000,
  });
  assert.equal(r.status, 0, r.stderr);
  return r.stderr;
}

test('selection: explicit flag, then HANDOFF_LOG_FORMAT, then pretty on a terminal and json elsewhere', () => {
  assert.equal(resolveLogFormat('json', 'pretty', true), 'json');
  assert.equal(resolveLogFormat('pretty', 'json', false), 'pretty');
  assert.equal(resolveLogFormat(null, 'json', true), 'json');
  assert.equal(resolveLogFormat(null, 'pretty', false), 'pretty');
  assert.equal(resolveLogFormat(null, undefined, true), 'pretty');
  assert.equal(resolveLogFormat(null, undefined, false), 'json');
  assert.equal(
    resolveLogFormat(null, 'bogus', false),
    'json',
    'an unknown env value falls back to the automatic choice',
  );
});

test('pretty line: level, name, message and fields, no JSON; an error prints its stack below', () => {
  const line = prettyLine(
    JSON.stringify({
      level: 40,
      time: Date.UTC(2025, 0, 1, 12, 3, 4, 5),
      name: 'serve-decode',
      msg: 'side channel silent',
      peer: 'prefill-ab',
      n: 3,
      note: 'two words',
    }),
    { color: false },
  );
  assert.match(
    line,
    /^\d\d:\d\d:\d\d\.\d{3} WARN  serve-decode: side channel silent peer=prefill-ab n=3 note="two words"\n$/,
  );
  assert.ok(!line.includes('{"level"'));
  const err = new Error('boom');
  const withErr = prettyLine(
    JSON.stringify({
      level: 50,
      time: 0,
      name: 'x',
      msg: 'failed',
      err: { type: 'Error', message: 'boom', stack: err.stack },
    }),
    { color: false },
  );
  assert.match(withErr, /ERROR x: failed\n {4}Error: boom\n {8}at /);
  assert.equal(prettyLine('not json', { color: false }), 'not json\n', 'a non-JSON line passes through');
  assert.match(
    prettyLine(JSON.stringify({ level: 30, time: 0, name: 'x', msg: 'hi' }), { color: true }),
    /\x1b\[32mINFO \x1b\[0m x: hi/,
  );
});

test('a pino logger through the pretty stream writes readable lines', () => {
  const lines: string[] = [];
  const log = pino(
    { name: 'proxy', base: { name: 'proxy' } },
    prettyStream({ write: (s) => lines.push(s) }, { color: false }),
  );
  log.info({ url: 'http://127.0.0.1:8000' }, 'listening');
  assert.equal(lines.length, 1);
  assert.match(lines[0] as string, /INFO  proxy: listening url=http:\/\/127\.0\.0\.1:8000\n$/);
});

test('createLogger: HANDOFF_LOG_FORMAT=pretty gives readable lines; stderr that is not a terminal gets parseable JSON', () => {
  const pretty = stderrOfChild({ HANDOFF_LOG_FORMAT: 'pretty' });
  assert.ok(!pretty.includes('{"level"'), `no raw JSON: ${pretty}`);
  assert.match(pretty, /WARN  probe: side channel silent peer=p-1/);
  assert.match(pretty, /ERROR probe: handler threw\n    Error: boom/);
  const json = stderrOfChild({});
  const records = json
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { level: number; msg: string; name: string });
  assert.deepEqual(
    records.map((r) => [r.level, r.name, r.msg]),
    [
      [40, 'probe', 'side channel silent'],
      [50, 'probe', 'handler threw'],
    ],
  );
});

test('log level: an argument, else HANDOFF_LOG_LEVEL (empty is unset), else info (warn under the test runner); anything else is BAD_CONFIG naming it', () => {
  assert.equal(logLevelOf(undefined, undefined, false), 'info');
  assert.equal(logLevelOf(undefined, '', false), 'info');
  assert.equal(logLevelOf(undefined, '  ', true), 'warn');
  assert.equal(logLevelOf(undefined, 'debug', false), 'debug');
  assert.equal(logLevelOf('error', 'debug', false), 'error');
  assert.throws(
    () => logLevelOf(undefined, 'verbose', false),
    (e: unknown) =>
      e instanceof HandoffError && e.code === 'BAD_CONFIG' && /HANDOFF_LOG_LEVEL.*'verbose'/.test(e.message),
  );
});
