"""The grader container's supervisor (``evalkube_sandbox.serve``) and the runner's side of it
(``PodSocketBackend``), on this machine: the supervisor as a real process started as the pod
starts it, the runner's backend as ``evalkube unit`` uses it, hostile graders between them.

The supervisor runs as it does in the grader container: the first process (PID 1) of its own
PID namespace, with a private ``/tmp`` (the worker wipes it between samples) and the runner's
socket folder mounted read-only (bubblewrap makes both). What runs here as on the real node:
the one control connection, workers on passed socket pairs, every process ended with its
worker, the memory watchdog, the log budget. The same attacks in a gVisor pod:
``tests/realnode/test_pod_attacks.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from evalkube.controller.manifests import sandbox_bootstrap
from evalkube.sandbox import GraderSandbox, SandboxBackend, SandboxLimits
from evalkube.sandbox.backends import WORKER_ROOT
from tests.integration.sandbox.support import grader

if TYPE_CHECKING:
    from evalkube.sandbox.remote import PodSocketBackend

MIB = 1024 * 1024


class Pod:
    """A supervisor process and the runner's backend, connected as in a work-unit pod."""

    def __init__(
        self, root: Path, *, memory_bytes: int, log_bytes: int, writable_socket_dir: bool = False
    ) -> None:
        from evalkube.sandbox.remote import PodSocketBackend

        self.root = root
        self.socket = root / "worker" / "worker.sock"
        self.socket.parent.mkdir()
        self.shared = root / "shared"  # where a grader may leave evidence for the test
        self.shared.mkdir()
        self.log = root / "grader.log"
        self.writable_socket_dir = writable_socket_dir
        bootstrap = sandbox_bootstrap("stdlib").replace("/opt/evalkube", str(WORKER_ROOT))
        with self.log.open("wb") as log:
            self.process = self._start(bootstrap, memory_bytes, log_bytes, log)
        self.backend: PodSocketBackend = PodSocketBackend(str(self.socket), connect_timeout=30)

    def _start(
        self, bootstrap: str, memory_bytes: int, log_bytes: int, log: Any
    ) -> subprocess.Popen[bytes]:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            pytest.fail("bubblewrap is required (installed by .ci/sandboxes.sh)")
        # a checkout (and its venv) under /tmp would have to be mounted in the private /tmp,
        # the worker's scratch directory, which it must find empty before it serves (exit 75)
        keep = {Path(sys.prefix), Path(sys.executable).parent, WORKER_ROOT}
        under_tmp = sorted(str(p) for p in keep if Path("/tmp") in p.parents)
        if under_tmp:
            pytest.fail(
                f"the pod supervisor tests need the checkout and its venv outside /tmp "
                f"({under_tmp} are under it): the pod's private /tmp is the grader worker's "
                "scratch directory, which it refuses to serve from unless it can empty it"
            )
        return subprocess.Popen(
            [
                bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--tmpfs", "/tmp",
                "--bind" if self.writable_socket_dir else "--ro-bind",
                str(self.socket.parent), str(self.socket.parent),
                "--bind", str(self.shared), str(self.shared),
                "--unshare-pid", "--as-pid-1", "--die-with-parent", "--",
                sys.executable, "-I", "-S", "-c", bootstrap,
                "--connect", str(self.socket),
                "--memory-bytes", str(memory_bytes),
                "--processes", "64",
                "--log-bytes", str(log_bytes),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )  # fmt: skip

    def grade(
        self, source: str, samples: list[Any], *, isolation: str = "unit", timeout: float = 5
    ) -> list[Any]:
        sandbox = GraderSandbox(
            self.backend,
            grader(source),
            task_id="task",
            load_timeout=20,
            isolation=isolation,
            sandbox_limits=SandboxLimits(memory_bytes=256 * MIB),
        )
        sandbox.start()
        try:
            items = (([s, i], f"exec-{i}") for i, s in enumerate(samples))
            return list(sandbox.execute("grader", items, timeout=timeout))
        finally:
            sandbox.close()

    def close(self) -> None:
        """The runner hangs up: the supervisor ends everything and exits (killed if it never
        got its connection)."""
        connected = self.backend._link is not None
        self.backend.close()
        try:
            if connected:
                self.process.wait(timeout=20)
        finally:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def pod(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Pod]:
    """A pod; ``writable_socket_dir`` (indirect parameter) lets the grader write where the
    runner listened, as a pod whose volume is not mounted read-only would."""
    # importing the backend registers it as ``pod``: keep it out of other tests' lists
    monkeypatch.setattr(SandboxBackend, "registry", dict(SandboxBackend.registry))
    writable = getattr(request, "param", False)
    with tempfile.TemporaryDirectory(prefix="evk-", dir="/run") as directory:  # short sun_path
        pod = Pod(
            Path(directory),
            memory_bytes=300 * MIB,
            log_bytes=64 * 1024,
            writable_socket_dir=writable,
        )
        try:
            yield pod
        finally:
            pod.close()


EXACT = "def grade(sample, item):\n    return float(sample == 'right')\n"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("isolation", ["unit", "sample"])
@pytest.mark.parametrize("pod", [False, True], ids=["read-only", "writable"], indirect=True)
def test_a_sample_cannot_put_itself_in_place_of_the_worker(pod: Pod, isolation: str) -> None:
    """The attack the real node saw win: a sample binds its own socket at the worker socket's
    path, daemonizes a server that answers every request, and kills its worker. The folder is
    read-only to the grader in a pod; even where it is not, the runner never dials a path
    again: the next samples reach fresh workers and keep the honest verdict."""
    source = f"""
import json, os, socket, sys
PATH = {str(pod.socket)!r}

def serve_forever(server):
    while True:
        conn, _ = server.accept()
        conn.sendall(b'{{"t": "hello"}}\\n')

def grade(sample, item):
    if sample == "attack":
        try:
            os.unlink(PATH)
        except OSError:
            pass
        server = socket.socket(socket.AF_UNIX)
        server.bind(PATH)
        server.listen(8)
        open({str(pod.shared / "planted")!r}, "w").close()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                serve_forever(server)
            os._exit(0)
        os.kill(os.getpid(), 9)
    return float(sample == "right")
"""
    executions = pod.grade(
        source, ["right", "attack", "wrong", "right", "wrong"], isolation=isolation
    )
    values = [e.value if e.status == "returned" else e.status for e in executions]
    assert values[0] == 1.0
    assert values[2:] == [0.0, 1.0, 0.0]
    assert executions[1].status != "returned"
    assert (pod.shared / "planted").exists() == pod.writable_socket_dir


@pytest.mark.timeout(120)
@pytest.mark.parametrize("isolation", ["unit", "sample"])
def test_every_process_ends_with_its_worker(pod: Pod, isolation: str) -> None:
    """A daemonized grandchild (its own session, its parent gone) is alive while its sample's
    worker lives and gone once the worker has ended, whether the worker timed out or the run
    finished."""
    marker = pod.shared
    source = f"""
import os, time
def grade(sample, item):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            beat = os.path.join({str(marker)!r}, f"{{sample}}-{{os.getpid()}}")
            while True:  # a heartbeat: the file grows while this process lives
                with open(beat, "a") as f:
                    f.write(".")
                time.sleep(0.05)
        os._exit(0)
    os.wait()
    time.sleep(0.2)
    if sample == "hang":
        time.sleep(60)
    return 1.0
"""
    executions = pod.grade(source, ["ok", "hang", "ok"], isolation=isolation, timeout=2)
    assert [e.status for e in executions] == ["returned", "timeout", "returned"]
    beats = sorted(marker.iterdir())
    assert len(beats) == 3
    before = {beat.name: beat.stat().st_size for beat in beats}
    time.sleep(0.5)
    assert {beat.name: beat.stat().st_size for beat in beats} == before


@pytest.mark.timeout(120)
def test_memory_held_across_processes_fails_the_sample_as_out_of_memory(pod: Pod) -> None:
    """Each process under its address-space limit, together over the sandbox's memory: the
    watchdog ends them all, the sample says "out of memory", the next one is graded."""
    source = """
import os, time
def grade(sample, item):
    if sample == "hog":
        for _ in range(3):
            if os.fork() == 0:
                block = bytearray(150 * 1024 * 1024)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                time.sleep(60)
        time.sleep(60)
    return 1.0
"""
    executions = pod.grade(source, ["ok", "hog", "ok"], timeout=30)
    assert [e.status for e in executions][::2] == ["returned", "returned"]
    hog = executions[1]
    assert hog.status != "returned"
    assert hog.error is not None
    assert "out of memory" in hog.error["message"], hog.error


@pytest.mark.timeout(120)
def test_grader_output_reaches_the_log_within_its_budget(pod: Pod) -> None:
    """50 MB written straight to file descriptor 2: at most the budget reaches the container
    log; the sample itself completes."""
    source = """
import os
def grade(sample, item):
    chunk = b"x" * 65536
    for _ in range(800):
        os.write(2, chunk)
    return 1.0
"""
    executions = pod.grade(source, ["flood", "ok"], timeout=60)
    assert [e.status for e in executions] == ["returned", "returned"]
    pod.close()
    logged = pod.log.stat().st_size
    assert logged < 64 * 1024 + 4096, logged
    assert "not logged" in pod.log.read_text(errors="replace")
