"""`field_paths`: the row fields a template always reads, so validate and the importer can
check them against the rows before a run makes every sample invalid."""

from __future__ import annotations

import pytest

from evalkube.grading.template_fields import field_paths, missing, spelled


@pytest.mark.parametrize(
    ("source", "paths"),
    [
        ("{{ item.answer }}", [("item", ("answer",))]),
        ("{{ item.meta.lang }} {{ item['meta'].lang }}", [("item", ("meta", "lang"))]),
        ("{{ item.choices[0] }}", [("item", ("choices", 0))]),
        ("{{ sample.output_json.city }}", [("sample", ("output_json", "city"))]),
        ("{{ item.a | default('x') }}", []),  # guarded: optional
        ("{% if item.a is defined %}{{ item.a.b }}{% endif %}", []),
        ("{% for m in item.msgs %}{{ m.content }}{% endfor %}", [("item", ("msgs",))]),
        ("{{ item[item.key] }}", [("item", ("key",))]),  # a computed key: only what is known
        ("{{ other.x }} {{ item }}", []),
        ("{{ item.a", []),  # does not parse: its compile error says why
    ],
)
def test_field_paths(source: str, paths: list[tuple[str, tuple[object, ...]]]) -> None:
    assert field_paths(source, ("item", "sample")) == paths


def test_missing_names_the_first_absent_part() -> None:
    row = {"meta": {"lang": "fr"}, "choices": ["a"]}
    assert missing(row, ("meta", "lang")) is None
    assert missing(row, ("meta", "region")) == "meta.region"
    assert missing(row, ("answer",)) == "answer"
    assert missing(row, ("choices", 0)) is None
    assert missing(row, ("choices", 3)) == "choices.3"
    assert spelled("item", ("choices", 0, "text")) == "item.choices[0].text"
