"""Random large rail fabrics with failed GPUs and NICs: the rail-hierarchical plan (or on a
healthy fabric the block plan, where estimated faster) always verifies, its program fits one
ConfigMap per node and passes the MSCCL validator, and the CLI ships a file only where the
NCCL model is not predicted faster.

Up to four GPUs and NICs fail, so at least half the rails stay whole and every rank owns one
part (``choreo.hierarchy.owners_of``); beyond that hosts hand parts to mates, and such a
program may exceed the executor runtime's threadblock limits (the lowering then names the
limit and no file ships)."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from choreo import cli
from choreo.blockgather import block_gather
from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.hierarchy import radices
from choreo.msccl.api import to_xml
from choreo.msccl.split import MAX_CONFIGMAP_BYTES, split_per_node
from choreo.msccl.validate import validate
from choreo.nccl.compare import versus_nccl
from choreo.simulate import simulate
from choreo.synth import SynthOptions, auto_chunks, synthesize
from choreo.topology import NodeKind
from choreo.transforms import fail_links, fail_npus
from choreo.verify import verify


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts=st.integers(33, 40), failed_gpus=st.integers(0, 2), failed_nics=st.integers(0, 2),
       size_mib=st.sampled_from([16, 256, 1024]), seed=st.integers(0, 2**16))
def test_rail_plans_on_damaged_fabrics(hosts: int, failed_gpus: int, failed_nics: int,
                                       size_mib: int, seed: int) -> None:
    rnd = random.Random(seed)
    fabric = build(f"dgx-h100-{hosts}")
    gpus = rnd.sample(list(fabric.npus), failed_gpus)
    rails = [i for i, lk in enumerate(fabric.links)
             if fabric.kinds[lk.dst] is NodeKind.SWITCH and "rail" in fabric.node_name(lk.dst)
             and lk.src not in gpus]
    nics = [(fabric.links[i].src, fabric.links[i].dst) for i in rnd.sample(rails, failed_nics)]
    damaged = fail_links(fail_npus(fabric, gpus), nics)
    alive = tuple(v for v in damaged.npus if v not in damaged.failed)
    size = size_mib << 20
    demand = Demand(Collective.ALLREDUCE, alive, size,
                    auto_chunks(damaged, Collective.ALLREDUCE, size, len(alive)))
    s = synthesize(damaged, [demand], SynthOptions(relay=False))
    # a healthy fabric may take the block plan where it is estimated faster
    assert s.engine == "rail-hierarchical" or (s.engine == "block-gather"
                                               and not failed_gpus and not failed_nics)
    verdict = verify(s)
    assert verdict.ok, verdict.summary()
    xml = to_xml(s, 0)
    files = split_per_node(xml, [damaged.names[r].split("/")[0] for r in s.demands[0].ranks])
    assert max(len(text.encode()) for text in files.values()) <= MAX_CONFIGMAP_BYTES
    assert validate(xml) == []


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts=st.integers(33, 36), failed_gpus=st.integers(0, 2),
       size_mib=st.sampled_from([16, 1024]), seed=st.integers(0, 2**16))
def test_the_cli_ships_a_file_only_where_nccl_is_not_faster(
        tmp_path_factory: pytest.TempPathFactory, hosts: int, failed_gpus: int, size_mib: int,
        seed: int) -> None:
    fabric = build(f"dgx-h100-{hosts}")
    gpus = random.Random(seed).sample(list(fabric.npus), failed_gpus)
    out = tmp_path_factory.mktemp("msccl")
    fail = ",".join(f"npu:{g}" for g in gpus)
    argv = ["synthesize", "-t", fabric.name, "-c", "allreduce", "-s", f"{size_mib}MiB",
            "--no-relay", "--no-baselines", "--msccl-out", str(out / "files"),
            "-o", str(out / "run")] + (["--fail", fail] if fail else [])
    assert cli.main(argv) == 0
    summary = json.loads((out / "run" / "summary.json").read_text())
    damaged = fail_npus(fabric, gpus)
    alive = tuple(v for v in damaged.npus if v not in damaged.failed)
    ours = summary["tenants"][0]["time"]
    vs = versus_nccl(damaged, Demand(Collective.ALLREDUCE, alive, size_mib << 20), ours)
    assert vs is not None
    shipped = (out / "files").exists() and any((out / "files").iterdir())
    assert shipped == (ours <= vs.nccl_s), (shipped, ours, vs.nccl_s)


# Host counts whose prime factors are all levels of the block plan (at most 19).
SMOOTH_HOSTS = [h for h in range(33, 97) if math.prod(radices(h)) == h]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts=st.sampled_from(SMOOTH_HOSTS),
       collective=st.sampled_from([Collective.ALLGATHER, Collective.REDUCESCATTER]),
       size_mib=st.sampled_from([16, 256, 1024]))
def test_block_plans_verify_fit_a_configmap_per_node_and_beat_nccl(
        hosts: int, collective: Collective, size_mib: int) -> None:
    """The block-doubling plan on rail fabrics of 33-96 hosts: verified, every node's file
    within one ConfigMap and clean in the validator, and ahead of the NCCL model (its ring
    pays an alpha per rank, the plan one per level)."""
    fabric = build(f"dgx-h100-{hosts}")
    size = size_mib << 20
    demand = Demand(collective, tuple(fabric.npus), size,
                    auto_chunks(fabric, collective, size, len(fabric.npus)))
    s = block_gather(fabric, [demand])
    verdict = verify(s)
    assert verdict.ok, verdict.summary()
    xml = to_xml(s, 0)
    files = split_per_node(xml, [fabric.names[r].split("/")[0] for r in s.demands[0].ranks])
    assert max(len(text.encode()) for text in files.values()) <= MAX_CONFIGMAP_BYTES
    assert validate(next(iter(files.values()))) == []
    vs = versus_nccl(fabric, demand, float(simulate(s).makespan))
    assert vs is not None and vs.speedup > 1.0, vs
