"""The Python client package (clients/python, installed into the test venv by the README's test command) against a
real sluice process: the sync and the asyncio client, each call's answer checked against what the server must have
counted.

- The package as installed: its stubs are the ones `generate.sh` makes from this repository's proto today, it
  passes `mypy --strict` (for Python 3.10 too, which it supports), it ships its type information, every public name
  is exported (`from sluice_client import RuleOffenders` passes `mypy --strict` in a program of its own), its
  `__version__` is pyproject's, and every method of the clients says what it does.
- Decisions from both services (sluice.v1 and Envoy's) on the same counters, over-limit answers, GetRemaining's
  exact remaining and retry times (and that it consumes nothing).
- WaitForPermit: a wait that ends in a permit, one that cannot end in time (answered at once, nothing consumed), and
  a call timeout shorter than the wait (DeadlineExceeded, nothing consumed).
- Reservations: settled with the actual cost, at the estimate when the block sets none, refunded (wholly or in
  part) when the block raises, left to expire with `on_error="expire"`, and refused as `BudgetExceeded` without
  running the block.
- Run-time lists, top offenders, and each gRPC status a caller meets as its exception (the input named).
- Descriptors given as mappings or as (key, value) pairs, counted as the guide says.
- A closed client: a call after `close()` (or on a closed channel of the caller's) and a call in flight when it
  closed raise `ClientClosed`, sync and async, while a task cancelled by its own caller still sees CancelledError.
- Every exception through `pickle`, and raised in a worker process of a `ProcessPoolExecutor` and again in the
  caller, its message, fields and notes intact.
- A refund that cannot be sent noted on the block's exception, by Python's `add_note` and by the fallback Python
  3.10 uses.
- Every Python block of the docs page, run as printed against a sluice serving deploy/config.
"""

from __future__ import annotations

import asyncio
import datetime
import filecmp
import importlib.metadata
import inspect
import multiprocessing
import os
import pickle
import re
import subprocess
import sys
import threading
import time
import tomllib
import traceback
import types
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
import sluice_client
from sluice_client import (
    AsyncClient,
    BudgetExceeded,
    Client,
    ClientClosed,
    Code,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    RpcError,
    SluiceError,
    Unauthenticated,
    Unavailable,
    Unit,
)
from sluice_client import _reservation

from conftest import REPO, Sluice, free_port, running_sluice, wait_until

PACKAGE = REPO / "clients" / "python"
TOKEN = "client-package-token"
HOUR = datetime.timedelta(hours=1)

# Hour-long fixed windows, so no window ends during a test (a test that straddles the top of the hour by chance
# would see its counters reset); `tick` is the one per-second limit, for a wait that ends.
CONFIG = """\
domain: shop
lists:
  - name: blocked
    key: remote_address
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3, name: user_per_hour}
  - key: tick
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: tokens
    rate_limit: {unit: hour, requests_per_unit: 1000, name: tokens_per_hour}
  - key: plan
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 5, name: plan_user_per_hour}
"""


@pytest.fixture(scope="module")
def sluice(sluice_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sluice]:
    workdir = tmp_path_factory.mktemp("client-package")
    (workdir / "config").mkdir()
    (workdir / "config" / "shop.yaml").write_text(CONFIG)
    with running_sluice(sluice_bin, workdir / "config", workdir, ("--admin-token", TOKEN)) as server:
        yield server


@pytest.fixture
def client(sluice: Sluice) -> Iterator[Client]:
    with Client(sluice.grpc_target, admin_token=TOKEN) as c:
        yield c


