"""A real single-node Kubernetes cluster in a network namespace of its own, for the real-node tier.

Where ``tests/cluster/ctrlplane.py`` fakes the node (kwok runs no containers), this runs one:
the same control plane, plus containerd 2 (runc from Debian, gVisor's runsc through
``containerd-shim-runsc-v1``), a kubelet, kube-proxy (iptables), kube-router (NetworkPolicy
only), Debian's CNI bridge plugin and CoreDNS as a pod, with the images of ``.ci/images.sh``
imported into containerd. Binaries come from ``tests/cluster/build-node.sh`` and
``tests/cluster/build-tools.sh`` (cached outside the work tree).

Everything lives in a fresh network namespace (``ekn-<id>``): the node's address
(192.168.200.2) sits on a veth whose both ends are inside it, so pods, services and the
NetworkPolicies under test never touch the host's network. The node processes also get a
private mount namespace: the kubelet's and containerd's mounts never reach the host, and the
host-wide sysctls the kubelet insists on setting are shown to it as files there.

Two halves:

- :class:`RealNode` (the pytest process, host namespaces): makes the netns, starts the
  launcher below inside it, waits for ``ready.json``, and offers ``kubectl``/``helm`` through
  ``nsenter --net``. ``stop()`` SIGTERMs the launcher, then removes what the kubelet left in
  the host's cgroup v1 hierarchies and deletes the netns.
- ``python -m tests.cluster.realnode --inside ...`` (the launcher, inside the netns and its own
  mount namespace): starts and stops the components, in order, and kills exactly the
  processes of its own mount namespace at the end (container shims and sandboxes included).

Lessons of the hand-run recipe this follows (shared/reference/real-node/README.md) are
comments where they apply.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tests.cluster.ctrlplane import BinariesMissing, ControlPlane, ControlPlaneError, find_bin_dir
from tests.cluster.kube import (
    KubeClient,
    client_env,
    make_client_dirs,
    set_pdeathsig,
    spawn,
    tail,
    terminate,
    timed_start,
    wait_for,
)
from tests.support.ports import NODE_PORTS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD_NODE = HERE / "build-node.sh"
IMAGES_SCRIPT = ROOT / ".ci" / "images.sh"
NODE_NAME = "realnode-0"
NODE_IP = "192.168.200.2"
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/16"
DNS_IP = "10.96.0.10"
CNI_BIN_DIR = Path("/usr/lib/cni")
RUNC = Path("/usr/bin/runc")
NODE_BINARIES = (
    "kubelet",
    "kube-proxy",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "runsc",
    "containerd-shim-runsc-v1",
    "kube-router",
    "coredns",
)
#: One real node per machine at a time: every kubelet here shares the host's cgroup v1 trees
#: (``kubepods``), and stopping one node clears them.
LOCK_FILE = Path("/run/lock/evalkube-realnode.lock")
IMAGE_TARS = ("evalkube.tar", "evalkube-sandbox.tar", "pause.tar", "busybox.tar")
#: the host commands the node needs (Debian packages in parentheses, installed by .ci/realnode.sh)
HOST_COMMANDS = {
    "ip": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "iptables": "iptables",
    "ipset": "ipset",
    "conntrack": "conntrack",
    "openssl": "openssl",
    "buildah": "buildah",
    "mount": "mount",
}
T = TypeVar("T")
#: The node's components a fault test may stop, freeze and start again (``RealNode.control``).
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "containerd",
    "kubelet",
    "kube-proxy",
    "kube-router",
)
CONTROL_ACTIONS = ("down", "kill", "up", "restart", "freeze", "thaw")
#: Requests to the launcher (``<id>.json``) and its answers (``<id>.result``), in the work dir.
CONTROL_DIR = "control"


class NodeError(ControlPlaneError):
    """The real node could not be started (the message says which part and why)."""


# --------------------------------------------------------------------------------------------
# What the host must have
# --------------------------------------------------------------------------------------------


def missing_facilities() -> list[str]:
    """Host facilities the node needs and this machine lacks, each named with its fix."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network and mount namespaces, cgroups, iptables)")
    for cmd, pkg in HOST_COMMANDS.items():
        if shutil.which(cmd) is None:
            missing.append(f"the `{cmd}` command (Debian package {pkg})")
    if not os.access(RUNC, os.X_OK):
        missing.append(f"{RUNC} (Debian package runc)")
    for plugin in ("bridge", "host-local", "loopback", "portmap"):
        if not os.access(CNI_BIN_DIR / plugin, os.X_OK):
            missing.append(f"CNI plugin {CNI_BIN_DIR / plugin} (containernetworking-plugins)")
    for controller in ("cpu", "memory", "pids", "cpuset"):
        if not Path(f"/sys/fs/cgroup/{controller}").is_dir():
            missing.append(f"the cgroup v1 `{controller}` hierarchy at /sys/fs/cgroup/{controller}")
    if not Path("/proc/sys/net/bridge").is_dir():
        missing.append("the br_netfilter kernel module (/proc/sys/net/bridge)")
    return missing


