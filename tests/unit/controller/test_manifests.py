"""The pure manifest builders: the work-unit Job's trust layout and the run's NetworkPolicy."""

from __future__ import annotations

import re
from typing import Any

import pytest

from evalkube import limits
from evalkube.controller import manifests, names
from evalkube.controller.settings import OperatorSettings
from evalkube.engine.plan import Unit, plan_units
from evalkube.models import EvalRunSpec, EvalSuiteSpec, validate_spec
from evalkube.models.snapshot import RunSnapshot, SnapshotRun, SnapshotSuite
from evalkube.reporting.console import EXIT_CONFIG

NAMESPACE = "team-a"
RUN_NAME = "qa-nightly"
UID = "0f1e2d3c-4b5a-6978-8695-a4b3c2d1e0f9"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def owner(name: str = RUN_NAME) -> dict[str, Any]:
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": UID, "generation": 1},
    }


def run_spec(**extra: Any) -> EvalRunSpec:
    wire: dict[str, Any] = {
        "suiteRef": {"name": "qa"},
        "models": ["openai:gpt-4.1-mini"],
        "providers": {
            "openai": {
                "baseURL": "https://api.openai.com/v1",
                "credentialsSecretRef": {"name": "openai", "key": "api-key"},
            },
            "local-vllm": {
                "baseURL": "http://vllm.models.svc:8000/v1",
                "credentialsSecretRef": {"name": "vllm", "key": "token"},
            },
        },
        **extra,
    }
    return validate_spec(EvalRunSpec, wire, prefix="spec")


SHARD = Unit("qa.openai-gpt-4.1-mini.00001", "qa", "openai:gpt-4.1-mini", "shard", 1, 100, 150)
AGGREGATE = Unit("qa.openai-gpt-4.1-mini.batch", "qa", "openai:gpt-4.1-mini", "aggregate")


