/**
 * The native scatter receive (native/scatter_read.c, built by `npm ci` through scripts/build_native.mjs):
 * readv(2) on a socket's descriptor into many slab segments in one call. null when the addon is not built
 * (or HANDOFF_NATIVE=off): the tcp NIC then receives as before, one read per segment or a copy.
 */
import { createRequire } from 'node:module';
import type net from 'node:net';

export interface ScatterNative {
  /** Bytes read into `count` (slab, offset, length) triples of `segs`, 0 when none could be read now. */
  scatterRead(fd: number, slabs: readonly Uint8Array[], segs: Float64Array, count: number): number;
}

/** Segments per call (the addon's bound; Linux's IOV_MAX is 1024). */
export const SCATTER_SEGS_MAX = 1024;

function load(): { native: ScatterNative | null; why: string } {
  if (process.env.HANDOFF_NATIVE === 'off') return { native: null, why: 'HANDOFF_NATIVE=off' };
  try {
    const req = createRequire(import.meta.url);
    return { native: req('../../../native/build/Release/handoff_native.node') as ScatterNative, why: 'built' };
    // catch-ok: only the require runs in the try; a missing or unloadable addon is a supported configuration
  } catch (e) {
    return { native: null, why: e instanceof Error ? (e.message.split('\n')[0] ?? '') : String(e) };
  }
}

let loaded: { native: ScatterNative | null; why: string } | null = null;

/**
 * The addon, or null (scatterNativeStatus says why). Loaded on first use, so only threads that receive
 * on tcp (the NIC threads) load it.
 */
export function scatterNative(): ScatterNative | null {
  loaded ??= load();
  return loaded.native;
}

export function scatterNativeStatus(): string {
  loaded ??= load();
  return loaded.why;
}

/** The descriptor of a connected socket on this platform, or -1 (no scatter receive on it). */
export function socketFd(socket: net.Socket): number {
  const handle = (socket as unknown as { _handle?: { fd?: unknown } })._handle;
  const fd = handle?.fd;
  return typeof fd === 'number' && Number.isInteger(fd) && fd >= 0 ? fd : -1;
}
