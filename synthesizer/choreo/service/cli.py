"""``choreo serve`` and ``choreo synthesize --remote``: the service's two command-line faces.

``register`` adds ``serve`` and the ``--remote*`` flags of ``synthesize`` to the main
parser; ``remote_synthesize`` builds the fabric and tenants exactly as the local path does,
sends them, and prints the same kind of summary from the response.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table

from choreo.errors import ChoreoError, InputError

console = Console(stderr=False, highlight=False)


def register(sub: Any) -> None:
    """Add ``serve`` to ``sub``, and to its ``synthesize`` command the remote flags and the
    dispatch of ``--remote`` to the service (a ``choreo.commands`` entry point)."""
    p = sub.add_parser("serve", help="run the gRPC synthesizer service")
    from choreo.service.server import ServerConfig
    from choreo.settings import add_arguments

    add_arguments(p, ServerConfig)
    p.set_defaults(func=cmd_serve)

    synth = sub.choices.get("synthesize")
    if synth is not None:
        r = synth.add_argument_group("remote synthesis")
        r.add_argument("--remote", metavar="ADDR",
                       help="ask a synthesizer service (host:port) instead of solving here")
        r.add_argument("--remote-ca", help="CA (PEM) to verify the server; enables TLS")
        r.add_argument("--remote-cert", help="client certificate (PEM) for mutual TLS")
        r.add_argument("--remote-key", help="client key (PEM) for mutual TLS")
        r.add_argument("--remote-timeout", type=float, default=300.0,
                       help="seconds before the call gives up (DEADLINE_EXCEEDED)")
        r.add_argument("--max-size", help="with --remote: the upper end of a size range from "
                       "--size; one MSCCL file per size bucket")
        local = synth.get_default("func")
        synth.set_defaults(func=lambda args: (remote_synthesize if args.remote else local)(args))


# ---- serve -----------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    from choreo.service.server import ServerConfig, SynthesizerServer
    from choreo.settings import SettingsError, from_arguments

    try:
        cfg = from_arguments(ServerConfig, args)
    except SettingsError as err:
        raise InputError(str(err)) from None
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = SynthesizerServer(cfg)
    server.install_signal_handlers()
    port = server.start()
    print(f"choreo synthesizer listening on {cfg.host}:{port}", file=sys.stderr, flush=True)
    server.wait()
    return 0


# ---- synthesize --remote ---------------------------------------------------------------------


def remote_synthesize(args: argparse.Namespace) -> int:
    """The local ``synthesize`` inputs, solved by the service at ``args.remote``."""
    from choreo.cli import listed, load_fabric, write_all
    from choreo.collectives import Collective, parse_size
    from choreo.msccl.cli import node_files
    from choreo.msccl.layout import MAX_CHILDREN
    from choreo.msccl.split import rank_nodes, split_per_node
    from choreo.service.client import (
        Client,
        RequestOptions,
        TenantRequest,
        bucket_xml,
        build_request,
        open_channel,
    )
    from choreo.service.status import details_of
    from choreo.tenants import TenantSpec, load_tenants

    if args.restarts < 1:
        raise InputError("--restarts: must be at least 1")
    fabric = load_fabric(args.topology, args.fail)
    if args.tenants:
        specs, _relay = load_tenants(args.tenants, fabric)
    else:
        if args.chunks is not None and args.chunks < 1:
            raise InputError(f"--chunks: must be at least 1, got {args.chunks}")
        specs = [TenantSpec(name="tenant0", ranks=tuple(fabric.npus),
                            collective=Collective.parse(args.collective, "--collective"),
                            size=parse_size(args.size, "--size"), chunks=args.chunks,
                            root=args.root)]
    top = parse_size(args.max_size, "--max-size") if getattr(args, "max_size", None) else 0
    tenants = [TenantRequest.one(s.name, s.ranks, s.collective, s.size, max(top, s.size),
                                 s.chunks, s.root, s.weight) for s in specs]
    engine = getattr(args, "engine", "greedy")
    request = build_request(fabric, tenants, RequestOptions(
        dialect=getattr(args, "dialect", ""), instances=getattr(args, "instances", 0),
        protocol=getattr(args, "proto", ""), restarts=args.restarts,
        deadline_seconds=0.0 if engine == "greedy" else getattr(args, "deadline", 0.0),
        ship_slower_than_nccl=bool(getattr(args, "force", False)), seed=args.seed,
        engine=engine, codec="zstd"))  # a tenth of the bytes or less: large files run to GBs
    try:
        channel = open_channel(args.remote, ca=args.remote_ca, cert=args.remote_cert,
                               key=args.remote_key)
    except OSError as err:
        raise InputError(f"--remote-ca/--remote-cert/--remote-key: {err}") from None
    with channel:
        try:
            response = Client(channel).synthesize(request, timeout=args.remote_timeout)
        except grpc.RpcError as err:
            raise ChoreoError(_describe(args.remote, err, details_of(err))) from None
    ok = print_response(response)
    xml: dict[str, Any] = {}
    ranks = {s.name: s.ranks for s in specs}
    for t in response.tenants:
        # as the operator ships it: a tenant of more ranks than one file holds, per node
        hosts = (rank_nodes(fabric.names, ranks[t.name])
                 if len(ranks[t.name]) > MAX_CHILDREN else None)
        for c in t.collectives:
            for b in c.buckets:
                if b.nccl_runs:
                    continue
                if hosts is not None:
                    xml.update(node_files(b.file_name.removesuffix(".xml"), split_per_node(
                        bucket_xml(b), hosts, check_xml=False)))
                    continue
                data = bucket_xml(b).encode()
                xml[b.file_name] = lambda data=data: data
    msccl_out = getattr(args, "msccl_out", None)
    if msccl_out:
        write_all(Path(msccl_out), xml)
        console.print(f"wrote {', '.join(listed(xml))} to {msccl_out}")
    if args.out:
        from google.protobuf.json_format import MessageToDict

        summary = MessageToDict(response)
        for t in summary.get("tenants", []):
            for c in t.get("collectives", []):
                for b in c.get("buckets", []):
                    b.pop("xml", None)
                    b.pop("xmlGzip", None)
        files = {**xml, "summary.json": lambda: json.dumps(summary, indent=2).encode()}
        write_all(Path(args.out), files)
        console.print(f"wrote {', '.join(listed(files))} to {args.out}")
    return 0 if ok else 1


def _describe(address: str, err: grpc.RpcError, details: dict[str, Any]) -> str:
    code = err.code() if hasattr(err, "code") else None
    text = err.details() if hasattr(err, "details") else str(err)
    out = f"{address}: {code.name if code else 'error'}: {text}"
    bad = details.get("BadRequest")
    if bad is not None:
        fields = ", ".join(v.field for v in bad.field_violations)
        out += f" (field: {fields})"
    return out


def print_response(response: Any) -> bool:
    """A table per tenant and collective, like the local summary; True if all verified."""
    from choreo.cli import _fmt_time
    from choreo.collectives import format_size

    ok = all(b.verification.ok for t in response.tenants for c in t.collectives
             for b in c.buckets)
    console.print(f"[bold]{response.engine}[/] schedules from the synthesizer"
                  f"{' (cache hit)' if response.cache_hit else ''}: "
                  + ("[green]verified[/]" if ok else "[red]FAILED verification[/]")
                  + f", synthesized in {_fmt_time(response.synthesis_seconds)}, "
                  f"fabric {response.fabric_fingerprint[:12]}")
    for t in response.tenants:
        for c in t.collectives:
            table = Table(title=f"{t.name}: {c.collective}", title_justify="left")
            for col, justify in (("sizes", "left"), ("chunks", "right"), ("time", "right"),
                                 ("algbw GB/s", "right"), ("busbw GB/s", "right"),
                                 ("lower bound", "right"), ("of bound", "right"),
                                 ("vs NCCL", "right"), ("verified", "left"), ("file", "left")):
                table.add_column(col, justify=justify)  # type: ignore[arg-type]
            for b in c.buckets:
                p = b.prediction
                sizes = (format_size(b.min_bytes) if b.min_bytes == b.max_bytes
                         else f"{format_size(b.min_bytes)} .. {format_size(b.max_bytes)}")
                table.add_row(sizes, str(b.chunks), _fmt_time(p.time_seconds),
                              f"{p.algbw_bytes_per_second / 1e9:.1f}",
                              f"{p.busbw_bytes_per_second / 1e9:.1f}",
                              _fmt_time(p.lower_bound_seconds), f"{p.fraction_of_bound:.1%}",
                              f"{p.speedup_vs_nccl:.2f}x" if p.nccl_choice else "-",
                              "[green]yes[/]" if b.verification.ok else "[red]no[/]",
                              "none: NCCL runs" if b.nccl_runs else b.file_name)
            console.print(table)
            for b in c.buckets:
                if b.nccl_runs:
                    console.print(f"  {format_size(b.min_bytes)} .. {format_size(b.max_bytes)}: no "
                                  f"MSCCL file: NCCL ({b.prediction.nccl_choice}) is predicted "
                                  f"{1 / b.prediction.speedup_vs_nccl:.2f}x faster; NCCL runs "
                                  "its own algorithm (--force ships the file anyway)")
            for b in c.buckets:
                for e in b.verification.errors:
                    console.print(f"  [red]{e}[/]")
    return ok
