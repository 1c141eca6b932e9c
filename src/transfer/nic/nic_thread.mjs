// Bootstrap of the NIC worker thread: under tsx on Node 20 a Worker cannot start from a .ts file,
// so this plain module loads nic_worker.ts through tsx's ESM API (NODE-TOOLBOX.md).
import { tsImport } from 'tsx/esm/api';

await tsImport(new URL('./nic_worker.ts', import.meta.url).href, import.meta.url);
