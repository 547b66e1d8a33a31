"""Load benchmark of the synthesizer service: ``python -m choreo.service.bench``.

A server runs as its own process (as in a Deployment) and 16 clients hammer it in closed
loops for ``--seconds``, each on its own channel: most repeat 64-GPU requests already in the
cache, a few send fresh 64-GPU requests that each need a solve (a new seed every time). The
clients are asyncio tasks in one process per 4 CPUs, so that the load generator itself
costs little of the machine it shares with the server. Prints
measured | target | reference for latency (cached and fresh apart), throughput, errors and
the server's peak memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console

from choreo.benchtable import Row, print_rows
from choreo.service.ports import listen_port

TOPOLOGY = "3d-rfs-64"
MIN_BYTES, MAX_BYTES = 1 << 20, 1 << 30
CACHED_TARGET_P50 = 0.005


@dataclass
class Sample:
    kind: str  # cached | fresh
    latency: float
    code: str
    cache_hit: bool


@dataclass
class Memory:
    server_peak: int = 0  # bytes, VmHWM of the server process
    worker_peak: int = 0  # bytes, highest VmHWM of any worker process
    total_peak: int = 0  # bytes, highest sum of RSS over the server and its workers
    samples: list[int] = field(default_factory=list)


def _request(tenant: str, seed: int) -> Any:
    from choreo.generators import build
    from choreo.service.client import RequestOptions, TenantRequest, build_request

    fabric = build(TOPOLOGY)
    tenant_request = TenantRequest.one(tenant, fabric.npus, "allreduce", MIN_BYTES, MAX_BYTES)
    return build_request(fabric, [tenant_request], RequestOptions(seed=seed, codec="zstd"))


def _clients(first: int, kinds: list[str], address: str, ids: list[str], start_at: float,
             stop_at: float, out: Any) -> None:
    """One process driving several closed-loop clients (asyncio tasks, a channel each):
    send, wait, record, repeat until ``stop_at``."""
    asyncio.run(_drive(first, kinds, address, ids, start_at, stop_at, out))


async def _drive(first: int, kinds: list[str], address: str, ids: list[str], start_at: float,
                 stop_at: float, out: Any) -> None:
    import grpc

    from choreo.service.api import SYNTHESIZE, pb

    pool = [_request(f"cached-{k}", k).SerializeToString() for k in range(len(ids))]
    known = []
    for k, result_id in enumerate(ids):
        req = _request(f"cached-{k}", k)
        req.known_result_id = result_id
        known.append(req.SerializeToString())
    options = [("grpc.max_receive_message_length", 64 << 20)]

    async def one(index: int, kind: str) -> list[tuple[str, float, str, bool]]:
        rng = random.Random(index)
        template = _request(f"fresh-{index}", 0)
        samples = []
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            call = channel.unary_unary(SYNTHESIZE, request_serializer=None,
                                       response_deserializer=pb.SynthesizeResponse.FromString)
            await call(pool[0], timeout=60)  # connect before the clock starts
            await asyncio.sleep(max(0.0, start_at - time.time()))
            seq = 0
            while time.time() < stop_at:
                if kind == "fresh":
                    seq += 1
                    template.options.seed = 1_000_000 * (index + 1) + seq
                    payload = template.SerializeToString()
                else:
                    payload = (pool if kind == "cached" else known)[rng.randrange(len(pool))]
                t0 = time.perf_counter()
                try:
                    resp = await call(payload, timeout=600)
                    code = "OK" if resp.not_modified == (kind == "revalidate") else "WRONG"
                    hit = resp.cache_hit
                except grpc.aio.AioRpcError as err:
                    code, hit = err.code().name, False
                samples.append((kind, time.perf_counter() - t0, code, hit))
        return samples

    results = await asyncio.gather(*(one(first + i, k) for i, k in enumerate(kinds)))
    out.put([s for r in results for s in r])


def _floor_server(port: int, response: bytes, workers: int, queue: int,
                  stop_at: float) -> None:
    """A gRPC server that answers every Synthesize call with one prebuilt response, built as
    the service builds its own (thread pool, options): what the transport alone costs a cache
    hit on this machine."""
    import grpc

    from choreo.service.api import MAX_MESSAGE_BYTES, SERVICE
    from choreo.service.server import rpc_server

    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Synthesize": grpc.unary_unary_rpc_method_handler(
            lambda _request, _context: response, request_deserializer=None,
            response_serializer=None)})
    server = rpc_server(workers, queue, MAX_MESSAGE_BYTES)
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination(timeout=max(0.0, stop_at - time.time()))
    server.stop(0)


def _drive_clients(address: str, kinds: list[str], ids: list[str], client_procs: int,
                   seconds: float) -> list[tuple[str, float, str, bool]]:
    """Run the closed-loop clients, spread over processes, for ``seconds``."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 8.0  # room for the client processes to start and connect
    stop_at = start_at + seconds
    shares = [list(range(len(kinds)))[p::client_procs] for p in range(client_procs)]
    procs = [ctx.Process(target=_clients, args=(
        share[0], [kinds[i] for i in share], address, ids, start_at, stop_at, out))
        for share in shares if share]
    for p in procs:
        p.start()
    results: list[tuple[str, float, str, bool]] = []
    try:
        for _ in procs:
            results.extend(out.get(timeout=seconds + 900))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return results


