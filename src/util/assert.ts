/**
 * Programmer-error assertions. Always on, never caught: a failed assertion means the code is wrong,
 * so the process dies with the message (TigerBeetle style). Operating errors use HandoffError.
 */
export class AssertionFailure extends Error {
  override name = 'AssertionFailure';
}

export function assert(condition: unknown, message: string | (() => string)): asserts condition {
  if (!condition) {
    throw new AssertionFailure(typeof message === 'function' ? message() : message);
  }
}

/** Narrow a possibly-undefined value (e.g. an indexed read under noUncheckedIndexedAccess). */
export function defined<T>(value: T | undefined | null, what: string): T {
  if (value === undefined || value === null) throw new AssertionFailure(`expected ${what} to be defined`);
  return value;
}

export function unreachable(value: never, what = 'value'): never {
  throw new AssertionFailure(`unreachable: unexpected ${what} ${JSON.stringify(value)}`);
}

/**
 * First line of a catch that handles operating errors: a programmer error passes through untouched, so
 * it still crashes instead of becoming a warning, a per-request error or an HTTP 500.
 */
export function rethrowIfAssertion(e: unknown): void {
  if (e instanceof AssertionFailure) throw e;
}
