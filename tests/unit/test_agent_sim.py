"""The simulated backend: slicing a synthesizer fabric into nodes, fault scripts, timings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from choreo.generators import build
from choreo.topofile import load_topology
from choreo_agents.backends import BackendError
from choreo_agents.backends.script import ScriptError, load_script, parse_script
from choreo_agents.backends.sim import SimBackend, machines, select_machine
from choreo_agents.fit import fit_alpha_beta
from choreo_agents.model import Peer
from choreo_agents.probes import ProbeError
from choreo_api import Device


def test_dgx_h100_node_has_switch_links_and_rail_nics() -> None:
    topo = build("dgx-h100-2")
    assert [m.prefix for m in machines(topo)] == ["node0", "node1"]
    sim = SimBackend(topo, "node1")
    inv = sim.discover()
    assert len(inv.gpus) == 8 and inv.nvswitch
    switch = [ln for ln in inv.links if ln.peer.switch]
    assert len(switch) == 8 and {ln.peer.switch for ln in switch} == {"sw-nvswitch"}
    # the preset carries the achievable 370 GB/s per GPU (NCCL's 18 x 20.6 GB/s), not the
    # 450 GB/s nominal peak; the agent reports what the fabric says
    assert all(ln.bandwidth == 370e9 and ln.kind == "nvswitch" for ln in switch)
    assert [(n.name, n.rail, n.nearest_gpu) for n in inv.nics][:2] == [
        ("mlx5_0", 0, 0),
        ("mlx5_1", 1, 1),
    ]
    nic_links = [ln for ln in inv.links if ln.peer.nic]
    assert len(nic_links) == 8 and all(ln.kind == "ib" for ln in nic_links)


def test_dgx1_double_links_become_counts() -> None:
    inv = SimBackend(build("dgx1"), "any-node-name").discover()
    counts = {(ln.src, ln.peer.gpu): ln.count for ln in inv.links}
    assert sum(counts.values()) == 48
    assert 2 in counts.values() and 1 in counts.values()
    assert not inv.nics


def test_machine_by_position_and_bad_names() -> None:
    topo = build("dgx-h100-2")
    assert select_machine(topo, 1).prefix == "node1"
    assert select_machine(topo, "0").prefix == "node0"
    with pytest.raises(BackendError, match="position 5"):
        select_machine(topo, 5)
    with pytest.raises(BackendError, match="no node 'gpu-x'"):
        select_machine(topo, "gpu-x")


def test_topology_file_fabric(tmp_path: Path) -> None:
    path = tmp_path / "pair.yaml"
    path.write_text(
        "name: pair\nnpus: 2\nlinks:\n"
        "  - {src: 0, dst: 1, bandwidth: 25GB/s, alpha: 1us, kind: nvlink, bidirectional: true}\n"
    )
    inv = SimBackend(load_topology(str(path)), "n").discover()
    assert len(inv.gpus) == 2 and len(inv.links) == 2
    assert inv.links[0].alpha == pytest.approx(1e-6)


def test_measurements_recover_the_fabric_within_noise() -> None:
    sim = SimBackend(build("dgx1"), "n", noise=0.05, seed=3)
    inv = sim.discover()
    got = sim.measure(inv.links)
    for link, samples in got.items():
        assert not isinstance(samples, Exception)
        fit = fit_alpha_beta(samples.sizes, samples.times)
        assert fit.bandwidth / link.count == pytest.approx(link.bandwidth, rel=0.05)


def test_noise_is_seeded_per_node() -> None:
    topo = build("dgx-h100-2")
    a = SimBackend(topo, "node0", seed=1).measure(SimBackend(topo, "node0").discover().links[:1])
    b = SimBackend(topo, "node0", seed=1).measure(SimBackend(topo, "node0").discover().links[:1])
    c = SimBackend(topo, "node1", seed=1).measure(SimBackend(topo, "node1").discover().links[:1])
    ta, tb, tc = (next(iter(x.values())) for x in (a, b, c))
    assert not isinstance(ta, Exception) and not isinstance(tb, Exception)
    assert not isinstance(tc, Exception)
    assert np.array_equal(ta.times, tb.times) and not np.array_equal(ta.times, tc.times)


def _sim_with(script: str, now: list[float]) -> SimBackend:
    import yaml

    return SimBackend(
        build("dgx1"), "n", script=parse_script(yaml.safe_load(script)), clock=lambda: now[0]
    )


def test_scripted_faults_drive_health_and_probes() -> None:
    now = [0.0]
    sim = _sim_with(
        """
events:
  - {at: 1s, link-down: [1, 4]}
  - {at: 3s, link-up: "1-4"}
  - {at: 1s, gpu-lost: 2}
  - {at: 1s, link-degraded: [0, 1], factor: 0.5}
  - {at: 1s, xid: {gpu: 4, code: 79}}
  - {at: 1s, link-errors: [0, 3], counter: replay, rate: 100, until: 2s}
