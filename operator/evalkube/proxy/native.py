"""The native data plane of the model bridge: ``evalkube-proxy`` (Go, ``operator/evalkube-proxy``).

Same HTTP contract as the Python proxy in :mod:`evalkube.proxy.routes` (grader and control
listeners, budgets, usage audit, metrics, retries, key files re-read on rotation), compiled,
for work-unit pods: one core carries about three times the model calls (``docs/proxy.md``).
Python keeps everything that is configuration: :func:`native_config` turns the run's resolved
providers and the proxy's settings into the binary's JSON configuration (key *sources* only,
never a key), which reaches the binary on its standard input.

- :func:`exec_native` replaces the current process with the binary (``evalkube proxy
  --engine native``: the sidecar keeps one process, signals go straight to it);
- :class:`NativeBridge` runs it as a child with the same methods as
  :class:`~evalkube.proxy.bridge.ModelBridge` (tests run the proxy suite against both).

The local ``local:`` embeddings provider runs sentence-transformers in-process, so it is served
by the Python proxy only; ``--engine auto`` picks Python for runs that name it.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from evalkube import limits
from evalkube.proxy.bridge_base import CONTROL_TIMEOUT, BridgeLifecycle, grader_listen
from evalkube.proxy.control import ControlClient
from evalkube.proxy.local_embeddings import LOCAL_PROVIDER
from evalkube.proxy.upstream import Provider
from evalkube.util.process import signal_on_parent_death

#: Path of the ``evalkube-proxy`` binary; else it is looked up on ``PATH``.
BINARY_ENV = "EVALKUBE_PROXY_BIN"
BINARY_NAME = "evalkube-proxy"
CONTROL_SOCKET_NAME = "control.sock"


class NativeProxyUnavailable(RuntimeError):
    """The native proxy cannot be used here; the message says what to do."""


def native_binary(environ: Mapping[str, str] | None = None) -> str | None:
    """The ``evalkube-proxy`` executable: ``$EVALKUBE_PROXY_BIN``, else the one on ``PATH``,
    else the one beside this Python (``make native-proxy`` puts it in ``.venv/bin``, found
    even when the virtualenv is not activated)."""
    env = os.environ if environ is None else environ
    configured = env.get(BINARY_ENV)
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    found = shutil.which(BINARY_NAME, path=env.get("PATH"))
    if found is None:
        found = shutil.which(BINARY_NAME, path=str(Path(sys.executable).parent))
    return found


def require_native_binary() -> str:
    binary = native_binary()
    if binary is None:
        raise NativeProxyUnavailable(
            f"the native proxy binary {BINARY_NAME} was not found: set {BINARY_ENV} to its path, "
            "put it on PATH (`make native-proxy` builds it into .venv/bin), or use "
            "--engine python"
        )
    return binary


def uses_local_provider(*models: str | None) -> bool:
    """True when a default model is served by the in-process ``local:`` provider."""
    return any(m is not None and m.startswith(f"{LOCAL_PROVIDER}:") for m in models)


def native_config(
    providers: Mapping[str, Provider],
    *,
    listen: str | None,
    control_listen: str | None = None,
    control_token_file: Path | str | None = None,
    judge_model: str | None = None,
    embedding_model: str | None = None,
    max_calls: int = limits.MAX_MODEL_CALLS_DEFAULT,
    planned_executions: int | None = None,
    unit_id: str = "default",
    retries: int = limits.GENERATION_RETRIES_DEFAULT,
    backoff_base: float = 0.5,
    log_level: str = "INFO",
    egress_proxy: str | None = None,
    egress_grant_file: Path | str | None = None,
    state_dir: Path | str | None = None,
) -> dict[str, Any]:
    """The binary's configuration: the same choices the Python proxy would make."""
    return {
        "listen": listen,
        "control_listen": control_listen,
        "control_token_file": str(control_token_file) if control_token_file else None,
        "judge_model": judge_model,
        "embedding_model": embedding_model,
        "max_calls": max_calls,
        "planned_executions": planned_executions,
        "unit_id": unit_id,
        "retries": retries,
        "backoff_base": backoff_base,
        "log_level": log_level,
        "egress_proxy": egress_proxy,
        "egress_grant_file": str(egress_grant_file) if egress_grant_file else None,
        "state_dir": str(state_dir) if state_dir else None,
        "providers": {
            name: {
                "base_url": p.base_url,
                "api_key_env": p.api_key_env,
                "api_key_file": p.api_key_file,
                "headers": dict(p.headers),
                "timeout": p.timeout,
                "api": p.api,
            }
            for name, p in providers.items()
        },
    }


def _config_pipe(config: Mapping[str, Any]) -> int:
    """A pipe's read end holding ``config`` (a configuration is far below a pipe's buffer)."""
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "wb") as writer:
        writer.write(json.dumps(config).encode())
    return read_end


