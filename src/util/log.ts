/**
 * Logger: pino, to stderr. HANDOFF_LOG_LEVEL sets the level (default info; tests set warn).
 *
 * Format: `pretty` (one human line per record: time, level, logger name, message, fields; an error's
 * stack below it) or `json` (pino's NDJSON, for log collectors). Chosen by `configureLogs` (the
 * `--log-format` flag of serve, proxy and up), else HANDOFF_LOG_FORMAT, else pretty when stderr is a
 * terminal and json when it is not. The pretty formatter is ours (a few lines, synchronous, so a line
 * written just before process.exit is not lost); pino-pretty's current releases pull in a dependency
 * that needs Node 22.
 */
import { pino, type DestinationStream, type Logger } from 'pino';
import { HandoffError } from './errors.ts';

export type { Logger };

export const LOG_FORMATS = ['pretty', 'json'] as const;
export type LogFormat = (typeof LOG_FORMATS)[number];

let configured: LogFormat | null = null;

/** Set the format of every logger created from now on (the CLI calls this from --log-format). */
export function configureLogs(o: { format: LogFormat | null }): void {
  configured = o.format;
}

/** Explicit choice first, then HANDOFF_LOG_FORMAT, then pretty on a terminal and json elsewhere. */
export function resolveLogFormat(
  explicit: LogFormat | null,
  envValue: string | undefined,
  stderrIsTTY: boolean,
): LogFormat {
  if (explicit !== null) return explicit;
  if (envValue === 'pretty' || envValue === 'json') return envValue;
  return stderrIsTTY ? 'pretty' : 'json';
}

/** The format loggers use now in this process. */
export function currentLogFormat(): LogFormat {
  return resolveLogFormat(configured, process.env['HANDOFF_LOG_FORMAT'], process.stderr.isTTY === true);
}

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

/** The level asked for (an argument, else HANDOFF_LOG_LEVEL; empty means unset), or BAD_CONFIG naming it. */
export function logLevelOf(level: string | undefined, envValue: string | undefined, inTest: boolean): string {
  const asked = level ?? (envValue === undefined || envValue.trim() === '' ? undefined : envValue.trim());
  if (asked === undefined) return inTest ? 'warn' : 'info';
  if (!LOG_LEVELS.includes(asked))
    throw new HandoffError('BAD_CONFIG', `HANDOFF_LOG_LEVEL must be one of ${LOG_LEVELS.join(', ')}; got '${asked}'`);
  return asked;
}

export function createLogger(name: string, level?: string): Logger {
  const lvl = logLevelOf(level, process.env['HANDOFF_LOG_LEVEL'], process.env['NODE_TEST_CONTEXT'] !== undefined);
  const fd = pino.destination(2);
  const dest: DestinationStream =
    currentLogFormat() === 'json'
      ? fd
      : prettyStream(fd, { color: process.stderr.isTTY === true && process.env['NO_COLOR'] === undefined });
  return pino({ name, level: lvl, base: { name } }, dest);
}

/** A destination that turns each pino JSON line into a pretty line before writing it to `out`. */
export function prettyStream(out: { write(s: string): unknown }, opts: { color: boolean }): DestinationStream {
  return { write: (line: string) => void out.write(prettyLine(line, opts)) };
}

const LEVELS: Record<number, { label: string; color: string }> = {
  10: { label: 'TRACE', color: '90' },
  20: { label: 'DEBUG', color: '36' },
  30: { label: 'INFO', color: '32' },
  40: { label: 'WARN', color: '33' },
  50: { label: 'ERROR', color: '31' },
  60: { label: 'FATAL', color: '35' },
};
const OMIT = new Set(['level', 'time', 'name', 'msg', 'pid', 'hostname', 'err']);
const VALUE_CHARS_MAX = 400;

/** `HH:MM:SS.mmm LEVEL name: msg key=value ...`, then an error's stack, indented. Not JSON: passed through. */
export function prettyLine(line: string, opts: { color: boolean }): string {
  let rec: Record<string, unknown>;
  try {
    rec = JSON.parse(line) as Record<string, unknown>;
    // catch-ok: only JSON.parse runs in the try: a line that is not JSON is printed as it is
  } catch {
    return line.endsWith('\n') ? line : `${line}\n`;
  }
  const lvl = LEVELS[Number(rec['level'])] ?? { label: String(rec['level']), color: '0' };
  const paint = (code: string, s: string): string => (opts.color ? `\x1b[${code}m${s}\x1b[0m` : s);
  const time = typeof rec['time'] === 'number' ? clockTime(new Date(rec['time'])) : '';
  const fields = Object.entries(rec)
    .filter(([k]) => !OMIT.has(k))
    .map(([k, v]) => `${k}=${fieldValue(v)}`);
  const head = [
    time,
    paint(lvl.color, lvl.label.padEnd(5)),
    `${String(rec['name'] ?? '')}:`,
    String(rec['msg'] ?? ''),
    ...fields,
  ]
    .filter((s) => s !== '')
    .join(' ');
  const err = rec['err'] as { stack?: unknown; message?: unknown } | undefined;
  const detail =
    err === undefined
      ? ''
      : `\n    ${String(err.stack ?? err.message ?? JSON.stringify(err))
          .split('\n')
          .join('\n    ')}`;
  return `${head}${detail}\n`;
}

/** Local wall-clock `HH:MM:SS.mmm`. */
function clockTime(d: Date): string {
  const two = (n: number): string => String(n).padStart(2, '0');
  return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}.${String(d.getMilliseconds()).padStart(3, '0')}`;
}

function fieldValue(v: unknown): string {
  const s = typeof v === 'string' ? (/^[^\s"=]+$/.test(v) ? v : JSON.stringify(v)) : (JSON.stringify(v) ?? String(v));
  return s.length > VALUE_CHARS_MAX ? `${s.slice(0, VALUE_CHARS_MAX)}…` : s;
}
