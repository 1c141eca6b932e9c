/** The transfer layer's entry points for the layers above. */
export { createTransferEngine } from './factory.ts';
export { layoutFromKvConfig } from './core/metadata.ts';
export type * from './core/types.ts';
