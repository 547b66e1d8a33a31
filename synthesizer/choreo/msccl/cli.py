"""``choreo msccl validate|run FILE`` and the ``--msccl-out`` options of ``choreo synthesize``."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console

from choreo.errors import ChoreoError, InputError
from choreo.msccl import layout
from choreo.msccl.interpret import run
from choreo.msccl.lower import lower, node_file_gpus
from choreo.msccl.split import rank_nodes, split_per_node
from choreo.msccl.validate import validate
from choreo.schedule import Schedule

console = Console(highlight=False)


def register(subparsers: Any) -> None:
    """Add the ``msccl`` command group to the top-level parser's subparsers."""
    m = subparsers.add_parser("msccl", help="check MSCCL XML files (validate, interpret)")
    sub = m.add_subparsers(metavar="ACTION")
    v = sub.add_parser("validate", help="check every parser and structural rule of the runtimes")
    v.add_argument("file")
    v.add_argument("--dialect", choices=layout.DIALECTS,
                   help="default: from the coll spelling or choreo's comment")
    v.add_argument("--partial", action="store_true",
                   help="a per-node split file (only some <gpu> elements)")
    v.set_defaults(func=cmd_validate)
    r = sub.add_parser("run", help="execute the file on symbolic buffers and check the result")
    r.add_argument("file")
    r.add_argument("--dialect", choices=layout.DIALECTS)
    r.add_argument("--root", type=int, help="root rank of rooted collectives (default: inferred)")
    r.set_defaults(func=cmd_run)
    m.set_defaults(func=lambda _args: m.print_help() or 2)


def add_synthesize_options(parser: argparse.ArgumentParser) -> None:
    """``choreo synthesize --msccl-out DIR [--dialect] [--instances] [--proto]``."""
    parser.add_argument("--msccl-out", metavar="DIR",
                        help="also write one MSCCL XML per tenant here (implies --no-relay)")
    parser.add_argument("--dialect", choices=layout.DIALECTS, default="executor",
                        help="MSCCL runtime: executor (msccl-executor-nccl), rccl (the executor "
                        "in RCCL) or legacy (microsoft/msccl: an in-place and an out-of-place "
                        "file per tenant)")
    parser.add_argument("--instances", type=int, default=1,
                        help="MSCCL instances: each chunk split in N, threadblocks replicated")
    parser.add_argument("--proto", choices=layout.PROTOCOLS, default="Simple")
    parser.add_argument("--force", action="store_true",
                        help="write a tenant's MSCCL file even where NCCL is predicted faster "
                        "(by default none is written there and NCCL runs)")


def msccl_files(sched: Schedule, args: argparse.Namespace,
                skip: frozenset[int] = frozenset()) -> dict[str, Callable[[], bytes]]:
    """Every tenant's file but those in ``skip``, each checked before anything is written
    (renderers for ``cli.write_all``, already computed): validated and run in the
    interpreter; or, for a tenant of more ranks than one file can hold
    (``node_file_gpus``), split as the operator ships it, one file per node
    (``<tenant>-<collective>/<node>.xml``), each validated (no runtime loads such a program
    whole, the interpreter included)."""
    files: dict[str, Callable[[], bytes]] = {}
    for t, d in enumerate(sched.demands):
        if t in skip:
            continue
        stem = _safe(d.name) if d.name else f"tenant{t}"
        file_gpus = node_file_gpus(sched, t)
        for kind in layout.file_kinds(d.collective, args.dialect):
            name = f"{stem}-{d.collective.value}{layout.file_suffix(kind)}"
            lowered = partial(lower, sched, t, dialect=args.dialect, instances=args.instances,
                              proto=args.proto, calls=kind, file_gpus=file_gpus)
            if file_gpus is not None:  # the whole text is let go once split (16K GPUs: 2.4 GB)
                files.update(node_files(name, split_per_node(
                    lowered().text, rank_nodes(sched.fabric.names, d.ranks), check_xml=False),
                    args.dialect))
                continue
            xml = lowered().text
            _check(f"{name}.xml", xml, args.dialect)
            result = run(xml, root=d.root, dialect=args.dialect)
            if not result.ok:
                raise ChoreoError(f"{name}.xml: generated file does not compute "
                                  f"{d.collective.value}: {result}")
            files[f"{name}.xml"] = _const(xml.encode())
    return files


def node_files(stem: str, parts: dict[str, str], dialect: str | None = None
               ) -> dict[str, Callable[[], bytes]]:
    """A program of more ranks than one file can hold, split as the operator ships it
    (``parts``: ``split_per_node``'s, emptied here as each is encoded): ``<stem>/<node>.xml``,
    each file validated."""
    files: dict[str, Callable[[], bytes]] = {}
    for node in list(parts):
        text = parts.pop(node)
        path = f"{stem}/{_safe(node)}.xml"
        _check(path, text, dialect)
        files[path] = _const(text.encode())
    return files


def _safe(name: str) -> str:
    """``name`` as part of one path component."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name)


def _check(name: str, xml: str, dialect: str | None) -> None:
    problems = validate(xml, dialect)
    if problems:
        raise ChoreoError(f"{name}: generated file breaks a runtime rule: {problems[0]}")


def _const(data: bytes) -> Callable[[], bytes]:
    return lambda: data


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def cmd_validate(args: argparse.Namespace) -> int:
    problems = validate(_read(args.file), args.dialect, partial=args.partial or None)
    if not problems:
        console.print(f"{args.file}: valid")
        return 0
    console.print(f"{args.file}: {len(problems)} violation(s)")
    for p in problems:
        console.print(f"  {p}", markup=False)
    return 1


def cmd_run(args: argparse.Namespace) -> int:
    result = run(_read(args.file), root=args.root, dialect=args.dialect)
    console.print(f"{args.file}: {result}", markup=False)
    return 0 if result.ok else 1
