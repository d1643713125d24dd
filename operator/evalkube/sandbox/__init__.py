"""Host side of grader sandboxes: backends, the protocol and the per-unit session.

Importing this package registers every backend: ``gvisor``, ``nsjail``, ``bwrap`` and
``process`` (see :data:`AUTO_ORDER` and ``docs/sandboxes.md``).
"""

from evalkube.sandbox.backends import (
    AUTO_ORDER,
    ProcessBackend,
    SandboxBackend,
    SandboxLimits,
    SandboxUnavailable,
    SpawnRequest,
    availability,
    resolve_backend,
)
from evalkube.sandbox.bwrap import BwrapBackend
from evalkube.sandbox.execution import Execution
from evalkube.sandbox.gvisor import GVisorBackend
from evalkube.sandbox.nsjail import NsjailBackend
from evalkube.sandbox.session import GraderSandbox, Program, ProgramLoadError, SandboxError

__all__ = [
    "AUTO_ORDER",
    "BwrapBackend",
    "Execution",
    "GVisorBackend",
    "GraderSandbox",
    "NsjailBackend",
    "ProcessBackend",
    "Program",
    "ProgramLoadError",
    "SandboxBackend",
    "SandboxError",
    "SandboxLimits",
    "SandboxUnavailable",
    "SpawnRequest",
    "availability",
    "resolve_backend",
]