def fresh(prefix: str) -> str:
    """A descriptor value no other test has used: every test starts from a full allowance on the shared server."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# The package as installed.


def test_the_installed_package_ships_its_stubs_and_types():
    installed = Path(sluice_client.__file__).parent
    assert PACKAGE not in installed.parents, f"imported from the source tree ({installed}), not the installed package"
    for name in ("py.typed", "_proto/sluice_pb2.py", "_proto/sluice_pb2.pyi", "_proto/sluice_pb2_grpc.py"):
        assert (installed / name).is_file(), f"the installed package lacks {name}"


def test_the_committed_stubs_are_generated_from_the_proto(tmp_path: Path):
    out = subprocess.run(
        ["bash", str(PACKAGE / "generate.sh"), str(tmp_path)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    committed = PACKAGE / "src" / "sluice_client" / "_proto"
    names = ["sluice_pb2.py", "sluice_pb2.pyi", "sluice_pb2_grpc.py"]
    _, differ, missing = filecmp.cmpfiles(committed, tmp_path, names, shallow=False)
    assert not differ and not missing, f"stale stubs {differ + missing}: run clients/python/generate.sh"


@pytest.mark.parametrize("python", ["3.11", "3.10"])
def test_the_package_passes_mypy_strict(tmp_path: Path, python: str):
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-version", python, "--cache-dir", str(tmp_path)],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def public_names() -> list[str]:
    """What `import sluice_client` offers a caller: its names without a leading underscore, modules aside."""
    return sorted(
        name
        for name, value in vars(sluice_client).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType) and name != "annotations"
    )


def test_every_public_name_is_exported():
    assert "RuleOffenders" in public_names()
    assert sorted(sluice_client.__all__) == public_names()
    for name in sluice_client.__all__:
        assert hasattr(sluice_client, name), f"__all__ names {name}, which the package lacks"


def test_a_program_importing_every_public_name_passes_mypy_strict(tmp_path: Path):
    """`--strict` refuses a name the package imports but does not export ("does not explicitly export"): checked
    on the package as installed, as a program that uses it sees it."""
    names = public_names()
    program = tmp_path / "uses_the_client.py"
    program.write_text(
        f"from sluice_client import {', '.join(names)}\n"
        "import sluice_client\n\n"
        "version: str = sluice_client.__version__\n"
        f"everything: list[object] = [{', '.join(names)}]\n"
        "def busiest(client: Client) -> list[RuleOffenders]:\n"
        '    return client.top_offenders("edge")\n'
    )
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), str(program)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_version_is_pyprojects():
    declared = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]["version"]
    assert sluice_client.__version__ == declared == importlib.metadata.version("sluice-client")


def test_every_method_of_the_clients_says_what_it_does():
    for cls in (Client, AsyncClient):
        for name, member in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("_"):
                assert inspect.getdoc(member), f"{cls.__name__}.{name} has no docstring"
    assert "ClientClosed" in (inspect.getdoc(Client.close) or "")
    assert "ClientClosed" in (inspect.getdoc(AsyncClient.close) or "")


# Decisions.


def test_over_limit_from_both_services_on_the_same_counter(client: Client):
    user = {"user": fresh("u")}
    answers = [
        client.should_rate_limit("shop", user),
        client.should_rate_limit_envoy("shop", [user]),
        client.should_rate_limit("shop", [list(user.items())]),
        client.should_rate_limit_envoy("shop", user),
    ]
    assert [a.code for a in answers] == [Code.OK, Code.OK, Code.OK, Code.OVER_LIMIT]
    assert [a.allowed for a in answers] == [True, True, True, False]
    assert [a.statuses[0].remaining for a in answers] == [2, 1, 0, 0]
    status = answers[3].statuses[0]
    assert status.limit is not None
    assert (status.limit.name, status.limit.requests_per_unit, status.limit.unit) == ("user_per_hour", 3, Unit.HOUR)
    assert status.reset_after is not None and datetime.timedelta(0) < status.reset_after <= HOUR


def test_hits_addend_counts_that_many(client: Client):
    user = {"user": fresh("u")}
    assert client.should_rate_limit("shop", user, hits_addend=2).statuses[0].remaining == 1
    assert not client.should_rate_limit("shop", user, hits_addend=2).allowed
    assert client.should_rate_limit("shop", user).statuses[0].remaining == 0


def test_get_remaining_is_exact_and_consumes_nothing(client: Client):
    user = {"user": fresh("u")}
    client.should_rate_limit("shop", user)
    client.should_rate_limit("shop", user)
    for _ in range(3):
        left, unmatched = client.get_remaining("shop", [user, {"colour": "blue"}])
        assert left.matched and not left.unlimited and not left.never
        assert left.remaining == 1
        assert left.limit is not None
        assert (left.limit.name, left.limit.requests_per_unit, left.limit.unit) == ("user_per_hour", 3, Unit.HOUR)
        assert (left.limit.unit_multiplier, left.limit.algorithm, left.limit.burst) == (1, "fixed_window", 3)
        assert left.retry_after == datetime.timedelta(0)
        assert left.reset_after is not None and datetime.timedelta(0) < left.reset_after <= HOUR
        assert not unmatched.matched and unmatched.limit is None
    # A cost of 2 needs the next window: its retry time is the window's reset; 4 never fits in 3.
    (two,) = client.get_remaining("shop", user, cost=2)
    assert two.retry_after is not None and two.reset_after is not None
    assert abs(two.retry_after - two.reset_after) < datetime.timedelta(seconds=1)
    assert two.retry_after > datetime.timedelta(0)
    (four,) = client.get_remaining("shop", user, cost=4)
    assert four.never and four.retry_after is None
    assert client.should_rate_limit("shop", user).statuses[0].remaining == 0


# WaitForPermit.


def test_wait_for_permit_waits_for_the_next_window(client: Client):
    tick = {"tick": fresh("t")}
    # Spend the second's one hit (a second try when the first lands at the very end of a second).
    asked = time.monotonic()
    assert any(not client.should_rate_limit("shop", tick).allowed for _ in range(3))
    # What a call takes on this host now: a busy host wakes a waiting call late by about as much.
    late = max(0.05, 4 * (time.monotonic() - asked))
    started = time.monotonic()
    permit = client.wait_for_permit("shop", tick, max_wait=2.0)
    elapsed = time.monotonic() - started
    assert permit.allowed, permit
    assert permit.waited <= datetime.timedelta(seconds=1 + late), (permit.waited, late)
    assert elapsed >= permit.waited.total_seconds()
    assert not client.should_rate_limit("shop", tick).allowed, "the permit counted the new second's hit"


def test_wait_for_permit_that_cannot_end_in_time_answers_at_once_consuming_nothing(client: Client):
    user = {"user": fresh("u")}
    client.should_rate_limit("shop", user, hits_addend=2)
    started = time.monotonic()
    permit = client.wait_for_permit("shop", user, max_wait=datetime.timedelta(seconds=2), hits_addend=2)
    assert time.monotonic() - started < 1.0
    assert not permit.allowed and permit.decision.code == Code.OVER_LIMIT
    assert client.get_remaining("shop", user)[0].remaining == 1


def test_wait_for_permit_timeout_raises_deadline_exceeded_consuming_nothing(client: Client):
    user = {"user": fresh("u")}
    client.should_rate_limit("shop", user, hits_addend=2)
    # 2 more fit only in the next window, within the hour the call may wait but after the 0.3 s it may last.
    with pytest.raises(DeadlineExceeded) as raised:
        client.wait_for_permit("shop", user, max_wait=3600, hits_addend=2, timeout=0.3)
    assert isinstance(raised.value, TimeoutError)
    assert raised.value.method == "WaitForPermit"
    assert client.get_remaining("shop", user)[0].remaining == 1, "the abandoned wait consumed nothing"


# Reservations.


def tokens_left(client: Client, key: dict[str, str]) -> int:
    return client.get_remaining("shop", key)[0].remaining


def test_reservation_settles_the_actual_cost(client: Client):
    key = {"tokens": fresh("k")}
    with client.reservation("shop", key, estimate=600) as r:
        assert len(r.id) > 0
        assert tokens_left(client, key) == 400, "the estimate is held while the block runs"
        r.actual = 100
    assert r.settled is not None and r.settled.settled
    (s,) = r.settled.settlements
    assert (s.estimate, s.actual, s.charged, s.refunded) == (600, 100, 0, 500)
    assert tokens_left(client, key) == 900


def test_reservation_charges_more_than_the_estimate(client: Client):
    key = {"tokens": fresh("k")}
    with client.reservation("shop", key, estimate=100) as r:
        r.actual = 250
    assert r.settled is not None
    (s,) = r.settled.settlements
    assert (s.charged, s.refunded) == (150, 0)
    assert tokens_left(client, key) == 750


def test_reservation_without_an_actual_cost_is_charged_its_estimate(client: Client):
    key = {"tokens": fresh("k")}
    with client.reservation("shop", key, estimate=300) as r:
        pass
    assert r.settled is not None and r.settled.settled
    (s,) = r.settled.settlements
    assert (s.estimate, s.actual, s.charged, s.refunded) == (300, 300, 0, 0)
    assert tokens_left(client, key) == 700


def test_reservation_refunds_when_the_block_raises(client: Client):
    key = {"tokens": fresh("k")}
    with pytest.raises(RuntimeError, match="model failed"):
        with client.reservation("shop", key, estimate=600) as whole:
            raise RuntimeError("model failed")
    assert whole.settled is not None and whole.settled.settlements[0].refunded == 600
    assert tokens_left(client, key) == 1000
    # What the block recorded before it raised is kept; the rest comes back.
    with pytest.raises(RuntimeError):
        with client.reservation("shop", key, estimate=600) as part:
            part.actual = 50
            raise RuntimeError("stream broke after 50 tokens")
    assert part.settled is not None and part.settled.settlements[0].refunded == 550
    assert tokens_left(client, key) == 950


def test_reservation_left_to_expire_when_the_block_raises(client: Client):
    key = {"tokens": fresh("k")}
    with pytest.raises(RuntimeError):
        with client.reservation("shop", key, estimate=600, ttl=60, on_error="expire") as r:
            raise RuntimeError("billed anyway")
    assert r.settled is None
    assert tokens_left(client, key) == 400, "the estimate stays held"
    # Still held, not settled: a Settle now finds it.
    assert client.settle("shop", key, r.id, actual=0).settled
    assert tokens_left(client, key) == 1000
    assert not client.settle("shop", key, r.id, actual=0).settled, "a reservation settles once"


def test_reservation_over_budget_raises_without_running_the_block(client: Client):
    key = {"tokens": fresh("k")}
    ran = False
    with pytest.raises(BudgetExceeded, match="tokens_per_hour") as raised:
        with client.reservation("shop", key, estimate=1001):
            ran = True
    assert not ran
    assert raised.value.statuses[0].code == Code.OVER_LIMIT
    assert tokens_left(client, key) == 1000, "nothing held"
    refused = client.reserve("shop", key, estimate=1001)
    assert not refused.allowed and refused.id == ""


def refund_that_cannot_be_sent(sluice_bin: Path, tmp_path: Path) -> BaseException:
    """The exception of a block whose server stopped while it ran, so that its refund could not be sent."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "shop.yaml").write_text(CONFIG)
    server = Sluice(sluice_bin, tmp_path / "config", tmp_path)
    try:
        server.wait_healthy()
        with Client(server.grpc_target, timeout=2) as client:
            with pytest.raises(RuntimeError, match="model failed") as raised:
                with client.reservation("shop", {"tokens": "k"}, estimate=10):
                    assert server.stop() == 0
                    raise RuntimeError("model failed")
        return raised.value
    finally:
        server.stop()


