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
