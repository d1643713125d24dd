"""Host side of grader sandboxes: backends, the protocol and the per-unit session."""

from evalkube.sandbox.backends import (
    AUTO_ORDER,
    ProcessBackend,
    SandboxBackend,
    SandboxUnavailable,
    WorkerProcess,
    resolve_backend,
)
from evalkube.sandbox.execution import Execution
from evalkube.sandbox.session import GraderSandbox, Program, ProgramLoadError, SandboxError

__all__ = [
    "AUTO_ORDER",
    "Execution",
    "GraderSandbox",
    "ProcessBackend",
    "Program",
    "ProgramLoadError",
    "SandboxBackend",
    "SandboxError",
    "SandboxUnavailable",
    "WorkerProcess",
    "resolve_backend",
]
