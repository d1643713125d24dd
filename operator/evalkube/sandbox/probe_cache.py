"""The platform gVisor's availability probe found here, remembered from one run to the next.

The probe starts a real container and waits for the worker's first frame (0.6-0.8 s on a
2-core VM): every ``evalkube run`` under gVisor paid that before its first sample. What it
measures, the platform a container starts on, follows the runsc binary, the kernel, the user
and the gVisor pin, so its answer is kept under a key made of those, in
``${XDG_CACHE_HOME:-~/.cache}/evalkube/gvisor-platform.json``. Any change to them probes
again; a worker that then fails to start forgets the answer, so the next start probes (a
host whose seccomp or cgroup setup changed under the same kernel heals itself).

Only a platform the probe would have tried is ever taken from the file: a file edited to
name another (``kvm``, a typo) is ignored, never trusted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

from evalkube.sandbox.runsc import MIN_RUNSC_DATE
from evalkube.util.cache_home import user_cache_home

FILE_NAME = "gvisor-platform.json"


def cache_file() -> Path:
    return user_cache_home() / "evalkube" / FILE_NAME


def probe_key(runsc: str, asked: str | None) -> str | None:
    """What the probe's answer depends on, digested; ``None`` when runsc cannot be read."""
    try:
        real = os.path.realpath(runsc)
        found = os.stat(real)
    except OSError:
        return None
    uname = os.uname()
    facts = [
        real,
        found.st_dev,
        found.st_ino,
        found.st_size,
        found.st_mtime_ns,
        uname.release,
        uname.version,
        uname.machine,
        os.geteuid(),
        asked,
        MIN_RUNSC_DATE,
    ]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()


def recall(key: str, allowed: tuple[str, ...]) -> str | None:
    """The platform kept under ``key``, when it is one of ``allowed``; else ``None``."""
    try:
        kept = json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("key") != key:
        return None
    platform = kept.get("platform")
    return platform if isinstance(platform, str) and platform in allowed else None


def remember(key: str, platform: str) -> None:
    """Keep ``platform`` under ``key`` (written whole or not at all; best effort)."""
    path = cache_file()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{FILE_NAME}.")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump({"key": key, "platform": platform}, handle)
            os.replace(temporary, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def forget() -> None:
    """Drop the kept answer: the next run probes again."""
    with contextlib.suppress(OSError):
        cache_file().unlink()
