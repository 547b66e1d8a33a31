"""Starting components as background processes and stopping exactly those, by PID.

A PID alone can be reused by the kernel after a process dies, so each record also keeps
the process's start time (psutil); a stop only signals a PID whose start time matches,
which makes ``down`` safe even days after ``up``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from choreo_dev.errors import DevClusterError

STOP_TIMEOUT = 10.0


@dataclass(frozen=True)
class ProcRecord:
    """Identity of a started process: name, PID, and the start time of that PID."""

    name: str
    pid: int
    started_at: float
    argv: tuple[str, ...]
    log: str


def started_at(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch), or ``None`` if it does not exist."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def is_alive(record: ProcRecord) -> bool:
    """The recorded process still runs (and is not a zombie or a reused PID)."""
    try:
        proc = psutil.Process(record.pid)
        return (proc.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
                and proc.create_time() == record.started_at)
    except psutil.Error:
        return False


def record_path(run_dir: Path, name: str) -> Path:
    return run_dir / f"{name}.json"


def start(name: str, argv: Sequence[str], log_path: Path, run_dir: Path,
          env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session with output to ``log_path`` and record its PID.

    The new session keeps the component alive after the CLI returns and away from the
    terminal's Ctrl-C, so only ``down`` stops it.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env={**os.environ, **env} if env else None,
            cwd=cwd,
        )
    rec = ProcRecord(name, proc.pid, started_at(proc.pid) or 0.0, tuple(argv), str(log_path))
    record_path(run_dir, name).write_text(json.dumps(asdict(rec), indent=2))
    return proc


def read(run_dir: Path, name: str) -> ProcRecord | None:
    """The record of a component, if one was written."""
    try:
        data = json.loads(record_path(run_dir, name).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if "started_at" not in data:
        raise DevClusterError(f"{record_path(run_dir, name)} was written by an older choreo-dev: "
                              f"stop PID {data.get('pid')} by hand and delete the file")
    return ProcRecord(
        name=data["name"],
        pid=int(data["pid"]),
        started_at=float(data["started_at"]),
        argv=tuple(data["argv"]),
        log=data["log"],
    )


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our child, so no zombie remains."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop(record: ProcRecord, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM, wait up to ``timeout``, then SIGKILL; only if the PID is still ours."""
    if not is_alive(record):
        _reap(record.pid)
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _reap(record.pid)
            if not is_alive(record):
                return
            time.sleep(0.05)


def stop_all(run_dir: Path, names: Sequence[str]) -> list[ProcRecord]:
    """Stop the named components in order, remove their records, return what was stopped."""
    stopped = []
    for name in names:
        rec = read(run_dir, name)
        if rec is None:
            continue
        stop(rec)
        stopped.append(rec)
        record_path(run_dir, name).unlink(missing_ok=True)
    return stopped


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (0 if it is gone)."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def peak_rss_bytes(pid: int) -> int:
    """The most resident memory a process has had (Linux ``VmHWM``; 0 if it is gone or the
    kernel does not say): what a container's memory limit must allow, not what it holds now."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (none if it is gone)."""
    try:
        proc = psutil.Process(pid)
        return [pid, *(c.pid for c in proc.children(recursive=True))]
    except psutil.Error:
        return []
