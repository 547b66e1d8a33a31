"""Prometheus metrics of the operator, on their own registry and port."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry()
TENANT = ("namespace", "job", "collective")

BUSBW = Gauge("choreo_tenant_predicted_busbw_bytes_per_second",
              "Predicted bus bandwidth of the tenant's collective at its largest size bucket",
              TENANT, registry=REGISTRY)
BOUND = Gauge("choreo_tenant_bound_fraction",
              "Lower-bound time over predicted time of the tenant's collective (1 = optimal)",
              TENANT, registry=REGISTRY)
VS_NCCL = Gauge("choreo_tenant_predicted_speedup_vs_nccl",
                "NCCL's predicted time over choreo's for the tenant's collective at its largest "
                "size bucket, NCCL as it runs on the same fabric (above 1: choreo is faster)",
                TENANT, registry=REGISTRY)
RUNS_CHOREO, RUNS_NCCL = "choreo", "nccl"
RANGES = Gauge("choreo_tenant_size_ranges",
               "Size ranges of the tenant's collective by who runs them: choreo's file, or NCCL "
               "where it is predicted faster (no file is shipped there)",
               (*TENANT, "runs"), registry=REGISTRY)
RESYNTHESES = Counter("choreo_resynthesis_total",
                      "Synthesis requests per tenant group by trigger and result",
                      ("reason", "result"), registry=REGISTRY)
LATENCY = Histogram("choreo_resynthesis_latency_seconds",
                    "From the first event of a batch to the new ConfigMap written",
                    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120), registry=REGISTRY)
ROUNDS = Counter("choreo_reconcile_rounds_total",
                 "Reconciliation rounds by the first of their triggers (a settled burst of "
                 "events is one round)", ("reason",), registry=REGISTRY)
ROUND_SECONDS = Histogram("choreo_reconcile_round_duration_seconds",
                          "A reconciliation round's own work: placing, planning, launching and "
                          "bookkeeping (not the syntheses it launches)",
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
                          registry=REGISTRY)
LEADER = Gauge("choreo_operator_leader",
               "1 on the replica that holds the Lease and reconciles, 0 on a standby",
               registry=REGISTRY)
TENANTS = Gauge("choreo_tenants", "CollectiveJobs by phase", ("phase",), registry=REGISTRY)

PHASES = ("Pending", "Synthesizing", "Ready", "Degraded", "Infeasible")


def serve(port: int, addr: str = "127.0.0.1") -> int:
    """Start the /metrics endpoint; returns the bound port (``0`` picks a free one)."""
    server, _thread = start_http_server(port, addr=addr, registry=REGISTRY)
    return int(server.server_port)


def set_phases(counts: dict[str, int]) -> None:
    for phase in PHASES:
        TENANTS.labels(phase=phase).set(counts.get(phase, 0))


def forget_tenant(namespace: str, job: str, collectives: list[str]) -> None:
    for c in collectives:
        for gauge in (BUSBW, BOUND, VS_NCCL):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, job, c)
        for runs in (RUNS_CHOREO, RUNS_NCCL):
            with contextlib.suppress(KeyError):
                RANGES.remove(namespace, job, c, runs)


def forget_tenants() -> None:
    """Drop every per-tenant series: a replica that stops leading no longer speaks for them."""
    for gauge in (BUSBW, BOUND, VS_NCCL, RANGES):
        gauge.clear()
