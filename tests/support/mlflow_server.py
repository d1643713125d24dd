"""A real MLflow tracking server for the tracking tests: ``mlflow server`` from the venv that
``.ci/mlflow.sh`` builds (``EVALKUBE_MLFLOW_BIN``, else that script's cache), with a SQLite
backend store and a local artifact root, on a loopback port (or another address of this
machine's test hosts). Started and stopped by the tests; stopping it is how they test a
tracking server that is down."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from evalkube.util.process import signal_on_parent_death
from tests.support.ports import free_port


def mlflow_bin() -> Path | None:
    """The folder holding ``mlflow`` (the server), or ``None`` when it is not installed."""
    given = os.environ.get("EVALKUBE_MLFLOW_BIN")
    if given:
        return Path(given)
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "evalkube-mlflow"
    done = sorted(glob.glob(str(root / "*" / ".complete")), key=os.path.getmtime)
    return Path(done[-1]).parent / "venv" / "bin" if done else None


class MlflowServer:
    """``mlflow server`` in a process group of its own; :meth:`stop` ends it (only it)."""

    def __init__(self, bindir: Path, root: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.bindir, self.root, self.host = bindir, root, host
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = root / "mlflow-server.log"

    def start(self, timeout: float = 120, *, netns: list[str] | None = None) -> MlflowServer:
        self.root.mkdir(parents=True, exist_ok=True)
        command = [
            str(self.bindir / "mlflow"),
            "server",
            "--host", self.host,
            "--port", str(self.port),
            "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
            "--artifacts-destination", str(self.root / "artifacts"),
            "--workers", "1",
            "--allowed-hosts", "*",
        ]  # fmt: skip
        env = {
            **os.environ,
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "DO_NOT_TRACK": "true",
            # no background job runner (its huey consumers are dozens of workers, not needed
            # to store runs, metrics and artifacts)
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        }
        parent = os.getpid()
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [*(netns or []), *command],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                # a killed test run (CI's timeout, Ctrl-C twice) takes its server along: its
                # own session is out of reach of the run's process group
                preexec_fn=lambda: signal_on_parent_death(signal.SIGTERM, parent) and None,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"mlflow server did not start in {timeout} s: {self.log.read_text()}")

    def stop(self) -> None:
        """End the server's process group and wait for it; nothing else is signalled."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(20)
