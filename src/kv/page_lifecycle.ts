/**
 * Page lifecycle oracle: one state machine per (instance, block), fed with what happens to pages
 * (pool allocations and frees, zero and forward ops enqueued and run: lifecycle_watch.ts, through the
 * pool's and the stream's observers; transfers posted and landed, grants issued and ended: the
 * simulator's fabric events), asserting the invariants of failure-modes.md §5:
 *
 *   free → allocated → zero-queued → zeroed ─────┬→ in-use → freed
 *                  └→ transfer-posted → landed ──┘
 *
 *   I1  no zero pending on a page a transfer writes; no stale zero (from an earlier allocation) lands
 *   I2  a fresh page (stale bytes of its previous owner) is zeroed, or every byte a forward reads was landed,
 *       zeroed (a clipped tail's zero-spans op) or written since, before a forward reads it
 *   I3  a forward reads a page only after every transfer into it landed
 *   I4  no page with a transfer in flight, or granted to a peer, is freed; nothing touches a freed page
 *   I6  zeroing covers whole pages of exactly the attention slabs, of pages the instance owns
 *   I7  ownership epochs: a page's generation (`epoch`) grows at each allocation, so its owner is (request,
 *       generation). A write lands only on the generation it was issued for: a transfer or forward that
 *       lands after the page was freed and reallocated is a stale writer (sglang #24527, TRT-LLM #12542),
 *       and so is ending a generation while the peer may still write it (a WRITE grant it holds, a WRITE
 *       it posted): that write would land on the next owner. (The world adds the request half at post.)
 * (I5, "done" only once the destination has the data, spans two instances: see world_events.ts.)
 */
import type { PageAccess, PageSpan } from '../device/types.ts';
import { addSpan, firstGap, overlaps, type SlabSpans } from './span_set.ts';

export type PageState =
  'free' | 'allocated' | 'zero-queued' | 'zeroed' | 'transfer-posted' | 'landed' | 'in-use' | 'freed';
export type Invariant = 'I1' | 'I2' | 'I3' | 'I4' | 'I5' | 'I6' | 'I7';
/** Who posted a transfer into a page: this instance (a READ it awaits and can abort) or its peer (a WRITE). */
export type Writer = 'self' | 'peer';

export interface LifecycleViolation {
  invariant: Invariant;
  instance: string;
  block: number | null;
  message: string;
}

interface Page {
  state: PageState;
  allocated: boolean;
  /** The page's generation (allocations so far): a zero, forward or transfer issued for an older one is stale. */
  epoch: number;
  /**
   * 'fresh': stale bytes of a previous owner, unusable until zeroed or landed; 'partial': stale except the
   * bytes in `defined` (what transfers landed, zero-spans ops zeroed and forwards wrote since allocation).
   */
  content: 'fresh' | 'valid' | 'partial';
  defined: SlabSpans;
  /** Allocated through a prefix hit: it holds KV other requests may share; no transfer may write it. */
  hit: boolean;
  zeroQueued: boolean;
  pendingZeros: number;
  /** A transfer landed in this generation (its KV is here): a whole-page zero queued now would wipe it. */
  landedNow: boolean;
  /** Transfers writing the page: the generation each was posted for, who posted it, a peer's grant. */
  inbound: Map<number, { epoch: number; writer: Writer; owner: string; grant: string | null }>;
  /**
   * A peer's WRITEs into the page whose grant ended (revoked and drained): the NIC refuses them, so they
   * hold nothing up (a free, a zeroing, a forward); only their landing after all is a violation.
   */
  refused: Map<number, { epoch: number; owner: string }>;
  outbound: Set<number>;
  /** Grants letting the peer read the page (producer) and write it (WRITE consumer). */
  grants: Set<string>;
  writeGrants: Set<string>;
  history: string[];
}

const HISTORY_MAX = 8;

export class PageLifecycle {
  private readonly pages: Page[];
  private readonly attnSlabs: Set<number>;
  private readonly zeros = new Map<number, { blocks: number[]; epochs: number[] }>();
  private readonly spanZeros = new Map<number, Array<{ block: number; epoch: number }>>();
  private readonly forwards = new Map<number, { writes: Array<{ block: number; epoch: number }> }>();

