/** What the race checker reports: two unordered accesses to the same bytes, at least one a write. */
import type { OpLabel } from '../types.ts';

/** Who made an access: a stream op, a NIC work request, or the host itself. */
export type AccessSource = 'op' | 'nic' | 'host';

export interface AccessInfo {
  /** 'host', a stream name ('compute') or 'nic'. */
  agent: string;
  source: AccessSource;
  /** Op id, work-request id or host access id (each source numbers its own). */
  id: number;
  label: OpLabel;
  write: boolean;
  /** The access's byte range inside the page. */
  start: number;
  end: number;
}

export interface RaceReport {
  /** The access recorded first (program order of the host), `b` the later one. */
  a: AccessInfo;
  b: AccessInfo;
  slab: number;
  block: number;
  /** Bytes of the page both touch (the hull when one pair of ops conflicts on several ranges). */
  range: { start: number; end: number };
}

function describeAccess(x: AccessInfo): string {
  const reqs = x.label.requestIds && x.label.requestIds.length > 0 ? ` requests=${x.label.requestIds.join(',')}` : '';
  const step = x.label.step === undefined ? '' : ` step=${x.label.step}`;
  return `${x.write ? 'write' : 'read'} by ${x.agent} ${x.source}#${x.id} '${x.label.what}'${reqs}${step} [${x.start},${x.end})`;
}

/** One line per race, for logs and the simulator's violation output. */
export function formatRace(r: RaceReport): string {
  return (
    `race on slab ${r.slab} block ${r.block} bytes [${r.range.start},${r.range.end}): ` +
    `${describeAccess(r.a)} is unordered with ${describeAccess(r.b)}`
  );
}
