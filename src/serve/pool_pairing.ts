/**
 * Which instances can pair with the other pool: a prefill and a decode whose /handoff/info compat_hash
 * differ (other model, preset, weight seed or cache layout) refuse each other's transfer handshake, so
 * every request routed over such a pair fails. An instance with a known hash that no candidate of the
 * other pool shares is kept out of routing; an unknown hash (a vLLM-like server, no connector) is never
 * judged, nor is anything while the other pool has no candidate.
 */
import type { InstanceInfo } from './instance_server.ts';

/** One instance that passed its own health check (or is still in), as the pairing sees it. */
export interface PairingCandidate {
  side: 'prefill' | 'decode';
  info: InstanceInfo | null;
}

function hashOf(info: InstanceInfo | null): string | null {
  return info?.compat_hash ?? null;
}

/** Why `c` cannot pair with any candidate of the other side, or null. */
export function unpairedReason(c: PairingCandidate, all: readonly PairingCandidate[]): string | null {
  const mine = hashOf(c.info);
  if (mine === null) return null;
  const others = all.filter((o) => o.side !== c.side);
  if (others.length === 0 || others.some((o) => hashOf(o.info) === null || hashOf(o.info) === mine)) return null;
  const other = c.side === 'prefill' ? 'decode' : 'prefill';
  const seen = [...new Set(others.map((o) => `${o.info?.preset ?? '?'} ${hashOf(o.info)?.slice(0, 12) ?? '?'}`))];
  return (
    `it cannot pair with any ${other} instance: its KV compatibility hash (model ${c.info?.preset ?? '?'}, ` +
    `${mine.slice(0, 12)}) differs from theirs (${seen.join(', ')}): other model, preset, --seed or cache layout`
  );
}
