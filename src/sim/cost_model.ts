/**
 * How long each simulated action takes, in virtual milliseconds. The clock moves by the chosen
 * action's cost (and jumps to the next timer when nothing is enabled), so leases, timeouts and idle
 * polls fire at plausible points of a schedule. Shape from reference/gpu-race-measurement.md: a
 * forward costs milliseconds and grows with tokens, zeroing is cheap per page, a READ of a step's
 * pages costs tens of microseconds per page, so a zeroing queued behind a forward lands well after a
 * READ posted at the same moment unless something orders them.
 */
export const COST = {
  forwardBaseMs: 1.0,
  forwardPerTokenMs: 0.05,
  zeroBaseMs: 0.005,
  zeroPerPageMs: 0.002,
  copyPerPageMs: 0.004,
  nicBaseMs: 0.01,
  /** About 10 GB/s. */
  nicPerByteMs: 1e-7,
  notifyMs: 0.02,
  handshakeMs: 0.05,
  actionMs: 0,
  /** How long an enabled message may wait for the explorer before it goes first (world.ts choices()). */
  netWaitMaxMs: 20,
} as const;

export function forwardCostMs(tokens: number): number {
  return COST.forwardBaseMs + COST.forwardPerTokenMs * tokens;
}

export function zeroCostMs(pages: number): number {
  return COST.zeroBaseMs + COST.zeroPerPageMs * pages;
}

export function nicCostMs(kind: 'read' | 'write' | 'notify' | 'handshake', bytes: number): number {
  if (kind === 'notify') return COST.notifyMs;
  if (kind === 'handshake') return COST.handshakeMs;
  return COST.nicBaseMs + COST.nicPerByteMs * bytes;
}
