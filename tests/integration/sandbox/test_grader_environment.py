"""The grader environment for real: OpenAI's packages import in every backend, read-only,
after the standard library, and only for the graders that ask.

The managed environment must exist (``make grader-env``): skipped without it locally, a
failure under CI (``.ci/grader-env.sh`` runs in ``make setup``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evalkube.sandbox import GraderSandbox, SandboxBackend
from evalkube.sandbox.environment import (
    INSIDE_ENVIRONMENT,
    LocalEnvironment,
    default_dir,
    default_site_packages,
)
from tests.conftest import require
from tests.integration.sandbox.support import BACKENDS, ISOLATING, backend, grader, run

#: OpenAI's docs example grader (python grader, "fuzzy match"), unchanged.
OPENAI_DOCS_GRADER = """from rapidfuzz import fuzz, utils

def grade(sample, item) -> float:
    output_text = sample["output_text"]
    reference_answer = item["reference_answer"]
    return fuzz.WRatio(output_text, reference_answer, processor=utils.default_process) / 100.0
"""
PAIRS = [
    ("The Eiffel Tower", "eiffel tower!"),
    ("Paris is the capital of France", "paris"),
    ("completely different", "Mount Kilimanjaro"),
]
#: The import names of the package set of OpenAI's python-grader image (2025-05-08).
PACKAGES = [
    "numpy",
    "scipy",
    "sympy",
    "pandas",
    "rapidfuzz",
    "sklearn",
    "rouge_score",
    "deepdiff",
    "jsonschema",
    "pydantic",
    "yaml",
    "nltk",
    "sqlparse",
    "rdkit",
    "skbio",
    "ast_grep_py",
]


@pytest.fixture(scope="module")
def site_packages() -> Path:
    found = default_site_packages()
    if found is None:
        require(f"the grader environment ({default_dir()}): run `make grader-env`")
        pytest.skip(f"the grader environment is not created ({default_dir()}): make grader-env")
    return found


def _in_process(site: Path) -> list[float]:
    """The values rapidfuzz computes outside any sandbox (a plain interpreter)."""
    code = (
        "import json, sys; sys.path.append(sys.argv[1]); from rapidfuzz import fuzz, utils; "
        "print(json.dumps([fuzz.WRatio(a, b, processor=utils.default_process) / 100.0 "
        f"for a, b in {PAIRS!r}]))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(site)],
        capture_output=True,
        text=True,
        check=True,
    )
    values: list[float] = json.loads(out.stdout)
    return values


def _grade_pairs(sandbox_backend: SandboxBackend, source: str) -> list[Any]:
    sandbox = GraderSandbox(sandbox_backend, grader(source), task_id="t", load_timeout=60)
    sandbox.start()
    try:
        items = (
            ([{"output_text": a}, {"reference_answer": b}], f"e{i}")
            for i, (a, b) in enumerate(PAIRS)
        )
        executions = list(sandbox.execute("grader", items, timeout=60))
    finally:
        sandbox.close()
    assert [e.status for e in executions] == ["returned"] * len(PAIRS), executions
    return [e.value for e in executions]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", BACKENDS)
def test_openai_docs_fuzzy_grader_runs_unchanged(name: str, site_packages: Path) -> None:
    values = _grade_pairs(backend(name), OPENAI_DOCS_GRADER)
    assert values == _in_process(site_packages)
    assert values[0] == 0.95


# -- each package imports in the sandbox (one gVisor worker for all) -----------------------------
IMPORTER = """
import importlib, sys

def grade(sample, item):
    module = importlib.import_module(sample)
    return {"scores": {"imported": 1.0}, "judge": {"file": module.__file__}}
"""


@pytest.fixture(scope="module")
def importer(site_packages: Path) -> Iterator[GraderSandbox]:
    sandbox = GraderSandbox(backend("gvisor"), grader(IMPORTER), task_id="t", load_timeout=60)
    sandbox.start()
    yield sandbox
    sandbox.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module", PACKAGES)
def test_package_imports_in_the_gvisor_sandbox(module: str, importer: GraderSandbox) -> None:
    (execution,) = importer.execute("grader", [([module, 0], None)], timeout=60)
    assert execution.status == "returned", execution.error
    assert execution.value["judge"]["file"].startswith(f"{INSIDE_ENVIRONMENT}/{module}/")


# -- lazy, after the stdlib, read-only -----------------------------------------------------------
PATH_PROBE = """
import sys

def grade(sample, item):
    loaded = sorted(
        name for name, m in list(sys.modules.items())
        if str(getattr(m, "__file__", "") or "").startswith("/opt/evalkube-env")
    )
    return {"scores": {"s": 1.0}, "judge": {"path": sys.path, "loaded": loaded}}
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ISOLATING)
def test_the_environment_is_last_on_sys_path_and_nothing_is_imported_from_it(
    name: str, site_packages: Path
) -> None:
    (execution,), _ = run(backend(name), PATH_PROBE, ["x"])
    judge = execution.value["judge"]
    assert judge["loaded"] == []
    assert judge["path"][-1] == INSIDE_ENVIRONMENT
    assert any(p.endswith("lib-dynload") for p in judge["path"][:-1])  # the stdlib before it


