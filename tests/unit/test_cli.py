"""The choreo command as a user meets it: results, bad input, and no partial output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from choreo.cli import main
from choreo.schedule import Schedule
from choreo.verify import verify


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "choreo.cli", *args], capture_output=True,
                          text=True, timeout=300, check=False)


def test_synthesize_writes_a_verified_schedule_and_summary(tmp_path: Path):
    out = tmp_path / "out"
    proc = run("synthesize", "-t", "torus-4x4", "-c", "allreduce", "-s", "64MiB",
               "--out", str(out), "--plot")
    assert proc.returncode == 0, proc.stderr
    assert "verified" in proc.stdout and "lower bound" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "schedule.json", "summary.json", "timeline.png", "utilization.png"]
    sched = Schedule.load(out / "schedule.json")
    assert verify(sched).ok
    summary = json.loads((out / "summary.json").read_text())
    tenant = summary["tenants"][0]
    assert summary["verified"] and 0 < tenant["fraction_of_bound"] <= 1
    assert tenant["baselines"] and all(v > 0 for v in tenant["baselines"].values())
    assert (out / "utilization.png").read_bytes()[:4] == b"\x89PNG"


def test_verify_and_simulate_read_a_written_schedule(tmp_path: Path):
    out = tmp_path / "o"
    assert main(["synthesize", "-t", "ring-4", "-s", "4MiB", "--out", str(out),
                 "--no-baselines"]) == 0
    assert main(["verify", str(out / "schedule.json")]) == 0
    assert main(["simulate", str(out / "schedule.json"), "--no-baselines"]) == 0
    doc = json.loads((out / "schedule.json").read_text())
    doc["transfers"]["start"][0] += 1.0  # break causality and link timing
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(doc))
    assert main(["verify", str(broken)]) == 1


def test_tenants_file(tmp_path: Path):
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants:\n"
        "  - {name: a, ranks: 0-7, collective: allreduce, size: 32MiB, weight: 2}\n"
        "  - {name: b, ranks: [8, 9, 10, 11, 12, 13, 14, 15], collective: allgather,"
        " size: 16MiB}\n")
    out = tmp_path / "o"
    proc = run("synthesize", "-t", "torus-4x4", "--tenants", str(tenants), "--out", str(out),
               "--no-baselines")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [t["name"] for t in summary["tenants"]] == ["a", "b"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-t", "torus-0x4"], "torus"),
        (["-t", "nosuch-8"], "unknown"),
        (["-t", "missing.yaml"], "no such file"),
        (["-t", "ring-4", "-c", "allmagic"], "unknown collective"),
        (["-t", "ring-4", "-s", "0"], "--size"),
        (["-t", "ring-4", "-s", "2TiB"], "--size"),
        (["-t", "ring-4", "-s", "lots"], "--size"),
        (["-t", "ring-4", "--chunks", "0"], "--chunks"),
        (["-t", "ring-4", "--fail", "npu:99"], "99"),
        (["-t", "ring-6", "--fail", "link:0-1,link:3-4"], "disconnected"),
        (["-t", "ring-2", "--fail", "npu:1"], "at least 2"),
    ],
)
def test_bad_input_is_one_clear_line_and_writes_nothing(tmp_path: Path, args, message):
    out = tmp_path / "out"
    proc = run("synthesize", *args, "--out", str(out), "--no-baselines")
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not out.exists()
    assert not list(tmp_path.iterdir())  # no staging leftovers either


def test_bad_topology_file_names_file_and_field(tmp_path: Path):
    bad = tmp_path / "fab.yaml"
    bad.write_text("npus: 2\nlinks:\n  - {src: 0, dst: 1, bandwidth: -5, alpha: 0}\n")
    proc = run("synthesize", "-t", str(bad))
    assert proc.returncode == 2
    assert "fab.yaml" in proc.stderr and "bandwidth" in proc.stderr


def test_bad_tenants_file_names_the_field(tmp_path: Path):
    tenants = tmp_path / "t.yaml"
    tenants.write_text("tenants:\n  - {name: a, ranks: 0-3, collective: allreduce, size: -1}\n")
    proc = run("synthesize", "-t", "ring-4", "--tenants", str(tenants))
    assert proc.returncode == 2
    assert "tenants[0].size" in proc.stderr


def test_topologies_lists_builtins():
    proc = run("topologies")
    assert proc.returncode == 0
    for name in ("3d-rfs-N", "dgx1", "torus-AxB[xC]", "dgx-h100-K"):
        assert name in proc.stdout
    detail = run("topologies", "dgx1")
    assert "8 NPUs" in detail.stdout
