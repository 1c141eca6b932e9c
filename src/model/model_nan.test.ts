/**
 * The NaN story end to end (DESIGN.md §4): a page that held f32 state of another group, handed to an
 * attention group without zeroing, decodes to NaN/Inf in its unwritten slots, and attention that masks
 * by multiplying with zero keeps it (0 * NaN = NaN). Zeroing the page first restores the fresh output.
 * Also: finite stale bytes past the sequence change nothing, and a Mamba page is never trusted at
 * startPos 0.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isMicroPreset, type ModelPreset } from '../kv/presets.ts';
import { vocabSizeOf } from './config.ts';
import { decodeFp8E4m3 } from '../kv/codecs.ts';
import { createModel } from './model.ts';
import { kvConfigFor, makeSlabs, promptTokens, request } from './fixtures.ts';
import type { ForwardOutput } from './types.ts';

const SEED = 3;
const PROMPT = promptTokens(20, 8); // 2 pages: the second page has slots 4..15 unwritten
const X = 9; // the recycled block

function runNew(preset: ModelPreset, slabs: Uint8Array[], tables: number[][]): ForwardOutput {
  const kv = kvConfigFor(preset);
  const prompt = isMicroPreset(preset) ? promptTokens(20, 8, vocabSizeOf(preset)) : PROMPT;
  return createModel(preset, SEED, kv).forward({ step: 1, requests: [request('new', prompt, 0, tables)] }, slabs)
    .outputs[0] as ForwardOutput;
}

/** Runs an earlier request 'old' whose `oldGroup` page is block X, leaving that group's f32 bytes in X. */
function slabsAfterOldRequest(preset: ModelPreset, oldTables: number[][]): Uint8Array[] {
  const kv = kvConfigFor(preset);
  const slabs = makeSlabs(kv);
  createModel(preset, SEED, kv).forward(
    { step: 0, requests: [request('old', promptTokens(16, 1, vocabSizeOf(preset)), 0, oldTables, { sample: false })] },
    slabs,
  );
  return slabs;
}

function zeroPage(preset: ModelPreset, slabs: Uint8Array[], block: number): void {
  const { pageBytes } = kvConfigFor(preset);
  for (const s of slabs) s.fill(0, block * pageBytes, (block + 1) * pageBytes);
}

test('dsv4-mini: a freed compressor page (f32) reused as an MLA page without zeroing poisons the output; zeroed, it equals a fresh run', () => {
  const fresh = runNew('dsv4-mini', makeSlabs(kvConfigFor('dsv4-mini')), [
    [1, 2],
    [3, 4],
  ]);
  assert.equal(fresh.nanLogits, false);

  const stale = slabsAfterOldRequest('dsv4-mini', [[5], [X]]); // X held compressor states of 'old'
  const { pageBytes } = kvConfigFor('dsv4-mini');
  const staleLatentBytes = [...(stale[0] as Uint8Array).subarray(X * pageBytes + 4 * 80, X * pageBytes + 16 * 80)];
  assert.ok(
    staleLatentBytes.some((b) => Number.isNaN(decodeFp8E4m3(b))),
    'f32 bytes read as fp8 e4m3 include NaN codes',
  );

  const poisoned = runNew(
    'dsv4-mini',
    stale.map((s) => s.slice()),
    [
      [1, X],
      [3, 4],
    ],
  );
  assert.ok(
    poisoned.nanLogits || poisoned.logitsHash !== fresh.logitsHash,
    'without zeroing the output must be corrupted',
  );
  assert.equal(poisoned.nanLogits, true, 'with these bytes the corruption is NaN logits (0 * NaN in the masked slots)');

  zeroPage('dsv4-mini', stale, X);
  const zeroed = runNew('dsv4-mini', stale, [
    [1, X],
    [3, 4],
  ]);
  assert.deepEqual([zeroed.tokenId, zeroed.logitsHash, zeroed.nanLogits], [fresh.tokenId, fresh.logitsHash, false]);
});

