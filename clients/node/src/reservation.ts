/**
 * A reservation held for the length of a callback: Reserve before it runs, Settle once it has (`withReservation`).
 *
 * The rules of the way out:
 *
 * - the callback returned (or its promise resolved): settle with the actual cost it recorded (`r.actual`,
 *   `r.actuals`), or at the estimate when it recorded none (charged as reserved: never less than was held by
 *   mistake); a Settle that fails then rejects `withReservation` with its error;
 * - the callback threw (or its promise rejected), `onError: 'refund'` (the default): settle with the actual cost
 *   recorded so far, else 0, giving back what the failed work did not spend;
 * - the callback threw, `onError: 'expire'`: leave the reservation alone; it expires after its ttl and stays charged
 *   at its estimate (for work that may have spent it all, e.g. a model call whose tokens are billed even when the
 *   caller's later step fails).
 *
 * The callback's error is always what `withReservation` rejects with, the same object. A refund that fails (the server
 * unreachable) never replaces it: the reservation then expires, charged at its estimate, and the refund's failure is
 * attached to the callback's error as its `sluiceRefundError` property (read it with `refundErrorOf(error)`) and kept
 * on the reservation as `r.refundError`.
 */
import * as calls from './calls.js';
import type { CallOptions, Costs, Count, Descriptors } from './calls.js';
import { BudgetExceeded, REFUND_ERROR, SluiceError, invalidArgument } from './errors.js';
import type { Reserved, Settled } from './types.js';

/** What a reservation does when its callback throws. */
export type OnError = 'refund' | 'expire';

/** The estimate to reserve, and what to do when the callback throws. */
export interface ReservationOptions extends CallOptions {
  /** The estimated cost; unset means 1 (Reserve's default). */
  estimate?: Count;
  /** Named estimates, e.g. `{input_tokens: 1200, output_tokens: 500}`. */
  estimates?: Costs;
  /** How long the reservation holds before it expires at its estimate; default: the server's (300 s). */
  ttlMs?: number;
  /** `'refund'` (default) or `'expire'`: see `withReservation`. */
  onError?: OnError;
}

/** A reservation being held: the callback of `withReservation` records the actual cost on it. */
export class Reservation {
  /** The actual cost to settle with, set by the callback when it knows it. */
  actual: Count | undefined = undefined;
  /** The actual named costs (`{input_tokens: 1180, output_tokens: 212}`), set by the callback. */
  actuals: Costs | undefined = undefined;
  /**
   * The Settle answer, once the callback has ended and the reservation was settled; null when it was left to expire
   * or nothing was held. `settled.settled` is false when the reservation had expired already.
   */
  settled: Settled | null = null;
  /** A refund that could not be sent after the callback threw (the reservation then expires at its estimate). */
  refundError: SluiceError | null = null;

  constructor(
    readonly domain: string,
    readonly descriptors: Descriptors,
    readonly estimate: Count | undefined,
    readonly estimates: Costs | undefined,
    readonly onError: OnError,
    /** The Reserve answer. */
    readonly reserved: Reserved,
  ) {}

  /** The reservation id; empty when no limit matched (nothing held, nothing to settle). */
  get id(): string {
    return this.reserved.id;
  }

  /** The Settle to send once the callback has ended, or null to send nothing. */
  settleCall(failed: boolean): calls.Call<Settled> | null {
    if (!this.id || (failed && this.onError === 'expire')) return null;
    let actual = this.actual;
    let actuals = this.actuals;
    if (failed) {
      actual = actual ?? 0;
    } else if (actual === undefined && actuals === undefined) {
      // Nothing recorded: charged as reserved. Reserve reads an unset estimate as 1, Settle an unset actual as 0.
      actual = this.estimate ?? 1;
      actuals = this.estimates;
    }
    return calls.settle(this.domain, this.descriptors, this.id, actual, actuals);
  }
}

/** What a reservation needs of its client: a call run to its answer. */
export interface Runs {
  run<T>(call: calls.Call<T>, options?: CallOptions): Promise<T>;
}

function attach(error: unknown, failure: SluiceError): void {
  if (typeof error === 'object' && error !== null && Object.isExtensible(error)) {
    Object.defineProperty(error, REFUND_ERROR, { value: failure, enumerable: true, configurable: true, writable: true });
  }
}

export async function withReservation<T>(
  client: Runs,
  domain: string,
  descriptors: Descriptors,
  options: ReservationOptions,
  callback: (r: Reservation) => Promise<T> | T,
): Promise<T> {
  const onError = options.onError ?? 'refund';
  if (onError !== 'refund' && onError !== 'expire') {
    throw invalidArgument('Reserve', `onError: '${String(onError)}' is neither 'refund' nor 'expire'`);
  }
  if (typeof callback !== 'function') throw invalidArgument('Reserve', 'callback: expected a function');
  const call = calls.reserve(domain, descriptors, options.estimate, options.estimates, options.ttlMs);
  const reserved = await client.run(call, options);
  if (!reserved.allowed) throw new BudgetExceeded(domain, reserved.statuses);
  const r = new Reservation(domain, descriptors, options.estimate, options.estimates, onError, reserved);
  // The caller's signal stops the Reserve and the callback's own work, never the Settle that follows: a refund after
  // an abort is what gives the estimate back.
  const settleOptions = options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs };
  let result: T;
  try {
    result = await callback(r);
  } catch (error) {
    try {
      const settle = r.settleCall(true);
      if (settle !== null) r.settled = await client.run(settle, settleOptions);
    } catch (failure) {
      r.refundError =
        failure instanceof SluiceError ? failure : new SluiceError(`Settle: ${String(failure)}`, { cause: failure });
      attach(error, r.refundError);
    }
    throw error;
  }
  const settle = r.settleCall(false);
  if (settle !== null) r.settled = await client.run(settle, settleOptions);
  return result;
}
