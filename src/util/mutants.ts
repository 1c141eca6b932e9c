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
  'free-on-abort': 'an aborted request’s pages return to the pool at once, while an in-flight step may still write them',
  'tail-not-zeroed': 'the decode recompute tail is excluded from zeroing along with the READ destinations',
  'write-done-early': 'WRITE reports completion when posted, before the data is visible at the destination',
} as const;

export type MutantName = keyof typeof MUTANTS;

export function isMutantName(s: string): s is MutantName {
  return Object.prototype.hasOwnProperty.call(MUTANTS, s);
}
