/**
 * Which instances can pair with the other pool: a prefill and a decode whose /handoff/info compat_hash
 * differ (other model, preset, weight seed or cache layout) refuse each other's transfer handshake, so
 * every request routed over such a pair fails. An instance with a known hash that no candidate of the
 * other pool shares is kept out of routing; an unknown hash (a vLLM-like server, no connector) is never
 * judged, nor is anything while the other pool has no candidate.
 */
import type { InstancePool, PoolMember } from './instance_pool.ts';
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

/** Whether two instances of opposite sides can pair as far as their infos tell (an unknown hash is never judged). */
export function canPair(a: InstanceInfo | null, b: InstanceInfo | null): boolean {
  const [x, y] = [hashOf(a), hashOf(b)];
  return x === null || y === null || x === y;
}

/**
 * `exclude` plus the members of `pool` that cannot pair with `chosen` (of the other side). Pairing per
 * instance (unpairedReason) keeps in any instance some other one pairs with; per request, a prefill was
 * still chosen without looking at the chosen decode, and a mixed deployment (a rolling change of weights)
 * routed requests to pairs whose handshake refuses: 409 PEER_INCOMPATIBLE while a compatible pair was up.
 */
export function pairedOnly(
  pool: InstancePool,
  chosen: PoolMember,
  exclude: ReadonlySet<PoolMember>,
): ReadonlySet<PoolMember> {
  const unpaired = pool.members.filter((m) => !canPair(m.info, chosen.info));
  return unpaired.length === 0 ? exclude : new Set([...exclude, ...unpaired]);
}

/**
 * `exclude` plus the decodes no healthy prefill (outside `exclude`) can pair with, when some prefill is up:
 * such a decode can serve only a request that fails, until the next health check takes it out.
 */
export function withoutLoneDecodes(
  pools: { prefill: InstancePool; decode: InstancePool },
  exclude: ReadonlySet<PoolMember>,
): ReadonlySet<PoolMember> {
  const prefills = pools.prefill.members.filter((p) => p.healthy && !exclude.has(p));
  if (prefills.length === 0) return exclude;
  const lone = pools.decode.members.filter((d) => !prefills.some((p) => canPair(p.info, d.info)));
  return lone.length === 0 ? exclude : new Set([...exclude, ...lone]);
}
