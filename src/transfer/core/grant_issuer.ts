/**
 * The issuing side of grants, on the engine thread: random tokens, an expiry timer per grant, and
 * revocation (explicit, on expiry, on the peer's release / write_done). Every change goes to the NIC
 * (thread or sim), whose GrantTable is what actually admits or refuses requests.
 */
import { assert } from '../../util/assert.ts';
import type { Env, TimerHandle } from '../../util/env.ts';
import { HandoffError } from '../../util/errors.ts';
import { hexId } from '../../util/ids.ts';
import type { GrantEnd, Nic } from './nic.ts';
import type { Grant, GrantRequest } from './types.ts';
import { sameToken, type ReleaseOutcome } from './grant_table.ts';

const GRANTS_MAX = 65536;

interface GrantRecord {
  token: string;
  peerEngineId: string | null;
  timer: TimerHandle;
}

export class GrantIssuer {
  private readonly grants = new Map<string, GrantRecord>();
  issued = 0;
  expired = 0;

  constructor(
    private readonly env: Env,
    private readonly nic: Nic,
    private readonly numBlocks: number,
  ) {}

  issue(req: GrantRequest): Grant {
    assert(
      typeof req.transferId === 'string' && req.transferId.length > 0 && req.transferId.length <= 256,
      'transferId must be 1..256 chars',
    );
    assert(req.peerEngineId === null || typeof req.peerEngineId === 'string', 'peerEngineId must be a string or null');
    assert(Number.isFinite(req.ttlMs) && req.ttlMs > 0, `grant ttlMs must be > 0, got ${req.ttlMs}`);
    assert(
      req.blockIds.every((b) => Number.isInteger(b) && b >= 0 && b < this.numBlocks),
      'grant block id out of range',
    );
    this.revoke(req.transferId);
    if (this.grants.size >= GRANTS_MAX) throw new HandoffError('OVERLOADED', `${GRANTS_MAX} grants live at once`);
    const token = hexId(this.env, 16);
    const record: GrantRecord = {
      token,
      peerEngineId: req.peerEngineId,
      timer: this.env.setTimer(req.ttlMs, () => {
        if (this.grants.get(req.transferId) !== record) return;
        this.end(req.transferId, 'expired');
        this.expired++;
      }),
    };
    this.grants.set(req.transferId, record);
    this.nic.grant(req.transferId, token, req.peerEngineId, [...req.blockIds], req.ttlMs);
    this.issued++;
    return { token, transferId: req.transferId, expiresAtMs: this.env.nowMs() + req.ttlMs };
  }

  /** True when a live grant was revoked. */
  revoke(transferId: string): boolean {
    return this.end(transferId, 'revoked');
  }

  private end(transferId: string, why: GrantEnd): boolean {
    const g = this.grants.get(transferId);
    if (g === undefined) return false;
    g.timer.cancel();
    this.grants.delete(transferId);
    this.nic.revokeGrant(transferId, why);
    return true;
  }

  /**
   * The grant's peer says it is done with the transfer (release, write_done) and proves it with the token: revoke it.
   */
  releasedBy(transferId: string, peerEngineId: string, token: unknown): ReleaseOutcome {
    const g = this.grants.get(transferId);
    if (g === undefined) return 'no-grant';
    if ((g.peerEngineId !== null && g.peerEngineId !== peerEngineId) || !sameToken(g.token, token)) return 'refused';
    this.end(transferId, 'released');
    return 'released';
  }

  /** Cancel every timer (engine close; the NIC thread goes away with its table). */
  clear(): void {
    for (const g of this.grants.values()) g.timer.cancel();
    this.grants.clear();
  }
}
