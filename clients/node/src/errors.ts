/**
 * The errors the client throws: one class per gRPC status a caller handles differently, one for a reservation the
 * budget refused, and one for a call its caller aborted.
 *
 * Every error is a `SluiceError`. Those thrown for a gRPC status are `RpcError`s carrying the method, the status and
 * the server's message, which names the offending input (`descriptors[0].entries[0]: empty key`). Statuses become
 * errors here and nowhere else (`fromServiceError`).
 */
import { status as Status, type ServiceError } from '@grpc/grpc-js';

import type { DescriptorStatus } from './types.js';

/** Anything the client throws. */
export class SluiceError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * A call answered with a gRPC status other than OK. `method` is the RPC (`GetRemaining`), `code` the status (as
 * `@grpc/grpc-js`'s `status`), `codeName` its name (`INVALID_ARGUMENT`) and `details` the server's message.
 */
export class RpcError extends SluiceError {
  readonly method: string;
  readonly code: Status;
  readonly codeName: string;
  readonly details: string;

  constructor(method: string, code: Status, details: string, options?: { cause?: unknown }) {
    const codeName = Status[code] ?? `STATUS_${code}`;
    super(details ? `${method}: ${codeName}: ${details}` : `${method}: ${codeName}`, options);
    this.method = method;
    this.code = code;
    this.codeName = codeName;
    this.details = details;
  }
}

/**
 * INVALID_ARGUMENT: the request was malformed or over a cap; `details` names the input (`values[1]: ...`). Also
 * thrown before any call for an input the client can check itself (a negative cost), with the same shape.
 */
export class InvalidArgument extends RpcError {}

/** NOT_FOUND: an unknown domain or list. */
export class NotFound extends RpcError {}

/** UNAUTHENTICATED: an admin call without the server's admin token, or with another one. */
export class Unauthenticated extends RpcError {}

/** PERMISSION_DENIED: an admin call to a server that has no admin token, so serves no admin calls. */
export class PermissionDenied extends RpcError {}

/** DEADLINE_EXCEEDED: no answer within the call's timeout. For WaitForPermit, nothing was consumed. */
export class DeadlineExceeded extends RpcError {}

/** UNAVAILABLE: the server could not be reached (down, or not listening there), or its store failed or timed out. */
export class Unavailable extends RpcError {}

/** RESOURCE_EXHAUSTED: as many WaitForPermit calls as the server allows (`--max-waiters`) wait already. */
export class ResourceExhausted extends RpcError {}

/**
 * The call's `AbortSignal` fired: the call was cancelled (or never sent, when the signal had fired already). For
 * WaitForPermit nothing was consumed. Its `name` is `AbortError`, as `fetch`'s is, and its `cause` the signal's
 * reason.
 */
export class Aborted extends SluiceError {
  readonly method: string;

  constructor(method: string, reason: unknown) {
    super(`${method}: aborted`, { cause: reason });
    this.name = 'AbortError';
    this.method = method;
  }
}

/**
 * A reservation refused by `withReservation`: some limit had no room for the estimate, so nothing is held and the
 * callback did not run. `statuses` says, per descriptor, which limit refused and what it has left.
 */
export class BudgetExceeded extends SluiceError {
  readonly domain: string;
  readonly statuses: readonly DescriptorStatus[];

  constructor(domain: string, statuses: readonly DescriptorStatus[]) {
    const names = statuses
      .filter((s) => !s.allowed && s.limit !== null)
      .map((s) => s.limit?.name || 'unnamed limit')
      .join(', ');
    super(`reservation in '${domain}' refused: over budget (${names || 'no room'})`);
    this.domain = domain;
    this.statuses = statuses;
  }
}

const BY_CODE: ReadonlyMap<Status, new (method: string, code: Status, details: string, options?: { cause?: unknown }) => RpcError> =
  new Map([
    [Status.INVALID_ARGUMENT, InvalidArgument],
    [Status.NOT_FOUND, NotFound],
    [Status.UNAUTHENTICATED, Unauthenticated],
    [Status.PERMISSION_DENIED, PermissionDenied],
    [Status.DEADLINE_EXCEEDED, DeadlineExceeded],
    [Status.UNAVAILABLE, Unavailable],
    [Status.RESOURCE_EXHAUSTED, ResourceExhausted],
  ]);

/**
 * The error for a failed call: the one place statuses become errors.
 *
 * A call whose timeout ran out may come back CANCELLED rather than DEADLINE_EXCEEDED: the timeout travels with the
 * call (`grpc-timeout`), and a server that enforces it can answer CANCELLED just before the client's own deadline
 * fires. A CANCELLED that arrives once the timeout has passed is that, and throws DeadlineExceeded.
 */
export function fromServiceError(method: string, error: ServiceError, timeoutMs: number, elapsedMs: number): RpcError {
  let code = error.code;
  let details = error.details ?? '';
  if (code === Status.CANCELLED && elapsedMs >= timeoutMs) {
    code = Status.DEADLINE_EXCEEDED;
    details = `the call's timeout of ${timeoutMs} ms ran out (${details})`;
  }
  const Class = BY_CODE.get(code) ?? RpcError;
  return new Class(method, code, details, { cause: error });
}

/** An input refused before any call, worded as the server words it. */
export function invalidArgument(method: string, details: string): InvalidArgument {
  return new InvalidArgument(method, Status.INVALID_ARGUMENT, details);
}

/**
 * Where `withReservation` leaves the failure of a refund it could not send: on the callback's own error, which is
 * thrown unchanged (same object, same class). Read it with `refundErrorOf`.
 */
export const REFUND_ERROR = 'sluiceRefundError';

/**
 * The refund `withReservation` could not send after its callback threw `error` (the reservation then expires, charged
 * at its estimate); undefined when the refund went through or none was attempted.
 */
export function refundErrorOf(error: unknown): SluiceError | undefined {
  if (typeof error === 'object' && error !== null && REFUND_ERROR in error) {
    const failure = (error as Record<string, unknown>)[REFUND_ERROR];
    return failure instanceof SluiceError ? failure : undefined;
  }
  return undefined;
}
