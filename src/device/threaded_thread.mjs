// Bootstrap of the compute stream's thread. Under tsx on Node 20 a Worker cannot start from a .ts
// file, so this plain module registers tsx in the thread (which also lets the executor import a
// TypeScript kernel module by URL) and then loads the executor.
import { register } from 'tsx/esm/api';

register();
await import('./threaded_worker.ts');
