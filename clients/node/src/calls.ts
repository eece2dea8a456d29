/**
 * Every RPC the client makes, as a `Call`: the request built from plain values, how it is sent on the typed stubs, and
 * how its answer is read back. The client only carries calls to the server (`Client.run`), so each RPC's request and
 * answer are written once, here.
 *
 * Inputs the client can judge itself (types, negative costs, durations) are refused before any call, named as the
 * server names them; what only the server knows (an unknown domain, a malformed CIDR range, a cap) is left to it: its
 * INVALID_ARGUMENT names the input just as well.
 */
import type * as grpc from '@grpc/grpc-js';

import { invalidArgument } from './errors.js';
import type { RateLimitDescriptor } from './generated/envoy/extensions/common/ratelimit/v3/RateLimitDescriptor.js';
import type { Duration } from './generated/google/protobuf/Duration.js';
import type { GetListEntriesResponse__Output } from './generated/sluice/v1/GetListEntriesResponse.js';
import type { GetRemainingResponse__Output } from './generated/sluice/v1/GetRemainingResponse.js';
import type { GetTopOffendersResponse__Output } from './generated/sluice/v1/GetTopOffendersResponse.js';
import type { Stubs } from './proto.js';
import {
  millis,
  readDecision,
  readPermit,
  readRemaining,
  readReserved,
  readRuleOffenders,
  readSettled,
  type Decision,
  type ListEntry,
  type Permit,
  type Remaining,
  type Reserved,
  type RuleOffenders,
  type Settled,
} from './types.js';

/** The default per-call timeout, in milliseconds. */
export const DEFAULT_TIMEOUT_MS = 5000;

/**
 * One descriptor: its entries as an object (`{user: 'alice'}`, in insertion order) or as `[key, value]` pairs (for an
 * order an object cannot keep: JavaScript puts integer-like keys first).
 */
export type Entries = Readonly<Record<string, string>> | readonly (readonly [string, string])[];

/** The descriptors of a request: a list of them, or one object standing for a list of one. */
export type Descriptors = Readonly<Record<string, string>> | readonly Entries[];

/** A cost or count: a whole number, as a number (exact up to 2^53) or a bigint. */
export type Count = number | bigint;

/** Named costs, e.g. `{input_tokens: 1200, output_tokens: 300}`. */
export type Costs = Readonly<Record<string, Count>>;

/** Which service a call goes to. */
export type Service = 'sluice' | 'envoy';

/** What a caller may add to any call. */
export interface CallOptions {
  /** The call's timeout in milliseconds; default: the client's (plus `maxWaitMs` for WaitForPermit). */
  timeoutMs?: number;
  /** Cancels the call when it fires; the call then rejects with `Aborted`. */
  signal?: AbortSignal;
}

type Done<T> = (error: grpc.ServiceError | null, answer?: T) => void;

/** One RPC ready to send: its method, how to send it on the stubs, and what its answer becomes. */
export interface Call<T> {
  readonly method: string;
  /** Sent with the admin token (`authorization: Bearer ...`). */
  readonly admin: boolean;
  /** Milliseconds the server may hold the call on purpose, added to the client's default timeout. */
  readonly holdsForMs: number;
  send(stubs: Stubs, metadata: grpc.Metadata, options: grpc.CallOptions, done: Done<T>): grpc.ClientUnaryCall;
}

/** A call whose answer of type `R` is read into a `T`. */
function call<R, T>(
  method: string,
  invoke: (stubs: Stubs, metadata: grpc.Metadata, options: grpc.CallOptions, done: Done<R>) => grpc.ClientUnaryCall,
  read: (answer: R) => T,
  extra: { admin?: boolean; holdsForMs?: number } = {},
): Call<T> {
  return {
    method,
    admin: extra.admin ?? false,
    holdsForMs: extra.holdsForMs ?? 0,
    send: (stubs, metadata, options, done) =>
      invoke(stubs, metadata, options, (error, answer) => {
        if (error !== null || answer === undefined) {
          done(error);
          return;
        }
        done(null, read(answer));
      }),
  };
}

const UINT32_MAX = 2 ** 32 - 1;
const UINT64_MAX = 2n ** 64n - 1n;

