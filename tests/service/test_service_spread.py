"""Several synthesizer replicas behind one client channel: calls spread, a lost replica retried.

One gRPC channel keeps one HTTP/2 connection per address it resolves; with the shared
``channel_options`` it balances round-robin over every replica whose health is SERVING and
retries a call whose replica went away on another one.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable

from service_helpers import Running, Subprocess, quick_request, wait_serving

from choreo.service.client import Client, open_channel

MISSES = re.compile(r"^choreo_synthesizer_cache_misses_total (\S+)$", re.M)


def _misses(metrics_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        found = MISSES.search(r.read().decode())
    return int(float(found.group(1))) if found else 0


def _target(ports: list[int]) -> str:
    return "ipv4:" + ",".join(f"127.0.0.1:{p}" for p in ports)


def test_uncached_requests_spread_over_every_replica(
        server_factory: Callable[..., Running]) -> None:
    replicas = [server_factory(workers=1) for _ in range(3)]
    ports = [r.server.metrics_port for r in replicas]
    with open_channel(_target([r.server.port for r in replicas])) as channel:
        client = Client(channel)
        for i in range(30):  # until every replica is connected and SERVING to the channel
            client.synthesize(quick_request(f"warm{i}", seed=500 + i), timeout=60)
            if min(_misses(p) for p in ports) >= 1:
                break
        before = [_misses(p) for p in ports]
        assert min(before) >= 1, before
        for i in range(12):
            client.synthesize(quick_request(f"t{i}", seed=i), timeout=60)
    got = [_misses(p) - b for p, b in zip(ports, before, strict=True)]
    assert sum(got) == 12 and min(got) >= 3, got  # round-robin: about 4 each


def test_a_replica_killed_mid_call_costs_no_failed_request(
        subprocess_server: Callable[..., Subprocess]) -> None:
    replicas = [subprocess_server("--workers", "1", "--warmup-topology", "ring-8")
                for _ in range(3)]
    for r in replicas:
        wait_serving(r.address)
    with open_channel(_target([r.port for r in replicas])) as channel:
        client = Client(channel)
        for i in range(30):  # every replica READY to the channel before the real calls
            client.synthesize(quick_request(f"warm{i}", seed=100 + i), timeout=60)
            if min(_misses(r.metrics_port) for r in replicas) >= 1:
                break
        before = sum(_misses(r.metrics_port) for r in replicas[1:])
        calls = [client.future(quick_request(f"t{i}", topology="torus-8x8x4", seed=i),
                               timeout=120) for i in range(3)]
        victim = replicas[0]
        end = time.monotonic() + 60
        while "choreo_synthesizer_workers_busy 1.0" not in _scrape(victim.metrics_port):
            assert time.monotonic() < end, "the victim never started a request"
            time.sleep(0.05)
        victim.stop()  # SIGKILL with a call in flight
        answers = [c.result() for c in calls]
    assert all(a.tenants and a.tenants[0].collectives for a in answers)
    solved = sum(_misses(r.metrics_port) for r in replicas[1:]) - before
    assert solved == 3  # their own two calls, and the victim's retried on one of them


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())
