/**
 * cancel-everywhere: a client that goes away at every point of a request's life. Each request's point
 * is drawn from the seed (scenarios.ts); here it becomes one explorer action, enabled only while the
 * request is at that point, so the explorer picks the moment (or lets the window close). The cancel is
 * the abort scenario's: the proxy's client signal, through pdFlow, as the HTTP proxy's disconnect.
 *
 *   before-prefill   not yet arrived, or queued in prefill (nothing computed)
 *   during-prefill   prefill's request scheduled, its forward queued or running
 *   after-answer     prefill answered; the answer is on its way to the proxy (an explorer choice)
 *   during-transfer  a READ (WRITE) of its KV is on the fabric
 *   during-decode    decode has the request (waiting to load, or generating), no transfer in flight
 */
import type { FabricItem } from '../transfer/sim/sim_fabric.ts';
import type { ProxyRequest } from './proxy.ts';
import type { CancelPoint } from './scenarios.ts';
import type { SimWorld } from './world.ts';

export interface CancelRecord {
  index: number;
  point: CancelPoint;
  atMs: number;
  step: number;
}

export class CancelPoints {
  /** Cancels applied, in order. */
  readonly applied: CancelRecord[] = [];
  /** Prefill answers on their way to the proxy (the after-answer window), by request index. */
  private readonly answersInFlight = new Set<number>();

  constructor(private readonly w: SimWorld) {}

  /** One cancel action per request that has a point. */
  install(): void {
    const w = this.w;
    w.proxy.requests.forEach((r, i) => {
      const point = w.scenario.cancelPoints[i] ?? null;
      if (point === null) return;
      w.addAction({
        key: `act:cancel:${i}`,
        name: `client of request ${i} goes away (${point})`,
        enabled: () => r.phase !== 'done' && this.at(r, point),
        run: () => {
          this.applied.push({ index: i, point, atMs: w.env.nowMs(), step: w.step });
          w.proxy.abort(r);
        },
      });
    });
  }

  /** Prefill's answer for `r` travels back to the proxy: it arrives when the explorer picks it. */
  hop(r: ProxyRequest, deliver: () => void): void {
    const i = r.spec.index;
    this.answersInFlight.add(i);
    this.w.addAction({
      key: `act:answer:${i}`,
      name: `prefill's answer for request ${i} reaches the proxy`,
      enabled: () => true,
      run: () => {
        this.answersInFlight.delete(i);
        deliver();
      },
    });
  }

  private at(r: ProxyRequest, point: CancelPoint): boolean {
    const i = r.spec.index;
    const p = this.w.P.engine.scheduler.requests.get(this.w.proxy.prefillId(r));
    const d = this.w.D.engine.scheduler.requests.get(this.w.proxy.decodeId(r));
    switch (point) {
      case 'before-prefill':
        return r.phase === 'pending' || (r.phase === 'prefill' && p?.status === 'WAITING' && p.numComputedTokens === 0);
      case 'during-prefill':
        return p !== undefined && (p.status === 'RUNNING' || p.status === 'PREEMPTED');
      case 'after-answer':
        return this.answersInFlight.has(i);
      case 'during-transfer':
        return this.transferInFlight(r);
      case 'during-decode':
        return d !== undefined && !d.isFinished && !this.transferInFlight(r);
    }
  }

  private transferInFlight(r: ProxyRequest): boolean {
    const ids = [this.w.proxy.prefillId(r), this.w.proxy.decodeId(r)];
    const mine = (item: FabricItem): boolean =>
      (item.kind === 'read' || item.kind === 'write') && (item.label.requestIds ?? []).some((id) => ids.includes(id));
    return this.w.fabric.queued().some(mine);
  }
}
