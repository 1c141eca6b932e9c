/**
 * Engine metadata exchanged at handshake, and the compatibility rule: two engines may move KV only when
 * the same tokens mean the same bytes on both sides (same model, preset, weight seed, tensor parallel size,
 * slab count and cache specs).
 * numBlocks may differ: each side checks offsets against its own.
 *
 * Geometry: with page formats (kv/token_map.ts; what every engine built from a KV config sends) the
 * block sizes and page sizes may differ, as long as every token group can be mapped (one side's block
 * size a multiple of the other's: a page of one holds whole pages of the other) and each side's pages
 * hold its block size; a state group (Mamba) moves whole at any pairing. Without page formats (a bare
 * engine) pages are copied whole, so page size and block sizes must be equal.
 *
 * Tensor parallel degrees may differ (kv/tp_map.ts maps a rank's share of the heads between them) when
 * both sides say how each group splits over ranks (`tpSplits`: its KV heads, compressor values or Mamba
 * channels; 0 for a replicated cache) and the finer degree lcm(P, D) divides every group's split: then
 * the whole (TP=1) formats must agree (a split group's format is its rank format times the degree), and
 * the hash covers what every rank shares (layer slabs per rank, whole formats, whole specs). Otherwise the
 * refusal names both degrees.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { assert } from '../../util/assert.ts';
import { HandoffError } from '../../util/errors.ts';
import { wholeSpec, type KVCacheConfig, type KVCacheSpec } from '../../kv/spec.ts';
import { formatPageBytes, pageFormatOf, type PageFormat } from '../../kv/token_map.ts';
import type { EngineMetadata, SlabLayout } from './types.ts';

export interface MetadataInput {
  engineId: string;
  modelName: string;
  preset: string;
  layout: SlabLayout;
  blockSizes: number[];
  /** Per group (same order as blockSizes): the page format of a rank's page, independent of the block size. */
  pageFormats?: PageFormat[];
  /** Per group: the units its whole cache splits into over ranks (0: replicated); needs pageFormats. */
  tpSplits?: number[];
  cacheHash?: string;
  /** The seed the model's weights are drawn from: KV computed by other weights means other tokens. */
  weightSeed?: number;
}

/** A rank's page format at `tp` ranks as the whole (TP=1) format: a split group's bytes scale with its share. */
export function wholeFormat(format: PageFormat, tp: number, split: number): PageFormat {
  if (split === 0 || tp === 1) return format;
  return format.kind === 'state'
    ? { kind: 'state', stateBytes: format.stateBytes * tp }
    : { kind: 'tokens', regionTokenBytes: format.regionTokenBytes.map((b) => b * tp) };
}

/** The whole formats of an engine's groups, or the rank formats when it did not say how they split. */
function wholeFormats(
  m: Pick<MetadataInput, 'pageFormats' | 'tpSplits'> & { layout: { tensorParallelSize?: number } },
): PageFormat[] | null {
  if (m.pageFormats === undefined) return null;
  const tp = m.layout.tensorParallelSize ?? 1;
  return m.pageFormats.map((f, g) => (m.tpSplits === undefined ? f : wholeFormat(f, tp, m.tpSplits[g] ?? 0)));
}

/** How a whole spec splits over ranks (spec.ts rankSpec): 0 for the replicated MLA latent. */
function tpSplitOf(spec: KVCacheSpec): number {
  switch (spec.type) {
    case 'full_attention':
      return spec.numKvHeads;
    case 'compressor':
      return spec.stateDim;
    case 'mamba':
      return spec.convDim;
    case 'mla':
      return 0;
  }
}

/** Over what must be equal on both sides; geometry (page size, block sizes) is checked by compatibilityProblem. */
export function compatibilityHash(m: Omit<MetadataInput, 'engineId'>): string {
  const tp = m.layout.tensorParallelSize ?? 1;
  // Whatever the degree, a rank-independent view: layer slabs per rank, whole formats and splits.
  const canonical = JSON.stringify([
    'handoff-kv-v3',
    m.modelName,
    m.preset,
    m.layout.numSlabs / tp,
    wholeFormats(m),
    m.tpSplits ?? null,
    m.cacheHash ?? '',
    ...(m.weightSeed === undefined ? [] : [`seed${m.weightSeed}`]),
    // Without splits a peer of another degree cannot be mapped: its degree stays part of what must agree.
    ...(m.tpSplits === undefined && tp !== 1 ? [`tp${tp}`] : []),
  ]);
  return createHash('sha256').update(canonical).digest('hex');
}

