/**
 * The proxy's answer to its client: decode's response relayed unchanged (status, content type, bytes).
 * JSON is read whole first, so a decode that dies mid-answer fails the attempt before anything was sent
 * (the proxy may retry it elsewhere); a stream is relayed chunk by chunk, and one that breaks after it
 * started ends with an error event in its own format.
 */
import { once } from 'node:events';
import type { ServerResponse } from 'node:http';
import { rethrowIfAssertion } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import { SSE_DONE, sseEvent } from './sse.ts';

/** Stream the decode response back unchanged (status, content type, bytes). */
export async function relay(r: Response, res: ServerResponse, signal: AbortSignal): Promise<void> {
  const contentType = r.headers.get('content-type') ?? 'application/json';
  if (!contentType.startsWith('text/event-stream') && r.body) {
    // A JSON answer is read whole before anything is sent: a decode that dies mid-answer (a broken
    // connection, no details) fails this attempt, which may then be retried elsewhere.
    let text: string;
    try {
      text = await r.text();
    } catch (e) {
      rethrowIfAssertion(e);
      if (signal.aborted) throw new HandoffError('REQUEST_ABORTED', 'the client went away');
      throw new HandoffError('PEER_UNAVAILABLE', `decode instance failed mid-response: ${(e as Error).message}`);
    }
    res.writeHead(r.status, { 'content-type': contentType, 'cache-control': 'no-cache' });
    res.end(text);
    return;
  }
  res.writeHead(r.status, { 'content-type': contentType, 'cache-control': 'no-cache' });
  if (!r.body) {
    res.end();
    return;
  }
  try {
    for await (const chunk of r.body) {
      if (!res.write(chunk)) await once(res, 'drain', { signal });
    }
    res.end();
  } catch (e) {
    rethrowIfAssertion(e);
    if (signal.aborted) throw new HandoffError('REQUEST_ABORTED', 'the client went away');
    // The decode instance died mid-response: say so in the stream's own format, then end it.
    const err = new HandoffError('PEER_UNAVAILABLE', `decode instance failed mid-response: ${(e as Error).message}`);
    if (contentType.startsWith('text/event-stream')) res.end(sseEvent(err.toJSON()) + SSE_DONE);
    else res.destroy();
  }
}
