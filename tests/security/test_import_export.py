"""``evalkube import openai`` of a hostile export: its ``item_schema`` fetches nothing, reads
no host file, runs no backtracking pattern and no unbounded ``$ref`` fan-out, and every
malformed shape is exit 2 naming the field, never a traceback. Each attack runs the real
command in a child process under a memory ceiling (:mod:`tests.security.bounded`).
"""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.security.bounded import PEAK_RSS_MB, Outcome, run_bounded
from tests.security.conftest import SECRET, Listener

pytestmark = pytest.mark.timeout(300)

FIXTURE = Path(__file__).parent.parent / "fixtures" / "openai_eval_export.json"
EXPORT = json.loads(FIXTURE.read_text())


def _import(tmp_path: Path, export: Any) -> Outcome:
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export))
    return run_bounded("import", "openai", path, "--out", tmp_path / "out", cwd=tmp_path)


def _with_schema(schema: Any, question: str | None = None) -> dict[str, Any]:
    export = copy.deepcopy(EXPORT)
    export["eval"]["data_source_config"]["item_schema"] = schema
    if question is not None:
        for line in export["run"]["data_source"]["source"]["content"]:
            line["item"]["question"] = question
    return export


def _refused(outcome: Outcome, *expected: str) -> None:
    assert outcome.code == 2, (outcome.code, outcome.stderr[-3000:])
    assert "Traceback" not in outcome.stderr, outcome.stderr[-3000:]
    for text in expected:
        assert text in outcome.stderr, outcome.stderr[-3000:]
    assert outcome.peak_rss_mb < PEAK_RSS_MB, outcome.peak_rss_mb


def _ref(target: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"question": {"$ref": target}}}


def test_an_http_ref_is_not_fetched(tmp_path: Path, listener: Listener) -> None:
    outcome = _import(tmp_path, _with_schema(_ref(f"http://127.0.0.1:{listener.port}/s.json")))
    _refused(outcome, "eval.data_source_config.item_schema", "points outside it")
    assert listener.accepted == 0
    assert not (tmp_path / "out" / "suite.yaml").exists()


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A port that completes TCP handshakes (backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def test_an_http_ref_to_a_silent_listener_does_not_hang(
    tmp_path: Path, silent_listener: int
) -> None:
    outcome = _import(tmp_path, _with_schema(_ref(f"http://127.0.0.1:{silent_listener}/s.json")))
    _refused(outcome, "points outside it")


def test_a_file_ref_reads_no_host_file(tmp_path: Path) -> None:
    secret = tmp_path / "credentials.json"
    secret.write_text(json.dumps({"api_key": SECRET}))
    outcome = _import(tmp_path, _with_schema(_ref(f"file://{secret}")))
    _refused(outcome, "points outside it")
    assert SECRET not in outcome.stderr + outcome.stdout


def test_a_dev_zero_ref_is_not_read(tmp_path: Path) -> None:
    _refused(_import(tmp_path, _with_schema(_ref("file:///dev/zero"))), "points outside it")


def test_a_catastrophic_pattern_runs_in_linear_time(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"question": {"pattern": "^(a+)+$"}}}
    outcome = _import(tmp_path, _with_schema(schema, question="a" * 40 + "!"))
    _refused(outcome, "content[0].item['question']", "does not match")


def test_a_catastrophic_pattern_property_runs_in_linear_time(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^(a|aa)+$": {"type": "string"}},
        "additionalProperties": {"type": "string"},
    }
    export = _with_schema(schema)
    export["run"]["data_source"]["source"]["content"][0]["item"]["a" * 40 + "!"] = "x"
    outcome = _import(tmp_path, export)
    assert outcome.code == 0, outcome.stderr[-3000:]
    assert outcome.peak_rss_mb < PEAK_RSS_MB


def test_a_lookahead_pattern_is_refused_naming_where(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"question": {"pattern": "^(?=a)a$"}}}
    _refused(
        _import(tmp_path, _with_schema(schema)),
        "item_schema.properties.question.pattern",
        "linear time",
    )


def test_exponential_ref_fan_out_is_bounded(tmp_path: Path) -> None:
    """Each level refers to the one below four times: 4**15 evaluations, 15 levels deep."""
    defs: dict[str, Any] = {"d0": {"type": "string"}}
    for level in range(1, 16):
        defs[f"d{level}"] = {"allOf": [{"$ref": f"#/$defs/d{level - 1}"}] * 4}
    question = {"$ref": "#/$defs/d15"}
    schema = {"$defs": defs, "type": "object", "properties": {"question": question}}
    _refused(_import(tmp_path, _with_schema(schema)), "item_schema", "schema steps")


