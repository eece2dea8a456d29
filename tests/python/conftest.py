"""Shared fixtures for the Python suite: the built sluice binary as a subprocess, free ports, and the sluice.v1
stubs compiled from this repository's proto.

The Envoy messages always come from PyPI's `xds-protos` (Envoy's own data-plane-api, compiled by others), never
from this repository's copies: that is what makes these tests a wire-compatibility check. Only
`proto/sluice/v1/sluice.proto` is compiled here, and its generated imports (`envoy.service.ratelimit.v3.rls_pb2`,
...) resolve to the xds-protos modules.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]

# Bounds on every wait, so a broken binary fails the test instead of hanging the run.
STARTUP_TIMEOUT_S = 15.0
SHUTDOWN_TIMEOUT_S = 5.0


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports on 127.0.0.1 that nothing listens on right now.

    The kernel picks them; the sockets are closed before the ports are handed to a child process, so another
    process could in theory take one in between. Ephemeral ports are handed out round-robin, which makes that rare,
    and sluice's startup retries on fresh ports if it happens.
    """
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def free_port() -> int:
    return free_ports(1)[0]


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    """Polls `predicate` until it is true, failing the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


def terminate(proc: subprocess.Popen, timeout: float = SHUTDOWN_TIMEOUT_S) -> int | None:
    """Sends SIGTERM to `proc` (by PID) and waits; SIGKILLs it if it does not exit in time.

    Returns the exit code of a process that stopped on its own after SIGTERM, None if it had to be killed.
    """
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)
        return None


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "<no output>"
    return text[-limit:] if text else "<no output>"


class SluiceExited(Exception):
    def __init__(self, code: int, output: str):
        super().__init__(f"sluice exited with code {code} before it was healthy:\n{output}")
        self.output = output


class Sluice:
    """One `sluice serve` process with its in-memory store, on free ports of 127.0.0.1.

    `config` None: no `--config` (the rules come from elsewhere, e.g. `--xds-server` in `extra_args`).
    `env` adds variables to (or overrides them in) the environment the process inherits, SLUICE_* removed.
    """

    def __init__(
        self,
        binary: Path,
        config: Path | None,
        workdir: Path,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        grpc_port: int | None = None,
    ):
        self.grpc_port, self.http_port = free_ports(2)
        if grpc_port is not None:
            self.grpc_port = grpc_port
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        self.log_path = workdir / f"sluice-{self.grpc_port}.log"
        # A file rather than a pipe: nobody reads the pipe while the test runs, and a full pipe would block the server.
        self._log = open(self.log_path, "ab")
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        # Logs only matter when something fails; keep them readable in the failure message.
        inherited.setdefault("RUST_LOG", "info")
        inherited["NO_COLOR"] = "1"
        self.proc = subprocess.Popen(
            [
                str(binary),
                "serve",
                *(("--config", str(config)) if config is not None else ()),
                "--grpc-addr",
                self.grpc_target,
                "--http-addr",
                f"127.0.0.1:{self.http_port}",
                *extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**inherited, **(env or {})},
        )

    @property
    def output(self) -> str:
        return _tail(self.log_path)

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise SluiceExited(self.proc.returncode, self.output)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/healthz", timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_healthy(self) -> None:
        wait_until(self._healthy, STARTUP_TIMEOUT_S, f"sluice's /healthz on port {self.http_port}")
        # /healthz is served by the HTTP listener; make sure the gRPC one accepts connections too.
        with socket.create_connection(("127.0.0.1", self.grpc_port), timeout=1):
            pass

    def stop(self) -> int | None:
        try:
            return terminate(self.proc)
        finally:
            self._log.close()


@pytest.fixture(scope="session")
def sluice_bin() -> Path:
    """The sluice binary under test: $SLUICE_BIN, else the debug build (the runner builds it before pytest)."""
    path = Path(os.environ.get("SLUICE_BIN", REPO / "target" / "debug" / "sluice"))
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(f"sluice binary not found at {path}: run `cargo build` first or set SLUICE_BIN")
    return path


@contextlib.contextmanager
def running_sluice(
    binary: Path,
    config: Path | None,
    workdir: Path,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    grpc_port: int | None = None,
) -> Iterator[Sluice]:
    """Runs sluice on a config file or directory while the block runs (on `grpc_port` when given, to restart it
    where its clients know it).

    On the way out the process gets SIGTERM and must exit 0 within a few seconds: that is the check of graceful
    shutdown. When the block raised, the process is still stopped (killed if need be) and the error goes on.
    """
    attempts = 3
    for attempt in range(1, attempts + 1):
        server = Sluice(binary, config, workdir, extra_args, env, grpc_port)
        try:
            server.wait_healthy()
        except SluiceExited as e:
            server.stop()
            exited = e
        except BaseException:
            server.stop()
            raise
        else:
            break
        # Another process took a port between free_ports() and sluice's bind: try again on fresh ones.
        if "cannot listen" not in exited.output or attempt == attempts:
            pytest.fail(str(exited))
    try:
        yield server
    except BaseException:
        server.stop()
        raise
    if server.proc.poll() is not None:
        code = server.stop()
        pytest.fail(f"sluice exited on its own while in use (code {code}):\n{server.output}")
    code = server.stop()
    if code is None:
        pytest.fail(f"sluice did not exit within {SHUTDOWN_TIMEOUT_S:.0f}s of SIGTERM:\n{server.output}")
    if code != 0:
        pytest.fail(f"sluice exited with code {code} after SIGTERM:\n{server.output}")


@pytest.fixture
def start_sluice(sluice_bin: Path, tmp_path: Path) -> Iterator[Callable[..., Sluice]]:
    """Starts sluice processes for one test (`start(config, *extra_flags, env={...})`); each is stopped, and its
    shutdown checked, when the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda config, *extra, env=None: stack.enter_context(
            running_sluice(sluice_bin, config, tmp_path, extra, env)
        )


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[[str, str], Path]:
    """Writes one domain file into a fresh config directory and returns the directory."""
    config_dir = tmp_path / "config"

    def write(text: str, name: str = "domain.yaml") -> Path:
        config_dir.mkdir(exist_ok=True)
        (config_dir / name).write_text(text)
        return config_dir

    return write


