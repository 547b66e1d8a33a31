"""``choreo unpack``: the pod sidecar that inflates a packed schedule for the pod's runtime.

A packed schedule's ConfigMap holds its MSCCL XML compressed (``binaryData``; zstd, or gzip
from operators before it). The kubelet
projects it into ``--source`` and swaps a new copy in whenever the ConfigMap changes (the
job's alias, once its first schedule exists). This copies every file to ``--target``,
inflating the compressed ones, the same way: each copy is written whole into a new hidden
directory and made current by renaming one symlink, ``..data``, so a runtime that lists
``msccl/`` never sees half a schedule. Top-level names point through ``..data``.

The standard library and zstandard only: it starts in every tenant pod.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zstandard

CURRENT = "..data"
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ALWAYS = ("msccl",)  # directories the runtime is pointed at, made even when empty


def version(source: Path) -> object:
    """What identifies the source's current copy: the kubelet's ``..data`` link, or (any
    other directory) every file's path, size and modification time."""
    link = source / CURRENT
    if link.is_symlink():
        return os.readlink(link)
    return tuple(sorted((str(p), st.st_size, st.st_mtime_ns)
                        for p in _files(source) if (st := p.stat())))


def _base(source: Path) -> Path:
    """Where the source's current copy is: the directory the kubelet's ``..data`` names
    now (read from it alone, a copy is never mixed with the next), else the source."""
    link = source / CURRENT
    return source / os.readlink(link) if link.is_symlink() else source


def _files(source: Path) -> list[Path]:
    """Regular files of the current copy (symlinks followed), skipping hidden ``..``
    entries."""
    out = []
    for dirpath, dirnames, filenames in os.walk(_base(source), followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith("..")]
        out += [Path(dirpath, f) for f in filenames if not f.startswith("..")]
    return out


def unpack(source: Path, target: Path) -> None:
    """Make ``target`` hold ``source``'s files, compressed ones inflated, in one step."""
    base = _base(source)
    fresh = Path(tempfile.mkdtemp(prefix="..", dir=target))
    try:
        for name in ALWAYS:
            (fresh / name).mkdir()
        for path in _files(source):
            rel = path.relative_to(base)
            body = path.read_bytes()
            if body.startswith(GZIP_MAGIC):
                body = gzip.decompress(body)
            elif body.startswith(ZSTD_MAGIC):
                body = _unzstd(body)
            (fresh / rel).parent.mkdir(parents=True, exist_ok=True)
            (fresh / rel).write_bytes(body)
        fresh.chmod(0o755)
        link = target / "..data_tmp"
        link.unlink(missing_ok=True)
        link.symlink_to(fresh.name)
        link.replace(target / CURRENT)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    names = {p.name for p in fresh.iterdir()}
    for entry in target.iterdir():
        if entry.name.startswith(".."):
            if entry.is_dir() and not entry.is_symlink() and entry != fresh:
                shutil.rmtree(entry, ignore_errors=True)  # earlier copies
        elif entry.is_symlink() and entry.name not in names:
            entry.unlink()
    for name in names:
        if not (target / name).is_symlink():
            (target / name).symlink_to(f"{CURRENT}/{name}")


def _unzstd(body: bytes) -> bytes:
    """Every zstd frame of ``body`` inflated, each checked against its checksum; a file that
    ends inside a frame is an error, not a shorter schedule."""
    out = []
    while body:
        frame = zstandard.ZstdDecompressor().decompressobj()
        out.append(frame.decompress(body))
        if not frame.eof:
            raise EOFError("compressed file ended inside a zstd frame")
        body = frame.unused_data
    return b"".join(out)


def run(source: Path, target: Path, interval: float, stop: threading.Event,
        once: bool = False) -> int:
    """Copy now, then whenever the source changes, until ``stop`` is set."""
    target.mkdir(parents=True, exist_ok=True)
    seen: object = None
    while True:
        now = version(source)
        if now != seen:
            try:
                unpack(source, target)
                seen = now
            except (OSError, EOFError, zstandard.ZstdError) as err:  # a copy swapped mid-read
                print(f"choreo unpack: {source}: {err}; trying again", file=sys.stderr)
        if once or stop.wait(interval):
            return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("unpack", help="pod sidecar: inflate a packed schedule's "
                              "ConfigMap for the pod's MSCCL runtime")
    add_arguments(p)
    p.set_defaults(func=run_command)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", type=Path, required=True,
                   help="the ConfigMap's volume (compressed files are inflated)")
    p.add_argument("--target", type=Path, required=True,
                   help="where the pod's containers read the files")
    p.add_argument("--interval", type=float, default=1.0,
                   help="seconds between looks at the source")
    p.add_argument("--once", action="store_true", help="copy once and exit")


def run_command(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return run(args.source, args.target, args.interval, stop, once=args.once)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="choreo unpack", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
