"""The gVisor OCI spec and the nsjail/bwrap command lines, built by pure functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evalkube.sandbox import SandboxLimits, SpawnRequest
from evalkube.sandbox.backends import WORKER_BOOTSTRAP
from evalkube.sandbox.bwrap import bwrap_argv
from evalkube.sandbox.environment import INSIDE_ENVIRONMENT
from evalkube.sandbox.hostfs import INSIDE_BRIDGE_SOCKET, SystemEntry
from evalkube.sandbox.nsjail import nsjail_argv
from evalkube.sandbox.oci import build_spec, rootfs_dirs

SYSTEM = [SystemEntry("/usr"), SystemEntry("/bin", "usr/bin"), SystemEntry("/etc/alternatives")]


def _spec(bridge: str | None = None, **overrides: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "args": ["/usr/bin/python3", "-c", "pass"],
        "env": {"PATH": "/usr/bin:/bin"},
        "system": SYSTEM,
        "worker_package": "/pkg/evalkube_sandbox",
        "bridge_socket": bridge,
        "memory_bytes": 1 << 30,
        "pids": 4096,
        "tmp_bytes": 64 << 20,
        "open_files": 256,
        "cgroups_path": "/evalkube-gvisor-1-abc",
    }
    return build_spec(**{**arguments, **overrides})


def test_the_container_is_read_only_unprivileged_and_offline() -> None:
    spec = _spec()
    process = spec["process"]
    assert spec["root"] == {"path": "rootfs", "readonly": True}
    assert process["user"]["uid"] == process["user"]["gid"] == 65534
    assert all(caps == [] for caps in process["capabilities"].values())
    assert process["noNewPrivileges"] is True
    assert process["env"] == ["PATH=/usr/bin:/bin"]
    namespaces = {n["type"] for n in spec["linux"]["namespaces"]}
    assert {"pid", "network", "ipc", "uts", "mount"} <= namespaces


def test_binds_are_read_only_and_only_the_system_and_the_worker() -> None:
    mounts = {m["destination"]: m for m in _spec()["mounts"]}
    binds = {d: m for d, m in mounts.items() if m["type"] == "bind"}
    assert set(binds) == {"/usr", "/etc/alternatives", "/opt/evalkube/evalkube_sandbox"}
    assert all("ro" in m["options"] for m in binds.values())
    assert "/bin" not in mounts  # a symlink in the rootfs, like the host's
    assert "size=65536k" in mounts["/tmp"]["options"]


def test_limits_and_cgroup() -> None:
    linux = _spec()["linux"]
    assert linux["resources"]["memory"]["limit"] == 1 << 30
    assert linux["resources"]["pids"]["limit"] == 4096
    assert linux["cgroupsPath"] == "/evalkube-gvisor-1-abc"


def test_the_bridge_socket_is_bound_only_when_asked() -> None:
    assert INSIDE_BRIDGE_SOCKET not in {m["destination"] for m in _spec()["mounts"]}
    mounts = {m["destination"]: m for m in _spec("/run/proxy/bridge.sock")["mounts"]}
    assert mounts[INSIDE_BRIDGE_SOCKET]["source"] == "/run/proxy/bridge.sock"
    assert "run/evalkube" in rootfs_dirs(SYSTEM, bridge=True)
    assert "run/evalkube" not in rootfs_dirs(SYSTEM, bridge=False)


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


def test_nsjail_maps_the_sandbox_user_and_keeps_the_network_off() -> None:
    request = SpawnRequest(SandboxLimits(tmp_bytes=1 << 20, open_files=99), environment=None)
    argv = nsjail_argv("nsjail", request, worker_package="/pkg", bridge_socket=None, system=SYSTEM)
    assert _pairs(argv, "--user") == ["65534:65534:1"]
    assert _pairs(argv, "--group") == ["65534:65534:1"]
    assert "--disable_clone_newnet" not in argv
    assert "-N" not in argv
    assert "none:/tmp:tmpfs:size=1048576,mode=1777" in _pairs(argv, "--mount")
    assert _pairs(argv, "--rlimit_nofile") == ["99"]
    assert set(_pairs(argv, "--bindmount_ro")) == {
        "/usr",
        "/etc/alternatives",
        "/pkg:/opt/evalkube/evalkube_sandbox",
    }
    assert _pairs(argv, "--symlink") == ["usr/bin:/bin"]
    assert argv[argv.index("--") + 1] == "/usr/bin/python3"


def test_bwrap_unshares_everything_and_binds_the_bridge_read_only() -> None:
    argv = bwrap_argv(
        "bwrap",
        SpawnRequest(),
        worker_package="/pkg",
        bridge_socket=Path("/run/proxy/bridge.sock"),
        system=SYSTEM,
    )
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"):
        assert flag in argv
    assert "--share-net" not in argv
    assert "--clearenv" in argv
    assert _pairs(argv, "--uid") == ["65534"]
    binds = [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == "--ro-bind"]
    assert ("/run/proxy/bridge.sock", INSIDE_BRIDGE_SOCKET) in binds
    assert not [a for a in argv if a == "--bind"]  # nothing writable from the host
    assert _pairs(argv, "--remount-ro") == ["/", "/dev"]  # /dev: nothing is planted there


# -- the grader environment: bound read-only, appended to sys.path after the stdlib ---------------
ENV = Path("/cache/evalkube-grader-env/k/site-packages")


def test_gvisor_binds_the_grader_environment_read_only() -> None:
    spec = _spec(env={}, cgroups_path="/x", environment=str(ENV))
    mounts = {m["destination"]: m for m in spec["mounts"]}
    assert mounts[INSIDE_ENVIRONMENT]["source"] == str(ENV)
    assert {"rbind", "ro"} <= set(mounts[INSIDE_ENVIRONMENT]["options"])
    assert INSIDE_ENVIRONMENT.lstrip("/") in rootfs_dirs(SYSTEM, bridge=False, environment=True)
    assert INSIDE_ENVIRONMENT not in {m["destination"] for m in _spec()["mounts"]}


def test_jails_bind_the_grader_environment_read_only_and_pass_it_last() -> None:
    request = SpawnRequest(environment=ENV)
    nsjail = nsjail_argv(
        "nsjail", request, worker_package="/pkg", bridge_socket=None, system=SYSTEM
    )
    assert f"{ENV}:{INSIDE_ENVIRONMENT}" in _pairs(nsjail, "--bindmount_ro")
    assert f"{ENV}:{INSIDE_ENVIRONMENT}" not in _pairs(nsjail, "--bindmount")
    bwrap = bwrap_argv("bwrap", request, worker_package="/pkg", bridge_socket=None, system=SYSTEM)
    binds = [(bwrap[i + 1], bwrap[i + 2]) for i, a in enumerate(bwrap) if a == "--ro-bind"]
    assert (str(ENV), INSIDE_ENVIRONMENT) in binds
    for argv in (nsjail, bwrap):
        assert argv[-3:] == [WORKER_BOOTSTRAP, "/opt/evalkube", INSIDE_ENVIRONMENT]
    stdlib_only = SpawnRequest(environment=None)
    argv = bwrap_argv(
        "bwrap", stdlib_only, worker_package="/pkg", bridge_socket=None, system=SYSTEM
    )
    assert INSIDE_ENVIRONMENT not in argv


def test_the_bootstrap_appends_the_environment_after_the_standard_library() -> None:
    # the worker package first; the environment after every stdlib entry (no shadowing)
    assert "sys.path.insert(0, sys.argv[1])" in WORKER_BOOTSTRAP
    assert "sys.path.extend(sys.argv[2:])" in WORKER_BOOTSTRAP
