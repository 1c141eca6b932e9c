/**
 * Order coverage: for every page that was the destination of a READ or WRITE, the order in which
 * the three events that decide its bytes first happened during that allocation of the page:
 *
 *   Z  a zero op ran on it        L  the transfer landed on it        F  a forward read it
 *
 * (Z: a whole-page `zero` or a clipped tail's `zero-spans`.) E.g. `L<F` (the correct READ path:
 * destinations are not zeroed), `Z<L<F` (zeroed, then filled), `L<Z<F` (the zeroing wiped landed
 * data: the seed bug; in the correct build, a clipped tail zeroed after its landing or a failed load
 * re-zeroed). Counted per page allocation over every seed of a run; the report lists which of the 6
 * permutations of Z, L, F were never seen (orders where one event never happened, like `L<F`, are
 * counted but are not permutations).
 */
import type { SimWorld } from './world.ts';

export type OrderCounts = Record<string, number>;

export interface CoverageReport {
  seen: OrderCounts;
  /** Permutations of Z, L, F not seen in any seed. */
  unseen: string[];
}

export const PERMUTATIONS = ['Z<L<F', 'Z<F<L', 'L<Z<F', 'L<F<Z', 'F<Z<L', 'F<L<Z'] as const;

interface Epoch {
  order: string[];
  destination: boolean;
}

/** Watches one world's instances and fabric (observe, never change). */
export class OrderCoverage {
  private readonly counts: OrderCounts = {};
  /** `${instance}:${block}` -> the page's current allocation. */
  private readonly epochs = new Map<string, Epoch>();
  /** Fabric item id -> the destination blocks of its work request. */
  private readonly posted = new Map<number, { inst: string; blocks: number[] }>();

  constructor(w: SimWorld) {
    for (const inst of w.instances) {
      const ops = new Map<number, { kind: string; read: number[]; write: number[] }>();
      inst.device.compute.observe({
        enqueued: (sub, id) => {
          const op = sub.op;
          const fp = sub.footprint ?? [];
          ops.set(id, {
            kind: op.kind,
            read: fp.filter((a) => !a.write).map((a) => a.block),
            write:
              op.kind === 'zero'
                ? op.blockIds
                : op.kind === 'zero-spans'
                  ? [...new Set(op.spans.map((x) => x.block))]
                  : [],
          });
        },
        executed: (id) => {
          const op = ops.get(id);
          ops.delete(id);
          if (op?.kind === 'zero' || op?.kind === 'zero-spans')
            for (const b of op.write) this.mark(inst.name, b, 'Z', false);
          if (op?.kind === 'kernel') for (const b of op.read) this.mark(inst.name, b, 'F', false);
        },
      });
      const start = (ids: number[]): void => {
        for (const b of ids) (this.close(`${inst.name}:${b}`), this.epochs.set(`${inst.name}:${b}`, this.fresh()));
      };
      inst.engine.kv.blockPool.observe({
        allocated: start,
        revived: start,
        freed: (ids) => ids.forEach((b) => this.close(`${inst.name}:${b}`)),
      });
    }
    w.fabric.onEvent((ev) => {
      if (ev.t !== 'post' && ev.t !== 'land') return;
      const item = ev.item;
      if (item.kind !== 'read' && item.kind !== 'write') return;
      const dst = w.instanceOf(item.kind === 'read' ? item.from : item.to);
      if (dst === null) return;
      const pageBytes = dst.kvConfig.pageBytes;
      const ranges = ev.t === 'post' ? (item.kind === 'read' ? ev.local : ev.remote) : null;
      if (ranges !== null) {
        const blocks = new Set<number>();
        for (const r of ranges)
          for (let b = Math.floor(r.offset / pageBytes); b <= Math.floor((r.offset + r.length - 1) / pageBytes); b++)
            blocks.add(b);
        this.posted.set(item.id, { inst: dst.name, blocks: [...blocks] });
        for (const b of blocks) this.mark(dst.name, b, null, true);
      } else {
        for (const b of this.posted.get(item.id)?.blocks ?? []) this.mark(dst.name, b, 'L', true);
        this.posted.delete(item.id);
      }
    });
  }

  private fresh(): Epoch {
    return { order: [], destination: false };
  }

  private mark(inst: string, block: number, what: 'Z' | 'L' | 'F' | null, destination: boolean): void {
    const key = `${inst}:${block}`;
    let e = this.epochs.get(key);
    if (e === undefined) {
      e = this.fresh();
      this.epochs.set(key, e);
    }
    if (destination) e.destination = true;
    if (what !== null && !e.order.includes(what)) e.order.push(what);
  }

  private close(key: string): void {
    const e = this.epochs.get(key);
    this.epochs.delete(key);
    if (e === undefined || !e.destination || e.order.length === 0) return;
    const order = e.order.join('<');
    this.counts[order] = (this.counts[order] ?? 0) + 1;
  }

  /** The counts so far, closing every page still allocated (the end of the run). */
  finish(): OrderCounts {
    for (const key of [...this.epochs.keys()]) this.close(key);
    return { ...this.counts };
  }
}

export function mergeCounts(into: OrderCounts, from: OrderCounts): void {
  for (const [k, n] of Object.entries(from)) into[k] = (into[k] ?? 0) + n;
}

export function coverageReport(counts: OrderCounts): CoverageReport {
  const seen = Object.fromEntries(Object.entries(counts).sort(([a], [b]) => a.localeCompare(b)));
  return { seen, unseen: PERMUTATIONS.filter((p) => !(p in counts)) };
}

export function formatCoverage(c: CoverageReport): string {
  const seen = Object.entries(c.seen).map(([k, n]) => `${k}: ${n}`);
  return `coverage: orders seen {${seen.join(', ')}}; permutations never seen: ${c.unseen.length === 0 ? 'none' : c.unseen.join(' ')}`;
}