function kind(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** The Envoy `RateLimitDescriptor`s for `values`. */
export function descriptors(method: string, values: Descriptors): RateLimitDescriptor[] {
  const list: readonly unknown[] = isRecord(values) ? [values] : Array.isArray(values) ? values : [];
  if (!isRecord(values) && !Array.isArray(values)) {
    throw invalidArgument(method, `descriptors: expected a list of descriptors, got ${kind(values)}`);
  }
  return list.map((value, i) => {
    let pairs: unknown[];
    if (isRecord(value)) {
      pairs = Object.entries(value);
    } else if (Array.isArray(value)) {
      pairs = value;
    } else {
      throw invalidArgument(method, `descriptors[${i}]: expected an object or [key, value] pairs, got ${kind(value)}`);
    }
    return {
      entries: pairs.map((pair, j) => {
        if (!(Array.isArray(pair) && pair.length === 2 && typeof pair[0] === 'string' && typeof pair[1] === 'string')) {
          throw invalidArgument(method, `descriptors[${i}].entries[${j}]: expected a [key, value] pair of strings`);
        }
        return { key: pair[0], value: pair[1] };
      }),
    };
  });
}

/** A cost or count, checked to be a whole number the field can hold, as a decimal string; undefined stays unset. */
export function count(method: string, name: string, value: Count | undefined, maximum: bigint = UINT64_MAX): string | undefined {
  if (value === undefined) return undefined;
  if (typeof value === 'number' && !Number.isSafeInteger(value)) {
    throw invalidArgument(method, `${name}: expected a whole number (exact up to 2^53, else a bigint), got ${value}`);
  }
  if (typeof value !== 'number' && typeof value !== 'bigint') {
    throw invalidArgument(method, `${name}: expected a whole number, got ${kind(value)}`);
  }
  const whole = BigInt(value);
  if (whole < 0n || whole > maximum) {
    throw invalidArgument(method, `${name}: ${value} is not between 0 and ${maximum}`);
  }
  return whole.toString();
}

function count32(method: string, name: string, value: Count | undefined): number {
  return Number(count(method, name, value, BigInt(UINT32_MAX)) ?? 0);
}

/** Named costs, each checked as `count` is. */
export function counts(method: string, name: string, values: Costs | undefined): Record<string, string> {
  if (values === undefined) return {};
  if (!isRecord(values)) throw invalidArgument(method, `${name}: expected an object of named costs, got ${kind(values)}`);
  return Object.fromEntries(
    Object.entries(values).map(([key, value]) => [key, count(method, `${name}['${key}']`, value) ?? '0']),
  );
}

/** A `google.protobuf.Duration` from milliseconds; undefined stays unset. Negative and infinite durations are refused. */
export function duration(method: string, name: string, ms: number | undefined): Duration | undefined {
  if (ms === undefined) return undefined;
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) {
    throw invalidArgument(method, `${name}: ${String(ms)} ms is not a duration`);
  }
  let seconds = Math.floor(ms / 1000);
  let nanos = Math.round((ms - seconds * 1000) * 1e6);
  if (nanos >= 1e9) {
    seconds += 1;
    nanos -= 1e9;
  }
  return { seconds: String(seconds), nanos };
}

function text(method: string, name: string, value: string): string {
  if (typeof value !== 'string') throw invalidArgument(method, `${name}: expected a string, got ${kind(value)}`);
  return value;
}

export function shouldRateLimit(service: Service, domain: string, values: Descriptors, hitsAddend: Count | undefined): Call<Decision> {
  const method = 'ShouldRateLimit';
  const request = {
    domain: text(method, 'domain', domain),
    descriptors: descriptors(method, values),
    hits_addend: count32(method, 'hitsAddend', hitsAddend),
  };
  return service === 'sluice'
    ? call(method, (s, m, o, d) => s.sluice.ShouldRateLimit(request, m, o, d), readDecision)
    : call(method, (s, m, o, d) => s.envoy.ShouldRateLimit(request, m, o, d), readDecision);
}

export function getRemaining(domain: string, values: Descriptors, cost: Count | undefined): Call<Remaining[]> {
  const method = 'GetRemaining';
  const request = {
    domain: text(method, 'domain', domain),
    descriptors: descriptors(method, values),
    cost: count(method, 'cost', cost),
  };
  return call<GetRemainingResponse__Output, Remaining[]>(method, (s, m, o, d) => s.sluice.GetRemaining(request, m, o, d), (r) => r.descriptors.map(readRemaining));
}

