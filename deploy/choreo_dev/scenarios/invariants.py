"""What must hold once the operator has caught up, whatever happened before.

- converged: every tenant's status records the inputs hash this snapshot of the API gives
  (so its schedule was synthesized for the fabric as it is now, failures included);
- verified: its MSCCL files pass ``msccl.validate`` and ``msccl.run`` with one GPU per rank;
- healthy devices only: no rank sits on a GPU the current fabric counts as failed;
- no ConfigMap lost: every status names ConfigMaps that exist;
- no ConfigMap orphaned: every schedule ConfigMap is owned by a CollectiveJob that exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from choreo_dev import schedules
from choreo_dev.kube import KubeClient
from choreo_dev.observe import Expected, expected
from choreo_operator.model import resumed
from choreo_operator.reconciler import Settings

JOB_LABEL = "choreo.dev/collectivejob"


@dataclass
class Report:
    tenants: int = 0
    converged: int = 0
    verified: int = 0
    configmaps: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.converged == self.verified == self.tenants


def converged(client: KubeClient, settings: Settings | None = None) -> list[str]:
    """Tenants whose status is not yet what the current objects call for (empty: all are)."""
    exp = expected(client, settings)
    return [f"{key}: {why}" for key, why in _lagging(exp).items()]


def _lagging(exp: Expected) -> dict[str, str]:
    out = {}
    for job in exp.inputs.jobs:
        plan = exp.plans.get(job.key)
        status = resumed(job)
        synthesizing = any(c.type == "Synthesizing" and c.status == "True"
                           for c in status.conditions or ())
        if plan is None:
            why = exp.blocked.get(job.key, ("?", "?", "no plan"))
            out[job.key] = f"blocked ({why[1]}: {why[2]})"
        elif (status.last_synthesis and status.last_synthesis.inputs_hash) != plan.inputs_hash:
            out[job.key] = "status records older inputs"
        elif synthesizing:
            out[job.key] = "still synthesizing"
    return out


def check(client: KubeClient, settings: Settings | None = None) -> Report:
    """Every invariant above, over every CollectiveJob in the cluster."""
    exp = expected(client, settings)
    report = Report(tenants=len(exp.inputs.jobs))
    lagging = _lagging(exp)
    report.problems += [f"{k}: not converged: {why}" for k, why in lagging.items()]
    report.converged = report.tenants - len(lagging)
    failed: set[tuple[str, int]] = set()
    if exp.fabric is not None:
        by_id = {v: k for k, v in exp.fabric.gpu_ids.items()}
        failed = {by_id[v] for v in exp.fabric.topology.failed if v in by_id}
    jobs = {(j["metadata"]["namespace"], j["metadata"]["name"]): j
            for j in client.get("/apis/choreo.dev/v1alpha1/collectivejobs")["items"]}
    uids = {j["metadata"]["uid"] for j in jobs.values()}
    for (ns, name), job in sorted(jobs.items()):
        st = job.get("status") or {}
        pub = schedules.load(client, ns, st)
        if pub is None:
            why = [f"{c['type']}={c['status']} {c.get('reason')}: {c.get('message', '')[:200]}"
                   for c in st.get("conditions") or [] if c["status"] == "True"]
            report.problems.append(f"{ns}/{name}: no schedule ({'; '.join(why)})")
            continue
        errors = schedules.problems(pub)
        bad = sorted(pub.placed & failed)
        if bad:
            errors.append(f"ranks on failed GPUs {bad}")
        if len(pub.ranks) != st.get("ranks"):
            errors.append(f"{len(pub.ranks)} ranks published, status says {st.get('ranks')}")
        report.problems += [f"{ns}/{name}: {e}" for e in errors]
        report.verified += not errors
    cms = client.get(f"/api/v1/configmaps?labelSelector={JOB_LABEL}")["items"]
    report.configmaps = len(cms)
    for cm in cms:
        owners = {o.get("uid") for o in cm["metadata"].get("ownerReferences") or []}
        if not owners & uids:
            report.problems.append(f"ConfigMap {cm['metadata']['namespace']}/"
                                   f"{cm['metadata']['name']} is orphaned")
    return report
