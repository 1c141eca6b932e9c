/** A promise settled from outside, with its state readable; rejections are marked handled (nobody may be waiting). */
export class Deferred<T> {
  readonly promise: Promise<T>;
  private state: 'pending' | 'done' | 'failed' = 'pending';
  private resolveFn!: (v: T) => void;
  private rejectFn!: (e: unknown) => void;

  constructor() {
    this.promise = new Promise<T>((res, rej) => {
      this.resolveFn = res;
      this.rejectFn = rej;
    });
    // catch-ok: only marks the rejection handled; `promise` still rejects for whoever awaits it
    this.promise.catch(() => {});
  }

  /** Resolved (not failed). */
  get done(): boolean {
    return this.state === 'done';
  }

  get settled(): boolean {
    return this.state !== 'pending';
  }

  resolve(value: T): void {
    if (this.state !== 'pending') return;
    this.state = 'done';
    this.resolveFn(value);
  }

  reject(err: unknown): void {
    if (this.state !== 'pending') return;
    this.state = 'failed';
    this.rejectFn(err);
  }
}