""",
        now,
    )
    inv = sim.discover()
    l14 = Device.link(1, gpu=4)
    raw = sim.health(inv)
    assert raw.link_up[l14] and raw.gpu_present[2] and raw.xids == []
    now[0] = 1.5
    raw = sim.health(inv)
    assert not raw.link_up[l14] and not raw.gpu_present[2]
    assert raw.xids == [(4, 79)]
    assert raw.counters[Device.link(0, gpu=3)] == {"replay": 50.0}
    assert "50%" in raw.link_partial[Device.link(0, gpu=1)]
    got = sim.measure(inv.links)
    errors = {str(v) for v in got.values() if isinstance(v, ProbeError)}
    assert "link 1->gpu4 is down" in errors and "gpu2 is lost" in errors
    degraded = got[inv.link(0, Peer(gpu=1))]  # type: ignore[index]
    assert not isinstance(degraded, Exception)
    fit = fit_alpha_beta(degraded.sizes, degraded.times)
    assert fit.bandwidth / 2 == pytest.approx(25e9 / 2, rel=0.1)  # double link at half speed
    now[0] = 3.0
    assert sim.health(inv).link_up[l14]


def test_flapping_alternates_until_its_end() -> None:
    now = [0.0]
    sim = _sim_with("events: [{at: 0, link-flapping: [0, 1], period: 1s, until: 4s}]", now)
    inv = sim.discover()
    key = Device.link(0, gpu=1)
    states = []
    for t in (0.1, 0.6, 1.1, 1.6, 4.5):
        now[0] = t
        states.append(sim.health(inv).link_up[key])
    assert states == [False, True, False, True, True]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"events": [{"at": "2s"}]}, r"events\[0\]: needs exactly one of"),
        ({"events": [{"link-down": [1, 5]}]}, r"events\[0\].at: missing"),
        ({"events": [{"at": "soon", "link-down": [1, 5]}]}, r"events\[0\].at: 'soon'"),
        ({"events": [{"at": 1, "link-down": [1, 1]}]}, "two different GPUs"),
        ({"events": [{"at": 1, "link-degraded": [0, 1], "factor": 2}]}, r"\.factor"),
        ({"events": [{"at": 1, "link-flapping": [0, 1]}]}, r"\.period"),
        ({"events": [{"at": 3, "link-flapping": [0, 1], "period": 1, "until": 2}]}, "later than"),
        ({"events": [{"at": 1, "link-errors": [0, 1], "counter": "ecc", "rate": 1}]}, "counter"),
        ({"events": [{"at": 1, "gpu-lost": -1}]}, "non-negative integer"),
        ({"events": [{"at": 1, "link-down": [1, 5], "colour": "red"}]}, "unexpected key"),
        ({"faults": []}, "unknown key"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_bad_scripts_name_the_field(doc: object, message: str) -> None:
    with pytest.raises(ScriptError, match=message):
        parse_script(doc, "s.yaml")


def test_edited_script_is_reloaded_and_past_events_apply_at_once(tmp_path: Path) -> None:
    path = tmp_path / "faults.yaml"
    path.write_text("events: []\n")
    now = [10.0]
    sim = SimBackend(build("dgx1"), "n", script=load_script(path), clock=lambda: now[0],
                     script_path=path)
    inv = sim.discover()
    assert all(sim.health(inv).gpu_present.values())
    path.write_text("events:\n  - {at: 0s, gpu-lost: 3}\n")
    assert sim.health(inv).gpu_present[3] is False
    # a broken edit keeps the previous script
    path.write_text("events: [\n")
    assert sim.health(inv).gpu_present[3] is False
    # an edit naming a device the node lacks is refused too
    path.write_text("events:\n  - {at: 0s, gpu-lost: 99}\n")
    assert sim.health(inv).gpu_present[3] is False
    path.write_text("events:\n  - {at: 0s, gpu-lost: 3}\n  - {at: 0s, gpu-back: 3}\n")
    assert sim.health(inv).gpu_present[3] is True


def test_script_files(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("events:\n  - {at: 500ms, nic-down: mlx5_0}\n")
    assert load_script(good).events[0].at == pytest.approx(0.5)
    bad = tmp_path / "bad.yaml"
    bad.write_text("events: [\n")
    with pytest.raises(ScriptError, match="not valid YAML"):
        load_script(bad)
    with pytest.raises(ScriptError, match="cannot read"):
        load_script(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ("{at: 1, link-down: [1, 7]}", "link 1-7"),
        ("{at: 1, gpu-lost: 8}", "gpu 8"),
        ("{at: 1, nic-down: mlx5_9}", "NIC mlx5_9"),
        ("{at: 1, link-down: [0, sw-nvswitch]}", "link 0-sw-nvswitch"),
    ],
)
def test_scripts_naming_devices_the_node_lacks_are_rejected(event: str, message: str) -> None:
    with pytest.raises(BackendError, match=message):
        _sim_with(f"events: [{event}]", [0.0])
