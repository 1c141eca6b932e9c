/**
 * The waiting queue under page pressure (vLLM #57841: block-holding async loads parked behind an
 * unschedulable head deadlock the pool). Requests that already hold pages (loads that landed or are
 * landing, loads rolled back for recompute) go first: they need few more pages. And when nothing can
 * run at all, the newest holder whose load is over gives its pages back to be recomputed.
 */
import type { Request } from './request.ts';

/** `waiting` with the requests holding pages first, each part in its own order. */
export function holdersFirst(waiting: Request[], holds: (r: Request) => boolean): Request[] {
  const holders: Request[] = [];
  const rest: Request[] = [];
  for (const r of waiting) (holds(r) ? holders : rest).push(r);
  return holders.length === 0 ? waiting : [...holders, ...rest];
}

/**
 * The newest waiting request other than `head` that holds pages and has no load in flight
 * (`loadOver` is asked only of requests still parked for an async load), or null.
 */
export function newestIdleHolder(
  waiting: readonly Request[],
  head: Request,
  holds: (r: Request) => boolean,
  loadOver: (r: Request) => boolean,
): Request | null {
  for (let i = waiting.length - 1; i >= 0; i--) {
    const r = waiting[i] as Request;
    if (r === head || !holds(r)) continue;
    if (r.status === 'WAITING_FOR_REMOTE_KVS' && !loadOver(r)) continue; // its load may still land
    return r;
  }
  return null;
}
