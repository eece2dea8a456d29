"""Every RPC the client makes, as a `Call`: the request built from plain Python values and how to read the answer.

The sync and async clients only carry calls to the server (`Client._run`, `AsyncClient._run`), so each RPC's
request and answer are written once, here. Inputs the client can judge itself (types, negative costs, durations) are
refused before any call, named as the server names them; what only the server knows (an unknown domain, a malformed
CIDR range, a cap) is left to it: its INVALID_ARGUMENT names the input just as well.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Generic, Literal, TypeVar, Union

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import duration_pb2

from ._proto import sluice_pb2
from ._types import Decision, ListEntry, Permit, Remaining, Reserved, RuleOffenders, Settled, timedelta_of
from .errors import invalid_argument

#: The default per-call timeout, in seconds.
DEFAULT_TIMEOUT_S = 5.0

#: One descriptor: its entries as a mapping (`{"user": "alice"}`, in order) or as (key, value) pairs.
Entries = Union[Mapping[str, str], Sequence[tuple[str, str]]]
#: The descriptors of a request: a list of them, or one mapping standing for a list of one.
Descriptors = Union[Mapping[str, str], Sequence[Entries]]
#: A duration: seconds as a number, or a timedelta.
Seconds = Union[float, datetime.timedelta]

_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1


def descriptors(method: str, values: Descriptors) -> list[Any]:
    """The Envoy `RateLimitDescriptor`s for `values`."""
    if isinstance(values, Mapping):
        values = [values]
    elif isinstance(values, (str, bytes)):
        raise invalid_argument(method, f"descriptors: expected a list of descriptors, got {type(values).__name__}")
    built = []
    for i, value in enumerate(values):
        if isinstance(value, Mapping):
            pairs = list(value.items())
        elif isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise invalid_argument(method, f"descriptors[{i}]: expected a mapping or (key, value) pairs")
        else:
            pairs = list(value)
        entries = []
        for j, pair in enumerate(pairs):
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
                raise invalid_argument(method, f"descriptors[{i}].entries[{j}]: expected a (key, value) pair of strings")
            entries.append(ratelimit_pb2.RateLimitDescriptor.Entry(key=pair[0], value=pair[1]))
        built.append(ratelimit_pb2.RateLimitDescriptor(entries=entries))
    return built


def count(method: str, name: str, value: int | None, maximum: int = _UINT64_MAX) -> int | None:
    """A cost or hit count, checked to be a whole number the field can hold; None stays None (unset)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_argument(method, f"{name}: expected a whole number, got {type(value).__name__}")
    if not 0 <= value <= maximum:
        raise invalid_argument(method, f"{name}: {value} is not between 0 and {maximum}")
    return value


def counts(method: str, name: str, values: Mapping[str, int] | None) -> dict[str, int]:
    """Named costs (`{"input_tokens": 1200}`), each checked as `count` is."""
    checked: dict[str, int] = {}
    for key, value in (values or {}).items():
        checked[key] = count(method, f"{name}['{key}']", value) or 0
    return checked


def seconds(value: Seconds) -> float:
    return value.total_seconds() if isinstance(value, datetime.timedelta) else float(value)


def duration(method: str, name: str, value: Seconds | None) -> duration_pb2.Duration | None:
    """A `google.protobuf.Duration`; None stays None (unset). Negative and infinite durations are refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, datetime.timedelta)):
        raise invalid_argument(method, f"{name}: expected seconds or a timedelta, got {type(value).__name__}")
    total = seconds(value)
    if not (total >= 0 and math.isfinite(total)):
        raise invalid_argument(method, f"{name}: {total} s is not a duration")
    whole, nanos = divmod(round(total * 1e9), 10**9)
    return duration_pb2.Duration(seconds=whole, nanos=nanos)


T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One RPC ready to send: the service and method, the request, and how its answer becomes a `T`."""

    #: "sluice" (sluice.v1.RateLimiter) or "envoy" (envoy.service.ratelimit.v3.RateLimitService).
    service: Literal["sluice", "envoy"]
    method: str
    request: Any
    read: Callable[[Any], T]
    #: Sent with the admin token (`authorization: Bearer ...`).
    admin: bool = False
    #: Seconds the server may hold the call on purpose, added to the client's default timeout.
    holds_for: float = 0.0


def should_rate_limit(
    service: Literal["sluice", "envoy"], domain: str, values: Descriptors, hits_addend: int | None
) -> Call[Decision]:
    method = "ShouldRateLimit"
    request = rls_pb2.RateLimitRequest(
        domain=domain,
        descriptors=descriptors(method, values),
        hits_addend=count(method, "hits_addend", hits_addend, _UINT32_MAX) or 0,
    )
    return Call(service, method, request, Decision.from_pb)


