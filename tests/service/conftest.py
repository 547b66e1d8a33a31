"""Fixtures: real synthesizer servers on free loopback ports, always stopped."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from service_helpers import ROOT, Running, Subprocess, start_server, wait_for_port

from choreo.service.ports import listen_port


@pytest.fixture(scope="module")
def served() -> Iterator[Running]:
    """A shared server with room to spare (2 workers, 8 queued)."""
    running = start_server(workers=2, queue=8)
    try:
        yield running
    finally:
        running.client.channel.close()
        running.server.stop(grace=2.0)


@pytest.fixture
def server_factory() -> Iterator[Callable[..., Running]]:
    """Servers with custom limits, each stopped after the test."""
    started: list[Running] = []

    def make(**overrides: object) -> Running:
        running = start_server(**overrides)
        started.append(running)
        return running

    yield make
    for running in started:
        running.client.channel.close()
        running.server.stop(grace=1.0)


@pytest.fixture
def subprocess_server(tmp_path: Path) -> Iterator[Callable[..., Subprocess]]:
    children: list[Subprocess] = []

    def start(*extra: str) -> Subprocess:
        port, metrics = listen_port(), listen_port()
        log = tmp_path / f"server-{port}.log"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT / "synthesizer"), os.environ.get("PYTHONPATH", "")]))
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "choreo.service", "serve", "--host", "127.0.0.1",
                 "--port", str(port), "--metrics-port", str(metrics), *extra],
                stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
        child = Subprocess(proc, port, metrics, log)
        children.append(child)
        wait_for_port(port, proc)
        return child

    yield start
    for child in children:
        child.stop()
