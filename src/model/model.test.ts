/**
 * Proves the model's reproducibility contract on all three presets: same inputs -> same tokens and
 * logits bit for bit; chunked prefill == one-chunk prefill; a request's output does not depend on
 * its batch; KV pages copied byte for byte from another instance give the same output as computing
 * locally.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MODEL_PRESETS, type ModelPreset } from '../kv/presets.ts';
import { tokenBytes, type AttentionSpec } from '../kv/spec.ts';
import { createModel } from './model.ts';
import { vocabSizeOf } from './config.ts';
import { generate, kvConfigFor, makeSlabs, PageCounter, promptTokens, request } from './fixtures.ts';
import type { ForwardOutput, SamplingParams } from './types.ts';

const SEED = 11;
const summary = (outs: ForwardOutput[]): Array<[number | null, string | null]> =>
  outs.map((o) => [o.tokenId, o.logitsHash]);

function fresh(preset: ModelPreset, numBlocks = 64) {
  const kv = kvConfigFor(preset, numBlocks);
  return { kv, model: createModel(preset, SEED, kv), slabs: makeSlabs(kv), pages: new PageCounter(kv) };
}

for (const preset of MODEL_PRESETS) {
  test(`${preset}: same prompt twice on fresh slabs gives the same tokens and logit hashes; another seed does not`, () => {
    const prompt = promptTokens(21, 1, vocabSizeOf(preset));
    const a = fresh(preset);
    const b = fresh(preset);
    const outA = generate(a.model, a.slabs, a.pages, prompt, 6);
    const outB = generate(b.model, b.slabs, b.pages, prompt, 6);
    assert.deepEqual(summary(outA), summary(outB));
    assert.ok(outA.every((o) => !o.nanLogits && o.tokenId !== null && /^[0-9a-f]{32}$/.test(o.logitsHash ?? '')));
    assert.ok(new Set(outA.map((o) => o.logitsHash)).size === outA.length, 'each step has its own logits');
    const kv = kvConfigFor(preset);
    const other = generate(createModel(preset, SEED + 1, kv), makeSlabs(kv), new PageCounter(kv), prompt, 6);
    assert.notDeepEqual(summary(other), summary(outA), 'the seed changes the weights, so the output');
  });

  test(`${preset}: a prompt computed in one chunk or in several (unaligned, growing tables) gives the same logits`, () => {
    const prompt = promptTokens(41, 2, vocabSizeOf(preset));
    const one = fresh(preset);
    const many = fresh(preset);
    const outOne = generate(one.model, one.slabs, one.pages, prompt, 4);
    const outMany = generate(many.model, many.slabs, many.pages, prompt, 4, { chunks: [16, 5, 1, 19] });
    assert.deepEqual(summary(outMany), summary(outOne));
  });

  test(`${preset}: a request alone and batched with others (other pages, prefill and decode mixed) gives the same output`, () => {
    const sampling: SamplingParams = { temperature: 0.9, topP: 0.95, seed: 5, outputIndex: 0 };
    const prompt = promptTokens(19, 3, vocabSizeOf(preset));
    const alone = fresh(preset, 96);
    const outAlone = generate(alone.model, alone.slabs, alone.pages, prompt, 3, { sampling });

    const b = fresh(preset, 96);
    const tables: number[][] = [];
    const other: number[][] = [];
    const third: number[][] = [];
    b.pages.cover(other, 40);
    b.pages.cover(tables, prompt.length);
    // Neighbour 'x' prefills first so it can decode alongside.
    b.model.forward({ step: 0, requests: [request('x', promptTokens(30, 9, vocabSizeOf(preset)), 0, other)] }, b.slabs);
    const outBatched: ForwardOutput[] = [];
    let res = b.model.forward(
      {
        step: 1,
        requests: [
          request('x', [7], 30, other),
          request('r', prompt, 0, tables, { sampling }),
          request('y', promptTokens(9, 4, vocabSizeOf(preset)), 0, b.pages.cover(third, 9), {
            sampling: { ...sampling, seed: 99 },
          }),
        ],
      },
      b.slabs,
    );
    outBatched.push(res.outputs[1] as ForwardOutput);
    for (let s = 1; s <= 3; s++) {
      const pos = prompt.length + s - 1;
      b.pages.cover(tables, pos + 1);
      const me = request('r', [outBatched[s - 1]?.tokenId as number], pos, tables, {
        sampling: { ...sampling, outputIndex: s },
      });
      const reqs =
        s % 2 === 0 ? [me, request('x', [8 + s], 30 + s, other)] : [request('x', [8 + s], 30 + s, other), me];
      res = b.model.forward({ step: 1 + s, requests: reqs }, b.slabs);
      outBatched.push(res.outputs.find((o) => o.requestId === 'r') as ForwardOutput);
    }
    assert.deepEqual(summary(outBatched), summary(outAlone));
  });

  test(`${preset}: KV pages copied byte for byte from another instance (other block ids) decode to the same output`, () => {
    const prompt = promptTokens(37, 5, vocabSizeOf(preset));
    const n = prompt.length;
    const kv = kvConfigFor(preset);
    const hasMamba = kv.hasMambaLayers;
    // Reference: the whole prompt computed locally in instance A.
    const ref = fresh(preset);
    const refOut = generate(ref.model, ref.slabs, ref.pages, prompt, 3);

    // Prefill side (instance P). Attention-only models prefill all N tokens; with Mamba, P computes
    // N-1 tokens (vLLM's _truncate_mamba_request_for_prefill) so D's recompute of token N-1 starts
    // from the recurrent state after N-1 tokens.
    const p = fresh(preset);
    const pTables = p.pages.cover([], n);
    const prefillLen = hasMamba ? n - 1 : n;
    const pOut = p.model.forward(
      { step: 0, requests: [request('r', prompt.slice(0, prefillLen), 0, pTables, { sample: !hasMamba })] },
      p.slabs,
    );

    // Decode side (instance D): different block ids, pages copied byte for byte, in every slab.
    const d = { model: createModel(preset, SEED, kv), slabs: makeSlabs(kv), pages: new PageCounter(kv, 20) };
    d.slabs.forEach((s, i) => s.fill(0xa5 + i)); // pages not copied hold junk; the copied ones must be all that matters
    const dTables = d.pages.cover([], n);
    for (let g = 0; g < kv.groups.length; g++) {
      for (let slab = 0; slab < (kv.groups[g]?.layerNames.length ?? 0); slab++) {
        const src = p.slabs[slab] as Uint8Array;
        (pTables[g] as number[]).forEach((pb, i) => {
          const db = (dTables[g] as number[])[i] as number;
          (d.slabs[slab] as Uint8Array).set(
            src.subarray(pb * kv.pageBytes, (pb + 1) * kv.pageBytes),
            db * kv.pageBytes,
          );
        });
      }
    }
    const outs: ForwardOutput[] = [];
    let pos = n - 1;
    let tokens = [prompt[n - 1] as number];
    for (let s = 0; s < 3; s++) {
      d.pages.cover(dTables, pos + tokens.length);
      const r = request('r', tokens, pos, dTables, { sampling: { temperature: 0, seed: 0, outputIndex: s } });
      const o = d.model.forward({ step: s, requests: [r] }, d.slabs).outputs[0] as ForwardOutput;
      outs.push(o);
      pos += tokens.length;
      tokens = [o.tokenId as number];
    }
    assert.deepEqual(summary(outs), summary(refOut.slice(0, 3)));
    if (!hasMamba)
      assert.deepEqual(
        summary(outs.slice(0, 1)),
        summary(pOut.outputs),
        'D recomputing token N-1 samples what P sampled',
      );
  });
}

test('dsv4-mini: both cache groups influence the output (MLA latent and compressor state)', () => {
  const prompt = promptTokens(20, 6);
  const base = fresh('dsv4-mini');
  const tables = base.pages.cover([], prompt.length);
  base.model.forward(
    { step: 0, requests: [request('r', prompt.slice(0, 19), 0, tables, { sample: false })] },
    base.slabs,
  );
  const snapshot = base.slabs.map((s) => s.slice());
  const run = (): string | null =>
    base.model.forward({ step: 1, requests: [request('r', prompt.slice(19), 19, tables)] }, base.slabs).outputs[0]
      ?.logitsHash ?? null;
  const restore = (): void => base.slabs.forEach((s, i) => s.set(snapshot[i] as Uint8Array));
  const ref = run();
  for (const group of [0, 1]) {
    restore();
    // Perturb token 3's slot of layer 0 in this group's first page (a finite change, no NaN).
    const page = (tables[group] as number[])[0] as number;
    const spec = base.kv.groups[group]?.spec as AttentionSpec;
    const at = page * base.kv.pageBytes + 3 * tokenBytes(spec) + (group === 0 ? 5 : 4);
    const slab0 = base.slabs[0] as Uint8Array;
    slab0[at] = (slab0[at] as number) ^ 0x01;
    assert.notEqual(run(), ref, `a change in group ${group}'s page must change the logits`);
  }
  restore();
  assert.equal(run(), ref);
});
