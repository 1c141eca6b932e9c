/**
 * Where the proxy sends a request: a decode with a prefill it can pair with (pool_pairing.ts), by the KV-aware
 * router when it is on and knows the prompt, else by the pools' own policy; never both legs on one instance
 * (legsApart). A retry's route excludes the instances that failed, every pool entry of them (membersOf).
 */
import { rethrowIfAssertion } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import type { InstancePool, PoolMember, RoutingPolicy } from './instance_pool.ts';
import { legsApart, sameInstance, type KvRouter, type RouteDecision } from './kv_router.ts';
import { pairedOnly, withoutLoneDecodes } from './pool_pairing.ts';

export interface ProxyPools {
  prefill: InstancePool;
  decode: InstancePool;
}

/** A healthy member of `pool` outside `exclude`, or PEER_UNAVAILABLE. */
export function pickMember(pool: InstancePool, exclude: ReadonlySet<PoolMember> = new Set()): PoolMember {
  const m = pool.pick(exclude);
  if (!m) throw new HandoffError('PEER_UNAVAILABLE', `no healthy ${pool.side} instance`);
  return m;
}

/** Decode and prefill for this request (prefill null: decode computes the prompt itself). */
export function routeOf(
  pools: ProxyPools,
  router: { policy: RoutingPolicy; kv: KvRouter },
  tokenIds: number[] | null,
  exclude: ReadonlySet<PoolMember>,
): RouteDecision {
  // Only pairs whose handshake can succeed (pool_pairing.ts): a decode with a prefill it pairs with, and that prefill.
  exclude = withoutLoneDecodes(pools, exclude);
  if (router.policy === 'kv-aware' && tokenIds !== null) {
    const r = router.kv.route(pools, tokenIds, exclude);
    if (r !== null) return legsApart(r, pools.prefill, exclude);
  }
  const decode = pickMember(pools.decode, exclude);
  const prefill = pickMember(pools.prefill, pairedOnly(pools.prefill, decode, exclude));
  return legsApart({ decode, prefill, decodeHitTokens: 0, prefillHitTokens: 0 }, pools.prefill, exclude);
}

/** The route of a retry; `first` (the failed attempt's error) when no other instance can take it. */
export function retryRouteOr(
  pools: ProxyPools,
  router: { policy: RoutingPolicy; kv: KvRouter },
  tokenIds: number[] | null,
  exclude: ReadonlySet<PoolMember>,
  first: unknown,
): RouteDecision {
  try {
    return routeOf(pools, router, tokenIds, exclude);
  } catch (e) {
    rethrowIfAssertion(e);
    throw first;
  }
}

/** `m` and every member of either pool that is the same instance (kv_router.ts sameInstance). */
export function membersOf(pools: ProxyPools, m: PoolMember): Array<{ pool: InstancePool; m: PoolMember }> {
  return [pools.prefill, pools.decode].flatMap((pool) =>
    pool.members.filter((o) => sameInstance(o, m)).map((o) => ({ pool, m: o })),
  );
}
