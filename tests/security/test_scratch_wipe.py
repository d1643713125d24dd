"""A sample cannot leave the scratch directory (the sandbox's private ``/tmp``) full or
non-empty for the next one, whatever it does to it, on every backend, in ``isolation: unit``
and ``sample``.

Each attack fills the scratch filesystem and then makes what it wrote hard to remove:
directories made unwritable (``chmod 0500``) and unreadable (``000``), a tree deeper than
``PATH_MAX``, a file with many hard links, the names the wipe itself moves directories to
taken first (``.evalkube-wipe-1/Z/<file>``), a deleted file the worker process itself keeps
open (``unit`` only: a sample process dies with its descriptors). Every later sample must
find the directory empty and at full capacity, and write and read 8 MB there; an attack
whose leftovers cannot be wiped (the held-open file) gets its sandbox replaced (a restart).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.sandbox.support import BACKENDS, backend, run

pytestmark = pytest.mark.timeout(300)

ATTACKS = {
    "chmod_0500": """
    os.mkdir("d")
    fill("d/blob")
    os.chmod("d", 0o500)
""",
    "chmod_000_nested": """
    os.makedirs("a/b/c")
    fill("a/b/c/blob")
    for path in ("a/b/c", "a/b", "a"):
        os.chmod(path, 0)
""",
    "deeper_than_path_max": """
    fd = os.open(".", os.O_RDONLY)
    for level in range(3000):            # 3000 x 2 characters: past PATH_MAX (4096)
        os.mkdir("n", dir_fd=fd)
        inner = os.open("n", os.O_RDONLY, dir_fd=fd)
        if level == 2999:
            with open(os.open("blob", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=inner), "wb") as f:
                fill_handle(f)
        os.close(fd)
        fd = inner
    os.close(fd)
    os.chmod("n", 0o500)
""",
    # the wipe's own staging names taken first: moving Z up to ``.evalkube-wipe-1`` would
    # target Z's own parent, so Z (and the file filling the scratch) would stay
    "wipe_names_taken": """
    for n in range(6):
        os.makedirs(f".evalkube-wipe-{n}/Z")
        with open(f".evalkube-wipe-{n}/Z/small", "wb") as handle:
            handle.write(b"z")
    fill(".evalkube-wipe-1/Z/big")
""",
    "wipe_names_taken_nested": """
    os.makedirs(".evalkube-wipe-1/.evalkube-wipe-2/.evalkube-wipe-1/Z")
    for n in range(6):
        if not os.path.exists(f".evalkube-wipe-{n}"):
            open(f".evalkube-wipe-{n}", "wb").close()
    fill(".evalkube-wipe-1/.evalkube-wipe-2/.evalkube-wipe-1/Z/big")
    os.chmod(".evalkube-wipe-1/.evalkube-wipe-2", 0o500)
""",
    "hard_links": """
    os.mkdir("h")
    fill("h/blob")
    for n in range(200):
        os.link("h/blob", f"h/link{n}")
    os.chmod("h", 0o500)
""",
}
#: The scratch directory itself made read-only (on bwrap and nsjail the sample's user owns
#: it; under gVisor it is root's and the chmod is refused): found by an attacker review. Every
#: later sample could not write there, and in a pod (whose ``/tmp`` outlives a replaced
#: worker) neither could the rest of the unit.
SCRATCH_READ_ONLY = """
    try:
        os.chmod(".", 0o500)
    except OSError:
        pass
"""
HELD_OPEN = """
    import builtins
    handle = open("held", "wb")
    fill_handle(handle)
    os.unlink("held")
    builtins._evalkube_test_keep = handle   # the worker process keeps it (unit isolation)
"""
GRADER = """
import os

def fill_handle(handle):
    block = b"x" * (1 << 20)
    try:
        while True:
            handle.write(block)
            handle.flush()
    except OSError:
        pass

def fill(path):
    with open(path, "wb") as handle:
        fill_handle(handle)

def grade(sample, item):
    if sample == "attack":
{attack}
        return 1.0
    usage = os.statvfs(".")
    state = {{
        "entries": float(len(os.listdir("."))),
        "free": float(usage.f_bfree == usage.f_blocks),
    }}
    with open("probe", "wb") as handle:
        handle.write(b"y" * (8 << 20))
    with open("probe", "rb") as handle:
        state["wrote"] = float(len(handle.read()) == 8 << 20)
    os.unlink("probe")
    return {{"scores": state}}
"""
CLEAN = {"entries": 0.0, "free": 1.0, "wrote": 1.0}
SAMPLES = ["check", "attack", "check", "check"]


def _grader(attack: str) -> str:
    return GRADER.format(attack="\n".join("    " + line for line in attack.splitlines()))


def _checks(name: str, attack: str, isolation: str) -> tuple[list[Any], int]:
    executions, restarts = run(
        backend(name), _grader(attack), SAMPLES, timeout=60, isolation=isolation
    )
    assert [e.status for e in executions] == ["returned"] * len(SAMPLES), [
        e.error for e in executions
    ]
    assert executions[1].value == 1.0
    values = [e.value["scores"] for i, e in enumerate(executions) if i != 1]
    return values, restarts


@pytest.mark.parametrize("isolation", ["unit", "sample"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("name", BACKENDS)
def test_every_later_sample_finds_the_scratch_empty_and_free(
    name: str, attack: str, isolation: str
) -> None:
    values, _ = _checks(name, ATTACKS[attack], isolation)
    for value in values:
        if name == "process":  # the host's own disk: capacity is not the sandbox's
            value = {**value, "free": 1.0}
        assert value == CLEAN


@pytest.mark.parametrize("isolation", ["unit", "sample"])
@pytest.mark.parametrize("name", [b for b in BACKENDS if b != "process"])
def test_a_scratch_directory_made_read_only_is_writable_again_for_the_next_sample(
    name: str, isolation: str
) -> None:
    values, restarts = _checks(name, SCRATCH_READ_ONLY, isolation)
    assert values == [CLEAN] * 3
    assert restarts == 0  # the sweep gives the directory its mode back: no fresh sandbox


@pytest.mark.parametrize("name", [b for b in BACKENDS if b != "process"])
def test_a_file_the_worker_holds_open_gets_the_sandbox_replaced(name: str) -> None:
    values, restarts = _checks(name, HELD_OPEN, "unit")
    assert values == [CLEAN] * 3
    assert restarts == 1


@pytest.mark.parametrize("attack", ["wipe_names_taken", "wipe_names_taken_nested"])
@pytest.mark.parametrize("name", BACKENDS)
def test_names_taken_before_the_wipe_do_not_stop_it(name: str, attack: str) -> None:
    """The wipe itself empties the scratch directory, whatever names the sample took: no
    replacement of the sandbox is needed (in a pod, replacing the worker keeps the pod's
    ``/tmp``, so a wipe that gave up would leave it full for the rest of the unit)."""
    values, restarts = _checks(name, ATTACKS[attack], "unit")
    assert restarts == 0
    for value in values:
        if name == "process":  # the host's own disk: capacity is not the sandbox's
            value = {**value, "free": 1.0}
        assert value == CLEAN