export function buildMetadata(m: MetadataInput): EngineMetadata {
  assert(m.engineId.length > 0 && m.engineId.length <= 256, 'engineId must be 1..256 characters');
  assert(
    m.blockSizes.length > 0 && m.blockSizes.every((b) => Number.isInteger(b) && b > 0),
    'blockSizes must be positive integers',
  );
  const { numSlabs, numBlocks, pageBytes } = m.layout;
  const tensorParallelSize = m.layout.tensorParallelSize ?? 1;
  assert(
    [numSlabs, numBlocks, pageBytes, tensorParallelSize].every((x) => Number.isInteger(x) && x > 0),
    'layout sizes must be positive integers',
  );
  assert(numSlabs % tensorParallelSize === 0, 'every tensor parallel rank registers the same number of slabs');
  assert(
    m.pageFormats === undefined || m.pageFormats.length === m.blockSizes.length,
    'one page format per block size (group)',
  );
  assert(
    m.tpSplits === undefined || (m.pageFormats !== undefined && m.tpSplits.length === m.blockSizes.length),
    'one tensor parallel split per group, with page formats',
  );
  const layout = { numSlabs, numBlocks, pageBytes, tensorParallelSize, blockSizes: [...m.blockSizes] };
  const formats = m.pageFormats === undefined ? {} : { pageFormats: structuredClone(m.pageFormats) };
  const splits = m.tpSplits === undefined ? {} : { tpSplits: [...m.tpSplits] };
  return {
    engineId: m.engineId,
    modelName: m.modelName,
    preset: m.preset,
    ...(m.weightSeed === undefined ? {} : { weightSeed: m.weightSeed }),
    layout: { ...layout, ...formats, ...splits },
    compatHash: compatibilityHash(m),
  };
}

/**
 * The layout part of the options, derived from a KV cache config: page formats (a rank's), how each group
 * splits over ranks, and a hash of the whole (TP=1) group specs without their block size and padding
 * (those are geometry, which may differ between peers, as may the degree).
 */
export function layoutFromKvConfig(config: KVCacheConfig): {
  layout: SlabLayout;
  blockSizes: number[];
  pageFormats: PageFormat[];
  tpSplits: number[];
  cacheHash: string;
} {
  const wholes = config.groups.map((g) => wholeSpec(g.spec, config.tensorParallelSize));
  const specs = JSON.stringify(
    wholes.map((spec, i) => {
      const { blockSize: _bs, ...rest } = spec;
      return [config.groups[i]?.layerNames, rest];
    }),
  );
  return {
    layout: {
      numSlabs: config.numSlabs,
      numBlocks: config.numBlocks,
      pageBytes: config.pageBytes,
      tensorParallelSize: config.tensorParallelSize,
    },
    blockSizes: config.groups.map((g) => g.spec.blockSize),
    pageFormats: config.groups.map((g) => pageFormatOf(g.spec)),
    tpSplits: wholes.map(tpSplitOf),
    cacheHash: createHash('sha256').update(specs).digest('hex'),
  };
}

/** Why the two geometries cannot exchange KV, as parts of the refusal; [] when they can. */
function geometryProblems(local: EngineMetadata, remote: EngineMetadata): string[] {
  const [l, r] = [local.layout, remote.layout];
  const sizes = (b: number[]): string => `[${b.join(',')}]`;
  if (l.pageFormats === undefined || r.pageFormats === undefined) {
    // Without page formats a page can only be copied whole: same page size, same block sizes.
    const diffs: string[] = [];
    if (r.pageBytes !== l.pageBytes) diffs.push(`pageBytes ${r.pageBytes} != ${l.pageBytes}`);
    if (sizes(r.blockSizes) !== sizes(l.blockSizes))
      diffs.push(`blockSizes ${sizes(r.blockSizes)} != ${sizes(l.blockSizes)}`);
    return diffs;
  }
  const whole = (x: typeof r) => JSON.stringify(wholeFormats({ ...x, layout: x }));
  if (whole(r) !== whole(l)) return ['page formats differ'];
  if (r.blockSizes.length !== r.pageFormats.length || l.blockSizes.length !== l.pageFormats.length)
    return [`blockSizes ${sizes(r.blockSizes)} and ${sizes(l.blockSizes)} do not name one size per group`];
  const diffs: string[] = [];
  r.pageFormats.forEach((f, g) => {
    const [rb, lb] = [r.blockSizes[g] as number, l.blockSizes[g] as number];
    if (f.kind === 'tokens' && Math.max(rb, lb) % Math.min(rb, lb) !== 0)
      diffs.push(
        `blockSizes ${sizes(r.blockSizes)} and ${sizes(l.blockSizes)} cannot be mapped: group ${g} has pages of ${rb} and ${lb} tokens, and one must be a multiple of the other`,
      );
    if (formatPageBytes(f, rb) > r.pageBytes)
      diffs.push(`group ${g}: ${rb} tokens need ${formatPageBytes(f, rb)} bytes, more than a page of ${r.pageBytes}`);
  });
  return diffs;
}

