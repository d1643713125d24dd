"""The CRD generator (evalkube.controller.crds): structural schemas, ranges, CEL rules, drift.

Pure tests, no cluster: tests/integration/cluster/test_crds.py applies the same CRDs to a real
API server and checks what it accepts and rejects.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field
from typer.testing import CliRunner

from evalkube import limits
from evalkube.controller import crds
from evalkube.controller.crds_cli import crds as crds_command
from evalkube.models.crd import CLUSTER_KEY, Rule, cel, cluster

ROOT = Path(__file__).resolve().parents[3]
Schema = dict[str, Any]


def root_schema(crd: Schema) -> Schema:
    version = crd["spec"]["versions"][0]
    schema: Schema = version["schema"]["openAPIV3Schema"]
    return schema


def at(schema: Schema, path: str) -> Schema:
    node = schema
    for part in path.split("."):
        if part == "[]":
            node = node["items"]
        elif part == "{}":
            node = node["additionalProperties"]
        else:
            node = node["properties"][part]
    return node


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}/{i}")


def properties(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    for name, sub in schema.get("properties", {}).items():
        here = f"{path}.{name}" if path else name
        yield here, sub
        yield from properties(sub, here)
        for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
            if isinstance(sub.get(key), dict):
                yield from properties(sub[key], here + suffix)


def rules(node: Schema) -> list[Schema]:
    found: list[Schema] = node.get("x-kubernetes-validations", [])
    return found


@pytest.fixture(scope="module")
def suite() -> Schema:
    return root_schema(crds.crd("EvalSuite"))


@pytest.fixture(scope="module")
def run() -> Schema:
    return root_schema(crds.crd("EvalRun"))


@pytest.fixture(scope="module")
def schedule() -> Schema:
    return root_schema(crds.crd("EvalSchedule"))


@pytest.fixture(scope="module", params=["EvalSuite", "EvalRun", "EvalSchedule"])
def crd(request: pytest.FixtureRequest) -> Schema:
    return crds.crd(request.param)


# -- names, scope, columns ------------------------------------------------------------------


def test_names_scope_and_versions(crd: Schema) -> None:
    spec = crd["spec"]
    kind = spec["names"]["kind"]
    assert crd["metadata"]["name"] == f"{spec['names']['plural']}.evalkube.io"
    assert spec["group"] == "evalkube.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["categories"] == ["evalkube"]
    short = {"EvalSuite": "evs", "EvalRun": "evr", "EvalSchedule": "evsc"}[kind]
    assert spec["names"]["shortNames"] == [short]
    [version] = spec["versions"]
    assert version["name"] == "v1alpha1"
    assert version["served"]
    assert version["storage"]
    assert version["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    def columns(crd: Schema) -> dict[str, str]:
        cols = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        return {c["name"]: c["jsonPath"] for c in cols}

    assert columns(crds.crd("EvalRun")) == {
        "Phase": ".status.phase",
        "Suite": ".spec.suiteRef.name",
        "Score": ".status.summary",
        "Age": ".metadata.creationTimestamp",
    }
    assert columns(crds.crd("EvalSuite")) == {
        "Version": ".status.suiteVersion",
        "Ready": '.status.conditions[?(@.type=="Ready")].status',
        "Age": ".metadata.creationTimestamp",
    }


def test_every_column_path_exists_in_the_schema(crd: Schema) -> None:
    schema = root_schema(crd)
    for column in crd["spec"]["versions"][0]["additionalPrinterColumns"]:
        path = column["jsonPath"].lstrip(".").split("[")[0]
        if path.startswith("metadata."):
            continue
        at(schema, path)  # KeyError when a column points at nothing


# -- structural schema ----------------------------------------------------------------------


def test_no_json_schema_leftovers(crd: Schema) -> None:
    text = json.dumps(crd)
    for word in ('"$ref"', '"$defs"', '"anyOf"', '"allOf"', '"oneOf"', '"title"', '"const"'):
        assert word not in text
    for path, node in walk(root_schema(crd)):
        if isinstance(node, dict) and isinstance(node.get("type"), str):
            assert node["type"] in {"object", "array", "string", "integer", "number", "boolean"}
            assert not (node.get("properties") and "additionalProperties" in node), path
        if isinstance(node, dict) and "default" in node and not path.endswith("/properties"):
            assert node["default"] is not None, f"{path}: default null"


def test_every_property_has_a_description(crd: Schema) -> None:
    missing = [
        path
        for path, sub in properties(root_schema(crd))
        if path != "metadata" and not sub.get("description")
    ]
    assert missing == []


def test_every_property_is_typed_or_explicitly_free_form(crd: Schema) -> None:
    for path, sub in properties(root_schema(crd)):
        assert "type" in sub or sub.get("x-kubernetes-preserve-unknown-fields"), path


def test_descriptions_are_one_paragraph_without_rst(suite: Schema) -> None:
    description = at(suite, "spec.tasks.[].grader.execution")["description"]
    assert "``" not in description
    assert "\n" not in description
    assert "`per_sample`" in description


def test_optional_fields_are_nullable_and_required_ones_required(suite: Schema) -> None:
    grader = at(suite, "spec.tasks.[].grader")
    assert grader["required"] == ["type"]
    assert grader["properties"]["source"]["nullable"] is True
    assert grader["properties"]["type"]["enum"] == [
        "python",
        "string_check",
        "text_similarity",
        "multi",
        "score_model",
        "label_model",
    ]
    task = at(suite, "spec.tasks.[]")
    assert set(task["required"]) == {"id", "dataset"}
    assert task["properties"]["preprocess"]["nullable"] is True


def test_a_task_needs_exactly_one_of_grader_or_graders(suite: Schema) -> None:
    task = at(suite, "spec.tasks.[]")
    rules = [r["rule"] for r in task["x-kubernetes-validations"]]
    assert any("grader" in r and "graders" in r for r in rules)
    criterion = at(suite, "spec.tasks.[].graders.[]")
    assert criterion["properties"]["source"]["maxLength"] == 262_144
    assert {"name", "passThreshold"} <= set(criterion["properties"])
    assert len(criterion["x-kubernetes-validations"]) == 2


def test_camel_case_only(suite: Schema, run: Schema) -> None:
    grader = at(suite, "spec.tasks.[].grader")["properties"]
    assert {"timeoutSeconds", "maxModelCalls", "metricId", "modelAccess"} <= set(grader)
    assert not [name for name in grader if "_" in name]
    assert "fileId" not in grader
    assert "baseURL" in at(run, "spec.providers.{}")["properties"]
    for _, sub in properties(suite):
        assert not [n for n in sub.get("properties", {}) if "_" in n]


def test_free_form_objects_preserve_unknown_fields(suite: Schema) -> None:
    for path in ("spec.tasks.[].dataset.rows.[]", "spec.tasks.[].fewShot.[]"):
        node = at(suite, path)
        assert node == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}, path


@pytest.mark.parametrize("field", ["prompt", "choices"])
def test_string_or_list_fields_keep_their_value(suite: Schema, field: str) -> None:
    node = at(suite, f"spec.tasks.[].{field}")
    assert node["x-kubernetes-preserve-unknown-fields"] is True
    assert "type" not in node
    assert "a list or a string" in node["description"]
    # the API server gives untyped fields no CEL type, so a rule here would not compile
    assert "x-kubernetes-validations" not in node


def test_metric_id_has_no_schema_default(suite: Schema) -> None:
    """The API server writes schema defaults into stored objects: a ``metricId: score`` default
    gave every criterion of a ``graders`` list the same metric (refused as a duplicate) where
    the model's default is the criterion's name."""
    from evalkube.models import TaskSpec, validate_spec

    for path in ("spec.tasks.[].grader.metricId", "spec.tasks.[].graders.[].metricId"):
        assert "default" not in at(suite, path), path
    graders = [
        {"type": "string_check", "name": n, "input": "x", "reference": "x", "operation": "eq"}
        for n in ("a", "b")
    ]
    task = validate_spec(
        TaskSpec, {"id": "t", "dataset": {"rows": [{}]}, "graders": graders}, prefix="task"
    )
    assert [g.metric_id for g in task.criteria] == ["a", "b"]


def test_ranges_and_defaults(suite: Schema, run: Schema) -> None:
    grader = at(suite, "spec.tasks.[].grader")["properties"]
    assert grader["timeoutSeconds"] | {} == {
        **grader["timeoutSeconds"],
        "type": "integer",
        "minimum": limits.TIMEOUT_SECONDS_MIN,
        "maximum": limits.TIMEOUT_SECONDS_MAX,
        "default": limits.TIMEOUT_SECONDS_DEFAULT,
    }
    assert (grader["maxModelCalls"]["minimum"], grader["maxModelCalls"]["maximum"]) == (0, 500)
    assert grader["maxModelCalls"]["default"] == limits.MAX_MODEL_CALLS_DEFAULT
    assert grader["contract"]["enum"] == ["sample", "batch", "model_backed"]
    assert grader["contract"]["default"] == "sample"
    preprocess = at(suite, "spec.tasks.[].preprocess.timeoutSeconds")
    assert (preprocess["minimum"], preprocess["maximum"]) == (1, 600)
    task_id = at(suite, "spec.tasks.[].id")
    assert task_id["maxLength"] == 63
    assert task_id["pattern"].startswith("^[a-z0-9]")
    timeout = at(run, "spec.providers.{}.timeoutSeconds")
    assert timeout["minimum"] == 0
    assert timeout["exclusiveMinimum"] is True
    assert timeout["maximum"] == 600
    assert at(run, "spec.generation.temperature")["maximum"] == 2


def test_cluster_bounds_keep_cel_affordable(suite: Schema, run: Schema) -> None:
    assert at(suite, "spec.tasks")["maxItems"] == 200
    assert at(suite, "spec.tasks")["minItems"] == 1
    assert at(suite, "spec.tasks.[].dataset.rows")["maxItems"] == 10_000
    assert at(suite, "spec.tasks.[].grader.source")["maxLength"] == 262_144
    assert at(run, "spec.models")["maxItems"] == 50
    assert at(run, "spec.models")["minItems"] == 1
    assert at(run, "spec.models.[]")["maxLength"] == 256
    # every list and map a CEL rule iterates over is bounded
    for schema in (suite, run):
        for path, node in walk(schema):
            if isinstance(node, dict) and rules(node):
                for rule in rules(node):
                    if ".all(" in rule["rule"] or ".exists" in rule["rule"]:
                        assert (
                            "maxItems" in node
                            or "maxProperties" in node
                            or (node.get("type") == "object")
                        ), path


def test_run_requires_a_suite_in_a_cluster(run: Schema) -> None:
    assert at(run, "spec")["required"] == ["models", "suiteRef"]


# -- CEL rules ------------------------------------------------------------------------------


def messages(node: Schema) -> list[str]:
    return [r.get("message", "") for r in rules(node)]


def test_exactly_one_source_or_file(suite: Schema) -> None:
    node = at(suite, "spec.tasks.[].preprocess")
    [one] = [r for r in rules(node) if "exactly one of `source`" in r.get("message", "")]
    assert one["rule"] == "has(self.source) != has(self.file)"
    assert any("configmap-name/key" in m for m in messages(node))


def test_python_graders_need_code_and_built_ins_none(suite: Schema) -> None:
    for path in ("spec.tasks.[].grader", "spec.tasks.[].graders.[]"):
        node = at(suite, path)
        [one] = [r for r in rules(node) if "a built-in grader has neither" in r["message"]]
        assert one["rule"] == (
            "has(self.type) && self.type != 'python' ? "
            "!has(self.source) && !has(self.file) : has(self.source) != has(self.file)"
        )
        assert any("configmap-name/key" in m for m in messages(node))


def test_dataset_rules(suite: Schema) -> None:
    node = at(suite, "spec.tasks.[].dataset")
    exactly, no_path, cluster_uri, pinned_https = rules(node)
    assert "exactly one of `rows`, `path`, `configMapRef` or `uri`" in exactly["message"]
    assert "configMapRef" in no_path["message"]
    assert no_path["fieldPath"] == ".path"
    assert no_path["reason"] == "FieldValueForbidden"
    assert cluster_uri["rule"] == "!has(self.uri) || self.uri.matches('^(s3|pvc|https)://')"
    assert cluster_uri["fieldPath"] == ".uri"
    assert "sha256" in pinned_https["rule"]
    assert pinned_https["fieldPath"] == ".sha256"


def test_unique_task_ids_and_models(suite: Schema, run: Schema) -> None:
    [unique] = rules(at(suite, "spec.tasks"))
    assert unique["rule"] == "self.all(t, self.exists_one(u, u.id == t.id))"
    assert "unique" in unique["message"]
    [unique_models] = rules(at(run, "spec.models"))
    assert "unique" in unique_models["message"]


def test_run_rules(run: Schema) -> None:
    [providers] = rules(at(run, "spec"))
    assert providers["fieldPath"] == ".models"
    assert "providers" in providers["message"]
    [headers] = rules(at(run, "spec.providers.{}.headers"))
    assert "authorization" in headers["rule"]


def test_extraction_and_outputs_rules(suite: Schema) -> None:
    assert len(rules(at(suite, "spec.tasks.[].extraction"))) == 2
    exactly, no_path, cluster_uri, pinned_https = rules(at(suite, "spec.tasks.[].outputs"))
    assert exactly["message"] == "set exactly one of `column`, `path` or `uri`"
    assert no_path["fieldPath"] == ".path"
    assert cluster_uri["fieldPath"] == ".uri"
    assert pinned_https["fieldPath"] == ".sha256"


# -- status ---------------------------------------------------------------------------------


def test_run_status_schema(run: Schema) -> None:
    status = at(run, "status")
    assert status["x-kubernetes-preserve-unknown-fields"] is True  # kopf's own bookkeeping
    props = status["properties"]
    assert {
        "phase",
        "observedGeneration",
        "suiteVersion",
        "conditions",
        "results",
        "summary",
    } <= set(props)
    assert props["phase"]["enum"] == ["Pending", "Running", "Succeeded", "Failed"]
    assert at(run, "status.results.[].counts.invalid")["type"] == "integer"
    assert at(run, "status.results.[].metrics")["additionalProperties"] == {"type": "number"}


def test_suite_status_schema(suite: Schema) -> None:
    status = at(suite, "status")
    assert status["x-kubernetes-preserve-unknown-fields"] is True
    assert {"observedGeneration", "suiteVersion", "conditions"} <= set(status["properties"])
    assert at(suite, "status.conditions.[].status")["enum"] == ["True", "False", "Unknown"]


# -- cluster-only declarations on the models -------------------------------------------------


def test_cluster_bounds_are_folded_in_and_never_leak(crd: Schema) -> None:
    assert CLUSTER_KEY not in json.dumps(crd)


def test_cluster_bounds_do_not_bind_local_runs(suite: Schema, run: Schema) -> None:
    """`evalkube run` accepts what the CRD's cluster-only bounds refuse."""
    from evalkube.models import EvalRunSpec, TaskSpec, validate_spec

    target = "x" * (at(suite, "spec.tasks.[].target")["maxLength"] + 1)
    stop = "s" * (at(suite, "spec.tasks.[].stop.[]")["maxLength"] + 1)
    source = "#" * (at(suite, "spec.tasks.[].grader.source")["maxLength"] + 1)
    task = validate_spec(
        TaskSpec,
        {
            "id": "t",
            "dataset": {"rows": [{}]},
            "target": target,
            "stop": [stop],
            "grader": {"type": "python", "source": source},
        },
        prefix="task",
    )
    assert (task.target, task.stop, task.criteria[0].source) == (target, [stop], source)
    model = "openai:" + "m" * at(run, "spec.models.[]")["maxLength"]
    spec = validate_spec(
        EvalRunSpec,
        {"models": [model], "providers": {"openai": {"baseURL": "https://example"}}},
        prefix="spec",
    )
    assert spec.models == [model]
    assert spec.suite_ref is None  # required in a cluster only


