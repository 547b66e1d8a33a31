"""One exception type for every failure a developer should read as a sentence.

The CLI catches :class:`DevClusterError` and prints ``error: <message>`` without a
traceback, so the message itself must say what went wrong and what to do next.
"""

from __future__ import annotations

from collections.abc import Sequence


class DevClusterError(Exception):
    """A failure of the local cluster tooling, explained for a human."""


def with_tail(message: str, title: str, lines: Sequence[str]) -> str:
    """Append the last lines of a log to ``message``, indented so they read as a quote."""
    if not lines:
        return f"{message}\n{title}: (empty)"
    body = "\n".join(f"    {line}" for line in lines)
    return f"{message}\n{title}:\n{body}"
