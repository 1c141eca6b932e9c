/**
 * A promise that tells the race checker when host code actually consumes it.
 *
 * Why: "the host observed op X complete" is a happens-before edge only when host code continues
 * *because of* X (it awaited the ticket). Recording the edge when X merely finished would order
 * everything the host did afterwards behind X, hiding races in exactly the runs where the bad
 * interleaving did not happen. So the hook runs inside the consumer's callback.
 *
 * How: `await p` on a subclass instance goes through `p.then` (a native Promise would skip it), and
 * `catch`/`finally` call `then` as well; both callbacks are wrapped (a missing one becomes a pass-through),
 * so any continuation fires the hook. Derived promises are plain Promises (species), and the promise
 * is marked handled internally so an unconsumed rejection (e.g. at close) never crashes the process.
 */
class ObservedPromise<T> extends Promise<T> {
  static override get [Symbol.species](): PromiseConstructor {
    return Promise;
  }

  onObserve: () => void = () => {};

  override then<R1 = T, R2 = never>(
    onFulfilled?: ((value: T) => R1 | PromiseLike<R1>) | null,
    onRejected?: ((reason: unknown) => R2 | PromiseLike<R2>) | null,
  ): Promise<R1 | R2> {
    const hook = this.onObserve;
    return super.then(
      (value) => {
        hook();
        return onFulfilled ? onFulfilled(value) : (value as unknown as R1);
      },
      (reason: unknown) => {
        hook();
        if (onRejected) return onRejected(reason);
        throw reason;
      },
    );
  }
}

/** `source`'s outcome, firing `onObserve` each time a consumer's continuation runs. */
export function observed<T>(source: Promise<T>, onObserve: () => void): Promise<T> {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const p = new ObservedPromise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  p.onObserve = onObserve;
  source.then(resolve, reject);
  Promise.prototype.then.call(p, undefined, () => {});
  return p;
}
