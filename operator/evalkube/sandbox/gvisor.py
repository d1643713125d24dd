"""The ``gvisor`` backend: the worker in a runsc container built on the fly.

Each worker gets a private temp dir ``evalkube-gvisor-<pid>-<random>`` holding the OCI bundle
(``config.json`` from :func:`evalkube.sandbox.oci.build_spec` and an empty rootfs of mount
points) and runsc's state (``--root``). The container runs on the platform the availability
probe measured (:mod:`evalkube.sandbox.runsc`: systrap where it starts, else ptrace), with
``--network=none`` (only ``lo`` inside; the host's loopback is unreachable), and
``--host-uds=open`` only when the model bridge socket is bound in. Its stdio are pipes
(runsc writes files from offset 0).

Cleanup, on close, on a missed deadline and at exit: ``runsc kill ID KILL``, ``runsc delete
--force ID``, then the temp dir goes. :func:`sweep_stale` removes what a killed evalkube
process left (containers, state, runsc's cgroups).
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import subprocess
import tempfile
from functools import cache, partial
from pathlib import Path

from evalkube.sandbox import cgroups, hostfs, oci, probe_cache
from evalkube.sandbox.backends import (
    ChildSetup,
    SandboxBackend,
    SandboxUnavailable,
    SpawnRequest,
    WorkerProcess,
    cleanup_on_error,
    resource_name,
    spawn_pipes,
    stale_temp_dirs,
    worker_env,
)
from evalkube.sandbox.runsc import (
    PLATFORMS,
    outdated_reason,
    requested_platform,
    runsc_path,
    runsc_version,
)

KIND = "gvisor"
#: How long a runsc management command (kill, delete, list) may take.
RUNSC_COMMAND_TIMEOUT = 30.0
#: Host-side pids limit of the whole sandbox. Under the ptrace platform the sentry's own
#: threads and one stub process per sandboxed process count here, and runsc fails to boot
#: below about a thousand; the guest-side limit is the worker's RLIMIT_NPROC.
GVISOR_HOST_PIDS = 4096
#: Seconds the availability probe waits for a container's first answer.
PROBE_TIMEOUT = 30.0
#: Temp dirs of dead processes whose container runsc could not delete in this process: each
#: start would wait for it again (a sandbox pid that stays a zombie under a parent that never
#: reaps it makes ``runsc delete --force`` wait); a later process tries once more.
_undeletable: set[Path] = set()
log = logging.getLogger(__name__)


class GVisorBackend(SandboxBackend):
    """gVisor (runsc): a user-space kernel between the grader and the host."""

    name = "gvisor"
    isolating = True

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return _probe()[1]

    def worker_did_not_start(self) -> None:
        """Probe again at the next start: the platform kept from an earlier run may be why."""
        probe_cache.forget()
        _probe.cache_clear()

    def describe(self) -> str:
        """``gvisor (runsc VERSION, PLATFORM)``: what the run record and the footer show."""
        runsc = runsc_path()
        if runsc is None:
            return self.name
        return f"{self.name} (runsc {runsc_version(runsc).text}, {platform()})"

    def spawn(self, request: SpawnRequest | None = None) -> WorkerProcess:
        return self.spawn_on(platform(), request)

    def spawn_on(self, platform: str, request: SpawnRequest | None = None) -> WorkerProcess:
        """A worker on ``platform`` (the probe tries each; everything else uses the one found)."""
        request = request or SpawnRequest()
        runsc = runsc_path()
        if runsc is None:
            raise SandboxUnavailable("runsc is not installed")
        sweep_stale()
        limits = request.limits
        bridge_socket, inside_endpoint = hostfs.bridge_mount(request.model_endpoint)
        name = resource_name(KIND)
        workdir = Path(tempfile.mkdtemp(prefix=name + "-"))
        state = workdir / "state"
        bundle = workdir / "bundle"
        remove_workdir = partial(shutil.rmtree, workdir, ignore_errors=True)
        with cleanup_on_error([remove_workdir]):
            state.mkdir()
            system = hostfs.system_entries()
            env = request.environment
            _make_rootfs(
                bundle / "rootfs",
                system,
                bridge=bridge_socket is not None,
                environment=env is not None,
            )
            spec = oci.build_spec(
                args=hostfs.inside_worker_argv(env is not None),
                env=worker_env(),
                environment=str(env) if env is not None else None,
                system=system,
                worker_package=str(hostfs.worker_package_dir()),
                bridge_socket=str(bridge_socket) if bridge_socket is not None else None,
                memory_bytes=limits.cgroup_memory_bytes,
                pids=GVISOR_HOST_PIDS,
                tmp_bytes=limits.tmp_bytes,
                open_files=limits.open_files,
                cgroups_path=f"/{name}",
            )
            (bundle / "config.json").write_text(json.dumps(spec, indent=1))
            argv = [runsc, f"--root={state}", "--network=none", f"--platform={platform}"]
            if bridge_socket is not None:
                argv.append("--host-uds=open")
            argv += ["run", "--bundle", str(bundle), name]
            popen = spawn_pipes(
                argv, ChildSetup(), cwd=workdir, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
            )
        return WorkerProcess(
            popen,
            None,
            model_endpoint=inside_endpoint,
            rlimits={**limits.worker_rlimits(), "processes": limits.pids},
            terminate=partial(_destroy, runsc, state, name, popen),
            cleanup=[remove_workdir],
        )


def _make_rootfs(
    rootfs: Path, system: list[hostfs.SystemEntry], *, bridge: bool, environment: bool
) -> None:
    rootfs.mkdir(parents=True)
    for entry in system:
        if entry.target is not None:
            os.symlink(entry.target, rootfs / entry.path.lstrip("/"))
    for relative in oci.rootfs_dirs(system, bridge=bridge, environment=environment):
        (rootfs / relative).mkdir(parents=True, exist_ok=True)
    if bridge:
        (rootfs / hostfs.INSIDE_BRIDGE_SOCKET.lstrip("/")).touch(0o644)
    for path in [rootfs, *rootfs.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)


def _runsc(runsc: str, state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [runsc, f"--root={state}", *args],
        capture_output=True,
        text=True,
        timeout=RUNSC_COMMAND_TIMEOUT,
        check=False,
    )


def _destroy(
    runsc: str, state: Path, container: str, popen: subprocess.Popen[bytes] | None
) -> None:
    """Kill and delete ``container``; wait for ``runsc run`` to return."""
    if not state.exists():
        return
    _runsc(runsc, state, "kill", container, "KILL")
    if popen is not None:
        try:
            popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
    _runsc(runsc, state, "delete", "--force", container)
    cgroups.destroy_paths([base / container for base in cgroups.controller_dirs()])


def containers(state: Path) -> list[str]:
    """Container ids runsc knows in ``state`` (``runsc --root=STATE list``)."""
    runsc = runsc_path()
    if runsc is None or not state.exists():
        return []
    result = _runsc(runsc, state, "list", "--quiet")
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def sweep_stale() -> list[str]:
    """Remove containers, state and cgroups of dead evalkube processes; return their names."""
    removed: list[str] = []
    runsc = runsc_path()
    for workdir in stale_temp_dirs(KIND):
        if workdir in _undeletable:
            continue
        state = workdir / "state"
        try:
            if runsc is not None:
                for container in containers(state):
                    _destroy(runsc, state, container, None)
        except subprocess.TimeoutExpired as exc:
            # kept (runsc's record of a sandbox that may still hold resources) for a later
            # sweep: one stuck leftover must not stop this start
            _undeletable.add(workdir)
            log.warning(
                "gVisor: a dead process's container in %s could not be removed (%s timed out "
                "after %g s); left for a later run to remove",
                workdir,
                " ".join(str(a) for a in exc.cmd[2:4]),
                exc.timeout,
            )
            continue
        shutil.rmtree(workdir, ignore_errors=True)
        removed.append(workdir.name)
    removed += cgroups.sweep_stale((KIND,))
    return removed


def platform() -> str:
    """The platform every container of this process uses: the one the probe started."""
    found, reason = _probe()
    if found is None:
        raise SandboxUnavailable(f"gVisor cannot run here: {reason}")
    return found


@cache
def _probe() -> tuple[str | None, str | None]:
    """The platform a real container starts on here, or why none does (once per process).

    ``EVALKUBE_GVISOR_PLATFORM`` names the one platform to try; otherwise systrap first,
    ptrace when systrap cannot start. The checks run each time; the container is started
    only when no earlier run on this machine, runsc and kernel kept the answer
    (:mod:`evalkube.sandbox.probe_cache`).
    """
    runsc = runsc_path()
    if runsc is None:
        return None, (
            "runsc is not installed (`make sandboxes` builds the pinned gVisor into "
            "/usr/local/bin/runsc; or set EVALKUBE_RUNSC)"
        )
    version = runsc_version(runsc)
    if version.outdated:
        return None, outdated_reason(runsc, version)
    if os.geteuid() != 0:
        return None, "runsc needs root to create its sandboxes (run as root or use nsjail/bwrap)"
    problem = hostfs.python_problem()
    if problem:
        return None, problem
    try:
        asked = requested_platform()
    except ValueError as exc:
        return None, str(exc)
    tried = (asked,) if asked else PLATFORMS
    key = probe_cache.probe_key(runsc, asked)
    kept = probe_cache.recall(key, tried) if key is not None else None
    if kept is not None:
        return kept, None
    failures = []
    for candidate in tried:
        reason = _start_worker(candidate)
        if reason is None:
            if key is not None:
                probe_cache.remember(key, candidate)
            return candidate, None
        failures.append(f"{candidate}: {reason}")
    return None, "; ".join(failures)


def _start_worker(platform: str) -> str | None:
    """Start one container on ``platform`` and wait for the worker's first frame."""
    try:
        worker = GVisorBackend().spawn_on(platform, SpawnRequest())
    except (OSError, RuntimeError) as exc:
        return f"runsc failed to start a container: {exc}"
    try:
        ready, _, _ = select.select([worker.stdout], [], [], PROBE_TIMEOUT)
        if ready and len(worker.stdout.read(4)) == 4:
            return None
        if not ready:
            return f"runsc did not start the worker within {PROBE_TIMEOUT:g} s"
        worker.popen.wait(timeout=RUNSC_COMMAND_TIMEOUT)
        detail = worker.stderr.read().decode("utf-8", "replace").strip().splitlines()[-3:]
        return "runsc could not run the worker: " + (" | ".join(detail) or "no output")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"runsc could not run the worker: {exc}"
    finally:
        worker.kill()
