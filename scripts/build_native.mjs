#!/usr/bin/env node
// Builds native/ (the tcp NIC's scatter receive, native/scatter_read.c) with the node-gyp that npm bundles,
// against the local Node headers. Run by `npm ci` / `npm install` (the "install" script).
// Without a compiler the build fails with a warning and the tcp backend receives without it (slower on
// scattered pages, same bytes); `npm test` then fails its "native addon built" check unless
// HANDOFF_NATIVE=off says that is intended.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const candidates = [
  process.env.npm_config_node_gyp,
  path.join(path.dirname(process.execPath), '../lib/node_modules/npm/node_modules/node-gyp/bin/node-gyp.js'),
].filter((p) => p && existsSync(p));
if (process.env.HANDOFF_NATIVE === 'off') {
  console.log('native addon: skipped (HANDOFF_NATIVE=off)');
  process.exit(0);
}
if (candidates.length === 0) {
  console.warn('native addon: node-gyp not found; the tcp backend will receive scattered pages without readv');
  process.exit(0);
}
// The headers of the Node that runs us (never a download): npm's nodedir, else this Node's own prefix.
const prefix = path.resolve(path.dirname(process.execPath), '..');
const nodedir =
  process.env.npm_config_nodedir || (existsSync(path.join(prefix, 'include/node/node_api.h')) ? prefix : null);
const args = [candidates[0], 'rebuild', '--directory', path.join(root, 'native')];
if (nodedir) args.push(`--nodedir=${nodedir}`);
const r = spawnSync(process.execPath, args, {
  stdio: 'inherit',
});
if (r.status !== 0) {
  console.warn('native addon: build failed; the tcp backend will receive scattered pages without readv');
  process.exit(0);
}
console.log('native addon: built native/build/Release/handoff_native.node');