def test_a_recursive_ref_is_bounded(tmp_path: Path) -> None:
    schema = {"$defs": {"loop": {"$ref": "#/$defs/loop"}}, "$ref": "#/$defs/loop"}
    _refused(_import(tmp_path, _with_schema(schema)), "nests deeper")


def _enum_fan_out(values: int, fan: int = 100) -> dict[str, Any]:
    """Every item gets ``fan`` tags, each checked against one ``values``-entry enum through
    ``items: {$ref}``; each tag is the enum's last value (the whole enum is walked)."""
    schema = {
        "$defs": {"tag": {"enum": list(range(values))}},
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}}},
    }
    export = _with_schema(schema)
    for line in export["run"]["data_source"]["source"]["content"]:
        line["item"]["tags"] = [values - 1] * fan
    return export


def test_a_huge_enum_is_refused_naming_it(tmp_path: Path) -> None:
    """100,000 values walked 100 times an item took 5 s an item, and was not refused."""
    _refused(
        _import(tmp_path, _enum_fan_out(100_000)),
        "item_schema.$defs.tag.enum: 100,000 values; an enum may hold at most 10,000",
    )


def test_enum_fan_out_is_charged_by_the_enum_size(tmp_path: Path) -> None:
    """An enum of the largest size allowed, reached 100 times an item, runs out of steps."""
    _refused(_import(tmp_path, _enum_fan_out(10_000)), "item_schema", "schema steps")


def test_an_enum_or_const_of_too_many_bytes_is_refused_naming_it(tmp_path: Path) -> None:
    big = "x" * (1024 * 1024)
    schema = {"type": "object", "properties": {"question": {"const": big}}}
    _refused(
        _import(tmp_path, _with_schema(schema, question=big)),
        "item_schema.properties.question.const: 1,048,578 bytes of JSON",
    )
    schema = {"type": "object", "properties": {"question": {"enum": [big[:500_000]] * 3}}}
    _refused(
        _import(tmp_path, _with_schema(schema)),
        "item_schema.properties.question.enum: 1,500,010 bytes of JSON",
    )


def test_a_small_enum_and_const_still_import(tmp_path: Path) -> None:
    content = EXPORT["run"]["data_source"]["source"]["content"]
    questions = [line["item"]["question"] for line in content]
    schema = {
        "type": "object",
        "properties": {"question": {"enum": ["other", *questions]}, "kind": {"const": "qa"}},
    }
    export = _with_schema(schema)
    for line in export["run"]["data_source"]["source"]["content"]:
        line["item"]["kind"] = "qa"
    outcome = _import(tmp_path, export)
    assert outcome.code == 0, outcome.stderr[-3000:]


def _set(export: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(export)
    node = changed
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return changed


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("eval",), [], "eval: expected the eval object (an object)"),
        (("eval", "data_source_config"), "x", "eval.data_source_config: expected an object"),
        (("eval", "testing_criteria"), {"a": 1}, "eval.testing_criteria: expected a list"),
        (("eval", "testing_criteria", 0), "string_check", "eval.testing_criteria[0]: expected"),
        (("eval", "testing_criteria", 0, "type"), 7, "eval.testing_criteria[0].type"),
        (
            ("run", "data_source", "source"),
            [1],
            "run.data_source.source: expected {type, content} (an object)",
        ),
        (("run", "data_source", "source", "content"), "x", "run.data_source.source.content"),
        (("run", "data_source", "input_messages"), "x", "run.data_source.input_messages"),
        (("run", "data_source", "input_messages", "template"), 3, "input_messages.template"),
        (("run", "data_source", "sampling_params"), [], "run.data_source.sampling_params"),
        (("eval", "data_source_config", "item_schema"), "x", "item_schema: expected"),
    ],
)
def test_a_malformed_export_names_the_field(
    tmp_path: Path, path: tuple[Any, ...], value: Any, named: str
) -> None:
    _refused(_import(tmp_path, _set(EXPORT, path, value)), named)


def test_an_export_nested_too_deeply_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "export.json"
    path.write_text('{"eval": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _refused(run_bounded("import", "openai", path, "--out", tmp_path / "out"), "nests too deeply")


def test_an_export_that_is_dev_zero_is_refused(tmp_path: Path) -> None:
    _refused(
        run_bounded("import", "openai", "/dev/zero", "--out", tmp_path / "out"),
        "character device",
    )