export function waitForPermit(domain: string, values: Descriptors, maxWaitMs: number, hitsAddend: Count | undefined): Call<Permit> {
  const method = 'WaitForPermit';
  const request = {
    domain: text(method, 'domain', domain),
    descriptors: descriptors(method, values),
    hits_addend: count32(method, 'hitsAddend', hitsAddend),
    max_wait: duration(method, 'maxWaitMs', maxWaitMs),
  };
  if (request.max_wait === undefined) throw invalidArgument(method, 'maxWaitMs: required');
  return call(method, (s, m, o, d) => s.sluice.WaitForPermit(request, m, o, d), readPermit, { holdsForMs: maxWaitMs });
}

export function checkOrReport(
  method: 'Check' | 'Report',
  domain: string,
  values: Descriptors,
  cost: Count | undefined,
  costs: Costs | undefined,
): Call<Decision> {
  const request = {
    domain: text(method, 'domain', domain),
    descriptors: descriptors(method, values),
    cost: count(method, 'cost', cost),
    costs: counts(method, 'costs', costs),
  };
  return method === 'Check'
    ? call(method, (s, m, o, d) => s.sluice.Check(request, m, o, d), readDecision)
    : call(method, (s, m, o, d) => s.sluice.Report(request, m, o, d), readDecision);
}

export function reserve(
  domain: string,
  values: Descriptors,
  estimate: Count | undefined,
  estimates: Costs | undefined,
  ttlMs: number | undefined,
): Call<Reserved> {
  const method = 'Reserve';
  const request = {
    domain: text(method, 'domain', domain),
    descriptors: descriptors(method, values),
    estimate: count(method, 'estimate', estimate),
    estimates: counts(method, 'estimates', estimates),
    ttl: duration(method, 'ttlMs', ttlMs),
  };
  return call(method, (s, m, o, d) => s.sluice.Reserve(request, m, o, d), readReserved);
}

export function settle(
  domain: string,
  values: Descriptors,
  reservationId: string,
  actual: Count | undefined,
  actuals: Costs | undefined,
): Call<Settled> {
  const method = 'Settle';
  const request = {
    domain: text(method, 'domain', domain),
    descriptors: descriptors(method, values),
    reservation_id: text(method, 'reservationId', reservationId),
    actual: count(method, 'actual', actual),
    actuals: counts(method, 'actuals', actuals),
  };
  return call(method, (s, m, o, d) => s.sluice.Settle(request, m, o, d), readSettled);
}

export function changeList(
  method: 'AddListEntries' | 'RemoveListEntries',
  domain: string,
  list: string,
  values: readonly string[],
  ttlMs?: number,
): Call<number> {
  if (!Array.isArray(values)) throw invalidArgument(method, `values: expected a list of values, got ${kind(values)}`);
  const request = {
    domain: text(method, 'domain', domain),
    list: text(method, 'list', list),
    values: values.map((v, i) => text(method, `values[${i}]`, v)),
    ttl: duration(method, 'ttlMs', ttlMs),
  };
  const read = (r: { changed: number }): number => r.changed;
  return method === 'AddListEntries'
    ? call(method, (s, m, o, d) => s.sluice.AddListEntries(request, m, o, d), read, { admin: true })
    : call(method, (s, m, o, d) => s.sluice.RemoveListEntries(request, m, o, d), read, { admin: true });
}

export function getListEntries(domain: string, list: string): Call<ListEntry[]> {
  const method = 'GetListEntries';
  const request = { domain: text(method, 'domain', domain), list: text(method, 'list', list) };
  return call<GetListEntriesResponse__Output, ListEntry[]>(
    method,
    (s, m, o, d) => s.sluice.GetListEntries(request, m, o, d),
    (r) => r.entries.map((e) => ({ value: e.value, expiresInMs: millis(e.expires_in) })),
    { admin: true },
  );
}

/** The span of GetTopOffenders. */
export type Span = 'minute' | 'hour';

export function topOffenders(domain: string, span: Span, limit: Count | undefined): Call<RuleOffenders[]> {
  const method = 'GetTopOffenders';
  if (span !== 'minute' && span !== 'hour') {
    throw invalidArgument(method, `span: '${String(span)}' is neither 'minute' nor 'hour'`);
  }
  const request = {
    domain: text(method, 'domain', domain),
    span: span === 'minute' ? ('MINUTE' as const) : ('HOUR' as const),
    limit: count32(method, 'limit', limit),
  };
  return call<GetTopOffendersResponse__Output, RuleOffenders[]>(
    method,
    (s, m, o, d) => s.sluice.GetTopOffenders(request, m, o, d),
    (r) => r.rules.map(readRuleOffenders),
    { admin: true },
  );
}
