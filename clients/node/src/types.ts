/**
 * The values the client answers with: plain, readonly objects read from the protobuf responses once, so callers never
 * handle generated messages (which stay reachable as `raw` on a decision, for a rarely used field).
 *
 * Durations are milliseconds (`resetAfterMs`); 64-bit counts are numbers, exact up to 2^53.
 */
import type { RateLimitResponse__Output } from './generated/envoy/service/ratelimit/v3/RateLimitResponse.js';
import type { Duration__Output } from './generated/google/protobuf/Duration.js';
import type { Struct__Output } from './generated/google/protobuf/Struct.js';
import type { Value__Output } from './generated/google/protobuf/Value.js';
import type { DescriptorRemaining__Output } from './generated/sluice/v1/DescriptorRemaining.js';
import type { ReserveResponse__Output } from './generated/sluice/v1/ReserveResponse.js';
import type { RuleOffenders__Output } from './generated/sluice/v1/RuleOffenders.js';
import type { SettleResponse__Output } from './generated/sluice/v1/SettleResponse.js';
import type { WaitForPermitResponse__Output } from './generated/sluice/v1/WaitForPermitResponse.js';

type DescriptorStatus__Output = RateLimitResponse__Output['statuses'][number];

/** A decision, as Envoy's `RateLimitResponse.Code`. */
export type Code = 'UNKNOWN' | 'OK' | 'OVER_LIMIT';

/** A limit's unit, as Envoy's `RateLimitResponse.RateLimit.Unit`. */
export type Unit = 'UNKNOWN' | 'SECOND' | 'MINUTE' | 'HOUR' | 'DAY' | 'MONTH' | 'YEAR' | 'WEEK';

const CODES: readonly string[] = ['UNKNOWN', 'OK', 'OVER_LIMIT'];
const UNITS: readonly string[] = ['UNKNOWN', 'SECOND', 'MINUTE', 'HOUR', 'DAY', 'MONTH', 'YEAR', 'WEEK'];

// A value a newer server adds reads as UNKNOWN rather than failing the whole answer.
function code(value: unknown): Code {
  return typeof value === 'string' && CODES.includes(value) ? (value as Code) : 'UNKNOWN';
}

function unit(value: unknown): Unit {
  return typeof value === 'string' && UNITS.includes(value) ? (value as Unit) : 'UNKNOWN';
}

/** A `google.protobuf.Duration` in milliseconds; null when the field is unset. */
export function millis(duration: Duration__Output | null | undefined): number | null {
  if (duration == null) return null;
  return Number(duration.seconds) * 1000 + duration.nanos / 1e6;
}

/** A uint64 (a decimal string, as the loader reads it) as a number. */
function count(value: string | number): number {
  return Number(value);
}

/** The limit a descriptor was decided by (Envoy's `current_limit`). */
export interface RateLimit {
  readonly name: string;
  readonly requestsPerUnit: number;
  readonly unit: Unit;
}

/** One descriptor's part of a decision, in request order. */
export interface DescriptorStatus {
  readonly code: Code;
  /** True when this descriptor was under its limits. */
  readonly allowed: boolean;
  /** Null when no limit applied (no rule matched, an unlimited rule, or a deny list decided). */
  readonly limit: RateLimit | null;
  /** Hits left in the limit after this one. */
  readonly remaining: number;
  /** Milliseconds until the limit's counter resets; null when the server did not say. */
  readonly resetAfterMs: number | null;
}

/** A rate limit decision: the answer to ShouldRateLimit, Check and Report. */
export interface Decision {
  readonly code: Code;
  /** True when every descriptor was under its limits. */
  readonly allowed: boolean;
  readonly statuses: readonly DescriptorStatus[];
  /** Headers the server asks to add to the response (`x-ratelimit-*`, `X-Sluice-List-Deny`, ...), in order. */
  readonly headers: readonly (readonly [string, string])[];
  /** The response's `dynamic_metadata` as plain values (e.g. `{sluice: {lease_id: ...}}`). */
  readonly metadata: Readonly<Record<string, unknown>>;
  /** The `envoy.service.ratelimit.v3.RateLimitResponse` itself, as the loader read it. */
  readonly raw: RateLimitResponse__Output;
}

/** The configured limit a descriptor matched, as GetRemaining reports it. */
export interface Limit {
  readonly name: string;
  readonly requestsPerUnit: number;
  readonly unit: Unit;
  /** The window is `unitMultiplier` units long. */
  readonly unitMultiplier: number;
  /** The algorithm that enforces it, e.g. "fixed_window". */
  readonly algorithm: string;
  /** Bucket capacity for token and leaky buckets; `requestsPerUnit` otherwise. */
  readonly burst: number;
}

/** What is left of one descriptor's limit, read without consuming anything (GetRemaining). */
export interface Remaining {
  /** Whether a rule applies to the descriptor; when false, nothing below is set. */
  readonly matched: boolean;
  /** The rule is `unlimited`: every hit passes. */
  readonly unlimited: boolean;
  /** The limit (the most constrained one when the rule has several). */
  readonly limit: Limit | null;
  /** Hits left before the limit is reached. */
  readonly remaining: number;
  /** Milliseconds until the counter resets. */
  readonly resetAfterMs: number | null;
  /** Milliseconds after which a hit of the asked cost would pass every limit (0: now); null when it never would. */
  readonly retryAfterMs: number | null;
  /** The cost exceeds the limit's capacity: it will never be allowed. */
  readonly never: boolean;
  /** The last recorded values of the rule's `record` entry, newest first. */
  readonly records: readonly string[];
}

/**
 * The answer to WaitForPermit: the decision once the hit passed, or the last check's when the wait ran out (then
 * nothing was consumed).
 */
