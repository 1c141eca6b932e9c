/**
 * Validation failures in the user's terms: which request field is wrong (`param`, OpenAI's
 * `error.param`: `max_tokens`, `messages[0].content`, `kv_transfer_params.remote_port`) and what is
 * wrong with it ("max_tokens must be at least 1, got 0"; "stop has 17 entries; at most 16"), never
 * zod's bare "Invalid input". Only the first issue is described: one clear sentence beats a list.
 */
import type { z } from 'zod';

export interface FieldProblem {
  /** The offending field, or null when the body as a whole is wrong. */
  param: string | null;
  message: string;
}

type Issue = z.core.$ZodIssue;

/** ['messages', 0, 'content'] → 'messages[0].content'; [] → null. */
export function paramOf(path: readonly PropertyKey[]): string | null {
  let out = '';
  for (const k of path) out += typeof k === 'number' ? `[${k}]` : `${out === '' ? '' : '.'}${String(k)}`;
  return out === '' ? null : out;
}

/** A short, safe rendering of a client's value for a message. */
export function preview(v: unknown): string {
  if (v === undefined) return 'nothing';
  if (v === null) return 'null';
  if (typeof v === 'string')
    return v.length > 40 ? `${JSON.stringify(v.slice(0, 40))}… (${v.length} characters)` : JSON.stringify(v);
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  if (Array.isArray(v)) return `a list of ${v.length} entries`;
  if (typeof v === 'object') return 'an object';
  return typeof v;
}

const ZOD_DEFAULT = /^(Invalid|Too (big|small)|Unrecognized)\b/;

const EXPECTED: Record<string, string> = {
  int: 'an integer',
  number: 'a number',
  string: 'a string',
  boolean: 'true or false',
  array: 'a list',
  tuple: 'a list',
  object: 'an object',
  record: 'an object',
  null: 'null',
};

/** The first issue of `error` (from parsing `input`, which sits at `prefix` in the request body). */
export function describeZodError(error: z.ZodError, input: unknown, prefix: readonly PropertyKey[] = []): FieldProblem {
  const issue = error.issues[0];
  if (issue === undefined)
    return { param: paramOf(prefix), message: `${paramOf(prefix) ?? 'the request body'} is not valid` };
  return describeIssue(issue, [], input, prefix);
}

function describeIssue(
  issue: Issue,
  base: readonly PropertyKey[],
  input: unknown,
  prefix: readonly PropertyKey[],
): FieldProblem {
  const path = [...base, ...issue.path];
  const param = paramOf([...prefix, ...path]);
  const name = param ?? 'the request body';
  const value = valueAt(input, path);
  const say = (message: string): FieldProblem => ({ param, message });
  // A schema's own message ("must be a string or a list of strings", "top alternatives are not
  // computed ...") wins over ours; zod's defaults ("Invalid input: ...", "Too big: ...") do not.
  const own = ZOD_DEFAULT.test(issue.message) ? null : issue.message;
  const withOwn = (m: string): FieldProblem => say(/^(must|is|has|are) /.test(m) ? `${name} ${m}` : `${name}: ${m}`);
  if (own !== null && issue.code !== 'invalid_union') return withOwn(own);
  switch (issue.code) {
    case 'invalid_union': {
      // Branches whose very type did not match say nothing; if exactly one branch got further, its
      // first issue is the real problem (e.g. a stop list with an empty string in it).
      const closer = issue.errors.filter((b) => !b.some((i) => i.path.length === 0 && i.code === 'invalid_type'));
      const only = closer.length === 1 ? closer[0]?.[0] : undefined;
      if (only !== undefined) return describeIssue(only, path, input, prefix);
      if (value === undefined) return say(`${name} is required`);
      return own !== null
        ? withOwn(`${own}, got ${preview(value)}`)
        : say(`${name} has the wrong type or shape, got ${preview(value)}`);
    }
    case 'invalid_type':
      if (value === undefined) return say(`${name} is required`);
      return say(`${name} must be ${EXPECTED[issue.expected] ?? issue.expected}, got ${preview(value)}`);
    case 'too_big':
      return say(sizeMessage(name, issue.origin, value, issue.maximum, issue.inclusive !== false, 'max'));
    case 'too_small':
      return say(sizeMessage(name, issue.origin, value, issue.minimum, issue.inclusive !== false, 'min'));
    case 'invalid_value': {
      const allowed = issue.values.map((v) => JSON.stringify(v));
      return say(
        `${name} must be ${allowed.length === 1 ? allowed[0] : `one of ${allowed.join(', ')}`}, got ${preview(value)}`,
      );
    }
    case 'unrecognized_keys':
      return say(`${name} has unknown fields: ${issue.keys.join(', ')}`);
    default:
      return say(`${name}: ${issue.message}`);
  }
}

function sizeMessage(
  name: string,
  origin: string,
  value: unknown,
  bound: number | bigint,
  inclusive: boolean,
  side: 'min' | 'max',
): string {
  if (origin === 'array' || origin === 'set' || origin === 'string') {
    const unit = origin === 'string' ? 'characters' : 'entries';
    const n = typeof value === 'string' || Array.isArray(value) ? value.length : '?';
    if (side === 'min' && Number(bound) === 1) return `${name} must not be empty`;
    return `${name} has ${n} ${unit}; at ${side === 'max' ? 'most' : 'least'} ${String(bound)}`;
  }
  const rel = side === 'max' ? (inclusive ? 'at most' : 'less than') : inclusive ? 'at least' : 'greater than';
  return `${name} must be ${rel} ${String(bound)}, got ${preview(value)}`;
}

function valueAt(input: unknown, path: readonly PropertyKey[]): unknown {
  let v = input;
  for (const k of path) {
    if (v === null || typeof v !== 'object') return undefined;
    v = (v as Record<PropertyKey, unknown>)[k];
  }
  return v;
}
