/**
 * createTransferEngine: the one way to get a TransferEngine. Validates the registered regions
 * against the layout, then starts the chosen backend (its NIC thread and, for tcp, its listeners).
 */
import { assert } from '../util/assert.ts';
import { InprocTransferEngine } from './inproc/inproc.ts';
import { SimTransferEngine } from './sim/sim.ts';
import { TcpTransferEngine } from './tcp/tcp.ts';
import type { TransferEngine, TransferEngineOptions } from './core/types.ts';

export async function createTransferEngine(opts: TransferEngineOptions): Promise<TransferEngine> {
  const { numSlabs, numBlocks, pageBytes } = opts.layout;
  assert(opts.slabs.length === numSlabs, `expected ${numSlabs} slabs, got ${opts.slabs.length}`);
  for (const [i, s] of opts.slabs.entries()) {
    assert(s instanceof SharedArrayBuffer, `slab ${i} must be a SharedArrayBuffer`);
    assert(
      s.byteLength === numBlocks * pageBytes,
      `slab ${i} is ${s.byteLength} bytes, expected ${numBlocks} x ${pageBytes}`,
    );
  }
  const f = opts.faults ?? {};
  for (const rate of [f.readErrorRate, f.dropNotificationRate])
    assert(rate === undefined || (rate >= 0 && rate <= 1), 'fault rates are in [0, 1]');
  assert(
    f.readDelayMs === undefined || (Number.isFinite(f.readDelayMs) && f.readDelayMs >= 0),
    'readDelayMs must be >= 0',
  );
  assert(
    opts.dataFrameBytes === undefined || (opts.dataFrameBytes >= 4096 && opts.dataFrameBytes <= 16 << 20),
    'dataFrameBytes in [4 KiB, 16 MiB]',
  );
  assert(
    opts.recvDirectMinBytes === undefined ||
      (Number.isSafeInteger(opts.recvDirectMinBytes) && opts.recvDirectMinBytes >= 1),
    'recvDirectMinBytes must be a positive integer',
  );
  assert(
    opts.lanes === undefined || (Number.isInteger(opts.lanes) && opts.lanes >= 1 && opts.lanes <= 16),
    'lanes must be 1..16',
  );
  assert(
    opts.laneMinBytes === undefined || (Number.isSafeInteger(opts.laneMinBytes) && opts.laneMinBytes >= 1),
    'laneMinBytes must be a positive integer',
  );
  switch (opts.backend) {
    case 'inproc':
      return InprocTransferEngine.create(opts);
    case 'tcp':
      return TcpTransferEngine.create(opts);
    case 'sim':
      // The simulator builds its engines on its own fabric; this path is the auto-running one (tests).
      return SimTransferEngine.create(opts);
  }
}
