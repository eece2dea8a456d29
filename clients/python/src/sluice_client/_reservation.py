"""A reservation held for the length of a `with` block: Reserve on the way in, Settle on the way out.

The rules of the way out are written once, in `ReservationState`, for the sync and async blocks:

- the block ended normally: settle with the actual cost the block recorded (`r.actual`, `r.actuals`), or at the
  estimate when it recorded none (charged as reserved: never less than was held by mistake);
- the block raised, `on_error="refund"` (the default): settle with the actual cost recorded so far, else 0, giving
  back what the failed work did not spend;
- the block raised, `on_error="expire"`: leave the reservation alone; it expires after its ttl and stays charged at
  its estimate (for work that may have spent it all, e.g. a model call whose tokens are billed even when the
  caller's later step fails).

A refund that fails (the server unreachable) never hides the block's own exception: the reservation then simply
expires, charged at its estimate, and the failure is added to the exception's notes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Generic, Literal, Protocol, TypeVar

from . import _calls
from ._calls import Descriptors, Seconds
from ._types import Reserved, Settled
from .errors import BudgetExceeded, SluiceError, invalid_argument

#: What a reservation does when its block raises.
OnError = Literal["refund", "expire"]

C = TypeVar("C")
T = TypeVar("T")


class Runs(Protocol):
    """What a blocking reservation needs of its client: a call run to its answer (`Client`)."""

    def _run(self, call: _calls.Call[T]) -> T: ...


class RunsAsync(Protocol):
    """What an asyncio reservation needs of its client: a call awaited to its answer (`AsyncClient`)."""

    async def _run(self, call: _calls.Call[T]) -> T: ...


class ReservationState(Generic[C]):
    """A reservation's state and the rules of its way out, shared by `Reservation` and `AsyncReservation`."""

    def __init__(
        self,
        client: C,
        domain: str,
        descriptors: Descriptors,
        estimate: int | None,
        estimates: Mapping[str, int] | None,
        ttl: Seconds | None,
        on_error: OnError,
    ) -> None:
        if on_error not in ("refund", "expire"):
            raise invalid_argument("Reserve", f"on_error: '{on_error}' is neither 'refund' nor 'expire'")
        self._client = client
        self.domain = domain
        self.descriptors = descriptors
        self.estimate = estimate
        self.estimates = dict(estimates) if estimates is not None else None
        self.ttl = ttl
        self.on_error = on_error
        #: The actual cost to settle with, set by the block when it knows it.
        self.actual: int | None = None
        #: The actual named costs (`{"input_tokens": 1180, "output_tokens": 212}`), set by the block.
        self.actuals: dict[str, int] | None = None
        #: The Reserve answer, once the block was entered.
        self.reserved: Reserved | None = None
        #: The Settle answer, once the block was left and the reservation settled; None when it was left to expire
        #: or nothing was held. `settled.settled` is False when the reservation had expired already.
        self.settled: Settled | None = None

    @property
    def id(self) -> str:
        """The reservation id; empty before the block, and when no limit matched (nothing held)."""
        return self.reserved.id if self.reserved is not None else ""

    def reserve_call(self) -> _calls.Call[Reserved]:
        return _calls.reserve(self.domain, self.descriptors, self.estimate, self.estimates, self.ttl)

    def admit(self, reserved: Reserved) -> None:
        """Keeps the Reserve answer; raises `BudgetExceeded` (the block does not run) when it was refused."""
        if not reserved.allowed:
            raise BudgetExceeded(self.domain, reserved.statuses)
        self.reserved = reserved

    def settle_call(self, failed: bool) -> _calls.Call[Settled] | None:
        """The Settle to send on leaving the block, or None to send nothing."""
        if not self.id or (failed and self.on_error == "expire"):
            return None
        actual, actuals = self.actual, self.actuals
        if failed:
            actual = actual or 0
        elif actual is None and actuals is None:
            # Nothing recorded: charged as reserved. Reserve reads an unset estimate as 1, Settle an unset actual as 0.
            actual = self.estimate if self.estimate is not None else 1
            actuals = self.estimates
        return _calls.settle(self.domain, self.descriptors, self.id, actual, actuals)


def append_note(error: BaseException, note: str) -> None:
    """`BaseException.add_note` for Python 3.10, which has none: appends to the exception's `__notes__` list, the one
    Python 3.11 and later keep notes in and print under the traceback (and that pytest and the `exceptiongroup`
    backport print on 3.10)."""
    notes = getattr(error, "__notes__", None)
    if not isinstance(notes, list):
        notes = []
        # Not `error.__notes__ = ...`: the attribute is typed on 3.11 and later only.
        setattr(error, "__notes__", notes)
    notes.append(note)


add_note: Callable[[BaseException, str], None]
"""Adds a note to an exception: Python's own where it has one (3.11 and later), else `append_note`."""
if sys.version_info >= (3, 11):
    add_note = BaseException.add_note
else:
    add_note = append_note


def _note(error: BaseException | None, failure: SluiceError) -> None:
    if error is not None:
        add_note(error, f"the reservation could not be settled, and expires charged at its estimate: {failure}")


class Reservation(ReservationState[Runs]):
    """`with client.reservation(...) as r:` — see the module's documentation for what leaving the block does."""

    def __enter__(self) -> Reservation:
        self.admit(self._client._run(self.reserve_call()))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        call = self.settle_call(failed=kind is not None)
        if call is None:
            return
        try:
            self.settled = self._client._run(call)
        except SluiceError as failure:
            if kind is None:
                raise
            _note(error, failure)


class AsyncReservation(ReservationState[RunsAsync]):
    """`async with client.reservation(...) as r:` — the same block as `Reservation`, for `AsyncClient`."""

    async def __aenter__(self) -> AsyncReservation:
        self.admit(await self._client._run(self.reserve_call()))
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        call = self.settle_call(failed=kind is not None)
        if call is None:
            return
        try:
            self.settled = await self._client._run(call)
        except SluiceError as failure:
            if kind is None:
                raise
            _note(error, failure)
