"""The scratch wipe (:mod:`evalkube_sandbox.hygiene`) against a sample that pre-creates the
names the wipe moves directories to: whatever names a sample made, the wipe empties the
directory (the same attacks against a real sandbox: ``tests/security/test_scratch_wipe.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evalkube_sandbox import hygiene
from evalkube_sandbox.hygiene import verify, wipe

#: Layouts a sample leaves: paths of files (directories made on the way); ``/`` at the end:
#: an empty directory.
COLLISIONS = {
    # the reported attack: moving Z up to ``.evalkube-wipe-1`` targets Z's own parent
    "own_parent": [".evalkube-wipe-1/Z/big"],
    "own_parent_0_to_5": [f".evalkube-wipe-{n}/Z/big" for n in range(6)],
    "nested_names": [".evalkube-wipe-1/.evalkube-wipe-2/.evalkube-wipe-1/Z/big"],
    "names_taken_by_files": ["d/Z/big", *[f".evalkube-wipe-{n}" for n in range(6)]],
    "names_taken_by_full_directories": [
        "d/Z/big",
        *[f".evalkube-wipe-{n}/keep/x" for n in range(6)],
    ],
    "names_taken_by_empty_directories": ["d/Z/big", *[f".evalkube-wipe-{n}/" for n in range(6)]],
    "wide_and_deep": [f".evalkube-wipe-{n}/{'Z/' * 20}big" for n in range(12)],
}


def _build(root: Path, paths: list[str]) -> None:
    for relative in paths:
        path = root / relative
        if relative.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 4096)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    directory = tmp_path / "scratch"
    directory.mkdir()
    return directory


@pytest.mark.parametrize("layout", sorted(COLLISIONS))
def test_names_a_sample_made_cannot_stop_the_wipe(scratch: Path, layout: str) -> None:
    _build(scratch, COLLISIONS[layout])
    wipe(str(scratch))
    assert os.listdir(scratch) == []
    assert verify(str(scratch)) is None


@pytest.mark.parametrize("layout", sorted(COLLISIONS))
def test_unwritable_colliding_directories_are_wiped(scratch: Path, layout: str) -> None:
    _build(scratch, COLLISIONS[layout])
    for dirpath, dirnames, _ in os.walk(scratch, topdown=False):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o500)
    wipe(str(scratch))
    assert os.listdir(scratch) == []


def test_the_staging_name_a_sample_guessed_is_wiped_not_used(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample that made the staging directory's name first (a file, then a full directory)
    does not get its entry used as the staging place: the wipe picks another name."""
    guessed = [".evalkube-wipe-guess-file", ".evalkube-wipe-guess-dir", ".evalkube-wipe-mine"]
    names = iter(guessed)
    monkeypatch.setattr(hygiene, "_staging_name", lambda: next(names))
    _build(scratch, [guessed[0], f"{guessed[1]}/Z/big", "d/Z/big", ".evalkube-wipe-1/Z/big"])
    wipe(str(scratch))
    assert os.listdir(scratch) == []


def test_without_a_staging_directory_the_wipe_still_finds_free_names(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The staging directory cannot be made (the scratch filesystem is full): directories are
    moved up under names checked to be free, even when the sample took them first (here the
    names are made predictable: ``.evalkube-wipe-1``, ``-2``, ...)."""
    monkeypatch.setattr(hygiene, "_make_staging", lambda root: None)
    monkeypatch.setattr(hygiene, "_staging_name", lambda: ".evalkube-wipe")
    layouts = ("own_parent_0_to_5", "nested_names", "wide_and_deep")
    _build(scratch, [path for layout in layouts for path in COLLISIONS[layout]])
    wipe(str(scratch))
    assert os.listdir(scratch) == []


def test_a_mount_point_is_left_for_verify_to_report(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What cannot be removed stays (here a directory that refuses removal) and the wipe
    ends; verify names it."""
    _build(scratch, ["stuck/x", ".evalkube-wipe-1/Z/big"])
    rmdir = os.rmdir

    def refuse(path: str, *, dir_fd: int | None = None) -> None:
        if path == "stuck":
            raise OSError(16, "Device or resource busy")
        rmdir(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "rmdir", refuse)
    wipe(str(scratch))
    monkeypatch.undo()
    assert os.listdir(scratch) == ["stuck"]
    assert "could not be removed" in (verify(str(scratch)) or "")


UNAUDITED = """
import os, sys
sys.path.insert(0, sys.argv[1])
from evalkube_sandbox.hygiene import Hygiene

hygiene = Hygiene(None)
hygiene.install()
os.mkfifo(sys.argv[2] + "/fifo")
fifo = hygiene.dirty
hygiene.dirty = False
import posix
posix.mkfifo(sys.argv[2] + "/fifo2")
fifo = fifo and hygiene.dirty
hygiene.dirty = False
import socket
socket.socket(socket.AF_UNIX).bind(sys.argv[2] + "/sock")
fifo = fifo and hygiene.dirty
hygiene.dirty = False
import _posixsubprocess
try:
    _posixsubprocess.fork_exec()  # called directly: no audit event says a process starts
except TypeError:
    pass
print(fifo, hygiene.dirty)
"""


def test_calls_that_raise_no_audit_event_still_mark_the_sample(tmp_path: Path) -> None:
    """A FIFO, a device node or ``_posixsubprocess.fork_exec`` called directly leave state
    behind without any audit event: the worker must still clean after such a sample."""
    package = Path(__file__).parents[3] / "sandbox_image"
    done = subprocess.run(
        [sys.executable, "-I", "-c", UNAUDITED, str(package), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == ["True", "True"], done.stderr