  constructor(
    readonly instance: string,
    numBlocks: number,
    private readonly pageBytes: number,
    /** The cache needs zeroing (needsKvCacheZeroing): I2 applies. */
    private readonly zeroing: boolean,
    attnSlabs: readonly number[],
    private readonly report: (v: LifecycleViolation) => void,
  ) {
    this.attnSlabs = new Set(attnSlabs);
    this.pages = Array.from({ length: numBlocks }, (_, b) => ({
      state: b === 0 ? 'in-use' : 'free',
      allocated: b === 0,
      epoch: 0,
      content: 'valid',
      defined: new Map(),
      hit: false,
      zeroQueued: b === 0,
      pendingZeros: 0,
      landedNow: false,
      inbound: new Map(),
      refused: new Map(),
      outbound: new Set(),
      grants: new Set(),
      writeGrants: new Set(),
      history: [],
    }));
  }

  state(block: number): PageState {
    return this.page(block).state;
  }

  /** The page's allocation number while it is allocated (a new one with every allocation), else null. */
  allocation(block: number): number | null {
    const p = this.page(block);
    return p.allocated ? p.epoch : null;
  }

  /** Recent transitions of a page, for violation messages. */
  history(block: number): string {
    return this.page(block).history.join(' → ');
  }

  private page(block: number): Page {
    const p = this.pages[block];
    if (p === undefined) throw new RangeError(`block ${block} outside the lifecycle table`);
    return p;
  }

  private move(block: number, state: PageState, why: string): void {
    const p = this.page(block);
    p.state = state;
    p.history.push(`${state}(${why})`);
    if (p.history.length > HISTORY_MAX) p.history.shift();
  }

  private violate(invariant: Invariant, block: number | null, message: string): void {
    const hist = block === null ? '' : ` [history: ${this.history(block)}]`;
    this.report({
      invariant,
      instance: this.instance,
      block,
      message: `${this.instance} block ${block ?? '-'}: ${message}${hist}`,
    });
  }

  /** Pages taken from the pool: `fresh` when popped (stale bytes), not when a prefix hit revived them. */
  allocated(blocks: readonly number[], fresh: boolean): void {
    for (const b of blocks) {
      const p = this.page(b);
      if (p.allocated) this.violate('I4', b, 'allocated twice');
      p.allocated = true;
      p.epoch++;
      p.hit = !fresh;
      p.landedNow = false;
      if (fresh) {
        p.content = 'fresh';
        p.zeroQueued = false;
      } else p.content = 'valid'; // a prefix hit: a full page of published KV
      p.defined = new Map();
      this.move(b, fresh ? 'allocated' : 'in-use', fresh ? 'pool' : 'prefix-hit');
    }
  }

  /** The scheduler gave up what these pages hold (a failed load, recomputed): zeroing them again is no wipe. */
  rolledBack(blocks: readonly number[]): void {
    for (const b of blocks) this.page(b).landedNow = false;
  }

  freed(blocks: readonly number[]): void {
    for (const b of blocks) {
      const p = this.page(b);
      const own = [...p.inbound].filter(([, w]) => w.writer === 'self').map(([id]) => id);
      const peer = [...p.inbound].filter(([, w]) => w.writer === 'peer').map(([id]) => id);
      if (peer.length > 0 || p.writeGrants.size > 0) {
        const what = [...peer.map((id) => `WRITE ${id} in flight`), ...[...p.writeGrants].map((t) => `grant ${t}`)];
        this.violate(
          'I7',
          b,
          `generation ${p.epoch} freed while the peer may still write it (${what.join(', ')}): a stale writer for the next owner`,
        );
      }
      if (own.length > 0) this.violate('I4', b, `freed while transfer ${own.join(',')} is still writing into it`);
      // A transfer still queued to read the page is harmless once its grant is gone (it will be refused).
      if (p.grants.size > 0)
        this.violate('I4', b, `freed while granted to a peer (transfer ${[...p.grants].join(',')})`);
      p.allocated = false;
      this.move(b, 'freed', 'pool');
    }
  }

