/** Flag values → typed options, with errors that name the flag (BAD_CONFIG). */
import { accessSync, constants, mkdirSync, statSync } from 'node:fs';
import { basename, dirname } from 'node:path';
import { HandoffError } from '../util/errors.ts';
import { LOG_FORMATS, type LogFormat } from '../util/log.ts';
import {
  checkTensorParallelSize,
  isBlockSize,
  isMicroPreset,
  isModelPreset,
  isServingPreset,
  MODEL_PRESETS,
  presetKVGroups,
  SERVING_PRESETS,
  type ModelPreset,
  type ServingPreset,
} from '../kv/presets.ts';
import { hasMambaLayers } from '../kv/spec.ts';
import { MICRO_VOCAB_SIZE } from '../model/config.ts';

/** A plain decimal integer ('12', ' 12 ', '-3'); null for anything else ('', '1e3', '0x10', '-0', '1.5', 'abc'). */
export function decimalInt(v: unknown): number | null {
  if (typeof v === 'number') return Number.isInteger(v) && !Object.is(v, -0) ? v : null;
  const s = String(v).trim();
  return /^(0|-?[1-9][0-9]*)$/.test(s) ? Number(s) : null;
}

export function intFlag(name: string, v: unknown, min: number, max: number): number {
  const n = decimalInt(v);
  if (n === null || !Number.isSafeInteger(n) || n < min || n > max) {
    throw new HandoffError('BAD_CONFIG', `--${name} must be an integer in [${min}, ${max}], got '${String(v)}'`);
  }
  return n;
}

export function numberFlag(name: string, v: unknown, min: number, max: number): number {
  const n = Number(String(v).trim());
  if (String(v).trim() === '' || !Number.isFinite(n) || n < min || n > max) {
    throw new HandoffError('BAD_CONFIG', `--${name} must be a number in [${min}, ${max}], got '${String(v)}'`);
  }
  return n;
}

export function optionalInt(name: string, v: unknown, min: number, max: number): number | undefined {
  return v === undefined ? undefined : intFlag(name, v, min, max);
}

export function choiceFlag<T extends string>(name: string, v: unknown, choices: readonly T[]): T {
  const s = String(v);
  if (!(choices as readonly string[]).includes(s))
    throw new HandoffError('BAD_CONFIG', `--${name} must be one of ${choices.join(', ')}; got '${s}'`);
  return s as T;
}

/** A preset that can serve text (serve, up, bench serve, soak, ab): the GPT-2 tokenizer's vocabulary. */
export function presetFlag(v: unknown): ServingPreset {
  const s = String(v);
  if (isMicroPreset(s))
    throw new HandoffError(
      'BAD_CONFIG',
      `--model ${s} is a simulator preset (a ${MICRO_VOCAB_SIZE}-token vocabulary, no tokenizer); serving and the A/B take ${SERVING_PRESETS.join(', ')}`,
    );
  if (!isServingPreset(s))
    throw new HandoffError('BAD_CONFIG', `--model must be one of ${SERVING_PRESETS.join(', ')}; got '${s}'`);
  return s;
}

/** `--block-size` (`--prefill-block-size`, `--decode-block-size`): tokens per KV page, a power of two in [1, 256]. */
export function blockSizeFlag(v: unknown, flag = 'block-size'): number {
  const n = decimalInt(v);
  if (!isBlockSize(n))
    throw new HandoffError('BAD_CONFIG', `--${flag} must be a power of two in [1, 256]; got '${String(v)}'`);
  return n;
}

/** `--tensor-parallel-size` (or `flag`): ranks of an instance, dividing the preset's KV heads and shards. */
export function tensorParallelFlag(preset: ModelPreset, v: unknown, flag = 'tensor-parallel-size'): number {
  return checkTensorParallelSize(preset, v ?? 1, flag);
}

/**
 * The TP degrees of a P/D pair: `--tensor-parallel-size` for both, `--prefill-tp` / `--decode-tp` for one.
 * They may differ: each decode rank gathers its heads from the prefill ranks' pages (kv/tp_map.ts).
 */
export function pdTensorParallelFlags(
  preset: ModelPreset,
  o: Record<string, unknown>,
): { prefill: number; decode: number } {
  const both = tensorParallelFlag(preset, o['tensorParallelSize']);
  const prefill = o['prefillTp'] === undefined ? both : tensorParallelFlag(preset, o['prefillTp'], 'prefill-tp');
  const decode = o['decodeTp'] === undefined ? both : tensorParallelFlag(preset, o['decodeTp'], 'decode-tp');
  return { prefill, decode };
}

/**
 * `--mode read|write` of a P/D deployment: WRITE with a Mamba model is refused here, naming the flag,
 * before any instance starts (the connector refuses it too, but only inside each child).
 */
export function modeFlag(preset: ModelPreset, v: unknown): 'read' | 'write' {
  const mode = choiceFlag('mode', v, ['read', 'write'] as const);
  if (mode === 'write' && hasMambaLayers(presetKVGroups(preset)))
    throw new HandoffError('BAD_CONFIG', `--mode write: ${preset} has Mamba layers, which support READ mode only`);
  return mode;
}