export interface Permit {
  /** True when the hit passed (and was counted). */
  readonly allowed: boolean;
  readonly decision: Decision;
  /** How long the server held the call, in milliseconds. */
  readonly waitedMs: number;
}

/** The answer to Reserve. */
export interface Reserved {
  /** Names the reservation in Settle; empty when nothing is held (refused, or no limit matched). */
  readonly id: string;
  readonly code: Code;
  /** True when every limit admitted the estimate (and it is held, if any limit matched). */
  readonly allowed: boolean;
  readonly statuses: readonly DescriptorStatus[];
  /** How long the reservation holds before it expires, charged at its estimate, in milliseconds. */
  readonly ttlMs: number | null;
}

/** One descriptor's settlement, in request order (costs summed over the descriptor's limits). */
export interface Settlement {
  readonly estimate: number;
  readonly actual: number;
  /** Counted beyond the estimate. */
  readonly charged: number;
  /**
   * What came back to a window still in force: 0 once the estimate's window has passed, less than
   * `estimate - actual` when the counter held less.
   */
  readonly refunded: number;
}

/** The answer to Settle. */
export interface Settled {
  /**
   * False when the reservation was not found: it expired (and stays charged at its estimate), was settled already,
   * or never existed. Nothing changed then.
   */
  readonly settled: boolean;
  readonly settlements: readonly Settlement[];
}

/** A run-time entry of a deny or allow list. */
export interface ListEntry {
  readonly value: string;
  /** Milliseconds left before it expires; null when it stays until removed. */
  readonly expiresInMs: number | null;
}

/**
 * A descriptor value (`key=value, key=value`) and how often it was decided or denied over the span: at least the
 * true count, over it by at most what the server's bounded tables let go.
 */
export interface Offender {
  readonly value: string;
  readonly count: number;
}

/** One rule's busiest values over the span. */
export interface RuleOffenders {
  /** The rule's path, as in metrics (`domain.key_value.key`). */
  readonly rule: string;
  /** Decisions per value, largest first. */
  readonly hits: readonly Offender[];
  /** Denials per value, largest first. */
  readonly denied: readonly Offender[];
}

export function readStatus(status: DescriptorStatus__Output): DescriptorStatus {
  const current = status.current_limit;
  const c = code(status.code);
  return {
    code: c,
    allowed: c === 'OK',
    limit:
      current === null
        ? null
        : { name: current.name, requestsPerUnit: current.requests_per_unit, unit: unit(current.unit) },
    remaining: status.limit_remaining,
    resetAfterMs: millis(status.duration_until_reset),
  };
}

function plain(value: Value__Output): unknown {
  switch (value.kind) {
    case 'numberValue':
      return value.numberValue;
    case 'stringValue':
      return value.stringValue;
    case 'boolValue':
      return value.boolValue;
    case 'structValue':
      return value.structValue ? plainStruct(value.structValue) : {};
    case 'listValue':
      return (value.listValue?.values ?? []).map(plain);
    default:
      return null;
  }
}

function plainStruct(struct: Struct__Output): Record<string, unknown> {
  return Object.fromEntries(Object.entries(struct.fields).map(([k, v]) => [k, plain(v)]));
}

export function readDecision(response: RateLimitResponse__Output): Decision {
  const c = code(response.overall_code);
  return {
    code: c,
    allowed: c === 'OK',
    statuses: response.statuses.map(readStatus),
    headers: response.response_headers_to_add.map((h) => [h.key, h.value] as const),
    metadata: response.dynamic_metadata ? plainStruct(response.dynamic_metadata) : {},
    raw: response,
  };
}

export function readRemaining(d: DescriptorRemaining__Output): Remaining {
  const l = d.limit;
  return {
    matched: d.matched,
    unlimited: d.unlimited,
    limit:
      l === null
        ? null
        : {
            name: l.name,
            requestsPerUnit: l.requests_per_unit,
            unit: unit(l.unit),
            unitMultiplier: l.unit_multiplier,
            algorithm: l.algorithm,
            burst: l.burst,
          },
    remaining: count(d.remaining),
    resetAfterMs: millis(d.reset_after),
    retryAfterMs: millis(d.retry_after),
    never: d.never,
    records: [...d.records],
  };
}

export function readPermit(response: WaitForPermitResponse__Output): Permit {
  // A server always sends the decision; an empty one reads as UNKNOWN, not allowed.
  const decision = readDecision(
    response.decision ?? {
      overall_code: 'UNKNOWN',
      statuses: [],
      response_headers_to_add: [],
      request_headers_to_add: [],
      raw_body: Buffer.alloc(0),
      dynamic_metadata: null,
      quota: null,
    },
  );
  return { allowed: decision.allowed, decision, waitedMs: millis(response.waited) ?? 0 };
}

export function readReserved(response: ReserveResponse__Output): Reserved {
  const c = code(response.overall_code);
  return {
    id: response.reservation_id,
    code: c,
    allowed: c === 'OK',
    statuses: response.statuses.map(readStatus),
    ttlMs: millis(response.ttl),
  };
}

export function readSettled(response: SettleResponse__Output): Settled {
  return {
    settled: response.settled,
    settlements: response.settlements.map((s) => ({
      estimate: count(s.estimate),
      actual: count(s.actual),
      charged: count(s.charged),
      refunded: count(s.refunded),
    })),
  };
}

export function readRuleOffenders(rule: RuleOffenders__Output): RuleOffenders {
  const offenders = (list: RuleOffenders__Output['hits']): Offender[] =>
    list.map((o) => ({ value: o.value, count: count(o.count) }));
  return { rule: rule.rule, hits: offenders(rule.hits), denied: offenders(rule.denied) };
}
