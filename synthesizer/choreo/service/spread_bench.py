"""Scale-out benchmark: ``python -m choreo.service.spread_bench``.

Three ``choreo serve`` processes, one client channel over all of them (the operator's
``channel_options``: round-robin over SERVING replicas, retries on UNAVAILABLE). Fresh
requests (each needs a solve) are sent from a few concurrent callers; halfway through one
replica is SIGKILLed. Prints each replica's share of the solves (target: about a third each
while all three run), the failed calls (target 0), and, as the reference, the shares a
single-connection channel (``pick_first``, what one ClusterIP connection gives) gets.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console

from choreo.benchtable import Row, print_rows
from choreo.service.bench import _request, _wait_serving
from choreo.service.ports import listen_port

MISSES = re.compile(r"^choreo_synthesizer_cache_misses_total (\S+)$", re.M)


def _misses(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            found = MISSES.search(r.read().decode())
    except OSError:
        return -1
    return int(float(found.group(1))) if found else 0


def _start(log: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    port, metrics = listen_port(), listen_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "choreo.service", "serve", "--host", "127.0.0.1",
             "--port", str(port), "--metrics-port", str(metrics), "--workers", "1",
             "--warmup-topology", "ring-8"], stdout=out, stderr=subprocess.STDOUT)
    _wait_serving(f"127.0.0.1:{port}", proc)
    return proc, port, metrics


def _round(procs: list[tuple[subprocess.Popen[bytes], int, int]], requests: int, callers: int,
           balanced: bool, kill_at: int | None, seed: int) -> dict[str, object]:
    import grpc

    from choreo.service.client import Client, channel_options

    target = "ipv4:" + ",".join(f"127.0.0.1:{p}" for _, p, _ in procs)
    options = channel_options()
    if not balanced:
        options = [(k, v) for k, v in options if k != "grpc.service_config"] + [
            ("grpc.service_config", json.dumps({"loadBalancingConfig": [{"pick_first": {}}]}))]
    before = [_misses(m) for _, _, m in procs]
    seen = list(before)
    failed = 0
    with grpc.insecure_channel(target, options=options) as channel:
        client = Client(channel)
        client.synthesize(_request("warm", seed), timeout=120)
        before = seen = [_misses(m) for _, _, m in procs]

        def call(i: int) -> bool:
            try:
                client.synthesize(_request(f"t{i}", seed + 1 + i), timeout=300)
                return True
            except grpc.RpcError:
                return False

        with ThreadPoolExecutor(callers) as pool:
            futures = [pool.submit(call, i) for i in range(requests)]
            for i, fut in enumerate(futures):
                if kill_at is not None and i == kill_at:
                    seen = [_misses(m) for _, _, m in procs]  # the victim's last count
                    os.kill(procs[0][0].pid, signal.SIGKILL)
                    procs[0][0].wait(10)
                failed += not fut.result()
    after = [_misses(m) if p.poll() is None else s
             for (p, _, m), s in zip(procs, seen, strict=True)]
    return {"solves": [a - b for a, b in zip(after, before, strict=True)], "failed": failed}


def run(requests: int, callers: int, console: Console) -> bool:
    with tempfile.TemporaryDirectory(prefix="choreo-spread-") as tmp:
        procs = [_start(Path(tmp) / f"replica{i}.log") for i in range(3)]
        try:
            ref = _round(procs, requests, callers, balanced=False, kill_at=None, seed=1000)
            even = _round(procs, requests, callers, balanced=True, kill_at=None, seed=2000)
            killed = _round(procs, requests, callers, balanced=True, kill_at=requests // 2,
                            seed=3000)
        finally:
            for p, _, _ in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
    solves = even["solves"]
    assert isinstance(solves, list)
    shares = [s / max(1, sum(solves)) for s in solves]
    ref_solves = ref["solves"]
    assert isinstance(ref_solves, list)
    ref_shares = [s / max(1, sum(ref_solves)) for s in ref_solves]
    ok_spread = all(0.25 <= s <= 0.42 for s in shares)
    ok_kill = killed["failed"] == 0
    rows = [
        Row("share of fresh solves per replica (3 replicas)",
            " / ".join(f"{s:.0%}" for s in shares), "about 33% each (25-42%)",
            "one connection (pick_first): " + " / ".join(f"{s:.0%}" for s in ref_shares),
            ok_spread),
        Row("failed calls, replica 0 SIGKILLed halfway", f"{killed['failed']} of {requests}",
            "0", f"solves per replica {killed['solves']} (the victim's counted until its "
            "death)", ok_kill),
    ]
    print_rows(rows, "synthesizer scale-out", console)
    return ok_spread and ok_kill


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m choreo.service.spread_bench",
                                description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=30, help="fresh requests per round")
    p.add_argument("--callers", type=int, default=3, help="concurrent calls")
    args = p.parse_args(argv)
    if args.requests < 6 or args.callers < 1:
        p.error("need --requests >= 6 and --callers >= 1")
    return 0 if run(args.requests, args.callers, Console(highlight=False, width=160)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
