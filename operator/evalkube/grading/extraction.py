"""From ``output_text`` to ``extracted_output``: stop sequences, then one extraction rule."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from typing import Any, Literal


class ExtractionMiss(ValueError):
    """The rule found nothing in the output; the sample records it as an extraction error."""


def apply_stop(text: str, stop: Sequence[str]) -> str:
    """Cut ``text`` at the earliest stop sequence."""
    found = [at for sequence in stop if sequence and (at := text.find(sequence)) >= 0]
    return text[: min(found, default=len(text))]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: One decoder for every sample (``json.loads`` with an option builds one per call).
_DECODER = json.JSONDecoder(parse_constant=_no_constant)
#: The first character of any JSON text after leading whitespace.
_JSON_STARTS = frozenset('{["-0123456789tfn')
_JSON_WHITESPACE = " \t\n\r"


def parse_output_json(text: str | None) -> Any:
    """``sample.output_json``: the output parsed as JSON, or ``None`` when it is not JSON.

    ``NaN``/``Infinity`` are refused (not JSON, and not numbers a grader should compare).
    Prose (most outputs) is told apart by its first character, without a parse attempt.
    """
    if not text:
        return None
    stripped = text.lstrip(_JSON_WHITESPACE)
    if not stripped or stripped[0] not in _JSON_STARTS:
        return None
    if stripped[0] in "tfn" and not stripped.startswith(("true", "false", "null")):
        return None  # "the answer is 4", "no", ...
    try:
        return _DECODER.decode(text)
    except (ValueError, RecursionError):
        return None


class Extractor:
    """A compiled extraction rule (``none``, ``regex``, ``json``, ``choice``)."""

    def __init__(
        self,
        kind: Literal["none", "regex", "json", "choice"] = "none",
        *,
        pattern: str | None = None,
        field: str | None = None,
        ignore_case: bool = False,
    ) -> None:
        self.kind = kind
        self.ignore_case = ignore_case
        self.field = field.split(".") if field else []
        self.regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0) if pattern else None

    def extract(self, text: str, choices: Sequence[str] = ()) -> str:
        """Return the extracted answer or raise :class:`ExtractionMiss` saying why."""
        if self.kind == "none":
            return text.strip()
        if self.kind == "regex":
            assert self.regex is not None
            match = self.regex.search(text)
            if match is None:
                raise ExtractionMiss(f"pattern {self.regex.pattern!r} did not match the output")
            value = match.group(1) if match.re.groups else match.group(0)
            if value is None:
                raise ExtractionMiss(
                    f"pattern {self.regex.pattern!r} matched but its first group did not"
                )
            return value.strip()
        if self.kind == "json":
            return self._json(text)
        return self._choice(text, choices)

    def _json(self, text: str) -> str:
        document = _first_json_object(text)
        value: Any = document
        for part in self.field:
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                raise ExtractionMiss(f"JSON output has no field {'.'.join(self.field)!r}")
        if value is None:
            raise ExtractionMiss(f"JSON field {'.'.join(self.field)!r} is null")
        return value if isinstance(value, str) else json.dumps(value)

    def _choice(self, text: str, choices: Sequence[str]) -> str:
        if not choices:
            raise ExtractionMiss("choice extraction needs `choices` on the task or row")
        flags = re.IGNORECASE if self.ignore_case else 0
        found = [
            (match.start(), -len(str(choice)), str(choice))
            for choice in choices
            if (match := re.search(rf"(?<!\w){re.escape(str(choice))}(?!\w)", text, flags))
        ]
        if not found:
            raise ExtractionMiss(f"none of the choices {list(choices)!r} appears in the output")
        return min(found)[2]


def _first_json_object(text: str) -> Any:
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.strip("`")
        stripped = stripped[stripped.find("\n") + 1 :]  # no newline: -1 + 1 keeps it all
    with contextlib.suppress(ValueError):
        return json.loads(stripped)
    decoder = json.JSONDecoder()
    for start, char in enumerate(text):
        if char in "{[":
            with contextlib.suppress(ValueError):
                return decoder.raw_decode(text, start)[0]
    raise ExtractionMiss("the output contains no JSON object")
