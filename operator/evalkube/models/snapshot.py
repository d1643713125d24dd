"""The record of every run: what it executes, copied once when it starts.

A run copies its suite (spec, grader sources, dataset references, version) when it starts, so
editing the suite later never changes a running run. In a cluster the operator writes it into
the run's ConfigMap, where the work-unit pods' runners and proxies read it; ``evalkube run``
writes the same document, with :class:`SnapshotLocal` for ``--resume``. The result store keeps
it as the run's ``spec`` either way, so every reader parses one shape. Its own keys are
snake_case (it is not a Kubernetes object); the specs inside keep their CRD spelling.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evalkube.models.run import EvalRunSpec
from evalkube.models.suite import EvalSuiteSpec


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SnapshotRun(_Document):
    """The run the snapshot belongs to: its EvalRun in a cluster, only its id on one machine."""

    run_id: str
    """The run's id in the result store (in a cluster: namespace, name and a uid prefix)."""
    namespace: str | None = None
    name: str | None = None
    uid: str | None = None


class SnapshotSuite(_Document):
    """The suite as the run found it."""

    name: str
    spec: EvalSuiteSpec
    version: str
    """sha256 over the spec, the code and the datasets (as the EvalSuite status shows it)."""


class SnapshotDataset(_Document):
    """A task's dataset: its size, and the ConfigMap key holding it (absent for inline rows);
    for a ``uri`` dataset the size comes with the run's pins, made by its prepare pod."""

    rows: int | None = Field(default=None, ge=0)
    config_map: str | None = Field(default=None, alias="configMap")
    key: str | None = None
    uri: str | None = None


class SnapshotLocal(_Document):
    """What ``evalkube run --resume`` needs beyond the suite: where its files were."""

    base_dir: str
    """The folder the suite's relative dataset and output paths are read from."""
    suite_file: str | None = None
    """The suite file, which ``--reload`` reads again."""
    pins: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """``task/part`` -> the :class:`~evalkube.sources.SourcePin` (as JSON) of each ``uri``
    source: ``--resume`` reads those bytes or fails."""
    reloads: list[dict[str, str]] = Field(default_factory=list)
    """Each ``--reload`` that changed the suite's version: ``{from, to, at}``."""


class RunSnapshot(_Document):
    """What a run executes (in a cluster, ``snapshot.json`` in the run's ConfigMap)."""

    run: SnapshotRun
    suite: SnapshotSuite
    run_spec: EvalRunSpec
    sources: dict[str, tuple[str, str]] = Field(default_factory=dict)
    """``task/kind`` (``grader``, ``graders[1]``, ``preprocess``) -> (source, filename)."""
    datasets: dict[str, SnapshotDataset] = Field(default_factory=dict)
    """Task id -> its dataset (cluster runs: the ConfigMaps holding inline datasets)."""
    local: SnapshotLocal | None = None
    """Set by ``evalkube run`` only."""

    def to_wire(self) -> dict[str, Any]:
        """The document as JSON values (the result store's ``spec`` of the run)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)
