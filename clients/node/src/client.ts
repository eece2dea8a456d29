/**
 * `Client`: one gRPC channel to sluice, and a method per call. Every method builds its call in `calls.ts` and sends it
 * through `run`, the one place a call meets the network, its timeout and abort signal, and where its failures become
 * errors.
 */
import * as grpc from '@grpc/grpc-js';

import * as calls from './calls.js';
import { DEFAULT_TIMEOUT_MS, type CallOptions, type Costs, type Count, type Descriptors, type Span } from './calls.js';
import { Aborted, SluiceError, fromServiceError, invalidArgument } from './errors.js';
import { stubs, type Stubs } from './proto.js';
import { withReservation, type Reservation, type ReservationOptions } from './reservation.js';
import type { Decision, ListEntry, Permit, Remaining, Reserved, RuleOffenders, Settled } from './types.js';

/** How a client connects. */
export interface ClientOptions {
  /** Sent as `authorization: Bearer <token>` with the admin calls (lists, offenders). */
  adminToken?: string;
  /** Every call's default timeout in milliseconds (5 000); WaitForPermit adds its `maxWaitMs` to it. */
  timeoutMs?: number;
  /** The channel's credentials, e.g. `grpc.credentials.createSsl(...)`; default: plaintext. */
  credentials?: grpc.ChannelCredentials;
  /** Options of the channel (`grpc.keepalive_time_ms`, ...). */
  channelOptions?: grpc.ChannelOptions;
}

/** A cost and its named parts, for Check and Report. */
export interface CostOptions extends CallOptions {
  /** The cost of each descriptor; unset means 1. */
  cost?: Count;
  /** Named costs, e.g. `{input_tokens: 1200}`. */
  costs?: Costs;
}

/**
 * A connection to sluice's gRPC listener (`host:port`, default `127.0.0.1:8081`). `close()` it when done.
 *
 * Every method takes, last, options with `timeoutMs` (the call's own timeout) and `signal` (an `AbortSignal` that
 * cancels it), and answers a promise: an input refused before any call rejects it, as the server's refusal would.
 */
export class Client {
  readonly target: string;
  readonly adminToken: string | undefined;
  readonly timeoutMs: number;
  private readonly channel: grpc.Channel;
  private readonly stubs: Stubs;

  constructor(target = '127.0.0.1:8081', options: ClientOptions = {}) {
    const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    if (typeof timeoutMs !== 'number' || !Number.isFinite(timeoutMs) || timeoutMs <= 0) {
      throw new SluiceError(`timeoutMs: ${String(timeoutMs)} is not a timeout in milliseconds`);
    }
    this.target = target;
    this.adminToken = options.adminToken;
    this.timeoutMs = timeoutMs;
    this.channel = new grpc.Channel(
      target,
      options.credentials ?? grpc.credentials.createInsecure(),
      options.channelOptions ?? {},
    );
    this.stubs = stubs(this.channel);
  }

  /** Closes the channel; calls in flight fail with Unavailable. */
  close(): void {
    this.channel.close();
  }

  /** Sends `call` and reads its answer; a gRPC status becomes its error class, an abort `Aborted`. */
  run<T>(call: calls.Call<T>, options: CallOptions = {}): Promise<T> {
    const { signal } = options;
    const timeoutMs = options.timeoutMs ?? this.timeoutMs + call.holdsForMs;
    if (typeof timeoutMs !== 'number' || !Number.isFinite(timeoutMs) || timeoutMs < 0) {
      return Promise.reject(invalidArgument(call.method, `timeoutMs: ${String(timeoutMs)} is not a timeout in milliseconds`));
    }
    if (signal?.aborted) return Promise.reject(new Aborted(call.method, signal.reason));
    const metadata = new grpc.Metadata();
    if (call.admin && this.adminToken !== undefined) metadata.set('authorization', `Bearer ${this.adminToken}`);
    const started = performance.now();
    return new Promise<T>((resolve, reject) => {
      let onAbort: (() => void) | undefined;
      const unary = call.send(this.stubs, metadata, { deadline: Date.now() + timeoutMs }, (error, answer) => {
        if (onAbort !== undefined) signal?.removeEventListener('abort', onAbort);
        if (error !== null) {
          if (signal?.aborted && error.code === grpc.status.CANCELLED) {
            reject(new Aborted(call.method, signal.reason));
          } else {
            reject(fromServiceError(call.method, error, timeoutMs, performance.now() - started));
          }
        } else if (answer === undefined) {
          reject(new SluiceError(`${call.method}: the server answered nothing`));
        } else {
          resolve(answer);
        }
      });
      if (signal !== undefined) {
        onAbort = () => unary.cancel();
        signal.addEventListener('abort', onAbort, { once: true });
      }
    });
  }

  // Decisions.

  /** Decides and counts a hit of `hitsAddend` (default 1) per descriptor: `sluice.v1.RateLimiter`. */
  async shouldRateLimit(domain: string, descriptors: Descriptors, options: CallOptions & { hitsAddend?: Count } = {}): Promise<Decision> {
    return this.run(calls.shouldRateLimit('sluice', domain, descriptors, options.hitsAddend), options);
  }

