/**
 * The serving side's grants in the `sim` backend: random tokens, an expiry timer per grant, revocation
 * (explicit, on expiry, on the peer's release / write_done), and the GrantTable that admits or refuses
 * each work request. Every change is reported on the fabric, so the simulator's oracles know which
 * pages a peer may touch at any moment.
 */
import { assert } from '../util/assert.ts';
import type { Env, TimerHandle } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { hexId } from '../util/ids.ts';
import { GrantTable, sameToken, type GrantDecision, type GrantQuery, type ReleaseOutcome } from './grant_table.ts';
import type { SimFabric } from './sim_fabric.ts';
import type { Grant, GrantRequest, SlabLayout } from './types.ts';

const GRANTS_MAX = 65_536;

type GrantEnd = 'revoked' | 'expired' | 'released';

export class SimGrants {
  private readonly table: GrantTable;
  private readonly records = new Map<string, { timer: TimerHandle; token: string; peerEngineId: string | null; blockIds: number[] }>();
  issued = 0;
  expired = 0;
  refused = 0;

  constructor(
    private readonly engineId: string,
    private readonly env: Env,
    private readonly fabric: SimFabric,
    private readonly layout: SlabLayout,
  ) {
    this.table = new GrantTable(layout, GRANTS_MAX);
  }

  issue(req: GrantRequest): Grant {
    assert(req.transferId.length > 0 && req.transferId.length <= 256, 'transferId must be 1..256 chars');
    assert(Number.isFinite(req.ttlMs) && req.ttlMs > 0, `grant ttlMs must be > 0, got ${req.ttlMs}`);
    assert(req.blockIds.every((b) => Number.isInteger(b) && b >= 0 && b < this.layout.numBlocks), 'grant block id out of range');
    this.end(req.transferId, 'revoked');
    if (this.records.size >= GRANTS_MAX) throw new HandoffError('OVERLOADED', `${GRANTS_MAX} grants live at once`);
    const token = hexId(this.env, 16);
    const expiresAtMs = this.env.nowMs() + req.ttlMs;
    const blockIds = [...req.blockIds];
    const record = {
      token,
      peerEngineId: req.peerEngineId,
      blockIds,
      timer: this.env.setTimer(req.ttlMs, () => {
        if (this.records.get(req.transferId) !== record) return;
        this.end(req.transferId, 'expired');
        this.expired++;
      }),
    };
    this.records.set(req.transferId, record);
    this.table.add({ transferId: req.transferId, token, peerEngineId: req.peerEngineId, blockIds, expiresAtMs });
    this.issued++;
    this.fabric.emit({ t: 'grant', engineId: this.engineId, change: 'issued', transferId: req.transferId, blockIds, peerEngineId: req.peerEngineId });
    return { token, transferId: req.transferId, expiresAtMs };
  }

  /** True when a live grant ended now. */
  end(transferId: string, change: GrantEnd): boolean {
    const g = this.records.get(transferId);
    if (g === undefined) return false;
    g.timer.cancel();
    this.records.delete(transferId);
    this.table.revoke(transferId);
    this.fabric.emit({ t: 'grant', engineId: this.engineId, change, transferId, blockIds: g.blockIds, peerEngineId: g.peerEngineId });
    return true;
  }

  /** The grant's peer is done with it (release, write_done) and proves it with the token. */
  releasedBy(transferId: string, peerEngineId: string, token: unknown): ReleaseOutcome {
    const g = this.records.get(transferId);
    if (g === undefined) return 'no-grant';
    if ((g.peerEngineId !== null && g.peerEngineId !== peerEngineId) || !sameToken(g.token, token)) return 'refused';
    this.end(transferId, 'released');
    return 'released';
  }

  check(q: GrantQuery): GrantDecision {
    const d = this.table.check(q);
    if (!d.ok) this.refused++;
    return d;
  }

  clear(): void {
    for (const g of this.records.values()) g.timer.cancel();
    this.records.clear();
  }
}
