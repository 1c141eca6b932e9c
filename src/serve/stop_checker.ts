/**
 * Stop strings on the decoded text, for streaming: text that could still be the start of a stop
 * string is held back, so a client never sees part of a stop string. When a stop string appears, the
 * text is cut right before it (the stop string is not returned, like OpenAI and vLLM), or right after
 * it with vLLM's include_stop_str_in_output.
 *
 *   pushed:   "Hello, wor" "ld. STO" "P here"        stop = ["STOP"]
 *   released: "Hello, "    "world. " ""  → stopped; the rest is dropped
 */
import { assert } from '../util/assert.ts';

export interface StopPush {
  /** Text that is now safe to send. */
  text: string;
  /** A stop string was found; nothing after it will be released. */
  stopped: boolean;
}

export class StopChecker {
  private buffer = '';
  private released = 0;
  private done = false;
  /** The stop string that ended the text (vLLM's stop_reason), or null. */
  matched: string | null = null;
  private readonly holdBack: number;

  constructor(
    private readonly stops: readonly string[],
    private readonly includeStop = false,
  ) {
    assert(
      stops.every((s) => s.length > 0),
      'stop strings must be non-empty',
    );
    this.holdBack = Math.max(0, ...stops.map((s) => s.length - 1));
  }

  get stopped(): boolean {
    return this.done;
  }

  push(delta: string): StopPush {
    if (this.done) return { text: '', stopped: true };
    this.buffer += delta;
    if (this.stops.length === 0) return { text: this.take(this.buffer.length), stopped: false };
    // A stop string can only start where it was not already ruled out: at most holdBack before the new text.
    const from = Math.max(0, this.buffer.length - delta.length - this.holdBack);
    let cut = -1;
    let cutLen = 0;
    let found: string | null = null;
    for (const s of this.stops) {
      const at = this.buffer.indexOf(s, from);
      if (at >= 0 && (cut < 0 || at < cut)) {
        cut = at;
        cutLen = s.length;
        found = s;
      }
    }
    if (cut >= 0) {
      this.done = true;
      this.matched = found;
      return { text: this.take(this.includeStop ? cut + cutLen : cut), stopped: true };
    }
    // Never between the halves of a surrogate pair (an emoji): each half alone is not text.
    let upTo = this.buffer.length - this.holdBack;
    if (upTo > this.released && isHighSurrogate(this.buffer.charCodeAt(upTo - 1))) upTo--;
    return { text: this.take(upTo), stopped: false };
  }

  /** End of generation: release what was held back (it cannot become a stop string any more). */
  flush(): string {
    if (this.done) return '';
    return this.take(this.buffer.length);
  }

  private take(upTo: number): string {
    if (upTo <= this.released) return '';
    const text = this.buffer.slice(this.released, upTo);
    this.released = upTo;
    return text;
  }
}

function isHighSurrogate(code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff;
}
