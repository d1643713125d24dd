"""Check user code before anything runs: it parses, and it defines its entry point.

Only parsing happens on the host (``ast.parse`` never executes code); import-time errors
are caught when the sandbox loads the program.
"""

from __future__ import annotations

import ast

from evalkube.engine.loading import LoadedSuite, task_programs
from evalkube.models.errors import ConfigError


def defined_names(tree: ast.Module) -> set[str]:
    """Top-level names a module binds (defs, assignments, imports)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def check_source(source: str, filename: str, entrypoint: str, where: str) -> None:
    """Raise :class:`ConfigError` naming ``where`` and the line when the code is unusable."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        raise ConfigError(f"{where}: SyntaxError at line {exc.lineno}: {exc.msg}") from None
    if entrypoint not in defined_names(tree):
        raise ConfigError(f"{where}: does not define `{entrypoint}(...)` at the top level")


def check_programs(loaded: LoadedSuite) -> None:
    """Check every task's grader and preprocessor."""
    for task in loaded.suite.spec.tasks:
        for kind, program in task_programs(task):
            source, filename = loaded.sources[(task.id, kind)]
            where = f"task {task.id!r} {kind} ({filename})"
            check_source(source, filename, program.entrypoint, where)
