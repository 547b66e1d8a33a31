"""Health interpretation and hysteresis: fail fast, recover slowly, never storm on flaps."""

from __future__ import annotations

from choreo_agents.backends import RawHealth
from choreo_agents.health import HealthMonitor, Hysteresis, State
from choreo_agents.model import Gpu, HealthSample, Inventory, LinkSpec, Peer
from choreo_api import Device

LINK = Device.link(0, gpu=1)
INV = Inventory(
    "sim",
    (Gpu(0), Gpu(1)),
    (LinkSpec(0, Peer(gpu=1), "nvlink", 1, 25e9), LinkSpec(1, Peer(gpu=0), "nvlink", 1, 25e9)),
)


def _sample(bad: bool) -> HealthSample:
    sample = HealthSample()
    sample.mark(LINK, bad, "link down" if bad else "")
    return sample


def _drive(
    h: Hysteresis, pattern: str, step: float = 0.5, start: float = 0.0
) -> list[tuple[float, State]]:
    """Feed 'B'ad/'g'ood polls; return (time, new state) for each transition."""
    out = []
    for i, ch in enumerate(pattern):
        t = start + i * step
        out += [(t, tr.state) for tr in h.update(_sample(ch == "B"), t)]
    return out


def test_needs_consecutive_bad_polls_to_fail() -> None:
    h = Hysteresis(fail_after=2, recover_after=2.0)
    assert _drive(h, "BgBgBg") == []
    assert h.state(LINK) is State.GOOD
    assert _drive(h, "BB", start=10) == [(10.5, State.BAD)]
    assert h.reason(LINK) == "link down"


def test_recovers_only_after_the_hold_time() -> None:
    h = Hysteresis(fail_after=1, recover_after=2.0)
    transitions = _drive(h, "B" + "g" * 8)
    assert transitions == [(0.0, State.BAD), (2.5, State.GOOD)]


def test_a_flapping_link_fails_once_and_stays_failed() -> None:
    h = Hysteresis(fail_after=2, recover_after=2.0)
    transitions = _drive(h, "BBgBgBgBgBgBgBgBgBgB")
    assert transitions == [(0.5, State.BAD)]
    assert h.state(LINK) is State.BAD


def test_each_relapse_lengthens_the_hold_and_it_is_capped() -> None:
    h = Hysteresis(fail_after=1, recover_after=1.0, max_hold=4.0, flap_window=100.0)
    t = _drive(h, "B" + "g" * 4)  # fails at 0, recovers at 1.5 (hold 1)
    assert t == [(0.0, State.BAD), (1.5, State.GOOD)]
    t = _drive(h, "B" + "g" * 6, start=10)  # relapse: hold 2
    assert t == [(10.0, State.BAD), (12.5, State.GOOD)]
    t = _drive(h, "B" + "g" * 12, start=20)  # hold 4 (cap)
    assert t == [(20.0, State.BAD), (24.5, State.GOOD)]
    t = _drive(h, "B" + "g" * 12, start=30)  # still capped at 4
    assert t == [(30.0, State.BAD), (34.5, State.GOOD)]


def test_seeded_failures_resolve_after_the_hold() -> None:
    h = Hysteresis(fail_after=2, recover_after=1.0)
    h.seed_bad([LINK], now=0.0, reason="from before")
    assert h.bad() == {LINK: "from before"}
    assert _drive(h, "ggggg") == [(1.0, State.GOOD)]


def test_monitor_turns_counter_rates_into_verdicts() -> None:
    monitor = HealthMonitor(thresholds={"crc": 10.0})
    raw = RawHealth(counters={LINK: {"crc": 100.0}})
    assert not monitor.observe(INV, raw, 0.0).observations[LINK].bad  # first read primes
    raw = RawHealth(counters={LINK: {"crc": 104.0}})
    assert not monitor.observe(INV, raw, 1.0).observations[LINK].bad  # 4/s
    raw = RawHealth(counters={LINK: {"crc": 150.0}})
    obs = monitor.observe(INV, raw, 2.0).observations[LINK]
    assert obs.bad and "crc errors 46/s" in obs.reason
    raw = RawHealth(counters={LINK: {"crc": 0.0}})  # counter reset: not an error burst
    assert not monitor.observe(INV, raw, 3.0).observations[LINK].bad


def test_monitor_reports_lost_gpus_down_links_and_xid_windows() -> None:
    monitor = HealthMonitor(xid_hold=5.0)
    raw = RawHealth(gpu_present={0: True, 1: False}, link_up={LINK: False}, xids=[(0, 79)])
    sample = monitor.observe(INV, raw, 0.0)
    assert sample.observations[Device.of_gpu(1)].bad
    assert sample.observations[LINK].reason == "link down"
    assert "fallen off the bus" in sample.observations[Device.of_gpu(0)].reason
    later = monitor.observe(INV, RawHealth(), 3.0)
    assert later.observations[Device.of_gpu(0)].bad  # held
    assert not monitor.observe(INV, RawHealth(), 6.0).observations[Device.of_gpu(0)].bad


def test_nvlink_xid_marks_that_gpus_links() -> None:
    monitor = HealthMonitor()
    sample = monitor.observe(INV, RawHealth(xids=[(1, 74)]), 0.0)
    assert "NVLink error" in sample.observations[LINK].reason
    assert not sample.observations[Device.of_gpu(1)].bad


def test_unknown_xids_and_out_of_range_gpus_are_ignored() -> None:
    monitor = HealthMonitor()
    sample = monitor.observe(INV, RawHealth(xids=[(0, 13), (9, 79), (-1, 79)]), 0.0)
    assert not any(o.bad for o in sample.observations.values())


def test_partial_links_are_degraded_not_failed() -> None:
    monitor = HealthMonitor()
    sample = monitor.observe(INV, RawHealth(link_partial={LINK: "1 of 2 NVLinks inactive"}), 0.0)
    assert LINK in sample.degraded and not sample.observations[LINK].bad
