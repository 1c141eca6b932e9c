/**
 * TokenizerThreads: prompts tokenized off the event loop, so one long prompt cannot stall /health and
 * every other request of a server. Short texts (up to `inlineCharsMax`, a few milliseconds at worst)
 * are tokenized inline; longer ones go to a small set of worker threads:
 *
 *   encode(text) ──short──> encode inline
 *                └─long───> [thread 1: text text] [thread 2: text] ...   (the least loaded; spawned lazily)
 *                           more than pendingMax texts on the threads → 503 OVERLOADED
 *
 * A thread is ref'd only while it has work, so idle threads never keep a process alive; close()
 * terminates them and fails whatever is still pending. A thread that dies fails its own texts (500)
 * and is replaced on the next long text.
 */
import { Worker } from 'node:worker_threads';
import { assert } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import { holdingLoopOpen } from '../util/env.ts';
import { encode, loadTokenizer } from '../model/tokenizer.ts';

export interface ToTokenizerThread {
  id: number;
  text: string;
}

export type FromTokenizerThread = { id: number; ids: Int32Array } | { id: number; error: string };

export interface TokenizerThreadsOptions {
  /** Texts of at most this many UTF-16 code units are tokenized inline. */
  inlineCharsMax: number;
  threadsMax: number;
  /** Texts queued or running on the threads at once; one more is refused (OVERLOADED). */
  pendingMax: number;
}

export const DEFAULT_TOKENIZER_THREADS: TokenizerThreadsOptions = {
  // ~1 ms of BPE for ordinary text, a few ms for one 4k-character word.
  inlineCharsMax: 4096,
  // The servers run on a few cores next to the engine's own threads: one tokenizer thread each.
  threadsMax: 1,
  pendingMax: 64,
};

const THREAD_ENTRY = new URL('./tokenizer_thread.mjs', import.meta.url);

interface Waiter {
  resolve(ids: number[]): void;
  reject(e: HandoffError): void;
}

class TokenizerThread {
  readonly pending = new Map<number, Waiter>();
  readonly worker: Worker;
  dead = false;

  constructor(onDeath: (t: TokenizerThread) => void) {
    this.worker = new Worker(THREAD_ENTRY);
    this.worker.unref();
    this.worker.on('message', (m: FromTokenizerThread) => {
      if (this.dead) return; // closed: its texts were already failed
      const w = this.pending.get(m.id);
      assert(w !== undefined, `tokenizer thread answered unknown text ${m.id}`);
      this.settled(m.id);
      if ('ids' in m) w.resolve(Array.from(m.ids));
      else w.reject(new HandoffError('INTERNAL', `tokenizer failed: ${m.error}`));
    });
    const die = (why: string): void => {
      if (this.dead) return;
      this.dead = true;
      onDeath(this);
      for (const w of this.pending.values()) w.reject(new HandoffError('INTERNAL', `tokenizer thread died: ${why}`));
      this.pending.clear();
    };
    this.worker.on('error', (e) => die(e.message));
    this.worker.on('exit', (code) => die(`exit code ${code}`));
  }

  send(id: number, text: string, w: Waiter): void {
    if (this.pending.size === 0) this.worker.ref();
    this.pending.set(id, w);
    const msg: ToTokenizerThread = { id, text };
    this.worker.postMessage(msg);
  }

  private settled(id: number): void {
    this.pending.delete(id);
    if (this.pending.size === 0) this.worker.unref();
  }
}

export class TokenizerThreads {
  private threads: TokenizerThread[] = [];
  private nextId = 1;
  private closed = false;

  constructor(readonly opts: TokenizerThreadsOptions = DEFAULT_TOKENIZER_THREADS) {
    assert(
      opts.threadsMax >= 1 && opts.pendingMax >= 1 && opts.inlineCharsMax >= 0,
      'tokenizer thread limits must be positive',
    );
    // The inline encoder (and the server's detokenizer) now, before the server listens, not on the
    // event loop of its first request.
    loadTokenizer();
  }

  /** Texts queued or running on the threads. */
  get numPending(): number {
    return this.threads.reduce((n, t) => n + t.pending.size, 0);
  }

  get numThreads(): number {
    return this.threads.length;
  }

  /** Token ids of `text` (the same as model/tokenizer's encode). */
  async encode(text: string): Promise<number[]> {
    if (this.closed) throw new HandoffError('OVERLOADED', 'the server is shutting down');
    if (text.length <= this.opts.inlineCharsMax) return encode(text);
    if (this.numPending >= this.opts.pendingMax) {
      throw new HandoffError(
        'OVERLOADED',
        `${this.opts.pendingMax} long prompts are already waiting to be tokenized; retry later`,
      );
    }
    const thread = this.pick();
    const id = this.nextId++;
    return new Promise<number[]>((resolve, reject) => thread.send(id, text, { resolve, reject }));
  }

  /** Terminate every thread; pending texts fail with OVERLOADED. */
  async close(): Promise<void> {
    this.closed = true;
    const threads = this.threads;
    this.threads = [];
    for (const t of threads) {
      t.dead = true;
      for (const w of t.pending.values()) w.reject(new HandoffError('OVERLOADED', 'the server is shutting down'));
      t.pending.clear();
    }
    await holdingLoopOpen(Promise.all(threads.map((t) => t.worker.terminate())));
  }

  /** An idle thread, else a new one (up to threadsMax), else the least loaded. */
  private pick(): TokenizerThread {
    const idle = this.threads.find((t) => t.pending.size === 0);
    if (idle) return idle;
    if (this.threads.length < this.opts.threadsMax) {
      const t = new TokenizerThread((dead) => (this.threads = this.threads.filter((x) => x !== dead)));
      this.threads.push(t);
      return t;
    }
    return this.threads.reduce((a, b) => (b.pending.size < a.pending.size ? b : a));
  }
}
