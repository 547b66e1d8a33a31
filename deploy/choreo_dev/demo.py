"""``choreo-dev demo``: the whole product on one machine, from an empty cluster to plots.

Starts a local control plane, installs choreo with its Helm chart, runs the operator, the
synthesizer and one simulated agent per fake H100 node on the host, runs two training
tenants that share the rail switches, injects a GPU and a link failure through the agents,
shows the operator resynthesizing, reads the metrics back from Prometheus and writes plots.
Every wait is bounded; everything started is stopped by PID unless ``--keep`` is given.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from choreo_dev import demo_env as E
from choreo_dev import demo_plots as P
from choreo_dev import demo_tenants as D
from choreo_dev import schedules
from choreo_dev.dashboard import promql
from choreo_dev.dashboard.render import render
from choreo_dev.errors import DevClusterError
from choreo_dev.kube import ApiException, wait_for
from choreo_dev.observe import GROUP, expected
from choreo_dev.stack import HostStack

STEPS = 9
console = Console(highlight=False)
if not console.is_terminal:
    console.width = 120  # logs and CI: wide enough for the tables


@dataclass
class Fault:
    """One injected fault and what followed, in seconds since the demo started."""

    what: str
    node: str
    tenant: str
    failure: str
    injected: float
    seen: float = 0.0  # DeviceFailure present
    scheduled: float = 0.0  # the tenant's status names a new ConfigMap
    configmap: str = ""
    synthesis_seconds: float = 0.0

    @property
    def latency(self) -> float:
        return self.scheduled - self.seen


@dataclass
class Run:
    """What the demo measured; written to ``summary.json``."""

    started: float = field(default_factory=time.monotonic)
    steps: dict[str, float] = field(default_factory=dict)
    tenants: list[dict[str, Any]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    restored: dict[str, bool] = field(default_factory=dict)
    recoveries: list[tuple[str, float, float]] = field(default_factory=list)  # lane, seen, done
    promql: dict[str, list[str]] = field(default_factory=dict)

    def now(self) -> float:
        return time.monotonic() - self.started


class Demo:
    def __init__(self, root: Path, out: Path) -> None:
        self.root, self.out = root, out
        self.run = Run()
        self.env: E.DemoEnv | None = None
        self.step_no = 0

    # ---- presentation ------------------------------------------------------------------------
    def section(self, title: str) -> None:
        self.step_no += 1
        self.run.steps[title] = round(self.run.now(), 1)
        console.rule(f"[bold cyan][{self.step_no}/{STEPS}] {title}[/]  "
                     f"[dim]t={self.run.now():.0f} s[/]", align="left")

    def wait(self, check: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.1) -> Any:
        """Poll with a spinner; fail with ``what`` after ``timeout``, or when a process died."""
        watchdog = self.env.stack.check if self.env else None
        with console.status(f"waiting for {what} (at most {timeout:.0f} s)"):
            return wait_for(check, timeout, what, interval=interval, watchdog=watchdog)

    # ---- the story ---------------------------------------------------------------------------
    def main(self) -> None:
        self.section("Local control plane")
        with console.status("starting etcd, kube-apiserver, controller-manager, scheduler, kwok"):
            bins = E.binaries()
            cluster, info = E.start_cluster(self.root, bins)
        client = cluster.client()
        self.env = E.DemoEnv(self.root, cluster, info, client, HostStack(self.root / "host"))
        console.print(f"API server [bold]{info.server}[/] "
                      f"(state in {escape(str(cluster.layout.root))})")
        with console.status("adding 8 fake GPU nodes"):
            names = E.add_nodes(client)
        console.print(f"{len(names)} kwok nodes Ready, 8 x nvidia.com/gpu each: {', '.join(names)}")

        self.section("choreo installed with the Helm chart")
        with console.status("helm install choreo charts/choreo --wait"):
            E.helm_install(self.root, info, E.helm_binary())
        self.print_chart_pods()
        console.print("kwok marks these pods Ready without running their images, so the same "
                      "commands run [bold]as host processes[/] against this API server "
                      "(as the e2e tests do):")
        E.start_choreo(self.env, E.agent_pods(client))
        E.start_prometheus(self.env)
        self.print_processes()

        self.section("Simulated fabric: 8 nodes x 8 H100-like GPUs")
        client.create(f"{GROUP}/fabrictopologies", D.fabric_topology())
        measured = self.wait(lambda: len([nf for nf in D.nodefabrics(client)
                                          if nf.get("status", {}).get("lastProbeTime")]) == 8,
                             60, "8 agents to publish measured NodeFabrics")
        assert measured
        self.print_fabric()
        self.wait(lambda: E.prometheus_targets_up(self.env.prometheus_url) if self.env else None,
                  60, "Prometheus to scrape every target")

        self.section("Two tenants sharing the rails")
        D.create_tenants(client)
        for t in D.TENANTS:
            self.wait(lambda t=t: D.phase_is(client, t, "Ready"), 120,  # type: ignore[misc]
                      f"{t.key} to be Ready")
        self.print_schedules("initial schedules")
        self.print_pod_contract()
        initial = {t.key: D.status(client, t)["configMap"] for t in D.TENANTS}
        healthy_util = self.utilization("healthy fabric")

        self.section("NPU failure: GPU 3 of h100-1 is lost")
        self.inject(D.TENANTS[0], "h100-1", {"gpu-lost": 3}, "h100-1-gpu3", "GPU lost",
                    lambda s: s.get("ranks") == 31)
        npu_util = self.utilization("after GPU h100-1/gpu3 failed")

        self.section("Link failure: GPU 2 of h100-6 loses its NVSwitch port")
        self.inject(D.TENANTS[1], "h100-6", {"link-down": [2, "sw-nvswitch"]},
                    "h100-6-link-2-sw-nvswitch", "NVLink down", lambda s: s.get("ranks") == 32)
        link_util = self.utilization("after link h100-6/gpu2-nvswitch failed")
        self.print_schedules("schedules around the failures")

        self.section("Recovery")
        self.recover(initial)

        self.section("Metrics in Prometheus")
        self.print_metrics()

        self.section("Plots")
        self.write_plots([healthy_util, npu_util, link_util])

    def print_chart_pods(self) -> None:
        assert self.env is not None
        table = Table(title=f"helm release {E.RELEASE} in {E.NAMESPACE}", title_justify="left")
        for col in ("pod", "node", "ready"):
            table.add_column(col)
        for p in E.chart_pods(self.env.client):
            ready = any(c["type"] == "Ready" and c["status"] == "True"
                        for c in p.get("status", {}).get("conditions") or [])
            table.add_row(p["metadata"]["name"], p["spec"].get("nodeName") or "-",
                          "[green]Ready[/]" if ready else "[red]not ready[/]")
        console.print(table)

    def print_processes(self) -> None:
        assert self.env is not None
        env, ports = self.env, self.env.ports
        table = Table(title="host processes (stopped by PID at the end)", title_justify="left")
        for col in ("process", "pid", "listens on", "log"):
            table.add_column(col)
        rows = [("synthesizer", f"gRPC :{ports['grpc']}, metrics :{ports['synthesizer']}"),
                ("operator", f"metrics :{ports['operator']}, webhook :{ports['webhook']}")]
        rows += [(f"agent-{n}", f"metrics :{ports[f'agent-{n}']}") for n in E.NODES]
        rows.append(("prometheus", f"http :{ports['prometheus']}"))
        for name, listens in rows:
            table.add_row(name, str(env.stack.pid(name)), f"127.0.0.1 {listens}",
                          escape(str(env.stack.log(name).relative_to(env.root))))
        console.print(table)

    def print_fabric(self) -> None:
        assert self.env is not None
        nf = next(x for x in D.nodefabrics(self.env.client)
                  if x["spec"]["nodeName"] == "h100-0")
        spec = nf["spec"]
        nv = [lk for lk in spec["links"] if lk.get("dstSwitch")]
        nic = spec.get("nics") or []
        console.print(
            f"FabricTopology [bold]{D.FABRIC_NAME}[/]: 8 nodes, preset dgx-h100, 8 IB rails at "
            f"{D.RAIL_BANDWIDTH / 1e9:.0f} GB/s per NIC.\n"
            f"Each agent (sim backend, fabric {E.FABRIC}) measured its node and published a "
            f"NodeFabric, e.g. h100-0: {len(spec['gpus'])} GPUs, {len(nv)} GPU->NVSwitch links "
            f"({nv[0]['count']} NVLinks x {nv[0]['bandwidthBytesPerSecond'] / 1e9:.0f} GB/s, "
            f"alpha {nv[0]['alphaSeconds'] * 1e6:.2f} us), {len(nic)} NICs on rails "
            f"{sorted(n.get('rail') for n in nic)}; the operator uses these over the preset.")

    def print_schedules(self, title: str) -> None:
        assert self.env is not None
        client = self.env.client
        table = Table(title=title, title_justify="left")
        for col, just in (("tenant", "left"), ("ranks", "right"), ("ConfigMap", "left"),
                          ("size", "right"), ("busbw", "right"), ("of bound", "right"),
                          ("vs NCCL", "right"), ("MSCCL check", "left")):
            table.add_column(col, justify=just)  # type: ignore[arg-type]
        for t in D.TENANTS:
            s = D.summarize(client, t)
            pub = schedules.load(client, t.namespace, D.status(client, t))
            errors = schedules.problems(pub) if pub else ["no schedule"]
            ok = (f"[green]{len(pub.files)} XML valid, run ok[/]" if pub and not errors
                  else f"[red]{escape(errors[0])}[/]")
            if pub and len(pub.configmaps) > 1:
                ok += f" ({len(pub.configmaps)} parts)"
            table.add_row(t.key, str(s.ranks), s.configmap, f"{s.size >> 20} MiB",
                          f"{s.busbw / 1e9:.0f} GB/s", f"{s.fraction:.0%}",
                          (f"{s.nccl_speedup:.2f}x ({s.nccl_choice})" if s.nccl_speedup else "-")
                          + (f", NCCL runs {s.nccl_ranges} size range(s)" if s.nccl_ranges
                             else ""), ok)
            self.run.tenants.append({"title": title, **{k: v for k, v in asdict(s).items()
                                                        if k != "tenant"}, "tenant": t.key,
                                     "nccl_speedup": s.nccl_speedup})
        console.print(table)
        console.print("[dim]Every figure comes from the CollectiveJob status at the largest "
                      "size range: busbw, the fraction of the lower bound, and the speedup over "
                      "NCCL as it runs (the synthesizer's NCCL model, with NCCL's own algorithm "
                      "and protocol choice, on the same sub-fabric). Where NCCL is predicted "
                      "faster, no file ships for those sizes and NCCL runs.[/]")

    def print_pod_contract(self) -> None:
        assert self.env is not None
        pod = D.pods(self.env.client, D.TENANTS[0])[0]
        vol = next((v for v in pod["spec"].get("volumes") or []
                    if v["name"] == "choreo-schedule"), None)
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env") or []}
        if vol is None:
            console.print("[yellow]the webhook did not inject the schedule volume[/]")
            return
        sidecar = next((c for c in pod["spec"].get("initContainers") or []
                        if c["name"] == "choreo-unpack"), None)
        how = (f"mounted ConfigMap [bold]{vol['configMap']['name']}[/] (compressed XML) into "
               f"its sidecar {sidecar['name']}, which inflates it to /etc/choreo,"
               if sidecar else
               f"mounted ConfigMap [bold]{vol['configMap']['name']}[/] at /etc/choreo and")
        console.print(f"pod {pod['metadata']['name']} on {pod['spec']['nodeName']}: the webhook "
                      f"{how} set MSCCL_ALGO_DIR={env.get('MSCCL_ALGO_DIR')}; NCCL_ALGO is left to "
                      f"the pod ({env.get('NCCL_ALGO') or 'unset'}), so calls without a file "
                      "run NCCL's own choice")

    def utilization(self, title: str) -> P.Utilization:
        assert self.env is not None
        exp = expected(self.env.client)
        assert exp.fabric is not None
        tenants = []
        for t in D.TENANTS:
            st = D.status(self.env.client, t)
            tenants.append((t.name, t.collective, D.tenant_npus(exp, t),
                            int(st["collectives"][0]["sizeBytes"])))
        return P.utilization(exp.fabric.topology, tenants, title)

    def inject(self, tenant: D.Tenant, node: str, event: dict[str, Any], failure: str,
               what: str, done: Callable[[dict[str, Any]], bool]) -> None:
        assert self.env is not None
        client = self.env.client
        before = D.status(client, tenant)["configMap"]
        other = next(t for t in D.TENANTS if t != tenant)
        other_before = D.status(client, other)["configMap"]
        fault = Fault(what, node, tenant.key, failure, self.run.now())
        D.add_fault(self.env, node, event)
        console.print(f"appended {json.dumps(event)} to {node}'s fault script; "
                      "its agent reloads it")
        df = self.wait(lambda: D.failure(client, failure), 30, f"DeviceFailure {failure}",
                       interval=0.05)
        fault.seen = self.run.now()
        console.print(f"agent opened DeviceFailure [bold]{failure}[/] ({df['spec'].get('reason')})"
                      f" {fault.seen - fault.injected:.2f} s after the fault")
        st = self.wait(lambda: (s := D.status(client, tenant)).get("configMap") not in
                       (None, before) and done(s) and s, 60,
                       f"{tenant.key} to get a schedule around {failure}", interval=0.05)
        fault.scheduled, fault.configmap = self.run.now(), st["configMap"]
        fault.synthesis_seconds = float(st["lastSynthesis"].get("durationSeconds", 0))
        self.run.faults.append(fault)
        pub = schedules.load(client, tenant.namespace, st)
        if pub is None:
            raise DevClusterError(f"{tenant.key}: status names no schedule")
        errors = schedules.problems(pub)
        failed_gpu = (node, int(event["gpu-lost"])) if "gpu-lost" in event else None
        console.print(
            f"operator resynthesized {tenant.key}: ConfigMap {before} -> [bold]{st['configMap']}"
            f"[/], {st['ranks']} ranks, phase {st['phase']}; [bold green]"
            f"{fault.latency:.2f} s[/] from DeviceFailure to the new ConfigMap "
            f"(synthesis {fault.synthesis_seconds:.2f} s)")
        verdict = ("pass msccl validate and run" if not errors
                   else f"[red]FAILED: {escape(str(errors[:2]))}[/]")
        excluded = "" if failed_gpu is None else (
            "; the failed GPU holds no rank" if failed_gpu not in pub.placed
            else "; [red]the failed GPU has a rank[/]")
        console.print(f"new schedule: {len(pub.files)} MSCCL XML file(s) {verdict}{excluded}")
        unchanged = D.status(client, other)["configMap"] == other_before
        console.print(f"{other.key}: {'schedule unchanged' if unchanged else 'resynthesized too'}"
                      f" ({'not on ' + node if unchanged else 'same synthesis group'})")
        affected = (D.failure(client, failure) or {}).get("status", {}).get("affected")
        if affected:
            console.print(f"DeviceFailure status.affected: {affected}")

    def recover(self, initial: dict[str, str]) -> None:
        assert self.env is not None
        client = self.env.client
        D.add_fault(self.env, "h100-1", {"gpu-back": 3})
        D.add_fault(self.env, "h100-6", {"link-up": [2, "sw-nvswitch"]})
        t0 = self.run.now()
        console.print("appended gpu-back and link-up; the agents hold a recovered device for "
                      "2 s (--recover-after) before resolving its DeviceFailure")
        failures = dict(zip((t.key for t in D.TENANTS),
                            ("h100-1-gpu3", "h100-6-link-2-sw-nvswitch"), strict=True))
        resolved_at: dict[str, float] = {}
        restored_at: dict[str, float] = {}

        def healed() -> bool:
            """Record when each failure is first seen resolved and each tenant restored."""
            for t in D.TENANTS:
                if t.key not in resolved_at and D.resolved(client, failures[t.key]):
                    resolved_at[t.key] = self.run.now()
                if t.key not in restored_at and D.ready_on(client, t, initial[t.key]):
                    restored_at[t.key] = self.run.now()
            return len(restored_at) == len(resolved_at) == len(D.TENANTS)

        self.wait(healed, 60, "the failures to be resolved and the original schedules back",
                  interval=0.05)
        for t in D.TENANTS:
            self.run.restored[t.key] = True
            self.run.recoveries.append((t.key, resolved_at[t.key], restored_at[t.key]))
        console.print(f"both tenants are back on their original ConfigMaps "
                      f"({', '.join(initial.values())}) {self.run.now() - t0:.1f} s after "
                      "recovery: names are content hashes, so the healed fabric gives the same "
                      "schedule")

    def print_metrics(self) -> None:
        assert self.env is not None
        prom = promql.Prometheus(self.env.prometheus_url)
        # two first schedules, two around the failures, two back after recovery
        self.wait(lambda: prom.query("sum(choreo_resynthesis_total{result=\"ok\"}) >= 6"), 30,
                  "Prometheus to scrape the last resyntheses")
        queries = {
            "choreo_tenant_predicted_speedup_vs_nccl":
                lambda r: f"{r['metric'].get('job')} {float(r['value'][1]):.2f}x",
            "choreo_tenant_predicted_busbw_bytes_per_second / 1e9":
                lambda r: f"{r['metric'].get('namespace')}/{r['metric'].get('job')} "
                          f"{float(r['value'][1]):.0f} GB/s",
            "choreo_tenant_bound_fraction":
                lambda r: f"{r['metric'].get('job')} {float(r['value'][1]):.0%}",
            "sum by (reason, result) (choreo_resynthesis_total)":
                lambda r: f"{r['metric'].get('reason')}/{r['metric'].get('result')}="
                          f"{float(r['value'][1]):.0f}",
            "histogram_quantile(0.9, sum by (le) (choreo_resynthesis_latency_seconds_bucket))":
                lambda r: f"p90 <= {float(r['value'][1]):.2f} s",
            "sum by (node) (1 - min_over_time(choreo_link_healthy[10m])) > 0":
                lambda r: f"{r['metric'].get('node')}: {float(r['value'][1]):.0f} link(s)",
            "max_over_time(sum(1 - choreo_gpu_healthy)[10m:1s])":
                lambda r: f"{float(r['value'][1]):.0f} GPU(s) down at worst",
            "sum by (code) (choreo_synthesizer_requests_total)":
                lambda r: f"{r['metric'].get('code')}={float(r['value'][1]):.0f}",
        }
        table = Table(title=f"PromQL at {self.env.prometheus_url}", title_justify="left")
        table.add_column("query")
        table.add_column("result")
        for expr, fmt in queries.items():
            rows = [fmt(r) for r in prom.query(expr)]
            self.run.promql[expr] = rows
            table.add_row(escape(expr), escape(", ".join(sorted(rows)) or "(no data)"))
        console.print(table)

    def write_plots(self, panels: list[P.Utilization]) -> None:
        assert self.env is not None
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "utilization.png").write_bytes(P.utilization_png(panels))
        marks, spans = [], []
        for f in self.run.faults:
            lane = f.tenant
            marks += [P.Mark(f.injected, lane, "fault", f.what),
                      P.Mark(f.seen, lane, "failure", "DeviceFailure"),
                      P.Mark(f.scheduled, lane, "configmap", f.configmap.rsplit("-", 1)[-1])]
            spans.append((lane, f.seen, f.scheduled))
        for lane, seen, done in self.run.recoveries:
            marks += [P.Mark(seen, lane, "recovered", "resolved"),
                      P.Mark(done, lane, "configmap", "original")]
            spans.append((lane, seen, done))
        (self.out / "resynthesis-timeline.png").write_bytes(P.timeline_png(marks, spans))
        dashboard = promql.load()
        minutes = max(2.0, self.run.now() / 60)
        data = render(dashboard, promql.Prometheus(self.env.prometheus_url),
                      self.out / "dashboard.png", minutes=minutes, step=2)
        (self.out / "summary.json").write_text(json.dumps({
            "steps": self.run.steps, "tenants": self.run.tenants,
            "faults": [{**asdict(f), "latency": f.latency} for f in self.run.faults],
            "restored": self.run.restored, "promql": self.run.promql}, indent=2))
        for name, what in (("utilization.png", "per-port link utilization: healthy, after the "
                            "GPU failure, after the link failure"),
                           ("resynthesis-timeline.png", "fault -> DeviceFailure -> ConfigMap"),
                           ("dashboard.png", f"the Grafana dashboard's {len(data)} panels drawn "
                            "from this Prometheus"),
                           ("summary.json", "every number above")):
            console.print(f"  {escape(str(self.out / name))}: {what}")


def finish(root: Path, keep: bool, env: E.DemoEnv | None) -> None:
    """Tear down by PID, or say how to use and stop what was kept."""
    if keep and env is not None:
        console.rule("[bold]Explore[/]", align="left")
        console.print(
            f"everything is still running. In another shell:\n"
            f"  export KUBECONFIG={env.info.kubeconfig}\n"
            "  choreo-dev --state-dir " + str(root / "cluster") + " kubectl get collectivejobs -A\n"
            "  choreo-dev --state-dir " + str(root / "cluster") + " kubectl get devicefailures,"
            "nodefabrics -A\n"
            "  choreo-dev --state-dir " + str(root / "cluster") + " kubectl -n team-a describe "
            "collectivejob llm-pretrain\n"
            f"  echo '{{events: [{{at: 0s, gpu-lost: 5}}]}}' > {env.script('h100-2')}   "
            "# inject a fault\n"
            f"  Prometheus: {env.prometheus_url}   logs: {env.stack.logs}\n"
            "stop everything (by PID) with:\n"
            f"  choreo-dev demo stop{'' if root == E.default_root() else f' --state {root}'}")
        return
    with console.status("stopping every process by PID"):
        stopped = E.stop(root)
    console.rule("[bold]Done[/]", align="left")
    console.print(f"stopped {len(stopped)} processes by PID. To explore instead, run "
                  "`choreo-dev demo --keep`: it leaves the cluster running, prints "
                  "`export KUBECONFIG=...`, and `choreo-dev demo stop` tears it down.")


def run(out: Path, keep: bool, root: Path | None = None) -> int:
    root = (root or E.default_root()).resolve()
    demo = Demo(root, out)
    console.print("[bold]choreo demo[/]: the operator, synthesizer and agents on a local "
                  "Kubernetes control plane with 8 simulated H100 nodes "
                  f"(output in {escape(str(out))}, state in {escape(str(root))})")
    code = 1
    try:
        demo.main()
        code = 0
    except (DevClusterError, ApiException, AssertionError) as err:
        console.print(f"[bold red]error:[/] {escape(str(err))}")
        if demo.env is not None:
            console.print(f"logs: {escape(str(demo.env.stack.logs))}, "
                          f"{escape(str(demo.env.cluster.layout.logs))}")
    except KeyboardInterrupt:
        console.print("interrupted")
        code = 130
    finally:
        finish(root, keep and code == 0, demo.env)
    total = demo.run.now()
    console.print(f"[bold]{'demo finished' if code == 0 else 'demo failed'}[/] in "
                  f"{total // 60:.0f} min {total % 60:.0f} s")
    return code


def stop(root: Path | None = None) -> int:
    stopped = E.stop((root or E.default_root()).resolve())
    print("stopped " + (", ".join(stopped) if stopped else "nothing (no demo was running)"))
    return 0
