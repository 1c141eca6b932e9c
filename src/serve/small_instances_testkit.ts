/**
 * For tests: small real instances (64 pages, max-model-len 256, free loopback ports), each closed after the
 * test file's tests. `start(options)` starts one with these options over the defaults.
 */
import { after } from 'node:test';
import type { Env } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance, type InstanceOptions } from './instance.ts';

export function smallInstances(env: Env): (o: Partial<InstanceOptions>) => Promise<Instance> {
  const started: Instance[] = [];
  after(async () => {
    for (const i of started) await i.close();
  });
  return async (o) => {
    const base = { ...DEFAULT_INSTANCE_OPTIONS, port: 0, numBlocks: 64, scheduler: { maxModelLen: 256 } };
    const i = await startInstance({ ...base, ...o }, env);
    started.push(i);
    return i;
  };
}
