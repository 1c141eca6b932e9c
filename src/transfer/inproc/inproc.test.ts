/** Runs the transfer conformance suite (conformance.ts) against the inproc backend, plus its own registry rule. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { makeNode, transferConformance } from '../testing/conformance.ts';

transferConformance('inproc');

test('inproc: a second engine with a live engine id is refused with BAD_CONFIG; the id is free again after close', async () => {
  const a = await makeNode('inproc', 1, { engineId: 'dup' });
  const id = a.engine.engineId;
  await assert.rejects(
    makeNode('inproc', 2, { engineId: id }).then(async (n) => (await n.engine.close(), n)),
    (e: Error & { code?: string }) => e.code === 'BAD_CONFIG',
  );
  await a.engine.close();
  const b = await makeNode('inproc', 3, { engineId: id });
  assert.equal(b.engine.engineId, id);
  await b.engine.close();
});
