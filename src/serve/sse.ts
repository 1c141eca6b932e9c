/**
 * Server-sent events as OpenAI streams them: one `data: <json>\n\n` per chunk, then `data: [DONE]\n\n`.
 * `SseParser` is the client side (bench, tests, proxy checks): it accepts the stream in arbitrary
 * pieces and yields complete `data:` payloads.
 */
import { HandoffError } from '../util/errors.ts';

export const SSE_DONE = 'data: [DONE]\n\n';
export const SSE_HEADERS = {
  'content-type': 'text/event-stream',
  'cache-control': 'no-cache',
  connection: 'keep-alive',
} as const;

export function sseEvent(payload: unknown): string {
  return `data: ${JSON.stringify(payload)}\n\n`;
}

/** Bound on one event (a chunk is one token; anything this large is not from our servers). */
const MAX_EVENT_CHARS = 1 << 20;

export class SseParser {
  private pending = '';

  /** Feed text; returns the `data:` payloads of every event completed by it ('[DONE]' included). */
  push(text: string): string[] {
    this.pending += text;
    const out: string[] = [];
    for (;;) {
      const end = this.pending.search(/\r?\n\r?\n/);
      if (end < 0) break;
      const block = this.pending.slice(0, end);
      const sep = /\r?\n\r?\n/.exec(this.pending.slice(end));
      this.pending = this.pending.slice(end + (sep?.[0].length ?? 2));
      const data = block
        .split(/\r?\n/)
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).replace(/^ /, ''))
        .join('\n');
      if (data.length > 0) out.push(data);
    }
    if (this.pending.length > MAX_EVENT_CHARS)
      throw new HandoffError('PEER_INCOMPATIBLE', `SSE event longer than ${MAX_EVENT_CHARS} characters`);
    return out;
  }
}
