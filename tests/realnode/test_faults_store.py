"""Store and ingest faults on the real node: PostgreSQL restarted or unreachable under
ingesting units, its disk full, two operator replicas losing their leader, and runners cut
from the ingest API for longer than their retry window. Each run must end with the samples,
counts and scores of the same suite run without the fault, every sample stored once, and
nothing left behind once the EvalRun is deleted.

The module moves the session's release onto a PostgreSQL server on a host outside the cluster
(its own netns, like the S3 store of test_sources.py), with the runners' retry window
shortened to :data:`RETRY_SECONDS`; it rolls the release back to SQLite at the end, so the
rest of the tier sees the chart as it was installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from evalkube.controller import names
from evalkube.store import ResultStore
from tests.cluster.ctrlplane import wait_for
from tests.cluster.realnode import POD_CIDR, RealNode
from tests.realnode.faults import exact_match_task, one_task_suite
from tests.realnode.support import OPERATOR_NS, RELEASE, diagnose, eval_run, wait_finished
from tests.support.postgres import find_bindir

#: Nightly as a module (``make nightly``): its set-up moves the session's release to a
#: PostgreSQL store and back (two ``helm upgrade`` rollouts and a fault-free run, about 2 min
#: 10 s) before any fault, and each CI run's real-node time is kept to about 4 minutes.
pytestmark = [pytest.mark.realnode, pytest.mark.timeout(900), pytest.mark.nightly]

#: The PostgreSQL host: TEST-NET-1, in a netns of this module's own (the S3 and provider
#: hosts of other tests use TEST-NET-2), linked to the node's netns by a veth pair.
PG_IP, PG_GW, PG_PORT = "192.0.2.2", "192.0.2.1", 5432
PG_SECRET = "evalkube-faults-pg"
#: The runners' retry window in this module (EVALKUBE_INGEST_RETRY_SECONDS; 300 by default):
#: the outages below are shorter than it, the partition longer.
RETRY_SECONDS = 30
#: How long the store stays down or full: inside the window, and long enough that the units'
#: posts (each unit grades for GRADE_SECONDS x SHARD rows) fall into it.
OUTAGE_SECONDS = 20
GRADE_SECONDS, ROWS, SHARD = 2, 12, 4
#: The store's data directory lives on a tmpfs of this size (the disk the disk-full test fills).
PG_DISK_MB = 96
SELECTOR = f"app.kubernetes.io/name=evalkube,app.kubernetes.io/instance={RELEASE}"
GRADER = f"""
import time

def grade(sample, item):
    time.sleep({GRADE_SECONDS})
    output = (sample.get("extracted_output") or "").strip()
    return {{"scores": {{"exact_match": 1.0 if output == item["a"] else 0.0}}}}
