/**
 * The bug zoo's switches (DESIGN.md §8): each mutant reintroduces one known bug of the P/D race family
 * at one named site, so the simulator can prove it catches it. Off unless a test or `handoff sim
 * --mutant` turns one on; the serving paths never set it.
 */
export const MUTANTS = {
  'zero-none': 'never exclude READ destinations from zeroing (vLLM before #59164)',
  'zero-mamba-only': 'exclude READ destinations only for Mamba hybrids (#59164): the seed bug on dsv4-mini',
  'no-await-reads': 'enqueue the forward before the step’s READs have landed',
  'free-before-release': 'prefill frees its pages at finish instead of holding them until decode released them',
  'free-on-abort':
    'an aborted request’s pages return to the pool at once, while an in-flight step may still write them',
  'tail-not-zeroed': 'the decode recompute tail is excluded from zeroing along with the READ destinations',
  'write-done-early': 'WRITE reports completion when posted, before the data is visible at the destination',
  'stale-writer': 'an aborted WRITE load frees its pages at once, grant live: the WRITE lands on the next owner',
  'read-done-early': 'a READ counts as done once posted (local ack), not once its bytes landed: forward and release go',
  'prefix-shift':
    'READ mapping skips decode’s cached prefix on the local side only: remote page i lands in local skip+i',
  'leak-on-cancel':
    'decode never releases a READ it will not load (client gone after prefill answered): prefill waits for the lease',
  'clip-tail-not-zeroed':
    'a decode page only partly filled by the transfer (larger than the prefill pages it receives) keeps the stale bytes past the transferred tokens: the zeroing after the load is forgotten',
  'kv-index-ignores-seq':
    'the router applies KV event batches as they arrive (no sequence order, no gap detection, no dump)',
  'kv-index-ignores-removed':
    'the router index drops BlockRemoved events: a page the instance evicted stays counted as a prefix hit',
  'head-layout-mismatch':
    'between TP degrees the mapper takes pages as head-major (HND) instead of token-major (NHD): wrong strides (TRT-LLM #6507)',
  'tp-slice-off-by-one': 'between TP degrees a decode rank gets the neighbour rank’s head slice (offset by one slice)',
  'abort-not-awaited':
    'a failed READ is reported (pages recomputed, release sent) without awaiting its abort: the NIC may still land it',
  'release-lost': 'decode’s release names its own request id, not the transfer: prefill keeps the pages for the lease',
  'zero-after-loads':
    'no READ destination excluded from zeroing, the zeroing queued once the step’s READs landed instead ("no race then"): it wipes them',
  'lease-no-drain':
    'a lease that ended frees prefill’s pages at once, while a READ admitted under its grant may still read them',
  'split-tail-dropped':
    'a transfer split into work requests counts them rounded down: its last, partial work request is never posted',
  'split-first-wr-only':
    'a READ split into work requests is done once its first work request landed, the later ones still in flight',
  'slot-leak-on-fail':
    'a failed or aborted work request never gives back its NIC completion-queue slot: once all are lost, every transfer is OVERLOADED',
  'hit-start-rounded-up':
    'READ mapping rounds decode’s prefix hit up to prefill’s page: a hit ending mid-page on prefill’s side (its pages the larger) starts the remote run one page late',
  'mamba-state-dropped':
    'a hybrid’s READ moves the attention pages only: decode’s Mamba state page is never loaded (its forward reads a page nobody wrote)',
  'grant-one-page-short':
    'prefill’s READ grant covers the pages of the N-1 tokens decode loads, not every page it lends: when N-1 ends on a page boundary decode’s whole-page READ is refused (GRANT_DENIED) and recomputed',
  'stop-no-handoff':
    'prefill hands its KV to decode only when it stopped on max_tokens: a prefill whose one token is a stop token (or EOS) answers without kv_transfer_params',
} as const;

export type MutantName = keyof typeof MUTANTS;

