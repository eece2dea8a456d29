/**
 * A TypeScript client for sluice, the rate limit decision service: decisions from sluice's own service and Envoy's,
 * what is left, waiting for a permit (with an `AbortSignal`), cost budgets reserved and settled around a callback,
 * run-time lists and top offenders.
 *
 * The map of the package:
 *
 * - `client.ts`: `Client`, a channel and a method per call, sent through `run`;
 * - `calls.ts`: every RPC as a `Call` (the request built from plain values, the answer read back);
 * - `reservation.ts`: `withReservation`, which reserves an estimate and settles the actual cost;
 * - `types.ts`: the answers, as plain readonly objects;
 * - `errors.ts`: gRPC statuses as error classes, mapped in one place;
 * - `proto.ts`: the services loaded from the shipped .proto files, typed by `generated/` (built from the same files).
 */
export { Client, type ClientOptions, type CostOptions } from './client.js';
export {
  DEFAULT_TIMEOUT_MS,
  type CallOptions,
  type Costs,
  type Count,
  type Descriptors,
  type Entries,
  type Span,
} from './calls.js';
export { Reservation, type OnError, type ReservationOptions } from './reservation.js';
export type {
  Code,
  Decision,
  DescriptorStatus,
  Limit,
  ListEntry,
  Offender,
  Permit,
  RateLimit,
  Remaining,
  Reserved,
  RuleOffenders,
  Settled,
  Settlement,
  Unit,
} from './types.js';
export {
  Aborted,
  BudgetExceeded,
  DeadlineExceeded,
  InvalidArgument,
  NotFound,
  PermissionDenied,
  REFUND_ERROR,
  ResourceExhausted,
  RpcError,
  SluiceError,
  Unauthenticated,
  Unavailable,
  refundErrorOf,
} from './errors.js';