def get_remaining(domain: str, values: Descriptors, cost: int | None) -> Call[list[Remaining]]:
    method = "GetRemaining"
    request = sluice_pb2.GetRemainingRequest(
        domain=domain, descriptors=descriptors(method, values), cost=count(method, "cost", cost)
    )

    def read(response: sluice_pb2.GetRemainingResponse) -> list[Remaining]:
        return [Remaining.from_pb(d) for d in response.descriptors]

    return Call("sluice", method, request, read)


def wait_for_permit(domain: str, values: Descriptors, max_wait: Seconds, hits_addend: int | None) -> Call[Permit]:
    method = "WaitForPermit"
    request = sluice_pb2.WaitForPermitRequest(
        domain=domain,
        descriptors=descriptors(method, values),
        hits_addend=count(method, "hits_addend", hits_addend, _UINT32_MAX) or 0,
        max_wait=duration(method, "max_wait", max_wait),
    )
    return Call("sluice", method, request, Permit.from_pb, holds_for=seconds(max_wait))


def check_or_report(
    method: Literal["Check", "Report"],
    domain: str,
    values: Descriptors,
    cost: int | None,
    costs: Mapping[str, int] | None,
) -> Call[Decision]:
    request = sluice_pb2.CostRequest(
        domain=domain,
        descriptors=descriptors(method, values),
        cost=count(method, "cost", cost),
        costs=counts(method, "costs", costs),
    )
    return Call("sluice", method, request, Decision.from_pb)


def reserve(
    domain: str,
    values: Descriptors,
    estimate: int | None,
    estimates: Mapping[str, int] | None,
    ttl: Seconds | None,
) -> Call[Reserved]:
    method = "Reserve"
    request = sluice_pb2.ReserveRequest(
        domain=domain,
        descriptors=descriptors(method, values),
        estimate=count(method, "estimate", estimate),
        estimates=counts(method, "estimates", estimates),
        ttl=duration(method, "ttl", ttl),
    )
    return Call("sluice", method, request, Reserved.from_pb)


def settle(
    domain: str, values: Descriptors, reservation_id: str, actual: int | None, actuals: Mapping[str, int] | None
) -> Call[Settled]:
    method = "Settle"
    request = sluice_pb2.SettleRequest(
        domain=domain,
        descriptors=descriptors(method, values),
        reservation_id=reservation_id,
        actual=count(method, "actual", actual),
        actuals=counts(method, "actuals", actuals),
    )
    return Call("sluice", method, request, Settled.from_pb)


def change_list(
    method: Literal["AddListEntries", "RemoveListEntries"],
    domain: str,
    list_name: str,
    values: Sequence[str],
    ttl: Seconds | None = None,
) -> Call[int]:
    if isinstance(values, str):
        raise invalid_argument(method, "values: expected a list of values, got one string")
    request = sluice_pb2.ListEntriesRequest(
        domain=domain, list=list_name, values=list(values), ttl=duration(method, "ttl", ttl)
    )

    def read(response: sluice_pb2.ListEntriesResponse) -> int:
        return response.changed

    return Call("sluice", method, request, read, admin=True)


def get_list_entries(domain: str, list_name: str) -> Call[list[ListEntry]]:
    request = sluice_pb2.GetListEntriesRequest(domain=domain, list=list_name)

    def read(response: sluice_pb2.GetListEntriesResponse) -> list[ListEntry]:
        return [ListEntry(e.value, timedelta_of(e.expires_in, e.HasField("expires_in"))) for e in response.entries]

    return Call("sluice", "GetListEntries", request, read, admin=True)


Span = Literal["minute", "hour"]
_SPANS = {"minute": sluice_pb2.GetTopOffendersRequest.MINUTE, "hour": sluice_pb2.GetTopOffendersRequest.HOUR}


def top_offenders(domain: str, span: Span, limit: int | None) -> Call[list[RuleOffenders]]:
    method = "GetTopOffenders"
    if span not in _SPANS:
        raise invalid_argument(method, f"span: '{span}' is neither 'minute' nor 'hour'")
    request = sluice_pb2.GetTopOffendersRequest(
        domain=domain, span=_SPANS[span], limit=count(method, "limit", limit, _UINT32_MAX) or 0
    )

    def read(response: sluice_pb2.GetTopOffendersResponse) -> list[RuleOffenders]:
        return [RuleOffenders.from_pb(r) for r in response.rules]

    return Call("sluice", method, request, read, admin=True)


def deadline(call: Call[Any], timeout: float | None, default: float) -> float:
    """The call's timeout in seconds: the caller's, else the client's default plus what the server may hold it for."""
    return timeout if timeout is not None else default + call.holds_for


def metadata(call: Call[Any], admin_token: str | None) -> tuple[tuple[str, str], ...]:
    """The admin token, as `authorization: Bearer <token>`, on the calls that need it."""
    return (("authorization", f"Bearer {admin_token}"),) if call.admin and admin_token is not None else ()