export function isMutantName(s: string): s is MutantName {
  return Object.prototype.hasOwnProperty.call(MUTANTS, s);
}

/**
 * What each mutant changes, as behaviour at its site: the code asks `mutationsFor(config.mutant)` and
 * never compares mutant names itself. The correct build is CORRECT_BEHAVIOUR; serving never sets a mutant.
 */
export interface Mutations {
  /** READ consumer: the pages excluded from zeroing for one request (correct: the aligned READ destinations). */
  zeroExcludedPages(alignedDestinations: number[][], allLocalPages: number[][]): number[][];
  /** Producer: a finished request's pages stay out of the pool until the peer released them. */
  readonly holdPagesUntilRelease: boolean;
  /** Scheduler: an aborted request's pages go behind the free fence (a step in flight may still write them). */
  readonly deferFreeOnAbort: boolean;
  /** READ consumer: the forward is enqueued only after every READ of its step landed. */
  readonly awaitReadsBeforeForward: boolean;
  /** WRITE producer: write_done is announced only once the data is visible at the destination. */
  readonly writeDoneAfterData: boolean;
  /** WRITE consumer: an aborted load revokes its grant and holds its pages until no WRITE can land. */
  readonly fenceAbortedWrites: boolean;
  /** READ consumer: a READ is complete when its bytes landed in our pages (not when it was posted). */
  readonly readDoneWhenLanded: boolean;
  /**
   * READ consumer: prefill's pages (from its token 0) that decode's tokens from `hitTokens` on map onto.
   * Correct: all of them, unchanged (local token t <- remote token t).
   */
  readSources(remote: number[], hitTokens: number, remoteBlockSize: number): number[];
  /** READ and WRITE consumers: a destination page's slots past the transferred tokens are zeroed after the load. */
  readonly zeroClippedTails: boolean;
  /** READ consumer: a load that will never run (cancelled, refused) still sends the producer its release. */
  readonly releaseUnusedLoads: boolean;
  /** Router index: batches apply in sequence order; a gap or a heartbeat ahead of it asks for a dump. */
  readonly orderKvEventsBySeq: boolean;
  /** Router index: a BlockRemoved event takes its hashes out of the instance's set. */
  readonly applyKvBlockRemoved: boolean;
  /**
   * READ consumer and WRITE producer: how the map between tensor parallel degrees goes wrong (kv/tp_map.ts
   * TpMapFaults). Correct: {} (token-major pages, each destination slice from its own source slice).
   */
  readonly tpMapFaults: { readonly headMajor?: boolean; readonly sliceShift?: number };
  /** READ consumer: a failed READ's abort is awaited (the NIC let go of the pages) before it is reported. */
  readonly awaitAbortOfFailedRead: boolean;
  /** READ consumer: the release names the transfer it ends (not decode's request id). */
  readonly releaseNamesTransfer: boolean;
  /** Runner (through the connector worker): the step's zeroing is queued before its loads, not after them. */
  readonly zeroBeforeLoads: boolean;
  /** Producer: the pages of a lease that ended are reported only once the NIC drained its grant. */
  readonly drainEndedLeases: boolean;
  /** READ consumer and WRITE producer: a transfer's last work request is posted also when it is not full. */
  readonly postPartialWorkRequest: boolean;
  /** READ consumer: a READ is awaited on every one of its work requests (not only its first). */
  readonly awaitEveryWorkRequest: boolean;
  /** Transfer engine (through the connector's options): a failed work request frees its completion-queue slot. */
  readonly freeSlotsOfFailedWork: boolean;
  /** Producer: a prefill that stopped on a stop token or EOS (not only on max_tokens) hands its KV to decode. */
  readonly handoffOnStop: boolean;
  /** READ consumer: a hybrid's Mamba state page (h(N-1)) is loaded with the attention pages. */
  readonly moveMambaState: boolean;
  /** Producer: the pages a READ grant covers (correct: every page of the answer, whatever decode loads of them). */
  grantedPages(groups: number[][], numPromptTokens: number, blockSize: number): number[];
}

