"""What ``evalkube submit`` makes of a local suite: uploads under content-addressed keys or
ConfigMaps for its data, a code ConfigMap for its grader files, the manifests as the CRDs
spell them; and what it refuses, naming the field and the fix. No cluster, no store: the
plan is built from real files in a temporary folder."""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from evalkube import limits
from evalkube.controller.snapshot import check_suite
from evalkube.engine.loading import iter_json_rows, load_files
from evalkube.models import ConfigError, EvalRun, EvalSuite
from evalkube.submit.plan import Plan, Store, SubmitRefused, build_plan, namespace_of
from tests.conftest import EXAMPLES

NOW = datetime(2026, 12, 4, 9, 30, 5, tzinfo=UTC)
GRADER = "def grade(sample, item):\n    return float(sample['output_text'] == item['target'])\n"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_suite(tmp: Path, tasks: list[dict[str, Any]], run: dict[str, Any] | None = None) -> Path:
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "evalkube.io/v1alpha1",
            "kind": "EvalSuite",
            "metadata": {"name": "qa"},
            "spec": {"tasks": tasks},
        },
    ]
    if run is not None:
        docs.append({"apiVersion": "evalkube.io/v1alpha1", "kind": "EvalRun", **run})
    path = tmp / "suite.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def task(dataset: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": extra.pop("id", "qa"),
        "dataset": dataset,
        "prompt": "{{ item.q }}",
        "target": "{{ item.a }}",
        "outputs": extra.pop("outputs", {"column": "out"}),
        "grader": extra.pop("grader", {"type": "python", "file": "graders/exact.py"}),
        **extra,
    }