def test_a_bound_the_model_declares_wins(suite: Schema) -> None:
    # metricId: the model says minLength 1, the cluster adds the maxLength it lacks
    metric = at(suite, "spec.tasks.[].grader.metricId")
    assert (metric["minLength"], metric["maxLength"]) == (1, 253)

    class Bounded(BaseModel):
        name: str = Field(max_length=10, json_schema_extra=cluster(max_length=20, pattern="^a"))

    assert crds.structural_schema(Bounded)["properties"]["name"] == {
        "type": "string",
        "maxLength": 10,
        "pattern": "^a",
    }


def test_rules_of_a_model_and_of_the_field_using_it_both_apply() -> None:
    inner_rule, field_rule = Rule(rule="self.a != ''"), Rule(rule="has(self.a)")

    class Inner(BaseModel):
        model_config = ConfigDict(json_schema_extra=cel(inner_rule) | cluster(required=["b"]))
        a: str = ""

    class Outer(BaseModel):
        inner: Inner | None = Field(default=None, json_schema_extra=cel(field_rule))
        items: list[Annotated[str, Field(json_schema_extra=cluster(max_length=5))]] = Field(
            default_factory=list, json_schema_extra=cluster(max_items=3)
        )

    schema = crds.structural_schema(Outer)
    inner = at(schema, "inner")
    assert rules(inner) == [inner_rule.to_schema(), field_rule.to_schema()]
    assert inner["required"] == ["b"]
    assert inner["nullable"] is True
    assert at(schema, "items")["maxItems"] == 3
    assert at(schema, "items.[]") == {"type": "string", "maxLength": 5}