def exec_native(binary: str, config: Mapping[str, Any]) -> None:
    """Replace this process with ``binary`` serving ``config`` (never returns)."""
    read_end = _config_pipe(config)
    os.dup2(read_end, 0)
    os.close(read_end)
    os.execv(binary, [binary, "--config", "-"])


class NativeBridge(BridgeLifecycle):
    """``evalkube-proxy`` as a child process, with :class:`~evalkube.proxy.bridge.ModelBridge`'s
    methods: control operations go to its control listener, a unix socket in a private
    directory (mode 0700), so no token is needed."""

    def __init__(
        self,
        providers: Mapping[str, Provider],
        *,
        judge_model: str | None = None,
        embedding_model: str | None = None,
        retries: int = limits.GENERATION_RETRIES_DEFAULT,
        backoff_base: float = 0.5,
        max_calls_per_execution: int = limits.MAX_MODEL_CALLS_DEFAULT,
        planned_executions: int | None = None,
        binary: str | None = None,
        stderr_path: Path | None = None,
        **ignored: Any,
    ) -> None:
        """``stderr_path``: append the binary's log there instead of this process's stderr.
        ``ignored``: ModelBridge options with no meaning here (``registry``: the binary keeps
        its own metrics, served on ``/metrics``)."""
        self._config = partial(
            native_config,
            dict(providers),
            judge_model=judge_model,
            embedding_model=embedding_model,
            max_calls=max_calls_per_execution,
            planned_executions=planned_executions,
            retries=retries,
            backoff_base=backoff_base,
        )
        self.binary = binary
        self.stderr_path = stderr_path
        self.endpoint: str | None = None
        self.control_endpoint: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._client: ControlClient | None = None
        self._tmpdir: str | None = None

    def start(self, socket_path: str | None = None) -> str:
        """Start serving; the grader endpoint (``ModelBridge.start``'s ``socket_path`` rules)."""
        if self.process is not None:
            raise RuntimeError("the model bridge is already started")
        binary = self.binary or require_native_binary()
        self._tmpdir = tempfile.mkdtemp(prefix="evalkube-native-bridge-")
        control = Path(self._tmpdir) / CONTROL_SOCKET_NAME
        config = self._config(
            listen=grader_listen(socket_path, self._tmpdir), control_listen=f"unix:{control}"
        )
        read_end = _config_pipe(config)
        parent = os.getpid()
        log = self.stderr_path.open("ab") if self.stderr_path is not None else None
        try:
            self.process = subprocess.Popen(
                [binary, "--config", "-"],
                stdin=read_end,
                stdout=subprocess.PIPE,
                stderr=log,
                close_fds=True,
                preexec_fn=lambda: _die_with(parent),
            )
        finally:
            os.close(read_end)
            if log is not None:
                log.close()
        try:
            ready = _ready_line(self.process)
        except BaseException:
            self.stop()
            raise
        self.endpoint = ready["endpoint"]
        self.control_endpoint = ready["control_endpoint"]
        self._client = ControlClient(f"unix:{control}", restart_retry_seconds=0)
        assert self.endpoint is not None
        return self.endpoint

    def stop(self) -> None:
        """Stop the child (SIGTERM: it removes its sockets), remove the directory; idempotent."""
        if self._client is not None:
            self._client.close()
            self._client = None
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(CONTROL_TIMEOUT)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            if process.stdout is not None:
                process.stdout.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    @property
    def started(self) -> bool:
        return self.process is not None

    # -- control -----------------------------------------------------------------------------
    def configure_unit(
        self, unit_id: str, max_calls_per_execution: int, planned_executions: int
    ) -> None:
        self._control().configure_unit(unit_id, max_calls_per_execution, planned_executions)

    def open_executions(self, tokens: Iterable[str]) -> None:
        self._control().open_executions(tokens)

    def take_usage(self, execution_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        return self._control().take_usage(execution_ids)

    def budget(self) -> dict[str, object]:
        return self._control().budget()

    def metrics(self) -> str:
        return self._control().metrics()

    def _control(self) -> ControlClient:
        if self._client is None:
            raise RuntimeError("the model bridge is not started; call start() first")
        return self._client


def _ready_line(process: subprocess.Popen[bytes]) -> dict[str, Any]:
    """The binary's first line on stdout (its endpoints), or RuntimeError when it exits or
    stays silent for :data:`CONTROL_TIMEOUT`."""
    assert process.stdout is not None
    deadline = time.monotonic() + CONTROL_TIMEOUT
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"{BINARY_NAME} did not start within {CONTROL_TIMEOUT:g} s")
        if select.select([process.stdout], [], [], left)[0]:
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                code = process.wait(CONTROL_TIMEOUT)
                raise RuntimeError(f"{BINARY_NAME} exited with {code} before serving")
            line += chunk
    ready: dict[str, Any] = json.loads(line)
    return ready


def _die_with(parent: int) -> None:
    """In the child: SIGTERM when the parent dies, so a killed engine leaves no proxy."""
    if not signal_on_parent_death(signal.SIGTERM, parent):
        os._exit(1)