export const CORRECT_BEHAVIOUR: Mutations = {
  zeroExcludedPages: (aligned) => aligned,
  holdPagesUntilRelease: true,
  deferFreeOnAbort: true,
  awaitReadsBeforeForward: true,
  writeDoneAfterData: true,
  fenceAbortedWrites: true,
  readDoneWhenLanded: true,
  readSources: (remote) => remote,
  zeroClippedTails: true,
  releaseUnusedLoads: true,
  orderKvEventsBySeq: true,
  applyKvBlockRemoved: true,
  tpMapFaults: {},
  awaitAbortOfFailedRead: true,
  releaseNamesTransfer: true,
  zeroBeforeLoads: true,
  drainEndedLeases: true,
  postPartialWorkRequest: true,
  awaitEveryWorkRequest: true,
  freeSlotsOfFailedWork: true,
  handoffOnStop: true,
  moveMambaState: true,
  grantedPages: (groups) => groups.flat(),
};

const MUTATIONS: Record<MutantName, Partial<Mutations>> = {
  'zero-none': {}, // a zeroExclusion setting (connector config), not a code site
  'zero-mamba-only': {},
  'no-await-reads': { awaitReadsBeforeForward: false },
  'free-before-release': { holdPagesUntilRelease: false },
  'free-on-abort': { deferFreeOnAbort: false },
  'tail-not-zeroed': { zeroExcludedPages: (_aligned, all) => all },
  'write-done-early': { writeDoneAfterData: false },
  'stale-writer': { fenceAbortedWrites: false },
  'read-done-early': { readDoneWhenLanded: false },
  // Remote page i lands in the local page of token hitTokens + i * remoteBlockSize: shifted by the local hit.
  'prefix-shift': {
    readSources: (remote, hitTokens, bs) => [...remote.slice(0, Math.floor(hitTokens / bs)), ...remote],
  },
  'leak-on-cancel': { releaseUnusedLoads: false },
  'clip-tail-not-zeroed': { zeroClippedTails: false },
  'kv-index-ignores-seq': { orderKvEventsBySeq: false },
  'kv-index-ignores-removed': { applyKvBlockRemoved: false },
  'head-layout-mismatch': { tpMapFaults: { headMajor: true } },
  'tp-slice-off-by-one': { tpMapFaults: { sliceShift: 1 } },
  'abort-not-awaited': { awaitAbortOfFailedRead: false },
  'release-lost': { releaseNamesTransfer: false },
  'zero-after-loads': { zeroBeforeLoads: false }, // with zeroExclusion 'none' (connector config)
  'lease-no-drain': { drainEndedLeases: false },
  'split-tail-dropped': { postPartialWorkRequest: false },
  'split-first-wr-only': { awaitEveryWorkRequest: false },
  'slot-leak-on-fail': { freeSlotsOfFailedWork: false },
  'stop-no-handoff': { handoffOnStop: false },
  'mamba-state-dropped': { moveMambaState: false },
  // Only the pages of the N-1 tokens decode loads: with N-1 on a page boundary, the page of token N-1 is left out.
  'grant-one-page-short': {
    grantedPages: (groups, n, bs) => groups.flatMap((g) => g.slice(0, Math.ceil((n - 1) / bs))),
  },
  // Remote pages from ceil(hit / bs) instead of floor: the page holding the hit's end is skipped.
  'hit-start-rounded-up': {
    readSources: (remote, hitTokens, bs) =>
      hitTokens % bs === 0
        ? remote
        : [...remote.slice(0, Math.floor(hitTokens / bs)), ...remote.slice(Math.floor(hitTokens / bs) + 1)],
  },
};

export function mutationsFor(mutant: MutantName | undefined): Mutations {
  return mutant === undefined ? CORRECT_BEHAVIOUR : { ...CORRECT_BEHAVIOUR, ...MUTATIONS[mutant] };
}
