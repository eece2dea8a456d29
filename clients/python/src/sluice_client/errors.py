"""The exceptions the client raises: one per gRPC status a caller handles differently, and one for a reservation
the budget refused.

Every exception is a `SluiceError`. Those raised for a gRPC status carry the method and the server's message, which
names the offending input (`descriptors[0].entries[0]: empty key`); they also derive from the matching built-in
exception where there is one (`ValueError`, `LookupError`, `PermissionError`, `TimeoutError`, `ConnectionError`), so
code that knows nothing of sluice can still catch them sensibly.

Every exception survives `pickle` with its message, its fields and its notes, so one raised in a worker process
(`concurrent.futures.ProcessPoolExecutor`, `multiprocessing`, a task queue) is raised again in the caller as itself.
An exception whose constructor takes more than its message says how it is rebuilt (`__reduce__`): from its fields,
with the rest of its state (notes included) restored afterwards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    from ._types import DescriptorStatus


class SluiceError(Exception):
    """Anything the client raises."""


class RpcError(SluiceError):
    """A call answered with a gRPC status other than OK.

    `method` is the RPC (`GetRemaining`), `code` the status and `details` the server's message.
    """

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{method}: {code.name}: {details}" if details else f"{method}: {code.name}")
        self.method = method
        self.code = code
        self.details = details

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.method, self.code, self.details), self.__dict__


class InvalidArgument(RpcError, ValueError):
    """INVALID_ARGUMENT: the request was malformed or over a cap; `details` names the input (`values[1]: ...`).

    Also raised before any call for an input the client can check itself (a negative cost), with the same shape.
    """


class NotFound(RpcError, LookupError):
    """NOT_FOUND: an unknown domain or list."""


class Unauthenticated(RpcError, PermissionError):
    """UNAUTHENTICATED: an admin call without the server's admin token, or with another one."""


class PermissionDenied(RpcError, PermissionError):
    """PERMISSION_DENIED: an admin call to a server that has no admin token, so serves no admin calls."""


class DeadlineExceeded(RpcError, TimeoutError):
    """DEADLINE_EXCEEDED: no answer within the call's timeout. For WaitForPermit, nothing was consumed."""


class Unavailable(RpcError, ConnectionError):
    """UNAVAILABLE: the server could not be reached, or its store failed or timed out."""


class ResourceExhausted(RpcError):
    """RESOURCE_EXHAUSTED: as many WaitForPermit calls as the server allows (`--max-waiters`) wait already."""


class BudgetExceeded(SluiceError):
    """A reservation refused: some limit had no room for the estimate, so nothing is held and the guarded block did
    not run. `statuses` says, per descriptor, which limit refused and what it has left."""

    def __init__(self, domain: str, statuses: tuple[DescriptorStatus, ...]) -> None:
        refused = [s for s in statuses if not s.allowed]
        names = ", ".join(s.limit.name or "unnamed limit" for s in refused if s.limit is not None)
        super().__init__(f"reservation in '{domain}' refused: over budget ({names or 'no room'})")
        self.domain = domain
        self.statuses = statuses

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.domain, self.statuses), self.__dict__


class ClientClosed(SluiceError):
    """A call on a client that was closed (`close()`, or the end of its `with` block), or on a channel of the
    caller's that was; and a call in flight when its client was closed, such as a WaitForPermit still waiting: that
    call is abandoned, and its task sees this rather than a cancellation it did not ask for. `method` is the RPC.
    """

    def __init__(self, method: str) -> None:
        super().__init__(f"{method}: the client is closed")
        self.method = method

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.method,), self.__dict__


_BY_CODE: dict[grpc.StatusCode, type[RpcError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
}


def from_rpc_error(method: str, error: grpc.RpcError, timeout: float, elapsed: float) -> RpcError:
    """The exception for a failed call: the one place statuses become exceptions, for the sync and async clients.

    A call whose timeout ran out may come back CANCELLED rather than DEADLINE_EXCEEDED: the timeout travels with the
    call (`grpc-timeout`), and a server that enforces it (tonic does) can answer CANCELLED just before the client's
    own deadline fires. A CANCELLED that arrives once the timeout has passed is that, and raises DeadlineExceeded.
    """
    if isinstance(error, (grpc.Call, grpc.aio.AioRpcError)):
        code, details = error.code(), error.details() or ""
    else:
        code, details = grpc.StatusCode.UNKNOWN, str(error)
    if code == grpc.StatusCode.CANCELLED and elapsed >= timeout:
        code, details = grpc.StatusCode.DEADLINE_EXCEEDED, f"the call's timeout of {timeout:g} s ran out ({details})"
    return _BY_CODE.get(code, RpcError)(method, code, details)


def invalid_argument(method: str, details: str) -> InvalidArgument:
    """An input refused before any call, worded as the server words it."""
    return InvalidArgument(method, grpc.StatusCode.INVALID_ARGUMENT, details)
