"""Size-capped capture of a grader execution's ``print`` output."""

from __future__ import annotations

import io


class CappedText(io.TextIOBase):
    """A text stream keeping the first ``limit`` characters and counting the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.kept = 0
        self.dropped = 0

    def reset(self) -> None:
        self.parts.clear()
        self.kept = self.dropped = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        room = self.limit - self.kept
        if room > 0:
            part = text[:room]
            self.parts.append(part)
            self.kept += len(part)
        self.dropped += max(0, len(text) - max(room, 0))
        return len(text)

    def text(self) -> str | None:
        if not self.kept and not self.dropped:
            return None
        body = "".join(self.parts)
        if self.dropped:
            body += f"\n[evalkube: {self.dropped} more characters dropped]"
        return body