def test_a_field_of_several_shapes_cannot_carry_a_rule() -> None:
    class Untyped(BaseModel):
        value: str | list[str] = Field(json_schema_extra=cluster(max_length=3))

    with pytest.raises(ValueError, match="several shapes"):
        crds.structural_schema(Untyped)


def test_generation_is_deterministic() -> None:
    first = [crds.render_crd(c) for c in crds.all_crds()]
    second = [crds.render_crd(c) for c in crds.all_crds()]
    assert first == second
    assert first[0].startswith(crds.HEADER)
    assert "do not edit" in crds.HEADER


# -- files and drift ------------------------------------------------------------------------


@pytest.mark.parametrize("directory", ["crds", "charts/evalkube/crds"])
def test_committed_files_match_the_models(directory: str) -> None:
    assert crds.check_crds(ROOT / directory) == [], "run `evalkube crds` and commit the result"


def test_committed_files_parse_as_the_generated_objects() -> None:
    for crd in crds.all_crds():
        text = (ROOT / "crds" / crds.crd_filename(crd)).read_text()
        assert yaml.safe_load(text) == crd


def test_write_then_check(tmp_path: Path) -> None:
    written = crds.write_crds(tmp_path / "out")
    assert [p.name for p in written] == [
        "evalsuites.evalkube.io.yaml",
        "evalruns.evalkube.io.yaml",
        "evalschedules.evalkube.io.yaml",
    ]
    assert crds.check_crds(tmp_path / "out") == []