def refund_noted(error: BaseException) -> None:
    notes = getattr(error, "__notes__", [])
    assert any("could not be settled" in n and "UNAVAILABLE" in n for n in notes), notes
    printed = "".join(traceback.format_exception(error))
    assert "the reservation could not be settled" in printed, printed


def test_a_refund_that_cannot_be_sent_keeps_the_blocks_exception(sluice_bin: Path, tmp_path: Path):
    refund_noted(refund_that_cannot_be_sent(sluice_bin, tmp_path))


def test_a_refund_that_cannot_be_sent_is_noted_where_python_has_no_add_note(
    sluice_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Python 3.10 has no `BaseException.add_note`: the package then appends to `__notes__` itself, the list 3.11
    reads. Here the package is made to take that path, and nothing else adds the note."""
    used: list[str] = []

    def without_add_note(error: BaseException, note: str) -> None:
        used.append(note)
        _reservation.append_note(error, note)

    monkeypatch.setattr(_reservation, "add_note", without_add_note)
    error = refund_that_cannot_be_sent(sluice_bin, tmp_path)
    assert len(used) == 1
    refund_noted(error)


def test_the_note_fallback_keeps_every_note():
    error = RuntimeError("model failed")
    _reservation.append_note(error, "first")
    _reservation.append_note(error, "second")
    assert error.__notes__ == ["first", "second"]
    noted = ValueError("noted already")
    noted.add_note("by Python")
    _reservation.append_note(noted, "by the fallback")
    assert noted.__notes__ == ["by Python", "by the fallback"]
    printed = "".join(traceback.format_exception(noted))
    assert printed.rstrip().endswith("by Python\nby the fallback"), printed
    # A stray non-list `__notes__` is replaced rather than appended to by accident.
    odd = RuntimeError("odd")
    odd.__notes__ = "not a list"  # type: ignore[assignment]
    _reservation.append_note(odd, "note")
    assert odd.__notes__ == ["note"]


def test_reservation_that_meets_no_limit_holds_and_settles_nothing(client: Client):
    with client.reservation("shop", {"colour": "blue"}, estimate=10) as r:
        assert r.id == ""
    assert r.settled is None


def test_check_and_report(client: Client):
    key = {"tokens": fresh("k")}
    assert client.check("shop", key, cost=1000).allowed
    assert not client.check("shop", key, cost=1001).allowed
    assert tokens_left(client, key) == 1000, "Check counts nothing"
    assert client.report("shop", key, cost=1200).statuses[0].remaining == 0, "Report is never refused"
    assert not client.check("shop", key, cost=1).allowed


# Lists and offenders.


def test_run_time_lists(client: Client):
    address = "198.51.100.9"
    assert client.should_rate_limit("shop", {"remote_address": address}).allowed
    added = client.add_list_entries("shop", "blocked", ["198.51.100.0/24", "192.0.2.77"], ttl=3600)
    assert added == 2
    assert client.add_list_entries("shop", "blocked", ["203.0.113.5"]) == 1
    entries = {e.value: e.expires_in for e in client.get_list_entries("shop", "blocked")}
    assert entries.keys() >= {"198.51.100.0/24", "192.0.2.77", "203.0.113.5"}
    ranged = entries["198.51.100.0/24"]
    assert ranged is not None and HOUR - datetime.timedelta(seconds=30) < ranged <= HOUR
    assert entries["203.0.113.5"] is None, "added without a ttl: until removed"
    denied = client.should_rate_limit("shop", {"remote_address": address})
    assert not denied.allowed
    assert ("X-Sluice-List-Deny", "blocked") in denied.headers
    assert client.remove_list_entries("shop", "blocked", ["198.51.100.0/24", "192.0.2.77", "203.0.113.5"]) == 3
    assert client.should_rate_limit("shop", {"remote_address": address}).allowed


def test_top_offenders(client: Client):
    user = fresh("noisy")
    for _ in range(5):
        client.should_rate_limit("shop", {"user": user})

    def counted() -> bool:
        rules = {r.rule: r for r in client.top_offenders("shop", span="minute", limit=1000)}
        rule = rules.get("shop.user")
        if rule is None:
            return False
        hits = {o.value: o.count for o in rule.hits}
        denied = {o.value: o.count for o in rule.denied}
        return hits.get(f"user={user}") == 5 and denied.get(f"user={user}") == 2

    # Each instance adds what it counted into the store every 5 seconds.
    wait_until(counted, 15, f"user={user} among the offenders")
    assert client.top_offenders("shop", span="hour", limit=1000)


# Errors.


def test_errors_name_the_input(sluice: Sluice, client: Client):
    with pytest.raises(InvalidArgument, match="domain is empty") as raised:
        client.should_rate_limit("", {"user": "a"})
    assert isinstance(raised.value, ValueError)
    assert raised.value.method == "ShouldRateLimit"
    with pytest.raises(InvalidArgument, match=r"^Reserve: INVALID_ARGUMENT: estimate: descriptors\[0\]"):
        client.reserve("shop", {"tokens": fresh("k")}, estimate=0)
    with pytest.raises(InvalidArgument, match=r"values\[1\]: '10\.0\.0\.0/40' is not a CIDR range"):
        client.add_list_entries("shop", "blocked", ["192.0.2.1", "10.0.0.0/40"])
    # Refused before any call, worded as the server words it.
    with pytest.raises(InvalidArgument, match=r"^GetRemaining: INVALID_ARGUMENT: cost: -1 is not between 0 and"):
        client.get_remaining("shop", {"user": "a"}, cost=-1)
    with pytest.raises(InvalidArgument, match=r"descriptors\[1\]\.entries\[0\]: expected a \(key, value\) pair"):
        client.should_rate_limit("shop", [{"user": "a"}, ["user"]])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match=r"descriptors\[0\]: expected a mapping or \(key, value\) pairs"):
        client.should_rate_limit("shop", [42])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="on_error: 'ignore'"):
        client.reservation("shop", {"tokens": "k"}, estimate=1, on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(NotFound, match="no list 'allowed'") as missing:
        client.get_list_entries("shop", "allowed")
    assert isinstance(missing.value, LookupError)
    with Client(sluice.grpc_target, admin_token="wrong") as stranger:
        with pytest.raises(Unauthenticated) as refused:
            stranger.get_list_entries("shop", "blocked")
    assert isinstance(refused.value, PermissionError)
    with Client(f"127.0.0.1:{free_port()}", timeout=2) as nobody:
        with pytest.raises(Unavailable) as unreachable:
            nobody.should_rate_limit("shop", {"user": "a"})
    assert isinstance(unreachable.value, ConnectionError)


def test_descriptors_as_mappings_or_pairs(client: Client):
    """As the guide says: a mapping is one descriptor; a list holds descriptors, each a mapping or a list of pairs;
    a flat list of pairs is refused, not guessed at."""
    user = fresh("u")
    (one,) = client.should_rate_limit("shop", [[("plan", "pro"), ("user", user)]]).statuses
    assert one.limit is not None and (one.limit.name, one.remaining) == ("plan_user_per_hour", 4)
    (same,) = client.get_remaining("shop", {"plan": "pro", "user": user})
    assert same.remaining == 4, "the pairs and the mapping are the same descriptor"
    plan, alone = client.should_rate_limit("shop", [{"plan": "pro"}, [("user", user)]]).statuses
    assert plan.limit is None
    assert alone.limit is not None and (alone.limit.name, alone.remaining) == ("user_per_hour", 2)
    with pytest.raises(InvalidArgument, match=r"descriptors\[0\]\.entries\[0\]: expected a \(key, value\) pair"):
        client.should_rate_limit("shop", [("user", user)])  # type: ignore[list-item]
    assert client.get_remaining("shop", {"user": user})[0].remaining == 2, "the refused call counted nothing"


# A closed client.


def spent_user(client: Client) -> dict[str, str]:
    """A `user` whose hour is spent: a WaitForPermit for it is held until the hour ends."""
    user = {"user": fresh("u")}
    client.should_rate_limit("shop", user, hits_addend=3)
    return user


def test_a_call_on_a_closed_client_raises_client_closed(sluice: Sluice):
    with Client(sluice.grpc_target) as client:
        assert client.should_rate_limit("shop", {"user": fresh("u")}).allowed
    with pytest.raises(ClientClosed, match="^ShouldRateLimit: the client is closed$") as raised:
        client.should_rate_limit("shop", {"user": fresh("u")})
    assert isinstance(raised.value, SluiceError) and raised.value.method == "ShouldRateLimit"
    client.close()  # again: nothing more
    with pytest.raises(ClientClosed):
        with client.reservation("shop", {"tokens": fresh("k")}, estimate=1):
            pytest.fail("the block ran on a closed client")
    # A channel of the caller's, closed by the caller.
    channel = grpc.insecure_channel(sluice.grpc_target)
    theirs = Client(channel=channel)
    assert theirs.should_rate_limit("shop", {"user": fresh("u")}).allowed
    channel.close()
    with pytest.raises(ClientClosed, match="^GetRemaining: "):
        theirs.get_remaining("shop", {"user": fresh("u")})


def test_closing_a_client_ends_a_wait_in_flight_with_client_closed(sluice: Sluice, client: Client):
    user = spent_user(client)
    waiting = Client(sluice.grpc_target)
    closer = threading.Timer(0.3, waiting.close)
    closer.start()
    started = time.monotonic()
    try:
        with pytest.raises(ClientClosed, match="^WaitForPermit: the client is closed$"):
            waiting.wait_for_permit("shop", user, max_wait=3600)
    finally:
        closer.join()
    assert time.monotonic() - started < 5, "the wait ended when the client closed, not when the hour did"


def test_async_close_ends_a_wait_in_flight_with_client_closed_not_cancellation(sluice: Sluice, client: Client):
    async def main() -> None:
        # A call after close, and on a closed channel of the caller's.
        async with AsyncClient(sluice.grpc_target) as closed:
            pass
        with pytest.raises(ClientClosed, match="^ShouldRateLimit: the client is closed$"):
            await closed.should_rate_limit("shop", {"user": fresh("u")})
        channel = grpc.aio.insecure_channel(sluice.grpc_target)
        theirs = AsyncClient(channel=channel)
        await channel.close()
        with pytest.raises(ClientClosed, match="^ShouldRateLimit: "):
            await theirs.should_rate_limit("shop", {"user": fresh("u")})

        # A wait in flight when another task closes the client: the waiting task gets ClientClosed.
        user = spent_user(client)
        waiting = AsyncClient(sluice.grpc_target)
        task = asyncio.create_task(waiting.wait_for_permit("shop", user, max_wait=3600))
        await asyncio.sleep(0.3)
        assert not task.done()
        started = time.monotonic()
        await waiting.close()
        with pytest.raises(ClientClosed, match="^WaitForPermit: the client is closed$"):
            await asyncio.wait_for(task, 5)
        assert not task.cancelled() and time.monotonic() - started < 5

        # A task its caller cancels still sees CancelledError: on an open client, and when the client closes
        # before the cancelled task has woken.
        for close_too in (False, True):
            other = AsyncClient(sluice.grpc_target)
            task = asyncio.create_task(other.wait_for_permit("shop", user, max_wait=3600))
            await asyncio.sleep(0.3)
            task.cancel()
            if close_too:
                await other.close()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert task.cancelled(), close_too
            await other.close()

        # A caller's own timeout is still a timeout.
        async with AsyncClient(sluice.grpc_target) as timed:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(timed.wait_for_permit("shop", user, max_wait=3600), 0.3)

    asyncio.run(main())


# Exceptions across processes.


def raise_in_worker(target: str, what: str) -> None:
    """Run in a worker process: a real call that raises, the exception going back to the caller by pickle."""
    with Client(target, admin_token=TOKEN) as client:
        if what == "NotFound":
            client.get_list_entries("shop", "allowed")
        elif what == "InvalidArgument":
            client.should_rate_limit("", {"user": "a"})
        elif what == "BudgetExceeded":
            with client.reservation("shop", {"tokens": fresh("k")}, estimate=1001):
                pass
        elif what == "ClientClosed":
            client.close()
            client.should_rate_limit("shop", {"user": "a"})
        elif what == "noted":
            try:
                client.get_list_entries("shop", "allowed")
            except NotFound as error:
                error.add_note("raised in a worker")
                raise
    raise AssertionError(f"{what}: nothing raised")


def exception_state(error: BaseException) -> dict[str, Any]:
    """What a caller reads of an exception: its type, message, fields and notes."""
    fields = ("method", "code", "details", "domain", "statuses", "__notes__")
    return {"type": type(error), "str": str(error), **{f: getattr(error, f, None) for f in fields}}


def raised_here(sluice: Sluice, what: str) -> SluiceError:
    with pytest.raises(SluiceError) as raised:
        raise_in_worker(sluice.grpc_target, what)
    return raised.value


WORKER_ERRORS = ["NotFound", "InvalidArgument", "BudgetExceeded", "ClientClosed", "noted"]


@pytest.mark.parametrize("what", WORKER_ERRORS)
def test_every_exception_survives_pickle(sluice: Sluice, what: str):
    error = raised_here(sluice, what)
    copy = pickle.loads(pickle.dumps(error))
    assert exception_state(copy) == exception_state(error)
    assert copy.args == error.args


def test_exceptions_built_by_hand_survive_pickle():
    for error in [
        SluiceError("plain"),
        RpcError("Settle", grpc.StatusCode.INTERNAL, "store failed"),
        Unavailable("ShouldRateLimit", grpc.StatusCode.UNAVAILABLE, ""),
        DeadlineExceeded("WaitForPermit", grpc.StatusCode.DEADLINE_EXCEEDED, "ran out"),
        BudgetExceeded("llm", ()),
        ClientClosed("Reserve"),
    ]:
        copy = pickle.loads(pickle.dumps(error))
        assert exception_state(copy) == exception_state(error)


def test_exceptions_raised_in_a_worker_process_are_raised_again_in_the_caller(sluice: Sluice):
    # Spawned, not forked: a forked child would inherit this process's gRPC state.
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        for what in WORKER_ERRORS:
            with pytest.raises(SluiceError) as raised:
                pool.submit(raise_in_worker, sluice.grpc_target, what).result(timeout=60)
            error = raised.value
            here = raised_here(sluice, what)
            expected = exception_state(here)
            got = exception_state(error)
            if what == "BudgetExceeded":
                # The same refusal, of another key: compare all but the reset times.
                assert [s.code for s in error.statuses] == [Code.OVER_LIMIT]
                assert error.statuses[0].limit.name == "tokens_per_hour"
                got["statuses"] = expected["statuses"] = None
            assert got == expected, what
            if what == "noted":
                assert error.__notes__ == ["raised in a worker"]


# The asyncio client: the same calls, awaited.


def test_async_client(sluice: Sluice):
    async def main() -> None:
        async with AsyncClient(sluice.grpc_target, admin_token=TOKEN) as client:
            user = {"user": fresh("u")}
            answers = [await client.should_rate_limit("shop", user) for _ in range(3)]
            answers.append(await client.should_rate_limit_envoy("shop", user))
            assert [a.code for a in answers] == [Code.OK, Code.OK, Code.OK, Code.OVER_LIMIT]
            (left,) = await client.get_remaining("shop", user)
            assert left.remaining == 0 and left.retry_after is not None and left.retry_after > datetime.timedelta(0)

            tick = {"tick": fresh("t")}
            await client.should_rate_limit("shop", tick)
            assert (await client.wait_for_permit("shop", tick, max_wait=2)).allowed
            assert not (await client.wait_for_permit("shop", user, max_wait=0.5)).allowed
            with pytest.raises(DeadlineExceeded):
                await client.wait_for_permit("shop", user, max_wait=3600, timeout=0.3)

            key = {"tokens": fresh("k")}
            async with client.reservation("shop", key, estimate=600) as r:
                assert (await client.get_remaining("shop", key))[0].remaining == 400
                r.actual = 100
            assert r.settled is not None and r.settled.settlements[0].refunded == 500
            with pytest.raises(RuntimeError):
                async with client.reservation("shop", key, estimate=600):
                    raise RuntimeError("model failed")
            with pytest.raises(asyncio.CancelledError):
                async with client.reservation("shop", key, estimate=600):
                    raise asyncio.CancelledError()
            assert (await client.get_remaining("shop", key))[0].remaining == 900, "both refunded"
            with pytest.raises(BudgetExceeded):
                async with client.reservation("shop", key, estimate=901):
                    pytest.fail("the block ran over budget")

            assert await client.add_list_entries("shop", "blocked", ["192.0.2.200"], ttl=60) == 1
            assert "192.0.2.200" in [e.value for e in await client.get_list_entries("shop", "blocked")]
            assert not (await client.should_rate_limit("shop", {"remote_address": "192.0.2.200"})).allowed
            assert await client.remove_list_entries("shop", "blocked", ["192.0.2.200"]) == 1
            assert isinstance(await client.top_offenders("shop"), list)
            with pytest.raises(InvalidArgument, match="no descriptors"):
                await client.should_rate_limit("shop", [])

    asyncio.run(main())


# The docs page's examples.

GUIDE = REPO / "docs" / "src" / "client-python.md"
GUIDE_BLOCKS = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
#: The budgeted LLM call calls the application's own model: `test_the_docs_budgeted_llm_call_runs_as_printed`
#: runs it with a fake one.
LLM_BLOCK = "llm.generate("


@pytest.fixture(scope="module")
def deployed(sluice_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sluice]:
    """sluice serving deploy/config with an admin token, as the README's run command starts it."""
    workdir = tmp_path_factory.mktemp("client-guide")
    with running_sluice(sluice_bin, REPO / "deploy" / "config", workdir, ("--admin-token", TOKEN)) as server:
        yield server


def spend_a_second(target: str) -> None:
    """Spends the second's 10 hits of edge's `remote_address` 10.0.0.1, so that a wait for a permit waits."""
    with Client(target) as client:
        assert any(
            not client.should_rate_limit("edge", {"remote_address": "10.0.0.1"}, hits_addend=10).allowed
            for _ in range(3)
        )


def check_connecting(out: str, client: Client) -> None:
    assert out == "True\nTrue\n", out


def check_waiting(out: str, client: Client) -> None:
    waited = re.fullmatch(r"allowed after ([\d.e-]+) s\n", out)
    assert waited and 0 <= float(waited.group(1)) <= 1.0, out


def check_lists(out: str, client: Client) -> None:
    assert out.splitlines()[0] == "1", out
    assert "203.0.113.0/24" in [e.value for e in client.get_list_entries("edge", "blocked")]
    for line in out.splitlines()[1:]:
        assert re.fullmatch(r"edge\.\S+ \[.*\]", line), out


#: Each block but the LLM call, known by a line of its own, with what it must print.
GUIDE_CHECKS = {
    "AsyncClient(": check_connecting,
    "wait_for_permit(": check_waiting,
    "add_list_entries(": check_lists,
}


def test_every_python_block_of_the_guide_is_run():
    assert len(GUIDE_BLOCKS) == len(GUIDE_CHECKS) + 1, GUIDE_BLOCKS
    for block in GUIDE_BLOCKS:
        claimed = [key for key in [*GUIDE_CHECKS, LLM_BLOCK] if key in block]
        assert len(claimed) == 1, (claimed, block)


@pytest.mark.parametrize("key", list(GUIDE_CHECKS))
def test_the_guides_blocks_run_on_their_own_as_printed(deployed: Sluice, tmp_path: Path, key: str):
    """Each block in a Python process of its own, as printed but for the server's address: its imports, its client
    and its token are its own."""
    (block,) = [b for b in GUIDE_BLOCKS if key in b]
    assert block.count("127.0.0.1:8081") >= 1, block
    if key == "wait_for_permit(":
        spend_a_second(deployed.grpc_target)
    out = subprocess.run(
        [sys.executable, "-c", block.replace("127.0.0.1:8081", deployed.grpc_target)],
        cwd=tmp_path,
        env={**os.environ, "SLUICE_ADMIN_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    with Client(deployed.grpc_target, admin_token=TOKEN) as client:
        GUIDE_CHECKS[key](out.stdout, client)


def test_the_docs_budgeted_llm_call_runs_as_printed(sluice_bin: Path, tmp_path: Path):
    """docs/src/client-python.md's ten lines, run against deploy/config's `llm` domain with a fake model: a call
    that fits is settled with its actual tokens, one over budget never reaches the model."""
    (example,) = [b for b in GUIDE_BLOCKS if LLM_BLOCK in b]
    assert len(example.strip().splitlines()) <= 10, example

    class Reply:
        def __init__(self, input_tokens: int, output_tokens: int):
            self.input_tokens, self.output_tokens = input_tokens, output_tokens

    class Model:
        def __init__(self) -> None:
            self.calls = 0

        def generate(self, prompt: str, max_tokens: int) -> Reply:
            self.calls += 1
            return Reply(len(prompt), max_tokens // 5)

    with running_sluice(sluice_bin, REPO / "deploy" / "config", tmp_path) as server:
        code = example.replace("127.0.0.1:8081", server.grpc_target)
        model = Model()
        fits = {"llm": model, "prompt": "x" * 1200, "user_id": fresh("docs"), "count_tokens": len}
        exec(code, fits)
        assert model.calls == 1 and fits["reply"] is not None
        r = fits["r"]
        assert r.settled.settled
        assert r.settled.settlements[0].refunded > 0, "500 output tokens held, 100 spent"
        over = {**fits, "prompt": "x" * 60_000}
        exec(code, over)
        assert model.calls == 1 and over["reply"] is None, "over the 50 000 input tokens a minute: not called"
        fits["sluice"].close()
        over["sluice"].close()
