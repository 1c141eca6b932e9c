/**
 * tcp: aborting a WRITE in flight (nic_tcp_client.ts cancelWrite) notes its id to drop the one answer the
 * server still owes; the server answers a cancelled WRITE it had not answered yet (nic_tcp_conn.ts), so
 * the note goes and the connection lives on. Before, the server forgot the WRITE silently and the note
 * stayed for the connection's life: one id per aborted WRITE, without end over a long run. White box: the
 * client's per-connection notes are private.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { TcpPlane } from './nic_tcp.ts';
import { packRanges } from '../core/ranges.ts';
import type { NicContext } from '../nic/nic_worker.ts';
import type { ErrorCode } from '../../util/errors.ts';
import { BLOCKS, PAGE, planeContext } from './relay_testkit.ts';

function ctx(engineId: string, completions: Map<number, ErrorCode | null>): NicContext {
  return planeContext(engineId, completions);
}

test('tcp: aborted in-flight WRITEs leave no note behind, and the connection stays up', async () => {
  const done = new Map<number, ErrorCode | null>();
  const server = new TcpPlane(ctx('P', new Map()), '127.0.0.1', 0);
  const port = await server.listen();
  const client = new TcpPlane(ctx('D', done), '127.0.0.1', 0);
  await client.listen();
  client.setPeer('P', { host: '127.0.0.1', port, session: 'a'.repeat(32) });
  try {
    const N = 20;
    for (let wrId = 1; wrId <= N; wrId++) {
      client.post({
        wrId,
        slot: 0,
        kind: 'write',
        peerEngineId: 'P',
        transferId: `t${wrId}`,
        grantToken: 'b'.repeat(32),
        ranges: packRanges([{ slab: 0, localOffset: 0, remoteOffset: 0, length: BLOCKS * PAGE }]),
        delayMs: 0,
        failWith: null,
      });
      await new Promise<void>((r) => client.abort(wrId, r));
    }
    const conns =
      (client as unknown as { clients: Map<string, Array<{ ignore: Set<number> }>> }).clients.get('P') ?? [];
    const noted = (): number => conns.reduce((n, c) => n + c.ignore.size, 0);
    // The server reads through what was already sent of each WRITE before its cancel (seconds on a loaded
    // machine); each cancel's answer then removes its note. Without the answers the notes never go.
    for (let k = 0; k < 200 && noted() > 0; k++) await new Promise((r) => setTimeout(r, 50));
    const ignored = noted();
    assert.ok(conns.length > 0, 'the connection was not dropped');
    assert.equal(ignored, 0, `ids still noted after ${N} aborted WRITEs`);
  } finally {
    await Promise.all([client.close(), server.close()]);
  }
});
