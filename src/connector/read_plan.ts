/**
 * What a READ consumer pulls for one request, decided on the scheduler side (alignment.ts, in token
 * space), and the checks of prefill's page lists against the prompt, in prefill's block size.
 *
 *   per attention group:  tokens [decode's local hit, min(decode pages, prefill pages)) move;
 *                         destinations = decode pages holding them, sources = prefill pages holding them
 *   per Mamba group:      the running state page moves whole (one state per request, any block sizes)
 */
import { defined } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import type { Mutations } from '../util/mutants.ts';
import { alignState, alignTokens, cdiv } from './alignment.ts';
import { remoteBlockIdsPerGroup, type KVTransferParams } from './params.ts';

export interface ReadPlan {
  /** Per transfer group: destination pages (decode), in token order. */
  localBlockIds: number[][];
  /** Per transfer group: source pages (prefill), in token order. */
  remoteBlockIds: number[][];
  /** Per transfer group: the tokens [start, end) moved (a state group: [0, 0), its page moves whole). */
  tokenRuns: Array<[number, number]>;
}

export interface ReadPlanInput {
  /** Every page of the request per transfer group (decode; Mamba: its running state page). */
  local: number[][];
  /** prefill's remote_block_ids per transfer group. */
  remote: number[][];
  numAttnGroups: number;
  localBlockSize: number;
  remoteBlockSize: number;
  /** decode's local prefix hit, in tokens (block aligned). */
  startToken: number;
  maxTailBlocks: number;
  mutations: Mutations;
}

export function planRead(i: ReadPlanInput): ReadPlan {
  const aligned = i.local.map((ids, g) => {
    // Mutant mamba-state-dropped: the state group moves nothing.
    if (g >= i.numAttnGroups) return alignState(ids, i.mutations.moveMambaState ? (i.remote[g] ?? []) : []);
    const sources = i.mutations.readSources(i.remote[g] ?? [], i.startToken, i.remoteBlockSize);
    return alignTokens(
      { blockIds: ids, blockSize: i.localBlockSize },
      { blockIds: sources, blockSize: i.remoteBlockSize },
      i.startToken,
      i.maxTailBlocks,
    );
  });
  return {
    localBlockIds: aligned.map((a) => a.local),
    remoteBlockIds: aligned.map((a) => a.remote),
    tokenRuns: aligned.map((a) => [a.start, a.end]),
  };
}

/** Nothing moves (a full local hit, or a load that will never run): still releases the producer's pages. */
export function emptyPlan(numGroups: number): ReadPlan {
  return {
    localBlockIds: Array.from({ length: numGroups }, () => []),
    remoteBlockIds: Array.from({ length: numGroups }, () => []),
    tokenRuns: Array.from({ length: numGroups }, () => [0, 0]),
  };
}

/**
 * prefill's page lists against a prompt of `n` tokens, in prefill's block size: each attention group
 * covers at least n-1 tokens and at most n (Mamba: one state page when n > 1); no null block, no page twice.
 */
export function checkRemoteBlocks(groups: number[][], n: number, numAttnGroups: number, remoteBlockSize: number): void {
  const seen = new Set<number>();
  groups.forEach((ids, i) => {
    const isMamba = i >= numAttnGroups;
    const max = isMamba ? 1 : cdiv(n, remoteBlockSize);
    const min = isMamba ? (n > 1 ? 1 : 0) : cdiv(Math.max(n - 1, 0), remoteBlockSize);
    if (ids.length > max)
      throw new HandoffError(
        'BAD_TRANSFER_PARAMS',
        `remote_block_ids group ${i} has ${ids.length} blocks, the prompt needs at most ${max}`,
      );
    if (ids.length < min)
      throw new HandoffError(
        'BAD_TRANSFER_PARAMS',
        `remote_block_ids group ${i} has ${ids.length} blocks, the prompt needs ${min}`,
      );
    for (const b of ids) {
      if (b === 0) throw new HandoffError('BAD_TRANSFER_PARAMS', 'remote_block_ids contains the null block 0');
      if (seen.has(b)) throw new HandoffError('BAD_TRANSFER_PARAMS', `remote_block_ids contains block ${b} twice`);
      seen.add(b);
    }
  });
}

/**
 * A READ request's params against this model, before admission (BAD_TRANSFER_PARAMS, nothing allocated):
 * one page list per transfer group, long enough for the prompt in prefill's pages, and prefill computed
 * the N-1 tokens decode loads (more is fine for attention, a prefix's KV is the same; not for a Mamba
 * state, which is h(remote_num_tokens)).
 */
export function checkReadParams(
  p: KVTransferParams,
  n: number,
  model: { numGroups: number; numAttnGroups: number; hasMamba: boolean; remoteBlockSize: number },
): void {
  const groups = remoteBlockIdsPerGroup(p);
  if (groups === null || groups === undefined)
    throw new HandoffError('BAD_TRANSFER_PARAMS', 'remote_block_ids missing');
  if (groups.length !== model.numGroups) {
    throw new HandoffError(
      'BAD_TRANSFER_PARAMS',
      `remote_block_ids has ${groups.length} groups, this model has ${model.numGroups}`,
    );
  }
  checkRemoteBlocks(groups, n, model.numAttnGroups, model.remoteBlockSize);
  const computed = p.remote_num_tokens;
  if (typeof computed === 'number' && computed < n - 1)
    throw new HandoffError('BAD_TRANSFER_PARAMS', `prefill computed ${computed} tokens, decode needs ${n - 1}`);
  if (model.hasMamba && n > 1 && typeof computed === 'number' && computed !== n - 1) {
    throw new HandoffError(
      'BAD_TRANSFER_PARAMS',
      `prefill computed the Mamba state of ${computed} tokens, decode goes on from ${n - 1}`,
      { param: 'kv_transfer_params.remote_num_tokens' },
    );
  }
}
