"""A real, throw-away Kubernetes control plane on loopback, for tests.

Starts etcd, kube-apiserver (TLS on 127.0.0.1, RBAC, service-account signing keys),
kube-controller-manager, kube-scheduler and kwok (one fake node, ``kwok-node-0``) from the
binaries that ``tests/cluster/build-tools.sh`` builds, each on a free loopback port, each in its
own process group. Writes an admin kubeconfig, waits until the cluster is usable (apiserver
/readyz, controller and scheduler /healthz, the ``default`` ServiceAccount and the
``kube-root-ca.crt`` ConfigMap in namespace ``default``, the kwok node Ready), and on ``stop()``
kills exactly the process groups it started. Logs, certificates and the kubeconfig live in one
work directory, removed on stop unless asked to keep it (the pytest plugin keeps it when a test
failed and prints where).

Standard library only; certificates are made with the ``openssl`` command.

    with ControlPlane(bin_dir) as cp:
        cp.kubectl("get", "nodes")

Nothing here sends traffic anywhere but 127.0.0.1. Pod and service IPs that appear in object
status are fake (kwok runs no containers; there is no kube-proxy).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tests.cluster.kube import (
    KubeClient,
    client_env,
    make_client_dirs,
    spawn,
    tail,
    timed_start,
    wait_for,
)
from tests.cluster.kube import KubectlError as KubectlError
from tests.support import ports

HERE = Path(__file__).resolve().parent
STAGES_DIR = HERE / "stages"
BUILD_SCRIPT = HERE / "build-tools.sh"
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
)
NODE_NAME = "kwok-node-0"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# Annotations understood by the stages in tests/cluster/stages/pod.yaml
HOLD_ANNOTATION = "evalkube.io/kwok-hold"
COMPLETE_ANNOTATION = "evalkube.io/kwok-complete"


class ControlPlaneError(RuntimeError):
    """The control plane could not be started (the message says which component and why)."""


class BinariesMissing(ControlPlaneError):
    """The control-plane binaries are not built."""


# --------------------------------------------------------------------------------------------
# Finding the binaries
# --------------------------------------------------------------------------------------------


def missing_binaries(bin_dir: Path) -> list[str]:
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


def find_bin_dir(*, env: dict[str, str] | None = None) -> Path:
    """The bin dir from ``$EVALKUBE_CTRLPLANE_BIN``, else from the build cache (never builds).

    Raises BinariesMissing with a message that says how to build them.
    """
    env = dict(os.environ if env is None else env)
    explicit = env.get("EVALKUBE_CTRLPLANE_BIN")
    if explicit:
        bin_dir = Path(explicit)
        missing = missing_binaries(bin_dir)
        if missing:
            raise BinariesMissing(
                f"EVALKUBE_CTRLPLANE_BIN={explicit} lacks {', '.join(missing)}; "
                f"build them with `bash {rel(BUILD_SCRIPT)}` and point the variable at the "
                "directory it prints"
            )
        return bin_dir
    try:
        out = subprocess.run(
            ["bash", str(BUILD_SCRIPT), "--print-if-cached"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:  # pragma: no cover - defensive
        raise BinariesMissing(
            f"could not run {rel(BUILD_SCRIPT)} --print-if-cached: {exc}"
        ) from exc
    if out.returncode == 0 and out.stdout.strip():
        bin_dir = Path(out.stdout.strip().splitlines()[-1])
        if not missing_binaries(bin_dir):
            return bin_dir
    raise BinariesMissing(
        "control-plane binaries are not built "
        f"({out.stderr.strip() or 'build-tools.sh found no complete cache'}). "
        f"Build them once with `bash {rel(BUILD_SCRIPT)}` (cold: ~30-40 min on 2 cores, "
        "then cached outside the work tree), or set EVALKUBE_CTRLPLANE_BIN to a directory "
        f"holding {', '.join(BINARIES)}."
    )


def rel(p: Path) -> str:
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    return ports.free_port()


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    if proc.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{proc.stderr}")


class _Proc:
    def __init__(self, name: str, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.name = name
        self.popen = popen
        self.log = log
        self.pgid = os.getpgid(popen.pid)  # == pid: started with start_new_session=True


# --------------------------------------------------------------------------------------------
# The control plane
# --------------------------------------------------------------------------------------------


class ControlPlane(KubeClient):
    """A loopback Kubernetes control plane (see module docstring).

    Attributes after ``start()``:
      bin         directory with the binaries (also first on ``env["PATH"]``)
      workdir     directory with certs, kubeconfigs, etcd data and ``logs/``
      logs_dir    ``workdir/logs``: one ``<component>.log`` per process
      kubeconfig  admin kubeconfig (system:masters, client certificate)
      server      ``https://127.0.0.1:<port>``
      env         environment for subprocesses: KUBECONFIG, PATH, isolated helm/kubectl caches
      node_name   the kwok fake node (``kwok-node-0``)
      ports       {"etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler"}
      startup_seconds  wall time of ``start()``
    """

    def __init__(
        self,
        bin_dir: Path | str,
        *,
        workdir: Path | str | None = None,
        stages: Sequence[Path | str] | None = None,
        node_name: str = NODE_NAME,
        start_timeout: float = 120.0,
        extra_apiserver_args: Iterable[str] = (),
    ) -> None:
        self.bin = Path(bin_dir).resolve()
        missing = missing_binaries(self.bin)
        if missing:
            raise BinariesMissing(f"{self.bin} lacks {', '.join(missing)}")
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="evalkube-ctrlplane-")).resolve()
        self.logs_dir = self.workdir / "logs"
        self.stages = [Path(s) for s in (stages or sorted(STAGES_DIR.glob("*.yaml")))]
        self.node_name = node_name
        self.start_timeout = start_timeout
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.ports: dict[str, int] = {}
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.server = ""
        self.startup_seconds: float | None = None
        # seconds from start() until each readiness check passed (and for certificate creation)
        self.timings: dict[str, float] = {}
        self._t_start = 0.0
        self._procs: list[_Proc] = []
        self._stopped = False
        self.env = self._make_env()

    # -- context manager ----------------------------------------------------------------------
    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.stop(keep_workdir=exc_type is not None)

    # -- clients (KubeClient: kubectl, kubectl_json, apply, run, wait_for) --------------------
    def timeout_report(self) -> str:
        return self._dead_processes_report()

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> ControlPlane:
        self._t_start = time.monotonic()
        self.startup_seconds = timed_start(self._start, self.stop)
        return self

    def stop(self, *, keep_workdir: bool = False, timeout: float = 15.0) -> None:
        """SIGTERM the process groups this object started (kwok, scheduler, controller-manager;
        then the apiserver; then etcd), SIGKILL what is left after ``timeout`` per wave; then
        remove the work dir unless ``keep_workdir``. Never signals any other process."""
        if self._stopped:
            return
        self._stopped = True
        # clients first, then the apiserver, then etcd: each sees its server go away last
        waves = [
            [p for p in self._procs if p.name not in ("kube-apiserver", "etcd")],
            [p for p in self._procs if p.name == "kube-apiserver"],
            [p for p in self._procs if p.name == "etcd"],
        ]
        for wave in waves:
            for proc in wave:
                if proc.popen.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pgid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for proc in wave:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self._procs:
            # whatever is left of the group (a hung process; any child it forked). A group id
            # stays reserved while any member lives; once all are gone killpg finds nothing
            # (reuse within these seconds would need the whole PID space to wrap).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5)
        if self._own_workdir and not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def pids(self) -> dict[str, int]:
        return {p.name: p.popen.pid for p in self._procs}

    def process(self, name: str) -> subprocess.Popen[bytes]:
        """The running (or stopped) process of component ``name`` (``etcd``, ...)."""
        for proc in self._procs:
            if proc.name == name:
                return proc.popen
        raise ControlPlaneError(f"no control plane component named {name!r}")

    def respawn(self, name: str, timeout: float = 120.0) -> None:
        """Start component ``name`` again, with its first command line, once it has exited (a
        fault test stopped it), and wait until it serves again. Its data (etcd's) is kept."""
        old = next((p for p in self._procs if p.name == name), None)
        if old is None:
            raise ControlPlaneError(f"no control plane component named {name!r}")
        if old.popen.poll() is None:
            raise ControlPlaneError(f"{name} still runs (pid {old.popen.pid})")
        args = old.popen.args
        assert isinstance(args, list), args  # _spawn passes a list
        self._procs.remove(old)
        proc = self._spawn(name, [str(a) for a in args])
        checks: dict[str, Callable[[], Any]] = {
            "etcd": lambda: self._http_ok(f"http://127.0.0.1:{self.ports['etcd']}/health"),
            "kube-apiserver": lambda: self._https_ok(f"{self.server}/readyz", client_cert=True),
            "kube-controller-manager": lambda: self._https_ok(
                f"https://127.0.0.1:{self.ports['controller-manager']}/healthz",
                client_cert=False,
                verify=False,
            ),
            "kube-scheduler": lambda: self._https_ok(
                f"https://127.0.0.1:{self.ports['scheduler']}/healthz",
                client_cert=False,
                verify=False,
            ),
        }
        self._wait_component(proc, checks.get(name, lambda: True), "serving again", timeout)

    # -- internals ----------------------------------------------------------------------------
    def _make_env(self) -> dict[str, str]:
        env = client_env(self.workdir, self.kubeconfig)  # helm and kubectl state out of $HOME
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["KWOK_WORKDIR"] = str(self.workdir / "kwok-home")  # no ~/.kwok/kwok.yaml
        return env

    def _spawn(self, name: str, args: list[str]) -> _Proc:
        log = self.logs_dir / f"{name}.log"
        # own process group: stop() kills exactly this group
        proc = _Proc(name, spawn(args, log, cwd=self.workdir, env=self.env), log)
        self._procs.append(proc)
        return proc

    def _dead_processes_report(self) -> str:
        out = []
        for p in self._procs:
            rc = p.popen.poll()
            if rc is not None:
                out.append(f"--- {p.name} exited with {rc}; last lines of {p.log}:\n{tail(p.log)}")
        return "\n".join(out)

    def _wait_component(
        self, proc: _Proc, check: Callable[[], Any], what: str, timeout: float | None = None
    ) -> None:
        def probe() -> Any:
            rc = proc.popen.poll()
            if rc is not None:
                raise ControlPlaneError(
                    f"{proc.name} exited with code {rc} during startup; last lines of "
                    f"{proc.log}:\n{tail(proc.log)}"
                )
            return check()

        try:
            wait_for(
                probe,
                timeout=timeout or self.start_timeout,
                interval=0.1,
                what=what,
                fatal=(ControlPlaneError,),
            )
        except TimeoutError as exc:
            raise ControlPlaneError(
                f"{proc.name}: {exc}; last lines of {proc.log}:\n{tail(proc.log)}"
            ) from None
        self.timings[f"{proc.name} {what}"] = time.monotonic() - self._t_start

    def _https_ok(self, url: str, *, client_cert: bool, verify: bool = True) -> bool:
        if verify:
            ctx = ssl.create_default_context(cafile=str(self.workdir / "pki" / "ca.crt"))
        else:  # controller-manager / scheduler serve a self-signed loopback certificate
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if client_cert:
            pki = self.workdir / "pki"
            ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        # A probe of a component that is still starting can fail mid-handshake; the socket
        # urllib then drops is finalized here, with its ResourceWarning ignored, instead of
        # surfacing later as an "unraisable" error in whatever test runs at that moment.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            try:
                with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
                    return resp.status == 200
            except urllib.error.HTTPError as exc:
                exc.close()  # an unclosed error response leaks its socket
                return False
            finally:
                gc.collect()

    def _api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One request to the apiserver as admin (stdlib; faster than a kubectl process).
        Returns the decoded JSON; raises urllib.error.HTTPError on 4xx/5xx."""
        pki = self.workdir / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.server}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            exc.close()  # keeps .code; an unclosed error response leaks its socket
            raise

    @staticmethod
    def _http_ok(url: str) -> bool:
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = resp.read()
            return resp.status == 200 and b'"health":"true"' in body.replace(b" ", b"")

    def _make_pki(self) -> None:
        pki = self.workdir / "pki"
        pki.mkdir()
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _openssl(
            "req",
            "-x509",
            *ec,
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "7",
            "-subj",
            "/CN=evalkube-test-ca",
            cwd=pki,
        )

        _openssl(
            "req",
            "-x509",
            *ec,
            "-keyout",
            "front-proxy-ca.key",
            "-out",
            "front-proxy-ca.crt",
            "-days",
            "7",
            "-subj",
            "/CN=evalkube-test-front-proxy-ca",
            cwd=pki,
        )

        def leaf(name: str, subj: str, *exts: str, ca: str = "ca") -> None:
            _openssl(
                "req",
                "-x509",
                *ec,
                "-keyout",
                f"{name}.key",
                "-out",
                f"{name}.crt",
                "-days",
                "7",
                "-subj",
                subj,
                "-CA",
                f"{ca}.crt",
                "-CAkey",
                f"{ca}.key",
                "-addext",
                "basicConstraints=critical,CA:FALSE",
                "-addext",
                "keyUsage=critical,digitalSignature,keyEncipherment",
                *[a for e in exts for a in ("-addext", e)],
                cwd=pki,
            )

        leaf(
            "apiserver",
            "/CN=kube-apiserver",
            "extendedKeyUsage=serverAuth",
            "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
            "DNS:kubernetes.default.svc.cluster.local",
        )
        client = "extendedKeyUsage=clientAuth"
        leaf("admin", "/O=system:masters/CN=evalkube-admin", client)
        leaf("controller-manager", "/CN=system:kube-controller-manager", client)
        leaf("scheduler", "/CN=system:kube-scheduler", client)
        # kwok updates node and pod status, leases and deletes pods: cluster-admin for simplicity
        leaf("kwok", "/O=system:masters/CN=kwok", client)
        leaf("front-proxy-client", "/CN=front-proxy-client", client, ca="front-proxy-ca")
        _openssl(
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-out",
            "sa.key",
            cwd=pki,
        )
        _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)

    def _write_kubeconfig(self, path: Path, user: str) -> None:
        pki = self.workdir / "pki"
        path.write_text(
            textwrap.dedent(f"""\
            apiVersion: v1
            kind: Config
            clusters:
            - name: evalkube-test
              cluster:
                server: {self.server}
                certificate-authority: {pki / "ca.crt"}
            users:
            - name: {user}
              user:
                client-certificate: {pki / (user + ".crt")}
                client-key: {pki / (user + ".key")}
            contexts:
            - name: evalkube-test
              context:
                cluster: evalkube-test
                user: {user}
                namespace: default
            current-context: evalkube-test
            """)
        )
        path.chmod(0o600)

    def _start(self) -> None:
        if self._procs:
            raise ControlPlaneError("already started")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        make_client_dirs(self.workdir)
        (self.workdir / "kwok-home").mkdir(exist_ok=True)
        t0 = time.monotonic()
        self._make_pki()
        self.timings["certificates"] = time.monotonic() - t0
        pki = self.workdir / "pki"
        for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler"):
            port = free_port()
            while port in self.ports.values():
                port = free_port()
            self.ports[name] = port
        self.server = f"https://127.0.0.1:{self.ports['apiserver']}"
        self._write_kubeconfig(self.kubeconfig, "admin")
        kcs = {}
        for user in ("controller-manager", "scheduler", "kwok"):
            kcs[user] = self.workdir / f"{user}.kubeconfig"
            self._write_kubeconfig(kcs[user], user)

        # etcd ---------------------------------------------------------------------------------
        ep, epp = self.ports["etcd"], self.ports["etcd-peer"]
        etcd = self._spawn(
            "etcd",
            [
                str(self.bin / "etcd"),
                "--name=evalkube",
                f"--data-dir={self.workdir / 'etcd-data'}",
                f"--listen-client-urls=http://127.0.0.1:{ep}",
                f"--advertise-client-urls=http://127.0.0.1:{ep}",
                f"--listen-peer-urls=http://127.0.0.1:{epp}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{epp}",
                f"--initial-cluster=evalkube=http://127.0.0.1:{epp}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync=true",  # throw-away data: no fsync per write
                "--log-level=warn",
            ],
        )
        self._wait_component(
            etcd, lambda: self._http_ok(f"http://127.0.0.1:{ep}/health"), "/health"
        )

        # kube-apiserver -----------------------------------------------------------------------
        ap = self.ports["apiserver"]
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.bin / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{ep}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={ap}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=RBAC",
                "--anonymous-auth=false",
                "--allow-privileged=true",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                # the loopback advertise address cannot be stored in the "kubernetes" Endpoints
                # (validation forbids loopback IPs); nothing in-cluster talks to it anyway
                "--endpoint-reconciler-type=none",
                # aggregation layer / request-header authentication (front-proxy CA)
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                "--profiling=false",
                *self.extra_apiserver_args,
            ],
        )
        self._wait_component(
            apiserver,
            lambda: self._https_ok(f"{self.server}/readyz", client_cert=True),
            "/readyz",
        )

        # controller-manager and scheduler -----------------------------------------------------
        def served(user: str, port: int, cert_dir: str) -> list[str]:
            """Their shared flags: own kubeconfig, a loopback HTTPS port, no leader election."""
            return [
                f"--kubeconfig={kcs[user]}",
                f"--authentication-kubeconfig={kcs[user]}",
                f"--authorization-kubeconfig={kcs[user]}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / cert_dir}",
                "--leader-elect=false",
            ]

        cmp_ = self.ports["controller-manager"]
        kcm = self._spawn(
            "kube-controller-manager",
            [
                str(self.bin / "kube-controller-manager"),
                *served("controller-manager", cmp_, "kcm-certs"),
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--use-service-account-credentials=true",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--profiling=false",
            ],
        )
        sp = self.ports["scheduler"]
        sched = self._spawn(
            "kube-scheduler",
            [
                str(self.bin / "kube-scheduler"),
                *served("scheduler", sp, "scheduler-certs"),
                "--profiling=false",
            ],
        )

        # kwok ---------------------------------------------------------------------------------
        kwok = self._spawn(
            "kwok",
            [
                str(self.bin / "kwok"),
                f"--kubeconfig={kcs['kwok']}",
                *[f"--config={s}" for s in self.stages],
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                "--node-ip=127.0.0.1",  # fake; nothing listens there for it
                "--cidr=10.244.0.0/16",  # fake pod IPs (no traffic: kwok runs no containers)
                "--node-lease-duration-seconds=40",
            ],
        )

        # the fake node: created now, so kwok and the controllers pick it up as they come up
        self._api(
            "POST",
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": self.node_name,
                    "annotations": {
                        KWOK_NODE_ANNOTATION: "fake",
                        "node.alpha.kubernetes.io/ttl": "0",
                    },
                    "labels": {
                        "kubernetes.io/hostname": self.node_name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                    },
                },
            },
        )

        self._wait_component(
            kcm,
            lambda: self._https_ok(
                f"https://127.0.0.1:{cmp_}/healthz", client_cert=False, verify=False
            ),
            "/healthz",
        )
        self._wait_component(
            sched,
            lambda: self._https_ok(
                f"https://127.0.0.1:{sp}/healthz", client_cert=False, verify=False
            ),
            "/healthz",
        )

        def node_ready() -> bool:
            node = self._api("GET", f"/api/v1/nodes/{self.node_name}")
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            taints = node.get("spec", {}).get("taints") or []
            # the node lifecycle controller removes node.kubernetes.io/not-ready once it is Ready
            return conds.get("Ready") == "True" and not any(
                t.get("key", "").startswith("node.kubernetes.io/") for t in taints
            )

        self._wait_component(kwok, node_ready, f"node {self.node_name} Ready and untainted")

        def default_ns_usable() -> bool:
            self._api("GET", "/api/v1/namespaces/default/serviceaccounts/default")
            self._api("GET", "/api/v1/namespaces/default/configmaps/kube-root-ca.crt")
            return True

        self._wait_component(
            kcm,
            default_ns_usable,
            "ServiceAccount default and ConfigMap kube-root-ca.crt in default",
        )

    def describe(self) -> str:
        lines = [f"control plane {self.server} (workdir {self.workdir})"]
        lines += [f"  {p.name}: pid {p.popen.pid} log {p.log}" for p in self._procs]
        return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.cluster.ctrlplane``: start a control plane and keep it up until ^C."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", help="bin dir (default: $EVALKUBE_CTRLPLANE_BIN or the build cache)")
    ap.add_argument("--workdir", help="work dir (default: a new temp dir, kept)")
    ns = ap.parse_args(argv)
    bin_dir = Path(ns.bin) if ns.bin else find_bin_dir()
    cp = ControlPlane(bin_dir, workdir=ns.workdir)
    cp.start()
    print(cp.describe())
    print(f"ready in {cp.startup_seconds:.1f}s\nexport KUBECONFIG={cp.kubeconfig}", flush=True)

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cp.stop(keep_workdir=True)
        print(f"stopped; logs in {cp.logs_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
