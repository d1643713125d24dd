"""The proxy sidecar's journal folder: mounted by the proxy alone, named by its flag, on disk
(not in the Pod's memory) and never shared (docs/proxy.md, "Resilience")."""

from __future__ import annotations

from evalkube.controller import manifests
from tests.unit.controller.test_manifests import container, job, pod_spec


def test_only_the_proxy_mounts_its_journal_folder_and_is_told_where_it_is() -> None:
    j = job()
    proxy = container(j, "proxy")
    (mount,) = [m for m in proxy["volumeMounts"] if m["name"] == "proxy-state"]
    assert mount["mountPath"] == manifests.PROXY_STATE_DIR
    assert not mount.get("readOnly")
    command = proxy["command"]
    assert command[command.index("--state-dir") + 1] == manifests.PROXY_STATE_DIR
    for name in ("runner", "grader"):
        assert "proxy-state" not in {m["name"] for m in container(j, name)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(j)["volumes"]}
    assert volumes["proxy-state"]["emptyDir"] == {"sizeLimit": manifests.PROXY_STATE_SIZE}
    hints = j["spec"]["template"]["metadata"].get("annotations") or {}
    assert not any("proxy-state" in key for key in hints)
