/**
 * `handoff sim --strategy dpor`: the DPOR search (dpor.ts) over the simulated world. Each schedule is
 * a fresh world (same scenario, world seed 0 like dfs, faults off) whose explorer asks the search.
 *
 * Footprint of a choice (objects `inst/thing`; `inst/*` is all of inst; when unsure, dependent):
 *   X.op#n  compute op      writes X/host (its completion runs X's engine), the blocks it writes;
 *   X.op#n.rK               (rank K's part of a zero or copy: the op's footprint, every rank's: conservative)
 *                           reads the blocks it reads (race-checker footprint: zero, copy, forward)
 *   net#n   READ  X<-Y      writes X/host and X's destination blocks; reads Y's source blocks and
 *                           Y/grant:<transfer> (the grant is checked where it lives)
 *   net#n   WRITE X->Y      writes X/host and Y's destination blocks; reads X's blocks, Y/grant:<transfer>
 *   net#n   notify/handshake X->Y   writes Y/* (its delivery runs Y's connector) and X/host
 *   act:*   scenario action global
 * plus, observed while the step and its continuation ran: grants issued or ended (writes
 * inst/grant:<transfer>), the proxy acting on an instance's engine (a prefill forward that finishes its
 * leg submits the decode request: writes that instance's host), an engine closing (global), and any
 * timer firing (global).
 *
 * Why virtual time does not break it: a step that fires a timer, and every time jump, is dependent
 * with everything, so no reordering moves a step across a timer. Two steps that fire none commute in
 * what fires: the clock after both is the sum of their costs in either order. Sleep sets only keep a
 * step asleep if both steps end before the next timer. What is NOT covered: host code that reads the
 * clock after an independent step (a deadline now+100ms set 1ms later in one order than the other);
 * in these worlds deadlines (100ms transfer timeout, 300ms lease) are far beyond a run (~10ms), so
 * such shifts never decide anything; a run near a deadline would break this assumption.
 * Whoever can cancel a work request (an abort, a timeout) runs host code of its poster, so writes
 * X/host, which every work request of X also writes: disabling is always a dependence.
 * Fabric item ids come from one counter, so two independent steps that both post get their ids
 * swapped in the other order: ids are names only (nothing branches on them), keys of existing items
 * never change, and a replay of the same prefix assigns the same ids (asserted by the search).
 */
import type { WireRange } from '../transfer/core/ranges.ts';
import type { FabricItem } from '../transfer/sim/sim_fabric.ts';
import type { Candidate, DporChooser, Footprint } from './dpor.ts';
import type { ChoiceInfo, Explorer } from './explorer.ts';
import type { SimWorld } from './world.ts';

const GLOBAL: Omit<Footprint, 'costMs'> = { reads: [], writes: [], global: true };

function blocksOf(ranges: readonly WireRange[], pageBytes: number): number[] {
  const out = new Set<number>();
  for (const r of ranges)
    for (let b = Math.floor(r.offset / pageBytes); b <= Math.floor((r.offset + r.length - 1) / pageBytes); b++)
      out.add(b);
  return [...out];
}

/** The world's explorer during a dpor search: every pick is the search's choice. */
export class DporWorldExplorer implements Explorer {
  readonly strategy = 'dpor' as const;
  readonly duplicate = false;
  /** Fabric item id -> its blocks, local (on the poster) and remote, from the post event. */
  private readonly itemBlocks = new Map<number, { local: number[]; remote: number[] }>();
  private pending: { fired: number; extra: string[]; global: boolean } | null = null;