def job(
    unit: Unit = SHARD,
    settings: OperatorSettings | None = None,
    spec: EvalRunSpec | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    return manifests.unit_job(
        owner(),
        unit,
        spec=spec or run_spec(),
        settings=settings or OperatorSettings(),
        dataset_config_maps=kwargs.pop("dataset_config_maps", [("qa-data", "rows.jsonl")]),
        timeout_seconds=kwargs.pop("timeout_seconds", 30),
        **kwargs,
    )


def pod_spec(j: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = j["spec"]["template"]["spec"]
    return spec


def container(j: dict[str, Any], name: str) -> dict[str, Any]:
    spec = pod_spec(j)
    for c in spec.get("initContainers", []) + spec["containers"]:
        if c["name"] == name:
            return dict(c)
    raise AssertionError(f"no container {name}")


def secret_volumes(j: dict[str, Any]) -> set[str]:
    return {v["name"] for v in pod_spec(j)["volumes"] if "secret" in v}


# -- the Pod: containers and trust ------------------------------------------------------------
def test_three_containers_with_proxy_and_grader_as_native_sidecars() -> None:
    """The runner is the pod's only main container: when it exits the kubelet stops both
    sidecars and the pod (and its Job) completes; a grader serving forever as a regular
    container kept every finished pod running (found on a real node)."""
    spec = pod_spec(job())
    assert [c["name"] for c in spec["initContainers"]] == ["proxy", "grader"]
    assert all(c["restartPolicy"] == "Always" for c in spec["initContainers"])
    assert [c["name"] for c in spec["containers"]] == ["runner"]
    assert spec["restartPolicy"] == "Never"
    for c in spec["containers"]:
        assert "restartPolicy" not in c


def test_runtime_class_defaults_to_gvisor_and_is_configurable() -> None:
    assert pod_spec(job())["runtimeClassName"] == "gvisor"
    assert pod_spec(job(settings=OperatorSettings(runtime_class="kata")))["runtimeClassName"] == (
        "kata"
    )
    assert "runtimeClassName" not in pod_spec(job(settings=OperatorSettings(runtime_class="")))
    assert "runtimeClassName" not in pod_spec(job(settings=OperatorSettings(runtime_class=None)))


def test_provider_secrets_are_mounted_only_in_the_proxy() -> None:
    j = job()
    provider_volumes = secret_volumes(j)
    assert provider_volumes == {"provider-openai", "provider-local-vllm"}
    by_volume = {v["name"]: v for v in pod_spec(j)["volumes"]}
    assert by_volume["provider-openai"]["secret"] == {
        "secretName": "openai",
        "items": [{"key": "api-key", "path": "key"}],
    }
    proxy = container(j, "proxy")
    assert {m["name"] for m in proxy["volumeMounts"]} >= provider_volumes
    assert all(m["readOnly"] for m in proxy["volumeMounts"] if m["name"] in provider_volumes)
    assert {e["name"]: e["value"] for e in proxy["env"] if "value" in e} == {
        "EVALKUBE_PROVIDER_OPENAI_KEY_FILE": f"{manifests.PROVIDER_KEYS_DIR}/openai/key",
        "EVALKUBE_PROVIDER_LOCAL_VLLM_KEY_FILE": f"{manifests.PROVIDER_KEYS_DIR}/local-vllm/key",
    }
    for name in ("runner", "grader"):
        c = container(j, name)
        assert not {m["name"] for m in c["volumeMounts"]} & provider_volumes, name
        assert not [e for e in c.get("env", []) if "PROVIDER" in e["name"]], name
        assert "envFrom" not in c, name


def test_a_provider_without_a_secret_mounts_nothing() -> None:
    spec = run_spec(
        models=["local:m"], providers={"local": {"baseURL": "http://127.0.0.1:9000/v1"}}
    )
    j = job(spec=spec)
    assert secret_volumes(j) == set()
    assert [e["name"] for e in container(j, "proxy")["env"]] == ["GOMEMLIMIT"]


@pytest.mark.parametrize("engine", ["auto", "native", "python"])
def test_proxy_sidecar_engine_and_memory_limit(engine: str) -> None:
    proxy = container(job(settings=OperatorSettings(proxy_engine=engine)), "proxy")
    command = proxy["command"]
    assert command[:2] == ["evalkube", "proxy"]
    assert command[command.index("--engine") + 1] == engine
    limit = {e["name"]: e for e in proxy["env"]}["GOMEMLIMIT"]
    assert limit["valueFrom"] == {
        "resourceFieldRef": {"containerName": "proxy", "resource": "limits.memory"}
    }


def test_the_proxy_serves_nothing_until_the_runner_configures_the_unit() -> None:
    """The sidecar starts with a zero budget for this unit: graders get nothing until the
    runner sets the unit's budget and opens execution tokens (``engine/driver.py``)."""
    command = container(job(), "proxy")["command"]
    flags = dict(zip(command[2::2], command[3::2], strict=False))
    assert flags["--unit-id"] == SHARD.unit_id
    assert flags["--max-calls"] == "0"
    assert flags["--planned-executions"] == "0"


def test_a_grader_without_model_access_does_not_mount_the_bridge() -> None:
    def mounts(model_access: bool) -> set[str]:
        grader = container(job(model_access=model_access), "grader")
        return {m["name"] for m in grader["volumeMounts"]}

    assert "bridge" in mounts(True)
    assert mounts(False) == {"tmp", "worker"}
    bridge = next(m for m in container(job(), "grader")["volumeMounts"] if m["name"] == "bridge")
    assert bridge["readOnly"] is True


def test_only_a_task_with_model_built_ins_gives_the_runner_the_bridge() -> None:
    """score_model/label_model/cosine calls are the trusted runner's: it mounts the socket
    (read-only) for them, while the sandboxed grader mounts it only for a Python grader with
    model access, so a hostile grader beside a score_model criterion still cannot reach it."""
    from evalkube.engine.driver import grader_calls_models, judges_call_models
    from evalkube.models import TaskSpec

    judge = {"type": "score_model", "name": "q", "input": [{"role": "user", "content": "x"}]}
    python = {"type": "python", "name": "p", "source": "def grade(sample, item): return 1"}
    gated = {**python, "name": "g", "modelAccess": "gateway"}

    def task(*graders: dict[str, Any]) -> TaskSpec:
        wire = {"id": "t", "dataset": {"rows": [{"a": 1}]}, "graders": list(graders)}
        return validate_spec(TaskSpec, wire, prefix="task")

    def mounts(t: TaskSpec) -> dict[str, set[str]]:
        j = job(model_access=grader_calls_models(t), runner_model_access=judges_call_models(t))
        return {
            c: {m["name"] for m in container(j, c)["volumeMounts"]} for c in ("runner", "grader")
        }

    with_judge = mounts(task(judge, python))
    assert "bridge" in with_judge["runner"]
    assert "bridge" not in with_judge["grader"]
    assert "bridge" not in mounts(task(python))["runner"]
    both = mounts(task(judge, gated))
    assert "bridge" in both["runner"]
    assert "bridge" in both["grader"]
    only_ctx = mounts(task(gated))
    assert "bridge" not in only_ctx["runner"]
    assert "bridge" in only_ctx["grader"]
    runner = container(job(runner_model_access=True), "runner")
    bridge = next(m for m in runner["volumeMounts"] if m["name"] == "bridge")
    assert bridge == {"name": "bridge", "mountPath": manifests.BRIDGE_DIR, "readOnly": True}


def test_the_runner_holds_the_ingest_token_and_no_provider_secret() -> None:
    runner = container(job(), "runner")
    env = {e["name"]: e for e in runner["env"]}
    assert env["EVALKUBE_INGEST_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": f"{RUN_NAME}-ingest", "key": manifests.TOKEN_KEY}
    }
    assert env["EVALKUBE_RUN"]["value"] == f"{NAMESPACE}/{RUN_NAME}"
    secret_refs = [e for e in runner["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert [e["valueFrom"]["secretKeyRef"]["name"] for e in secret_refs] == [
        names.token_secret_name(RUN_NAME)
    ]
    args = runner["command"]
    assert args[:2] == ["evalkube", "unit"]
    assert args[args.index("--unit") + 1] == SHARD.unit_id
    assert args[args.index("--ingest-url") + 1] == OperatorSettings().ingest_url
    assert args[args.index("--worker") + 1] == f"unix:{manifests.WORKER_SOCKET}"


def test_the_runner_gets_the_operators_ingest_retry_window() -> None:
    """A runner gives up on the ingest API after the window the operator is set to (its Pod
    then fails and the Job retries it): the default, and a shorter one."""
    for window, flag in ((None, "300"), (30.0, "30"), (12.5, "12.5")):
        settings = (
            OperatorSettings() if window is None else OperatorSettings(ingest_retry_seconds=window)
        )
        args = container(job(settings=settings), "runner")["command"]
        assert args[args.index("--ingest-retry-seconds") + 1] == flag


def test_the_grader_has_no_env_no_secrets_no_token() -> None:
    j = job()
    grader = container(j, "grader")
    assert grader["env"] == []
    assert "envFrom" not in grader
    mounted = {m["name"] for m in grader["volumeMounts"]}
    assert mounted == {"tmp", "worker", "bridge"}
    volumes = {v["name"]: v for v in pod_spec(j)["volumes"]}
    for name in mounted:
        assert "emptyDir" in volumes[name], f"the grader mounts only emptyDirs, not {name}"
    bridge = next(m for m in grader["volumeMounts"] if m["name"] == "bridge")
    assert bridge["readOnly"] is True
    assert grader["image"] == OperatorSettings().sandbox_image
    assert grader["command"][:3] == ["python3", "-I", "-S"]


def test_no_service_account_token_and_no_service_links() -> None:
    spec = pod_spec(job())
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert "serviceAccountName" not in spec


@pytest.mark.parametrize("name", ["proxy", "runner", "grader"])
def test_every_container_is_restricted(name: str) -> None:
    ctx = container(job(), name)["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["runAsNonRoot"] is True
    uid = manifests.GRADER_UID if name == "grader" else manifests.RUNNER_UID
    assert ctx["runAsUser"] == uid != 0
    assert ctx["runAsGroup"] == manifests.NOBODY
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert "add" not in ctx["capabilities"]
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in ctx


def test_pod_security_context_is_restricted() -> None:
    ctx = pod_spec(job())["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert ctx["runAsUser"] == manifests.NOBODY
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    spec = pod_spec(job())
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(key)
    assert not [v for v in spec["volumes"] if "hostPath" in v]


def test_grader_tmp_is_a_size_capped_memory_emptydir() -> None:
    j = job(settings=OperatorSettings(tmp_size="64Mi"))
    volumes = {v["name"]: v for v in pod_spec(j)["volumes"]}
    assert volumes["tmp"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Mi"}
    grader = container(j, "grader")
    assert {"name": "tmp", "mountPath": "/tmp"} in grader["volumeMounts"]
    for volume in volumes.values():
        if "emptyDir" in volume:
            assert volume["emptyDir"].get("sizeLimit"), volume["name"]


def test_resources_limits_on_every_container() -> None:
    """Memory, and ephemeral storage (what a container may write to the node's disk: its
    logs); the grader's memory limit adds the sandbox's overhead to what its supervisor
    enforces inside."""
    settings = OperatorSettings(grader_memory="2Gi", grader_cpu="500m", runner_memory="300Mi")
    j = job(settings=settings)
    grader = container(j, "grader")
    assert grader["resources"]["limits"] == {
        "memory": str(2 * 2**30 + limits.SANDBOX_MEMORY_OVERHEAD_BYTES),
        "cpu": "500m",
        "ephemeral-storage": manifests.EPHEMERAL_STORAGE["grader"],
    }
    flags = grader["command"][grader["command"].index("--connect") :]
    assert dict(zip(flags[::2], flags[1::2], strict=True)) == {
        "--connect": manifests.WORKER_SOCKET,
        "--memory-bytes": str(2 * 2**30),
        "--memory-from": "cgroup",
        "--processes": str(limits.SANDBOX_PIDS),
        "--log-bytes": str(settings.grader_log_bytes),
    }
    assert container(j, "runner")["resources"]["limits"] == {
        "memory": "300Mi",
        "ephemeral-storage": manifests.EPHEMERAL_STORAGE["runner"],
    }
    assert container(j, "proxy")["resources"]["limits"]["memory"] == settings.proxy_memory
    for name in ("proxy", "runner", "grader"):
        assert container(j, name)["resources"]["requests"]["ephemeral-storage"], name


def test_the_grader_mounts_the_runners_socket_folder_read_only() -> None:
    grader = {m["name"]: m for m in container(job(), "grader")["volumeMounts"]}
    runner = {m["name"]: m for m in container(job(), "runner")["volumeMounts"]}
    assert grader["worker"]["readOnly"] is True
    assert not runner["worker"].get("readOnly")


@pytest.mark.parametrize(
    ("ipv6", "sysctl", "runner_flag"),
    [("disable", True, "refuse"), ("refuse", False, "refuse"), ("allow", False, "allow")],
)
def test_ipv6_is_disabled_by_sysctl_and_refused_by_the_runner(
    ipv6: str, sysctl: bool, runner_flag: str
) -> None:
    j = job(settings=OperatorSettings(ipv6=ipv6))  # type: ignore[arg-type]
    sysctls = pod_spec(j)["securityContext"].get("sysctls", [])
    assert (sysctls == [{"name": "net.ipv6.conf.all.disable_ipv6", "value": "1"}]) is sysctl
    args = container(j, "runner")["command"]
    assert args[args.index("--ipv6") + 1] == runner_flag


@pytest.mark.parametrize(
    ("quantity", "size"),
    [
        ("1Gi", 2**30),
        ("512Mi", 512 * 2**20),
        ("1000000", 10**6),
        ("1.5Gi", 3 * 2**29),
        ("2G", 2 * 10**9),
    ],
)
def test_memory_quantities(quantity: str, size: int) -> None:
    assert manifests.quantity_bytes(quantity) == size


def test_a_bad_memory_quantity_is_named() -> None:
    with pytest.raises(ValueError, match="'lots' is not a memory quantity"):
        manifests.quantity_bytes("lots")


def test_datasets_and_snapshot_are_mounted_read_only_in_the_runner() -> None:
    j = job(dataset_config_maps=[("qa-data", "rows.jsonl")])
    runner = container(j, "runner")
    mounts = {m["name"]: m for m in runner["volumeMounts"]}
    assert mounts["snapshot"] == {
        "name": "snapshot",
        "mountPath": manifests.SNAPSHOT_DIR,
        "readOnly": True,
    }
    assert mounts["dataset-0"]["mountPath"] == f"{manifests.DATASETS_DIR}/qa-data"
    assert mounts["dataset-0"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod_spec(j)["volumes"]}
    assert volumes["snapshot"]["configMap"]["name"] == f"{RUN_NAME}-snapshot"
    assert volumes["dataset-0"]["configMap"]["name"] == "qa-data"


# -- the Job ----------------------------------------------------------------------------------
def test_job_limits_backoff_ttl_and_deadline() -> None:
    settings = OperatorSettings(job_backoff_limit=1, job_ttl_seconds=600)
    j = job(settings=settings, timeout_seconds=30, preprocess_timeout=5)
    assert j["spec"]["backoffLimit"] == 1
    assert j["spec"]["ttlSecondsAfterFinished"] == 600
    # 50 rows x (30 s grading + 5 s preprocessing) + the slack
    assert j["spec"]["activeDeadlineSeconds"] == 50 * 35 + settings.active_deadline_slack_seconds


def test_deadline_of_an_aggregate_unit_and_the_cap() -> None:
    settings = OperatorSettings(active_deadline_slack_seconds=60)
    assert job(AGGREGATE, settings=settings, timeout_seconds=120)["spec"][
        "activeDeadlineSeconds"
    ] == (120 + 60)
    huge = Unit("t.m.00000", "t", "m", "shard", 0, 0, 1_000_000)
    assert job(huge, timeout_seconds=600)["spec"]["activeDeadlineSeconds"] == 86_400
    # the cap is a setting, and the deadline says what it was made of
    capped = OperatorSettings(unit_deadline_max_seconds=3_600)
    assert job(huge, settings=capped, timeout_seconds=1)["spec"]["activeDeadlineSeconds"] == 3_600
    deadline = manifests.unit_deadline(huge, 120, 0, OperatorSettings())
    assert (deadline.seconds, deadline.worst, deadline.capped) == (86_400, 120_000_300, True)
    assert "a spec.shardSize of at most 717" in deadline.explain(OperatorSettings())
    ten_thousand = Unit("t.m.00000", "t", "m", "shard", 0, 0, 10_000)
    assert manifests.unit_deadline(ten_thousand, 120, 0, OperatorSettings()).capped


def test_a_runner_that_reports_its_unit_failed_is_not_retried() -> None:
    """The runner exits with EXIT_CONFIG when its unit cannot run at all (after reporting why):
    the Job's podFailurePolicy fails the Job at once instead of retrying it."""
    [rule, _] = job()["spec"]["podFailurePolicy"]["rules"]
    assert rule == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "runner", "operator": "In", "values": [EXIT_CONFIG]},
    }
    assert manifests.RUNNER_EXIT_UNIT_FAILED == EXIT_CONFIG


def test_an_evicted_pod_is_retried_without_counting_against_the_backoff_limit() -> None:
    """Eviction, preemption and a node drain mark the Pod ``DisruptionTarget``: the Job
    retries its unit without spending ``backoffLimit`` (the real eviction:
    tests/realnode/test_faults_node.py)."""
    [_, rule] = job()["spec"]["podFailurePolicy"]["rules"]
    assert rule == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}


def test_job_metadata_labels_annotation_and_owner() -> None:
    j = job()
    meta = j["metadata"]
    assert meta["namespace"] == NAMESPACE
    assert meta["annotations"] == {
        names.ANNOTATION_UNIT_ID: SHARD.unit_id,
        names.ANNOTATION_RUN: RUN_NAME,
    }
    assert meta["labels"][names.LABEL_RUN] == RUN_NAME
    assert meta["labels"][names.LABEL_COMPONENT] == "work-unit"
    assert meta["labels"][names.LABEL_MANAGED_BY] == "evalkube"
    assert DNS_LABEL.match(meta["labels"][names.LABEL_UNIT])
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "evalkube.io/v1alpha1",
            "kind": "EvalRun",
            "name": RUN_NAME,
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    template = j["spec"]["template"]["metadata"]
    assert template["labels"][names.LABEL_RUN] == RUN_NAME
    assert template["labels"][names.LABEL_COMPONENT] == "work-unit"
    assert set(template["annotations"]) == set(manifests.gvisor_mount_hints(pod_spec(j)))
    annotated = job(settings=OperatorSettings(pod_annotations={"a.b/c": "d"}))
    assert annotated["spec"]["template"]["metadata"]["annotations"]["a.b/c"] == "d"


def test_socket_folders_are_one_tmpfs_per_pod_under_gvisor() -> None:
    """runsc shows each container its own view of an emptyDir unless the pod says otherwise:
    without these hints the runner never sees the grader's worker socket (nor the proxy's)."""
    annotations = job()["spec"]["template"]["metadata"]["annotations"]
    hinted = {k for k in annotations if k.startswith("dev.gvisor.spec.mount.")}
    expected = {}
    for volume in ("bridge", "control", "worker"):
        expected[f"dev.gvisor.spec.mount.{volume}.share"] = "pod"
        expected[f"dev.gvisor.spec.mount.{volume}.type"] = "tmpfs"
    assert {k: annotations[k] for k in hinted} == expected
    # every memory emptyDir mounted by more than one container is hinted, and no other volume
    spec = pod_spec(job())
    mounts: dict[str, int] = {}
    for c in spec["initContainers"] + spec["containers"]:
        for m in c["volumeMounts"]:
            mounts[m["name"]] = mounts.get(m["name"], 0) + 1
    shared = {
        v["name"]
        for v in spec["volumes"]
        if v.get("emptyDir", {}).get("medium") == "Memory" and mounts.get(v["name"], 0) > 1
    }
    assert {k.split(".")[4] for k in hinted} == shared


def test_user_pod_annotations_are_kept_beside_the_gvisor_hints() -> None:
    settings = OperatorSettings(
        pod_annotations={"a.b/c": "d", "dev.gvisor.spec.mount.worker.type": "bind"}
    )
    annotations = job(settings=settings)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["a.b/c"] == "d"
    assert annotations["dev.gvisor.spec.mount.worker.share"] == "pod"
    # an explicit setting wins (an escape hatch for a runtime that needs other hints)
    assert annotations["dev.gvisor.spec.mount.worker.type"] == "bind"


def test_gvisor_hints_skip_private_and_disk_volumes() -> None:
    spec = {
        "containers": [
            {"name": "a", "volumeMounts": [{"name": "mem"}, {"name": "disk"}, {"name": "own"}]},
            {"name": "b", "volumeMounts": [{"name": "mem"}, {"name": "disk"}]},
        ],
        "volumes": [
            {"name": "mem", "emptyDir": {"medium": "Memory"}},
            {"name": "disk", "emptyDir": {}},
            {"name": "own", "emptyDir": {"medium": "Memory"}},
        ],
    }
    assert manifests.gvisor_mount_hints(spec) == {
        "dev.gvisor.spec.mount.mem.share": "pod",
        "dev.gvisor.spec.mount.mem.type": "tmpfs",
    }


def test_node_selector_is_passed_through() -> None:
    assert "nodeSelector" not in pod_spec(job())
    j = job(settings=OperatorSettings(node_selector={"runtime": "gvisor"}))
    assert pod_spec(j)["nodeSelector"] == {"runtime": "gvisor"}


def test_job_names_are_deterministic_distinct_and_dns_labels() -> None:
    units = plan_units([("qa", 1000, True), ("sentiment", 30, True)], ["a:b", "c:d"], 10)
    long_name = "r" * 60 + "-" + "x" * 150
    for run_name in (RUN_NAME, long_name, "a"):
        job_names = [names.job_name(run_name, u.unit_id) for u in units]
        assert len(set(job_names)) == len(units)
        for name in job_names:
            assert len(name) <= 63
            assert DNS_LABEL.match(name), name
        assert job_names == [names.job_name(run_name, u.unit_id) for u in units]
    assert names.job_name(long_name, "u") != names.job_name(long_name[:-1] + "y", "u")
    built = manifests.unit_job(
        owner(long_name),
        SHARD,
        spec=run_spec(),
        settings=OperatorSettings(),
        dataset_config_maps=[],
        timeout_seconds=1,
    )
    assert built["metadata"]["name"] == names.job_name(long_name, SHARD.unit_id)
    assert len(built["metadata"]["name"]) <= 63


def test_builders_are_pure() -> None:
    assert job() == job()


# -- the run's other objects ------------------------------------------------------------------
def test_owned_objects_carry_the_owner_reference_and_deterministic_names() -> None:
    body = owner()
    doc = RunSnapshot(
        run=SnapshotRun(namespace=NAMESPACE, name=RUN_NAME, uid=UID, run_id="r"),
        suite=SnapshotSuite(
            name="qa",
            spec=EvalSuiteSpec.model_validate(
                {"tasks": [{"id": "t", "dataset": {"rows": [{"a": "1"}]}, "prompt": "{{ item.a }}",
                            "grader": {"type": "python", "source": "def grade(s, i): return 1"}}]}
            ),
            version="sha256:x",
        ),
        run_spec=run_spec(),
    )  # fmt: skip
    snapshot = manifests.snapshot_config_map(body, doc)
    assert RunSnapshot.model_validate_json(snapshot["data"]["snapshot.json"]) == doc
    secret = manifests.token_secret(body, "t0ken")
    policy = manifests.network_policy(body, run_spec(), OperatorSettings())
    assert snapshot["metadata"]["name"] == f"{RUN_NAME}-snapshot"
    assert snapshot["immutable"] is True
    assert secret["metadata"]["name"] == f"{RUN_NAME}-ingest"
    assert secret["stringData"] == {manifests.TOKEN_KEY: "t0ken"}
    assert policy["metadata"]["name"] == f"{RUN_NAME}-egress"
    for obj in (snapshot, secret, policy):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == UID
        assert obj["metadata"]["labels"][names.LABEL_RUN] == RUN_NAME


def test_direct_egress_policy_no_ingress_and_only_dns_ingest_and_provider_ports() -> None:
    settings = OperatorSettings(
        operator_namespace="evalkube-system",
        ingest_port=8443,
        operator_pod_labels={"app": "ek"},
        egress_via_gateway=False,
    )
    spec = run_spec(
        models=["openai:gpt-4.1-mini", "vllm:llama"],
        providers={
            "openai": {"baseURL": "https://api.openai.com/v1"},
            "vllm": {"baseURL": "http://vllm.example:8000/v1"},
            "other": {"baseURL": "https://other.example/v1"},
            "plain": {"baseURL": "http://plain.example/v1"},
        },
    )
    policy = manifests.network_policy(owner(), spec, settings)["spec"]
    assert policy["podSelector"] == {
        "matchLabels": {names.LABEL_RUN: RUN_NAME, names.LABEL_COMPONENT: "work-unit"}
    }
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    assert policy["ingress"] == []
    dns, ingest, providers = policy["egress"]
    assert sorted((p["protocol"], p["port"]) for p in dns["ports"]) == [("TCP", 53), ("UDP", 53)]
    assert dns["to"] == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
    ]
    assert ingest["ports"] == [{"protocol": "TCP", "port": 8443}]
    assert ingest["to"] == [
        {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": "evalkube-system"}
            },
            "podSelector": {"matchLabels": {"app": "ek"}},
        }
    ]
    assert providers["ports"] == [{"protocol": "TCP", "port": p} for p in (80, 443, 8000)]
    (block,) = providers["to"]
    assert block["ipBlock"]["cidr"] == "0.0.0.0/0"
    assert set(block["ipBlock"]["except"]) >= {"10.0.0.0/8", "169.254.0.0/16"}


