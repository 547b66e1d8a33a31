"""Pure parts of the demo and the scenario harness: latency histograms, schedule parts,
tenant layouts, live fault scripts, host processes stopped by PID."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest
import yaml

from choreo_dev import schedules
from choreo_dev.procs import process_tree
from choreo_dev.scenarios.latency import Sampler, parse_buckets, quantile
from choreo_dev.scenarios.scale import layout
from choreo_dev.stack import HostStack, prometheus_config

METRICS = """# HELP choreo_resynthesis_latency_seconds x
choreo_resynthesis_latency_seconds_bucket{le="0.5"} 2.0
choreo_resynthesis_latency_seconds_bucket{le="1.0"} 6.0
choreo_resynthesis_latency_seconds_bucket{le="2.0"} 10.0
choreo_resynthesis_latency_seconds_bucket{le="+Inf"} 10.0
choreo_resynthesis_latency_seconds_count 10.0
"""


def test_histogram_quantiles_follow_prometheus() -> None:
    buckets = parse_buckets(METRICS)
    assert buckets == {0.5: 2.0, 1.0: 6.0, 2.0: 10.0, math.inf: 10.0}
    assert quantile(0.5, buckets) == pytest.approx(0.875)  # rank 5 in (0.5, 1]: 3/4 of it
    assert quantile(0.9, buckets) == pytest.approx(1.75)
    assert quantile(0.1, buckets) == pytest.approx(0.25)
    assert math.isnan(quantile(0.5, {}))


def test_sampler_sums_the_last_scrape_of_each_process() -> None:
    texts = iter([METRICS, METRICS.replace("10.0", "12.0"), METRICS])
    pids = iter([1, 1, 2])
    sampler = Sampler(lambda: next(texts), lambda: next(pids))
    for _ in range(3):
        sampler.sample()
    total = sampler.total()
    assert total[math.inf] == 22.0  # 12 from the first process's last scrape + 10


def test_split_schedules_are_joined_back_in_rank_order() -> None:
    head = '<algo name="a" ngpus="3">{}</algo>'
    parts = [head.format('<gpu id="2"/>'), head.format('<gpu id="0"/><gpu id="1"/>')]
    joined = schedules.join_parts(parts)
    assert joined.count("<gpu") == 3
    assert joined.index('id="0"') < joined.index('id="1"') < joined.index('id="2"')


def test_layout_gives_every_tenant_two_nodes_and_fits() -> None:
    sizes = layout(random.Random(7), 128, 20)
    assert len(sizes) == 20 and min(sizes) >= 2 and max(sizes) <= 8 and sum(sizes) <= 128
    assert sizes == layout(random.Random(7), 128, 20)  # seeded
    with pytest.raises(ValueError):
        layout(random.Random(0), 10, 6)


def test_prometheus_config_honours_labels() -> None:
    cfg = prometheus_config({"choreo-operator": ["127.0.0.1:1"]})
    assert cfg["scrape_configs"][0]["honor_labels"] is True
    assert cfg["global"]["scrape_interval"] == "1s"


def test_host_stack_starts_records_and_stops_by_pid(tmp_path: Path) -> None:
    stack = HostStack(tmp_path)
    pid = stack.start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    assert stack.alive("sleeper") and stack.pid("sleeper") == pid
    assert stack.rss_bytes("sleeper") > 0 and process_tree(pid)[0] == pid
    stopped = stack.stop_all()
    assert [r.pid for r in stopped] == [pid]
    assert not stack.alive("sleeper") and stack.names() == []


def test_add_fault_appends_an_event_due_now(tmp_path: Path) -> None:
    from choreo_dev.demo_env import DemoEnv
    from choreo_dev.demo_tenants import add_fault

    env = DemoEnv.__new__(DemoEnv)
    env.stack = HostStack(tmp_path)
    env.scripts.mkdir(parents=True)
    env.script("n").write_text("events: []\n")
    add_fault(env, "n", {"gpu-lost": 3})
    add_fault(env, "n", {"gpu-back": 3})
    events = yaml.safe_load(env.script("n").read_text())["events"]
    assert events == [{"at": "0s", "gpu-lost": 3}, {"at": "0s", "gpu-back": 3}]


def test_chaos_knows_which_failures_the_agents_must_report() -> None:
    from choreo_dev.scenarios.faults import Chaos

    chaos = Chaos.__new__(Chaos)
    chaos.broken = {("n1", "gpu", 3), ("n1", "link", 3), ("n2", "link", 5)}
    must = {"n1-gpu3", "n2-link-5-sw-nvswitch"}
    assert chaos.reported(must)
    assert chaos.reported(must | {"n1-link-3-sw-nvswitch"})  # the lost GPU's own port
    assert not chaos.reported({"n1-gpu3"})  # a fault not reported yet
    assert not chaos.reported(must | {"n3-gpu0"})  # a mended device not resolved yet
