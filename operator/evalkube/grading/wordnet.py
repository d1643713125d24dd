"""WordNet 3.0 for ``text_similarity`` ``meteor``, read from the operating system's files.

nltk's ``meteor_score`` matches synonyms through WordNet, which nltk downloads from GitHub at
run time (``nltk.download("wordnet")``): impossible on an air-gapped cluster, and pip cannot
install it. Debian ships the same WordNet 3.0 database as packages (``wordnet-base`` for the
data and index files, ``wordnet-sense-index`` for ``index.sense``, which nltk's reader maps
versions with), which ``make setup`` and the evalkube image install. nltk's reader also wants
``lexnames``, the table of the 45 lexicographer files; Debian documents it in
``lexnames(5WN)`` but does not ship the file, so it is written here from that table.

The reader is built once per process, from ``EVALKUBE_WORDNET_DIR`` or ``/usr/share/wordnet``.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from functools import cache
from pathlib import Path
from typing import Any

from evalkube.util.cache_home import user_cache_home

#: Where Debian's wordnet-base puts the database.
SYSTEM_DIR = Path("/usr/share/wordnet")
#: The nltk data directory an image prepares at build time (``python -m
#: evalkube.grading.wordnet``); nltk trusts it by default.
PREPARED = Path("/usr/share/nltk_data")
#: Files nltk's WordNetCorpusReader opens (besides ``lexnames``).
NEEDED = (
    *(f"{kind}.{pos}" for kind in ("data", "index") for pos in ("noun", "verb", "adj", "adv")),
    *(f"{pos}.exc" for pos in ("noun", "verb", "adj", "adv")),
    "index.sense",
)
HOW_TO_INSTALL = (
    "meteor needs the WordNet 3.0 database: `apt-get install wordnet-base wordnet-sense-index` "
    "(Debian/Ubuntu; `make setup` does it), or point EVALKUBE_WORDNET_DIR at a directory "
    "holding WordNet 3.0's dict files (data.*, index.*, *.exc, index.sense)"
)

#: WordNet's lexicographer files (lexnames(5WN)): number, name; the syntactic category
#: (1 noun, 2 verb, 3 adjective, 4 adverb) follows from the name.
LEXNAMES = (
    "adj.all",
    "adj.pert",
    "adv.all",
    "noun.Tops",
    "noun.act",
    "noun.animal",
    "noun.artifact",
    "noun.attribute",
    "noun.body",
    "noun.cognition",
    "noun.communication",
    "noun.event",
    "noun.feeling",
    "noun.food",
    "noun.group",
    "noun.location",
    "noun.motive",
    "noun.object",
    "noun.person",
    "noun.phenomenon",
    "noun.plant",
    "noun.possession",
    "noun.process",
    "noun.quantity",
    "noun.relation",
    "noun.shape",
    "noun.state",
    "noun.substance",
    "noun.time",
    "verb.body",
    "verb.change",
    "verb.cognition",
    "verb.communication",
    "verb.competition",
    "verb.consumption",
    "verb.contact",
    "verb.creation",
    "verb.emotion",
    "verb.motion",
    "verb.perception",
    "verb.possession",
    "verb.social",
    "verb.stative",
    "verb.weather",
    "adj.ppl",
)
_CATEGORY = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}


class WordNetMissing(LookupError):
    """No usable WordNet 3.0 database here (the message says how to install one)."""


def wordnet_dir() -> Path:
    """The directory holding WordNet 3.0's dict files, or :class:`WordNetMissing`."""
    configured = os.environ.get("EVALKUBE_WORDNET_DIR")
    directory = Path(configured) if configured else SYSTEM_DIR
    missing = [name for name in NEEDED if not (directory / name).is_file()]
    if missing:
        where = f"EVALKUBE_WORDNET_DIR={configured}" if configured else str(SYSTEM_DIR)
        raise WordNetMissing(f"{where} lacks {', '.join(missing[:3])}: {HOW_TO_INSTALL}")
    return directory


def lexnames_text() -> str:
    return "".join(
        f"{number:02d}\t{name}\t{_CATEGORY[name.split('.')[0]]}\n"
        for number, name in enumerate(LEXNAMES)
    )


def data_root(directory: Path) -> Path:
    """An nltk data directory holding ``corpora/wordnet``: the database's files copied (nltk
    refuses corpus files that resolve outside its data path, and Debian's directory lacks
    ``lexnames``) plus ``lexnames``. nltk's reader looks the corpus up by name there to map
    sense keys between versions.

    :data:`PREPARED` when an image made it at build time (its filesystem is read-only when it
    runs); else made once per database in the user's cache."""
    if _ready(PREPARED):
        return PREPARED
    key = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:12]
    return prepare(directory, user_cache_home() / "evalkube" / f"nltk_data-{key}")


def prepare(directory: Path, root: Path) -> Path:
    """Make ``root`` an nltk data directory holding the WordNet of ``directory``."""
    corpus = root / "corpora" / "wordnet"
    if not _ready(root):
        corpus.mkdir(parents=True, exist_ok=True)
        for name in NEEDED:
            _write_atomically(corpus / name, (directory / name).read_bytes())
        lexnames = directory / "lexnames"
        table = lexnames.read_bytes() if lexnames.is_file() else lexnames_text().encode()
        _write_atomically(corpus / "lexnames", table)
    return root


def _ready(root: Path) -> bool:
    return (root / "corpora" / "wordnet" / "lexnames").is_file()


def _write_atomically(target: Path, data: bytes) -> None:
    """Write whole, then rename: a concurrent run never reads half a file (``lexnames``
    last: its presence means the copy is complete)."""
    with tempfile.NamedTemporaryFile("wb", dir=target.parent, delete=False) as handle:
        handle.write(data)
    temporary = Path(handle.name)
    temporary.chmod(0o644)  # readable by every user (an image's runner is not its builder)
    temporary.replace(target)


@cache
def wordnet_reader() -> Any:
    """nltk's WordNet reader over the local database (loaded once: a few seconds)."""
    import nltk.data
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    root = data_root(wordnet_dir())
    # nltk (3.9+) opens corpus files only below its data path
    if str(root) not in nltk.data.path:
        nltk.data.path.append(str(root))
    with warnings.catch_warnings():  # no Open Multilingual WordNet: English only, as meteor
        warnings.filterwarnings("ignore", message="The multilingual functions")
        return WordNetCorpusReader(str(root / "corpora" / "wordnet"), None)


if __name__ == "__main__":  # an image's build step: python -m evalkube.grading.wordnet
    print(prepare(wordnet_dir(), PREPARED))
