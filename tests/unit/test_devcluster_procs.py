"""Components are started in the background and stopped by PID, and only by PID."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from choreo_dev import procs

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
    "time.sleep(60)",
]


def test_start_records_and_stop_kills(tmp_path: Path) -> None:
    proc = procs.start("sleeper", SLEEPER, tmp_path / "logs" / "s.log", tmp_path / "run")
    rec = procs.read(tmp_path / "run", "sleeper")
    assert rec is not None and rec.pid == proc.pid
    assert procs.is_alive(rec)
    assert procs.rss_bytes(rec.pid) > 0
    stopped = procs.stop_all(tmp_path / "run", ["sleeper"])
    assert [r.pid for r in stopped] == [proc.pid]
    assert not procs.is_alive(rec)
    assert proc.poll() is not None
    assert procs.read(tmp_path / "run", "sleeper") is None


def test_sigterm_ignoring_process_is_killed(tmp_path: Path) -> None:
    log = tmp_path / "stubborn.log"
    proc = procs.start("stubborn", STUBBORN, log, tmp_path / "run")
    rec = procs.read(tmp_path / "run", "stubborn")
    assert rec is not None
    while "up" not in log.read_text():
        pass
    procs.stop(rec, timeout=0.5)
    assert not procs.is_alive(rec)
    assert proc.poll() is not None


def test_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    proc = procs.start("sleeper", SLEEPER, tmp_path / "s.log", tmp_path / "run")
    rec = procs.read(tmp_path / "run", "sleeper")
    assert rec is not None
    impostor = dataclasses.replace(rec, started_at=rec.started_at + 1)
    assert not procs.is_alive(impostor)
    procs.stop(impostor)
    assert proc.poll() is None
    procs.stop(rec)
    assert proc.poll() is not None


def test_stopping_nothing_is_fine(tmp_path: Path) -> None:
    assert procs.stop_all(tmp_path / "run", ["etcd"]) == []