def test_direct_egress_policy_without_providers_allows_only_dns_and_ingest() -> None:
    spec = validate_spec(
        EvalRunSpec, {"suiteRef": {"name": "qa"}, "models": ["precomputed"]}, prefix="spec"
    )
    settings = OperatorSettings(egress_via_gateway=False)
    egress = manifests.network_policy(owner(), spec, settings)["spec"]["egress"]
    assert len(egress) == 2
    ports = sorted(p["port"] for rule in egress for p in rule["ports"])
    assert ports == [53, 53, OperatorSettings().ingest_port]
    assert not [rule for rule in egress for to in rule["to"] if "ipBlock" in to]


# -- egress through the gateway ---------------------------------------------------------------
GATEWAY = OperatorSettings(
    egress_via_gateway=True,
    operator_namespace="evalkube-system",
    operator_pod_labels={"app": "ek"},
    ingest_port=8443,
    egress_gateway_url="http://10.96.0.40:3128",
    egress_gateway_pod_labels={"app": "ek-egress"},
)


def test_gateway_policy_allows_only_the_gateway_and_ingest_no_dns_no_ip_block() -> None:
    policy = manifests.network_policy(owner(), run_spec(), GATEWAY)["spec"]
    assert policy["ingress"] == []
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    system = {"matchLabels": {"kubernetes.io/metadata.name": "evalkube-system"}}
    assert policy["egress"] == [
        {
            "to": [
                {"namespaceSelector": system, "podSelector": {"matchLabels": {"app": "ek-egress"}}}
            ],
            "ports": [{"protocol": "TCP", "port": 3128}],
        },
        {
            "to": [{"namespaceSelector": system, "podSelector": {"matchLabels": {"app": "ek"}}}],
            "ports": [{"protocol": "TCP", "port": 8443}],
        },
    ]


