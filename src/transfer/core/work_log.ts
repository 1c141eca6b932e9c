/** The opt-in work-request log of a transfer engine (startWorkLog), on the NIC's clock. */
import type { OpLabel, PageAccess } from '../../device/types.ts';
import { assert } from '../../util/assert.ts';
import type { Nic } from './nic.ts';

/**
 * One work request in the opt-in log of a transfer engine (startWorkLog), for timelines of real runs.
 * Times are epoch ms as the HOST saw them: posted when postRead/postWrite ran, done when the host
 * learned of the completion (the NIC's message or a completion-queue poll), which can be later than
 * the NIC's last byte when the host was busy.
 */
export interface WorkRequestRecord {
  wrId: number;
  /** The race checker's id (RaceReport access `id` with source 'nic'); null without a checker. */
  checkerWrId: number | null;
  kind: 'read' | 'write';
  label: OpLabel;
  transferId: string;
  bytes: number;
  /** Local pages the work request touches. */
  blockIds: number[];
  postedMs: number;
  doneMs: number | null;
  state: 'pending' | 'done' | 'failed';
}

export const WORK_LOG_MAX = 100_000;

/** Bounded: past WORK_LOG_MAX work requests nothing more is logged (counted in `dropped`). */
export class WorkRequestLog {
  private readonly records: WorkRequestRecord[] = [];
  dropped = 0;

  constructor(private readonly nic: Pick<Nic, 'nowEpochMs'>) {}

  posted(
    r: Omit<WorkRequestRecord, 'postedMs' | 'doneMs' | 'state' | 'blockIds'>,
    footprint: readonly PageAccess[],
  ): WorkRequestRecord | null {
    if (this.records.length >= WORK_LOG_MAX) {
      this.dropped++;
      return null;
    }
    const rec: WorkRequestRecord = {
      ...r,
      label: { ...r.label },
      blockIds: [...new Set(footprint.map((a) => a.block))],
      postedMs: this.nic.nowEpochMs(),
      doneMs: null,
      state: 'pending',
    };
    this.records.push(rec);
    return rec;
  }

  finished(rec: WorkRequestRecord, state: 'done' | 'failed'): void {
    assert(rec.state === 'pending', `work request ${rec.wrId} finished twice in the log`);
    rec.doneMs = this.nic.nowEpochMs();
    rec.state = state;
  }

  entries(): WorkRequestRecord[] {
    return this.records.map((r) => ({ ...r, label: { ...r.label }, blockIds: [...r.blockIds] }));
  }
}
