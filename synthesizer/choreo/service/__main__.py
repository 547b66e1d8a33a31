"""``python -m choreo.service serve ...``: the server without the rest of the ``choreo`` CLI
(what the container image runs)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from choreo.errors import ChoreoError
from choreo.service.cli import register


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m choreo.service")
    register(parser.add_subparsers(metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ChoreoError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
