/**
 * drainGrant over real engines (NIC threads; tcp on loopback, and inproc): a 64 MiB READ is being served
 * when the producer revokes its grant and waits for drainGrant, then overwrites every source page, as a
 * freed and reused page would be. Proves that the READ, when it completes, holds only the bytes from before
 * the overwrite: the NIC sent nothing from the pages after the drain settled. (Settling at once, as before
 * the drain existed, lets the overwrite reach the wire on tcp: the bytes Node still held as views of the
 * slab went out changed. On inproc it could land in the middle of the serving NIC thread's copy.)
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { createTransferEngine } from './factory.ts';
import type { TransferBackend, TransferEngine, TransferRange } from './core/types.ts';

const PAGE = 1 << 20;
const PAGES = 33; // page 0 unused, 32 pages of 1 MiB per slab
const env = new RealEnv(7);

async function engine(
  backend: TransferBackend,
  id: string,
  fill: number,
): Promise<{ engine: TransferEngine; slabs: Uint8Array[] }> {
  const buffers = [0, 1].map(() => new SharedArrayBuffer(PAGES * PAGE));
  const slabs = buffers.map((b) => new Uint8Array(b).fill(fill));
  const e = await createTransferEngine({
    backend,
    env,
    engineId: id,
    modelName: 'drain-test',
    preset: 'bench',
    layout: { numSlabs: 2, numBlocks: PAGES, pageBytes: PAGE },
    blockSizes: [16],
    slabs: buffers,
  });
  return { engine: e, slabs };
}

for (const backend of ['tcp', 'inproc'] as const)
  test(`drainGrant, ${backend}: a READ served while the grant ends gets none of the bytes written after the drain`, async () => {
    const [P, D] = await Promise.all([
      engine(backend, `drain-P-${backend}`, 0xaa),
      engine(backend, `drain-D-${backend}`, 0),
    ]);
    try {
      await D.engine.handshake(P.engine.address());
      const blocks = Array.from({ length: PAGES - 1 }, (_, i) => i + 1);
      let served = 0;
      for (let round = 0; round < 3; round++) {
        for (const s of P.slabs) s.fill(0xaa);
        for (const s of D.slabs) s.fill(0);
        const t = `drain-${round}`;
        const { token } = P.engine.issueGrant({
          transferId: t,
          peerEngineId: D.engine.engineId,
          blockIds: blocks,
          ttlMs: 60_000,
        });
        const ranges: TransferRange[] = [0, 1].flatMap((slab) =>
          blocks.map((b) => ({ slab, localOffset: b * PAGE, remoteOffset: b * PAGE, length: PAGE })),
        );
        const h = D.engine.postRead({
          peerEngineId: P.engine.engineId,
          transferId: t,
          grantToken: token,
          ranges,
          label: { what: 'drain' },
          footprint: [],
        });
        await env.sleep(3); // the READ reaches P and its reply is under way (64 MiB take ~20 ms here)
        P.engine.revokeGrant(t);
        await P.engine.drainGrant(t);
        for (const s of P.slabs) s.fill(0x55, PAGE); // the pages are reused
        const ok = await D.engine.wait([h], 10_000).then(
          () => true,
          (e: unknown) => (assert.equal((e as { code?: string }).code, 'GRANT_DENIED'), false),
        );
        if (!ok) continue;
        served++;
        for (const s of D.slabs) {
          const changed = s.subarray(PAGE).findIndex((x) => x !== 0xaa);
          assert.equal(changed, -1, `byte ${changed + PAGE} of a landed READ was written after the drain`);
        }
      }
      assert.ok(served > 0, 'at least one READ was under way when its grant ended');
    } finally {
      await Promise.all([P.engine.close(), D.engine.close()]);
    }
  });
