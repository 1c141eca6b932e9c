/**
 * The GPT-2 byte-level BPE tokenizer (js-tiktoken, offline ranks), and an incremental detokenizer
 * for streaming: a token can end in the middle of a UTF-8 character, so text that ends in U+FFFD is
 * held back until the next token completes it.
 */
import { Tiktoken } from 'js-tiktoken/lite';
import gpt2 from 'js-tiktoken/ranks/gpt2';
import { assert } from '../util/assert.ts';
import { VOCAB_SIZE } from './config.ts';

export const EOS_TOKEN_ID = 50256;

let encoder: Tiktoken | null = null;

/** Built on first use (~0.1 s): the ranks are large. */
function tiktoken(): Tiktoken {
  encoder ??= new Tiktoken(gpt2);
  return encoder;
}

/** Text to token ids. Special-token text such as "<|endoftext|>" is encoded as ordinary text. */
export function encode(text: string): number[] {
  return tiktoken().encode(text, [], []);
}

export function decode(ids: readonly number[]): string {
  for (const id of ids) assert(Number.isInteger(id) && id >= 0 && id < VOCAB_SIZE, () => `token id ${id} out of the vocabulary`);
  return tiktoken().decode([...ids]);
}

/** A held-back tail longer than this is emitted anyway (bytes that never form a character). */
const MAX_PENDING_TOKENS = 8;
const REPLACEMENT = '\uFFFD';

export class IncrementalDecoder {
  private pending: number[] = [];

  /** The text that token `id` completes: '' while a character is still incomplete. */
  push(id: number): string {
    this.pending.push(id);
    const text = decode(this.pending);
    if (text.endsWith(REPLACEMENT) && this.pending.length < MAX_PENDING_TOKENS) return '';
    this.pending = [];
    return text;
  }

  /** Whatever is held back (at the end of a stream). */
  flush(): string {
    const text = this.pending.length > 0 ? decode(this.pending) : '';
    this.pending = [];
    return text;
  }
}
