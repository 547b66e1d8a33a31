"""The shared benchmark table: verdicts and the gate a benchmark run exits with."""

import json

from rich.console import Console

from choreo.benchtable import Row, exit_code, print_rows, write_json


def test_missed_target_fails_the_run_and_reported_rows_do_not(tmp_path):
    rows = [Row("a", "1 s", "<= 2 s", "ref", True), Row("b", "3", "-", "ref")]
    assert exit_code(rows) == 0
    assert exit_code([*rows, Row("c", "9 s", "<= 2 s", "ref", False)]) == 1
    write_json(rows, tmp_path / "rows.json")
    assert json.loads((tmp_path / "rows.json").read_text())[0]["case"] == "a"


def test_table_shows_each_verdict_and_escapes_markup():
    console = Console(record=True, width=160)
    print_rows([Row("x[1]", "1", "t", "r", False, group="g")], "title", console)
    text = console.export_text()
    assert "x[1]" in text and "NO" in text and "group" in text


def test_cli_group_runs_only_when_named(monkeypatch):
    from choreo_dev import synth_bench as bench

    ran: list[str] = []
    for name in ("_scale_rows", "_growth_rows", "_quality_rows", "_table_v_rows", "_cli_rows"):
        monkeypatch.setattr(bench, name, lambda quick, name=name: ran.append(name) or [])
    console = Console(record=True, width=160)
    bench.run_bench(quick=True, only=None, json_path=None, console=console)
    assert "_cli_rows" not in ran and "_scale_rows" in ran
    ran.clear()
    bench.run_bench(quick=True, only="cli", json_path=None, console=console)
    assert ran == ["_cli_rows"]


def test_cli_run_reports_its_own_exit_code_time_and_peak_memory():
    from choreo_dev.synth_bench import run_cli

    rc, seconds, peak, err = run_cli(["-t", "ring-4", "-s", "4KiB", "--restarts", "1"])
    assert rc == 0, err
    assert seconds > 0 and peak > 1 << 20
    rc, _, _, err = run_cli(["-t", "no-such-fabric"])
    assert rc == 2 and "error" in err
