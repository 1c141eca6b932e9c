/**
 * TransferTable: the one place a role of the connector keeps its transfers. Each transfer has a `state`
 * from the role's enum, and moves only along the role's declared transitions (asserted), so "where is
 * this transfer" has one answer instead of membership in several maps and sets. A transfer leaves the
 * table only from a terminal state (one with no outgoing transitions) or by an explicit `drop`.
 *
 *   const t = new TransferTable<'posted' | 'landed', Read>('READ', { posted: ['landed'], landed: [] }, 4096);
 *   t.add(id, { state: 'posted', ... });  t.move(id, 'landed');  t.take('landed') → every landed one, removed
 */
import { assert, defined } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';

export class TransferTable<S extends string, T extends { state: S }> {
  private readonly items = new Map<string, T>();

  constructor(
    private readonly role: string,
    private readonly transitions: Readonly<Record<S, readonly S[]>>,
    /** Bound on live transfers (a peer or client can create them). */
    readonly sizeMax: number,
  ) {}

  get size(): number {
    return this.items.size;
  }

  get(id: string): T | undefined {
    return this.items.get(id);
  }

  has(id: string): boolean {
    return this.items.has(id);
  }

  add(id: string, t: T): T {
    assert(!this.items.has(id), () => `${this.role}: transfer ${id} already exists (${this.items.get(id)?.state})`);
    assert(this.items.size < this.sizeMax, () => `${this.role}: more than ${this.sizeMax} transfers`);
    this.items.set(id, t);
    return t;
  }

  /** Move a transfer to `to`; the transition must be declared. */
  move(id: string, to: S): T {
    const t = defined(this.items.get(id), `${this.role}: no transfer ${id}`);
    assert(
      this.transitions[t.state].includes(to),
      () => `${this.role}: transfer ${id} cannot go from ${t.state} to ${to}`,
    );
    t.state = to;
    return t;
  }

  /** Remove a transfer in a terminal state. */
  delete(id: string): T {
    const t = defined(this.items.get(id), `${this.role}: no transfer ${id}`);
    assert(
      this.transitions[t.state].length === 0,
      () => `${this.role}: transfer ${id} removed in non-terminal state ${t.state}`,
    );
    this.items.delete(id);
    return t;
  }

  /** Forget a transfer whatever its state (its pages are no longer reachable: the peer or the request is gone). */
  drop(id: string): T | undefined {
    const t = this.items.get(id);
    this.items.delete(id);
    return t;
  }

  /** Remove and return every transfer in terminal state `s`, in insertion order. */
  take(s: S): Array<[string, T]> {
    assert(this.transitions[s].length === 0, () => `${this.role}: take(${s}) of a non-terminal state`);
    const out: Array<[string, T]> = [];
    for (const [id, t] of this.items) if (t.state === s) out.push([id, t]);
    for (const [id] of out) this.items.delete(id);
    return out;
  }

  /** Every transfer in state `s` (still in the table). */
  inState(s: S): Array<[string, T]> {
    const out: Array<[string, T]> = [];
    for (const [id, t] of this.items) if (t.state === s) out.push([id, t]);
    return out;
  }

  /** The first (oldest) transfer in state `s`, without collecting the rest. */
  oldestIn(s: S): [string, T] | undefined {
    for (const e of this.items) if (e[1].state === s) return e;
    return undefined;
  }

  entries(): IterableIterator<[string, T]> {
    return this.items.entries();
  }
}

/**
 * A producer's transfer_id must not name pages still lent under it (held, or a lease ending): a second grant
 * under the id would replace the first (that transfer's decode then failed with GRANT_DENIED) and the worker
 * keys holds by it. Throws BAD_TRANSFER_PARAMS.
 */
export function refuseLent<S extends string, T extends { state: S; transferId: string }>(
  table: TransferTable<S, T>,
  transferId: string,
): void {
  for (const [other, t] of table.entries())
    if (t.transferId === transferId && (t.state === 'held' || t.state === 'expiring'))
      throw new HandoffError(
        'BAD_TRANSFER_PARAMS',
        `transfer_id '${transferId.slice(0, 80)}' is still lent here (request ${other.slice(0, 80)})`,
        { param: 'kv_transfer_params.transfer_id' },
      );
}
