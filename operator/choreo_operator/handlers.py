"""The kopf wiring: indexes over every input, change detection, the webhook, start and stop.

Indexes keep compact values (``model``) of FabricTopologies, NodeFabrics, DeviceFailures,
Nodes, CollectiveJobs and Pods. Event handlers only decide whether a change matters (its
compact value differs from the last one seen) and poke the reconciler, which reads the
indexes when a burst has settled. Nothing here patches the watched objects, so kopf needs no
finalizers or annotations on them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kopf
from kubernetes_asyncio.config import ConfigException
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from choreo_api import GROUP, VERSION, CollectiveJob, DeviceFailure, FabricTopology, NodeFabricSpec
from choreo_api.kube import describe
from choreo_operator import certs, metrics, model, sources, toggles, webhook
from choreo_operator.config import Config
from choreo_operator.kube import CALL_ERRORS, Kube, connection_info, load_configuration
from choreo_operator.leader import Election, ElectionThread
from choreo_operator.reconciler import Inputs, Reconciler, Settings
from choreo_operator.synthclient import SynthesizerClient

log = logging.getLogger("choreo.operator")
toggles.install()  # index readiness in wake-ups linear in the objects listed
registry = kopf.OperatorRegistry()
G, V = GROUP, VERSION


class Runtime:
    """Per-process state handed to handlers through kopf's memo."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.api = Kube()
        # Lease renewals on their own connections: never queued behind bulk ConfigMap writes.
        self.lease_api = Kube(pool=2)
        self.indices: Any = None
        self.seen: dict[tuple[str, str], int] = {}
        self.synth = SynthesizerClient(
            config.synthesizer,
            Path(config.synthesizer_ca).read_bytes() if config.synthesizer_ca else None)
        self.reconciler = self.new_reconciler()
        self.task: asyncio.Task[None] | None = None
        self.webhook_task: asyncio.Task[None] | None = None
        self.elector = ElectionThread(self.lease_api, Election(
            config.lease_namespace, config.lease_name, config.identity)
        ) if config.leader_election else None
        self.stepped_down_at: int | None = None  # the Lease's transitions when this stopped
        self.webhook_ca = b""
        self.sources = sources.Resolver()

    @property
    def leading(self) -> bool:
        """Whether this replica reconciles: a standby only keeps its indexes warm."""
        return self.elector is None or self.elector.leading

    def new_reconciler(self) -> Reconciler:
        """A reconciler with nothing in memory: it learns each job's state from its status."""
        config = self.config
        return Reconciler(self.read, self.api, self.synth, Settings(
            quiet_seconds=config.debounce, max_delay_seconds=config.max_delay,
            call_timeout_seconds=config.timeout, restarts=config.restarts,
            max_buckets=config.max_buckets, split_bytes=config.split_bytes,
            request_slots=config.max_requests, packed=config.unpack_image is not None,
            keep_replaced_seconds=config.keep_replaced))

    def _values(self, name: str) -> Iterator[Any]:
        index = self.indices[name] if self.indices is not None else {}
        for store in index.values():
            yield from store

    def read(self) -> Inputs:
        nodes = {n.name: n for n in self._values("node_idx")}
        invalid: list[model.Invalid] = []

        def valid(name: str) -> list[Any]:
            values = list(self._values(name))
            invalid.extend(v for v in values if isinstance(v, model.Invalid))
            return [v for v in values if not isinstance(v, model.Invalid)]

        # a FabricTopology with spec.source becomes an ordinary one here
        resolved = self.sources.resolve_all(valid("fabric_idx"), nodes,
                                            self._values("kueue_topology_idx"),
                                            self._values("hypernode_idx"))
        return Inputs(
            fabrics=[ft for ft, _ in resolved],
            node_fabrics={nf.node_name: nf for nf in valid("nodefabric_idx")},
            failures=valid("failure_idx"),
            nodes=nodes,
            jobs=valid("job_idx"),
            pods=list(self._values("pod_idx")),
            notes={ft.name: notes for ft, notes in resolved if notes},
            invalid=invalid,
        )

    def changed(self, kind: str, key: str, value: Any, deleted: bool) -> bool:
        """Whether the compact value of an object differs from the last one seen."""
        if deleted:
            return self.seen.pop((kind, key), None) is not None
        digest = hash(value)
        if self.seen.get((kind, key)) == digest:
            return False
        self.seen[(kind, key)] = digest
        return True


def _rt(memo: Any) -> Runtime:
    rt: Runtime = memo.runtime
    return rt


# ---- lifecycle -------------------------------------------------------------------------------


@kopf.on.login(registry=registry)
async def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo | None:
    """One set of credentials for kopf's watches and choreo's writes, reloaded on every login
    (kopf logs in again after a 401, e.g. once a rotated token has replaced the old one)."""
    rt = _rt(memo)
    try:
        cfg = await load_configuration(rt.config.kubeconfig)
    except ConfigException as err:
        log.error("no Kubernetes credentials: %s", describe(err))
        return None
    await rt.api.login(cfg)
    if rt.elector is not None:  # the Lease client lives on the election's own loop
        await rt.elector.call(rt.lease_api.login(cfg))
    return await connection_info(cfg)


