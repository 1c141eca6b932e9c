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
