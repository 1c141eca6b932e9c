/**
 * Engine metadata exchanged at handshake, and the compatibility rule: two engines may move KV only when
 * the same tokens mean the same bytes on both sides (same model, preset, tensor parallel size, slab count
 * and cache specs).
 * numBlocks may differ: each side checks offsets against its own.
 *
 * Geometry: with page formats (kv/token_map.ts; what every engine built from a KV config sends) the
 * block sizes and page sizes may differ, as long as every token group can be mapped (one side's block
 * size a multiple of the other's: a page of one holds whole pages of the other) and each side's pages
 * hold its block size; a state group (Mamba) moves whole at any pairing. Without page formats (a bare
 * engine) pages are copied whole, so page size and block sizes must be equal.
 *
 * Different TP degrees are refused first and by name: a rank's page holds its share of the heads, so it
 * needs a mapping (kv/tp_layout.ts) that slab-to-slab copies do not do (yet).
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { assert } from '../../util/assert.ts';
import { HandoffError } from '../../util/errors.ts';
import type { KVCacheConfig } from '../../kv/spec.ts';
import { formatPageBytes, pageFormatOf, type PageFormat } from '../../kv/token_map.ts';
import type { EngineMetadata, SlabLayout } from './types.ts';

export interface MetadataInput {
  engineId: string;
  modelName: string;
  preset: string;
  layout: SlabLayout;
  blockSizes: number[];
  /** Per group (same order as blockSizes): the page format, independent of the block size. */
  pageFormats?: PageFormat[];
  cacheHash?: string;
}

/** Over what must be equal on both sides; geometry (page size, block sizes) is checked by compatibilityProblem. */
export function compatibilityHash(m: Omit<MetadataInput, 'engineId'>): string {
  const canonical = JSON.stringify([
    'handoff-kv-v2',
    m.modelName,
    m.preset,
    m.layout.numSlabs,
    m.pageFormats ?? null,
    m.cacheHash ?? '',
    ...((m.layout.tensorParallelSize ?? 1) === 1 ? [] : [`tp${m.layout.tensorParallelSize}`]),
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
  const layout = { numSlabs, numBlocks, pageBytes, tensorParallelSize, blockSizes: [...m.blockSizes] };
  return {
    engineId: m.engineId,
    modelName: m.modelName,
    preset: m.preset,
    layout: m.pageFormats === undefined ? layout : { ...layout, pageFormats: structuredClone(m.pageFormats) },
    compatHash: compatibilityHash(m),
  };
}

/**
 * The layout part of the options, derived from a KV cache config: page formats, and a hash of the group
 * specs without their block size and padding (those are geometry, which may differ between peers).
 */
export function layoutFromKvConfig(config: KVCacheConfig): {
  layout: SlabLayout;
  blockSizes: number[];
  pageFormats: PageFormat[];
  cacheHash: string;
} {
  const specs = JSON.stringify(
    config.groups.map((g) => {
      const { blockSize: _bs, pageSizePadded: _pad, ...rest } = g.spec;
      return [g.layerNames, rest];
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
  if (JSON.stringify(r.pageFormats) !== JSON.stringify(l.pageFormats)) return ['page formats differ'];
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

/** A human-readable reason why `remote` cannot exchange pages with `local`, or null. */
export function compatibilityProblem(local: EngineMetadata, remote: EngineMetadata): string | null {
  const [theirs, ours] = [remote.layout.tensorParallelSize, local.layout.tensorParallelSize];
  if (theirs !== ours)
    return (
      `peer ${remote.engineId} is incompatible: tensor parallel size ${theirs} != ${ours} ` +
      `(peer ${remote.engineId} runs TP=${theirs}, engine ${local.engineId} TP=${ours}; P/D between different ` +
      'TP degrees needs a head-slice mapping of the pages that is not implemented yet: use equal degrees)'
    );
  const diffs: string[] = [];
  if (remote.engineId === local.engineId) diffs.push(`same engine id ${local.engineId}`);
  if (remote.modelName !== local.modelName) diffs.push(`model ${remote.modelName} != ${local.modelName}`);
  if (remote.preset !== local.preset) diffs.push(`preset ${remote.preset} != ${local.preset}`);
  if (remote.layout.numSlabs !== local.layout.numSlabs)
    diffs.push(`numSlabs ${remote.layout.numSlabs} != ${local.layout.numSlabs}`);
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