"""


def fault_suite(namespace: str) -> dict[str, Any]:
    """One task of ROWS rows in shards of SHARD, a grader that takes GRADE_SECONDS a row (the
    units are still running when a fault starts), every third answer wrong, and a 24 kB
    prompt of incompressible text per row (each unit's post needs new pages of the store:
    a full disk refuses it)."""
    rows = []
    for i in range(ROWS):
        noise = os.urandom(9000).hex()[:24000]
        rows.append({"q": f"{i}? {noise}", "a": str(i), "out": "wrong" if i % 3 == 0 else str(i)})
    return one_task_suite(namespace, "faults", exact_match_task("qa", rows, GRADER))


# --------------------------------------------------------------------------------------------
# The PostgreSQL host
# --------------------------------------------------------------------------------------------


class OutsidePostgres:
    """A throwaway PostgreSQL cluster in its own netns at PG_IP (the operator pods reach it
    through the node's netns), its data directory on a size-limited tmpfs (a disk that can be
    filled), its WAL on the host's disk (a full data disk makes writes fail, not the server
    panic), and a unix socket on the host for the test to read the store through."""

    def __init__(self, node: RealNode) -> None:
        bindir = find_bindir()
        if bindir is None:
            pytest.fail("PostgreSQL server binaries not found (apt-get install postgresql)")
        self.bindir = bindir
        self.node = node
        self.netns = f"{node.netns}-pg"
        self.root = Path(tempfile.mkdtemp(prefix="evalkube-faults-pg-"))
        self.disk = self.root / "disk"
        self.data = self.disk / "data"
        self.sockets = self.root / "sock"
        self.filler = self.disk / "filler"

    # the pods' URL (through the node's netns) and the test's (the unix socket on the host)
    @property
    def pod_url(self) -> str:
        return f"postgresql+psycopg://postgres@{PG_IP}:{PG_PORT}/postgres"

    @property
    def host_url(self) -> str:
        return f"postgresql+psycopg://postgres@/postgres?host={self.sockets}&port={PG_PORT}"

    def _as_postgres(self, *args: str, netns: bool = False) -> subprocess.CompletedProcess[str]:
        cmd = ["runuser", "-u", "postgres", "--", *args]
        if netns:
            cmd = ["nsenter", f"--net=/run/netns/{self.netns}", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)

    def start_host(self) -> None:
        ns = self.netns
        for cmd in (
            ["ip", "netns", "add", ns],
            ["ip", "-n", self.node.netns, "link", "add", "pg0", "type", "veth", "peer", "name",
             "pg1"],
            ["ip", "-n", self.node.netns, "link", "set", "pg1", "netns", ns],
            ["ip", "-n", self.node.netns, "addr", "add", f"{PG_GW}/24", "dev", "pg0"],
            ["ip", "-n", self.node.netns, "link", "set", "pg0", "up"],
            ["ip", "-n", ns, "addr", "add", f"{PG_IP}/24", "dev", "pg1"],
            ["ip", "-n", ns, "link", "set", "pg1", "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "-n", ns, "route", "add", POD_CIDR, "via", PG_GW],
        ):  # fmt: skip
            subprocess.run(cmd, check=True, capture_output=True)
        self.disk.mkdir()
        self.sockets.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={PG_DISK_MB}m,mode=0755", "tmpfs",
             str(self.disk)],
            check=True, capture_output=True,
        )  # fmt: skip
        for path in (self.root, self.disk, self.sockets):
            shutil.chown(path, "postgres")
        init = self._as_postgres(
            str(self.bindir / "initdb"), "-D", str(self.data), "-X", str(self.root / "wal"),
            "-A", "trust", "-U", "postgres", "--no-sync",
        )  # fmt: skip
        assert init.returncode == 0, init.stderr
        with (self.data / "pg_hba.conf").open("a") as hba:
            # the pods' posts may arrive masqueraded as the node's end of the veth
            hba.write("host all all 0.0.0.0/0 trust\n")
        self.start()

    def start(self) -> None:
        started = self._as_postgres(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
            "-w", "-t", "60", "-o",
            f"-p {PG_PORT} -k {self.sockets} -c listen_addresses={PG_IP} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off",
            "start", netns=True,
        )  # fmt: skip
        assert started.returncode == 0, f"{started.stderr}\n{self.log()}"

    def stop(self) -> None:
        """Stop at once, as a crashed or killed server would (no shutdown checkpoint)."""
        stopped = self._as_postgres(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"
        )
        assert stopped.returncode == 0, stopped.stderr

    def fill_disk(self) -> None:
        """Write a file until the data disk has no byte left."""
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={self.filler}", "bs=1M"], capture_output=True, check=False
        )
        assert shutil.disk_usage(self.disk).free < 1024 * 1024

    def free_disk(self) -> None:
        self.filler.unlink(missing_ok=True)

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "log").read_text(errors="replace")[-4000:]
        return ""

    def remove(self) -> None:
        self._as_postgres(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"
        )
        pids = subprocess.run(
            ["ip", "netns", "pids", self.netns], capture_output=True, text=True
        ).stdout
        for pid in pids.split():
            subprocess.run(["kill", "-KILL", pid], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        subprocess.run(["ip", "-n", self.node.netns, "link", "del", "pg0"], capture_output=True)
        subprocess.run(["umount", "-l", str(self.disk)], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# The release on PostgreSQL, and a fault-free run to compare with
# --------------------------------------------------------------------------------------------


def helm_upgrade(node: RealNode, *sets: str) -> None:
    """``helm upgrade`` the session's release: the values it has (``--reuse-values``, unless
    ``sets`` says ``--reset-values``) changed by ``sets``; wait until the operator is Ready."""
    reuse = [] if "--reset-values" in sets else ["--reuse-values"]
    out = node.helm(
        "upgrade", RELEASE, str(Path(__file__).resolve().parents[2] / "charts" / "evalkube"),
        "--namespace", OPERATOR_NS, *reuse, *sets,
    )  # fmt: skip
    assert out.returncode == 0, f"helm upgrade failed:\n{out.stdout}\n{out.stderr}"
    wait_rolled_out(node)


def wait_rolled_out(node: RealNode) -> None:
    rollout = node.kubectl(
        "-n", OPERATOR_NS, "rollout", "status", f"deploy/{RELEASE}", "--timeout=180s",
        check=False, timeout=200,
    )  # fmt: skip
    assert rollout.returncode == 0, f"operator not ready: {rollout.stderr}\n{diagnose(node)}"


def operator_pods(node: RealNode) -> list[dict[str, Any]]:
    pods = node.kubectl_json("get", "pods", "-n", OPERATOR_NS, "-l", SELECTOR)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


@dataclass
class Outcome:
    """What a finished run left: its status and its samples as the store has them, keyed by
    what does not depend on the run (its uid is in every sample id)."""

    run: dict[str, Any]
    samples: dict[tuple[str, str, int], tuple[str | None, str, dict[str, float]]]
    stored: int


@pytest.fixture(scope="module")
def pg(evalkube_on_node: RealNode) -> Iterator[OutsidePostgres]:
    """The session's release on an outside PostgreSQL (retry window RETRY_SECONDS); back on
    its own values at the end. An upgrade, not ``helm rollback``: the SQLite claim (kept by its
    ``resource-policy``) is adopted again by an upgrade, and a rollback refuses it."""
    node = evalkube_on_node
    values = node.workdir / "faults-store-values.json"
    got = node.helm("get", "values", RELEASE, "-n", OPERATOR_NS, "-o", "json")
    assert got.returncode == 0, got.stderr
    values.write_text(got.stdout)
    server = OutsidePostgres(node)
    try:
        server.start_host()
        node.kubectl("-n", OPERATOR_NS, "delete", "secret", PG_SECRET, check=False)
        node.kubectl(
            "-n", OPERATOR_NS, "create", "secret", "generic", PG_SECRET,
            f"--from-literal=url={server.pod_url}",
        )  # fmt: skip
        helm_upgrade(
            node,
            "--set", "store.type=postgres",
            "--set", f"store.postgres.existingSecret={PG_SECRET}",
            "--set", "extraEnv[0].name=EVALKUBE_INGEST_RETRY_SECONDS",
            "--set-string", f"extraEnv[0].value={RETRY_SECONDS}",
        )  # fmt: skip
        yield server
    finally:
        try:
            helm_upgrade(node, "--reset-values", "-f", str(values))
        finally:
            node.kubectl("-n", OPERATOR_NS, "delete", "secret", PG_SECRET, check=False)
            server.remove()


def outcome(node: RealNode, pg: OutsidePostgres, namespace: str, name: str) -> Outcome:
    run = wait_finished(node, namespace, name, timeout=420)
    meta = run["metadata"]
    store = ResultStore.open(pg.host_url)
    try:
        records = list(store.iter_samples(names.run_id(namespace, name, meta["uid"])))
    finally:
        store.close()
    samples = {(r.task_id, r.model, r.seq): (r.row_id, r.status, dict(r.scores)) for r in records}
    return Outcome(run=run, samples=samples, stored=len(records))


def start_run(node: RealNode, namespace: str, name: str) -> None:
    node.apply(fault_suite(namespace))
    node.apply(eval_run(namespace, name, "faults", shardSize=SHARD))


@pytest.fixture(scope="module")
def baseline(pg: OutsidePostgres, evalkube_on_node: RealNode) -> Iterator[Outcome]:
    """The same suite run with no fault, on the same release and store."""
    node = evalkube_on_node
    namespace = "rn-faults-baseline"
    node.kubectl("create", "namespace", namespace)
    try:
        start_run(node, namespace, "calm")
        result = outcome(node, pg, namespace, "calm")
        assert result.run["status"]["phase"] == "Succeeded", json.dumps(result.run["status"])
        assert result.stored == ROWS
        yield result
    finally:
        node.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def assert_like_baseline(
    node: RealNode, namespace: str, name: str, got: Outcome, baseline: Outcome
) -> None:
    """Terminal phase with its reason, the samples of the fault-free run once each, the same
    scores and counts, no unit run twice; then nothing of the run left once it is deleted."""
    status = got.run["status"]
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    assert conditions["Succeeded"]["status"] == "True", conditions
    assert conditions["Succeeded"].get("reason"), conditions
    assert got.stored == baseline.stored == ROWS  # once each: no sample twice, none lost
    assert got.samples == baseline.samples
    assert status["results"] == baseline.run["status"]["results"]
    units = status["units"]
    assert units["succeeded"] == units["total"] == ROWS // SHARD, units
    jobs = node.kubectl_json("get", "jobs", "-n", namespace)["items"]
    assert len(jobs) == units["total"], [j["metadata"]["name"] for j in jobs]  # none re-created
    assert_nothing_left(node, namespace, name, got.run["metadata"]["uid"])


def assert_nothing_left(node: RealNode, namespace: str, name: str, uid: str) -> None:
    node.kubectl("delete", "evalrun", name, "-n", namespace, "--wait=true", timeout=120)

    def left() -> list[str]:
        found = []
        for kind in ("jobs", "pods", "secrets", "configmaps", "networkpolicies"):
            for item in node.kubectl_json("get", kind, "-n", namespace)["items"]:
                meta = item["metadata"]
                owned = any(o.get("uid") == uid for o in meta.get("ownerReferences", []))
                labelled = meta.get("labels", {}).get(names.LABEL_RUN) == names.run_label(name)
                if owned or labelled:
                    found.append(f"{kind}/{meta['name']}")
        return found

    deadline = time.monotonic() + 120
    while remaining := left():
        assert time.monotonic() < deadline, f"orphans of the deleted run: {remaining}"
        time.sleep(2)


def runners_started(node: RealNode, namespace: str, name: str, count: int) -> None:
    """Wait until ``count`` of the run's Pods have their runner container running."""

    def running() -> bool:
        pods = node.kubectl_json("get", "pods", "-n", namespace, "-l", f"{names.LABEL_RUN}={name}")[
            "items"
        ]
        started = 0
        for pod in pods:
            for c in pod.get("status", {}).get("containerStatuses", []):
                if c["name"] == "runner" and "running" in c.get("state", {}):
                    started += 1
        return started >= count

    try:
        wait_for(running, timeout=180, interval=0.5, what=f"{count} runners of {namespace}/{name}")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{operator_logs(node)[-6000:]}\n{diagnose(node)}") from None