  constructor(
    private readonly w: SimWorld,
    private readonly chooser: DporChooser,
  ) {
    w.fabric.onEvent((ev) => {
      if (ev.t === 'post') {
        // Each side's offsets are in its own pages (the two sides' block sizes, so page sizes, may differ).
        const [poster, peer] = [w.instanceOf(ev.item.from), w.instanceOf(ev.item.to)];
        const pb = (inst: typeof poster): number => (inst ?? w.D).kvConfig.pageBytes;
        this.itemBlocks.set(ev.item.id, {
          local: blocksOf(ev.local, pb(poster)),
          remote: blocksOf(ev.remote, pb(peer)),
        });
      } else if (ev.t === 'grant' && this.pending !== null) {
        this.pending.extra.push(`${w.instanceOf(ev.engineId)?.name ?? ev.engineId}/grant:${ev.transferId}`);
      } else if (ev.t === 'engine-closed' && this.pending !== null) {
        this.pending.global = true;
      }
    });
  }

  pick(choices: readonly ChoiceInfo[]): number {
    // The proxy is built after the explorer: its hook is set at the first choice.
    this.w.proxy.touches ??= (inst) => void this.pending?.extra.push(`${inst.name}/host`);
    this.flush();
    const now = this.w.env.nowMs();
    const next = [this.w.env.nextTimerMs(), this.w.fabric.nextEnabledMs(now)].filter((t): t is number => t !== null);
    const horizonMs = next.length === 0 ? Infinity : Math.min(...next) - now;
    const enabled: Candidate[] = choices.map((c) => ({ key: c.key, fp: this.footprint(c) }));
    const i = this.chooser.choose(enabled, horizonMs);
    this.pending = { fired: 0, extra: [], global: false };
    return i;
  }

  stepped(timersFired: number): void {
    if (this.pending !== null) this.pending.fired += timersFired;
  }

  jumped(): void {
    this.flush();
    this.chooser.barrier();
  }

  ended(enabledKeys: string[]): void {
    this.flush();
    this.chooser.end(enabledKeys);
  }

  /** The last step's continuation has settled: report what it did beyond its static footprint. */
  private flush(): void {
    const p = this.pending;
    if (p === null) return;
    this.pending = null;
    this.chooser.ran(p.global || p.fired > 0, p.extra);
  }

  footprint(c: ChoiceInfo): Footprint {
    const costMs = c.costMs ?? 0;
    const op = /^(\w+)\.op#(\d+)(?:\.r\d+)?$/.exec(c.key);
    if (op !== null) {
      const inst = this.w.instances.find((x) => x.name === op[1]);
      const info = inst?.ops.get(Number(op[2]));
      if (inst === undefined || info === undefined) return { reads: [], writes: [`${op[1]}/*`], global: false, costMs };
      const page = (b: number): string => `${inst.name}/page:${b}`;
      return {
        reads: info.readBlocks.map(page),
        writes: [`${inst.name}/host`, ...info.writeBlocks.map(page)],
        global: false,
        costMs,
      };
    }
    const net = /^net#(\d+)$/.exec(c.key);
    const item = net === null ? undefined : this.w.fabric.queued().find((x) => x.id === Number(net[1]));
    if (item === undefined) return { ...GLOBAL, costMs };
    return { ...this.itemFootprint(item), costMs };
  }

  private itemFootprint(item: FabricItem): Omit<Footprint, 'costMs'> {
    const from = this.w.instanceOf(item.from)?.name;
    const to = this.w.instanceOf(item.to)?.name;
    if (from === undefined || to === undefined) return GLOBAL;
    if (item.kind === 'notify' || item.kind === 'handshake')
      return { reads: [], writes: [`${to}/*`, `${from}/host`], global: false };
    const b = this.itemBlocks.get(item.id);
    if (b === undefined) return GLOBAL;
    const at = (inst: string) => (x: number) => `${inst}/page:${x}`;
    const grant = `${to}/grant:${item.transferId ?? '?'}`;
    if (item.kind === 'read')
      return {
        reads: [...b.remote.map(at(to)), grant],
        writes: [`${from}/host`, ...b.local.map(at(from))],
        global: false,
      };
    return {
      reads: [...b.local.map(at(from)), grant],
      writes: [`${from}/host`, ...b.remote.map(at(to))],
      global: false,
    };
  }
}
