/**
 * Property over a scheduler with the one-sided consumer connector (WRITE: async loads parked in
 * WAITING_FOR_REMOTE_KVS; READ: synchronous loads), a scripted worker that lands or fails loads after
 * random delays and reports aborted WRITE loads drained, page pressure, aborts and async depth 1/2:
 * no crash, every request ends, a page is never owned by two requests unless shared, and at the end
 * every page is back in the pool.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { DEFAULT_ONE_SIDED_CONFIG } from '../connector/config.ts';
import { OneSidedConnectorScheduler } from '../connector/one_sided_scheduler.ts';
import type { KVTransferParams } from '../connector/params.ts';
import type { OneSidedMetadata } from '../worker/connector_metadata.ts';
import type { SchedulerOutput } from '../worker/scheduler_output.ts';
import { fakeRun, makeRequest, makeScheduler } from './scheduler_testkit.ts';

const GRANT = 'cd'.repeat(16);

test('property: consumer connector states under preemption, aborts and async scheduling', () => {
  fc.assert(
    fc.property(
      fc.constantFrom('read' as const, 'write' as const),
      fc.constantFrom('dsv4-mini' as const, 'llama-mini' as const),
      fc.integer({ min: 8, max: 30 }),
      fc.integer({ min: 1, max: 2 }),
      fc.constantFrom('recompute' as const, 'fail' as const),
      fc.boolean(),
      fc.array(
        fc.record({
          prompt: fc.integer({ min: 1, max: 70 }),
          maxTokens: fc.integer({ min: 1, max: 30 }),
          remote: fc.boolean(),
          shared: fc.boolean(),
          arriveAt: fc.nat(6),
          abortAt: fc.option(fc.integer({ min: 0, max: 15 }), { freq: 3 }),
          delay: fc.nat(3),
          fail: fc.boolean(),
        }),
        { minLength: 1, maxLength: 10 },
      ),
      (mode, preset, numBlocks, depth, policy, caching, specs) => {
        const { scheduler, kv } = makeScheduler({
          preset,
          numBlocks,
          config: {
            maxNumBatchedTokens: 48,
            maxNumSeqs: 4,
            maxModelLen: 120,
            kvLoadFailurePolicy: policy,
            enablePrefixCaching: caching,
          },
          connector: (env, kv) =>
            new OneSidedConnectorScheduler(
              { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer', mode },
              kv.config,
              env,
              { engineId: 'e', host: '127.0.0.1', port: 7 },
              null,
            ),
        });
        const groups = kv.config.groups.length;
        const paramsFor = (i: number, n: number): KVTransferParams => {
          const base = {
            do_remote_prefill: true,
            remote_engine_id: 'p',
            remote_host: '127.0.0.1',
            remote_port: 5,
            transfer_id: `t${i}`,
          };
          if (mode === 'write') return base;
          const pages = Math.ceil(n / 16);
          return {
            ...base,
            remote_block_ids: Array.from({ length: groups }, (_, g) =>
              Array.from({ length: pages }, (_, k) => 1 + g * 100 + k),
            ),
            grant: GRANT,
          };
        };
        // Scripted worker state.
        const loads = new Map<string, { at: number; fail: boolean; blocks: number[] }>();
        const drains = new Map<string, number>();
        const queue: SchedulerOutput[] = [];
        const finished = new Map<string, string>();
        const added = new Set<number>();
        let steps = 0;
        for (; steps < 800; steps++) {
          specs.forEach((s, i) => {
            if (!added.has(i) && s.arriveAt <= steps) {
              added.add(i);
              const r = makeRequest(
                s.prompt,
                s.maxTokens,
                s.remote ? paramsFor(i, s.prompt) : null,
                `r${i}`,
                s.shared ? 1 : 1 + 100 * i,
              );
              try {
                scheduler.addRequest(r);
              } catch {
                finished.set(r.requestId, 'refused');
              }
            }
            if (s.abortAt === steps && scheduler.abortRequest(`r${i}`)) finished.set(`r${i}`, 'abort');
          });
          for (const o of scheduler.drainPendingOutputs())
            if (o.finishReason) finished.set(o.requestId, o.finishReason);
          if (added.size === specs.length && !scheduler.hasWork() && queue.length === 0) break;
          if (queue.length < depth && scheduler.hasWork()) {
            const so = scheduler.schedule();
            queue.push(so);
            const meta = so.kvConnectorMetadata as OneSidedMetadata;
            for (const n of meta.reqsToNotify) {
              const s = specs[Number(n.requestId.slice(1))]!;
              loads.set(n.requestId, {
                at: steps + s.delay,
                fail: s.fail,
                blocks: n.localBlockIds.flatMap((ids) => ids.slice(n.skipBlocks)),
              });
            }
            for (const a of meta.abortedRecvs) {
              loads.delete(a.requestId);
              drains.set(a.requestId, steps + 1);
            }
            continue;
          }
          const so = queue.shift();
          if (!so) continue;
          const meta = so.kvConnectorMetadata as OneSidedMetadata;
          const failedLoadReqIds: string[] = [];
          const invalidBlockIds: number[] = [];
          const finishedRecving: string[] = [];
          const finishedSending: string[] = [];
          for (const r of meta.reqsToRecv) {
            if (r.requestId.startsWith('unused:')) continue;
            const s = specs[Number(r.requestId.slice(1))]!;
            if (s.fail && s.delay === 0) {
              failedLoadReqIds.push(r.requestId);
              invalidBlockIds.push(...r.localBlockIds.flat());
            }
          }
          for (const [id, l] of [...loads]) {
            if (l.at > steps) continue;
            loads.delete(id);
            if (l.fail) (failedLoadReqIds.push(id), invalidBlockIds.push(...l.blocks));
            else finishedRecving.push(id);
          }
          for (const [id, at] of [...drains]) if (at <= steps) (drains.delete(id), finishedSending.push(id));
          const loadErrors = Object.fromEntries(failedLoadReqIds.map((id) => [id, { code: 'TIMEOUT', message: 'x' }]));
          const run = fakeRun(so, { failedLoadReqIds, invalidBlockIds, finishedRecving, finishedSending, loadErrors });
          for (const o of scheduler.updateFromOutput(so, run))
            if (o.finishReason) finished.set(o.requestId, o.finishReason);
          kv.blockPool.verify();
        }
        assert.ok(steps < 800, `every request ends (${scheduler.numWaiting} waiting, ${scheduler.numRunning} running)`);
        specs.forEach((_, i) => assert.ok(finished.has(`r${i}`), `r${i} finished`));
        assert.ok(scheduler.isQuiescent(), 'quiescent');
        assert.equal(kv.getNumFreeBlocks(), numBlocks - 1, 'every page back');
      },
    ),
    { numRuns: Number(process.env.RUNS ?? 200), seed: process.env.SEED ? Number(process.env.SEED) : undefined },
  );
});
