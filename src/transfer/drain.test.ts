/**
 * drainGrant over real engines (NIC threads; tcp on loopback, and inproc): a 64 MiB READ is being served
 * when the producer revokes its grant and waits for drainGrant, then overwrites every source page, as a
 * freed and reused page would be. Proves that the READ, when it completes, holds only the bytes from before
 * the overwrite: the NIC sent nothing from the pages after the drain settled. (Settling at once, as before
 * the drain existed, lets the overwrite reach the wire on tcp: the bytes Node still held as views of the
 * slab went out changed. On inproc it could land in the middle of the serving NIC thread's copy.)
 *
 * The WRITE twin: a 64 MiB WRITE is landing in the consumer's pages when the consumer revokes its grant
 * (its load timed out, or its request was aborted) and waits for drainGrant, then reuses the pages.
 * Proves that nothing of the WRITE lands after the drain settled, and that the WRITE then fails
 * (GRANT_DENIED) instead of reporting done. (Before the revoke stopped WRITEs under way, the tcp
 * receiver kept landing an announced WRITE's bytes until its last one, over the reused pages.)
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

/**
 * Post a READ (by `poster` from `granter`) or a WRITE (by `poster` into `granter`) of `pages` (every page
 * at the same offset on both sides, both slabs) under a fresh grant of `granter`'s.
 */
function post(kind: 'read' | 'write', poster: TransferEngine, granter: TransferEngine, t: string, pages: number[]) {
  const { token } = granter.issueGrant({
    transferId: t,
    peerEngineId: poster.engineId,
    blockIds: pages,
    ttlMs: 60_000,
  });
  const ranges: TransferRange[] = [0, 1].flatMap((slab) =>
    pages.map((b) => ({ slab, localOffset: b * PAGE, remoteOffset: b * PAGE, length: PAGE })),
  );
  const req = {
    peerEngineId: granter.engineId,
    transferId: t,
    grantToken: token,
    ranges,
    label: { what: 'drain' },
    footprint: [],
  };
  return kind === 'read' ? poster.postRead(req) : poster.postWrite(req);
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
        const h = post('read', D.engine, P.engine, t, blocks);
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

for (const backend of ['tcp', 'inproc'] as const)
  test(`drainGrant, ${backend}: a WRITE landing while its grant ends lands nothing after the drain`, async () => {
    const [P, D] = await Promise.all([
      engine(backend, `drainw-P-${backend}`, 0xaa),
      engine(backend, `drainw-D-${backend}`, 0),
    ]);
    try {
      await P.engine.handshake(D.engine.address());
      const blocks = Array.from({ length: PAGES - 1 }, (_, i) => i + 1);
      await P.engine.wait([post('write', P.engine, D.engine, 'drainw-warm', [1])], 10_000); // the data connection is open
      let cut = 0;
      for (let round = 0; round < 4; round++) {
        for (const s of D.slabs) s.fill(0);
        const t = `drainw-${round}`;
        const h = post('write', P.engine, D.engine, t, blocks);
        await env.sleep(3); // the WRITE reaches D and its bytes are landing (64 MiB take ~20 ms here)
        D.engine.revokeGrant(t);
        await D.engine.drainGrant(t);
        for (const s of D.slabs) s.fill(0x55, PAGE); // the pages are reused
        const done = await P.engine.wait([h], 10_000).then(
          () => true,
          (e: unknown) => (assert.equal((e as { code?: string }).code, 'GRANT_DENIED'), false),
        );
        await env.sleep(20); // anything still on the wire has arrived
        for (const s of D.slabs) {
          const late = s.subarray(PAGE).findIndex((x) => x !== 0x55);
          assert.equal(
            late,
            -1,
            `byte ${late + PAGE} of the WRITE landed after the drain (it ended ${done ? 'done' : 'denied'})`,
          );
        }
        if (!done) cut++;
      }
      if (backend === 'tcp') {
        // inproc lands a WRITE in one copy on D's NIC thread, which the drain waits behind: never cut.
        assert.ok(cut > 0, 'at least one WRITE was under way when its grant ended');
        // Denied mid-payload (cut) or, when the revoke came first, at its announcement (refused).
        const { writesCut, grantsRefused } = D.engine.stats();
        assert.ok(writesCut > 0, 'a WRITE was stopped mid-payload');
        assert.equal(writesCut + grantsRefused, cut, 'each denied WRITE counted once by the receiver');
      }
    } finally {
      await Promise.all([P.engine.close(), D.engine.close()]);
    }
  });
