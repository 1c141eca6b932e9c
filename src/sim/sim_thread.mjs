// Bootstrap of a simulator seed thread: under tsx on Node 20 a Worker cannot start from a .ts file, so
// this plain module loads sim_thread_worker.ts through tsx's ESM API (like serve/tokenizer_thread.mjs).
import { tsImport } from 'tsx/esm/api';

await tsImport(new URL('./sim_thread_worker.ts', import.meta.url).href, import.meta.url);
