/** The transfer layer's entry points for the layers above. */
export { createTransferEngine } from './factory.ts';
export { layoutFromKvConfig } from './metadata.ts';
export type * from './types.ts';