def failed_pods(node: RealNode, namespace: str) -> int:
    jobs = node.kubectl_json("get", "jobs", "-n", namespace)["items"]
    return sum(int(j.get("status", {}).get("failed") or 0) for j in jobs)


def operator_logs(node: RealNode) -> str:
    return "".join(
        node.kubectl(
            "logs", "-n", OPERATOR_NS, p["metadata"]["name"], "--tail=2000", check=False
        ).stdout
        for p in operator_pods(node)
    )


# --------------------------------------------------------------------------------------------
# The faults
# --------------------------------------------------------------------------------------------


def test_postgres_restarted_while_units_ingest_loses_and_duplicates_nothing(
    pg: OutsidePostgres, baseline: Outcome, evalkube_on_node: RealNode, node_namespace: str
) -> None:
    """PostgreSQL killed (no shutdown checkpoint) while every unit grades, unreachable for
    OUTAGE_SECONDS, then started again: the ingest answers 503 naming the store, the runners
    wait within their window (no Pod fails), and the run ends exactly as without the fault."""
    node, ns = evalkube_on_node, node_namespace
    start_run(node, ns, "pg-restart")
    runners_started(node, ns, "pg-restart", ROWS // SHARD)
    time.sleep(2)
    pg.stop()
    try:
        time.sleep(OUTAGE_SECONDS)
    finally:
        pg.start()
    got = outcome(node, pg, ns, "pg-restart")
    assert "the results store refused" in operator_logs(node)  # the outage was met, and named
    assert failed_pods(node, ns) == 0, "a runner gave up on an outage shorter than its window"
    assert_like_baseline(node, ns, "pg-restart", got, baseline)


def test_postgres_unreachable_while_units_ingest_loses_and_duplicates_nothing(
    pg: OutsidePostgres, baseline: Outcome, evalkube_on_node: RealNode, node_namespace: str
) -> None:
    """Every packet to PostgreSQL dropped for OUTAGE_SECONDS while every unit grades (no
    refusal, no reset: the operator's connections hang, as behind a broken switch), then let
    through again: nothing is stored twice or lost, and the run ends exactly as without the
    fault (a runner whose post outlasted its window fails, and its Job's next Pod finishes the
    unit)."""
    node, ns = evalkube_on_node, node_namespace
    rule = ["INPUT", "-p", "tcp", "--dport", str(PG_PORT), "-j", "DROP"]
    in_pg = ["nsenter", f"--net=/run/netns/{pg.netns}", "iptables", "-w"]
    start_run(node, ns, "pg-unreachable")
    runners_started(node, ns, "pg-unreachable", ROWS // SHARD)
    time.sleep(2)
    subprocess.run([*in_pg, "-I", *rule], check=True)
    try:
        time.sleep(OUTAGE_SECONDS)
        # every unit has graded its rows by now (GRADE_SECONDS x SHARD): what is not stored
        # is held behind the dropped packets (the test reads the store over its unix socket)
        uid = node.kubectl_json("get", "evalrun", "pg-unreachable", "-n", ns)["metadata"]["uid"]
        store = ResultStore.open(pg.host_url)
        try:
            held = ROWS - sum(store.sample_counts(names.run_id(ns, "pg-unreachable", uid)).values())
        finally:
            store.close()
    finally:
        subprocess.run([*in_pg, "-D", *rule], check=False)
    assert held > 0, "no post met the outage"
    got = outcome(node, pg, ns, "pg-unreachable")
    assert_like_baseline(node, ns, "pg-unreachable", got, baseline)


def test_store_disk_full_waits_and_loses_nothing(
    pg: OutsidePostgres, baseline: Outcome, evalkube_on_node: RealNode, node_namespace: str
) -> None:
    """The store's disk fills while every unit grades: each post is refused with a 503 naming
    the full disk, runners wait, samples already recorded (the fault-free run's) stay
    readable; once space returns within the window the run ends exactly as without it."""
    node, ns = evalkube_on_node, node_namespace
    start_run(node, ns, "disk-full")
    runners_started(node, ns, "disk-full", ROWS // SHARD)
    pg.fill_disk()
    try:
        time.sleep(OUTAGE_SECONDS)
        logs = operator_logs(node)
        store = ResultStore.open(pg.host_url)
        try:
            meta = baseline.run["metadata"]
            kept = list(store.iter_samples(names.run_id(meta["namespace"], "calm", meta["uid"])))
        finally:
            store.close()
    finally:
        pg.free_disk()
    assert len(kept) == baseline.stored  # nothing already recorded was lost
    got = outcome(node, pg, ns, "disk-full")
    assert got.samples == baseline.samples, "samples lost or changed behind the full disk"
    assert "No space left on device" in logs, logs[-3000:]  # refused, and the refusal named
    assert failed_pods(node, ns) == 0, "a runner gave up on a full disk freed within its window"
    assert_like_baseline(node, ns, "disk-full", got, baseline)


def _operator_netns(node: RealNode, pod: dict[str, Any]) -> str:
    """The network namespace of an operator pod (runc: the kernel's stack, so iptables in it
    sees every packet of the ingest port), found through its pod's cgroup."""
    uid = pod["metadata"]["uid"]
    marks = (f"pod{uid}", f"pod{uid.replace('-', '_')}")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cgroups = (entry / "cgroup").read_text()
            if any(m in cgroups for m in marks):  # the pause process shares the pod's netns
                return f"/proc/{entry.name}/ns/net"
    raise AssertionError(f"no process of operator pod {pod['metadata']['name']} found")


def test_partition_longer_than_the_retry_window_is_retried_by_the_job(
    pg: OutsidePostgres, baseline: Outcome, evalkube_on_node: RealNode, node_namespace: str
) -> None:
    """The operator's answers on the ingest port are dropped (its pods get every request, the
    runners no reply: a post may be stored and never acknowledged) until a runner gives up,
    which must happen within its window and with a reason naming it; the Job's next Pod then
    finds what was stored, and the run ends exactly as without the partition."""
    node, ns = evalkube_on_node, node_namespace
    (operator,) = operator_pods(node)
    netns = _operator_netns(node, operator)
    rule = ["OUTPUT", "-o", "eth0", "-p", "tcp", "--sport", "8080", "-j", "DROP"]
    start_run(node, ns, "partition")
    runners_started(node, ns, "partition", ROWS // SHARD)
    time.sleep(GRADE_SECONDS * SHARD / 2)  # past the runners' start-up look-ups
    subprocess.run(["nsenter", f"--net={netns}", "iptables", "-w", "-I", *rule], check=True)
    try:
        # a runner gives up after its window (and one attempt bounded by it) past its post
        node.wait_for(
            lambda: failed_pods(node, ns) > 0,
            timeout=GRADE_SECONDS * SHARD + 3 * RETRY_SECONDS + 30,
            what="a runner giving up behind the partition",
            interval=1,
        )
    finally:
        subprocess.run(["nsenter", f"--net={netns}", "iptables", "-w", "-D", *rule], check=False)
    # the partition outlasted the window: a runner said so, naming it, as it gave up
    logs = "".join(
        node.kubectl("logs", "-n", ns, p["metadata"]["name"], "-c", "runner", check=False).stdout
        for p in node.kubectl_json("get", "pods", "-n", ns)["items"]
        if p["status"].get("phase") == "Failed"
    )
    assert f"retry window is {RETRY_SECONDS} s" in " ".join(logs.split()), logs[-3000:]
    got = outcome(node, pg, ns, "partition")
    assert_like_baseline(node, ns, "partition", got, baseline)


def _leader(node: RealNode) -> dict[str, Any]:
    """The operator pod kopf's peering made active: the live peer of highest priority."""
    peering = node.kubectl_json("get", "clusterkopfpeering", "evalkube")
    peers = peering.get("status") or {}
    pods = operator_pods(node)
    ranked = sorted(peers.items(), key=lambda kv: -int(kv[1].get("priority", 0)))
    for identity, _info in ranked:
        for pod in pods:
            if pod["metadata"]["name"] in identity:
                return pod
    raise AssertionError(f"no live operator pod leads the peering: {peers}")


def test_two_replicas_survive_the_leaders_pod_deleted_mid_run(
    pg: OutsidePostgres, baseline: Outcome, evalkube_on_node: RealNode, node_namespace: str
) -> None:
    """Two operator replicas on the PostgreSQL store with kopf peering: one handles the runs,
    both take posts. The leader's pod is deleted while every unit grades; the other takes
    over, and the run ends exactly as with one replica and no fault, no Job made twice."""
    node, ns = evalkube_on_node, node_namespace
    helm_upgrade(node, "--set", "replicas=2")
    try:
        node.wait_for(
            lambda: (
                len(operator_pods(node)) == 2
                and len(
                    node.kubectl_json("get", "clusterkopfpeering", "evalkube").get("status") or {}
                )
                >= 2
            ),
            timeout=120,
            what="two replicas in the peering",
        )
        start_run(node, ns, "leader")
        runners_started(node, ns, "leader", ROWS // SHARD)
        leader = _leader(node)
        node.kubectl("delete", "pod", "-n", OPERATOR_NS, leader["metadata"]["name"], "--wait=false")
        got = outcome(node, pg, ns, "leader")
        assert_like_baseline(node, ns, "leader", got, baseline)
    finally:
        helm_upgrade(node, "--set", "replicas=1")
