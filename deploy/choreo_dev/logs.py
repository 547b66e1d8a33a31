"""Reading the end of a log file, the part that explains why something stopped."""

from __future__ import annotations

from pathlib import Path

TAIL_LINES = 20


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """Return the last ``lines`` non-empty lines of ``path`` (nothing if it does not exist).

    Reads only the last 64 KiB so that a multi-megabyte component log costs nothing.
    """
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 65536))
            data = fh.read()
    except FileNotFoundError:
        return []
    text = data.decode("utf-8", errors="replace")
    kept = [line.rstrip() for line in text.splitlines() if line.strip()]
    return kept[-lines:]
