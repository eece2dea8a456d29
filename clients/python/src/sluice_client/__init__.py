"""A Python client for sluice, the rate limit decision service: decisions, what is left, waiting for a permit, cost
budgets reserved and settled around a block, run-time lists and top offenders; sync (`Client`) and asyncio
(`AsyncClient`) with the same methods.

The map of the package:

- `_calls`: every RPC as a `Call` (the request built from Python values, the answer read back), written once for
  both clients;
- `_sync` and `_aio`: `Client` and `AsyncClient`, which only carry calls over a gRPC channel;
- `_reservation`: the `with` block that reserves an estimate and settles the actual cost;
- `_types`: the answers, as plain immutable Python values;
- `errors`: gRPC statuses as exceptions, mapped in one place;
- `_proto`: the stubs generated from `proto/sluice/v1/sluice.proto` (`generate.sh`); the Envoy messages come from
  xds-protos.

`__version__` is the installed distribution's version, which `pyproject.toml` sets: the one place it is written.
"""

from importlib import metadata as _metadata

from ._aio import AsyncClient
from ._calls import DEFAULT_TIMEOUT_S, Descriptors, Entries, Seconds, Span
from ._reservation import AsyncReservation, OnError, Reservation
from ._sync import Client
from ._types import (
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
)
from .errors import (
    BudgetExceeded,
    ClientClosed,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    RpcError,
    SluiceError,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "AsyncClient",
    "AsyncReservation",
    "BudgetExceeded",
    "Client",
    "ClientClosed",
    "Code",
    "DeadlineExceeded",
    "Decision",
    "DescriptorStatus",
    "Descriptors",
    "Entries",
    "InvalidArgument",
    "Limit",
    "ListEntry",
    "NotFound",
    "Offender",
    "OnError",
    "Permit",
    "PermissionDenied",
    "RateLimit",
    "Remaining",
    "Reservation",
    "Reserved",
    "ResourceExhausted",
    "RpcError",
    "RuleOffenders",
    "Seconds",
    "Settled",
    "Settlement",
    "SluiceError",
    "Span",
    "Unauthenticated",
    "Unavailable",
    "Unit",
]

try:
    __version__ = _metadata.version("sluice-client")
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
