"""Which runsc evalkube accepts: its version is read from ``runsc --version`` and compared
with the project's gVisor pin, so a runsc years behind upstream is refused, not used."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evalkube.sandbox import runsc

PIN = Path(__file__).parents[2] / "cluster" / "tools" / "gvisor" / "go.mod"


def test_the_minimum_date_is_the_pinned_gvisor() -> None:
    pinned = re.search(r"gvisor\.dev/gvisor v0\.0\.0-(\d{8})\d{6}-", PIN.read_text())
    assert pinned is not None
    assert pinned.group(1) == runsc.MIN_RUNSC_DATE


@pytest.mark.parametrize(
    ("output", "text", "date", "outdated"),
    [
        (
            "runsc version release-20221219.0\nspec: 1.0.2-dev\n",
            "release-20221219.0",
            "20221219",
            True,
        ),
        (
            "runsc version v0.0.0-20260527191743-a81fd9dd382e\nspec: 1.1.0\n",
            "v0.0.0-20260527191743-a81fd9dd382e",
            "20260527",
            False,
        ),
        ("runsc version release-20261102.0\n", "release-20261102.0", "20261102", False),
        ("runsc version VERSION_MISSING\n", "VERSION_MISSING", None, True),
        ("", "no version", None, True),
    ],
)
def test_the_version_and_its_date_are_read(
    output: str, text: str, date: str | None, outdated: bool
) -> None:
    version = runsc.parse_version(output)
    assert (version.text, version.date, version.outdated) == (text, date, outdated)


def test_an_outdated_runsc_is_named_with_what_to_install() -> None:
    reason = runsc.outdated_reason(
        "/usr/bin/runsc", runsc.parse_version("runsc version release-20221219.0")
    )
    assert "/usr/bin/runsc (release-20221219.0, 2022-12-19)" in reason
    assert "older than the gVisor evalkube requires (2026-05-27)" in reason
    assert "make sandboxes" in reason
    assert "EVALKUBE_RUNSC" in reason


def test_evalkube_runsc_chooses_the_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "runsc"
    fake.write_text("#!/bin/sh\necho 'runsc version release-20221219.0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("EVALKUBE_RUNSC", str(fake))
    assert runsc.runsc_path() == str(fake)
    assert runsc.runsc_version(str(fake)).outdated
    monkeypatch.setenv("EVALKUBE_RUNSC", str(tmp_path / "missing"))
    assert runsc.runsc_path() is None


def test_a_platform_must_be_one_gvisor_has(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALKUBE_GVISOR_PLATFORM", "ptrace")
    assert runsc.requested_platform() == "ptrace"
    monkeypatch.setenv("EVALKUBE_GVISOR_PLATFORM", "qemu")
    with pytest.raises(ValueError, match="EVALKUBE_GVISOR_PLATFORM='qemu': choose one of systrap"):
        runsc.requested_platform()
    monkeypatch.delenv("EVALKUBE_GVISOR_PLATFORM")
    assert runsc.requested_platform() is None
