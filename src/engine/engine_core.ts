/**
 * EngineCore: the busy loop that drives scheduler and runner, with async scheduling.
 *
 *   batch queue (depth 2):  schedule k+1 → runner.executeModel(k+1)   while the stream still runs step k
 *                           then await step k's output → scheduler.updateFromOutput → outputs to callers
 *
 * With asyncScheduling off the depth is 1 (the host waits for each step before scheduling the next).
 * The loop sleeps when there is nothing to do and wakes on a new request or abort; while the connector
 * holds pages for a peer it keeps taking (empty) steps at `idlePollMs` so releases and leases are seen.
 */
import { assert, rethrowIfAssertion } from '../util/assert.ts';
import type { ActivitySignal } from '../util/activity.ts';
import type { Env } from '../util/env.ts';
import { HandoffError, isHandoffError } from '../util/errors.ts';
import type { Logger } from '../util/log.ts';
import type { ModelRunner, StepHandle } from '../worker/model_runner.ts';
import type { SchedulerOutput } from '../worker/scheduler_output.ts';
import type { EngineOutput } from './output.ts';
import type { Request } from './request.ts';
import type { Scheduler } from './scheduler.ts';

export interface EngineCoreOptions {
  asyncScheduling: boolean;
  idlePollMs: number;
  /** Connector activity (transfer done, peer answered): wakes the loop. */
  activity?: ActivitySignal;
  /** The device's loss (Device.lost): the loop stops with its reason, even when idle. */
  deviceLost?: Promise<HandoffError>;
}

export type OutputListener = (out: EngineOutput) => void;

export class EngineCore {
  private readonly listeners = new Map<string, OutputListener>();
  private readonly queue: Array<{ so: SchedulerOutput; handle: StepHandle }> = [];
  private wake: (() => void) | null = null;
  private running = false;
  private stopped = false;
  private loopDone: Promise<void> = Promise.resolve();
  private fatal: Error | null = null;
  private deviceLost: HandoffError | null = null;
  private unsubscribe: (() => void) | null = null;
  stats = { steps: 0, emptySteps: 0 };

  constructor(
    readonly scheduler: Scheduler,
    readonly runner: ModelRunner,
    private readonly env: Env,
    private readonly opts: EngineCoreOptions,
    private readonly log?: Logger,
  ) {}

  /** Add a request; `onOutput` receives every output of it, the last one with a finishReason. */
  addRequest(req: Request, onOutput: OutputListener): void {
    if (this.fatal) throw new HandoffError('INTERNAL', `engine stopped: ${this.fatal.message}`);
    if (this.stopped) throw new HandoffError('OVERLOADED', 'engine is shutting down');
    this.scheduler.addRequest(req);
    this.listeners.set(req.requestId, onOutput);
    this.kick();
  }

  /**
   * The client went away: abort the request; if it already finished and holds its pages for a peer, its
   * answer never reached the client (the server calls this only then), so the hold ends now. With
   * `only`, a live request under the id that is not `only` (a retry reusing the id) is left alone: the
   * hold, if any, is the finished request's and still ends.
   */
  abort(requestId: string, endHold = true, only?: object): void {
    const live = this.scheduler.requests.get(requestId);
    const mine = live !== undefined && (only === undefined || live === only);
    if (mine && this.scheduler.abortRequest(requestId)) {
      for (const o of this.scheduler.drainPendingOutputs()) this.dispatch(o);
      this.kick();
    } else if (endHold && !mine && this.scheduler.connector.endHold(requestId)) this.kick();
  }

  /** Start the loop (idempotent). */
  start(): void {
    if (this.running) return;
    this.running = true;
    this.unsubscribe = this.opts.activity?.subscribe(() => this.kick()) ?? null;
    void this.opts.deviceLost?.then((err) => {
      this.deviceLost = err;
      this.kick();
    });
    // catch-ok: reports the crash to every listener, then re-throws a bug (the rejection crashes the process); an
    // operating error (the device lost) stops the loop alone: `crashed` says why (health 503) until the process stops
    this.loopDone = this.loop().catch((e: unknown) => {
      this.fatal = e instanceof Error ? e : new Error(String(e));
      this.log?.fatal({ err: this.fatal }, 'engine loop crashed');
      for (const [id, l] of this.listeners) {
        l(this.errorOutput(id, new HandoffError('INTERNAL', `engine loop crashed: ${this.fatal.message}`)));
      }
      this.listeners.clear();
      if (!isHandoffError(e)) throw this.fatal;
    });
  }

