/**
 * A WRITE pair for the engine's tests: decode's real scheduler (with its one-sided connector) and prefill's
 * real worker side, over a transfer engine that records the WRITEs prefill posts. Prefill already holds
 * transfer T (request R, pages [1, 2, 3], final) and waits for decode to say where to write it.
 */
import { makeScheduler } from './scheduler_testkit.ts';
import { emptyOneSidedMetadata, type OneSidedMetadata } from '../worker/connector_metadata.ts';
import { makeEmptySchedulerOutput } from '../worker/scheduler_output.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from '../connector/config.ts';
import { OneSidedConnectorScheduler } from '../connector/one_sided_scheduler.ts';
import { writeProducerRig } from '../connector/write_producer_testkit.ts';

/**
 * Decode's worker side, by hand: remote_blocks to prefill for every notice of the step, then a release for
 * every READ entry (an empty one for a request that will never load); then prefill starts its ready pushes.
 */
export function carryToPrefill(prefill: ReturnType<typeof writeProducerRig>, meta: OneSidedMetadata): void {
  for (const n of meta.reqsToNotify) {
    const payload = { blockIds: n.localBlockIds, skipBlocks: n.skipBlocks, endToken: n.endToken, grant: 'cd' };
    prefill.notify('decode-0', { type: 'remote_blocks', transferId: n.transferId, payload });
  }
  for (const r of meta.reqsToRecv)
    prefill.notify('decode-0', { type: 'release', transferId: r.transferId, payload: {} });
  prefill.worker.saves.startReadySaves();
}

/** Decode's scheduler in WRITE mode, and prefill holding T for it; `params()` names T (a fresh object each call). */
export async function writePairWithHeldTransfer() {
  const { scheduler, kv } = makeScheduler({
    preset: 'llama-mini',
    numBlocks: 64,
    connector: (env, kv) =>
      new OneSidedConnectorScheduler(
        { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer', mode: 'write' },
        kv.config,
        env,
        { engineId: 'decode-0', host: '127.0.0.1', port: 7 },
        null,
      ),
  });
  const prefill = writeProducerRig(kv.config);
  const so1 = makeEmptySchedulerOutput(1);
  so1.kvConnectorMetadata = {
    ...emptyOneSidedMetadata(),
    sendTransfers: { T: 'R' },
    reqsToSave: [{ requestId: 'R', transferId: 'T', localBlockIds: [[1, 2, 3]] }],
  };
  await prefill.worker.preForward(so1);
  const params = () => ({
    do_remote_prefill: true,
    remote_engine_id: 'prefill-0',
    remote_host: '127.0.0.1',
    remote_port: 5,
    transfer_id: 'T',
  });
  return { scheduler, kv, prefill, params };
}
