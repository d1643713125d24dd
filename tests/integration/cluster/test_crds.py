"""The generated CRDs on a real API server: what it accepts, what it rejects and how it says so.

Applies ``crds/*.yaml`` (what ``evalkube crds`` writes) to the loopback control plane
(tests/cluster), then creates EvalSuites and EvalRuns in a fresh namespace per test and reads
the API server's own messages: field paths, ranges, the CEL rules' messages, pruning of unknown
fields, ``kubectl explain`` and the printer columns.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from tests.cluster.ctrlplane import ControlPlane, KubectlError

# startup of the session control plane (~10-20 s) may be charged to the first test
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[3]
CRD_DIR = ROOT / "crds"
API_VERSION = "evalkube.io/v1alpha1"


def install_crds(cp: ControlPlane) -> None:
    """Apply the generated CRDs (idempotent) and wait until both are Established."""
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
    for name in ("evalsuites.evalkube.io", "evalruns.evalkube.io", "evalschedules.evalkube.io"):
        cp.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")


@pytest.fixture(scope="module")
def crds_installed(control_plane: ControlPlane) -> ControlPlane:
    install_crds(control_plane)
    return control_plane


def suite(name: str = "qa", **task_fields: Any) -> dict[str, Any]:
    task: dict[str, Any] = {
        "id": "qa_exact_match",
        "dataset": {"rows": [{"question": "2+2?", "answer": "4", "meta": {"any": ["thing"]}}]},
        "prompt": "Answer briefly: {{ item.question }}",
        "target": "{{ item.answer }}",
        "extraction": {"type": "regex", "pattern": "(\\d+)"},
        "grader": {
            "type": "python",
            "contract": "sample",
            "source": "def grade(sample, item):\n    return 1.0\n",
        },
        "metrics": ["score"],
    }
    task.update(task_fields)
    return {
        "apiVersion": API_VERSION,
        "kind": "EvalSuite",
        "metadata": {"name": name},
        "spec": {"tasks": [task]},
    }


def run(name: str = "qa-nightly", **spec_fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "suiteRef": {"name": "qa"},
        "models": ["openai:gpt-4.1-mini"],
        "judgeModel": "openai:gpt-4.1-mini",
        "embeddingModel": "openai:text-embedding-3-small",
        "providers": {
            "openai": {
                "baseURL": "https://api.openai.com/v1",
                "credentialsSecretRef": {"name": "openai", "key": "api-key"},
            }
        },
    }
    spec.update(spec_fields)
    return {
        "apiVersion": API_VERSION,
        "kind": "EvalRun",
        "metadata": {"name": name},
        "spec": spec,
    }


def create(cp: ControlPlane, ns: str, obj: dict[str, Any], *args: str) -> dict[str, Any]:
    out = cp.kubectl("create", "-n", ns, "-o", "json", "-f", "-", *args, input=json.dumps(obj))
    created: dict[str, Any] = json.loads(out.stdout)
    return created


def rejected(cp: ControlPlane, ns: str, obj: dict[str, Any], *args: str) -> str:
    with pytest.raises(KubectlError) as info:
        create(cp, ns, obj, *args)
    return info.value.stderr


# -- accepted -------------------------------------------------------------------------------


def test_crds_are_established_with_names_and_categories(crds_installed: ControlPlane) -> None:
    cp = crds_installed
    resources = cp.kubectl("api-resources", "--api-group=evalkube.io", "-o", "wide").stdout
    assert "evalsuites" in resources
    assert "evs" in resources
    assert "evalruns" in resources
    assert "evr" in resources
    assert "evalkube" in resources  # category column


def test_valid_suite_and_run_are_accepted_with_defaults(
    crds_installed: ControlPlane, cluster_namespace: str
) -> None:
    cp, ns = crds_installed, cluster_namespace
    created = create(cp, ns, suite())
    task = created["spec"]["tasks"][0]
    # defaults from the models, applied by the API server
    assert task["grader"]["timeoutSeconds"] == 120
    assert task["grader"]["maxModelCalls"] == 64
    # no schema default: a `graders:` list without metricIds must not get "score" twice (the
    # model names each criterion's metric; tests/unit/controller/test_crds.py)
    assert "metricId" not in task["grader"]
    assert task["extraction"]["ignoreCase"] is False
    # free-form rows survive untouched
    assert task["dataset"]["rows"][0]["meta"] == {"any": ["thing"]}
    created_run = create(cp, ns, run())
    # no schema default: an unset shardSize is the operator's EVALKUBE_SHARD_SIZE, which it
    # writes into the run's snapshot (tests/unit/controller/test_run_limits.py)
    assert "shardSize" not in created_run["spec"]
    assert created_run["spec"]["providers"]["openai"]["timeoutSeconds"] == 60


def test_prompt_as_chat_messages_and_file_graders(
    crds_installed: ControlPlane, cluster_namespace: str
) -> None:
    obj = suite(
        prompt=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "{{ item.question }}"},
        ],
        choices=["A", "B"],
        preprocess={"type": "python", "contract": "batch", "file": "graders/prep.py"},
        grader={"type": "python", "file": "graders/grade.py", "timeoutSeconds": 600},
    )
    created = create(crds_installed, cluster_namespace, obj)
    assert created["spec"]["tasks"][0]["prompt"][1]["role"] == "user"
    assert created["spec"]["tasks"][0]["grader"]["file"] == "graders/grade.py"


def test_explicit_null_counts_as_absent(
    crds_installed: ControlPlane, cluster_namespace: str
) -> None:
    # as in the CLI (pydantic), `source: null` next to `file` is not "both"
    obj = suite(grader={"type": "python", "file": "graders/grade.py", "source": None})
    create(crds_installed, cluster_namespace, obj)


def test_kubectl_apply_drops_null_values_from_inline_rows(
    crds_installed: ControlPlane, cluster_namespace: str
) -> None:
    """A limitation docs/migrating-from-openai.md names: an item field that is null (an
    imported OpenAI item's `{"answer": null}`) is kept by the API server (`kubectl create`,
    server-side apply) but dropped by a client-side `kubectl apply`, whose patch reads null as
    "remove"; a ConfigMap dataset (`configMapRef`, JSONL text) keeps it whatever the client."""
    rows = [{"question": "q", "answer": None, "meta": {"n": None}}]
    created = create(crds_installed, cluster_namespace, suite("kept", dataset={"rows": rows}))
    assert created["spec"]["tasks"][0]["dataset"]["rows"] == rows
    for args in ((), ("--server-side",)):
        name = "ssa" if args else "applied"
        obj = {**suite(name, dataset={"rows": rows}), "metadata": {"name": name}}
        crds_installed.kubectl("apply", "-n", cluster_namespace, *args, "-f", "-",
                               input=json.dumps(obj))  # fmt: skip
        got = crds_installed.kubectl_json("get", "evalsuite", name, "-n", cluster_namespace)
        dropped = [{"question": "q", "meta": {}}]
        assert got["spec"]["tasks"][0]["dataset"]["rows"] == (rows if args else dropped), args


# -- rejected, with field-named messages ----------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, "greater than or equal to 1"), (601, "less than or equal to 600")],
)
def test_timeout_out_of_range(
    crds_installed: ControlPlane, cluster_namespace: str, value: int, expected: str
) -> None:
    obj = suite(grader={"type": "python", "source": "x", "timeoutSeconds": value})
    message = rejected(crds_installed, cluster_namespace, obj)
    assert "spec.tasks[0].grader.timeoutSeconds" in message
    assert expected in message


def test_max_model_calls_out_of_range(crds_installed: ControlPlane, cluster_namespace: str) -> None:
    obj = suite(grader={"type": "python", "source": "x", "maxModelCalls": 501})
    message = rejected(crds_installed, cluster_namespace, obj)
    assert "spec.tasks[0].grader.maxModelCalls" in message
    assert "less than or equal to 500" in message


@pytest.mark.parametrize("where", ["grader", "preprocess"])
def test_source_and_file_together(
    crds_installed: ControlPlane, cluster_namespace: str, where: str
) -> None:
    code = {"type": "python", "source": "def grade(s, i): return 1", "file": "cm/grade.py"}
    message = rejected(crds_installed, cluster_namespace, suite(**{where: code}))
    assert f"spec.tasks[0].{where}" in message
    assert "exactly one of `source` (inline Python) or `file`" in message


def test_neither_source_nor_file(crds_installed: ControlPlane, cluster_namespace: str) -> None:
    message = rejected(crds_installed, cluster_namespace, suite(grader={"type": "python"}))
    assert "spec.tasks[0].grader" in message
    assert "a python grader needs exactly one of `source`" in message


def test_file_must_be_a_configmap_key(crds_installed: ControlPlane, cluster_namespace: str) -> None:
    obj = suite(grader={"type": "python", "file": "../graders/grade.py"})
    message = rejected(crds_installed, cluster_namespace, obj)
    assert "spec.tasks[0].grader.file" in message
    assert "configmap-name/key" in message


def test_duplicate_task_ids(crds_installed: ControlPlane, cluster_namespace: str) -> None:
    obj = suite()
    obj["spec"]["tasks"].append(copy.deepcopy(obj["spec"]["tasks"][0]))
    message = rejected(crds_installed, cluster_namespace, obj)
    assert "spec.tasks" in message
    assert "task ids must be unique within a suite" in message


def test_dataset_path_is_local_only(crds_installed: ControlPlane, cluster_namespace: str) -> None:
    message = rejected(crds_installed, cluster_namespace, suite(dataset={"path": "data/qa.jsonl"}))
    assert "spec.tasks[0].dataset.path" in message
    assert "use `configMapRef" in message


def test_dataset_needs_exactly_one_source(
    crds_installed: ControlPlane, cluster_namespace: str
) -> None:
    both = {"rows": [{"q": 1}], "configMapRef": {"name": "qa", "key": "rows.jsonl"}}
    for dataset in (both, {}):
        message = rejected(crds_installed, cluster_namespace, suite(dataset=dataset))
        assert "spec.tasks[0].dataset" in message
        assert "set exactly one of `rows`, `path`, `configMapRef` or `uri`" in message


def test_regex_extraction_needs_a_pattern(
    crds_installed: ControlPlane, cluster_namespace: str
) -> None:
    obj = suite(extraction={"type": "regex"})
    message = rejected(crds_installed, cluster_namespace, obj)
    assert "spec.tasks[0].extraction.pattern" in message
    assert "`pattern` is required when type is `regex`" in message


def test_bad_enum_and_task_id(crds_installed: ControlPlane, cluster_namespace: str) -> None:
    obj = suite(id="Not_OK!", grader={"type": "python", "source": "x", "contract": "weird"})
    message = rejected(crds_installed, cluster_namespace, obj)
    assert "spec.tasks[0].id" in message
    assert "spec.tasks[0].grader.contract" in message
    assert '"sample", "batch", "model_backed"' in message


def test_too_many_tasks(crds_installed: ControlPlane, cluster_namespace: str) -> None:
    obj = suite()
    template = obj["spec"]["tasks"][0]
    obj["spec"]["tasks"] = [{**template, "id": f"t{i}"} for i in range(201)]
    message = rejected(crds_installed, cluster_namespace, obj)
    assert "spec.tasks" in message
    assert "must have at most 200 items" in message


def test_run_rules(crds_installed: ControlPlane, cluster_namespace: str) -> None:
    cp, ns = crds_installed, cluster_namespace
    message = rejected(cp, ns, run(models=["openai:gpt-4.1-mini", "openai:gpt-4.1-mini"]))
    assert "spec.models" in message
    assert "models must be unique" in message
    message = rejected(cp, ns, run(models=["anthropic:claude"]))
    assert "spec.models" in message
    assert "must be declared in `providers`" in message
    message = rejected(cp, ns, run(models=["Bad Model"]))
    assert "spec.models[0]" in message
    headers = {"openai": {"baseURL": "https://x", "headers": {"Authorization": "Bearer k"}}}
    message = rejected(cp, ns, run(providers=headers))
    assert "spec.providers[openai].headers" in message
    assert "must not carry credentials" in message
    no_suite = run()
    del no_suite["spec"]["suiteRef"]
    message = rejected(cp, ns, no_suite)
    assert "spec.suiteRef: Required value" in message
    message = rejected(cp, ns, run(models=[]))
    assert "spec.models" in message


def test_precomputed_runs_need_no_provider(
    crds_installed: ControlPlane, cluster_namespace: str
) -> None:
    obj = run(models=["precomputed", "precomputed:baseline"], providers={})
    del obj["spec"]["judgeModel"], obj["spec"]["embeddingModel"]
    create(crds_installed, cluster_namespace, obj)


# -- unknown fields -------------------------------------------------------------------------


def test_unknown_fields_are_pruned_without_strict_validation(
    crds_installed: ControlPlane, cluster_namespace: str
) -> None:
    obj = suite()
    obj["spec"]["tasks"][0]["grader"]["timeout_seconds"] = 5  # snake_case: CLI only
    created = create(crds_installed, cluster_namespace, obj, "--validate=false")
    grader = created["spec"]["tasks"][0]["grader"]
    assert "timeout_seconds" not in grader
    assert grader["timeoutSeconds"] == 120


def test_unknown_fields_are_errors_with_strict_validation(
    crds_installed: ControlPlane, cluster_namespace: str
) -> None:
    obj = suite()
    obj["spec"]["tasks"][0]["grader"]["timeout_seconds"] = 5
    message = rejected(crds_installed, cluster_namespace, obj, "--validate=strict")
    assert 'unknown field "spec.tasks[0].grader.timeout_seconds"' in message


# -- status, explain, printer columns -------------------------------------------------------


def test_status_subresource_and_printer_columns(
    crds_installed: ControlPlane, cluster_namespace: str
) -> None:
    cp, ns = crds_installed, cluster_namespace
    create(cp, ns, suite())
    create(cp, ns, run())
    status = {
        "status": {
            "phase": "Succeeded",
            "observedGeneration": 1,
            "suiteVersion": "sha256:abc",
            "summary": "score=0.83 (1 tasks)",
            "conditions": [
                {"type": "Succeeded", "status": "True", "reason": "Done", "observedGeneration": 1}
            ],
            "results": [
                {
                    "task": "qa_exact_match",
                    "model": "openai:gpt-4.1-mini",
                    "metrics": {"score": 0.83},
                    "counts": {"samples": 6, "valid": 5, "invalid": 1, "errored": 0},
                    "modelCalls": {"candidate": 6},
                }
            ],
            "kopf": {"progress": {"some-handler": {"started": "x"}}},
        }
    }
    cp.kubectl(
        "patch", "evr", "qa-nightly", "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip
    stored = cp.kubectl_json("get", "evr", "qa-nightly", "-n", ns)["status"]
    assert stored["results"][0]["metrics"] == {"score": 0.83}
    assert stored["kopf"] == {"progress": {"some-handler": {"started": "x"}}}  # kept for kopf
    table = cp.kubectl("get", "evr", "-n", ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "SUITE", "SCORE", "AGE"]
    assert table[1].split()[:4] == ["qa-nightly", "Succeeded", "qa", "score=0.83"]
    # the status subresource ignores spec changes and the main resource ignores status
    cp.kubectl(
        "patch", "evr", "qa-nightly", "-n", ns, "--type=merge", "-p",
        json.dumps({"status": {"phase": "Failed"}}),
    )  # fmt: skip
    assert cp.kubectl_json("get", "evr", "qa-nightly", "-n", ns)["status"]["phase"] == "Succeeded"
    bad = {"status": {"phase": "Exploded"}}
    with pytest.raises(KubectlError) as info:
        cp.kubectl(
            "patch", "evr", "qa-nightly", "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps(bad),
        )  # fmt: skip
    assert "status.phase" in info.value.stderr

    suite_status = {
        "status": {
            "suiteVersion": "sha256:0123abcd",
            "observedGeneration": 1,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Validated"}],
        }
    }
    cp.kubectl(
        "patch", "evs", "qa", "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps(suite_status),
    )  # fmt: skip
    table = cp.kubectl("get", "evs", "-n", ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "VERSION", "READY", "AGE"]
    assert table[1].split()[:3] == ["qa", "sha256:0123abcd", "True"]
    everything = cp.kubectl("get", "evalkube", "-n", ns, "-o", "name").stdout.split()
    assert sorted(everything) == [
        "evalrun.evalkube.io/qa-nightly",
        "evalsuite.evalkube.io/qa",
    ]


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("evalrun.spec.models", "Models under test as `provider:model`"),
        ("evr.spec.providers.baseURL", "API base URL"),
        ("evalsuite.spec.tasks.grader.timeoutSeconds", "1..600 seconds"),
        ("evs.spec.tasks.dataset.configMapRef", "ConfigMap key holding JSONL"),
        ("evalrun.status.summary", "One-line score summary"),
        ("evalrun.status.results.counts.invalid", "scored 0"),
    ],
)
def test_kubectl_explain(crds_installed: ControlPlane, field: str, expected: str) -> None:
    def explained() -> str:
        out = crds_installed.kubectl("explain", field, check=False)
        return out.stdout if out.returncode == 0 else ""

    # the OpenAPI of a new CRD is published a moment after it is Established
    text = crds_installed.wait_for(explained, timeout=30, what=f"kubectl explain {field}")
    assert expected in " ".join(text.split())