@kopf.on.startup(registry=registry)
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    rt = _rt(memo)
    cfg = rt.config
    rt.indices = kwargs.get("indices") or _indices(kwargs)
    settings.peering.standalone = True
    settings.scanning.disabled = True
    settings.posting.enabled = False
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 30
    if cfg.metrics_port >= 0:
        port = metrics.serve(cfg.metrics_port, cfg.metrics_addr)
        log.info("metrics on http://%s:%d/metrics", cfg.metrics_addr, port)
    if cfg.webhook_port > 0:
        host = cfg.webhook_host or cfg.webhook_addr
        cert_dir = Path(cfg.webhook_cert_dir)
        if (cert_dir / "tls.crt").exists() and (cert_dir / "tls.key").exists():
            serving = certs.ServingCert((cert_dir / "ca.crt").read_bytes()
                                        if (cert_dir / "ca.crt").exists() else b"",
                                        cert_dir / "tls.crt", cert_dir / "tls.key")
        else:
            serving = certs.make(cert_dir, [host, cfg.webhook_addr, "localhost"])
        settings.admission.server = kopf.WebhookServer(
            addr=cfg.webhook_addr, port=cfg.webhook_port, host=host,
            certfile=str(serving.cert_path), pkeyfile=str(serving.key_path))
        rt.webhook_ca = serving.ca_pem
    if rt.elector is None:
        await _lead(rt)
        return
    metrics.LEADER.set(0)

    async def lead() -> None:
        assert rt.elector is not None
        if rt.elector.transitions != rt.stepped_down_at:
            # Another replica led meanwhile: what this one knew may be stale, so it starts
            # over from the jobs' statuses. Otherwise (renewals only stalled) it goes on.
            rt.reconciler = rt.new_reconciler()
        await _lead(rt)

    async def step_down() -> None:
        # Stop writing at once (in-flight syntheses are dropped and redone when leading).
        assert rt.elector is not None
        rt.stepped_down_at = rt.elector.transitions
        if rt.task is not None:
            rt.task.cancel()
        await rt.reconciler.stop()
        metrics.LEADER.set(0)
        metrics.forget_tenants()

    await rt.elector.start(lead, step_down)


async def _lead(rt: Runtime) -> None:
    """Start reconciling (and point the webhook here): this replica is the active one."""
    cfg = rt.config
    metrics.LEADER.set(1)
    rt.task = asyncio.create_task(rt.reconciler.run(), name="choreo-reconciler")
    rt.reconciler.poke("leader")  # a full round: the events seen while standing by were not
    if cfg.webhook_port > 0 and cfg.webhook_config:
        rt.webhook_task = asyncio.create_task(_register_webhook(rt), name="choreo-webhook")


def _indices(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k.endswith("_idx")}


async def _register_webhook(rt: Runtime) -> None:
    cfg = rt.config
    host = cfg.webhook_host or cfg.webhook_addr
    url = f"https://{host}:{cfg.webhook_port}/inject"
    retrying = AsyncRetrying(  # the API may not be reachable yet; never fatal
        retry=retry_if_exception_type(CALL_ERRORS), stop=stop_after_attempt(30),
        wait=wait_exponential(multiplier=1.0, max=10.0), reraise=True,
        before_sleep=lambda state: log.warning(
            "configuring webhook %s (attempt %d): %s", cfg.webhook_config,
            state.attempt_number, state.outcome.exception() if state.outcome else None))
    try:
        async for attempt in retrying:
            with attempt:
                await webhook.point_at(rt.api, cfg.webhook_config, url, rt.webhook_ca)
    except CALL_ERRORS as err:
        log.error("gave up configuring webhook %s: %s", cfg.webhook_config, describe(err))
        return
    log.info("MutatingWebhookConfiguration %s points at %s", cfg.webhook_config, url)


@kopf.on.cleanup(registry=registry)
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    rt = _rt(memo)
    if rt.elector is not None:
        rt.elector.cancel()
    if rt.task is not None:
        rt.task.cancel()
    await rt.reconciler.stop()
    if rt.elector is not None:
        # nothing is written after this: a standby may lead now
        await rt.elector.close(rt.lease_api.close)
    await rt.synth.close()
    await rt.api.close()


# ---- indexes ---------------------------------------------------------------------------------


# choreo's own kinds are held as API models, or as Invalid saying what does not fit.
@kopf.index(G, V, "fabrictopologies", registry=registry)
def fabric_idx(body: kopf.Body, **_: Any) -> dict[str, FabricTopology | model.Invalid]:
    return {body["metadata"]["name"]: model.fabric_topology(body)}


@kopf.index(G, V, "nodefabrics", registry=registry)
def nodefabric_idx(body: kopf.Body, **_: Any) -> dict[str, NodeFabricSpec | model.Invalid]:
    nf = model.node_fabric(body)
    return {nf.key if isinstance(nf, model.Invalid) else nf.node_name: nf}


