"""WordNet for ``meteor`` comes from the operating system (Debian's wordnet-base and
wordnet-sense-index); the one file nltk wants that Debian does not ship, ``lexnames``, is
written from the table Debian documents."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from evalkube.grading import wordnet
from evalkube.grading.builtin import BuiltinGrader, MissingLibrary
from tests.conftest import require

MAN_PAGE = Path("/usr/share/man/man5/lexnames.5WN.gz")


def test_lexnames_is_the_table_of_the_lexnames_man_page() -> None:
    if not MAN_PAGE.exists():
        require("wordnet-base's man page is not installed (bash .ci/wordnet.sh)")
    text = gzip.decompress(MAN_PAGE.read_bytes()).decode()
    documented = [(int(n), name) for n, name in re.findall(r"^(\d\d)\t\s*(\S+)", text, re.M)]
    ours = [
        (int(n), name)
        for n, name, _ in (line.split("\t") for line in wordnet.lexnames_text().splitlines())
    ]
    assert ours == documented
    assert len(ours) == 45


def test_the_reader_is_built_over_the_system_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = wordnet.data_root(wordnet.wordnet_dir())
    corpus = root / "corpora" / "wordnet"
    assert (corpus / "lexnames").read_text() == wordnet.lexnames_text()
    assert (corpus / "data.noun").read_bytes() == (wordnet.SYSTEM_DIR / "data.noun").read_bytes()
    assert wordnet.data_root(wordnet.wordnet_dir()) == root  # made once


def test_without_wordnet_meteor_is_refused_saying_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVALKUBE_WORDNET_DIR", str(tmp_path))
    wordnet.wordnet_reader.cache_clear()
    try:
        with pytest.raises(
            MissingLibrary, match=r"apt-get install wordnet-base wordnet-sense-index"
        ):
            BuiltinGrader(
                "text_similarity",
                input="{{ sample.output_text }}",
                reference="{{ item.answer }}",
                metric_id="m",
                where="tasks[t].grader",
                evaluation_metric="meteor",
            )
    finally:
        wordnet.wordnet_reader.cache_clear()


def test_an_image_prepared_at_build_time_is_read_without_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work-unit containers have a read-only filesystem and no home: the image's build step
    (``python -m evalkube.grading.wordnet``) prepares the data, and the runner only reads it
    (on the real node: tests/realnode/test_imported_eval.py, its meteor criterion)."""
    prepared = wordnet.prepare(wordnet.wordnet_dir(), tmp_path / "nltk_data")
    # built by one user, read by another: every file readable by all
    corpus = prepared / "corpora" / "wordnet"
    assert {oct(f.stat().st_mode & 0o444) for f in corpus.iterdir()} == {oct(0o444)}
    monkeypatch.setattr(wordnet, "PREPARED", prepared)
    monkeypatch.setenv("XDG_CACHE_HOME", "/nonexistent/cache")  # any write would fail
    wordnet.wordnet_reader.cache_clear()
    try:
        reader = wordnet.wordnet_reader()
        assert reader.synsets("sofa")
        assert wordnet.data_root(wordnet.wordnet_dir()) == prepared
    finally:
        wordnet.wordnet_reader.cache_clear()
