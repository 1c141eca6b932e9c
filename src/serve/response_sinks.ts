/**
 * Where a Generation's events go: one JSON body (non-streaming) or an SSE stream. The stream sends its
 * headers only with the first token, so a request that fails before producing anything (bad transfer
 * params found at admission, a failed KV load) still gets a real HTTP status and error JSON; after
 * that an error becomes a `data: {"error": …}` event followed by `[DONE]`.
 */
import type { ServerResponse } from 'node:http';
import type { HandoffError } from '../util/errors.ts';
import type { GenerationSink } from './generation.ts';
import { sendJson } from './http_io.ts';
import {
  appendPiece,
  emptyPiece,
  fullResponse,
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
    if (!res.headersSent) res.writeHead(200, { ...SSE_HEADERS, ...headers });
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
