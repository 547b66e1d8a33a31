"""``python -m choreo_dev.dashboard --prometheus URL --out dashboard.png``: draw the dashboard."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from choreo.errors import ChoreoError
from choreo_dev.dashboard.promql import DEFAULT_DASHBOARD, Prometheus, default_variables, load
from choreo_dev.dashboard.render import render


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m choreo_dev.dashboard", description=__doc__)
    p.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    p.add_argument("--out", type=Path, required=True, help="PNG to write")
    p.add_argument("--dashboard", type=Path, default=DEFAULT_DASHBOARD,
                   help="Grafana dashboard JSON (default: the chart's)")
    p.add_argument("--minutes", type=float, default=15.0, help="time range to draw")
    p.add_argument("--rate-interval", default="1m", help="value of $__rate_interval")
    args = p.parse_args(argv)
    try:
        dashboard = load(args.dashboard)
        data = render(dashboard, Prometheus(args.prometheus), args.out, minutes=args.minutes,
                      variables=default_variables(dashboard, args.rate_interval))
    except ChoreoError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    empty = [d.title for d in data if not d.points]
    print(f"wrote {args.out}: {len(data)} panels"
          + (f", no data in: {', '.join(empty)}" if empty else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
