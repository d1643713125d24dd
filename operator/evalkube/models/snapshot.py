"""The snapshot a cluster run executes: one document, written once by the operator into the
run's ConfigMap and read by the work-unit pod's runner and proxy.

A run copies its suite (spec, grader sources, dataset references, version) when it starts, so
editing the suite later never changes a running run. Both sides parse the one model, so the
operator's plan and every pod's plan come from the same validated specs. Its own keys are
snake_case (it is not a Kubernetes object); the specs inside keep their CRD spelling.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from evalkube.models.run import EvalRunSpec
from evalkube.models.suite import EvalSuiteSpec


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SnapshotRun(_Document):
    """The EvalRun the snapshot belongs to."""

    namespace: str
    name: str
    uid: str
    run_id: str
    """The run's id in the result store (namespace, name and a uid prefix)."""


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


class RunSnapshot(_Document):
    """What a cluster run executes (``snapshot.json`` in the run's ConfigMap)."""

    run: SnapshotRun
    suite: SnapshotSuite
    run_spec: EvalRunSpec
    sources: dict[str, tuple[str, str]] = Field(default_factory=dict)
    """``task/kind`` (``grader``, ``graders[1]``, ``preprocess``) -> (source, filename)."""
    datasets: dict[str, SnapshotDataset] = Field(default_factory=dict)
    """Task id -> its dataset."""

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)