def _floor(response: bytes, clients: int, client_procs: int, seconds: float, workers: int,
           queue: int) -> dict[str, float]:
    """Cached-path latency and rate against ``_floor_server``, same clients, same response."""
    ctx = mp.get_context("spawn")
    port = listen_port()
    server = ctx.Process(target=_floor_server,
                         args=(port, response, workers, queue, time.time() + seconds + 120))
    server.start()
    try:
        _wait_serving_port(f"127.0.0.1:{port}")
        results = _drive_clients(f"127.0.0.1:{port}", ["cached"] * clients, ["-"],
                                 client_procs, seconds)
    finally:
        server.kill()
        server.join()
    lat = [r[1] for r in results if r[2] == "OK"]
    return {"p50": _pct(lat, 0.5), "throughput": len(lat) / seconds,
            "errors": len(results) - len(lat)}


def _wait_serving_port(address: str, timeout: float = 60) -> None:
    import grpc

    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=timeout)


def _descendants(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _status_kib(pid: int, key: str) -> int:
    """A memory figure of /proc/PID/status in bytes: VmHWM, the peak, is not in psutil."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _watch_memory(pid: int, mem: Memory, stop: threading.Event) -> None:
    while not stop.is_set():
        kids = _descendants(pid)
        mem.server_peak = max(mem.server_peak, _status_kib(pid, "VmHWM"))
        mem.worker_peak = max([mem.worker_peak] + [_status_kib(k, "VmHWM") for k in kids])
        total = _status_kib(pid, "VmRSS") + sum(_status_kib(k, "VmRSS") for k in kids)
        mem.total_peak = max(mem.total_peak, total)
        mem.samples.append(total)
        stop.wait(0.25)


def _wait_serving(address: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    end = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise RuntimeError("server did not become SERVING")


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run(seconds: float, clients: int, fresh_clients: int, revalidate_clients: int,
        workers: int, cached: int, client_procs: int, console: Console) -> dict[str, Any]:
    from choreo.service.client import Client, open_channel

    port, metrics_port = listen_port(), listen_port()
    address = f"127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "choreo.service", "serve", "--host", "127.0.0.1",
           "--port", str(port), "--metrics-port", str(metrics_port), "--workers", str(workers),
           "--queue", str(clients), "--warmup-topology", TOPOLOGY]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    mem, stop_watch = Memory(), threading.Event()
    watcher = threading.Thread(target=_watch_memory, args=(server.pid, mem, stop_watch),
                               daemon=True)
    try:
        _wait_serving(address, server)
        watcher.start()
        console.print(f"server pid {server.pid} on {address}, {workers} worker(s); "
                      f"warming {cached} cached 64-GPU requests")
        solo: dict[str, float] = {}
        with open_channel(address) as channel:
            client = Client(channel)
            first, ids = [], []
            for k in range(cached):
                t0 = time.perf_counter()
                resp = client.synthesize(_request(f"cached-{k}", k), timeout=600)
                first.append(time.perf_counter() - t0)
                ids.append(resp.result_id)
                if k == 0:
                    floor_response = resp.SerializeToString()
            solo["fresh_alone"] = statistics.median(first)
            solo["bytes"] = resp.ByteSize()
            hits = []
            payload = _request("cached-0", 0).SerializeToString()
            for _ in range(200):
                t0 = time.perf_counter()
                client.synthesize(payload, timeout=30)
                hits.append(time.perf_counter() - t0)
            solo["cached_alone"] = statistics.median(hits)
            plain = _request("plain", 0)
            plain.options.xml_encoding = 0
            client.synthesize(plain, timeout=600)
            plain_hits = []
            for _ in range(100):
                t0 = time.perf_counter()
                resp = client.synthesize(plain, timeout=30)
                plain_hits.append(time.perf_counter() - t0)
            solo["plain_cached_alone"] = statistics.median(plain_hits)
            solo["plain_bytes"] = resp.ByteSize()

        kinds = (["fresh"] * fresh_clients + ["revalidate"] * revalidate_clients
                 + ["cached"] * (clients - fresh_clients - revalidate_clients))
        console.print(f"{clients} clients ({fresh_clients} fresh, {revalidate_clients} "
                      f"revalidating, {kinds.count('cached')} cached) in "
                      f"{min(client_procs, clients)} process(es) for {seconds:g} s")
        results = _drive_clients(address, kinds, ids, client_procs, seconds)
    finally:
        stop_watch.set()
        if server.poll() is None:
            os.kill(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(server.pid, signal.SIGKILL)
                server.wait()
    cached_clients = clients - fresh_clients - revalidate_clients
    floor = (_floor(floor_response, cached_clients, client_procs, min(seconds, 15.0), workers,
                    clients) if cached_clients else None)
    samples = [Sample(*r) for r in results]
    cached_lat = [s.latency for s in samples if s.kind == "cached" and s.code == "OK"]
    fresh_lat = [s.latency for s in samples if s.kind == "fresh" and s.code == "OK"]
    reval_lat = [s.latency for s in samples if s.kind == "revalidate" and s.code == "OK"]
    errors = [s for s in samples if s.code != "OK"]
    wrong_hits = sum(1 for s in samples if s.code == "OK" and s.cache_hit != (s.kind != "fresh"))
    return {
        "seconds": seconds, "clients": clients, "fresh_clients": fresh_clients,
        "workers": workers, "cpus": os.cpu_count(), "client_procs": client_procs,
        "requests": len(samples), "errors": len(errors),
        "error_codes": sorted({s.code for s in errors}), "wrong_cache_flags": wrong_hits,
        "cached": {"count": len(cached_lat), "p50": _pct(cached_lat, 0.5),
                   "p99": _pct(cached_lat, 0.99)},
        "fresh": {"count": len(fresh_lat), "p50": _pct(fresh_lat, 0.5),
                  "p99": _pct(fresh_lat, 0.99)},
        "revalidate": {"count": len(reval_lat), "p50": _pct(reval_lat, 0.5),
                       "p99": _pct(reval_lat, 0.99)},
        "revalidate_clients": revalidate_clients,
        "throughput": len(samples) / seconds,
        "cached_throughput": len(cached_lat) / seconds,
        "revalidate_throughput": len(reval_lat) / seconds,
        "fresh_throughput": len(fresh_lat) / seconds,
        "memory": {k: v for k, v in asdict(mem).items() if k != "samples"},
        "memory_last_quarter_vs_first": _drift(mem.samples),
        "alone": solo,
        "transport_floor": floor,
        "exit_code": server.returncode,
    }


def _drift(samples: list[int]) -> float:
    """Mean RSS of the last quarter of the run over the second quarter (1.0: flat)."""
    if len(samples) < 8:
        return float("nan")
    q = len(samples) // 4
    return statistics.mean(samples[-q:]) / statistics.mean(samples[q:2 * q])


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms"


def report(r: dict[str, Any], console: Console) -> bool:
    mib = 1 << 20
    c, f, a, m = r["cached"], r["fresh"], r["alone"], r["memory"]
    ok_p50 = c["p50"] <= CACHED_TARGET_P50
    ok_err = r["errors"] == 0 and r["wrong_cache_flags"] == 0
    title = (f"synthesizer service: {r['clients']} clients ({r['client_procs']} process(es)) "
             f"x {r['seconds']:g} s, 64-GPU AllReduce 1 MiB..1 GiB in 4 buckets ({TOPOLOGY}), "
             f"{r['workers']} worker(s) on {r['cpus']} CPU(s)")
    rows = [
        Row("cached p50", _ms(c["p50"]), "<= 5 ms",
            f"one client alone: {_ms(a['cached_alone'])}", ok_p50),
    ]
    floor = r.get("transport_floor")
    if floor:
        rows.append(Row(
            "cached p50, transport alone", _ms(floor["p50"]), "-",
            f"a gRPC server answering the same {a['bytes'] / mib:.2f} MiB response from memory, "
            f"same clients: {floor['throughput']:.0f} req/s (the service "
            f"{r['cached_throughput']:.0f}/s)"))
    rows += [
        Row("cached p99", _ms(c["p99"]), "-",
            f"plain-XML hit alone: {_ms(a['plain_cached_alone'])} "
            f"({a['plain_bytes'] / mib:.1f} MiB vs {a['bytes'] / mib:.2f} MiB zstd)"),
    ]
    v = r["revalidate"]
    if v["count"]:
        rows.append(Row("revalidated p50 / p99", f"{_ms(v['p50'])} / {_ms(v['p99'])}", "-",
                        "known_result_id matched: not_modified, no body"))
    rows += [
        Row("fresh p50", f"{f['p50']:.2f} s", "-",
            f"one fresh request alone: {a['fresh_alone']:.2f} s"),
        Row("fresh p99", f"{f['p99']:.2f} s", "-", "queueing behind the other fresh"),
        Row("throughput", f"{r['throughput']:.0f} req/s", "-",
            f"cached {r['cached_throughput']:.0f}/s, revalidated "
            f"{r['revalidate_throughput']:.0f}/s, fresh {r['fresh_throughput']:.2f}/s"),
        Row("errors", str(r["errors"]), "0",
            f"{r['requests']} requests; codes {r['error_codes'] or 'none'}; "
            f"{r['wrong_cache_flags']} wrong cache flags", ok_err),
        Row("server peak RSS", f"{m['server_peak'] / mib:.0f} MiB", "bounded",
            f"all processes {m['total_peak'] / mib:.0f} MiB peak; worker "
            f"{m['worker_peak'] / mib:.0f} MiB; late/early "
            f"{r['memory_last_quarter_vs_first']:.2f}"),
    ]
    print_rows(rows, title, console)
    return ok_p50 and ok_err


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m choreo.service.bench", description=__doc__)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--fresh-clients", type=int, default=2,
                   help="clients sending only fresh requests (the rest repeat cached ones)")
    p.add_argument("--revalidate-clients", type=int, default=0,
                   help="clients repeating cached requests with known_result_id set")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                   help="server worker processes (default: CPUs - 1, one left for serving)")
    p.add_argument("--cached", type=int, default=8, help="distinct cached requests")
    p.add_argument("--client-procs", type=int, default=max(1, (os.cpu_count() or 1) // 4),
                   help="processes the clients are spread over (asyncio inside each); "
                   "default one per 4 CPUs, since on a small machine more load-generator "
                   "processes only fight the server for the CPU")
    p.add_argument("--json", help="also write the numbers to this file")
    args = p.parse_args(argv)
    if (not 0 <= args.fresh_clients + args.revalidate_clients <= args.clients
            or min(args.fresh_clients, args.revalidate_clients) < 0 or args.seconds <= 0
            or args.cached < 1):
        p.error("need 0 <= --fresh-clients + --revalidate-clients <= --clients, "
                "--seconds > 0, --cached >= 1")
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=160)
    result = run(args.seconds, args.clients, args.fresh_clients, args.revalidate_clients,
                 args.workers, args.cached, max(1, args.client_procs), console)
    ok = report(result, console)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
