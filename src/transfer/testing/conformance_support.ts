/**
 * What the transfer conformance suite (conformance.ts, conformance_grants.ts, conformance_faults.ts) is
 * built from: engines over fresh slabs, page helpers and assertions, and the shared suite state.
 */
import assert from 'node:assert/strict';
import type { OpLabel, PageAccess } from '../../device/types.ts';
import { RealEnv } from '../../util/env.ts';
import { HandoffError } from '../../util/errors.ts';
import { createTransferEngine } from '../factory.ts';
import type { TransferBackend, TransferEngine, TransferEngineOptions, TransferRange } from '../core/types.ts';

export const LAYOUT = { numSlabs: 2, numBlocks: 16, pageBytes: 1024 };
export const SENTINEL = 0xee;

export interface Node {
  engine: TransferEngine;
  slabs: Uint8Array[];
}

let counter = 0;

/** An engine over fresh slabs; `seed` fills them with a recognisable pattern, null with SENTINEL. */
export async function makeNode(
  backend: TransferBackend,
  seed: number | null,
  opts: Partial<TransferEngineOptions> = {},
): Promise<Node> {
  const layout = opts.layout ?? LAYOUT;
  const buffers = Array.from(
    { length: layout.numSlabs },
    () => new SharedArrayBuffer(layout.numBlocks * layout.pageBytes),
  );
  const slabs = buffers.map((b) => new Uint8Array(b));
  slabs.forEach((s, i) =>
    seed === null ? s.fill(SENTINEL) : s.forEach((_, o) => (s[o] = (seed * 31 + i * 131 + o * 7 + (o >> 10)) & 0xff)),
  );
  const engine = await createTransferEngine({
    backend,
    env: new RealEnv(seed ?? 99),
    engineId: `${backend}-${opts.engineId ?? 'node'}-${++counter}`,
    modelName: 'tiny',
    preset: 'dsv4-mini',
    blockSizes: [16, 16],
    dataFrameBytes: 4096,
    // tcp: every 1 KiB page is received straight into the slab, so the suite runs the direct path.
    recvDirectMinBytes: 1024,
    ...opts,
    layout,
    slabs: buffers,
  });
  return { engine, slabs };
}

/** One range per page per slab: remote block -> local block. */
export function pageRanges(
  pairs: ReadonlyArray<readonly [remote: number, local: number]>,
  pageBytes = LAYOUT.pageBytes,
): TransferRange[] {
  return [0, 1].flatMap((slab) =>
    pairs.map(([r, l]) => ({ slab, localOffset: l * pageBytes, remoteOffset: r * pageBytes, length: pageBytes })),
  );
}

export function page(n: Node, slab: number, block: number): Uint8Array {
  return (n.slabs[slab] as Uint8Array).subarray(block * LAYOUT.pageBytes, (block + 1) * LAYOUT.pageBytes);
}

/** Destination pages equal their source pages; every other destination page still holds SENTINEL. */
export function assertLanded(dst: Node, src: Node, pairs: ReadonlyArray<readonly [src: number, dst: number]>): void {
  const map = new Map(pairs.map(([s, d]) => [d, s]));
  for (let slab = 0; slab < LAYOUT.numSlabs; slab++) {
    for (let b = 0; b < LAYOUT.numBlocks; b++) {
      const from = map.get(b);
      if (from === undefined)
        assert.ok(
          page(dst, slab, b).every((x) => x === SENTINEL),
          `slab ${slab} page ${b} was touched`,
        );
      else assert.deepEqual(page(dst, slab, b), page(src, slab, from), `slab ${slab} page ${b} != source page ${from}`);
    }
  }
}

export function untouched(n: Node): boolean {
  return n.slabs.every((s) => s.every((x) => x === SENTINEL));
}

export const label: OpLabel = { what: 'conformance', requestIds: ['req-1'], step: 3 };

export function readOf(from: Node, transferId: string, token: string, ranges: TransferRange[]) {
  return {
    peerEngineId: from.engine.engineId,
    transferId,
    grantToken: token,
    ranges,
    label,
    footprint: [] as PageAccess[],
  };
}

export async function rejectsWith(p: Promise<unknown>, code: string, message?: RegExp): Promise<HandoffError> {
  const e = await p.then(
    () => assert.fail(`expected ${code}, got success`),
    (err: unknown) => err,
  );
  assert.ok(e instanceof HandoffError, `expected a HandoffError, got ${String(e)}`);
  assert.equal(e.code, code, e.message);
  if (message) assert.match(e.message, message);
  return e;
}

/** The suite's shared state: P, D and E are set by the suite's `before` hook (read them in hooks or tests). */
export interface ConformanceSuite {
  readonly backend: TransferBackend;
  readonly P: Node; // producer: pattern pages, serves READs
  readonly D: Node; // consumer: SENTINEL pages, reads
  readonly E: Node; // another consumer, handshaked with P, never granted anything
  /** A new engine, closed with the suite. */
  make(seed: number | null, opts?: Partial<TransferEngineOptions>): Promise<Node>;
  /** A fresh transfer id. */
  tid(): string;
  /** Fills every page of `n` with SENTINEL. */
  reset(n: Node): void;
}
