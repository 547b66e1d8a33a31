"""The Grafana dashboard: datasource as a variable, the panels the issue asks for, and only
metric names that a component really exports (read from the components' own registries).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from choreo.errors import InputError
from choreo_dev.dashboard import promql

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts/choreo/dashboards/choreo.json"
DS = {"type": "prometheus", "uid": "${datasource}"}


def exported_names() -> set[str]:
    """Sample names of every choreo metric the operator, synthesizer, agent and reporter define."""
    from choreo.service.metrics import Metrics
    from choreo.telemetry import Reporter
    from choreo_agents.metrics import AgentMetrics
    from choreo_operator.metrics import REGISTRY

    registries: list[CollectorRegistry] = [
        Metrics().registry, REGISTRY, AgentMetrics().registry,
        Reporter(port=None, namespace="n", job="j").registry]
    names = set()
    for registry in registries:
        for family in registry.collect():
            names.add(family.name)
            kind = family.type
            if kind == "counter":
                names.add(f"{family.name}_total")
            if kind == "histogram":
                names.update(f"{family.name}_{s}" for s in ("bucket", "sum", "count"))
    return names


def test_datasource_is_a_variable_everywhere() -> None:
    d = promql.load(DASHBOARD)
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in promql.panels(d):
        assert panel["datasource"] == DS, panel["title"]
        for t in panel["targets"]:
            assert t["datasource"] == DS, (panel["title"], t["refId"])


def test_panels_cover_the_issue() -> None:
    titles = [p["title"] for p in promql.panels(promql.load(DASHBOARD))]
    assert titles == [
        "Predicted speedup vs NCCL as it runs",
        "Size ranges left to NCCL",
        "Bus bandwidth per tenant and collective: predicted vs measured",
        "Measured / predicted bus bandwidth",
        "Fraction of the lower bound",
        "Resynthesis events by reason",
        "Failure to new schedule latency",
        "Tenants by phase",
        "Link latency α per node",
        "Link bandwidth 1/β per node",
        "Unhealthy links per node",
        "Synthesis duration",
        "Synthesizer queue depth",
        "Synthesizer requests by status",
    ]


def test_latency_panels_are_histogram_quantiles() -> None:
    d = promql.load(DASHBOARD)
    for title in ("Failure to new schedule latency", "Synthesis duration"):
        panel = next(p for p in promql.panels(d) if p["title"] == title)
        exprs = [t["expr"] for t in panel["targets"]]
        assert [e.split("(")[0] for e in exprs] == ["histogram_quantile"] * 3
        assert [re.search(r"histogram_quantile\(([\d.]+)", e).group(1)  # type: ignore[union-attr]
                for e in exprs] == ["0.5", "0.9", "0.99"]
        assert all("_bucket[$__rate_interval]" in e and "by (le)" in e for e in exprs)


def test_every_metric_is_exported_by_a_component() -> None:
    exported = exported_names()
    used = {name for t in promql.targets(promql.load(DASHBOARD))
            for name in re.findall(r"\bchoreo_\w+", t.expr)}
    assert len(used) >= 13
    assert used <= exported, sorted(used - exported)


def test_layout_ids_unique_and_no_overlap() -> None:
    panels = promql.panels(promql.load(DASHBOARD))
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, p["title"]
                cells.add((x, y))
        assert g["x"] + g["w"] <= 24


def test_expand_substitutes_and_refuses_unknown_variables() -> None:
    d = promql.load(DASHBOARD)
    values = promql.default_variables(d, "2m")
    assert promql.expand('rate(x{node=~"$node"}[$__rate_interval])', values) == (
        'rate(x{node=~".*"}[2m])')
    assert promql.expand("a{n=~\"${namespace}\"}", values) == 'a{n=~".*"}'
    for t in promql.targets(d):
        assert "$" not in promql.expand(t.expr, values)
    with pytest.raises(InputError, match=r"\$cluster"):
        promql.expand("up{cluster=~\"$cluster\"}", values)


def test_legend_format() -> None:
    labels = {"namespace": "a", "job": "b", "collective": "grads"}
    assert promql.legend("{{namespace}}/{{ job }} {{collective}}", labels) == "a/b grads"
    assert promql.legend("", {"b": "2", "a": "1"}) == "{a=1, b=2}"


def test_load_rejects_what_is_not_a_dashboard(tmp_path: Path) -> None:
    bad = tmp_path / "d.json"
    bad.write_text("[1]")
    with pytest.raises(InputError, match="no panels"):
        promql.load(bad)
    with pytest.raises(InputError, match="does not exist"):
        promql.load(tmp_path / "absent.json")