def test_egress_grant_secret_is_owned_and_deterministic() -> None:
    secret = manifests.egress_grant_secret(owner(), "v1.payload.mac")
    assert secret["kind"] == "Secret"
    assert secret["metadata"]["name"] == f"{RUN_NAME}-egress-grant"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == UID
    assert secret["metadata"]["labels"][names.LABEL_RUN] == RUN_NAME
    assert secret["metadata"]["labels"][names.LABEL_COMPONENT] == "egress-grant"
    assert secret["stringData"] == {manifests.EGRESS_GRANT_KEY: "v1.payload.mac"}


def test_only_the_proxy_mounts_the_grant_and_goes_through_the_gateway() -> None:
    j = job(settings=GATEWAY)
    proxy = container(j, "proxy")
    command = proxy["command"]
    assert command[command.index("--egress-proxy") + 1] == "http://10.96.0.40:3128"
    grant_file = command[command.index("--egress-grant-file") + 1]
    (mount,) = [m for m in proxy["volumeMounts"] if m["name"] == "egress-grant"]
    assert mount["readOnly"] is True
    assert grant_file == f"{mount['mountPath']}/{manifests.EGRESS_GRANT_KEY}"
    (volume,) = [v for v in pod_spec(j)["volumes"] if v["name"] == "egress-grant"]
    assert volume["secret"]["secretName"] == f"{RUN_NAME}-egress-grant"
    for name in ("runner", "grader"):
        other = container(j, name)
        assert "egress-grant" not in {m["name"] for m in other["volumeMounts"]}
        assert "egress" not in " ".join(other["command"])
    assert "--egress-proxy" not in container(job(), "proxy")["command"]
    assert "egress-grant" not in {v["name"] for v in pod_spec(job())["volumes"]}


