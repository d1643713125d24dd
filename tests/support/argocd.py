"""Run the chart's Argo CD health checks (charts/evalkube/argocd/*.lua) the way Argo CD does.

Argo CD runs a health script in gopher-lua (Lua 5.1) with the live object as the global
``obj`` and reads the returned table's ``status`` and ``message``; lupa's Lua 5.1 runtime
does the same here. The ``argocd-cm`` patch in docs/gitops.md is generated from the Lua
files: ``python -m tests.support.argocd`` rewrites it (the unit tests check it matches).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
LUA_DIR = ROOT / "charts" / "evalkube" / "argocd"
GITOPS_DOC = ROOT / "docs" / "gitops.md"
BEGIN = "<!-- argocd-cm: generated from charts/evalkube/argocd/*.lua -->"
END = "<!-- end argocd-cm -->"
#: Argo CD's health statuses (pkg/health): a script must return one of them.
STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}
#: Removed before a script runs: Argo CD's VM offers base, table, string, math and a few os
#: functions only, and the scripts need nothing beyond the first four.
SANDBOXED_AWAY = ("os", "io", "require", "dofile", "loadfile", "package", "debug")


def scripts() -> dict[str, str]:
    """``argocd-cm`` data key -> Lua source, one per file (named ``<group>_<Kind>.lua``)."""
    return {
        f"resource.customizations.health.{path.stem}": path.read_text()
        for path in sorted(LUA_DIR.glob("*.lua"))
    }


def health(kind: str, obj: dict[str, Any]) -> dict[str, str]:
    """Run the health script of ``evalkube.io/<kind>`` on ``obj``; Argo CD's ``hs`` table."""
    from lupa import lua51

    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    for name in SANDBOXED_AWAY:
        lua.globals()[name] = None
    lua.globals().obj = lua.table_from(_without_nulls(obj), recursive=True)
    result = lua.execute((LUA_DIR / f"evalkube.io_{kind}.lua").read_text())
    hs = dict(result.items())
    assert hs.get("status") in STATUSES, f"{kind} health returned status {hs.get('status')!r}"
    return {"status": str(hs["status"]), "message": str(hs.get("message", ""))}


def _without_nulls(value: Any) -> Any:
    """JSON nulls are absent fields to a Lua script (nil), as in Argo CD."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def argocd_cm() -> str:
    """The documented ``argocd-cm`` patch, as YAML."""
    patch = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "argocd-cm",
            "namespace": "argocd",
            "labels": {"app.kubernetes.io/part-of": "argocd"},
        },
        "data": scripts(),
    }

    class Literal(yaml.SafeDumper):
        pass

    Literal.add_representer(
        str,
        lambda dumper, text: dumper.represent_scalar(
            "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None
        ),
    )
    return yaml.dump(patch, Dumper=Literal, sort_keys=False, width=200)


def doc_block(text: str) -> str:
    """The generated YAML between the markers of docs/gitops.md."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    body = text[start:end].strip()
    assert body.startswith("```yaml\n"), "a fenced ```yaml block expected after the marker"
    assert body.endswith("```"), "the ```yaml block must end before the end marker"
    return body[len("```yaml\n") : -3]


def write_doc() -> None:
    text = GITOPS_DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    GITOPS_DOC.write_text(f"{text[:start]}\n```yaml\n{argocd_cm()}```\n{text[end:]}")


if __name__ == "__main__":
    write_doc()
    sys.stdout.write(f"wrote the argocd-cm patch into {GITOPS_DOC}\n")
