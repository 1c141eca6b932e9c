/** Helpers shared by the device conformance suite (conformance.ts, conformance_race.ts). */
import assert from 'node:assert/strict';
import type { Device, DeviceEvent, DeviceOptions } from './types.ts';

export type DeviceFactory = (opts: DeviceOptions & { raceCheck?: boolean }) => Promise<Device>;

export const TEST_GEOMETRY = { numSlabs: 4, numBlocks: 8, pageBytes: 64 } as const;
export const TEST_KERNELS_URL = new URL('./test_kernels.ts', import.meta.url).href;

/** Open a device with the test kernels, run `body`, always close it. */
export async function withDevice(
  factory: DeviceFactory,
  body: (d: Device) => Promise<void>,
  raceCheck = false,
): Promise<void> {
  const d = await factory({
    ...TEST_GEOMETRY,
    kernelModuleUrl: TEST_KERNELS_URL,
    kernelInit: { pageBytes: TEST_GEOMETRY.pageBytes },
    raceCheck,
  });
  try {
    await body(d);
  } finally {
    await d.close();
  }
}

/** Give a device's stream time to run whatever it (wrongly or rightly) may run, without a clock. */
export async function letDevicesRun(factory: DeviceFactory): Promise<void> {
  await withDevice(factory, async (other) => {
    await other.compute.enqueue({ op: { kind: 'sleep', ms: 30 }, label: { what: 'let-run' } }).done;
  });
}

/** A hand-made event from "elsewhere": reached only when the test opens it. */
export function gateEvent(): DeviceEvent & { open(): void } {
  let opened = false;
  let release!: () => void;
  const reached = new Promise<void>((r) => (release = r));
  return {
    id: -1,
    wait: () => reached,
    query: () => opened,
    open: () => {
      opened = true;
      release();
    },
  };
}

export function page(d: Device, slab: number, block: number): Uint8Array {
  const s = d.slabs[slab];
  assert.ok(s !== undefined);
  return s.subarray(block * d.pageBytes, (block + 1) * d.pageBytes);
}