def test_the_runner_waits_for_the_policy_only_when_a_canary_is_set() -> None:
    canary = GATEWAY.model_copy(update={"policy_canary_url": "http://10.96.0.40:9090"})
    command = container(job(settings=canary), "runner")["command"]
    assert command[command.index("--policy-canary") + 1] == "http://10.96.0.40:9090"
    assert "--policy-canary" not in container(job(settings=GATEWAY), "runner")["command"]
    # without the gateway there is no policy to wait for that would keep the grader off the net
    direct = OperatorSettings(policy_canary_url="http://10.96.0.40:9090")
    assert "--policy-canary" not in container(job(settings=direct), "runner")["command"]


# -- grader.environment: the grader container's image and its sys.path ----------------------------
def test_a_task_environment_image_replaces_the_sandbox_image_for_its_grader() -> None:
    grader = container(job(grader_environment="registry.example/graders:2.0"), "grader")
    assert grader["image"] == "registry.example/graders:2.0"
    assert "sys.path.append('/opt/evalkube-env')" in grader["command"][4]


def test_default_keeps_the_sandbox_image_with_its_environment_and_stdlib_leaves_it_off() -> None:
    default = container(job(grader_environment="default"), "grader")
    assert default["image"] == OperatorSettings().sandbox_image
    bootstrap = default["command"][4]
    # after the worker package (first) and so after the standard library
    assert bootstrap.index("sys.path.insert(0") < bootstrap.index("sys.path.append(")
    stdlib = container(job(grader_environment="stdlib"), "grader")
    assert stdlib["image"] == OperatorSettings().sandbox_image
    assert "/opt/evalkube-env" not in stdlib["command"][4]


