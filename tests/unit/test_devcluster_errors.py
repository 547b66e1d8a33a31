"""Failures of the local-cluster tooling read as sentences, never as tracebacks."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from choreo_dev import build, cli
from choreo_dev.cluster import Cluster, early_exit_message
from choreo_dev.errors import DevClusterError
from choreo_dev.logs import tail
from choreo_dev.versions import binary


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CHOREO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CHOREO_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "cache"


def test_missing_go_toolchain(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHOREO_GO", "")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(build, "GO_FALLBACKS", ("/nonexistent/go",))
    with pytest.raises(DevClusterError, match="Go toolchain was not found"):
        build.ensure(["etcd"])


def test_cli_prints_error_without_traceback(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CHOREO_GO", "")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(build, "GO_FALLBACKS", ("/nonexistent/go",))
    assert cli.main(["cluster", "up"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the Go toolchain was not found")
    assert "Traceback" not in err


def test_failed_build_shows_the_end_of_its_log(
    empty_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_go = tmp_path / "go"
    fake_go.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = env ]; then echo go1.0; exit 0; fi\n'
        "echo compiling...; echo 'main.go:3: undefined: etcdmain' ; exit 2\n"
    )
    fake_go.chmod(fake_go.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CHOREO_GO", str(fake_go))
    with pytest.raises(DevClusterError) as info:
        build.ensure(["etcd"])
    message = str(info.value)
    assert "building etcd v3.6.8 failed (exit 2)" in message
    assert "undefined: etcdmain" in message
    assert not build.is_cached(binary("etcd"))
    assert not list((empty_cache / "bin").glob(".*partial"))


def test_resolve_says_how_to_build(empty_cache: Path) -> None:
    with pytest.raises(DevClusterError, match="run `choreo-dev build`"):
        build.resolve(["kube-apiserver"])


def test_early_exit_message_quotes_the_log_and_spots_port_clashes(tmp_path: Path) -> None:
    log = tmp_path / "etcd.log"
    clash = "listen tcp 127.0.0.1:2379: bind: address already in use\n"
    log.write_text("starting\n" + "noise\n" * 50 + clash)
    message = early_exit_message("etcd", 1, log)
    assert "etcd exited early (exit code 1)" in message
    assert "address already in use" in message
    assert "port was taken" in message
    assert message.count("noise") < 20


def test_tail_of_missing_log_is_empty(tmp_path: Path) -> None:
    assert tail(tmp_path / "nope.log") == []


def test_commands_on_a_stopped_cluster_explain_how_to_start(
    empty_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["cluster", "env"]) == 1
    assert "choreo-dev cluster up" in capsys.readouterr().err
    assert cli.main(["nodes", "add", "--count", "2"]) == 1
    assert "not running" in capsys.readouterr().err


def test_status_of_a_never_started_cluster(empty_cache: Path) -> None:
    cluster = Cluster(Path(os.environ["CHOREO_STATE_DIR"]))
    assert not any(cluster.status().values())
    with pytest.raises(DevClusterError, match="no cluster"):
        cluster.info()


def test_bad_cli_label_is_explained() -> None:
    with pytest.raises(DevClusterError, match="key=value"):
        cli.parse_labels(["novalue"])
    with pytest.raises(DevClusterError, match="4x2"):
        cli.parse_dims("4by2")
