"""Starting components as background processes and stopping exactly those, by PID.

A PID alone can be reused by the kernel after a process dies, so each record also keeps
the process start time from /proc; a stop only signals a PID whose start time matches,
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

STOP_TIMEOUT = 10.0


@dataclass(frozen=True)
class ProcRecord:
    """Identity of a started process: name, PID, and the kernel's start time of that PID."""

    name: str
    pid: int
    start_ticks: int
    argv: tuple[str, ...]
    log: str


def start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or ``None`` if it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces; fields after it are space separated.
    fields = raw[raw.rfind(")") + 2 :].split()
    return int(fields[19])


def proc_state(pid: int) -> str | None:
    """Single-letter process state (``R``, ``S``, ``Z``...) or ``None`` if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rfind(")") + 2 :].split()[0]


def is_alive(record: ProcRecord) -> bool:
    """The recorded process still runs (and is not a zombie or a reused PID)."""
    state = proc_state(record.pid)
    if state is None or state in ("Z", "X"):
        return False
    return start_ticks(record.pid) == record.start_ticks


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
    ticks = start_ticks(proc.pid) or 0
    rec = ProcRecord(name, proc.pid, ticks, tuple(argv), str(log_path))
    record_path(run_dir, name).write_text(json.dumps(asdict(rec), indent=2))
    return proc


def read(run_dir: Path, name: str) -> ProcRecord | None:
    """The record of a component, if one was written."""
    try:
        data = json.loads(record_path(run_dir, name).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return ProcRecord(
        name=data["name"],
        pid=int(data["pid"]),
        start_ticks=int(data["start_ticks"]),
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
    """Resident memory of a process, from /proc (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return 0