def test_a_queue_name_labels_the_job_for_kueue_and_creates_it_suspended() -> None:
    queued = job(spec=run_spec(queueName="team-a"))
    assert queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert queued["spec"]["suspend"] is True
    # the Pods are not Kueue's business: the label is on the Job only
    assert "kueue.x-k8s.io/queue-name" not in queued["spec"]["template"]["metadata"]["labels"]
    plain = job()
    assert "suspend" not in plain["spec"]
    assert "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]


@pytest.mark.parametrize("queue", ["Team_A", "-a", "a.", ""])
def test_a_bad_queue_name_names_the_field_and_the_rule(queue: str) -> None:
    from evalkube.models import SpecError

    with pytest.raises(SpecError) as info:
        run_spec(queueName=queue)
    [problem] = info.value.problems
    assert problem.startswith("spec.queueName: ")
    assert "is not a Kueue LocalQueue name: use lowercase letters" in problem


def test_a_run_name_longer_than_a_label_value_labels_within_63_and_is_found_again() -> None:
    """EvalRun names may have 253 characters (a scheduled run's name is its schedule's plus
    a time); label values 63. Jobs, Pods and the policy selecting them agree on one short
    label, and the Job index maps a Job back to the full name from its annotation."""
    from evalkube.controller.run_decisions import job_index_entry

    name = "nightly-" + "regression-suite-" * 12 + "29000000"
    body = {**owner(), "metadata": {**owner()["metadata"], "name": name}}
    built = manifests.unit_job(
        body, SHARD, spec=run_spec(), settings=OperatorSettings(), dataset_config_maps=[],
        timeout_seconds=30,
    )  # fmt: skip
    policy = manifests.network_policy(body, run_spec(), OperatorSettings())
    label = names.run_label(name)
    assert len(label) <= 63
    assert DNS_LABEL.match(label.replace(".", "-"))
    assert names.run_label("short") == "short"
    for labels in (
        built["metadata"]["labels"],
        built["spec"]["template"]["metadata"]["labels"],
        policy["metadata"]["labels"],
    ):
        assert all(len(v) <= 63 for v in labels.values()), labels
        assert labels[names.LABEL_RUN] == label
    assert policy["spec"]["podSelector"]["matchLabels"][names.LABEL_RUN] == label
    meta = built["metadata"]
    [(key, (unit, _))] = job_index_entry(
        NAMESPACE, meta["labels"], meta["annotations"], built
    ).items()
    assert key == (NAMESPACE, name)
    assert unit == SHARD.unit_id


def _selects(selector: str, labels: dict[str, str]) -> bool:
    """A label selector of ``key=value`` and bare ``key`` (exists) terms, as the API server
    reads it."""
    for term in selector.split(","):
        key, equals, value = term.partition("=")
        if key not in labels or (equals and labels[key] != value):
            return False
    return True


@pytest.mark.parametrize("unit", [SHARD, AGGREGATE], ids=["shard", "aggregate"])
def test_the_job_watchs_server_side_selector_takes_every_unit_job_and_no_other(unit: Unit) -> None:
    """The operator's Job watch sees only what ``names.UNIT_JOBS_SELECTOR`` selects: a unit
    Job it missed would leave its run waiting for an event that never comes."""
    labels = job(unit)["metadata"]["labels"]
    assert _selects(names.UNIT_JOBS_SELECTOR, labels)
    for dropped in (names.LABEL_RUN, names.LABEL_MANAGED_BY):
        assert not _selects(
            names.UNIT_JOBS_SELECTOR, {k: v for k, v in labels.items() if k != dropped}
        )
    assert not _selects(names.UNIT_JOBS_SELECTOR, {**labels, names.LABEL_MANAGED_BY: "helm"})
