"""Which runsc the ``gvisor`` backend runs, how old it is, and which platform it uses.

Graders run model output, so the sandbox must not lag its upstream's security fixes: a runsc
older than :data:`MIN_RUNSC_DATE` (the project's gVisor pin, ``tests/cluster/tools/gvisor``,
which ``.ci/gvisor.sh`` builds for local runs and the real node alike) is refused with a
message saying what to install, never used quietly. Debian's packaged runsc (2022-12-19) is
such a runsc.

The platform (how the sentry intercepts the grader's syscalls) is measured, not assumed:
``systrap`` (seccomp traps; gVisor's default since 2023) where a container starts on it,
``ptrace`` where it must; ``kvm`` needs ``/dev/kvm`` and
hangs in nested VMs, so it is used only when asked for with ``EVALKUBE_GVISOR_PLATFORM``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache

#: The oldest gVisor accepted: the date of the pinned module version
#: (``gvisor.dev/gvisor v0.0.0-20260527191743-a81fd9dd382e``). A test keeps the two equal.
MIN_RUNSC_DATE = "20260527"
#: Platforms in the order the probe tries them.
PLATFORMS = ("systrap", "ptrace")
#: ``EVALKUBE_GVISOR_PLATFORM`` may name one of these instead.
KNOWN_PLATFORMS = ("systrap", "ptrace", "kvm")
#: Where the pinned build is installed (``.ci/sandboxes.sh``), ahead of a distribution's.
INSTALLED = "/usr/local/bin/runsc"
INSTALL_HINT = (
    "install the pinned gVisor with `make sandboxes` (.ci/sandboxes.sh builds it into "
    f"{INSTALLED}), or point EVALKUBE_RUNSC at a runsc from {MIN_RUNSC_DATE[:4]}-"
    f"{MIN_RUNSC_DATE[4:6]}-{MIN_RUNSC_DATE[6:]} or later"
)
_DATE = re.compile(r"(?:release-|\d-)(20\d{6})")


@dataclass(frozen=True)
class RunscVersion:
    """What ``runsc --version`` said, and the date read from it (``None``: none found)."""

    text: str
    date: str | None

    @property
    def outdated(self) -> bool:
        return self.date is None or self.date < MIN_RUNSC_DATE


def runsc_path() -> str | None:
    """``EVALKUBE_RUNSC``, else the first ``runsc`` on ``PATH``, else the installed build."""
    chosen = os.environ.get("EVALKUBE_RUNSC")
    if chosen:
        return chosen if os.access(chosen, os.X_OK) else None
    return shutil.which("runsc") or next(
        (p for p in (INSTALLED, "/usr/bin/runsc") if os.access(p, os.X_OK)), None
    )


def parse_version(output: str) -> RunscVersion:
    """``runsc version release-20221219.0`` or ``runsc version v0.0.0-20260527191743-...``."""
    first = output.strip().splitlines()[0] if output.strip() else ""
    text = first.removeprefix("runsc version ").strip() or "no version"
    found = _DATE.search(text)
    return RunscVersion(text, found.group(1) if found else None)


@cache
def runsc_version(path: str) -> RunscVersion:
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return RunscVersion(f"unreadable ({exc})", None)
    return parse_version(done.stdout or done.stderr)


def outdated_reason(path: str, version: RunscVersion) -> str:
    said = f"{version.text}" + (
        f", {version.date[:4]}-{version.date[4:6]}-{version.date[6:]}" if version.date else ""
    )
    return (
        f"runsc at {path} ({said}) is older than the gVisor evalkube requires "
        f"({MIN_RUNSC_DATE[:4]}-{MIN_RUNSC_DATE[4:6]}-{MIN_RUNSC_DATE[6:]}): {INSTALL_HINT}"
    )


def requested_platform() -> str | None:
    """``EVALKUBE_GVISOR_PLATFORM`` when set (validated), else ``None``: measure."""
    chosen = os.environ.get("EVALKUBE_GVISOR_PLATFORM", "").strip()
    if not chosen:
        return None
    if chosen not in KNOWN_PLATFORMS:
        raise ValueError(
            f"EVALKUBE_GVISOR_PLATFORM={chosen!r}: choose one of {', '.join(KNOWN_PLATFORMS)} "
            "or unset it to let evalkube measure"
        )
    return chosen
