/**
 * ActivitySignal: "something happened that the engine loop should look at" (a transfer completed, a
 * peer answered, a notification arrived). Created first by the composition root, handed to the
 * connector as its onActivity, subscribed by the EngineCore (which wakes up). Replaces mutable holders
 * patched after construction: whoever exists first can notify, whoever exists later subscribes.
 */
import { assert } from './assert.ts';

const SUBSCRIBERS_MAX = 64;

export class ActivitySignal {
  private readonly subscribers = new Set<() => void>();

  notify(): void {
    for (const fn of this.subscribers) fn();
  }

  /** Returns the unsubscribe function. */
  subscribe(fn: () => void): () => void {
    assert(this.subscribers.size < SUBSCRIBERS_MAX, 'activity subscribers are bounded');
    this.subscribers.add(fn);
    return () => this.subscribers.delete(fn);
  }
}
