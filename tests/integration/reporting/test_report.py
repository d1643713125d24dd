"""`evalkube report` without a browser: the file is self-contained, escaped and complete.

What a person sees in it is checked in Chromium by test_report_browser.py.
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.integration.reporting.report_data import RUN, make_report_store

pytestmark = pytest.mark.timeout(120)

EVALKUBE = Path(sys.executable).parent / "evalkube"


def evalkube(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EVALKUBE), *args], cwd=cwd, capture_output=True, text=True, timeout=100
    )


class Page(HTMLParser):
    """Collects what the checks need: resource URLs, scripts, the CSP, figures."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.scripts: list[str] = []
        self.csp: str | None = None
        self.in_script = False
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.tags.append((tag, found))
        self.urls += [v or "" for k, v in attrs if k in ("src", "href", "action", "xlink:href")]
        if tag == "meta" and found.get("http-equiv") == "Content-Security-Policy":
            self.csp = found.get("content")
        if tag == "script":
            self.in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self.in_script = False

    def handle_data(self, data: str) -> None:
        if self.in_script:
            self.scripts[-1] += data


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return make_report_store(tmp_path / "results.db")


def test_report_is_self_contained_with_one_hashed_script(store_url: str, tmp_path: Path) -> None:
    done = evalkube("report", RUN, "--db", store_url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / f"{RUN}.html"  # the default file name
    assert f"wrote {out}" in done.stderr.replace("\n", "")
    page = Page()
    page.feed(out.read_text(encoding="utf-8"))
    assert page.urls == []  # nothing to fetch: no src, href or form action anywhere
    assert page.csp is not None
    assert "default-src 'none'" in page.csp
    (script,) = page.scripts  # the filter script, and no script from a sample
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}';" in page.csp
    assert not any(tag in ("link", "iframe", "object", "embed", "img") for tag, _ in page.tags)


def test_untrusted_text_is_escaped(store_url: str, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    done = evalkube("report", RUN, "--db", store_url, "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    html = out.read_text(encoding="utf-8")
    assert "&lt;script&gt;window.pwned = 1" in html
    assert "<script>window.pwned" not in html
    assert 'onerror="window.pwned' not in html


def test_max_samples_keeps_scores_and_distributions_whole(store_url: str, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    done = evalkube(
        "report", RUN, "--db", store_url, "--out", str(out), "--max-samples", "2", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    html = out.read_text(encoding="utf-8")
    assert html.count('<article class="sample"') == 2
    assert "holds the first 2 of 7 samples" in html
    assert len(re.findall(r"n = 3</text>", html)) == 1  # capitals f1: all three scored samples


def test_unknown_run_is_exit_2_naming_the_store(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    done = evalkube("report", "nope", "--db", str(db), cwd=tmp_path)
    assert done.returncode == 2
    assert f"run 'nope' is not in the store {db}" in done.stderr.replace("\n", "")


def test_an_unwritable_out_is_exit_2(store_url: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "r.html"
    done = evalkube("report", RUN, "--db", store_url, "--out", str(missing), cwd=tmp_path)
    assert done.returncode == 2
    assert f"cannot write --out {missing}" in done.stderr.replace("\n", "")
