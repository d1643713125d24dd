"""docs/development.md's map names real code: every package and root module of ``evalkube``
sits in one row of its table of layers, in the layer pyproject.toml's import contract gives
it, and every dotted ``evalkube...`` name of a sample's path resolves; so the page fails here
when code moves."""

from __future__ import annotations

import importlib
import re
import tomllib
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


PACKAGE = DOC.parents[1] / "operator" / "evalkube"


def _layers_of_the_contract() -> dict[str, int]:
    """Root package or module -> its layer (highest first, as the contract lists them)."""
    config = tomllib.loads((DOC.parents[1] / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    found: dict[str, int] = {}
    for depth, layer in enumerate(contract["layers"]):
        for name in re.split(r"[|:]", layer):
            found[name.strip().removeprefix("evalkube.")] = len(contract["layers"]) - depth
    return found


def _layers_of_the_table() -> dict[str, int]:
    text = DOC.read_text()
    table = text[text.index("| layer | package |") : text.index("## A sample's path")]
    found: dict[str, int] = {}
    for row in table.splitlines()[2:]:
        cells = row.split(" | ")
        if len(cells) < 3 or not cells[0].lstrip("| ").isdigit():
            continue
        for name in re.findall(r"`(\w+)`", cells[1]):
            found[name] = int(cells[0].lstrip("| "))
    return found


def test_every_package_is_in_the_contract_and_the_table_in_the_same_layer() -> None:
    root = {
        path.stem
        for path in PACKAGE.iterdir()
        if (path.suffix == ".py" or (path / "__init__.py").is_file()) and path.name != "__init__.py"
    }
    contract, table = _layers_of_the_contract(), _layers_of_the_table()
    assert root - set(contract) == set(), "root modules the import contract does not layer"
    assert root - set(table) == set(), "root modules docs/development.md does not map"
    assert table == {name: contract[name] for name in table}
