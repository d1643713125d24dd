"""evalkube: self-hosted, sandboxed Python graders for LLM evaluations.

The package is layered (see docs/development.md): ``controller -> engine -> (sandbox, proxy,
store, grading) -> models``. ``grading`` and ``models`` import nothing from the others.
"""

__version__ = "0.1.0"