@kopf.index(G, V, "devicefailures", registry=registry)
def failure_idx(body: kopf.Body, **_: Any) -> dict[str, DeviceFailure | model.Invalid]:
    return {body["metadata"]["name"]: model.device_failure(body)}


@kopf.index("", "v1", "nodes", registry=registry)
def node_idx(body: kopf.Body, **_: Any) -> dict[str, model.NodeInfo]:
    return {body["metadata"]["name"]: model.node_info(body)}


# Topology sources of FabricTopology spec.source. Versionless: kopf serves the version the
# API server prefers (Kueue's v1alpha1, v1beta1 or v1beta2 Topology alike). kopf resolves
# resources once at startup (scanning is off): a Kueue or Volcano CRD installed later is
# served after an operator restart; without the CRD these indexes stay empty.
KUEUE_TOPOLOGIES = ("kueue.x-k8s.io", "topologies")
VOLCANO_HYPERNODES = ("topology.volcano.sh", "hypernodes")


@kopf.index(*KUEUE_TOPOLOGIES, registry=registry)
def kueue_topology_idx(body: kopf.Body, **_: Any) -> dict[str, model.KueueTopology]:
    return {body["metadata"]["name"]: model.kueue_topology(body)}


@kopf.index(*VOLCANO_HYPERNODES, registry=registry)
def hypernode_idx(body: kopf.Body, **_: Any) -> dict[str, model.HyperNode]:
    return {body["metadata"]["name"]: model.hyper_node(body)}


@kopf.index(G, V, "collectivejobs", registry=registry)
def job_idx(body: kopf.Body, **_: Any) -> dict[str, CollectiveJob | model.Invalid]:
    job = model.job(body)
    return {job.key: job}


@kopf.index("", "v1", "pods", registry=registry)
def pod_idx(body: kopf.Body, **_: Any) -> dict[str, model.PodInfo]:
    pod = model.pod_info(body)
    return {f"{pod.namespace}/{pod.name}": pod}


# ---- change detection ------------------------------------------------------------------------


def _watch(kind: str, reason: str, key_of: Callable[[kopf.Body], str],
           compact: Callable[[kopf.Body], Any], *resource: str) -> None:
    @kopf.on.event(*resource, registry=registry, id=f"watch-{kind}")
    def handler(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
        rt = _rt(memo)
        value = compact(body)
        if rt.changed(kind, key_of(body), value, deleted=type == "DELETED") and rt.leading:
            rt.reconciler.poke(reason)


def _name(body: kopf.Body) -> str:
    return str(body["metadata"]["name"])


def _ns_name(body: kopf.Body) -> str:
    return f"{body['metadata'].get('namespace', '')}/{body['metadata']['name']}"


def _job_trigger(body: kopf.Body) -> Any:
    """A job matters again when its spec changes, not when we write its status."""
    meta = body["metadata"]
    return (meta.get("generation"), meta.get("uid"), bool(meta.get("deletionTimestamp")))


def _pod_trigger(body: kopf.Body) -> Any:
    pod = model.pod_info(body)
    return (pod.labels, pod.node, pod.gpus, pod.gpu_annotation, pod.rank_values,
            pod.config_maps, pod.active)


_watch("fabric", "fabric", _name, model.fabric_topology, G, V, "fabrictopologies")
_watch("nodefabric", "nodefabric", _name, model.node_fabric, G, V, "nodefabrics")
_watch("failure", "failure", _name, model.device_failure, G, V, "devicefailures")
_watch("node", "node", _name, model.node_info, "", "v1", "nodes")  # labels feed spec.source
_watch("kueue", "fabric", _name, model.kueue_topology, *KUEUE_TOPOLOGIES)
_watch("hypernode", "fabric", _name, model.hyper_node, *VOLCANO_HYPERNODES)
_watch("job", "job", _ns_name, _job_trigger, G, V, "collectivejobs")
_watch("pod", "pods", _ns_name, _pod_trigger, "", "v1", "pods")


# ---- admission -------------------------------------------------------------------------------


def enable_webhook() -> None:
    """Register the pod mutation; only then does kopf require a webhook server."""
    kopf.on.mutate("", "v1", "pods", operation="CREATE", ignore_failures=True, id="inject",
                   registry=registry)(inject)


def inject(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
    job_idx: kopf.Index[str, CollectiveJob | model.Invalid] = kwargs["job_idx"]
    jobs = [j for store in job_idx.values() for j in store if not isinstance(j, model.Invalid)]
    pod = {"metadata": dict(body["metadata"]), "spec": dict(body.get("spec") or {})}
    change = webhook.mutation(pod, jobs, _rt(kwargs["memo"]).config.unpack_image)
    if change is None:
        return
    for key in ("volumes", "containers", "initContainers"):
        if key in change:
            patch.spec[key] = change[key]
    for key, value in change["annotations"].items():
        patch.metadata.annotations[key] = value
