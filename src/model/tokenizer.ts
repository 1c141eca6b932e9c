/**
 * The GPT-2 byte-level BPE tokenizer (js-tiktoken's offline ranks, our O(n log n) merge in bpe.ts:
 * the same merges as js-tiktoken, without its quadratic time on long words, over GPT-2's pieces: its
 * pattern's `\s` is Unicode White_Space, not JavaScript's), and an incremental
 * detokenizer for streaming: a token can end in the middle of a UTF-8 character, whose bytes are held
 * back until the next token completes it.
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

/**
 * GPT-2's bytes_to_unicode: each byte as a printable character (the printable Latin-1 ones as
 * themselves, the others from U+0100 on), the alphabet its vocabulary's token strings are written in.
 */
const BYTE_CHARS: readonly string[] = (() => {
  const printable = (b: number): boolean => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
  let next = 256;
  return Array.from({ length: 256 }, (_, b) => String.fromCharCode(printable(b) ? b : next++));
})();

/**
 * A token's vocabulary string, as Hugging Face's convert_ids_to_tokens gives it (vLLM's /tokenize
 * token_strs): its bytes in GPT-2's byte alphabet, so " world" reads "Ġworld" and a token holding part
 * of a character still reads as its own bytes.
 */
export function tokenString(id: number): string {
  let s = '';
  for (const b of tokenBytes(id)) s += BYTE_CHARS[b] as string;
  return s;
}

export class IncrementalDecoder {
  // A streaming UTF-8 decoder: the bytes of a character not yet complete wait in it for the next token,
  // and bytes that can no longer form one become U+FFFD at once, so the pieces are exactly the decode of
  // all the tokens. (Holding back token runs whose text ended in U+FFFD, and giving up after a few,
  // cut a character in two after a run of generated "�".) ignoreBOM: a generated U+FEFF is text.
  private readonly utf8 = new TextDecoder('utf-8', { ignoreBOM: true });

  /** The text that token `id` completes: '' while a character is still incomplete. */
  push(id: number): string {
    return this.utf8.decode(tokenBytes(id), { stream: true });
  }

  /** Whatever is held back (at the end of a stream). */
  flush(): string {
    return this.utf8.decode();
  }
}
