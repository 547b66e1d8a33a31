"""Settings written once: flags generated from the model, flag over environment over default."""

from __future__ import annotations

import argparse

import pytest

from choreo.settings import SettingsError, add_arguments, from_arguments
from choreo_operator.config import Config


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, Config)
    return parser.parse_args(argv)


def test_flag_wins_over_environment_which_wins_over_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert from_arguments(Config, parse([])).max_buckets == 4
    monkeypatch.setenv("CHOREO_OPERATOR_MAX_BUCKETS", "6")
    assert from_arguments(Config, parse([])).max_buckets == 6
    assert from_arguments(Config, parse(["--max-buckets", "2"])).max_buckets == 2


def test_booleans_take_a_negative_flag() -> None:
    assert from_arguments(Config, parse([])).leader_election is True
    assert from_arguments(Config, parse(["--no-leader-election"])).leader_election is False


def test_a_bad_value_names_where_it_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SettingsError, match=r"^--debounce: Input should be greater than 0"):
        from_arguments(Config, parse(["--debounce", "-1"]))
    monkeypatch.setenv("CHOREO_OPERATOR_RESTARTS", "many")
    with pytest.raises(SettingsError, match=r"^\$CHOREO_OPERATOR_RESTARTS: .*integer"):
        from_arguments(Config, parse([]))


def test_help_shows_the_variable_and_the_default() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, Config)
    text = " ".join(parser.format_help().split())
    assert "--split-bytes SPLIT_BYTES cut a schedule per pod" in text
    assert "($CHOREO_OPERATOR_SPLIT_BYTES; default 921600)" in text
