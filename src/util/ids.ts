/** Identifiers built from an Env's randomness (never Math.random). */
import type { Env } from './env.ts';

export function hexId(env: Env, bytes = 16): string {
  return Buffer.from(env.secureRandomBytes(bytes)).toString('hex');
}