  zeroEnqueued(opId: number, blocks: readonly number[], slabs: readonly number[]): void {
    const attn = [...this.attnSlabs].sort((a, b) => a - b).join(',');
    if ([...slabs].sort((a, b) => a - b).join(',') !== attn)
      this.violate('I6', null, `zero op ${opId} covers slabs ${slabs.join(',')}, attention slabs are ${attn}`);
    for (const b of blocks) {
      const p = this.page(b);
      if (b !== 0 && !p.allocated)
        this.violate('I6', b, `zeroing queued for a page the instance does not own (op ${opId})`);
      if (p.inbound.size > 0)
        this.violate(
          'I1',
          b,
          `zeroing queued while transfer ${[...p.inbound.keys()].join(',')} writes the page (op ${opId})`,
        );
      else if (p.allocated && p.landedNow)
        this.violate('I1', b, `zeroing queued after a transfer landed in the page (op ${opId}): it wipes the KV`);
      p.pendingZeros++;
      p.zeroQueued = true;
      this.move(b, 'zero-queued', `op ${opId}`);
    }
    this.zeros.set(opId, { blocks: [...blocks], epochs: blocks.map((b) => this.page(b).epoch) });
  }

  zeroRan(opId: number): void {
    const z = this.zeros.get(opId);
    if (z === undefined) return;
    this.zeros.delete(opId);
    z.blocks.forEach((b, i) => {
      const p = this.page(b);
      p.pendingZeros--;
      if (p.epoch !== z.epochs[i] && p.allocated)
        this.violate('I1', b, `zeroing from an earlier allocation (op ${opId}) landed on the page's new owner`);
      else if (p.state === 'landed')
        this.violate('I1', b, `zeroing (op ${opId}) ran after a transfer landed and wiped it`);
      if (p.pendingZeros === 0 && p.epoch === z.epochs[i]) p.content = 'valid';
      this.move(b, 'zeroed', `op ${opId}`);
    });
  }

  /**
   * A zero-spans op (a clipped tail) was enqueued: only on owned pages of the attention slabs, never
   * while a transfer writes the page (I1: it must come after the landing) and never over bytes that
   * already hold KV (I1: it would wipe them). Queued before any later forward (FIFO), its bytes count
   * as defined from now on.
   */
  spansZeroEnqueued(opId: number, spans: readonly PageSpan[]): void {
    for (const s of spans) {
      const p = this.page(s.block);
      if (!this.attnSlabs.has(s.slab)) this.violate('I6', s.block, `zero-spans op ${opId} writes slab ${s.slab}`);
      if (!p.allocated)
        this.violate('I6', s.block, `zero-spans queued for a page the instance does not own (op ${opId})`);
      if (p.inbound.size > 0)
        this.violate(
          'I1',
          s.block,
          `zero-spans queued while transfer ${[...p.inbound.keys()].join(',')} writes the page (op ${opId})`,
        );
      if ((p.content === 'partial' && overlaps(p.defined, s)) || (p.content === 'valid' && p.landedNow))
        this.violate(
          'I1',
          s.block,
          `zero-spans op ${opId} wipes bytes [${s.start}, ${s.end}) of slab ${s.slab} that hold KV`,
        );
      if (p.content !== 'valid') {
        p.content = 'partial';
        addSpan(p.defined, s);
      }
    }
    this.spanZeros.set(
      opId,
      spans.map((s) => ({ block: s.block, epoch: this.page(s.block).epoch })),
    );
  }

  /** A zero-spans op ran: one issued for an earlier allocation of a page is a stale zero (I1). */
  spansZeroRan(opId: number): void {
    const z = this.spanZeros.get(opId);
    if (z === undefined) return;
    this.spanZeros.delete(opId);
    for (const s of z) {
      const p = this.page(s.block);
      if (p.epoch !== s.epoch && p.allocated)
        this.violate(
          'I1',
          s.block,
          `zero-spans from an earlier allocation (op ${opId}) landed on the page's new owner`,
        );
    }
  }