  /** Stop after in-flight steps; resolves when the loop has exited. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.unsubscribe?.();
    this.kick();
    await this.loopDone.catch((e: unknown) => rethrowIfAssertion(e));
    // Requests still here never get another step: each is told so, instead of waiting forever.
    for (const [id, l] of this.listeners)
      l(this.errorOutput(id, new HandoffError('OVERLOADED', 'the engine was closed')));
    this.listeners.clear();
  }

  get crashed(): Error | null {
    return this.fatal;
  }

  /**
   * The caller watches `crashed` (the simulator's crash oracle): a crash of the loop is reported there,
   * so its rejection must not kill the process as an unhandled one. `stop()` still sees it.
   */
  reportCrashesViaCrashed(): void {
    // catch-ok: the crash stays in `fatal` for the caller to report
    void this.loopDone.catch(() => undefined);
  }

  kick(): void {
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  private async loop(): Promise<void> {
    const depth = this.opts.asyncScheduling ? 2 : 1;
    let lastWasEmpty = false;
    for (;;) {
      if (this.deviceLost !== null) throw this.deviceLost;
      if (this.stopped && this.queue.length === 0) return;
      const canSchedule =
        !this.stopped &&
        this.queue.length < depth &&
        this.scheduler.hasWork() &&
        !(lastWasEmpty && this.queue.length > 0);
      if (canSchedule) {
        const so = this.scheduler.schedule();
        lastWasEmpty = so.totalNumScheduledTokens === 0;
        if (lastWasEmpty) this.stats.emptySteps++;
        this.stats.steps++;
        const handle = await this.runner.executeModel(so);
        // catch-ok: the loop awaits it in turn; if the loop died first, the loop's crash is what is reported
        void handle.output.catch(() => undefined);
        this.queue.push({ so, handle });
        continue;
      }
      const head = this.queue.shift();
      if (head) {
        const out = await head.handle.output;
        for (const o of this.scheduler.updateFromOutput(head.so, out)) this.dispatch(o);
        if (head.so.totalNumScheduledTokens === 0 && this.queue.length === 0) {
          // Nothing could run (async loads pending, pages held for a peer): poll gently, wake on news.
          await this.sleepOrWake(this.opts.idlePollMs);
        }
        lastWasEmpty = lastWasEmpty && this.queue.length > 0;
        continue;
      }
      if (this.stopped) return;
      // Idle: waiting requests that cannot run yet (async loads) or nothing at all.
      await this.sleepOrWake(this.scheduler.hasWork() ? this.opts.idlePollMs : 60_000);
      lastWasEmpty = false;
    }
  }

  private sleepOrWake(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const timer = this.env.setTimer(ms, () => {
        this.wake = null;
        resolve();
      });
      this.wake = () => {
        timer.cancel();
        resolve();
      };
    });
  }

  private dispatch(o: EngineOutput): void {
    const l = this.listeners.get(o.requestId);
    if (!l) return;
    if (o.finishReason !== null) this.listeners.delete(o.requestId);
    try {
      l(o);
    } catch (e) {
      rethrowIfAssertion(e);
      this.log?.error({ err: e, requestId: o.requestId }, 'output listener threw');
    }
  }

  private errorOutput(requestId: string, error: HandoffError): EngineOutput {
    return {
      requestId,
      newTokenIds: [],
      newLogprobs: [],
      logitsHashes: [],
      nanLogits: false,
      finishReason: 'error',
      kvTransferParams: null,
      error,
      numPromptTokens: 0,
      numCachedTokens: 0,
      numExternalTokens: 0,
    };
  }

  /** For tests and shutdown: true when nothing is running, queued or held. */
  isIdle(): boolean {
    assert(this.queue.length >= 0, 'queue length');
    return this.queue.length === 0 && this.scheduler.isQuiescent();
  }
}
