"""``grader.environment``: what it accepts, what a local run mounts, what a cluster refuses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from evalkube.controller.snapshot import ImagePolicy, check_suite
from evalkube.models import EvalSuite, SpecError, validate_spec
from evalkube.sandbox import environment
from evalkube.sandbox.environment import EnvironmentProblem, cluster_image, resolve_local


def _suite(env: object) -> dict[str, object]:
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "s"},
        "spec": {
            "tasks": [
                {
                    "id": "t",
                    "prompt": "{{ item.q }}",
                    "dataset": {"rows": [{"q": "a"}]},
                    "grader": {
                        "type": "python",
                        "source": "def grade(sample, item):\n    return 1.0\n",
                        "environment": env,
                    },
                }
            ]
        },
    }


@pytest.mark.parametrize(
    "value",
    [
        "default",
        "stdlib",
        "/opt/venv",
        "./env",
        "~/env",
        "ghcr.io/acme/graders:1.2",
        "localhost:5000/g@sha256:" + "a" * 64,
    ],
)
def test_accepted_values(value: str) -> None:
    suite = validate_spec(EvalSuite, _suite(value), prefix="")
    assert suite.spec.tasks[0].grader.environment == value


@pytest.mark.parametrize("value", ["Not An Image", "", "UPPER/case", 3, "/a:b", "./my env"])
def test_a_bad_value_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(SpecError) as exc:
        validate_spec(EvalSuite, _suite(value), prefix="")
    assert "spec.tasks[0].grader.environment" in str(exc.value)


def test_default_and_stdlib_locally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALKUBE_GRADER_ENV_CACHE", str(tmp_path))
    environment.default_site_packages.cache_clear()
    try:
        assert resolve_local("stdlib").site_packages is None
        assert resolve_local(None).site_packages is None  # not created: the stdlib only
        made = tmp_path / environment.lock_key()
        (made / "site-packages").mkdir(parents=True)
        (made / ".complete").touch()
        environment.default_site_packages.cache_clear()
        assert resolve_local("default").site_packages == made / "site-packages"
    finally:
        environment.default_site_packages.cache_clear()


def test_a_path_is_a_target_dir_or_a_venv_relative_to_the_suite(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    assert resolve_local("./target", base=tmp_path).site_packages == target
    venv_site = tmp_path / "venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    (venv_site / "site-packages").mkdir(parents=True)
    assert resolve_local(str(tmp_path / "venv")).site_packages == venv_site / "site-packages"


def test_local_problems_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentProblem, match=r"tasks\[t\]\.grader\.environment: .*cluster"):
        resolve_local("ghcr.io/acme/graders:1", field="tasks[t].grader.environment")
    with pytest.raises(EnvironmentProblem, match=r"tasks\[t\]\.grader\.environment: .*not a dir"):
        resolve_local(str(tmp_path / "nope"), field="tasks[t].grader.environment")


def test_a_cluster_refuses_a_local_directory() -> None:
    with pytest.raises(EnvironmentProblem, match=r"grader\.environment"):
        cluster_image("/opt/venv", "sandbox:1", field="tasks[t].grader.environment")
    assert cluster_image("stdlib", "sandbox:1", field="f") == "sandbox:1"
    check = check_suite("ns", _suite("/opt/venv")["spec"], lambda ns, cm, key: None)  # type: ignore[arg-type]
    assert any("spec.tasks[0].grader.environment" in p for p in check.problems)


def test_a_cluster_admits_only_the_sandbox_image_and_the_platforms_patterns() -> None:
    """An image's own python3 supervises the grader: a suite cannot bring one the platform
    did not admit (its supervisor would drop the memory, process and log limits)."""
    policy = ImagePolicy("reg.local/evalkube-sandbox:1", ("reg.local/evals/*",))

    def problems(environment: str) -> list[str]:
        spec = _suite(environment)["spec"]
        return check_suite("ns", spec, lambda ns, cm, key: None, policy).problems  # type: ignore[arg-type]

    for admitted in ("default", "stdlib", "reg.local/evalkube-sandbox:1", "reg.local/evals/nlp:2"):
        assert problems(admitted) == [], admitted
    refused = problems("docker.io/attacker/python:3")
    assert len(refused) == 1
    assert "spec.tasks[0].grader.environment: image 'docker.io/attacker/python:3'" in refused[0]
    assert "work.graderImages" in refused[0]
    # a client that does not know the operator's policy (submit --dry-run) checks no image
    assert check_suite("ns", _suite("docker.io/x:1")["spec"], lambda ns, cm, key: None).ok  # type: ignore[arg-type]
