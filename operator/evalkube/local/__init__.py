"""The local runner: a whole suite on one machine (``evalkube run``), and the importer of
OpenAI evals (``evalkube import openai``).

It drives units through the engine every path shares (:mod:`evalkube.engine`), adding what
only one machine needs: the run record and ``--resume``, preflight checks, a pool of unit
processes. The operator never imports it (the layer contract in pyproject.toml).
"""

from __future__ import annotations

from evalkube.local.engine import LocalEngine, ModelAccess, RunSummary

__all__ = ["LocalEngine", "ModelAccess", "RunSummary"]
