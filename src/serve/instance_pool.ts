/**
 * InstancePool: the prefill (or decode) instances behind the proxy, their health and their load.
 * `pick()` returns a healthy member: round robin, or least loaded (fewest requests in flight through
 * this proxy, ties broken in round-robin order). Unhealthy members are skipped until a health check
 * (or a successful request) brings them back. `kv-aware` is KvRouter's (kv_router.ts); where no prompt
 * is known (e.g. /v1/models) the pool picks least loaded for it.
 */
import { assert } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import type { InstanceInfo } from './instance_server.ts';
import type { InstanceLoad } from './kv_event_stream.ts';

export type RoutingPolicy = 'round-robin' | 'least-loaded' | 'kv-aware';
export const ROUTING_POLICIES: readonly RoutingPolicy[] = ['round-robin', 'least-loaded', 'kv-aware'];

export interface PoolMember {
  readonly url: string;
  healthy: boolean;
  inflight: number;
  /** GET /handoff/info, once known (WRITE mode needs the side channel of prefill). */
  info: InstanceInfo | null;
  lastError: string | null;
  /** Requests sent to it (for tests and /metrics). */
  served: number;
  /** Its last reported load (KV event heartbeats; kv-aware only), null until one arrived. */
  load: InstanceLoad | null;
}

/** A failed call or health check saying the instance cannot be reached: refused or reset, or silent. */
export function isUnreachable(e: unknown): boolean {
  return e instanceof HandoffError && (e.code === 'PEER_UNAVAILABLE' || e.code === 'TIMEOUT');
}

export class InstancePool {
  readonly members: PoolMember[];
  private next = 0;
  /** Per member: aborted when it is taken out as unreachable, so calls still waiting on it fail over. */
  private readonly unreachable = new Map<PoolMember, AbortController>();

  constructor(
    readonly side: 'prefill' | 'decode',
    urls: readonly string[],
    readonly policy: RoutingPolicy,
  ) {
    assert(urls.length > 0, `the ${side} pool needs at least one instance`);
    assert(new Set(urls).size === urls.length, `duplicate ${side} instance URLs`);
    this.members = urls.map((url) => ({
      url,
      healthy: false,
      inflight: 0,
      info: null,
      lastError: null,
      served: 0,
      load: null,
    }));
  }

  get numHealthy(): number {
    return this.members.filter((m) => m.healthy).length;
  }

  /** A healthy member (not in `exclude`) by the policy, or null when none is. Does not acquire it. */
  pick(exclude: ReadonlySet<PoolMember> = new Set()): PoolMember | null {
    const n = this.members.length;
    let best: { m: PoolMember; i: number } | null = null;
    for (let k = 0; k < n; k++) {
      const i = (this.next + k) % n;
      const m = this.members[i] as PoolMember;
      if (!m.healthy || exclude.has(m)) continue;
      if (this.policy === 'round-robin') {
        best = { m, i };
        break;
      }
      if (best === null || m.inflight < best.m.inflight) best = { m, i };
    }
    if (best === null) return null;
    this.next = (best.i + 1) % n;
    return best.m;
  }

  acquire(m: PoolMember): void {
    m.inflight++;
    m.served++;
  }

  /**
   * Count `m` as loaded now by a request routed to it whose call starts later (READ: decode, once
   * prefill answered), so requests routed meanwhile see it busy. The returned function ends it (once).
   */
  reserve(m: PoolMember): () => void {
    m.inflight++;
    let held = true;
    return () => {
      if (held) this.release(m);
      held = false;
    };
  }

  release(m: PoolMember): void {
    assert(m.inflight > 0, `release of ${m.url} without acquire`);
    m.inflight--;
  }

  markUp(m: PoolMember, info?: InstanceInfo): void {
    m.healthy = true;
    m.lastError = null;
    if (info) m.info = info;
  }

  /** `unreachable` (refused, reset, or silent past its health checks): calls still waiting on it give up. */
  markDown(m: PoolMember, why: string, unreachable = false): void {
    m.healthy = false;
    m.lastError = why;
    if (!unreachable) return;
    this.unreachable.get(m)?.abort();
    this.unreachable.delete(m);
  }

  /** Aborted when `m` is next marked down as unreachable. */
  goneSignal(m: PoolMember): AbortSignal {
    let c = this.unreachable.get(m);
    if (c === undefined) {
      c = new AbortController();
      this.unreachable.set(m, c);
    }
    return c.signal;
  }
}