/** Why two degrees cannot be mapped (kv/tp_map.ts: through lcm(P, D) fine slices of every split), or null. */
function tpProblem(local: EngineMetadata, remote: EngineMetadata): string | null {
  const [l, r] = [local.layout, remote.layout];
  if (
    l.tpSplits === undefined ||
    r.tpSplits === undefined ||
    l.pageFormats === undefined ||
    r.pageFormats === undefined
  )
    return 'a peer without page formats and tensor parallel splits copies pages slab to slab: use equal degrees';
  if (JSON.stringify(l.tpSplits) !== JSON.stringify(r.tpSplits))
    return `the caches split differently over ranks ([${r.tpSplits.join(',')}] and [${l.tpSplits.join(',')}])`;
  const gcd = (a: number, b: number): number => (b === 0 ? a : gcd(b, a % b));
  const fine = (l.tensorParallelSize * r.tensorParallelSize) / gcd(l.tensorParallelSize, r.tensorParallelSize);
  const g = l.tpSplits.findIndex((n) => n > 0 && n % fine !== 0);
  if (g >= 0)
    return `group ${g} splits into ${l.tpSplits[g]} (heads or channels), which ${fine} slices (lcm of the degrees) do not divide`;
  return null;
}

/** A human-readable reason why `remote` cannot exchange pages with `local`, or null. */
export function compatibilityProblem(local: EngineMetadata, remote: EngineMetadata): string | null {
  const [theirs, ours] = [remote.layout.tensorParallelSize, local.layout.tensorParallelSize];
  const tp = theirs === ours ? null : tpProblem(local, remote);
  if (tp !== null)
    return (
      `peer ${remote.engineId} is incompatible: tensor parallel sizes ${theirs} and ${ours} cannot be mapped ` +
      `(peer ${remote.engineId} runs TP=${theirs}, engine ${local.engineId} TP=${ours}): ${tp}`
    );
  const diffs: string[] = [];
  if (remote.engineId === local.engineId) diffs.push(`same engine id ${local.engineId}`);
  if (remote.modelName !== local.modelName) diffs.push(`model ${remote.modelName} != ${local.modelName}`);
  if (remote.preset !== local.preset) diffs.push(`preset ${remote.preset} != ${local.preset}`);
  if (remote.weightSeed !== local.weightSeed)
    diffs.push(`weight seed ${remote.weightSeed ?? 'unknown'} != ${local.weightSeed ?? 'unknown'} (--seed)`);
  const [rs, ls] = [remote.layout.numSlabs / theirs, local.layout.numSlabs / ours];
  if (rs !== ls)
    diffs.push(
      theirs === ours
        ? `numSlabs ${remote.layout.numSlabs} != ${local.layout.numSlabs}`
        : `layer slabs per rank ${rs} != ${ls}`,
    );
  diffs.push(...geometryProblems(local, remote));
  if (diffs.length === 0 && remote.compatHash !== local.compatHash)
    diffs.push('KV cache specs differ (compatibility hash mismatch)');
  return diffs.length === 0 ? null : `peer ${remote.engineId} is incompatible: ${diffs.join('; ')}`;
}

function sameSecret(a: string | undefined, b: string | undefined): boolean {
  if (a === undefined || b === undefined) return a === b;
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

/**
 * A handshake between two engines of one process (inproc, sim): the side-channel secrets must match
 * (compared in constant time) and each side must accept the other's metadata. Null when admitted;
 * otherwise the error the initiator throws (and the remote counts a refused handshake).
 */
export function localHandshakeRefusal(
  local: { secret: string | undefined; metadata: EngineMetadata },
  remote: { secret: string | undefined; metadata: EngineMetadata },
): HandoffError | null {
  const remoteId = remote.metadata.engineId;
  if (!sameSecret(local.secret, remote.secret))
    return new HandoffError('UNAUTHORIZED', `handshake with ${remoteId} refused: side channel secret mismatch`);
  const problem =
    compatibilityProblem(local.metadata, remote.metadata) ?? compatibilityProblem(remote.metadata, local.metadata);
  return problem === null ? null : new HandoffError('PEER_INCOMPATIBLE', problem);
}
