/**
 * DeviceEvent objects for both devices, and how a stream waits on an event that may come from
 * elsewhere (another stream, another device, a NIC completion).
 *
 * Two views of "reached": the public one (`wait()`, `query()`), which is a host observation and so
 * an edge for the race checker, and the internal `EventSource`, which executors use to release a
 * stream-side wait without pretending the host observed anything.
 */
import type { RaceChecker } from './race/race_checker.ts';
import { observed } from './observed_promise.ts';
import type { DeviceEvent } from './types.ts';

/** The executor-side view of an event. */
export interface EventSource {
  readonly reached: Promise<void>;
  isReached(): boolean;
}

const sources = new WeakMap<DeviceEvent, EventSource>();

/**
 * Build a DeviceEvent over `source`. With a checker, wait() and a true query() join the event's
 * clock into the host, and the event is bound so a stream of any of our devices can wait on it.
 */
export function makeDeviceEvent(
  id: number,
  source: EventSource,
  checker: RaceChecker | null,
  checkerEventId: number | null,
): DeviceEvent {
  const observe = (): void => {
    if (checker !== null && checkerEventId !== null) checker.hostWaitEvent(checkerEventId);
  };
  const ev: DeviceEvent = {
    id,
    wait: () => observed(source.reached, observe),
    query: () => {
      const reached = source.isReached();
      if (reached) observe();
      return reached;
    },
  };
  sources.set(ev, source);
  if (checker !== null && checkerEventId !== null) checker.bindEvent(ev, checkerEventId);
  return ev;
}

/**
 * How an executor learns that `ev` is reached. Our own events expose their source; for anything else
 * (a NIC completion object from src/transfer, a test's gate) the public wait()/query() are used.
 */
export function eventSource(ev: DeviceEvent): EventSource {
  const own = sources.get(ev);
  if (own !== undefined) return own;
  const reached = ev.wait();
  // catch-ok: only marks the rejection handled; `reached` still rejects for whoever awaits it
  reached.catch(() => {});
  return { reached, isReached: () => ev.query() };
}
