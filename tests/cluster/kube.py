"""What the loopback control plane (``ctrlplane.py``) and the real node (``realnode.py``) share:
kubectl, helm and the other cluster clients, polling, and the child processes they start.

Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

#: Folders (under a work dir) that keep helm's and kubectl's state out of ``$HOME``.
CLIENT_DIRS = {
    "HELM_CACHE_HOME": "helm/cache",
    "HELM_CONFIG_HOME": "helm/config",
    "HELM_DATA_HOME": "helm/data",
    "KUBECACHEDIR": "kube-cache",
}


class KubectlError(subprocess.CalledProcessError):
    """kubectl exited non-zero; ``stderr`` holds its message (also shown by ``str()``)."""

    def __str__(self) -> str:
        args = " ".join(str(a) for a in self.cmd[2:])  # drop binary and --kubeconfig
        return f"kubectl {args} exited {self.returncode}: {(self.stderr or '').strip()}"


def wait_for(
    check: Callable[[], T],
    *,
    timeout: float,
    interval: float = 0.2,
    what: str = "condition",
    on_timeout: Callable[[], str] | None = None,
    fatal: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``check`` until it returns a truthy value (returned) or ``timeout`` seconds pass.

    Exceptions from ``check`` count as "not yet" (the last one is reported on timeout), but
    for those of ``fatal``, which propagate at once. ``on_timeout`` adds to the message.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except fatal:
            raise
        except Exception as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            extra = on_timeout() if on_timeout else ""
            extra = f"\n{extra}" if extra else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}{extra}")
        time.sleep(interval)


def timed_start(start: Callable[[], None], stop: Callable[..., None]) -> float:
    """``start()``, and the seconds it took; when it fails, ``stop(keep_workdir=True)`` (what
    started is stopped, its logs kept) and the error goes on."""
    t0 = time.monotonic()
    try:
        start()
    except BaseException:
        stop(keep_workdir=True)
        raise
    return time.monotonic() - t0


def set_pdeathsig() -> None:  # runs in the child between fork and exec
    """Have the kernel SIGTERM the child if the test process dies without cleaning up."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except Exception:
        pass


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log, for an error message."""
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(data[-lines:])


def spawn(
    args: Sequence[str], log: Path, *, cwd: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Start ``args`` in a process group of its own (stopping it kills exactly that group),
    SIGTERMed when this process dies, its output appended to ``log`` after the command line."""
    with open(log, "ab") as fh:
        fh.write(f"$ {' '.join(args)}\n".encode())
        fh.flush()
        return subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=set_pdeathsig if sys.platform.startswith("linux") else None,
        )


def terminate(proc: subprocess.Popen[bytes], timeout: float = 15.0, kill_wait: float = 5.0) -> None:
    """SIGTERM the process group ``proc`` leads; SIGKILL it if it is still there after
    ``timeout`` seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=kill_wait)


def client_env(workdir: Path, kubeconfig: Path) -> dict[str, str]:
    """The environment for cluster clients: this one's, with ``KUBECONFIG`` set and helm's and
    kubectl's state in ``workdir`` (:data:`CLIENT_DIRS`, made here)."""
    env = dict(os.environ)
    for var, sub in CLIENT_DIRS.items():
        env[var] = str(workdir / sub)
    env["KUBECONFIG"] = str(kubeconfig)
    return env


def make_client_dirs(workdir: Path) -> None:
    for sub in CLIENT_DIRS.values():
        (workdir / sub).mkdir(parents=True, exist_ok=True)


class KubeClient:
    """``kubectl``, ``kubectl_json``, ``apply``, ``run`` (another tool) and ``wait_for`` against
    one cluster, for a class that sets ``bin`` (kubectl, helm, ...), ``kubeconfig`` and ``env``.
    ``command()`` may wrap each command line (the real node's clients run in its netns)."""

    bin: Path
    kubeconfig: Path
    env: dict[str, str]
    #: seconds between two checks of ``wait_for``
    poll_interval = 0.2

    def command(self, argv: list[str]) -> list[str]:
        return argv

    def timeout_report(self) -> str:
        """What ``wait_for`` adds to its timeout error (e.g. which components died)."""
        return ""

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl --kubeconfig=<admin> *args``; raise CalledProcessError (with stderr in
        the message) when ``check`` and it fails (KubectlError, a CalledProcessError)."""
        argv = [str(self.bin / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        proc = self.run_command(argv, input=input, timeout=timeout)
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc

    def kubectl_json(self, *args: str, timeout: float = 60.0) -> Any:
        """``kubectl *args -o json``, parsed."""
        return json.loads(self.kubectl(*args, "-o", "json", timeout=timeout).stdout)

    def apply(self, manifest: str | dict[str, Any] | list[dict[str, Any]], *args: str) -> str:
        """``kubectl apply -f -`` of YAML text or of object(s) (dicts, sent as JSON)."""
        if not isinstance(manifest, str):
            items = manifest if isinstance(manifest, list) else [manifest]
            manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        return self.kubectl("apply", "-f", "-", *args, input=manifest).stdout

    def run(
        self, tool: str, *args: str, input: str | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run another binary from ``bin`` (e.g. ``helm``) with ``env``; never raises on exit."""
        return self.run_command([str(self.bin / tool), *args], input=input, timeout=timeout)

    def run_command(
        self, argv: list[str], *, input: str | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(argv),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            stdin=None if input is not None else subprocess.DEVNULL,
        )

    def wait_for(
        self,
        check: Callable[[], T],
        *,
        timeout: float = 60.0,
        what: str = "condition",
        interval: float | None = None,
    ) -> T:
        return wait_for(
            check,
            timeout=timeout,
            what=what,
            interval=self.poll_interval if interval is None else interval,
            on_timeout=self.timeout_report,
        )