def test_check_reports_stale_missing_and_stray_files(tmp_path: Path) -> None:
    crds.write_crds(tmp_path)
    stale = tmp_path / "evalruns.evalkube.io.yaml"
    stale.write_text(stale.read_text().replace("maxItems: 50", "maxItems: 51"))
    (tmp_path / "evalsuites.evalkube.io.yaml").unlink()
    (tmp_path / "old.evalkube.io.yaml").write_text("{}")
    problems = crds.check_crds(tmp_path)
    assert len(problems) == 3
    assert "evalsuites.evalkube.io.yaml: missing" in problems[0]
    assert "evalruns.evalkube.io.yaml: out of date" in problems[1]
    assert "maxItems: 51" in problems[1]
    assert "evalkube crds" in problems[1]
    assert "old.evalkube.io.yaml: not generated" in problems[2]


def test_cli_command_writes_and_checks(tmp_path: Path) -> None:
    import typer

    app = typer.Typer()
    app.command("crds")(crds_command)
    app.command("noop")(lambda: None)  # keeps `crds` a subcommand, as in the real CLI
    runner = CliRunner()
    out = tmp_path / "crds"
    result = runner.invoke(app, ["crds", "--check", "--output-dir", str(out)])
    assert result.exit_code == 1
    assert "missing" in result.output
    result = runner.invoke(app, ["crds", "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "evalruns.evalkube.io.yaml",
        "evalschedules.evalkube.io.yaml",
        "evalsuites.evalkube.io.yaml",
    ]
    result = runner.invoke(app, ["crds", "--check", "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    assert "up to date" in result.output


def test_schedule_template_is_an_evalrun_spec_with_its_bounds_and_rules(
    schedule: Schema, run: Schema
) -> None:
    spec = at(schedule, "spec")
    assert sorted(spec["required"]) == ["runTemplate", "schedule"]
    assert at(spec, "concurrencyPolicy")["enum"] == ["Allow", "Forbid", "Replace"]
    assert at(spec, "concurrencyPolicy")["default"] == "Forbid"
    assert at(spec, "startingDeadlineSeconds")["minimum"] == 0
    template = at(spec, "runTemplate.spec")
    assert template["required"] == ["models", "suiteRef"]
    assert at(template, "models")["maxItems"] == 50
    assert rules(template) == rules(at(run, "spec"))
    assert rules(at(template, "models")) == rules(at(run, "spec.models"))


def test_schedule_status_schema(schedule: Schema) -> None:
    status = at(schedule, "status")
    assert set(status["properties"]) >= {
        "lastScheduleTime",
        "lastSuccessfulTime",
        "nextScheduleTime",
        "active",
        "conditions",
    }
    assert set(at(status, "active.[]")["properties"]) == {"name", "uid"}