  /**
   * A forward was enqueued with this footprint. Its writes come first (a forward writes its new tokens'
   * slots before attention reads the page), then each read is checked: I4, I3, and I2 (stale bytes).
   */
  forwardEnqueued(opId: number, footprint: readonly PageAccess[]): void {
    const writes: Array<{ block: number; epoch: number }> = [];
    const reported = new Set<string>();
    const once = (key: string): boolean => {
      if (reported.has(key)) return false;
      reported.add(key);
      return true;
    };
    // A recurrent (Mamba) state is read-modify-write: its read is judged before the forward's own writes. The
    // footprint marks it (a.state): Mamba layers share the attention slabs (layer j of every group in slab j).
    const isStateRead = (a: PageAccess): boolean => !a.write && (a.state === true || !this.attnSlabs.has(a.slab));
    for (const a of footprint) {
      if (a.block === 0 || !isStateRead(a)) continue;
      const problem = this.readProblem(this.page(a.block), a, opId);
      if (problem !== null && once(`${a.block}:r`)) this.violate(problem[0], a.block, problem[1]);
    }
    for (const a of footprint) {
      if (a.block === 0 || !a.write) continue;
      const p = this.page(a.block);
      if (!once(`${a.block}:w`)) {
        this.fill(p, a);
        continue;
      }
      if (!p.allocated) this.violate('I4', a.block, `forward (op ${opId}) writes a freed page`);
      writes.push({ block: a.block, epoch: p.epoch });
      this.fill(p, a);
    }
    for (const a of footprint) {
      if (a.block === 0 || a.write || isStateRead(a)) continue;
      const problem = this.readProblem(this.page(a.block), a, opId);
      if (problem !== null && once(`${a.block}:r`)) this.violate(problem[0], a.block, problem[1]);
    }
    this.forwards.set(opId, { writes });
  }

  /** Bytes a forward writes: a whole page leaves no stale byte; a fresh or partial page gains them. */
  private fill(p: Page, a: PageAccess): void {
    if (a.start === 0 && a.end === this.pageBytes) {
      p.content = 'valid';
      p.defined = new Map();
    } else if (p.content !== 'valid') {
      p.content = 'partial';
      addSpan(p.defined, a);
    }
  }

  private readProblem(p: Page, a: PageAccess, opId: number): [Invariant, string] | null {
    if (!p.allocated) return ['I4', `forward (op ${opId}) reads a freed page`];
    if (p.inbound.size > 0)
      return [
        'I3',
        `forward (op ${opId}) enqueued before transfer ${[...p.inbound.keys()].join(',')} into the page landed`,
      ];
    if (!this.zeroing || p.zeroQueued) return null;
    if (p.content === 'fresh')
      return ['I2', `forward (op ${opId}) reads a page that was neither zeroed nor filled by a transfer (stale bytes)`];
    const gap = p.content === 'partial' ? firstGap(p.defined, a) : null;
    if (gap !== null)
      return [
        'I2',
        `forward (op ${opId}) reads bytes [${gap[0]}, ${gap[1]}) of slab ${a.slab} that no transfer, zeroing or forward filled: a page filled only partly (a clipped tail left stale)`,
      ];
    return null;
  }

  forwardRan(opId: number): void {
    const f = this.forwards.get(opId);
    if (f === undefined) return;
    this.forwards.delete(opId);
    for (const w of f.writes) {
      const p = this.page(w.block);
      if (!p.allocated) this.violate('I4', w.block, `forward (op ${opId}) wrote the page after it was freed`);
      else if (p.epoch !== w.epoch)
        this.violate(
          'I7',
          w.block,
          `stale writer: forward (op ${opId}) enqueued for generation ${w.epoch} wrote generation ${p.epoch} (freed and reallocated)`,
        );
      else this.move(w.block, 'in-use', `op ${opId}`);
    }
  }

