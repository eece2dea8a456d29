"""`AsyncClient`: the calls of `Client` on a `grpc.aio` channel, with the same names, arguments and answers, awaited.
Every method builds its call in `_calls` and sends it through `_run`, the one place an async call meets the network
and its failures become exceptions."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
from envoy.service.ratelimit.v3 import rls_pb2_grpc

from . import _calls
from ._calls import DEFAULT_TIMEOUT_S, Call, Descriptors, Seconds, Span
from ._proto import sluice_pb2_grpc
from ._reservation import AsyncReservation, OnError
from ._types import Decision, ListEntry, Permit, Remaining, Reserved, RuleOffenders, Settled
from .errors import ClientClosed, from_rpc_error

T = TypeVar("T")


def _cancelled_by_caller() -> bool:
    """Whether the running task was asked to stop (`Task.cancel()`), rather than seeing a CancelledError that grpc
    raised for a call the closing of its channel ended.

    Python 3.11 counts a task's pending cancellations (`Task.cancelling()`). Python 3.10 keeps no such count: there,
    a CancelledError seen once the client is closed is taken for the close, so a task cancelled after its client
    was closed, before it woke from the ended call, raises `ClientClosed` rather than CancelledError.
    """
    if sys.version_info < (3, 11):
        return False
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class AsyncClient:
    """A connection to sluice's gRPC listener for asyncio code; create it inside the running event loop.

    `target` is `host:port`. The channel is plaintext unless `credentials` are given (`grpc.ssl_channel_credentials()`),
    or is `channel` when given (the caller's to close). `admin_token` is sent with the admin calls (lists, offenders).
    `timeout` is every call's default timeout in seconds; WaitForPermit adds its `max_wait` to it.

    Use it as an async context manager, or await `close()`, to close the channel it opened.
    """

    def __init__(
        self,
        target: str = "127.0.0.1:8081",
        *,
        admin_token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        if channel is not None:
            self._channel, self._owned = channel, False
        elif credentials is not None:
            self._channel, self._owned = grpc.aio.secure_channel(target, credentials, options=list(options)), True
        else:
            self._channel, self._owned = grpc.aio.insecure_channel(target, options=list(options)), True
        self._stubs = {
            "sluice": sluice_pb2_grpc.RateLimiterStub(self._channel),
            "envoy": rls_pb2_grpc.RateLimitServiceStub(self._channel),
        }
        self.admin_token = admin_token
        self.timeout = timeout
        self._closed = False

    async def close(self) -> None:
        """Closes the channel the client opened (one given as `channel=` is left to its owner). A call made after
        raises `ClientClosed`, and so does a call still in flight then (a `wait_for_permit` still waiting, in
        another task): the call is abandoned, and its task is not cancelled. Closing twice does nothing more."""
        self._closed = True
        if self._owned:
            await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()

    async def _run(self, call: Call[T], timeout: float | None = None) -> T:
        if self._closed:
            raise ClientClosed(call.method)
        method = getattr(self._stubs[call.service], call.method)
        deadline = _calls.deadline(call, timeout, self.timeout)
        started = time.monotonic()
        try:
            response = await method(call.request, timeout=deadline, metadata=_calls.metadata(call, self.admin_token))
        except grpc.RpcError as error:
            if self._closed:
                raise ClientClosed(call.method) from error
            raise from_rpc_error(call.method, error, deadline, time.monotonic() - started) from error
        except grpc.aio.UsageError as error:
            # A call on a channel of the caller's that was closed.
            raise ClientClosed(call.method) from error
        except asyncio.CancelledError:
            # Closing the channel cancels the calls in flight, and grpc raises that in the caller's task as a
            # CancelledError. Only a cancellation the task's own caller asked for goes on as one.
            if self._closed and not _cancelled_by_caller():
                raise ClientClosed(call.method) from None
            raise
        return call.read(response)

    # Decisions.

    async def should_rate_limit(
        self, domain: str, descriptors: Descriptors, *, hits_addend: int | None = None, timeout: float | None = None
    ) -> Decision:
        """Decides and counts a hit of `hits_addend` (default 1) per descriptor: `sluice.v1.RateLimiter`."""
        return await self._run(_calls.should_rate_limit("sluice", domain, descriptors, hits_addend), timeout)

    async def should_rate_limit_envoy(
        self, domain: str, descriptors: Descriptors, *, hits_addend: int | None = None, timeout: float | None = None
    ) -> Decision:
        """The same decision through Envoy's `envoy.service.ratelimit.v3.RateLimitService`, the one service any
        Envoy-compatible rate limit server speaks."""
        return await self._run(_calls.should_rate_limit("envoy", domain, descriptors, hits_addend), timeout)

    async def get_remaining(
        self, domain: str, descriptors: Descriptors, *, cost: int | None = None, timeout: float | None = None
    ) -> list[Remaining]:
        """What is left of each descriptor's limit, in request order, consuming nothing; `retry_after` says when a
        hit of `cost` (default 1) would pass."""
        return await self._run(_calls.get_remaining(domain, descriptors, cost), timeout)

    async def wait_for_permit(
        self,
        domain: str,
        descriptors: Descriptors,
        *,
        max_wait: Seconds,
        hits_addend: int | None = None,
        timeout: float | None = None,
    ) -> Permit:
        """Holds the call until the hit would pass, at most `max_wait` (seconds or a timedelta, at most an hour),
        then decides it. `Permit.allowed` is False when it could not pass in time (nothing consumed). The call's
        timeout defaults to `max_wait` plus the client's; one that runs out first raises `DeadlineExceeded`, and
        nothing is consumed then either."""
        return await self._run(_calls.wait_for_permit(domain, descriptors, max_wait, hits_addend), timeout)

    # Cost budgets.

    async def check(
        self,
        domain: str,
        descriptors: Descriptors,
        *,
        cost: int | None = None,
        costs: Mapping[str, int] | None = None,
        timeout: float | None = None,
    ) -> Decision:
        """The decision a cost would get, counting nothing."""
        return await self._run(_calls.check_or_report("Check", domain, descriptors, cost, costs), timeout)

    async def report(
        self,
        domain: str,
        descriptors: Descriptors,
        *,
        cost: int | None = None,
        costs: Mapping[str, int] | None = None,
        timeout: float | None = None,
    ) -> Decision:
        """Counts a cost that already happened, whatever the limits say (never refused)."""
        return await self._run(_calls.check_or_report("Report", domain, descriptors, cost, costs), timeout)

    def reservation(
        self,
        domain: str,
        descriptors: Descriptors,
        *,
        estimate: int | None = None,
        estimates: Mapping[str, int] | None = None,
        ttl: Seconds | None = None,
        on_error: OnError = "refund",
    ) -> AsyncReservation:
        """A reservation of the estimated cost for a `with` block, settled with the actual cost when it ends:

            async with client.reservation("llm", {"user": "alice"}, estimate=2000) as r:
                r.actual = await call_the_model()

        Entering reserves (raising `BudgetExceeded` when a limit has no room, and the block does not run). Leaving
        settles with `r.actual` / `r.actuals`, or at the estimate when the block set neither. When the block raises,
        `on_error="refund"` settles with what it set so far, else 0; `"expire"` leaves the reservation to expire
        after `ttl` (default: the server's, 300 s) charged at its estimate."""
        return AsyncReservation(self, domain, descriptors, estimate, estimates, ttl, on_error)

    async def reserve(
        self,
        domain: str,
        descriptors: Descriptors,
        *,
        estimate: int | None = None,
        estimates: Mapping[str, int] | None = None,
        ttl: Seconds | None = None,
        timeout: float | None = None,
    ) -> Reserved:
        """Reserve on its own, for a reservation settled elsewhere (another process, a later request); a refusal is
        an answer here (`Reserved.allowed` False), not an exception."""
        return await self._run(_calls.reserve(domain, descriptors, estimate, estimates, ttl), timeout)

    async def settle(
        self,
        domain: str,
        descriptors: Descriptors,
        reservation_id: str,
        *,
        actual: int | None = None,
        actuals: Mapping[str, int] | None = None,
        timeout: float | None = None,
    ) -> Settled:
        """Settle on its own: replaces the reservation's estimate with the actual cost (unset: 0). `Settled.settled`
        is False when it had expired, was settled already, or never existed."""
        return await self._run(_calls.settle(domain, descriptors, reservation_id, actual, actuals), timeout)

    # Run-time lists and offenders (admin calls: they need the server's admin token).

    async def add_list_entries(
        self,
        domain: str,
        list_name: str,
        values: Sequence[str],
        *,
        ttl: Seconds | None = None,
        timeout: float | None = None,
    ) -> int:
        """Adds (or renews) values in a configured deny or allow list, for `ttl` or until removed; answers how many
        were new."""
        return await self._run(_calls.change_list("AddListEntries", domain, list_name, values, ttl), timeout)

    async def remove_list_entries(
        self, domain: str, list_name: str, values: Sequence[str], *, timeout: float | None = None
    ) -> int:
        """Takes run-time entries away (configured values stay); answers how many were there."""
        return await self._run(_calls.change_list("RemoveListEntries", domain, list_name, values), timeout)

    async def get_list_entries(self, domain: str, list_name: str, *, timeout: float | None = None) -> list[ListEntry]:
        """The list's run-time entries that have not expired, by value."""
        return await self._run(_calls.get_list_entries(domain, list_name), timeout)

    async def top_offenders(
        self, domain: str, *, span: Span = "minute", limit: int | None = None, timeout: float | None = None
    ) -> list[RuleOffenders]:
        """Per rule, the descriptor values decided and denied most over the last minute or hour, the busiest rule
        first (at most `limit` rules and values each; default 10). Lags the traffic by up to 5 s."""
        return await self._run(_calls.top_offenders(domain, span, limit), timeout)
