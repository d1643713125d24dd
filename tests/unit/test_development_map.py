"""docs/development.md's map of a sample's path names real code: every dotted
``evalkube...`` name in it resolves, so the page fails here when code moves."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "development.md"


def path_section() -> str:
    text = DOC.read_text()
    start = text.index("## A sample's path: from a YAML row to EvalRun status")
    return text[start : text.index("\n## ", start + 1)]


NAMES = sorted(set(re.findall(r"`(evalkube(?:_sandbox)?(?:\.\w+)+)`", path_section())))


def resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            target = getattr(target, attribute)
        return target
    raise ModuleNotFoundError(dotted)


def test_the_path_names_each_step() -> None:
    assert len(NAMES) >= 25


@pytest.mark.parametrize("dotted", NAMES)
def test_every_name_on_the_path_exists(dotted: str) -> None:
    resolve(dotted)