@pytest.fixture(scope="session")
def sluice_stubs(tmp_path_factory: pytest.TempPathFactory) -> types.SimpleNamespace:
    """`sluice_pb2` and `sluice_pb2_grpc`, generated from proto/sluice/v1/sluice.proto with grpcio-tools.

    Only that one file is compiled: its envoy/... imports must resolve to xds-protos' modules, so that both
    services exchange the very same Envoy message classes.
    """
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("stubs")
    # grpc_tools bundles the google/protobuf/*.proto well-known types; xds-protos does not ship .proto files, so
    # the envoy/... imports are read from this repo's copies for type-checking only and never generated.
    well_known = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{REPO / 'proto'}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        str(REPO / "proto" / "sluice" / "v1" / "sluice.proto"),
    ]
    if protoc.main(args) != 0:
        pytest.fail(f"protoc failed on proto/sluice/v1/sluice.proto: {' '.join(args)}")
    generated = out / "sluice" / "v1" / "sluice_pb2.py"
    imports = generated.read_text()
    for module in (
        "envoy.service.ratelimit.v3 import rls_pb2",
        "envoy.extensions.common.ratelimit.v3 import ratelimit_pb2",
    ):
        assert f"from {module}" in imports, f"generated sluice_pb2 does not import `{module}`"

    sys.path.insert(0, str(out))
    try:
        sluice_pb2 = importlib.import_module("sluice.v1.sluice_pb2")
        sluice_pb2_grpc = importlib.import_module("sluice.v1.sluice_pb2_grpc")
    finally:
        sys.path.remove(str(out))

    # The generated module must share the message classes of xds-protos, not carry copies of them.
    from envoy.service.ratelimit.v3 import rls_pb2

    request_type = sluice_pb2.DESCRIPTOR.services_by_name["RateLimiter"].methods_by_name["ShouldRateLimit"].input_type
    assert request_type is rls_pb2.RateLimitRequest.DESCRIPTOR
    return types.SimpleNamespace(pb2=sluice_pb2, grpc=sluice_pb2_grpc, dir=out)


@contextlib.contextmanager
def open_process(args: list[str], log_path: Path, **kwargs) -> Iterator[subprocess.Popen]:
    """Runs a helper process (e.g. Envoy) with its output in `log_path`, and stops it by PID on the way out."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, **kwargs)
        try:
            yield proc
        finally:
            terminate(proc)


@contextlib.contextmanager
def redis_server(workdir: Path) -> Iterator[str]:
    """A `redis-server` on a free port of 127.0.0.1 while the block runs (stopped by PID); yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (the README's test command installs it)")
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    with open_process(args, workdir / f"redis-{port}.log"):

        def answers() -> bool:
            out = subprocess.run(["redis-cli", "-p", str(port), "PING"], capture_output=True, text=True)
            return out.stdout.strip() == "PONG"

        wait_until(answers, 10, f"redis-server on port {port}")
        yield f"redis://127.0.0.1:{port}"
