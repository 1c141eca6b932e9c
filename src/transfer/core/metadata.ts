/**
 * Engine metadata exchanged at handshake, and the compatibility rule: two engines may move pages
 * only when a page means the same bytes on both sides (same model, preset, tensor parallel size, slab
 * count, page size, block sizes and cache specs). numBlocks may differ: each side checks offsets
 * against its own. Different TP degrees are refused first and by name: a rank's page holds its share of
 * the heads, so it needs a mapping (kv/tp_layout.ts) that slab-to-slab copies do not do (yet).
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { assert } from '../../util/assert.ts';
import { HandoffError } from '../../util/errors.ts';
import type { KVCacheConfig } from '../../kv/spec.ts';
import type { EngineMetadata, SlabLayout } from './types.ts';

export interface MetadataInput {
  engineId: string;
  modelName: string;
  preset: string;
  layout: SlabLayout;
  blockSizes: number[];
  cacheHash?: string;
}

export function compatibilityHash(m: Omit<MetadataInput, 'engineId'>): string {
  const canonical = JSON.stringify([
    'handoff-kv-v1',
    m.modelName,
    m.preset,
    m.layout.numSlabs,
    m.layout.pageBytes,
    m.blockSizes,
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
  return {
    engineId: m.engineId,
    modelName: m.modelName,
    preset: m.preset,
    layout: { numSlabs, numBlocks, pageBytes, tensorParallelSize, blockSizes: [...m.blockSizes] },
    compatHash: compatibilityHash(m),
  };
}

/** The layout part of the options, derived from a KV cache config (group specs feed the hash). */
export function layoutFromKvConfig(config: KVCacheConfig): {
  layout: SlabLayout;
  blockSizes: number[];
  cacheHash: string;
} {
  const specs = JSON.stringify(config.groups.map((g) => [g.layerNames, g.spec]));
  return {
    layout: {
      numSlabs: config.numSlabs,
      numBlocks: config.numBlocks,
      pageBytes: config.pageBytes,
      tensorParallelSize: config.tensorParallelSize,
    },
    blockSizes: config.groups.map((g) => g.spec.blockSize),
    cacheHash: createHash('sha256').update(specs).digest('hex'),
  };
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
  if (remote.layout.pageBytes !== local.layout.pageBytes)
    diffs.push(`pageBytes ${remote.layout.pageBytes} != ${local.layout.pageBytes}`);
  if (JSON.stringify(remote.layout.blockSizes) !== JSON.stringify(local.layout.blockSizes)) {
    diffs.push(`blockSizes [${remote.layout.blockSizes.join(',')}] != [${local.layout.blockSizes.join(',')}]`);
  }
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
