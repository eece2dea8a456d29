"""`Client`: the calls on a blocking gRPC channel. Every method builds its call in `_calls` and sends it through
`_run`, the one place a sync call meets the network and its failures become exceptions."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
from envoy.service.ratelimit.v3 import rls_pb2_grpc

from . import _calls
from ._calls import DEFAULT_TIMEOUT_S, Call, Descriptors, Seconds, Span
from ._proto import sluice_pb2_grpc
from ._reservation import OnError, Reservation
from ._types import Decision, ListEntry, Permit, Remaining, Reserved, RuleOffenders, Settled
from .errors import ClientClosed, from_rpc_error

T = TypeVar("T")


class Client:
    """A connection to sluice's gRPC listener.

    `target` is `host:port`. The channel is plaintext unless `credentials` are given (`grpc.ssl_channel_credentials()`),
    or is `channel` when given (the caller's to close). `admin_token` is sent with the admin calls (lists, offenders).
    `timeout` is every call's default timeout in seconds; WaitForPermit adds its `max_wait` to it.

    Use it as a context manager, or call `close()`, to close the channel it opened.
    """

    def __init__(
        self,
        target: str = "127.0.0.1:8081",
        *,
        admin_token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        channel: grpc.Channel | None = None,
    ) -> None:
        if channel is not None:
            self._channel, self._owned = channel, False
        elif credentials is not None:
            self._channel, self._owned = grpc.secure_channel(target, credentials, options=list(options)), True
        else:
            self._channel, self._owned = grpc.insecure_channel(target, options=list(options)), True
        self._stubs = {
            "sluice": sluice_pb2_grpc.RateLimiterStub(self._channel),
            "envoy": rls_pb2_grpc.RateLimitServiceStub(self._channel),
        }
        self.admin_token = admin_token
        self.timeout = timeout
        self._closed = False

    def close(self) -> None:
        """Closes the channel the client opened (one given as `channel=` is left to its owner). A call made after,
        or still in flight then (in another thread), raises `ClientClosed`. Closing twice does nothing more."""
        self._closed = True
        if self._owned:
            self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _run(self, call: Call[T], timeout: float | None = None) -> T:
        if self._closed:
            raise ClientClosed(call.method)
        method = getattr(self._stubs[call.service], call.method)
        deadline = _calls.deadline(call, timeout, self.timeout)
        started = time.monotonic()
        try:
            response = method(call.request, timeout=deadline, metadata=_calls.metadata(call, self.admin_token))
        except grpc.RpcError as error:
            # A call in flight when `close()` ran ends CANCELLED ("Channel closed!").
            if self._closed:
                raise ClientClosed(call.method) from error
            raise from_rpc_error(call.method, error, deadline, time.monotonic() - started) from error
        except ValueError as error:
            # grpc's word for a call on a channel that was closed: a channel of the caller's, or ours closed by
            # another thread since the check above.
            if self._closed or "closed channel" in str(error):
                raise ClientClosed(call.method) from error
            raise
        return call.read(response)

    # Decisions.

    def should_rate_limit(
        self, domain: str, descriptors: Descriptors, *, hits_addend: int | None = None, timeout: float | None = None
    ) -> Decision:
        """Decides and counts a hit of `hits_addend` (default 1) per descriptor: `sluice.v1.RateLimiter`."""
        return self._run(_calls.should_rate_limit("sluice", domain, descriptors, hits_addend), timeout)

    def should_rate_limit_envoy(
        self, domain: str, descriptors: Descriptors, *, hits_addend: int | None = None, timeout: float | None = None
    ) -> Decision:
        """The same decision through Envoy's `envoy.service.ratelimit.v3.RateLimitService`, the one service any
        Envoy-compatible rate limit server speaks."""
        return self._run(_calls.should_rate_limit("envoy", domain, descriptors, hits_addend), timeout)

    def get_remaining(
        self, domain: str, descriptors: Descriptors, *, cost: int | None = None, timeout: float | None = None
    ) -> list[Remaining]:
        """What is left of each descriptor's limit, in request order, consuming nothing; `retry_after` says when a
        hit of `cost` (default 1) would pass."""
        return self._run(_calls.get_remaining(domain, descriptors, cost), timeout)

    def wait_for_permit(
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
        return self._run(_calls.wait_for_permit(domain, descriptors, max_wait, hits_addend), timeout)

    # Cost budgets.

    def check(
        self,
        domain: str,
        descriptors: Descriptors,
        *,
        cost: int | None = None,
        costs: Mapping[str, int] | None = None,
        timeout: float | None = None,
    ) -> Decision:
        """The decision a cost would get, counting nothing."""
        return self._run(_calls.check_or_report("Check", domain, descriptors, cost, costs), timeout)

    def report(
        self,
        domain: str,
        descriptors: Descriptors,
        *,
        cost: int | None = None,
        costs: Mapping[str, int] | None = None,
        timeout: float | None = None,
    ) -> Decision:
        """Counts a cost that already happened, whatever the limits say (never refused)."""
        return self._run(_calls.check_or_report("Report", domain, descriptors, cost, costs), timeout)

    def reservation(
        self,
        domain: str,
        descriptors: Descriptors,
        *,
        estimate: int | None = None,
        estimates: Mapping[str, int] | None = None,
        ttl: Seconds | None = None,
        on_error: OnError = "refund",
    ) -> Reservation:
        """A reservation of the estimated cost for a `with` block, settled with the actual cost when it ends:

            with client.reservation("llm", {"user": "alice"}, estimate=2000) as r:
                r.actual = call_the_model()

        Entering reserves (raising `BudgetExceeded` when a limit has no room, and the block does not run). Leaving
        settles with `r.actual` / `r.actuals`, or at the estimate when the block set neither. When the block raises,
        `on_error="refund"` settles with what it set so far, else 0; `"expire"` leaves the reservation to expire
        after `ttl` (default: the server's, 300 s) charged at its estimate."""
        return Reservation(self, domain, descriptors, estimate, estimates, ttl, on_error)

    def reserve(
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
        return self._run(_calls.reserve(domain, descriptors, estimate, estimates, ttl), timeout)

    def settle(
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
        return self._run(_calls.settle(domain, descriptors, reservation_id, actual, actuals), timeout)

    # Run-time lists and offenders (admin calls: they need the server's admin token).

    def add_list_entries(
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
        return self._run(_calls.change_list("AddListEntries", domain, list_name, values, ttl), timeout)

    def remove_list_entries(
        self, domain: str, list_name: str, values: Sequence[str], *, timeout: float | None = None
    ) -> int:
        """Takes run-time entries away (configured values stay); answers how many were there."""
        return self._run(_calls.change_list("RemoveListEntries", domain, list_name, values), timeout)

    def get_list_entries(self, domain: str, list_name: str, *, timeout: float | None = None) -> list[ListEntry]:
        """The list's run-time entries that have not expired, by value."""
        return self._run(_calls.get_list_entries(domain, list_name), timeout)

    def top_offenders(
        self, domain: str, *, span: Span = "minute", limit: int | None = None, timeout: float | None = None
    ) -> list[RuleOffenders]:
        """Per rule, the descriptor values decided and denied most over the last minute or hour, the busiest rule
        first (at most `limit` rules and values each; default 10). Lags the traffic by up to 5 s."""
        return self._run(_calls.top_offenders(domain, span, limit), timeout)
