import datetime

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as _ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2 as _rls_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListEntriesRequest(_message.Message):
    __slots__ = ("domain", "list", "values", "ttl")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    domain: str
    list: str
    values: _containers.RepeatedScalarFieldContainer[str]
    ttl: _duration_pb2.Duration
    def __init__(self, domain: _Optional[str] = ..., list: _Optional[str] = ..., values: _Optional[_Iterable[str]] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ListEntriesResponse(_message.Message):
    __slots__ = ("changed",)
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    changed: int
    def __init__(self, changed: _Optional[int] = ...) -> None: ...

class GetListEntriesRequest(_message.Message):
    __slots__ = ("domain", "list")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    domain: str
    list: str
    def __init__(self, domain: _Optional[str] = ..., list: _Optional[str] = ...) -> None: ...

class GetListEntriesResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[ListEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[ListEntry, _Mapping]]] = ...) -> None: ...

class ListEntry(_message.Message):
    __slots__ = ("value", "expires_in")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_FIELD_NUMBER: _ClassVar[int]
    value: str
    expires_in: _duration_pb2.Duration
    def __init__(self, value: _Optional[str] = ..., expires_in: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class GetTopOffendersRequest(_message.Message):
    __slots__ = ("domain", "span", "limit")
    class Span(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        MINUTE: _ClassVar[GetTopOffendersRequest.Span]
        HOUR: _ClassVar[GetTopOffendersRequest.Span]
    MINUTE: GetTopOffendersRequest.Span
    HOUR: GetTopOffendersRequest.Span
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    SPAN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    domain: str
    span: GetTopOffendersRequest.Span
    limit: int
    def __init__(self, domain: _Optional[str] = ..., span: _Optional[_Union[GetTopOffendersRequest.Span, str]] = ..., limit: _Optional[int] = ...) -> None: ...

class GetTopOffendersResponse(_message.Message):
    __slots__ = ("rules",)
    RULES_FIELD_NUMBER: _ClassVar[int]
    rules: _containers.RepeatedCompositeFieldContainer[RuleOffenders]
    def __init__(self, rules: _Optional[_Iterable[_Union[RuleOffenders, _Mapping]]] = ...) -> None: ...

class RuleOffenders(_message.Message):
    __slots__ = ("rule", "hits", "denied")
    RULE_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    DENIED_FIELD_NUMBER: _ClassVar[int]
    rule: str
    hits: _containers.RepeatedCompositeFieldContainer[Offender]
    denied: _containers.RepeatedCompositeFieldContainer[Offender]
    def __init__(self, rule: _Optional[str] = ..., hits: _Optional[_Iterable[_Union[Offender, _Mapping]]] = ..., denied: _Optional[_Iterable[_Union[Offender, _Mapping]]] = ...) -> None: ...

class Offender(_message.Message):
    __slots__ = ("value", "count")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    value: str
    count: int
    def __init__(self, value: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class WaitForPermitRequest(_message.Message):
    __slots__ = ("domain", "descriptors", "hits_addend", "max_wait")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    HITS_ADDEND_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptors: _containers.RepeatedCompositeFieldContainer[_ratelimit_pb2.RateLimitDescriptor]
    hits_addend: int
    max_wait: _duration_pb2.Duration
    def __init__(self, domain: _Optional[str] = ..., descriptors: _Optional[_Iterable[_Union[_ratelimit_pb2.RateLimitDescriptor, _Mapping]]] = ..., hits_addend: _Optional[int] = ..., max_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WaitForPermitResponse(_message.Message):
    __slots__ = ("decision", "waited")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    WAITED_FIELD_NUMBER: _ClassVar[int]
    decision: _rls_pb2.RateLimitResponse
    waited: _duration_pb2.Duration
    def __init__(self, decision: _Optional[_Union[_rls_pb2.RateLimitResponse, _Mapping]] = ..., waited: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CostRequest(_message.Message):
    __slots__ = ("domain", "descriptors", "cost", "costs")
    class CostsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    COSTS_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptors: _containers.RepeatedCompositeFieldContainer[_ratelimit_pb2.RateLimitDescriptor]
    cost: int
    costs: _containers.ScalarMap[str, int]
    def __init__(self, domain: _Optional[str] = ..., descriptors: _Optional[_Iterable[_Union[_ratelimit_pb2.RateLimitDescriptor, _Mapping]]] = ..., cost: _Optional[int] = ..., costs: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("domain", "descriptors", "estimate", "estimates", "ttl")
    class EstimatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    ESTIMATES_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptors: _containers.RepeatedCompositeFieldContainer[_ratelimit_pb2.RateLimitDescriptor]
    estimate: int
    estimates: _containers.ScalarMap[str, int]
    ttl: _duration_pb2.Duration
    def __init__(self, domain: _Optional[str] = ..., descriptors: _Optional[_Iterable[_Union[_ratelimit_pb2.RateLimitDescriptor, _Mapping]]] = ..., estimate: _Optional[int] = ..., estimates: _Optional[_Mapping[str, int]] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ReserveResponse(_message.Message):
    __slots__ = ("overall_code", "statuses", "reservation_id", "ttl")
    OVERALL_CODE_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    overall_code: _rls_pb2.RateLimitResponse.Code
    statuses: _containers.RepeatedCompositeFieldContainer[_rls_pb2.RateLimitResponse.DescriptorStatus]
    reservation_id: str
    ttl: _duration_pb2.Duration
    def __init__(self, overall_code: _Optional[_Union[_rls_pb2.RateLimitResponse.Code, str]] = ..., statuses: _Optional[_Iterable[_Union[_rls_pb2.RateLimitResponse.DescriptorStatus, _Mapping]]] = ..., reservation_id: _Optional[str] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SettleRequest(_message.Message):
    __slots__ = ("domain", "descriptors", "reservation_id", "actual", "actuals")
    class ActualsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_FIELD_NUMBER: _ClassVar[int]
    ACTUALS_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptors: _containers.RepeatedCompositeFieldContainer[_ratelimit_pb2.RateLimitDescriptor]
    reservation_id: str
    actual: int
    actuals: _containers.ScalarMap[str, int]
    def __init__(self, domain: _Optional[str] = ..., descriptors: _Optional[_Iterable[_Union[_ratelimit_pb2.RateLimitDescriptor, _Mapping]]] = ..., reservation_id: _Optional[str] = ..., actual: _Optional[int] = ..., actuals: _Optional[_Mapping[str, int]] = ...) -> None: ...

class SettleResponse(_message.Message):
    __slots__ = ("settled", "settlements")
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    SETTLEMENTS_FIELD_NUMBER: _ClassVar[int]
    settled: bool
    settlements: _containers.RepeatedCompositeFieldContainer[Settlement]
    def __init__(self, settled: _Optional[bool] = ..., settlements: _Optional[_Iterable[_Union[Settlement, _Mapping]]] = ...) -> None: ...

class Settlement(_message.Message):
    __slots__ = ("estimate", "actual", "charged", "refunded")
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_FIELD_NUMBER: _ClassVar[int]
    CHARGED_FIELD_NUMBER: _ClassVar[int]
    REFUNDED_FIELD_NUMBER: _ClassVar[int]
    estimate: int
    actual: int
    charged: int
    refunded: int
    def __init__(self, estimate: _Optional[int] = ..., actual: _Optional[int] = ..., charged: _Optional[int] = ..., refunded: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("domain", "descriptors", "lease_id")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptors: _containers.RepeatedCompositeFieldContainer[_ratelimit_pb2.RateLimitDescriptor]
    lease_id: str
    def __init__(self, domain: _Optional[str] = ..., descriptors: _Optional[_Iterable[_Union[_ratelimit_pb2.RateLimitDescriptor, _Mapping]]] = ..., lease_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("domain", "descriptors", "drop_queued_work")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    DROP_QUEUED_WORK_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptors: _containers.RepeatedCompositeFieldContainer[_ratelimit_pb2.RateLimitDescriptor]
    drop_queued_work: bool
    def __init__(self, domain: _Optional[str] = ..., descriptors: _Optional[_Iterable[_Union[_ratelimit_pb2.RateLimitDescriptor, _Mapping]]] = ..., drop_queued_work: _Optional[bool] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ("deleted", "kept_streams")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    KEPT_STREAMS_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    kept_streams: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, deleted: _Optional[int] = ..., kept_streams: _Optional[_Iterable[str]] = ...) -> None: ...

class GetRemainingRequest(_message.Message):
    __slots__ = ("domain", "descriptors", "cost")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptors: _containers.RepeatedCompositeFieldContainer[_ratelimit_pb2.RateLimitDescriptor]
    cost: int
    def __init__(self, domain: _Optional[str] = ..., descriptors: _Optional[_Iterable[_Union[_ratelimit_pb2.RateLimitDescriptor, _Mapping]]] = ..., cost: _Optional[int] = ...) -> None: ...

class GetRemainingResponse(_message.Message):
    __slots__ = ("descriptors",)
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    descriptors: _containers.RepeatedCompositeFieldContainer[DescriptorRemaining]
    def __init__(self, descriptors: _Optional[_Iterable[_Union[DescriptorRemaining, _Mapping]]] = ...) -> None: ...

class Limit(_message.Message):
    __slots__ = ("name", "requests_per_unit", "unit", "unit_multiplier", "algorithm", "burst")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_UNIT_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    UNIT_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    name: str
    requests_per_unit: int
    unit: _rls_pb2.RateLimitResponse.RateLimit.Unit
    unit_multiplier: int
    algorithm: str
    burst: int
    def __init__(self, name: _Optional[str] = ..., requests_per_unit: _Optional[int] = ..., unit: _Optional[_Union[_rls_pb2.RateLimitResponse.RateLimit.Unit, str]] = ..., unit_multiplier: _Optional[int] = ..., algorithm: _Optional[str] = ..., burst: _Optional[int] = ...) -> None: ...

class DescriptorRemaining(_message.Message):
    __slots__ = ("matched", "unlimited", "limit", "remaining", "reset_after", "retry_after", "never", "records")
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    UNLIMITED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    RESET_AFTER_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    NEVER_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    matched: bool
    unlimited: bool
    limit: Limit
    remaining: int
    reset_after: _duration_pb2.Duration
    retry_after: _duration_pb2.Duration
    never: bool
    records: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, matched: _Optional[bool] = ..., unlimited: _Optional[bool] = ..., limit: _Optional[_Union[Limit, _Mapping]] = ..., remaining: _Optional[int] = ..., reset_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., never: _Optional[bool] = ..., records: _Optional[_Iterable[str]] = ...) -> None: ...