def _cached(variable: str, script: Path, missing: str, fix: str) -> Path:
    """``$variable``, else the folder ``script --print-if-cached`` prints (it never builds)."""
    explicit = os.environ.get(variable)
    if explicit:
        return Path(explicit)
    out = subprocess.run(
        ["bash", str(script), "--print-if-cached"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    if out.returncode != 0 or not out.stdout.strip():
        raise BinariesMissing(f"{missing} ({out.stderr.strip()[-300:]}). {fix}, or set {variable}")
    return Path(out.stdout.strip().splitlines()[-1])


def find_node_bin() -> Path:
    """``$EVALKUBE_NODE_BIN``, else the cache of build-node.sh (never builds)."""
    bin_dir = _cached(
        "EVALKUBE_NODE_BIN",
        BUILD_NODE,
        "node binaries are not built",
        f"Build them once with `bash {BUILD_NODE.relative_to(ROOT)}` (or `bash .ci/realnode.sh`)",
    )
    lacking = [b for b in NODE_BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if lacking:
        raise BinariesMissing(f"{bin_dir} lacks {', '.join(lacking)}")
    return bin_dir


def find_images() -> Path:
    """``$EVALKUBE_IMAGES_DIR``, else the cache of .ci/images.sh for this tree (never builds)."""
    images = _cached(
        "EVALKUBE_IMAGES_DIR",
        IMAGES_SCRIPT,
        "images are not built for this tree",
        "Build them with `bash .ci/images.sh`",
    )
    lacking = [t for t in IMAGE_TARS if not (images / t).is_file()]
    if lacking:
        raise BinariesMissing(f"{images} lacks {', '.join(lacking)}")
    return images


def image_version(images: Path) -> str:
    for line in (images / "IMAGES").read_text().splitlines():
        if line.startswith("version="):
            return line.split("=", 1)[1]
    raise NodeError(f"{images}/IMAGES names no version")


def coredns_image(node_bin: Path) -> Path:
    """A one-binary CoreDNS image (docker-archive), made once beside the node binaries."""
    tar = node_bin.parent / "coredns-image.tar"
    if tar.is_file():
        return tar
    version = "dev"
    for line in (node_bin / "VERSIONS").read_text().splitlines():
        if line.startswith("coredns="):
            version = line.split("=", 1)[1]
    ref = f"localhost/coredns:{version}"

    def buildah(*args: str) -> str:
        return subprocess.run(
            ["buildah", *args], check=True, capture_output=True, text=True
        ).stdout.strip()

    c = buildah("from", "scratch")
    try:
        buildah("copy", c, str(node_bin / "coredns"), "/coredns")
        buildah("config", "--entrypoint", '["/coredns"]', "--user", "65534:65534", c)
        buildah("commit", "--quiet", c, ref)
    finally:
        subprocess.run(["buildah", "rm", c], capture_output=True)
    partial = tar.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    buildah("push", "--quiet", ref, f"docker-archive:{partial}:{ref}")
    partial.rename(tar)
    return tar


# --------------------------------------------------------------------------------------------
# The pytest side
# --------------------------------------------------------------------------------------------


class RealNode(KubeClient):
    """One real node and its control plane in a private network namespace (see module doc).

    After ``start()``: ``netns``, ``workdir``, ``kubeconfig``, ``server``, ``bin`` (control
    plane binaries: kubectl, helm), ``node_bin``, ``images``, ``version`` (the images' tag),
    ``startup_seconds`` and ``timings`` (from the launcher's ready.json). Clients
    (``kubectl``, ``kubectl_json``, ``apply``, ``helm``, ``run``) run in the netns.
    """

    poll_interval = 0.5

    def __init__(
        self,
        cp_bin: Path,
        node_bin: Path,
        images: Path,
        *,
        workdir: Path | None = None,
        start_timeout: float = 300.0,
    ) -> None:
        self.bin = Path(cp_bin)
        self.node_bin = Path(node_bin)
        self.images = Path(images)
        self.version = image_version(self.images)
        self.netns = f"ekn-{uuid.uuid4().hex[:8]}"
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="evalkube-realnode-")).resolve()
        self.kubeconfig = self.workdir / "cp" / "admin.kubeconfig"
        self.start_timeout = start_timeout
        self.server = ""
        self.startup_seconds: float | None = None
        self.timings: dict[str, float] = {}
        self._launcher: subprocess.Popen[bytes] | None = None
        self._lock: Any = None
        self.env = client_env(self.workdir, self.kubeconfig)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> RealNode:
        self.startup_seconds = timed_start(self._start, self.stop)
        return self

    def _start(self) -> None:
        import fcntl

        LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(LOCK_FILE, "w")  # noqa: SIM115 - held until stop()
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.stderr.write(
                f"[realnode] another real node runs on this machine; waiting ({LOCK_FILE})\n"
            )
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.workdir.mkdir(parents=True, exist_ok=True)
        coredns_tar = coredns_image(self.node_bin)
        ns = self.netns
        _run("ip", "netns", "add", ns)
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        # the kernel has no `dummy` links: a veth pair with both ends inside the netns holds the
        # node address (kubelet refuses a loopback node IP)
        _run("ip", "-n", ns, "link", "add", "node0", "type", "veth", "peer", "name", "node0-peer")
        _run("ip", "-n", ns, "addr", "add", f"{NODE_IP}/24", "dev", "node0")
        _run("ip", "-n", ns, "link", "set", "node0-peer", "up")
        _run("ip", "-n", ns, "link", "set", "node0", "up")
        # kubelet and kube-proxy want a default route; it leads nowhere (no peer outside)
        gateway = NODE_IP.rsplit(".", 1)[0] + ".1"
        _run("ip", "-n", ns, "route", "add", "default", "via", gateway, "dev", "node0", "onlink")
        _run(
            "ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1",
            "net.bridge.bridge-nf-call-iptables=1", "net.bridge.bridge-nf-call-ip6tables=1",
        )  # fmt: skip
        make_client_dirs(self.workdir)
        log = open(self.workdir / "launcher.log", "ab")  # noqa: SIM115 - the child keeps it
        args = [
            "nsenter", f"--net=/run/netns/{ns}", "unshare", "--mount", "--propagation", "private",
            sys.executable, "-m", "tests.cluster.realnode", "--inside",
            "--workdir", str(self.workdir), "--cp-bin", str(self.bin),
            "--node-bin", str(self.node_bin), "--images", str(self.images),
            "--coredns-image", str(coredns_tar),
        ]  # fmt: skip
        self._launcher = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"},
            start_new_session=True,
            preexec_fn=set_pdeathsig,  # pytest killed: the launcher still stops the node
        )
        log.close()
        ready = self.workdir / "ready.json"

        def is_ready() -> bool:
            rc = self._launcher.poll() if self._launcher else 1
            if rc is not None:
                raise NodeError(
                    f"the node launcher exited with {rc} during startup; last lines of "
                    f"{self.workdir / 'launcher.log'}:\n{tail(self.workdir / 'launcher.log', 60)}"
                )
            return ready.is_file()

        try:
            wait_for(is_ready, timeout=self.start_timeout, interval=0.5, what="the real node")
        except TimeoutError as exc:
            raise NodeError(f"{exc}\n{tail(self.workdir / 'launcher.log', 60)}") from None
        info = json.loads(ready.read_text())
        self.server = info["server"]
        self.timings = info["timings"]

    def stop(self, *, keep_workdir: bool = False, timeout: float = 120.0) -> None:
        """SIGTERM the launcher (it stops pods, the node and the control plane), then remove
        the kubelet's cgroups and the netns. Signals only the launcher's process group."""
        launcher, self._launcher = self._launcher, None
        if launcher is not None:
            terminate(launcher, timeout=timeout, kill_wait=10)
        if self._lock is not None:
            remove_kubepods_cgroups()
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
            self._lock.close()  # releases the machine-wide lock
            self._lock = None
        if not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.stop(keep_workdir=exc_type is not None)

    # -- faults -------------------------------------------------------------------------------
    def control(self, action: str, component: str, timeout: float = 240.0) -> None:
        """Have the launcher ``action`` one of the node's components (:data:`COMPONENTS`):
        ``down`` (SIGTERM, then SIGKILL after 15 s), ``kill`` (SIGKILL), ``up`` (start it
        again with its first command line, waiting until it serves), ``restart`` (down, up),
        ``freeze``/``thaw`` (SIGSTOP/SIGCONT of its process group). The launcher stays the
        only one that spawns components, so its end-of-session sweep still stops them all.
        Raises :class:`NodeError` with the launcher's reason when the action failed."""
        if action not in CONTROL_ACTIONS:
            raise ValueError(f"unknown action {action!r} (one of {', '.join(CONTROL_ACTIONS)})")
        if component not in COMPONENTS:
            raise ValueError(f"unknown component {component!r} (one of {', '.join(COMPONENTS)})")
        control = self.workdir / CONTROL_DIR
        request = uuid.uuid4().hex
        partial = control / f"{request}.partial"
        partial.write_text(json.dumps({"action": action, "component": component}))
        partial.rename(control / f"{request}.json")
        result = control / f"{request}.result"

        def answered() -> bool:
            if self._launcher is None or self._launcher.poll() is not None:
                raise NodeError(
                    f"the node launcher is gone; last lines of {self.workdir / 'launcher.log'}:"
                    f"\n{tail(self.workdir / 'launcher.log', 60)}"
                )
            return result.is_file()

        wait_for(answered, timeout=timeout, interval=0.2, what=f"{action} {component}")
        answer = json.loads(result.read_text())
        result.unlink()
        if not answer["ok"]:
            raise NodeError(f"{action} {component}: {answer['error']}")

    def down(self, component: str) -> None:
        self.control("down", component)

    def up(self, component: str) -> None:
        self.control("up", component)

    def restart(self, component: str) -> None:
        self.control("restart", component)

    def freeze(self, component: str) -> None:
        self.control("freeze", component)

    def thaw(self, component: str) -> None:
        self.control("thaw", component)

    # -- clients ------------------------------------------------------------------------------
    def in_netns(self, *args: str) -> list[str]:
        """A command line that runs ``args`` in the node's network namespace."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", *args]

    def command(self, argv: list[str]) -> list[str]:
        return self.in_netns(*argv)

    def helm(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        return self.run("helm", f"--kubeconfig={self.kubeconfig}", *args, timeout=timeout)

    def pod_log(self, namespace: str, pod: str, container: str) -> str:
        return self.kubectl("logs", "-n", namespace, pod, "-c", container, check=False).stdout


def remove_kubepods_cgroups() -> None:
    """The kubelet's cgroup v1 trees (``kubepods`` in each hierarchy), deepest first, after
    killing any process still in them (a gVisor sandbox lives in its own mount namespace, so
    the launcher's sweep cannot see it; its pod cgroup can)."""

    def in_kubepods() -> set[int]:
        left = set()
        for procs in Path("/sys/fs/cgroup/pids/kubepods").rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                left.update(int(p) for p in procs.read_text().split())
        return left

    _kill_until_none(in_kubepods, rounds=5)
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / "kubepods"
        if not top.is_dir():
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def _kill_until_none(find: Callable[[], set[int]], rounds: int) -> None:
    """SIGKILL the processes ``find()`` names, a second apart, until it names none (at most
    ``rounds`` times)."""
    for _ in range(rounds):
        left = find()
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(1)


def _run(*args: str) -> None:
    proc = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise NodeError(f"{' '.join(args)} failed: {proc.stderr.strip()}")


# --------------------------------------------------------------------------------------------
# The launcher (inside the netns and a private mount namespace)
# --------------------------------------------------------------------------------------------


class _Launcher:
    def __init__(self, ns: argparse.Namespace) -> None:
        self.w = Path(ns.workdir)
        self.cp_bin = Path(ns.cp_bin)
        self.bin = Path(ns.node_bin)
        self.images = Path(ns.images)
        self.coredns_tar = Path(ns.coredns_image)
        self.logs = self.w / "logs"
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.cp: ControlPlane | None = None
        self.t0 = time.monotonic()
        self.timings: dict[str, float] = {}
        self.sock = self.w / "containerd" / "containerd.sock"
        self.env = {**os.environ, "PATH": f"{self.bin}:{self.cp_bin}:{os.environ['PATH']}"}
        #: components a fault test stopped (``alive()`` does not count them) or froze
        self.stopped: set[str] = set()
        self.frozen: set[str] = set()

    def mark(self, what: str) -> None:
        self.timings[what] = round(time.monotonic() - self.t0, 1)
        print(f"[realnode] {what} at {self.timings[what]}s", flush=True)

    def spawn(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        # a killed launcher takes its components along (pdeathsig)
        popen = spawn(args, self.logs / f"{name}.log", cwd=self.w, env=self.env)
        self.procs.append((name, popen))
        return popen

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        assert self.cp is not None
        return self.cp.kubectl(*args, input=input, check=check).stdout

    def alive(self) -> None:
        for name, proc in self.procs:
            if name in self.stopped:
                continue
            rc = proc.poll()
            if rc is not None:
                raise NodeError(
                    f"{name} exited with {rc}; last lines of {self.logs / (name + '.log')}:\n"
                    f"{tail(self.logs / (name + '.log'), 60)}"
                )

    def wait(self, check: Callable[[], T], what: str, timeout: float = 120.0) -> T:
        def probe() -> T:
            self.alive()
            return check()

        try:
            result = wait_for(probe, timeout=timeout, interval=0.5, what=what, fatal=(NodeError,))
        except TimeoutError as exc:
            raise NodeError(str(exc)) from None
        self.mark(what)
        return result

    # -- faults (RealNode.control) -----------------------------------------------------------
    def serve_controls(self) -> None:
        """Carry out each request a test left in the control folder, answering each one."""
        for request in sorted((self.w / CONTROL_DIR).glob("*.json")):
            answer: dict[str, Any] = {"ok": True}
            try:
                order = json.loads(request.read_text())
                self.control(order["action"], order["component"])
            except Exception as exc:
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            print(f"[realnode] control {request.stem}: {answer}", flush=True)
            partial = request.with_suffix(".partial")
            partial.write_text(json.dumps(answer))
            partial.rename(request.with_suffix(".result"))
            request.unlink()

    def process(self, name: str) -> subprocess.Popen[bytes]:
        if name not in COMPONENTS:
            raise NodeError(f"unknown component {name!r}")
        for own, proc in self.procs:
            if own == name:
                return proc
        assert self.cp is not None
        return self.cp.process(name)

    def control(self, action: str, name: str) -> None:
        proc = self.process(name)
        print(f"[realnode] {action} {name} (pid {proc.pid})", flush=True)
        if action in ("freeze", "thaw"):
            if name in self.stopped:
                raise NodeError(f"{name} is down")
            os.killpg(proc.pid, signal.SIGSTOP if action == "freeze" else signal.SIGCONT)
            (self.frozen.add if action == "freeze" else self.frozen.discard)(name)
            return
        if action in ("down", "kill", "restart"):
            self.stopped.add(name)
            if name in self.frozen:  # a stopped process sees SIGTERM only once continued
                os.killpg(proc.pid, signal.SIGCONT)
                self.frozen.discard(name)
            if action == "kill":
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            else:
                self.terminate(proc)
        if action in ("up", "restart"):
            if proc.poll() is None:
                raise NodeError(f"{name} still runs (pid {proc.pid})")
            self.respawn(name, proc)
            self.stopped.discard(name)

    def respawn(self, name: str, old: subprocess.Popen[bytes]) -> None:
        """Start ``name`` again with its first command line, where it was in the start order,
        and wait until it serves."""
        if self.cp is not None and all(own != name for own, _ in self.procs):
            self.cp.respawn(name)
            return
        args = old.args
        assert isinstance(args, list), args  # spawn() passes a list
        at = self.procs.index((name, old))
        since = time.time()
        self.spawn(name, [str(a) for a in args])
        self.procs[at] = self.procs.pop()  # the new process takes the old one's place
        if name == "containerd":
            ctr = [str(self.bin / "ctr"), "-a", str(self.sock), "version"]
            self.wait(
                lambda: subprocess.run(ctr, capture_output=True, timeout=10).returncode == 0,
                "containerd serving again",
            )
        elif name == "kubelet":

            def heartbeat() -> bool:
                node = json.loads(self.kubectl("get", "node", NODE_NAME, "-o", "json"))
                for cond in node["status"].get("conditions", []):
                    if cond["type"] == "Ready" and cond["status"] == "True":
                        beat = datetime.datetime.fromisoformat(cond["lastHeartbeatTime"])
                        return beat.timestamp() >= since - 1  # the API keeps whole seconds
                return False

            self.wait(heartbeat, "the restarted kubelet's Ready heartbeat")

    # -- start --------------------------------------------------------------------------------
    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.w / CONTROL_DIR).mkdir(exist_ok=True)
        self.mounts()
        self.control_plane()
        self.containerd()
        self.kubelet()
        self.network()
        self.cluster_addons()
        (self.w / "ready.json.partial").write_text(
            json.dumps({"server": self.cp.server if self.cp else "", "timings": self.timings})
        )
        (self.w / "ready.json.partial").rename(self.w / "ready.json")

    def mounts(self) -> None:
        sh = ["mount", "--make-rshared", "/"]  # the kubelet needs shared propagation for pods
        subprocess.run(sh, check=True)
        # gVisor's shim looks for pod volumes under /var/lib/kubelet/pods (hard-coded): keep
        # the kubelet's files in the work dir, shown there in this mount namespace only
        root = self.w / "kubelet-root"
        root.mkdir(parents=True, exist_ok=True)
        Path("/var/lib/kubelet").mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", str(root), "/var/lib/kubelet"], check=True)
        cni_var = self.w / "cni-var"
        cni_var.mkdir(exist_ok=True)
        Path("/var/lib/cni").mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", str(cni_var), "/var/lib/cni"], check=True)
        # the kubelet sets these host-wide sysctls at start (kernel.panic_on_oops=1 on a shared
        # VM is not ok): it sees files with the values it wants, in this mount namespace only
        fake = self.w / "fake-sysctl"
        fake.mkdir(exist_ok=True)
        for key, value in (
            ("vm/overcommit_memory", "1"),
            ("vm/panic_on_oom", "0"),
            ("kernel/panic", "10"),
            ("kernel/panic_on_oops", "1"),
            ("kernel/keys/root_maxkeys", "1000000"),
            ("kernel/keys/root_maxbytes", "25000000"),
        ):
            if not Path(f"/proc/sys/{key}").exists():
                continue
            f = fake / key.replace("/", ".")
            f.write_text(value + "\n")
            subprocess.run(["mount", "--bind", str(f), f"/proc/sys/{key}"], check=True)

    def control_plane(self) -> None:
        pki = self.w / "cp" / "pki"
        self.cp = ControlPlane(
            self.cp_bin,
            workdir=self.w / "cp",
            extra_apiserver_args=[
                # pods reach the apiserver through the `kubernetes` Service (kube-proxy): it
                # listens on the node address too and publishes that address as its endpoint
                "--bind-address=0.0.0.0",
                f"--advertise-address={NODE_IP}",
                "--endpoint-reconciler-type=lease",
                # logs and exec: reach the kubelet by node IP, with a client certificate
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={pki / 'admin.crt'}",
                f"--kubelet-client-key={pki / 'admin.key'}",
            ],
        )
        self.cp.start()
        # kube-router lets every pod reach the node's own addresses on NodePort-range ports,
        # whatever the pod's NetworkPolicy says (docs/security.md, Known gaps): an API server
        # there is open to every grader pod through the `kubernetes` Service
        if (port := self.cp.ports["apiserver"]) in NODE_PORTS:
            raise ControlPlaneError(
                f"the API server's port {port} is in the NodePort range "
                f"{NODE_PORTS.start}-{NODE_PORTS.stop - 1}, which kube-router exempts from pods' "
                "egress policy; pick ports with tests.support.ports.free_port"
            )
        self.mark("control plane ready")
        # no fake node: the scheduler must place every pod on the real one
        self.kubectl("delete", "node", self.cp.node_name, "--ignore-not-found")
        # the kubelet's identity (CN=system:node:<node>, O=system:nodes), signed by the CA
        subprocess.run(
            [
                "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "kubelet.key",
                "-out", "kubelet.crt", "-days", "7",
                "-subj", f"/O=system:nodes/CN=system:node:{NODE_NAME}",
                "-CA", "ca.crt", "-CAkey", "ca.key",
                "-addext", "basicConstraints=critical,CA:FALSE",
                "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
                "-addext", "extendedKeyUsage=clientAuth",
            ],
            cwd=pki, check=True, capture_output=True,
        )  # fmt: skip
        kc = self.cp.kubeconfig.read_text()
        kc = kc.replace("admin.crt", "kubelet.crt").replace("admin.key", "kubelet.key")
        (self.w / "cp" / "kubelet.kubeconfig").write_text(kc)
        # RBAC only (no Node authorizer): the built-in system:node role for the nodes group
        self.kubectl(
            "create", "clusterrolebinding", "realnode-system-node",
            "--clusterrole=system:node", "--group=system:nodes",
        )  # fmt: skip

    def containerd(self) -> None:
        c = self.w / "containerd"
        c.mkdir(exist_ok=True)
        (self.w / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        (self.w / "cni" / "net.d" / "10-bridge.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "realnode",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "cni0",
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_CIDR}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(self.w / "cni" / "ipam"),
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                        {"type": "loopback"},
                    ],
                },
                indent=1,
            )
        )
        (c / "runsc.toml").write_text(
            textwrap.dedent(f"""\
            # options of containerd-shim-runsc-v1
            binary_name = "{self.bin / "runsc"}"
            root = "{c / "runsc"}"
            [runsc_config]
              platform = "systrap"
            """)
        )
        rt = "plugins.'io.containerd.cri.v1.runtime'"
        (c / "config.toml").write_text(
            textwrap.dedent(f"""\
            version = 3
            root = "{c / "root"}"
            state = "{c / "state"}"
            disabled_plugins = ["io.containerd.nri.v1.nri"]
            [grpc]
              address = "{self.sock}"
            [ttrpc]
              address = "{self.sock}.ttrpc"
            [plugins.'io.containerd.cri.v1.images']
              snapshotter = "overlayfs"
              [plugins.'io.containerd.cri.v1.images'.pinned_images]
                sandbox = "registry.k8s.io/pause:3.10"
            [{rt}]
              enable_unprivileged_ports = true
              enable_unprivileged_icmp = true
              # pod network namespaces under the state dir, not in the host's /run/netns
              netns_mounts_under_state_dir = true
              # this VM withholds CAP_SYS_RESOURCE: never ask for an oom_score_adj below
              # containerd's own
              restrict_oom_score_adj = true
              [{rt}.containerd]
                default_runtime_name = "runc"
                [{rt}.containerd.runtimes.runc]
                  runtime_type = "io.containerd.runc.v2"
                  [{rt}.containerd.runtimes.runc.options]
                    SystemdCgroup = false
                    BinaryName = "{RUNC}"
                    Root = "{c / "runc"}"
                [{rt}.containerd.runtimes.runsc]
                  runtime_type = "io.containerd.runsc.v1"
                  # gVisor's mount hints (shared socket folders) must reach the shim
                  pod_annotations = ["dev.gvisor.*"]
                  [{rt}.containerd.runtimes.runsc.options]
                    TypeUrl = "io.containerd.runsc.v1.options"
                    ConfigPath = "{c / "runsc.toml"}"
              [{rt}.cni]
                bin_dirs = ["{CNI_BIN_DIR}"]
                conf_dir = "{self.w / "cni" / "net.d"}"
            """)
        )
        self.spawn("containerd", [str(self.bin / "containerd"), "--config", str(c / "config.toml")])
        self.wait(self.sock.exists, "containerd socket")
        tars = [self.images / t for t in IMAGE_TARS] + [self.coredns_tar]
        for tar in tars:
            subprocess.run(
                [str(self.bin / "ctr"), "-a", str(self.sock), "-n", "k8s.io", "images", "import",
                 str(tar)],
                check=True, capture_output=True, env=self.env,
            )  # fmt: skip
        self.mark("images imported")

    def kubelet(self) -> None:
        assert self.cp is not None
        pki = self.w / "cp" / "pki"
        cfg = self.w / "kubelet-config.yaml"
        (self.w / "pod-logs").mkdir(exist_ok=True)
        (self.w / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        cfg.write_text(
            textwrap.dedent(f"""\
            apiVersion: kubelet.config.k8s.io/v1beta1
            kind: KubeletConfiguration
            # this machine kind has cgroup v1 only
            failCgroupV1: false
            cgroupDriver: cgroupfs
            containerRuntimeEndpoint: unix://{self.sock}
            authentication:
              anonymous: {{enabled: false}}
              webhook: {{enabled: false}}
              x509: {{clientCAFile: {pki / "ca.crt"}}}
            authorization: {{mode: AlwaysAllow}}
            clusterDNS: [{DNS_IP}]
            clusterDomain: cluster.local
            resolvConf: {self.w / "resolv.conf"}
            podLogsDir: {self.w / "pod-logs"}
            failSwapOn: false
            readOnlyPort: 0
            healthzPort: 0
            serializeImagePulls: false
            evictionHard: {{memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}}
            imageGCHighThresholdPercent: 100
            imageGCLowThresholdPercent: 99
            protectKernelDefaults: false
            # work-unit pods turn IPv6 off (the chart's work.ipv6=disable; docs/install.md)
            allowedUnsafeSysctls: [net.ipv6.conf.all.disable_ipv6]
            """)
        )
        (self.w / "volume-plugins").mkdir(exist_ok=True)
        self.spawn(
            "kubelet",
            [
                str(self.bin / "kubelet"),
                f"--config={cfg}",
                f"--kubeconfig={self.w / 'cp' / 'kubelet.kubeconfig'}",
                "--root-dir=/var/lib/kubelet",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                f"--volume-plugin-dir={self.w / 'volume-plugins'}",
                "--v=1",
            ],
        )
        self.wait(
            lambda: self.kubectl("get", "node", NODE_NAME, check=False).strip(),
            "node registered",
            timeout=90,
        )
        # nothing allocates podCIDRs here (no --allocate-node-cidrs): kube-router and
        # kube-proxy read it from the Node
        self.kubectl(
            "patch", "node", NODE_NAME, "--type=merge",
            "-p", json.dumps({"spec": {"podCIDR": POD_CIDR, "podCIDRs": [POD_CIDR]}}),
        )  # fmt: skip

    def network(self) -> None:
        assert self.cp is not None
        kp = self.w / "kube-proxy.yaml"
        kp.write_text(
            textwrap.dedent(f"""\
            apiVersion: kubeproxy.config.k8s.io/v1alpha1
            kind: KubeProxyConfiguration
            clientConnection: {{kubeconfig: {self.cp.kubeconfig}}}
            mode: iptables
            clusterCIDR: {POD_CIDR}
            hostnameOverride: {NODE_NAME}
            bindAddress: {NODE_IP}
            healthzBindAddress: ""
            metricsBindAddress: ""
            conntrack:
              maxPerCore: 0
              min: 0
              tcpEstablishedTimeout: 0s
              tcpCloseWaitTimeout: 0s
            """)
        )
        self.spawn("kube-proxy", [str(self.bin / "kube-proxy"), f"--config={kp}", "--v=1"])
        # kube-router: the NetworkPolicy controller only (iptables + ipset); kube-network-
        # policies needs CONFIG_NFT_QUEUE, which this kernel lacks
        self.spawn(
            "kube-router",
            [
                str(self.bin / "kube-router"),
                f"--kubeconfig={self.cp.kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                "--run-firewall=true",
                "--run-router=false",
                "--run-service-proxy=false",
                "--enable-cni=false",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--metrics-port=0",
                "--health-port=0",
                "--v=1",
            ],
        )

        def node_ready() -> bool:
            node = json.loads(self.kubectl("get", "node", NODE_NAME, "-o", "json"))
            conds = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
            return conds.get("Ready") == "True"

        self.wait(node_ready, "node Ready", timeout=120)

    def cluster_addons(self) -> None:
        version = "dev"
        for line in (self.bin / "VERSIONS").read_text().splitlines():
            if line.startswith("coredns="):
                version = line.split("=", 1)[1]
        self.kubectl("apply", "-f", "-", input=coredns_manifest(f"localhost/coredns:{version}"))
        self.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "node.k8s.io/v1",
                    "kind": "RuntimeClass",
                    "metadata": {"name": "gvisor"},
                    "handler": "runsc",
                }
            ),
        )
        self.wait(
            lambda: self.kubectl(
                "-n", "kube-system", "get", "deploy", "coredns",
                "-o", "jsonpath={.status.readyReplicas}", check=False,
            ).strip() == "1",
            "CoreDNS ready",
            timeout=120,
        )  # fmt: skip

    # -- stop ---------------------------------------------------------------------------------
    def stop(self) -> None:
        """Pods first (through containerd), then the node, then the control plane; at last
        every process left in this mount namespace (shims, sandboxes) -- ours by construction."""
        for name in list(self.frozen):  # a stopped process would sit out SIGTERM
            with contextlib.suppress(ProcessLookupError, NodeError):
                os.killpg(self.process(name).pid, signal.SIGCONT)
        if self.sock.exists():
            ctr = [str(self.bin / "ctr"), "-a", str(self.sock), "-n", "k8s.io"]
            kubelet = [p for n, p in self.procs if n == "kubelet"]
            for p in kubelet:
                self.terminate(p)
            tasks = subprocess.run(
                [*ctr, "tasks", "ls", "-q"], capture_output=True, text=True, timeout=30
            ).stdout.split()
            for task in tasks:
                subprocess.run([*ctr, "tasks", "kill", "-s", "KILL", task], capture_output=True)
            for task in tasks:
                subprocess.run([*ctr, "tasks", "rm", "-f", task], capture_output=True, timeout=30)
        for _name, proc in reversed(self.procs):
            self.terminate(proc)
        if self.cp is not None:
            self.cp.stop(keep_workdir=True)
        own_mnt = os.stat("/proc/self/ns/mnt").st_ino

        def in_own_mount_namespace() -> set[int]:
            left = set()
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit() or int(entry.name) == os.getpid():
                    continue
                with contextlib.suppress(OSError):
                    if os.stat(entry / "ns" / "mnt").st_ino == own_mnt:
                        left.add(int(entry.name))
            return left

        _kill_until_none(in_own_mount_namespace, rounds=3)

    @staticmethod
    def terminate(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
        if proc.poll() is None:
            terminate(proc, timeout)


def coredns_manifest(image: str) -> str:
    """CoreDNS as the cluster DNS: a pod labelled k8s-app=kube-dns (the label work-unit
    NetworkPolicies allow DNS to) behind the Service the kubelet points pods at. It listens
    on port 53 itself (NetworkPolicies see the pod's port), as nobody: containerd's
    ``enable_unprivileged_ports`` opens low ports to every pod."""
    corefile = textwrap.dedent("""\
        .:53 {
            errors
            health :8081
            ready :8181
            kubernetes cluster.local in-addr.arpa ip6.arpa {
                pods insecure
                fallthrough in-addr.arpa ip6.arpa
            }
            cache 5
        }
        """)
    items: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "coredns", "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "realnode:coredns"},
         "rules": [
             {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
              "verbs": ["list", "watch"]},
             {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
              "verbs": ["list", "watch"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "realnode:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "realnode:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}]},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "coredns", "namespace": "kube-system"},
         "data": {"Corefile": corefile}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "coredns", "namespace": "kube-system",
                      "labels": {"k8s-app": "kube-dns"}},
         "spec": {
             "replicas": 1,
             "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
             "template": {
                 "metadata": {"labels": {"k8s-app": "kube-dns"}},
                 "spec": {
                     "serviceAccountName": "coredns",
                     "dnsPolicy": "Default",
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 65534,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{
                         "name": "coredns",
                         "image": image,
                         "imagePullPolicy": "Never",
                         "args": ["-conf", "/etc/coredns/Corefile"],
                         "ports": [{"containerPort": 53, "protocol": "UDP", "name": "dns"},
                                   {"containerPort": 53, "protocol": "TCP", "name": "dns-tcp"}],
                         "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181},
                                            "periodSeconds": 2},
                         "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                         "securityContext": {"allowPrivilegeEscalation": False,
                                             "readOnlyRootFilesystem": True,
                                             "capabilities": {"drop": ["ALL"]}},
                     }],
                     "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                 },
             },
         }},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": "kube-system",
                      "labels": {"k8s-app": "kube-dns"}},
         "spec": {"clusterIP": DNS_IP, "selector": {"k8s-app": "kube-dns"},
                  "ports": [{"name": "dns", "port": 53, "targetPort": 53, "protocol": "UDP"},
                            {"name": "dns-tcp", "port": 53, "targetPort": 53,
                             "protocol": "TCP"}]}},
    ]  # fmt: skip
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def _inside(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inside", action="store_true", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--cp-bin", required=True)
    ap.add_argument("--node-bin", required=True)
    ap.add_argument("--images", required=True)
    ap.add_argument("--coredns-image", required=True)
    launcher = _Launcher(ap.parse_args(argv))
    stopping = False

    def _term(signum: int, frame: object) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    try:
        launcher.start()
        print(f"[realnode] ready in {time.monotonic() - launcher.t0:.1f}s", flush=True)
        checked = time.monotonic()
        while True:
            time.sleep(0.2)
            launcher.serve_controls()
            if time.monotonic() - checked >= 2:
                launcher.alive()
                checked = time.monotonic()
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        launcher.stop()
        print("[realnode] stopped", flush=True)


@contextlib.contextmanager
def running_node(**kwargs: Any) -> Iterator[RealNode]:
    """``with running_node() as node:`` -- binaries and images from their caches."""
    node = RealNode(find_bin_dir(), find_node_bin(), find_images(), **kwargs)
    with node:
        yield node


if __name__ == "__main__":
    if "--inside" in sys.argv:
        sys.exit(_inside(sys.argv[1:]))
    with running_node() as n:  # a node for a person to look at, until ^C
        print(f"node up in {n.startup_seconds:.1f}s; netns {n.netns}; work dir {n.workdir}")
        print(f"nsenter --net=/run/netns/{n.netns} {n.bin}/kubectl --kubeconfig={n.kubeconfig}")
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
