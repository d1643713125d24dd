"""charts/evalkube/values.schema.json: helm refuses a bad value before any template renders.

Each bad value a user is likely to write (and one of each kind the schema checks: type, enum, range,
pattern, unknown key, required pair) must fail both ``helm template`` and ``helm lint
--strict`` with a message naming the value's path; every key of values.yaml is described by
the schema; and the value sets the chart's other tests and docs use still render.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.chart.conftest import CHART, HelmFailed, helm_template

SCHEMA = CHART / "values.schema.json"


def _lint(helm: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    args = [str(helm), "lint", "--strict", str(CHART)]
    for item in sets:
        args += ["--set", item]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("replicas=two", "at '/replicas': got string, want integer"),
        ("replica=3", "additional properties 'replica' not allowed"),
        ("ingest.port=http", "at '/ingest/port': got string, want integer"),
        ("api.port=70000", "at '/api/port': maximum"),
        ("work.proxyEngine=turbo", "at '/work/proxyEngine': value must be one of"),
        ("work.parallelism=0", "at '/work/parallelism': minimum"),
        ("work.shardSize=0", "at '/work/shardSize': minimum"),
        ("store.type=mysql", "at '/store/type': value must be one of 'sqlite', 'postgres'"),
        ("store.type=postgres", "at '/store/postgres/existingSecret': minLength"),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy': value must be one of"),
        ("image.tag=v1:latest", "at '/image/tag'"),
        ("runtimeClassName=gVisor", "at '/runtimeClassName'"),
        ("watchNamespace=Team_A", "at '/watchNamespace'"),
        ("watchNamespaces[0]=Team_A", "at '/watchNamespaces/0'"),
        ("rbac.secretPolicy=maybe", "at '/rbac/secretPolicy': got string, want boolean"),
        ("egress.dialTimeout=10", "at '/egress/dialTimeout': got number, want string"),
        ("egress.idleTimeout=soon", "at '/egress/idleTimeout'"),
        ("egress.grantTTLSeconds=60", "at '/egress/grantTTLSeconds': minimum"),
        ("egress.denyCIDRs[0]=localhost", "at '/egress/denyCIDRs/0'"),
        ("service.type=Ingress", "at '/service/type': value must be one of"),
        ("podLabels.tier=1", "at '/podLabels/tier': got number, want string"),
        ("extraEnv[0].value=x", "at '/extraEnv/0': missing property 'name'"),
        ("store.sqlite.accessModes[0]=RWO", "at '/store/sqlite/accessModes/0'"),
        ("metrics.serviceMonitor.interval=often", "at '/metrics/serviceMonitor/interval'"),
        ("prometheusRule.runsFailing.window=1 hour", "at '/prometheusRule/runsFailing/window'"),
        ("prometheusRule.gateFailed.sevrity=page", "additional properties 'sevrity' not allowed"),
        ("networkPolicy.enabled=maybe", "at '/networkPolicy/enabled': got string, want boolean"),
    ],
)
def test_a_bad_value_fails_template_and_lint_naming_it(helm: Path, item: str, message: str) -> None:
    with pytest.raises(HelmFailed) as failed:
        helm_template(helm, item)
    assert "don't meet the specifications of the schema" in str(failed.value)
    assert message in str(failed.value)
    linted = _lint(helm, item)
    assert linted.returncode != 0
    assert message in linted.stdout + linted.stderr


def _leaf_paths(value: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths of values.yaml down to scalars, lists and empty maps (what a user sets)."""
    if isinstance(value, dict) and value:
        return [p for k, v in value.items() for p in _leaf_paths(v, (*prefix, k))]
    return [prefix]


def _described(schema: dict[str, Any], node: dict[str, Any], path: tuple[str, ...]) -> bool:
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    if not path:
        return "type" in node or "oneOf" in node
    child = node.get("properties", {}).get(path[0])
    if child is None and isinstance(node.get("additionalProperties"), dict):
        child = node["additionalProperties"]  # a map: resources.requests.cpu
    return child is not None and _described(schema, child, path[1:])


def test_every_value_is_in_the_schema_and_no_unknown_key_passes() -> None:
    schema = json.loads(SCHEMA.read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [".".join(p) for p in _leaf_paths(values) if not _described(schema, schema, p)]
    assert missing == []

    # every object of the schema that lists its keys refuses others (typos), except the
    # free-form Kubernetes objects (affinity, NetworkPolicy peers, tolerations)
    def closed(node: dict[str, Any], where: str) -> list[str]:
        found = []
        if "properties" in node and node.get("additionalProperties") is not False:
            found.append(where or "/")
        for key, child in node.get("properties", {}).items():
            found += closed(child, f"{where}/{key}")
        return found

    assert closed(schema, "") == []


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["runtimeClassName=", "store.sqlite.storageClass=fast,store.sqlite.size=1Gi"],
        ["replicas=2", "store.type=postgres", "store.postgres.existingSecret=pg"],
        ["replicas=3,store.type=postgres,store.postgres.existingSecret=pg,watchNamespace=team-a"],
        ["metrics.serviceMonitor.enabled=true,prometheusRule.enabled=true"],
        ["prometheusRule.scoreRegression.maxDrop=0.2,prometheusRule.samplesErroring.maxRatio=0.5"],
        ["grafanaDashboard.enabled=true,grafanaDashboard.namespace=monitoring"],
        ["egress.enabled=false,networkPolicy.enabled=false,rbac.create=false"],
        ["watchNamespaces={team-a,team-b}", "rbac.secretPolicy=false"],
        ["egress.grantKey.existingSecret=mine,api.existingSecret=reader"],
        ["image.repository=localhost/evalkube,image.pullPolicy=Never,image.tag=dev"],
        ["networkPolicy.apiFrom[0].namespaceSelector.matchLabels.team=observability"],
        ["extraEnv[0].name=EVALKUBE_JOB_BACKOFF_LIMIT,extraEnv[0].value=4"],
        ["tolerations[0].key=gvisor,tolerations[0].operator=Exists", "replicas=0"],
        ["store.sqlite.size=500", "resources.limits.cpu=2"],
    ],
)
def test_the_value_sets_in_use_still_render(helm: Path, sets: list[str]) -> None:
    assert helm_template(helm, *sets)


def test_required_pair_is_satisfied_by_setting_both(helm: Path) -> None:
    """store.type=postgres alone fails (above); with its Secret it renders the Secret ref."""
    with pytest.raises(HelmFailed, match="/store/postgres/existingSecret"):
        helm_template(helm, "store.type=postgres", "store.postgres.existingSecret=")
    docs = helm_template(helm, "store.type=postgres", "store.postgres.existingSecret=pg")
    operator = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["EVALKUBE_STORE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "pg"