def plan_of(suite: Path, **options: Any) -> Plan:
    loaded, run = load_files(suite, None, versioned=False)
    options.setdefault("namespace", "team-a")
    return build_plan(loaded, run, now=NOW, **options)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "graders").mkdir()
    (tmp_path / "graders" / "exact.py").write_text(GRADER)
    (tmp_path / "data").mkdir()
    rows = [{"id": f"r{i}", "q": f"{i}?", "a": str(i), "out": str(i)} for i in range(5)]
    (tmp_path / "data" / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def refusal(suite: Path, **options: Any) -> str:
    with pytest.raises(SubmitRefused) as caught:
        plan_of(suite, **options)
    return str(caught.value)


def test_the_recipes_go_to_the_store_under_content_addressed_keys() -> None:
    suite = EXAMPLES / "recipes" / "suite.yaml"
    plan = plan_of(suite, store=Store.parse("s3://evals/team/nightly"))
    data = EXAMPLES / "recipes" / "data"
    expected = {
        f"evals/team/nightly/recipes/{sha256(data / name)}/{name}": data / name
        for name in ("arithmetic.jsonl", "measurements.jsonl", "outputs-f1.jsonl")
    }
    assert {f"{u.bucket}/{u.key}": u.file.path for u in plan.uploads} == expected
    assert all(u.file.converted is None for u in plan.uploads)  # JSONL goes as it is
    tasks = {t["id"]: t for t in plan.suite["spec"]["tasks"]}
    arithmetic = sha256(data / "arithmetic.jsonl")
    assert tasks["exact_match"]["dataset"] == {
        "uri": f"s3://evals/team/nightly/recipes/{arithmetic}/arithmetic.jsonl",
        "sha256": arithmetic,
        "idField": "id",
    }
    outputs = sha256(data / "outputs-f1.jsonl")
    assert tasks["token_f1"]["outputs"] == {
        "uri": f"s3://evals/team/nightly/recipes/{outputs}/outputs-f1.jsonl",
        "sha256": outputs,
    }
    # inline rows and columns stay as they were
    assert tasks["case_insensitive"]["dataset"]["rows"][0]["capital"] == "Paris"
    assert tasks["case_insensitive"]["outputs"] == {"column": "output"}
    # one code ConfigMap; every file reference is one of its keys
    (code,) = plan.config_maps
    assert code["metadata"] == {
        "name": "recipes-code",
        "namespace": "team-a",
        "labels": {
            "app.kubernetes.io/managed-by": "evalkube-submit",
            "evalkube.io/suite": "recipes",
        },
    }
    graders = EXAMPLES / "recipes" / "graders"
    assert code["data"] == {p.name: p.read_text() for p in sorted(graders.glob("*.py"))}
    assert tasks["preprocess_row"]["preprocess"]["file"] == "recipes-code/clean_rows.py"
    assert tasks["macro_f1"]["grader"]["file"] == "recipes-code/macro_f1.py"
    assert "ownerReferences" not in code["metadata"]
    # nothing local is left, and the manifests are what the CRDs and the operator accept
    text = json.dumps(plan.suite)
    assert '"path"' not in text
    assert "graders/" not in text
    EvalSuite.model_validate(plan.suite)
    assert check_suite("team-a", plan.suite["spec"], _reader(plan)).problems == []
    assert plan.manifests == [code, plan.suite, plan.run]


def _reader(plan: Plan) -> Any:
    data = {(c["metadata"]["name"], k): v for c in plan.config_maps for k, v in c["data"].items()}
    return lambda _ns, name, key: data.get((name, key))


def test_the_same_bytes_get_the_same_key_and_changed_bytes_a_new_one(folder: Path) -> None:
    suite = write_suite(folder, [task({"path": "data/qa.jsonl"})])
    store = Store.parse("s3://evals")
    first, again = plan_of(suite, store=store), plan_of(suite, store=store)
    assert [u.key for u in first.uploads] == [u.key for u in again.uploads]
    assert first.uploads[0].key == f"qa/{sha256(folder / 'data' / 'qa.jsonl')}/qa.jsonl"
    with (folder / "data" / "qa.jsonl").open("a") as extra:
        extra.write('{"id": "r9", "q": "9?", "a": "9", "out": "9"}\n')
    changed = plan_of(suite, store=store)
    assert changed.uploads[0].key != first.uploads[0].key


def test_two_tasks_naming_one_file_upload_it_once(folder: Path) -> None:
    suite = write_suite(
        folder,
        [task({"path": "data/qa.jsonl"}, id="a"), task({"path": "data/qa.jsonl"}, id="b")],
    )
    plan = plan_of(suite, store=Store.parse("s3://evals/x"))
    assert len(plan.uploads) == 1
    uris = {t["dataset"]["uri"] for t in plan.suite["spec"]["tasks"]}
    assert uris == {plan.uploads[0].uri}


def test_a_small_jsonl_dataset_without_a_store_becomes_a_configmap(folder: Path) -> None:
    suite = write_suite(folder, [task({"path": "data/qa.jsonl", "idField": "id"})])
    plan = plan_of(suite)
    assert plan.uploads == []
    digest = sha256(folder / "data" / "qa.jsonl")
    code, data = plan.config_maps
    assert code["metadata"]["name"] == "qa-code"
    assert data["metadata"]["name"] == f"qa-data-{digest[:10]}"
    assert data["data"] == {"qa.jsonl": (folder / "data" / "qa.jsonl").read_text()}
    dataset = plan.suite["spec"]["tasks"][0]["dataset"]
    assert dataset == {
        "configMapRef": {"name": f"qa-data-{digest[:10]}", "key": "qa.jsonl"},
        "idField": "id",
    }
    check = check_suite("team-a", plan.suite["spec"], _reader(plan))
    assert check.problems == []
    assert check.datasets["qa"].rows == 5


def test_a_dataset_too_large_for_a_configmap_is_refused_naming_the_file_and_store(
    folder: Path,
) -> None:
    line = json.dumps({"q": "x" * 1000, "a": "1", "out": "1"}) + "\n"
    big = folder / "data" / "big.jsonl"
    big.write_text(line * (limits.SUBMIT_CONFIGMAP_BYTES // len(line) + 1))
    suite = write_suite(folder, [task({"path": "data/big.jsonl"})])
    message = refusal(suite)
    assert "tasks[qa].dataset.path" in message
    assert str(big) in message
    assert f"{big.stat().st_size:,} bytes" in message
    assert "--store s3://BUCKET/PREFIX" in message
    # with a store it is uploaded as it is
    plan = plan_of(suite, store=Store.parse("s3://evals"))
    assert plan.uploads[0].file.size == big.stat().st_size


def test_a_json_array_becomes_jsonl(folder: Path) -> None:
    rows = [{"q": "1?", "a": "1", "out": "1"}, {"q": "é?", "a": "2", "out": "3"}]
    (folder / "data" / "rows.json").write_text(json.dumps(rows))
    suite = write_suite(folder, [task({"path": "data/rows.json"})])
    uploaded = plan_of(suite, store=Store.parse("s3://evals")).uploads[0]
    assert uploaded.key.endswith("/rows.jsonl")
    assert uploaded.file.converted is not None
    assert [json.loads(line) for line in uploaded.file.converted.splitlines()] == rows
    assert uploaded.key.split("/")[1] == hashlib.sha256(uploaded.file.converted).hexdigest()
    configmap = plan_of(suite).config_maps[1]
    ((key, text),) = configmap["data"].items()
    assert key == "rows.jsonl"
    converted = folder / "converted.jsonl"
    converted.write_text(text)
    assert list(iter_json_rows(converted, "f")) == rows  # what the pod reads


def test_line_separators_inside_strings_cannot_change_the_operators_row_count(
    folder: Path,
) -> None:
    """The operator counts a ConfigMap's rows with ``str.splitlines``, which also breaks at
    U+2028, U+2029 and U+0085 (valid raw inside a JSON string); the runner reads lines. The
    ConfigMap holds them as escapes: the same values, the same count."""
    rows = [{"q": "a\u2028b", "a": "x\u2029y", "out": "\x85"}, {"q": "2", "a": "2", "out": "2"}]
    path = folder / "data" / "odd.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    assert len(path.read_text().splitlines()) > 2  # what the operator would have counted
    plan = plan_of(write_suite(folder, [task({"path": "data/odd.jsonl"})]))
    check = check_suite("team-a", plan.suite["spec"], _reader(plan))
    assert check.datasets["qa"].rows == 2
    (text,) = plan.config_maps[1]["data"].values()
    mounted = folder / "mounted.jsonl"
    mounted.write_text(text)
    assert list(iter_json_rows(mounted, "f")) == rows


def test_outputs_files_need_a_store(folder: Path) -> None:
    (folder / "data" / "outputs.jsonl").write_text('{"id": "r0", "output_text": "0"}\n')
    suite = write_suite(
        folder,
        [task({"path": "data/qa.jsonl", "idField": "id"}, outputs={"path": "data/outputs.jsonl"})],
    )
    message = refusal(suite)
    assert "tasks[qa].outputs.path" in message
    assert "--store s3://BUCKET/PREFIX" in message
    plan = plan_of(suite, store=Store.parse("s3://evals/p"))
    outputs = plan.suite["spec"]["tasks"][0]["outputs"]
    assert outputs["uri"].endswith("/outputs.jsonl")
    assert outputs["sha256"] == sha256(folder / "data" / "outputs.jsonl")


def test_a_local_parquet_uri_is_uploaded_with_its_format(folder: Path) -> None:
    table = pa.table({"q": ["1?", "2?"], "a": ["1", "2"], "out": ["1", "3"]})
    pq.write_table(table, folder / "data" / "qa.parquet")
    (folder / "data" / "qa.bin").write_bytes((folder / "data" / "qa.parquet").read_bytes())
    suite = write_suite(
        folder,
        [
            task({"uri": "data/qa.parquet"}, id="named"),
            task({"uri": f"file://{folder}/data/qa.bin", "format": "parquet"}, id="declared"),
        ],
    )
    message = refusal(suite)
    assert "tasks[named].dataset.uri" in message
    assert "is Parquet, which only an object store serves a cluster" in message
    assert "tasks[declared].dataset.uri" in message
    plan = plan_of(suite, store=Store.parse("s3://evals"))
    named, declared = (t["dataset"] for t in plan.suite["spec"]["tasks"])
    digest = sha256(folder / "data" / "qa.parquet")
    # pinned by its footer and ETag: no sha256 asks the prepare pod to read it all
    assert named == {"uri": f"s3://evals/qa/{digest}/qa.parquet"}
    assert declared == {"uri": f"s3://evals/qa/{digest}/qa.bin", "format": "parquet"}


def test_a_local_jsonl_uri_fits_a_configmap_and_a_gzipped_one_needs_the_store(
    folder: Path,
) -> None:
    import gzip

    (folder / "data" / "qa.jsonl.gz").write_bytes(
        gzip.compress((folder / "data" / "qa.jsonl").read_bytes())
    )
    suite = write_suite(folder, [task({"uri": "data/qa.jsonl"})])
    dataset = plan_of(suite).suite["spec"]["tasks"][0]["dataset"]
    assert set(dataset) == {"configMapRef"}
    gz = write_suite(folder, [task({"uri": "data/qa.jsonl.gz"})])
    assert "is gzip-compressed JSONL, which only an object store serves" in refusal(gz)
    uploaded = plan_of(gz, store=Store.parse("s3://evals")).suite["spec"]["tasks"][0]["dataset"]
    assert uploaded["uri"].endswith("/qa.jsonl.gz")
    assert uploaded["sha256"] == sha256(folder / "data" / "qa.jsonl.gz")


def test_a_declared_sha256_that_does_not_match_the_file_is_refused(folder: Path) -> None:
    suite = write_suite(folder, [task({"uri": "data/qa.jsonl", "sha256": "0" * 64})])
    message = refusal(suite, store=Store.parse("s3://evals"))
    assert "tasks[qa].dataset.sha256" in message
    assert sha256(folder / "data" / "qa.jsonl") in message


def test_remote_sources_stay_as_they_are_and_are_never_read(folder: Path) -> None:
    suite = write_suite(
        folder,
        [
            task({"uri": "s3://somewhere/x/data.parquet"}, id="s3"),
            task({"uri": "pvc://claim/data.jsonl"}, id="pvc"),
            task({"uri": "https://example.invalid/d.jsonl", "sha256": "a" * 64}, id="https"),
        ],
    )
    plan = plan_of(suite)
    assert [t["dataset"] for t in plan.suite["spec"]["tasks"]] == [
        {"uri": "s3://somewhere/x/data.parquet"},
        {"uri": "pvc://claim/data.jsonl"},
        {"uri": "https://example.invalid/d.jsonl", "sha256": "a" * 64},
    ]
    assert plan.uploads == []


def test_a_path_environment_is_refused_naming_the_field_and_the_fix(folder: Path) -> None:
    (folder / "venv").mkdir()
    grader = {"type": "python", "file": "graders/exact.py", "environment": "./venv"}
    message = refusal(write_suite(folder, [task({"path": "data/qa.jsonl"}, grader=grader)]))
    assert "tasks[qa].grader.environment: './venv' is a directory on this machine" in message
    assert "build an image FROM the evalkube-sandbox image" in message
    image = {**grader, "environment": "registry.example/graders:1.0"}
    plan = plan_of(write_suite(folder, [task({"path": "data/qa.jsonl"}, grader=image)]))
    assert plan.suite["spec"]["tasks"][0]["grader"]["environment"] == "registry.example/graders:1.0"


def test_every_refusal_is_listed_at_once(folder: Path) -> None:
    (folder / "data" / "outputs.jsonl").write_text('{"id": "0", "output_text": "0"}\n')
    grader = {"type": "python", "file": "graders/exact.py", "environment": "/opt/venv"}
    suite = write_suite(
        folder,
        [
            task({"uri": "data/qa.jsonl.zst"}, id="a"),
            task({"path": "data/qa.jsonl"}, id="b", outputs={"path": "data/outputs.jsonl"}),
            task({"path": "data/qa.jsonl"}, id="c", grader=grader),
        ],
    )
    (folder / "data" / "qa.jsonl.zst").write_bytes(b"not really zstd")
    message = refusal(suite)
    assert message.count("\n  - ") == 3, message
    for field in ("tasks[a].dataset.uri", "tasks[b].outputs.path", "tasks[c].grader.environment"):
        assert field in message


def test_grader_files_sharing_a_name_get_keys_of_their_own(folder: Path) -> None:
    (folder / "other").mkdir()
    other = "def grade(sample, item):\n    return 1.0\n"
    (folder / "other" / "exact.py").write_text(other)
    suite = write_suite(
        folder,
        [
            task({"path": "data/qa.jsonl"}, id="a"),
            task(
                {"path": "data/qa.jsonl"},
                id="b",
                grader={"type": "python", "file": "other/exact.py"},
            ),
            task({"path": "data/qa.jsonl"}, id="c"),
        ],
    )
    plan = plan_of(suite)
    files = [t["grader"]["file"] for t in plan.suite["spec"]["tasks"]]
    assert files[0] == files[2] == "qa-code/exact.py"
    assert files[1].startswith("qa-code/exact-")
    assert files[1].endswith(".py")
    code = plan.config_maps[0]["data"]
    assert code == {"exact.py": GRADER, files[1].split("/", 1)[1]: other}


def test_the_grader_files_must_fit_their_configmap(folder: Path) -> None:
    big = "x = 1\n" * (limits.SUBMIT_CONFIGMAP_BYTES // 6 + 1) + GRADER
    (folder / "graders" / "big.py").write_text(big)
    grader = {"type": "python", "file": "graders/big.py"}
    message = refusal(write_suite(folder, [task({"path": "data/qa.jsonl"}, grader=grader)]))
    assert "more than its code ConfigMap qa-code holds" in message
    assert "big.py" in message


def test_the_run_is_named_and_points_at_the_suite(folder: Path) -> None:
    plain = write_suite(folder, [task({"path": "data/qa.jsonl"})])
    plan = plan_of(plain)
    assert plan.run_name == "qa-20261204-093005"
    assert plan.run["metadata"]["name"] == "qa-20261204-093005"
    assert plan.run["spec"] == {"models": ["precomputed"], "suiteRef": {"name": "qa"}}
    assert plan_of(plain, run_name="mine").run["metadata"]["name"] == "mine"
    run = {
        "metadata": {
            "name": "nightly",
            "labels": {"team": "qa"},
            "uid": "x",
            "resourceVersion": "9",
        },
        "spec": {"suiteRef": {"name": "elsewhere"}, "models": ["precomputed"], "shardSize": 2},
    }
    from_file = plan_of(write_suite(folder, [task({"path": "data/qa.jsonl"})], run))
    assert from_file.run["metadata"] == {
        "name": "nightly",
        "namespace": "team-a",
        "labels": {
            "team": "qa",
            "app.kubernetes.io/managed-by": "evalkube-submit",
            "evalkube.io/suite": "qa",
        },
    }
    # only what the file set: a default stays the operator's
    assert from_file.run["spec"] == {
        "suiteRef": {"name": "qa"},
        "models": ["precomputed"],
        "shardSize": 2,
    }
    assert any("suiteRef 'elsewhere' is replaced" in w for w in from_file.warnings)
    EvalRun.model_validate(from_file.run)
    assert "--name" in refusal(plain, run_name="Not_A_Name")


def test_fields_are_spelled_as_the_crds_spell_them(folder: Path) -> None:
    snake = task(
        {"path": "data/qa.jsonl", "id_field": "id"},
        grader={
            "type": "python",
            "file": "graders/exact.py",
            "metric_id": "em",
            "timeout_seconds": 5,
        },
        grader_inputs="openai",
    )
    spec = plan_of(write_suite(folder, [snake])).suite["spec"]["tasks"][0]
    assert spec["dataset"]["idField"] == "id"
    assert spec["grader"] == {
        "file": "qa-code/exact.py",
        "type": "python",
        "metricId": "em",
        "timeoutSeconds": 5,
    }
    assert spec["graderInputs"] == "openai"
    assert "extraction" not in spec  # left to the default


def test_uploads_warn_when_the_run_cannot_reach_the_store(folder: Path) -> None:
    suite = write_suite(folder, [task({"path": "data/qa.jsonl"})])
    plan = plan_of(suite, store=Store.parse("s3://evals"))
    assert any("the run has no spec.storage.s3" in w for w in plan.warnings)
    storage = {"s3": {"endpointURL": "http://seaweedfs.storage.svc:8333"}}
    run = {"metadata": {"name": "r"}, "spec": {"models": ["precomputed"], "storage": storage}}
    with_storage = plan_of(
        write_suite(folder, [task({"path": "data/qa.jsonl"})], run), store=Store.parse("s3://evals")
    )
    assert [w for w in with_storage.warnings if "credentials" in w]
    assert plan_of(suite).warnings == []  # nothing uploaded, nothing to reach


@pytest.mark.parametrize(
    ("raw", "bucket", "prefix"),
    [
        ("s3://evals", "evals", ""),
        ("s3://evals/", "evals", ""),
        ("s3://evals/a/b/", "evals", "a/b"),
    ],
)
def test_store_urls(raw: str, bucket: str, prefix: str) -> None:
    assert Store.parse(raw) == Store(bucket, prefix)


@pytest.mark.parametrize(
    "raw", ["evals", "gs://evals/x", "s3://E/x", "s3://evals/../x", "s3://evals/x?y=1", "pvc://c/x"]
)
def test_store_urls_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="give s3://BUCKET or s3://BUCKET/PREFIX"):
        Store.parse(raw)


def test_the_namespace_comes_from_the_flag_the_files_or_the_context(folder: Path) -> None:
    loaded, _ = load_files(write_suite(folder, [task({"path": "data/qa.jsonl"})]), None)
    assert namespace_of(loaded, None, None, "ctx") == "ctx"
    assert namespace_of(loaded, None, "team-b", "ctx") == "team-b"
    loaded.suite.metadata.namespace = "team-a"
    assert namespace_of(loaded, None, None, "ctx") == "team-a"
    with pytest.raises(ConfigError, match="names namespace 'team-a', not the 'team-b'"):
        namespace_of(loaded, None, "team-b", "ctx")


def test_a_suite_name_kubernetes_refuses_is_named(folder: Path) -> None:
    suite = write_suite(folder, [task({"path": "data/qa.jsonl"})])
    text = suite.read_text().replace("name: qa", "name: QA_suite", 1)
    suite.write_text(text)
    assert "metadata.name: 'QA_suite' is not a Kubernetes name" in refusal(suite)


def test_the_examples_plan_without_reading_remote_sources(tmp_path: Path) -> None:
    """``versioned=False`` loads a suite without pinning its uri sources: an s3:// dataset
    is not fetched (there is no store here to fetch it from)."""
    shutil.copytree(EXAMPLES / "recipes", tmp_path / "recipes")
    suite = write_suite(tmp_path, [task({"uri": "s3://nowhere-bucket/x.jsonl"})])
    (tmp_path / "graders").mkdir()
    (tmp_path / "graders" / "exact.py").write_text(GRADER)
    plan = plan_of(suite)
    assert plan.suite["spec"]["tasks"][0]["dataset"] == {"uri": "s3://nowhere-bucket/x.jsonl"}


def test_models_given_replace_the_run_files(folder: Path) -> None:
    run = {"metadata": {"name": "r"}, "spec": {"models": ["precomputed"]}}
    suite = write_suite(folder, [task({"path": "data/qa.jsonl"})], run)
    plan = plan_of(suite, models=["precomputed:ft-1", "precomputed:ft-2"])
    assert plan.run["spec"]["models"] == ["precomputed:ft-1", "precomputed:ft-2"]


def test_each_criterion_of_a_graders_list_gets_its_file_key(folder: Path) -> None:
    (folder / "graders" / "other.py").write_text("def grade(sample, item):\n    return 0.5\n")
    graders = [
        {"type": "python", "name": "exact", "file": "graders/exact.py"},
        {"type": "python", "name": "half", "file": "graders/other.py"},
        {"type": "string_check", "name": "same", "input": "{{ sample.output_text }}",
         "reference": "{{ item.a }}", "operation": "eq"},
    ]  # fmt: skip
    suite = write_suite(folder, [{**task({"path": "data/qa.jsonl"}), "grader": None}])
    docs = list(yaml.safe_load_all(suite.read_text()))
    docs[0]["spec"]["tasks"][0].pop("grader")
    docs[0]["spec"]["tasks"][0]["graders"] = graders
    suite.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    spec = plan_of(suite).suite["spec"]["tasks"][0]
    assert [g.get("file") for g in spec["graders"]] == [
        "qa-code/exact.py",
        "qa-code/other.py",
        None,
    ]


def _keyed_run(folder: Path, **provider: Any) -> Path:
    run = {
        "metadata": {"name": "judged"},
        "spec": {
            "models": ["precomputed"],
            "judgeModel": "openai:gpt-4.1-mini",
            "providers": {
                "openai": {"baseURL": "https://api.openai.com/v1", **provider},
                "vllm": {
                    "baseURL": "http://vllm.serving:8000/v1",
                    "credentialsSecretRef": {"name": "vllm", "key": "token"},
                },
            },
        },
    }
    return write_suite(folder, [task({"path": "data/qa.jsonl"})], run)


def test_a_provider_key_from_the_environment_becomes_a_secret_the_run_reads(
    folder: Path,
) -> None:
    suite = _keyed_run(folder, apiKeyEnv="OPENAI_API_KEY")
    plan = plan_of(suite, environ={"OPENAI_API_KEY": "sk-local-key"})
    kinds = [m["kind"] for m in plan.manifests]
    assert kinds[-3:] == ["Secret", "EvalSuite", "EvalRun"]  # the keys exist before the run
    assert plan.secret is not None
    assert plan.secret["metadata"]["name"] == "judged-provider-keys"
    assert plan.secret["metadata"]["namespace"] == "team-a"
    assert plan.secret["stringData"] == {"openai": "sk-local-key"}
    providers = plan.run["spec"]["providers"]
    assert providers["openai"] == {
        "baseURL": "https://api.openai.com/v1",
        "credentialsSecretRef": {"name": "judged-provider-keys", "key": "openai"},
    }
    # a provider that already names a Secret is left as it is
    assert providers["vllm"]["credentialsSecretRef"] == {"name": "vllm", "key": "token"}
    # what --dry-run prints says where the key comes from, never the key
    shown = yaml.safe_dump_all(plan.shown())
    assert "sk-local-key" not in shown
    assert "<the value of $OPENAI_API_KEY>" in shown
    # owned by the run once it exists: deleting the EvalRun deletes the keys
    owned = plan.owned_secret("uid-1")
    assert owned is not None
    assert owned["metadata"]["ownerReferences"] == [
        {"apiVersion": "evalkube.io/v1alpha1", "kind": "EvalRun", "name": "judged", "uid": "uid-1"}
    ]
    assert owned["stringData"] == {"openai": "sk-local-key"}


def test_an_unset_key_variable_is_refused_naming_the_field_and_the_fix(folder: Path) -> None:
    suite = _keyed_run(folder, apiKeyEnv="OPENAI_API_KEY")
    message = refusal(suite, environ={})
    assert "providers.openai.apiKeyEnv: the environment variable OPENAI_API_KEY is not set" in (
        message
    )
    assert "export OPENAI_API_KEY" in message
    assert "providers.openai.credentialsSecretRef" in message


def test_without_key_variables_no_secret_is_made(folder: Path) -> None:
    suite = _keyed_run(folder, credentialsSecretRef={"name": "openai", "key": "api-key"})
    plan = plan_of(suite, environ={"OPENAI_API_KEY": "sk-unused"})
    assert plan.secret is None
    assert "Secret" not in [m["kind"] for m in plan.shown()]


def test_a_provider_name_that_cannot_be_a_secret_key_is_refused(folder: Path) -> None:
    run = {
        "metadata": {"name": "judged"},
        "spec": {
            "models": ["precomputed"],
            "providers": {"team models": {"baseURL": "https://x.example/v1", "apiKeyEnv": "K"}},
        },
    }
    suite = write_suite(folder, [task({"path": "data/qa.jsonl"})], run)
    message = refusal(suite, environ={"K": "sk-1"})
    assert "providers.team models.apiKeyEnv: the provider's name becomes the key" in message
    assert "rename the provider" in message
