"""Obtain the pinned control-plane binaries: build each once, then reuse the cache.

A fresh machine compiles everything from the Go module proxy (several minutes, mostly
kube-apiserver); afterwards each binary sits in ``<cache>/bin/<name>-<version>/`` and a
cluster start needs no Go at all. A file lock makes concurrent builds (a test run and a
developer's shell) wait for each other instead of racing on the same output.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from choreo_dev import paths
from choreo_dev.errors import DevClusterError, with_tail
from choreo_dev.logs import tail
from choreo_dev.versions import BINARIES, KWOK_STAGE_FILES, Binary, binary

GO_FALLBACKS = ("/usr/local/go/bin/go",)
MARKER = "build.json"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuildRecord:
    """What the cache remembers about one build, so the benchmark can report cold times."""

    name: str
    version: str
    seconds: float
    go_version: str
    built_at: float


def bin_root() -> Path:
    """Directory holding one sub-directory per cached binary."""
    return paths.cache_dir() / "bin"


def binary_dir(item: Binary) -> Path:
    """Cache directory of one component version."""
    return bin_root() / item.key


def binary_path(item: Binary) -> Path:
    """Path of the cached executable of one component version."""
    return binary_dir(item) / item.name


def kwok_stage_dir() -> Path:
    """Where the kwok stage files copied out of the kwok module live."""
    return binary_dir(binary("kwok")) / "stages"


def is_cached(item: Binary) -> bool:
    """A binary counts as cached only once its build finished and left its marker."""
    exe = binary_path(item)
    if not (exe.is_file() and os.access(exe, os.X_OK) and (binary_dir(item) / MARKER).is_file()):
        return False
    if item.name == "kwok":
        return all((kwok_stage_dir() / rel).is_file() for rel in KWOK_STAGE_FILES)
    return True


def missing(names: Iterable[str] | None = None) -> list[str]:
    """Names of the binaries (all by default) that still need a build."""
    wanted = [binary(n) for n in names] if names is not None else list(BINARIES)
    return [b.name for b in wanted if not is_cached(b)]


def record(item: Binary) -> BuildRecord | None:
    """The build record of a cached binary, or ``None`` if it was never built here."""
    try:
        data = json.loads((binary_dir(item) / MARKER).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return BuildRecord(
        name=item.name,
        version=item.version,
        seconds=float(data.get("seconds", 0.0)),
        go_version=str(data.get("go_version", "")),
        built_at=float(data.get("built_at", 0.0)),
    )


def find_go() -> str:
    """Locate the Go toolchain, or explain how to provide one."""
    candidates = [os.environ.get("CHOREO_GO", ""), shutil.which("go") or "", *GO_FALLBACKS]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and Path(candidate).is_file():
            return candidate
    raise DevClusterError(
        "the Go toolchain was not found (looked at $CHOREO_GO, `go` on PATH and "
        f"{', '.join(GO_FALLBACKS)}); install Go >= 1.24 from https://go.dev/dl/ or set "
        "CHOREO_GO to the go executable. It is needed once, to build the control plane."
    )


def go_version(go: str) -> str:
    """The toolchain's version string, e.g. ``go1.26.0``."""
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown"


def go_command(item: Binary, output: Path) -> list[str]:
    """The go invocation that produces ``item`` at ``output`` (``go install`` writes to GOBIN)."""
    flags = ["-trimpath", "-ldflags=" + " ".join(("-s", "-w", *item.ldflags))]
    if item.module_dir:
        return ["build", *flags, "-o", str(output), item.package]
    return ["install", *flags, item.package]


def go_mod_cache(go: str) -> Path:
    """The module cache that ``go install`` extracted the kwok module into."""
    out = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def copy_kwok_stages(go: str, dest: Path) -> None:
    """Copy the stage files kwok needs out of the kwok module in the Go module cache."""
    item = binary("kwok")
    src = go_mod_cache(go) / f"sigs.k8s.io/kwok@{item.version}" / "kustomize" / "stage"
    for rel in KWOK_STAGE_FILES:
        source = src / rel
        if not source.is_file():
            raise DevClusterError(f"kwok stage file {source} is missing from the Go module cache")
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


@contextmanager
def build_lock() -> Iterator[None]:
    """Serialise builds across processes sharing the cache."""
    root = bin_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_one(item: Binary, go: str, progress: Progress) -> BuildRecord:
    """Build one binary into a scratch directory, then move it into the cache atomically."""
    final_dir = binary_dir(item)
    scratch = bin_root() / f".{item.key}.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    log_path = paths.cache_dir() / "logs" / f"build-{item.key}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cwd = paths.source_dir() / item.module_dir if item.module_dir else scratch
    env = {**os.environ, "CGO_ENABLED": "0", "GOWORK": "off", "GOBIN": str(scratch)}
    progress(f"building {item.name} {item.version} (log: {log_path})")
    started = time.monotonic()
    with log_path.open("w") as log:
        result = subprocess.run(
            [go, *go_command(item, scratch / item.name)],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if result.returncode != 0 or not (scratch / item.name).is_file():
        shutil.rmtree(scratch, ignore_errors=True)
        raise DevClusterError(
            with_tail(
                f"building {item.name} {item.version} failed (exit {result.returncode}); "
                f"full log: {log_path}",
                "last lines of the build log",
                tail(log_path),
            )
        )
    if item.name == "kwok":
        copy_kwok_stages(go, scratch / "stages")
    seconds = time.monotonic() - started
    rec = BuildRecord(item.name, item.version, seconds, go_version(go), time.time())
    (scratch / MARKER).write_text(
        json.dumps(
            {"seconds": rec.seconds, "go_version": rec.go_version, "built_at": rec.built_at},
            indent=2,
        )
    )
    shutil.rmtree(final_dir, ignore_errors=True)
    scratch.rename(final_dir)
    progress(f"built {item.name} {item.version} in {seconds:.0f} s")
    return rec


def ensure(names: Iterable[str] | None = None, progress: Progress = print) -> dict[str, Path]:
    """Make sure the named binaries (all by default) are cached; return their paths.

    Only missing binaries are built, so calling this on a warm cache costs milliseconds
    and never needs the Go toolchain.
    """
    wanted = [binary(n) for n in names] if names is not None else list(BINARIES)
    if any(not is_cached(b) for b in wanted):
        go = find_go()
        with build_lock():
            for item in wanted:
                if not is_cached(item):
                    build_one(item, go, progress)
    return {b.name: binary_path(b) for b in wanted}


def resolve(names: Iterable[str]) -> dict[str, Path]:
    """Paths of already-cached binaries; explain how to build them when some are missing."""
    names = list(names)
    absent = missing(names)
    if absent:
        raise DevClusterError(
            f"control-plane binaries not built yet: {', '.join(absent)}; run `choreo-dev build` "
            f"(the first build takes about 10 minutes and is cached under {bin_root()})"
        )
    return {n: binary_path(binary(n)) for n in names}
