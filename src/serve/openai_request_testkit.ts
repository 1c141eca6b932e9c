/** Shared by the request validation tests (openai_request.test.ts, openai_request_fields.test.ts). */
import assert from 'node:assert/strict';
import { HandoffError } from '../util/errors.ts';

export const limits = { maxModelLen: 128 };

/** The refusal's code, or 'ok' when `f` returns. */
export function code(f: () => unknown): string {
  return refusal(f)?.code ?? 'ok';
}

/** The HandoffError `f` throws (anything else fails the test), or null when it returns. */
export function refusal(f: () => unknown): HandoffError | null {
  try {
    f();
  } catch (e) {
    assert.ok(e instanceof HandoffError, `a HandoffError, got ${String(e)}`);
    return e;
  }
  return null;
}
