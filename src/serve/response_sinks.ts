/**
 * Where a Generation's events go: one JSON body (non-streaming) or an SSE stream. The stream sends its
 * headers only with the first token, so a request that fails before producing anything (bad transfer
 * params found at admission, a failed KV load) still gets a real HTTP status and error JSON; after
 * that an error becomes a `data: {"error": …}` event followed by `[DONE]`.
 *
 * A finished answer its client takes no byte of for ANSWER_STALL_MS is dropped with its connection
 * (withStallBound): one pipelined behind a response that never ends, or for a client that stopped
 * reading, stayed live for good and held every drain for its whole timeout.
 */
import type { ServerResponse } from 'node:http';
import type { Env, TimerHandle } from '../util/env.ts';
import type { HandoffError } from '../util/errors.ts';
import type { GenerationSink } from './generation.ts';
import { sendJson } from './http_io.ts';
import {
  appendPiece,
  emptyPiece,
  fullResponse,
  roleChunk,
  streamChunk,
  usageChunk,
  type ResponseContext,
} from './openai_response.ts';
import { SSE_DONE, SSE_HEADERS, sseEvent } from './sse.ts';

/** Called once per request with the error (metrics), before it is written. */
export type ErrorHook = (e: HandoffError) => void;

export function jsonSink(
  res: ServerResponse,
  ctx: ResponseContext,
  headers: Record<string, string>,
  onError: ErrorHook,
): GenerationSink {
  const all = emptyPiece();
  return {
    onPiece: (p) => appendPiece(all, p),
    onFinish: (f) => {
      appendPiece(all, f.piece);
      sendJson(res, 200, fullResponse(ctx, all, f.finishReason, f.usage, f.kvTransferParams, f.stopReason), headers);
    },
    onError: (e) => {
      onError(e);
      sendJson(res, e.httpStatus, e.toJSON(), headers);
    },
  };
}

export function streamSink(
  res: ServerResponse,
  ctx: ResponseContext,
  includeUsage: boolean,
  headers: Record<string, string>,
  onError: ErrorHook,
): GenerationSink {
  let first = true;
  const open = (): void => {
    if (res.headersSent) return;
    res.writeHead(200, { ...SSE_HEADERS, ...headers });
    if (ctx.kind !== 'chat') return;
    res.write(sseEvent(roleChunk(ctx)));
    first = false;
  };
  return {
    onPiece: (p) => {
      open();
      res.write(sseEvent(streamChunk(ctx, p, null, first)));
      first = false;
    },
    onFinish: (f) => {
      open();
      res.write(sseEvent(streamChunk(ctx, f.piece, f.finishReason, first, f.kvTransferParams, f.stopReason)));
      if (includeUsage) res.write(sseEvent(usageChunk(ctx, f.usage)));
      res.end(SSE_DONE);
    },
    onError: (e) => {
      onError(e);
      if (!res.headersSent) {
        sendJson(res, e.httpStatus, e.toJSON(), headers);
        return;
      }
      res.write(sseEvent(e.toJSON()));
      res.end(SSE_DONE);
    },
  };
}

/** A finished answer its client takes no byte of for this long is dropped (its connection closed). */
export const ANSWER_STALL_MS = 30_000;

/**
 * Call `gone` once, when the response closes or its connection does (at once if either already did). A
 * response pipelined behind another on a keep-alive connection gets the socket only once that one ended:
 * if the connection closes first, the response's own 'close' never comes.
 */
export function onResponseGone(res: ServerResponse, gone: () => void): void {
  const conn = res.req.socket;
  // Closed before anyone listened (a pipelined request whose client left while it was prepared): no
  // event will come.
  if (res.closed || conn.destroyed) return gone();
  let ended = false;
  const end = (): void => {
    if (ended) return;
    ended = true;
    conn.off('close', end);
    gone();
  };
  res.once('close', end);
  conn.once('close', end);
}

/** Responses dropIfUnsent closed with part of their answer still queued: their client never got it. */
export const droppedUnsent = new WeakSet<ServerResponse>();

/**
 * Once `res` was ended: drop its connection if its client takes no byte of what is still queued for
 * `stallMs` (a response that never flushes held its connection and its bytes for good).
 */
export function dropIfUnsent(res: ServerResponse, stallMs: number, env: Env): void {
  let left = res.writableLength;
  let timer: TimerHandle | null = null;
  const check = (): void => {
    const conn = res.req.socket;
    if (res.writableFinished || res.destroyed || conn.destroyed) return;
    if (res.writableLength < left) {
      left = res.writableLength; // it took some: wait again
      timer = env.setTimer(stallMs, check);
      return;
    }
    droppedUnsent.add(res);
    conn.destroy(); // not res.destroy(): a response still queued on the connection has no socket to end
  };
  if (res.writableFinished || res.destroyed) return;
  timer = env.setTimer(stallMs, check);
  onResponseGone(res, () => timer?.cancel());
}

/** `sink`, and once it wrote the end of the answer: drop the answer if its client takes none of it for `stallMs`. */
export function withStallBound(sink: GenerationSink, res: ServerResponse, stallMs: number, env: Env): GenerationSink {
  const answered = (): void => dropIfUnsent(res, stallMs, env);
  return {
    onPiece: (p) => sink.onPiece(p),
    onFinish: (f) => {
      sink.onFinish(f);
      answered();
    },
    onError: (e) => {
      sink.onError(e);
      answered();
    },
  };
}
