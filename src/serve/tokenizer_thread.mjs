// Bootstrap of a tokenizer thread: under tsx on Node 20 a Worker cannot start from a .ts file, so this
// plain module loads tokenizer_thread_worker.ts through tsx's ESM API (like src/transfer/nic_thread.mjs).
import { tsImport } from 'tsx/esm/api';

await tsImport(new URL('./tokenizer_thread_worker.ts', import.meta.url).href, import.meta.url);
