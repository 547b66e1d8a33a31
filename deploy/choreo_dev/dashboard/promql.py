"""The dashboard's queries as plain PromQL, and a small client of the Prometheus HTTP API.

Grafana expands ``$variables`` before it sends a query; here the same expansion is done with
fixed values (every template variable "All", a fixed rate interval), which is what the
dashboard shows by default.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from choreo.errors import ChoreoError, InputError

# The chart's copy is the only copy; a source checkout finds it next to the package.
DEFAULT_DASHBOARD = Path(__file__).resolve().parents[3] / "charts/choreo/dashboards/choreo.json"

_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


@dataclass(frozen=True)
class Target:
    """One query of one panel."""

    panel: str
    ref: str
    expr: str
    legend: str


@dataclass(frozen=True)
class Series:
    """One time series of a query_range answer."""

    labels: dict[str, str]
    times: list[float]
    values: list[float]


def load(path: Path = DEFAULT_DASHBOARD) -> dict[str, Any]:
    """The dashboard JSON (a Grafana dashboard model)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"dashboard: {path} does not exist") from None
    except json.JSONDecodeError as err:
        raise InputError(f"dashboard: {path} is not JSON: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("panels"), list):
        raise InputError(f"dashboard: {path} has no panels list")
    return data


def default_variables(dashboard: dict[str, Any], rate_interval: str = "1m") -> dict[str, str]:
    """Values Grafana would substitute by default: "All" for every query variable."""
    values = {"__rate_interval": rate_interval, "__interval": rate_interval,
              "__range": "1h"}
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            values[var["name"]] = var.get("allValue") or ".*"
    return values


def expand(expr: str, variables: dict[str, str]) -> str:
    """Substitute ``$name`` and ``${name}``; an unknown variable is an error, not a blank."""
    def sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise InputError(f"dashboard: query uses undefined variable ${name}: {expr}")
        return variables[name]

    return _VAR.sub(sub, expr)


def targets(dashboard: dict[str, Any]) -> Iterator[Target]:
    """Every query of every panel (rows' nested panels included)."""
    for panel in _panels(dashboard):
        for t in panel.get("targets", []):
            yield Target(panel.get("title", ""), t.get("refId", ""), t["expr"],
                         t.get("legendFormat", ""))


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """The panels that show data, in layout order (top to bottom, left to right)."""
    shown = [p for p in _panels(dashboard) if p.get("targets")]
    return sorted(shown, key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's ``{{label}}`` legend format; without one, the label set."""
    if not fmt:
        return "{" + ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt)


class PrometheusError(ChoreoError):
    """Prometheus refused a query or could not be reached."""


class Prometheus:
    """The two read endpoints of the Prometheus HTTP API the dashboard needs."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            try:
                body = json.loads(err.read())
            except json.JSONDecodeError:
                raise PrometheusError(f"{url}: HTTP {err.code}") from None
        except OSError as err:
            raise PrometheusError(f"{self.url}: {err}") from None
        if body.get("status") != "success":
            raise PrometheusError(
                f"{params.get('query', path)}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query: the result vector."""
        data = self._get("/api/v1/query", {"query": expr})
        return list(data["result"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        """Range query: one ``Series`` per result, NaN samples dropped."""
        data = self._get("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}",
                                                 "end": f"{end:.3f}", "step": f"{step:g}"})
        if data["resultType"] != "matrix":
            raise PrometheusError(f"{expr}: expected a matrix, got {data['resultType']}")
        out = []
        for r in data["result"]:
            points = [(float(t), float(v)) for t, v in r["values"] if v not in ("NaN", "+Inf",
                                                                                  "-Inf")]
            out.append(Series(dict(r["metric"]), [t for t, _ in points],
                              [v for _, v in points]))
        return out

    def metric_names(self) -> set[str]:
        """Every metric name Prometheus holds."""
        return set(self._get("/api/v1/label/__name__/values", {}))
