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
    // Like vLLM's check_stop_strings: the first stop string of the list that is found ends the text,
    // wherever another one starts (the same text and stop_reason as vLLM's when one delta completes two).
    for (const s of this.stops) {
      const at = this.find(s, from);
      if (at < 0) continue;
      this.done = true;
      this.matched = s;
      return { text: this.take(this.includeStop ? at + s.length : at), stopped: true };
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

  /**
   * Where `s` occurs from `from`, never splitting a surrogate pair: the text is whole characters, so a
   * stop string holding half of one ("\ud83d") never matches half of an emoji (nor in vLLM's Python str).
   */
  private find(s: string, from: number): number {
    for (let at = this.buffer.indexOf(s, from); at >= 0; at = this.buffer.indexOf(s, at + 1))
      if (!this.splitsPair(at) && !this.splitsPair(at + s.length)) return at;
    return -1;
  }

  /** Whether a cut before index `i` of the buffer falls between the halves of a surrogate pair. */
  private splitsPair(i: number): boolean {
    return isHighSurrogate(this.buffer.charCodeAt(i - 1)) && isLowSurrogate(this.buffer.charCodeAt(i));
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

function isLowSurrogate(code: number): boolean {
  return code >= 0xdc00 && code <= 0xdfff;
}
