/**
 * The serving side's grant table. It lives where the data path runs (the NIC thread), so every READ
 * and WRITE is checked without the engine thread: token, transfer id, peer, expiry, and that every
 * byte range lies inside granted pages. Anything else is refused and nothing is moved.
 *
 * Clock-free: callers pass `nowMs` in the same clock as `expiresAtMs`.
 */
import { timingSafeEqual } from 'node:crypto';
import { assert } from '../../util/assert.ts';
import { PageRuns, firstPageOutside, rangeProblemAt, type SideRanges } from './ranges.ts';
import type { SlabLayout } from './types.ts';

export interface GrantEntry {
  transferId: string;
  token: string;
  peerEngineId: string | null;
  blockIds: readonly number[];
  expiresAtMs: number;
}

export interface GrantQuery {
  peerEngineId: string;
  transferId: string;
  token: string;
  /** The ranges in the granting engine's slabs. */
  ranges: SideRanges;
  nowMs: number;
}

export type GrantDecision = { ok: true } | { ok: false; reason: string };

interface Stored {
  token: Buffer;
  peerEngineId: string | null;
  pages: PageRuns;
  expiresAtMs: number;
}

const TOKEN_RE = /^[0-9a-f]{32,128}$/;

export function isTokenFormat(token: string): boolean {
  return TOKEN_RE.test(token) && token.length % 2 === 0;
}

/** Constant-time comparison of a presented token with the issued one. */
export function sameToken(issued: string, presented: unknown): boolean {
  if (typeof presented !== 'string' || !isTokenFormat(presented) || presented.length !== issued.length) return false;
  return timingSafeEqual(Buffer.from(issued, 'hex'), Buffer.from(presented, 'hex'));
}

/**
 * A release/write_done ends a grant only when it comes from the grant's peer and carries the grant's
 * token: otherwise anyone who learned a transfer id could free another request's pages.
 */
export type ReleaseOutcome = 'released' | 'refused' | 'no-grant';

export class GrantTable {
  private readonly grants = new Map<string, Stored>();

  constructor(
    private readonly layout: SlabLayout,
    private readonly grantsMax = 65536,
  ) {}

  get size(): number {
    return this.grants.size;
  }

  /** Adds or replaces the grant of `transferId`. A null peer binds to the first engine that uses it. */
  add(g: GrantEntry): void {
    assert(isTokenFormat(g.token), 'grant token must be lowercase hex of 16..64 bytes');
    assert(
      g.blockIds.every((b) => Number.isInteger(b) && b >= 0 && b < this.layout.numBlocks),
      'grant block id out of range',
    );
    assert(this.grants.size < this.grantsMax || this.grants.has(g.transferId), `grant table full (${this.grantsMax})`);
    this.grants.set(g.transferId, {
      token: Buffer.from(g.token, 'hex'),
      peerEngineId: g.peerEngineId,
      pages: new PageRuns(g.blockIds),
      expiresAtMs: g.expiresAtMs,
    });
  }

  revoke(transferId: string): boolean {
    return this.grants.delete(transferId);
  }

  /** Drop every grant expired at `nowMs`; returns how many. */
  sweep(nowMs: number): number {
    let n = 0;
    for (const [id, g] of this.grants) {
      if (g.expiresAtMs <= nowMs) {
        this.grants.delete(id);
        n++;
      }
    }
    return n;
  }

  check(q: GrantQuery): GrantDecision {
    const g = this.grants.get(q.transferId);
    if (g === undefined) return { ok: false, reason: `no live grant for transfer ${q.transferId}` };
    if (!isTokenFormat(q.token)) return { ok: false, reason: 'malformed grant token' };
    const token = Buffer.from(q.token, 'hex');
    if (token.length !== g.token.length || !timingSafeEqual(token, g.token)) {
      return { ok: false, reason: `wrong grant token for transfer ${q.transferId}` };
    }
    if (g.expiresAtMs <= q.nowMs) {
      this.grants.delete(q.transferId);
      return { ok: false, reason: `grant for transfer ${q.transferId} expired` };
    }
    if (g.peerEngineId !== null && g.peerEngineId !== q.peerEngineId) {
      return { ok: false, reason: `grant for transfer ${q.transferId} is not for engine ${q.peerEngineId}` };
    }
    const { p, stride, at } = q.ranges;
    if (p.length === 0) return { ok: false, reason: 'no ranges' };
    const { pageBytes } = this.layout;
    for (let j = 0; j < p.length; j += stride) {
      const [slab, offset, length] = [p[j + at - 1] as number, p[j + at] as number, p[j + stride - 1] as number];
      const problem = rangeProblemAt(slab, offset, length, this.layout);
      if (problem !== null) return { ok: false, reason: problem };
      const outside = firstPageOutside(offset, length, pageBytes, g.pages);
      if (outside !== null)
        return { ok: false, reason: `slab ${slab} page ${outside} is not granted for transfer ${q.transferId}` };
    }
    // Single peer: a grant issued before the reader was known (READ mode) binds to its first valid user.
    if (g.peerEngineId === null) g.peerEngineId = q.peerEngineId;
    return { ok: true };
  }
}
