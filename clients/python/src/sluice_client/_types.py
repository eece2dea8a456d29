"""The values the client answers with: plain, immutable Python types read from the protobuf responses once, so
callers never handle generated messages (which stay reachable as `raw` where a rarely used field is needed)."""

from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format

from ._proto import sluice_pb2


class Code(enum.IntEnum):
    """A decision, as Envoy's `RateLimitResponse.Code`."""

    UNKNOWN = 0
    OK = 1
    OVER_LIMIT = 2


class Unit(enum.IntEnum):
    """A limit's unit, as Envoy's `RateLimitResponse.RateLimit.Unit`."""

    UNKNOWN = 0
    SECOND = 1
    MINUTE = 2
    HOUR = 3
    DAY = 4
    MONTH = 5
    YEAR = 6
    WEEK = 7


def _code(value: int) -> Code:
    # A code a newer server adds reads as UNKNOWN rather than failing the whole answer.
    return Code(value) if value in Code._value2member_map_ else Code.UNKNOWN


def _unit(value: int) -> Unit:
    return Unit(value) if value in Unit._value2member_map_ else Unit.UNKNOWN


def timedelta_of(message: Any, present: bool = True) -> datetime.timedelta | None:
    """A `google.protobuf.Duration` as a timedelta; None when the field is unset."""
    if not present:
        return None
    return datetime.timedelta(seconds=message.seconds, microseconds=message.nanos // 1000)


@dataclass(frozen=True)
class RateLimit:
    """The limit a descriptor was decided by (Envoy's `current_limit`)."""

    name: str
    requests_per_unit: int
    unit: Unit


@dataclass(frozen=True)
class DescriptorStatus:
    """One descriptor's part of a decision, in request order."""

    code: Code
    #: None when no limit applied (no rule matched, an unlimited rule, or a deny list decided).
    limit: RateLimit | None
    #: Hits left in the limit after this one.
    remaining: int
    #: Time until the limit's counter resets; None when the server did not say.
    reset_after: datetime.timedelta | None

    @property
    def allowed(self) -> bool:
        """True when this descriptor was under its limits."""
        return self.code == Code.OK

    @classmethod
    def from_pb(cls, status: Any) -> DescriptorStatus:
        limit = None
        if status.HasField("current_limit"):
            current = status.current_limit
            limit = RateLimit(current.name, current.requests_per_unit, _unit(current.unit))
        return cls(
            code=_code(status.code),
            limit=limit,
            remaining=status.limit_remaining,
            reset_after=timedelta_of(status.duration_until_reset, status.HasField("duration_until_reset")),
        )


@dataclass(frozen=True)
class Decision:
    """A rate limit decision: the answer to ShouldRateLimit, Check and Report."""

    code: Code
    statuses: tuple[DescriptorStatus, ...]
    #: Headers the server asks to add to the response (`x-ratelimit-*`, `X-Sluice-List-Deny`, ...), in order.
    headers: tuple[tuple[str, str], ...]
    #: The response's `dynamic_metadata` as plain Python values (e.g. `{"sluice": {"lease_id": ...}}`).
    metadata: dict[str, Any]
    #: The `envoy.service.ratelimit.v3.RateLimitResponse` itself.
    raw: Any = field(repr=False, compare=False)

    @property
    def allowed(self) -> bool:
        """True when every descriptor was under its limits."""
        return self.code == Code.OK

    @classmethod
    def from_pb(cls, response: Any) -> Decision:
        return cls(
            code=_code(response.overall_code),
            statuses=tuple(DescriptorStatus.from_pb(s) for s in response.statuses),
            headers=tuple((h.key, h.value) for h in response.response_headers_to_add),
            metadata=json_format.MessageToDict(response.dynamic_metadata) if response.HasField("dynamic_metadata") else {},
            raw=response,
        )


@dataclass(frozen=True)
class Limit:
    """The configured limit a descriptor matched, as GetRemaining reports it."""

    name: str
    requests_per_unit: int
    unit: Unit
    #: The window is `unit_multiplier` units long.
    unit_multiplier: int
    #: The algorithm that enforces it, e.g. "fixed_window".
    algorithm: str
    #: Bucket capacity for token and leaky buckets; `requests_per_unit` otherwise.
    burst: int


@dataclass(frozen=True)
class Remaining:
    """What is left of one descriptor's limit, read without consuming anything (GetRemaining)."""

    #: Whether a rule applies to the descriptor; when False, nothing below is set.
    matched: bool
    #: The rule is `unlimited`: every hit passes.
    unlimited: bool
    #: The limit (the most constrained one when the rule has several).
    limit: Limit | None
    #: Hits left before the limit is reached.
    remaining: int
    #: Time until the counter resets.
    reset_after: datetime.timedelta | None
    #: Time after which a hit of the asked cost would pass every limit (zero: now); None when it never would.
    retry_after: datetime.timedelta | None
    #: The cost exceeds the limit's capacity: it will never be allowed.
    never: bool
    #: The last recorded values of the rule's `record` entry, newest first.
    records: tuple[str, ...]

    @classmethod
    def from_pb(cls, d: sluice_pb2.DescriptorRemaining) -> Remaining:
        limit = None
        if d.HasField("limit"):
            pb = d.limit
            limit = Limit(pb.name, pb.requests_per_unit, _unit(pb.unit), pb.unit_multiplier, pb.algorithm, pb.burst)
        return cls(
            matched=d.matched,
            unlimited=d.unlimited,
            limit=limit,
            remaining=d.remaining,
            reset_after=timedelta_of(d.reset_after, d.HasField("reset_after")),
            retry_after=timedelta_of(d.retry_after, d.HasField("retry_after")),
            never=d.never,
            records=tuple(d.records),
        )


@dataclass(frozen=True)
class Permit:
    """The answer to WaitForPermit: the decision once the hit passed, or the last check's when the wait ran out
    (then nothing was consumed)."""

    decision: Decision
    #: How long the server held the call.
    waited: datetime.timedelta

    @property
    def allowed(self) -> bool:
        """True when the hit passed (and was counted)."""
        return self.decision.allowed

    @classmethod
    def from_pb(cls, response: sluice_pb2.WaitForPermitResponse) -> Permit:
        return cls(Decision.from_pb(response.decision), timedelta_of(response.waited) or datetime.timedelta(0))


@dataclass(frozen=True)
class Reserved:
    """The answer to Reserve."""

    #: Names the reservation in Settle; empty when nothing is held (refused, or no limit matched).
    id: str
    code: Code
    statuses: tuple[DescriptorStatus, ...]
    #: How long the reservation holds before it expires, charged at its estimate.
    ttl: datetime.timedelta | None

    @property
    def allowed(self) -> bool:
        """True when every limit admitted the estimate (and it is held, if any limit matched)."""
        return self.code == Code.OK

    @classmethod
    def from_pb(cls, response: sluice_pb2.ReserveResponse) -> Reserved:
        return cls(
            id=response.reservation_id,
            code=_code(response.overall_code),
            statuses=tuple(DescriptorStatus.from_pb(s) for s in response.statuses),
            ttl=timedelta_of(response.ttl, response.HasField("ttl")),
        )


@dataclass(frozen=True)
class Settlement:
    """One descriptor's settlement, in request order (costs summed over the descriptor's limits)."""

    estimate: int
    actual: int
    #: Counted beyond the estimate.
    charged: int
    #: What came back to a window still in force: 0 once the estimate's window has passed, less than
    #: `estimate - actual` when the counter held less.
    refunded: int


@dataclass(frozen=True)
class Settled:
    """The answer to Settle."""

    #: False when the reservation was not found: it expired (and stays charged at its estimate), was settled
    #: already, or never existed. Nothing changed then.
    settled: bool
    settlements: tuple[Settlement, ...]

    @classmethod
    def from_pb(cls, response: sluice_pb2.SettleResponse) -> Settled:
        return cls(
            settled=response.settled,
            settlements=tuple(Settlement(s.estimate, s.actual, s.charged, s.refunded) for s in response.settlements),
        )


@dataclass(frozen=True)
class ListEntry:
    """A run-time entry of a deny or allow list."""

    value: str
    #: Time left before it expires; None when it stays until removed.
    expires_in: datetime.timedelta | None


@dataclass(frozen=True)
class Offender:
    """A descriptor value (`key=value, key=value`) and how often it was decided or denied over the span: at least
    the true count, over it by at most what the server's bounded tables let go."""

    value: str
    count: int


@dataclass(frozen=True)
class RuleOffenders:
    """One rule's busiest values over the span."""

    #: The rule's path, as in metrics (`domain.key_value.key`).
    rule: str
    #: Decisions per value, largest first.
    hits: tuple[Offender, ...]
    #: Denials per value, largest first.
    denied: tuple[Offender, ...]

    @classmethod
    def from_pb(cls, rule: sluice_pb2.RuleOffenders) -> RuleOffenders:
        return cls(
            rule=rule.rule,
            hits=tuple(Offender(o.value, o.count) for o in rule.hits),
            denied=tuple(Offender(o.value, o.count) for o in rule.denied),
        )
