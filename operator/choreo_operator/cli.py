"""``choreo operator`` and ``python -m choreo_operator``: run the operator in the foreground.

Imports stay light here: the ``choreo`` command builds its parser on every call, and kopf,
grpc and aiohttp load only when the operator actually runs. The flags come from ``Config``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    from choreo.settings import add_arguments as add_settings
    from choreo_operator.config import Config

    add_settings(p, Config)


def register(subparsers: Any) -> None:
    """Add ``operator`` to the ``choreo`` command."""
    p = subparsers.add_parser("operator", help="run the Kubernetes operator (kopf)")
    add_arguments(p)
    p.set_defaults(func=run_from_args)


def run_from_args(args: argparse.Namespace) -> int:
    from choreo.settings import SettingsError, from_arguments
    from choreo_operator.config import Config
    from choreo_operator.main import run

    try:
        config = from_arguments(Config, args)
    except SettingsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return run(config)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="choreo-operator", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run_from_args(p.parse_args(argv))
