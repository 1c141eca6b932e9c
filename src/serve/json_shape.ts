/**
 * Limits on the shape of a JSON request body, checked on its bytes before JSON.parse. The body's size
 * alone does not bound the parse: 4 MiB of `[[[[...` took JSON.parse 1.5-3.5 s, and 250k keys in one
 * object 0.3 s plus 0.7 s of validation, all on the event loop, so one such request stalled every other
 * request of the server (/health included). No request this server takes comes near these limits
 * (the largest, a chat of 256 messages of 64 parts, has ~17k objects and ~34k keys, depth 5); past
 * them, parsing and validating stays well under 0.2 s. The scan is one pass over the bytes (a few ms
 * for 4 MiB): it counts outside strings only and leaves syntax errors to JSON.parse.
 */
import { HandoffError } from '../util/errors.ts';

/** Objects and arrays nested in each other. */
export const JSON_DEPTH_MAX = 64;
/** Objects and arrays in the whole body. */
export const JSON_CONTAINERS_MAX = 1 << 16;
/** Keys in the whole body. */
export const JSON_KEYS_MAX = 1 << 16;
/** Keys in one object. */
export const JSON_OBJECT_KEYS_MAX = 1024;

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COLON = 0x3a;
const OPEN_OBJECT = 0x7b;
const OPEN_ARRAY = 0x5b;
const CLOSE_OBJECT = 0x7d;
const CLOSE_ARRAY = 0x5d;

const tooMuch = (what: string): HandoffError => new HandoffError('BAD_REQUEST', `request body ${what}`);

/**
 * BAD_REQUEST when `bytes` (UTF-8 JSON) nests deeper than JSON_DEPTH_MAX or holds more objects, arrays
 * or keys than the limits above. UTF-8 continuation bytes are never ASCII, so a byte scan is exact.
 */
export function checkJsonShape(bytes: Uint8Array): void {
  // keys[d]: keys so far in the object open at depth d (arrays count none: a colon only appears in objects).
  const keys = new Int32Array(JSON_DEPTH_MAX + 1);
  let depth = 0;
  let containers = 0;
  let totalKeys = 0;
  let inString = false;
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i] as number;
    if (inString) {
      if (b === BACKSLASH) i++;
      else if (b === QUOTE) inString = false;
      continue;
    }
    if (b === QUOTE) inString = true;
    else if (b === OPEN_OBJECT || b === OPEN_ARRAY) {
      if (++depth > JSON_DEPTH_MAX) throw tooMuch(`nests objects and arrays deeper than ${JSON_DEPTH_MAX} levels`);
      if (++containers > JSON_CONTAINERS_MAX) throw tooMuch(`has more than ${JSON_CONTAINERS_MAX} objects and arrays`);
      keys[depth] = 0;
    } else if (b === CLOSE_OBJECT || b === CLOSE_ARRAY) {
      if (depth > 0) depth--;
    } else if (b === COLON) {
      if (++totalKeys > JSON_KEYS_MAX) throw tooMuch(`has more than ${JSON_KEYS_MAX} keys`);
      const inObject = (keys[depth] ?? 0) + 1;
      keys[depth] = inObject;
      if (inObject > JSON_OBJECT_KEYS_MAX) throw tooMuch(`has an object with more than ${JSON_OBJECT_KEYS_MAX} keys`);
    }
  }
}