  /**
   * A transfer will write these pages of this instance (READ destination, WRITE target): it is bound to
   * their current generation, for `owner` (the request it was posted for, in messages).
   */
  inboundPosted(
    itemId: number,
    blocks: readonly number[],
    writer: Writer = 'self',
    owner = '',
    grant: string | null = null,
  ): void {
    for (const b of blocks) {
      const p = this.page(b);
      if (writer === 'peer' && grant !== null && !p.writeGrants.has(grant)) {
        // Posted under a grant that ended: the NIC will refuse it (checked if it lands after all).
        p.refused.set(itemId, { epoch: p.epoch, owner });
        continue;
      }
      if (!p.allocated) this.violate('I4', b, `transfer ${itemId} targets a free page`);
      else if (p.hit)
        this.violate(
          'I4',
          b,
          `transfer ${itemId} overwrites a prefix-hit page (valid KV that other requests may be reading)`,
        );
      if (p.pendingZeros > 0)
        this.violate('I1', b, `transfer ${itemId} writes the page while its zeroing is still queued`);
      p.inbound.set(itemId, { epoch: p.epoch, writer, owner, grant });
      this.move(b, 'transfer-posted', `wr ${itemId}`);
    }
  }

  /**
   * `spans`: the bytes the transfer wrote (any page of `blocks`); without them it counts as writing whole
   * pages. A fresh page whose bytes landed only in part is 'partial' until the rest is zeroed or written.
   */
  inboundDone(itemId: number, blocks: readonly number[], landed: boolean, spans?: readonly PageSpan[]): void {
    for (const b of blocks) {
      const p = this.page(b);
      const refused = p.refused.get(itemId);
      const w = p.inbound.get(itemId);
      p.inbound.delete(itemId);
      p.refused.delete(itemId);
      if (!landed) continue;
      if (refused !== undefined) {
        this.violate(
          'I7',
          b,
          `stale writer: transfer ${itemId} posted for ${refused.owner || 'its owner'} at generation ${refused.epoch} landed after its grant ended${p.allocated ? ` (on generation ${p.epoch})` : ' (on a freed page)'}`,
        );
        continue;
      }
      if (!p.allocated) this.violate('I4', b, `transfer ${itemId} landed in a freed page`);
      else if (w !== undefined && w.epoch !== p.epoch)
        this.violate(
          'I7',
          b,
          `stale writer: transfer ${itemId} posted for ${w.owner || 'its owner'} at generation ${w.epoch} landed on generation ${p.epoch} (freed and reallocated)`,
        );
      p.landedNow = true;
      if (spans === undefined) {
        p.content = 'valid';
        p.defined = new Map();
      } else if (p.content !== 'valid') {
        p.content = 'partial';
        for (const s of spans) if (s.block === b) addSpan(p.defined, s);
      }
      this.move(b, 'landed', `wr ${itemId}`);
    }
  }

  /** A transfer will read these pages of this instance (READ source, WRITE source). */
  outboundPosted(itemId: number, blocks: readonly number[]): void {
    for (const b of blocks) this.page(b).outbound.add(itemId);
  }

  /** The transfer reads the pages now: they must still hold what was granted. */
  outboundRan(itemId: number, blocks: readonly number[]): void {
    for (const b of blocks)
      if (!this.page(b).allocated) this.violate('I4', b, `transfer ${itemId} read the page after it was freed`);
    this.outboundDone(itemId, blocks);
  }

  outboundDone(itemId: number, blocks: readonly number[]): void {
    for (const b of blocks) this.page(b).outbound.delete(itemId);
  }

  /** A grant on these pages issued or ended; `peerWrites`: it lets the peer WRITE them (else READ them). */
  grant(transferId: string, blocks: readonly number[], live: boolean, peerWrites = false): void {
    for (const b of blocks) {
      const p = this.page(b);
      const g = peerWrites ? p.writeGrants : p.grants;
      if (live) g.add(transferId);
      else g.delete(transferId);
      if (live || !peerWrites) continue;
      // The grant's WRITEs still queued can only be refused now (on tcp: once the drain settled).
      for (const [id, w] of [...p.inbound]) {
        if (w.grant !== transferId) continue;
        p.inbound.delete(id);
        p.refused.set(id, { epoch: w.epoch, owner: w.owner });
      }
    }
  }

  /** Whether the peer may still WRITE some of `blocks` under `transferId` (a grant of ours not ended). */
  writeGrantLive(transferId: string, blocks: readonly number[]): boolean {
    return blocks.some((b) => this.page(b).writeGrants.has(transferId));
  }

  /** Pages still allocated (null block excluded). */
  allocatedCount(): number {
    return this.pages.filter((p, b) => b !== 0 && p.allocated).length;
  }
}
