/**
 * The GPT-2 byte-level BPE tokenizer (js-tiktoken's offline ranks, our O(n log n) merge in bpe.ts:
 * the same ids as js-tiktoken, without its quadratic time on long words), and an incremental
 * detokenizer for streaming: a token can end in the middle of a UTF-8 character, so text that ends in
 * U+FFFD is held back until the next token completes it.
 */
import gpt2 from 'js-tiktoken/ranks/gpt2';
import { assert } from '../util/assert.ts';
import { BytePairEncoder } from './bpe.ts';
import { VOCAB_SIZE } from './config.ts';

export const EOS_TOKEN_ID = 50256;

/**
 * The longest GPT-2 token, in bytes. A prompt of L UTF-16 code units has at least L UTF-8 bytes, so at
 * least L / MAX_TOKEN_BYTES tokens: the serving edge refuses over-long text by its length alone, before
 * tokenizing, without ever refusing a prompt that would have fit.
 */
export const MAX_TOKEN_BYTES = 128;

let encoder: BytePairEncoder | null = null;

/** Built on first use (loadTokenizer), 0.4-1 s: the ranks are large. */
function bpe(): BytePairEncoder {
  if (encoder === null) {
    encoder = new BytePairEncoder(gpt2);
    assert(
      encoder.maxTokenBytes === MAX_TOKEN_BYTES,
      () => `the longest GPT-2 token has ${encoder?.maxTokenBytes} bytes, not ${MAX_TOKEN_BYTES}`,
    );
    assert(encoder.vocabSize === VOCAB_SIZE, 'the ranks are GPT-2 (50257 ids)');
  }
  return encoder;
}

/**
 * Build the tables now (0.4-1 s of parsing the ranks). A server calls this before it listens: built
 * lazily, they stalled the event loop, and every request of the process, on the first request.
 */
export function loadTokenizer(): void {
  bpe();
}

/** Text to token ids. Special-token text such as "<|endoftext|>" is encoded as ordinary text. */
export function encode(text: string): number[] {
  return bpe().encode(text);
}

export function decode(ids: readonly number[]): string {
  for (const id of ids)
    assert(Number.isInteger(id) && id >= 0 && id < VOCAB_SIZE, () => `token id ${id} out of the vocabulary`);
  return bpe().decode(ids);
}

/**
 * The UTF-8 bytes of one token as they are, not as text: a token holding part of a character decodes
 * to U+FFFD on its own, but its bytes combined with its neighbours' give the character (OpenAI's
 * logprobs `bytes`).
 */
export function tokenBytes(id: number): Uint8Array {
  const b = bpe().bytesOfToken(id);
  assert(b !== undefined, () => `token id ${id} out of the vocabulary`);
  return b;
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