WRITER = """
import os

def grade(sample, item):
    import rapidfuzz  # the environment is there
    wrote = []
    for path in ("/opt/evalkube-env/pwned", "/opt/evalkube-env/rapidfuzz/__init__.py"):
        try:
            with open(path, "a") as f:
                f.write("pwned")
            wrote.append(path)
        except OSError:
            pass
    try:
        os.mkdir("/opt/evalkube-env/pwned-dir")
        wrote.append("mkdir")
    except OSError:
        pass
    return {"scores": {"wrote": float(len(wrote))}, "judge": {"wrote": wrote}}
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ISOLATING)
def test_a_grader_cannot_write_into_the_environment(name: str, site_packages: Path) -> None:
    init = site_packages / "rapidfuzz" / "__init__.py"
    before = init.read_bytes()
    (execution,), _ = run(backend(name), WRITER, ["x"])
    assert execution.status == "returned", execution.error
    assert execution.value["judge"]["wrote"] == []
    assert init.read_bytes() == before
    assert not (site_packages / "pwned").exists()
    assert not (site_packages / "pwned-dir").exists()


# -- another environment for a task ---------------------------------------------------------------
@pytest.mark.timeout(60)
def test_stdlib_environment_has_no_packages(site_packages: Path) -> None:
    sandbox = GraderSandbox(
        backend("gvisor"),
        grader(OPENAI_DOCS_GRADER),
        task_id="t",
        load_timeout=60,
        environment=LocalEnvironment(None),
    )
    with pytest.raises(Exception, match="rapidfuzz"):
        sandbox.start()
    sandbox.close()


OWN_MODULE = """
import evalkube_test_own_env

def grade(sample, item):
    return evalkube_test_own_env.VALUE
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["gvisor", "process"])
def test_a_task_can_name_its_own_package_directory(name: str, tmp_path: Path) -> None:
    own = tmp_path / "target"
    own.mkdir()
    (own / "evalkube_test_own_env.py").write_text("VALUE = 0.25\n")
    for path in (tmp_path, own, own / "evalkube_test_own_env.py"):
        os.chmod(path, 0o755)
    sandbox = GraderSandbox(
        backend(name),
        grader(OWN_MODULE),
        task_id="t",
        load_timeout=60,
        environment=LocalEnvironment(own),
    )
    sandbox.start()
    try:
        (execution,) = sandbox.execute("grader", [(["x", 0], None)], timeout=30)
    finally:
        sandbox.close()
    assert (execution.status, execution.value) == ("returned", 0.25)


THREADS = """
import threading
import numpy
from threadpoolctl import threadpool_info

def grade(sample, item):
    return {
        "scores": {"s": 1.0},
        "judge": {
            "pools": [p["num_threads"] for p in threadpool_info()],
            "threads": threading.active_count(),
        },
    }
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", BACKENDS)
def test_numpy_starts_one_blas_thread_whatever_the_host_cpus(
    name: str, site_packages: Path
) -> None:
    (execution,), _ = run(backend(name), THREADS, ["x"], timeout=30)
    assert execution.status == "returned", execution.error
    assert execution.value["judge"]["pools"]
    assert set(execution.value["judge"]["pools"]) == {1}


# -- nltk's data: what OpenAI's python-grader image shipped, offline ------------------------------
NLTK_GRADER = """
import nltk
from nltk.corpus import stopwords, wordnet
from nltk.stem import WordNetLemmatizer

def grade(sample, item):
    words = nltk.word_tokenize(sample)
    return {"scores": {"s": 1.0}, "judge": {
        "tokens": words,
        "sentences": nltk.sent_tokenize(sample),
        "content": [w for w in words if w.lower() not in stopwords.words("english")],
        "dog": wordnet.synsets("dog")[0].name(),
        "geese": WordNetLemmatizer().lemmatize("geese"),
        "version": wordnet.get_version(),
        "languages": len(stopwords.fileids()),
    }}
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", BACKENDS)
def test_nltk_stopwords_punkt_and_wordnet_work_offline(name: str, site_packages: Path) -> None:
    """punkt (punkt_tab), stopwords and wordnet, as graders of OpenAI's image used them; no
    sandbox has a network, so nltk's downloader could not fetch them."""
    text = "Mr. Smith saw the geese. They were not his."
    (execution,), _ = run(backend(name), NLTK_GRADER, [text], timeout=60)
    assert execution.status == "returned", execution.error
    judge = execution.value["judge"]
    assert judge["sentences"] == ["Mr. Smith saw the geese.", "They were not his."]
    assert judge["tokens"][:3] == ["Mr.", "Smith", "saw"]
    assert judge["content"] == ["Mr.", "Smith", "saw", "geese", ".", "."]
    assert (judge["dog"], judge["geese"], judge["version"]) == ("dog.n.01", "goose", "3.0")
    assert judge["languages"] >= 29