/** Any preset, micro ones included (sim, bench model, bench sched). */
export function anyPresetFlag(v: unknown): ModelPreset {
  const s = String(v);
  if (!isModelPreset(s))
    throw new HandoffError('BAD_CONFIG', `--model must be one of ${MODEL_PRESETS.join(', ')}; got '${s}'`);
  return s;
}

/**
 * An interface to listen on: an empty one ('', or an unset variable in `--host "$HOST"`) is refused; Node
 * took it as every interface (the HTTP port, and serve's KV side channel and data plane with it).
 */
export function hostFlag(name: string, v: unknown): string {
  const s = String(v ?? '').trim();
  if (s === '')
    throw new HandoffError('BAD_CONFIG', `--${name} must name an interface (e.g. 127.0.0.1, or 0.0.0.0 for all)`);
  return s;
}

export function portFlag(name: string, v: unknown): number {
  return intFlag(name, v, 0, 65535);
}

/** `MIN:MAX` or `N` (both ends inclusive). */
export function rangeFlag(name: string, v: unknown, min: number, max: number): [number, number] {
  const parts = String(v).split(':');
  if (parts.length > 2) throw new HandoffError('BAD_CONFIG', `--${name} must be N or MIN:MAX, got '${String(v)}'`);
  const lo = intFlag(name, parts[0], min, max);
  const hi = parts.length === 2 ? intFlag(name, parts[1], min, max) : lo;
  if (hi < lo) throw new HandoffError('BAD_CONFIG', `--${name}: MIN must not exceed MAX, got '${String(v)}'`);
  return [lo, hi];
}

/** A comma-separated list of http(s) URLs (trailing slashes dropped). */
export function urlListFlag(name: string, v: unknown): string[] {
  const urls = String(v ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
  if (urls.length === 0) throw new HandoffError('BAD_CONFIG', `--${name} needs at least one URL`);
  const origins = urls.map((u) => httpUrl(name, u).origin);
  const dup = origins.find((u, i) => origins.indexOf(u) !== i);
  if (dup !== undefined) throw new HandoffError('BAD_CONFIG', `--${name} lists ${dup} twice`);
  return origins;
}

/** One http(s) URL (`bench serve --url`), its path kept, trailing slashes dropped. */
export function urlFlag(name: string, v: unknown): string {
  const u = String(v ?? '').trim();
  httpUrl(name, u);
  return u.replace(/\/+$/, '');
}

function httpUrl(name: string, u: string): URL {
  let parsed: URL;
  try {
    parsed = new URL(u);
    // catch-ok: only new URL runs in the try: its TypeError means the flag is not a URL
  } catch {
    throw new HandoffError('BAD_CONFIG', `--${name}: '${u}' is not a URL`);
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:')
    throw new HandoffError('BAD_CONFIG', `--${name}: '${u}' is not an http(s) URL`);
  return parsed;
}

/**
 * The files an output flag (`trace --out`, `ab --trace`, `bench transfer --svg`) will write: each one's
 * directory is created and must be writable, and none may be a directory. Checked before the run, so a
 * bad path is one BAD_CONFIG line naming the flag, not a stack trace after the work is done.
 */
export function outputFilesFlag(name: string, files: readonly string[]): void {
  for (const file of files) {
    const dir = dirname(file) || '.';
    let isDir = false;
    try {
      mkdirSync(dir, { recursive: true });
      accessSync(dir, constants.W_OK);
      isDir = statSync(file, { throwIfNoEntry: false })?.isDirectory() ?? false;
      // catch-ok: only file system calls run in the try: their error means the path cannot be written
    } catch (e) {
      throw new HandoffError('BAD_CONFIG', `--${name}: cannot write '${file}': ${(e as Error).message}`);
    }
    if (isDir) throw new HandoffError('BAD_CONFIG', `--${name}: '${file}' is a directory`);
  }
}

/**
 * A trace base (`trace --out`, `ab --trace`): `<base>.json` and `<base>.html` are written, so it must end in
 * a file name. '', 'dir/' or '.' wrote hidden files ('dir/.json', '..json') that a listing does not show.
 */
export function traceBaseFlag(name: string, v: unknown): string {
  const base = String(v ?? '');
  const stem = base.replace(/\.(json|html)$/, '');
  if (stem === '' || /[\\/]$/.test(stem) || ['.', '..'].includes(basename(stem)))
    throw new HandoffError('BAD_CONFIG', `--${name} needs a file name (it writes <name>.json and <name>.html)`);
  return base;
}

/** `--log-format pretty|json`; absent = automatic (pretty on a terminal, json otherwise). */
export function logFormatFlag(v: unknown): LogFormat | null {
  return v === undefined ? null : choiceFlag('log-format', v, LOG_FORMATS);
}

export const LOG_FORMAT_HELP =
  'log lines on stderr: pretty | json (default: pretty on a terminal, json otherwise, or HANDOFF_LOG_FORMAT)';
