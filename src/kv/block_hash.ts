/**
 * Prefix-cache block hashes: sha256 over (parent hash, the block's token ids, group id).
 *
 * A block's hash names the whole prefix that ends with it (the parent chain), within one KV cache
 * group, so equal hashes mean equal KV contents for that group. The byte framing is fixed (no JSON,
 * no platform-dependent encoding), so hashes are stable across processes and machines:
 *
 *   [ 1 byte: has parent ] [ 32 bytes: parent digest or zeros ] [ u32 LE group id ] [ u32 LE n ]
 *   [ n x u32 LE token id ]
 */
import { createHash } from 'node:crypto';
import { assert } from '../util/assert.ts';

/** Hex sha256 digest (64 lowercase hex characters). */
export type BlockHash = string;

const HEX_DIGEST = /^[0-9a-f]{64}$/;
const MAX_U32 = 0xffff_ffff;

export function hashBlockTokens(parent: BlockHash | null, tokenIds: readonly number[], groupId: number): BlockHash {
  assert(parent === null || HEX_DIGEST.test(parent), () => `parent block hash is not a sha256 hex digest: ${parent}`);
  assert(Number.isInteger(groupId) && groupId >= 0 && groupId <= MAX_U32, `bad group id ${groupId}`);
  assert(tokenIds.length > 0, 'a block hash needs at least one token');
  const buf = Buffer.alloc(1 + 32 + 4 + 4 + 4 * tokenIds.length);
  buf.writeUInt8(parent === null ? 0 : 1, 0);
  if (parent !== null) buf.write(parent, 1, 32, 'hex');
  buf.writeUInt32LE(groupId, 33);
  buf.writeUInt32LE(tokenIds.length, 37);
  tokenIds.forEach((t, i) => {
    assert(Number.isInteger(t) && t >= 0 && t <= MAX_U32, `token id ${t} is not a u32`);
    buf.writeUInt32LE(t, 41 + 4 * i);
  });
  return createHash('sha256').update(buf).digest('hex');
}

/**
 * Extend `hashes` (the chain of a request's first hashes.length full blocks) so it covers the first
 * `numBlocks` full blocks of `tokenIds`. Returns the same array.
 */
export function extendBlockHashes(
  hashes: BlockHash[],
  tokenIds: readonly number[],
  blockSize: number,
  groupId: number,
  numBlocks: number,
): BlockHash[] {
  assert(Number.isInteger(blockSize) && blockSize > 0, `bad block size ${blockSize}`);
  assert(
    numBlocks * blockSize <= tokenIds.length,
    () => `${numBlocks} full blocks need ${numBlocks * blockSize} tokens, have ${tokenIds.length}`,
  );
  for (let i = hashes.length; i < numBlocks; i++) {
    const parent = i === 0 ? null : (hashes[i - 1] as BlockHash);
    hashes.push(hashBlockTokens(parent, tokenIds.slice(i * blockSize, (i + 1) * blockSize), groupId));
  }
  return hashes;
}
