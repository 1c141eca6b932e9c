import type { MutantName } from '../util/mutants.ts';

/** Scheduler limits and policies (vLLM's SchedulerConfig, camelCase). */
export interface SchedulerConfig {
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  maxModelLen: number;
  enableChunkedPrefill: boolean;
  enablePrefixCaching: boolean;
  numLookaheadTokens: number;
  kvLoadFailurePolicy: 'fail' | 'recompute';
  eosTokenId: number;
  /** Bug zoo only: 'free-on-abort' frees an aborted request's pages without the fence. */
  mutant?: MutantName;
  /** Bound on the waiting queue (CONVENTIONS: bound everything). */
  maxWaiting: number;
}

export const DEFAULT_SCHEDULER_CONFIG: SchedulerConfig = {
  maxNumSeqs: 32,
  maxNumBatchedTokens: 512,
  maxModelLen: 1024,
  enableChunkedPrefill: true,
  enablePrefixCaching: true,
  numLookaheadTokens: 0,
  kvLoadFailurePolicy: 'recompute',
  eosTokenId: 50256,
  maxWaiting: 4096,
};