test('hybrid-mini: a Mamba state page (f32) reused as a bf16 attention page without zeroing corrupts the output; zeroed, it equals a fresh run', () => {
  const fresh = runNew('hybrid-mini', makeSlabs(kvConfigFor('hybrid-mini')), [[1, 2], [3]]);
  assert.equal(fresh.nanLogits, false);
  const stale = slabsAfterOldRequest('hybrid-mini', [[5], [X]]); // X held the Mamba conv/SSM state of 'old'
  const poisoned = runNew(
    'hybrid-mini',
    stale.map((s) => s.slice()),
    [[1, X], [3]],
  );
  assert.ok(
    poisoned.nanLogits || poisoned.logitsHash !== fresh.logitsHash,
    'without zeroing the output must be corrupted',
  );
  // Low halves of f32 values read as bf16 have random exponents: some are Inf/NaN or overflow a score.
  assert.equal(poisoned.nanLogits, true, 'with these bytes the corruption is NaN logits');
  zeroPage('hybrid-mini', stale, X);
  const zeroed = runNew('hybrid-mini', stale, [[1, X], [3]]);
  assert.deepEqual([zeroed.tokenId, zeroed.logitsHash, zeroed.nanLogits], [fresh.tokenId, fresh.logitsHash, false]);
});

test('hybrid-mini: at startPos 0 a Mamba page full of NaN bytes is ignored (the state starts from zero)', () => {
  const fresh = runNew('hybrid-mini', makeSlabs(kvConfigFor('hybrid-mini')), [[1, 2], [3]]);
  const slabs = makeSlabs(kvConfigFor('hybrid-mini'));
  const { pageBytes } = kvConfigFor('hybrid-mini');
  for (const s of slabs) s.fill(0xff, 3 * pageBytes, 4 * pageBytes);
  const out = runNew('hybrid-mini', slabs, [[1, 2], [3]]);
  assert.deepEqual([out.tokenId, out.logitsHash, out.nanLogits], [fresh.tokenId, fresh.logitsHash, false]);
});

test('llama-mini: masked slots are multiplied, not skipped: NaN in an unwritten K or V slot poisons, finite junk changes nothing', () => {
  const kv = kvConfigFor('llama-mini');
  const fresh = runNew('llama-mini', makeSlabs(kv), [[1, 2]]);
  // Slot 15 of page 2 is past the sequence (positions 16..19 are written). K of slot t at t*64, V at 1024 + t*64.
  const cases: Array<[string, number, number, boolean]> = [
    ['NaN in K', 15 * 64, 0xff, true],
    ['NaN in V', 1024 + 15 * 64, 0xff, true],
    ['finite junk in K and V (bf16 0x3f3f = 0.75)', 15 * 64, 0x3f, false],
  ];
  for (const [what, offset, byte, poisons] of cases) {
    const slabs = makeSlabs(kv);
    for (const s of slabs) {
      s.fill(byte, 2 * kv.pageBytes + offset, 2 * kv.pageBytes + offset + 64);
      if (!poisons) s.fill(byte, 2 * kv.pageBytes + 1024 + 15 * 64, 2 * kv.pageBytes + 1024 + 16 * 64);
    }
    const out = runNew('llama-mini', slabs, [[1, 2]]);
    if (poisons) assert.equal(out.nanLogits, true, what);
    else assert.deepEqual([out.tokenId, out.logitsHash, out.nanLogits], [fresh.tokenId, fresh.logitsHash, false], what);
  }
});

// The micro twin of the seed's model (the simulator's default) keeps the story: same page formats, smaller
// tensors. (hybrid-micro's 160 bytes of Mamba state, read as bf16 K/V past the sequence, are finite junk for
// this prompt, which changes nothing, as the llama-mini test shows; its corruptions are caught by P/D ==
// colocated.)
const MICRO_TABLES: Array<[ModelPreset, number[][]]> = [
  [
    'dsv4-micro',
    [
      [1, X],
      [3, 4],
    ],
  ],
];
for (const [preset, tables] of MICRO_TABLES) {
  test(`${preset}: an f32 state page reused without zeroing corrupts the output; zeroed, it equals a fresh run`, () => {
    const freshTables = tables.map((t) => t.map((b) => (b === X ? 2 : b)));
    const fresh = runNew(preset, makeSlabs(kvConfigFor(preset)), freshTables);
    assert.equal(fresh.nanLogits, false);
    const stale = slabsAfterOldRequest(preset, [[5], [X]]);
    const poisoned = runNew(
      preset,
      stale.map((s) => s.slice()),
      tables.map((t) => [...t]),
    );
    assert.ok(
      poisoned.nanLogits || poisoned.logitsHash !== fresh.logitsHash,
      'without zeroing the output is corrupted',
    );
    assert.equal(poisoned.nanLogits, true, 'stale f32 bytes read as fp8 pages give NaN (0 * NaN in masked slots)');
    zeroPage(preset, stale, X);
    const zeroed = runNew(
      preset,
      stale,
      tables.map((t) => [...t]),
    );
    assert.deepEqual([zeroed.tokenId, zeroed.logitsHash, zeroed.nanLogits], [fresh.tokenId, fresh.logitsHash, false]);
  });
}