  /**
   * The same decision through Envoy's `envoy.service.ratelimit.v3.RateLimitService`, the one service any
   * Envoy-compatible rate limit server speaks.
   */
  async shouldRateLimitEnvoy(domain: string, descriptors: Descriptors, options: CallOptions & { hitsAddend?: Count } = {}): Promise<Decision> {
    return this.run(calls.shouldRateLimit('envoy', domain, descriptors, options.hitsAddend), options);
  }

  /**
   * What is left of each descriptor's limit, in request order, consuming nothing; `retryAfterMs` says when a hit of
   * `cost` (default 1) would pass.
   */
  async getRemaining(domain: string, descriptors: Descriptors, options: CallOptions & { cost?: Count } = {}): Promise<Remaining[]> {
    return this.run(calls.getRemaining(domain, descriptors, options.cost), options);
  }

  /**
   * Holds the call until the hit would pass, at most `maxWaitMs` (at most an hour), then decides it. `allowed` is
   * false when it could not pass in time (nothing consumed). The call's timeout defaults to `maxWaitMs` plus the
   * client's; one that runs out first throws `DeadlineExceeded`, and an abort through `signal` throws `Aborted`:
   * nothing is consumed then either.
   */
  async waitForPermit(
    domain: string,
    descriptors: Descriptors,
    options: CallOptions & { maxWaitMs: number; hitsAddend?: Count },
  ): Promise<Permit> {
    return this.run(calls.waitForPermit(domain, descriptors, options.maxWaitMs, options.hitsAddend), options);
  }

  // Cost budgets.

  /** The decision a cost would get, counting nothing. */
  async check(domain: string, descriptors: Descriptors, options: CostOptions = {}): Promise<Decision> {
    return this.run(calls.checkOrReport('Check', domain, descriptors, options.cost, options.costs), options);
  }

  /** Counts a cost that already happened, whatever the limits say (never refused). */
  async report(domain: string, descriptors: Descriptors, options: CostOptions = {}): Promise<Decision> {
    return this.run(calls.checkOrReport('Report', domain, descriptors, options.cost, options.costs), options);
  }

  /**
   * Reserves the estimate, runs `callback`, and settles the actual cost it recorded on the reservation:
   *
   *     const reply = await client.withReservation('llm', {user: 'alice'}, {estimate: 2000}, async (r) => {
   *       const reply = await callTheModel();
   *       r.actual = reply.tokens;
   *       return reply;
   *     });
   *
   * Resolves to what the callback returns. Throws `BudgetExceeded` (the callback does not run) when a limit has no
   * room. When the callback sets no actual cost, it is charged its estimate. When it throws, `onError: 'refund'`
   * settles with what it set so far, else 0, and `'expire'` leaves the reservation to expire after `ttlMs` charged at
   * its estimate; either way the callback's error is rethrown unchanged, with a refund that failed attached to it
   * (`refundErrorOf(error)`).
   */
  async withReservation<T>(
    domain: string,
    descriptors: Descriptors,
    options: ReservationOptions,
    callback: (r: Reservation) => Promise<T> | T,
  ): Promise<T> {
    return withReservation(this, domain, descriptors, options, callback);
  }

  /**
   * Reserve on its own, for a reservation settled elsewhere (another process, a later request); a refusal is an
   * answer here (`allowed` false), not an error.
   */
  async reserve(
    domain: string,
    descriptors: Descriptors,
    options: CallOptions & { estimate?: Count; estimates?: Costs; ttlMs?: number } = {},
  ): Promise<Reserved> {
    return this.run(calls.reserve(domain, descriptors, options.estimate, options.estimates, options.ttlMs), options);
  }

  /**
   * Settle on its own: replaces the reservation's estimate with the actual cost (unset: 0). `settled` is false when it
   * had expired, was settled already, or never existed.
   */
  async settle(
    domain: string,
    descriptors: Descriptors,
    reservationId: string,
    options: CallOptions & { actual?: Count; actuals?: Costs } = {},
  ): Promise<Settled> {
    return this.run(calls.settle(domain, descriptors, reservationId, options.actual, options.actuals), options);
  }

  // Run-time lists and offenders (admin calls: they need the server's admin token).

  /** Adds (or renews) values in a configured deny or allow list, for `ttlMs` or until removed; answers how many were new. */
  async addListEntries(domain: string, list: string, values: readonly string[], options: CallOptions & { ttlMs?: number } = {}): Promise<number> {
    return this.run(calls.changeList('AddListEntries', domain, list, values, options.ttlMs), options);
  }

  /** Takes run-time entries away (configured values stay); answers how many were there. */
  async removeListEntries(domain: string, list: string, values: readonly string[], options: CallOptions = {}): Promise<number> {
    return this.run(calls.changeList('RemoveListEntries', domain, list, values), options);
  }

  /** The list's run-time entries that have not expired, by value. */
  async getListEntries(domain: string, list: string, options: CallOptions = {}): Promise<ListEntry[]> {
    return this.run(calls.getListEntries(domain, list), options);
  }

  /**
   * Per rule, the descriptor values decided and denied most over the last minute or hour, the busiest rule first (at
   * most `limit` rules and values each; default 10). Lags the traffic by up to 5 s.
   */
  async topOffenders(domain: string, options: CallOptions & { span?: Span; limit?: Count } = {}): Promise<RuleOffenders[]> {
    return this.run(calls.topOffenders(domain, options.span ?? 'minute', options.limit), options);
  }
}
