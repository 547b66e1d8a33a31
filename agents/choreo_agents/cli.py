"""``choreo agent``: the node agent's command line (also ``python -m choreo_agents``).

Imports here stay light because ``choreo``'s own CLI builds its parser from this module on
every invocation; the agent's modules load when the command runs. The flags come from
``AgentConfig``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``agent`` sub-command to a parent CLI."""
    p = subparsers.add_parser(
        "agent", help="run the node agent: discover, measure and watch GPU links"
    )
    add_arguments(p)
    p.set_defaults(func=run_command)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    from choreo.settings import add_arguments as add_settings
    from choreo_agents.config import AgentConfig

    add_settings(p, AgentConfig)


def run_command(args: argparse.Namespace) -> int:
    from choreo_agents.run import run

    return run(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="choreo-agent", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
