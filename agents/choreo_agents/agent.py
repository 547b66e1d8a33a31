"""The agent's control loop: discover, watch health, measure, publish.

One thread runs short ticks (every ``poll`` seconds): read health, debounce it, publish
what changed. Measurements can take minutes on real hardware (nccl-tests), so they run on
a single worker thread and their results are folded in on a later tick; health keeps
flowing meanwhile. Any step that fails (NVML, a probe, the API server) is logged, backs
off exponentially, and leaves the last good state in place: nothing here exits the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from choreo_agents.backends import Backend, BackendError
from choreo_agents.fit import FitError, fit_alpha_beta
from choreo_agents.health import HealthMonitor, Hysteresis, State
from choreo_agents.metrics import AgentMetrics, Heartbeat
from choreo_agents.model import Fit, Inventory, LinkSpec, Peer, failure_name
from choreo_agents.publisher import PROBE_REQUEST, Publisher, now_rfc3339
from choreo_agents.report import fabric_spec, link_healthy, significant, status_counts
from choreo_agents.schedule import Backoff, ProbeSchedule
from choreo_api import Condition, Device, NodeFabricSpec, NodeFabricStatus
from choreo_api.kube import CALL_ERRORS, describe

log = logging.getLogger(__name__)

LinkId = tuple[int, Peer]



@dataclass
class Settings:
    node: str
    namespace: str = "choreo-system"
    interval: float = 600.0
    """Seconds between full re-measurements (jittered)."""
    poll: float = 0.5
    """Seconds between health polls (one loop tick)."""
    stagger: float = 30.0
    """Window over which nodes spread their first probe."""
    jitter: float = 0.1
    change_threshold: float = 0.1
    fail_after: int = 2
    recover_after: float = 30.0
    reprobe_gap: float = 5.0
    """At least this long between re-measurements of one link triggered by health."""


@dataclass
class _ProbeResult:
    links: list[LinkSpec]
    fits: dict[LinkId, Fit] = field(default_factory=dict)
    errors: dict[LinkId, str] = field(default_factory=dict)
    duration: float = 0.0
    full: bool = False


class Agent:
    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        publisher: Publisher | None,
        metrics: AgentMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.s = settings
        self.backend = backend
        self.publisher = publisher
        self.metrics = metrics or AgentMetrics()
        self.clock = clock
        self.heartbeat = Heartbeat(stale_after=max(30.0, 20 * settings.poll))
        self.inventory: Inventory | None = None
        self.fits: dict[LinkId, Fit] = {}
        self.monitor = HealthMonitor()
        self.hysteresis = Hysteresis(
            fail_after=settings.fail_after, recover_after=settings.recover_after
        )
        start = clock()
        self.schedule = ProbeSchedule(
            settings.node, settings.interval, start, settings.jitter, settings.stagger
        )
        self.probe_requested = threading.Event()
        self._request_pending = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe")
        self._probe: Future[_ProbeResult] | None = None
        self._reprobe: set[LinkId] = set()
        self._last_reprobe: dict[LinkId, float] = {}
        self._degraded: set[Device] = set()
        self.published: NodeFabricSpec | None = None
        self._status_dirty = False
        self._last_probe_time: str | None = None
        self._probe_ok: bool | None = None
        self._conditions: dict[str, Condition] = {}
        self._failures_loaded = publisher is None
        self._backoff = {
            name: Backoff(seed=hash((settings.node, name)) & 0xFFFF)
            for name in ("discover", "health", "fabric", "status", "failures", "load")
        }

    # ---- loop ----------------------------------------------------------------------------
    def run(self, stop: threading.Event, max_ticks: int | None = None) -> None:
        ticks = 0
        try:
            while not stop.is_set() and (max_ticks is None or ticks < max_ticks):
                started = self.clock()
                try:
                    self.tick()
                except Exception:  # a bug must not kill the DaemonSet pod in a crash loop
                    log.exception("agent tick failed; continuing")
                ticks += 1
                stop.wait(max(0.0, self.s.poll - (self.clock() - started)))
        finally:
            self.close()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def tick(self) -> None:
        now = self.clock()
        if self.inventory is None and not self._discover(now):
            return
        self._load_failures(now)
        self._health(now)
        self._collect_probe(now)
        self._start_probe(now)
        self._publish(now)
        self.heartbeat.beat()
        self.metrics.last_tick.labels(self.s.node).set(time.time())

    # ---- discovery -----------------------------------------------------------------------
    def _discover(self, now: float) -> bool:
        if not self._backoff["discover"].ready(now):
            return False
        try:
            inventory = self.backend.discover()
        except BackendError as exc:
            delay = self._backoff["discover"].failed(now)
            log.error("discovery failed: %s (retrying in %.1f s)", exc, delay)
            return False
        self._backoff["discover"].succeeded()
        self.inventory = inventory
        log.info(
            "discovered %d GPUs, %d links, %d NICs (%s backend%s)",
            len(inventory.gpus), len(inventory.links), len(inventory.nics), inventory.backend,
            ", NVSwitch" if inventory.nvswitch else "",
        )  # fmt: skip
        return True

    def _load_failures(self, now: float) -> None:
        """Adopt failures an earlier agent reported, so they resolve only once healed."""
        if self._failures_loaded or self.publisher is None or not self._backoff["load"].ready(now):
            return
        try:
            open_ones = self.publisher.load_failures()
        except CALL_ERRORS as exc:
            log.warning("cannot list DeviceFailures yet: %s", describe(exc))
            self._backoff["load"].failed(now)
            return
        for key, reason in open_ones.items():
            self.hysteresis.seed_bad([key], now, reason)
        if open_ones:
            log.info("adopted %d open DeviceFailure(s) from before this start", len(open_ones))
        self._failures_loaded = True

    # ---- health --------------------------------------------------------------------------
    def _health(self, now: float) -> None:
        assert self.inventory is not None
        if not self._backoff["health"].ready(now):
            return
        try:
            raw = self.backend.health(self.inventory)
        except BackendError as exc:
            delay = self._backoff["health"].failed(now)
            log.error("health read failed: %s (retrying in %.1f s)", exc, delay)
            return
        self._backoff["health"].succeeded()
        sample = self.monitor.observe(self.inventory, raw, now)
        for t in self.hysteresis.update(sample, now):
            self.metrics.transitions.labels(self.s.node, t.key.type, t.state.value).inc()
            if t.state is State.BAD:
                log.warning("%s failed: %s", t.key.label(), t.reason)
            else:
                log.info("%s recovered", t.key.label())
                self._queue_reprobe(self._links_of(t.key))
        changed = sample.degraded ^ self._degraded
        if changed:
            for key in sorted(changed):
                state = "degraded" if key in sample.degraded else "no longer degraded"
                log.info("%s %s: re-measuring", key.label(), state)
            self._queue_reprobe(self._links_of(*changed))
        self._degraded = set(sample.degraded)
        for key, rates in self.monitor.rates.items():
            for link in self._links_of(key):
                for counter, rate in rates.items():
                    self.metrics.link_errors.labels(*self._labels(link), counter).set(rate)

    def _links_of(self, *keys: Device) -> list[LinkSpec]:
        assert self.inventory is not None
        wanted = set(keys)
        return [
            link
            for link in self.inventory.links
            if link.device in wanted
            or (Device.of_gpu(link.src) in wanted)
            or (link.peer.gpu is not None and Device.of_gpu(link.peer.gpu) in wanted)
        ]

    def _queue_reprobe(self, links: Sequence[LinkSpec]) -> None:
        self._reprobe.update((link.src, link.peer) for link in links)

    # ---- measurement ---------------------------------------------------------------------
    def _start_probe(self, now: float) -> None:
        assert self.inventory is not None
        if self._probe is not None:
            return
        if self.probe_requested.is_set():
            self.probe_requested.clear()
            self._request_pending = True
            log.info("re-measurement requested through the %s annotation", PROBE_REQUEST)
        full = self._request_pending or self.schedule.due(now)
        if full:
            links = list(self.inventory.links)
            self._reprobe.clear()
        else:
            ready = {
                lid
                for lid in self._reprobe
                if now - self._last_reprobe.get(lid, float("-inf")) >= self.s.reprobe_gap
            }
            if not ready:
                return
            self._reprobe -= ready
            links = [ln for ln in self.inventory.links if (ln.src, ln.peer) in ready]
            for link in links:
                self._last_reprobe[(link.src, link.peer)] = now
        self._probe = self._executor.submit(self._measure, links, full)

    def _measure(self, links: list[LinkSpec], full: bool) -> _ProbeResult:
        """Runs on the probe thread: time the links and fit each one."""
        result = _ProbeResult(links, full=full)
        started = time.perf_counter()
        try:
            samples = self.backend.measure(links)
        except Exception as exc:  # a backend bug or a vanished device must not kill the worker
            result.errors = {(ln.src, ln.peer): f"probe failed: {exc}" for ln in links}
            result.duration = time.perf_counter() - started
            return result
        for link, got in samples.items():
            lid = (link.src, link.peer)
            if isinstance(got, Exception):
                result.errors[lid] = str(got)
                continue
            try:
                result.fits[lid] = fit_alpha_beta(got.sizes, got.times)
            except FitError as exc:
                result.errors[lid] = f"fit: {exc}"
        result.duration = time.perf_counter() - started
        return result

    def _collect_probe(self, now: float) -> None:
        if self._probe is None or not self._probe.done():
            return
        result = self._probe.result()
        self._probe = None
        scope = "full" if result.full else "links"
        self.metrics.probe_duration.labels(self.s.node, scope).observe(result.duration)
        self.fits.update(result.fits)
        if result.errors:
            self.metrics.probe_failures.labels(self.s.node).inc(len(result.errors))
            first = next(iter(result.errors.items()))
            log.warning(
                "%d of %d link measurements failed (kept previous values), e.g. %d->%s: %s",
                len(result.errors), len(result.links), first[0][0], first[0][1].label, first[1],
            )  # fmt: skip
        if result.full:
            self.schedule.done(now)
            self._last_probe_time = now_rfc3339()
            self._probe_ok = len(result.fits) > 0 or not result.links
            self._status_dirty = True
            if self._request_pending:
                self._request_pending = False
                self._clear_request()
        log.info("measured %d link(s) in %.3f s (%s)", len(result.fits), result.duration, scope)

    def _clear_request(self) -> None:
        if self.publisher is None:
            return
        try:
            self.publisher.clear_probe_request()
        except CALL_ERRORS as exc:
            log.warning("could not clear the %s annotation: %s", PROBE_REQUEST, describe(exc))

    # ---- publishing ----------------------------------------------------------------------
    def spec(self) -> NodeFabricSpec:
        assert self.inventory is not None
        return fabric_spec(self.s.node, self.inventory, self.fits, self.hysteresis.bad())

    def _publish(self, now: float) -> None:
        spec = self.spec()
        self._update_link_metrics()
        if self.publisher is None:
            if significant(self.published, spec, self.s.change_threshold):
                self.published = spec
            return
        self._write_fabric(now, spec)
        self._write_status(now)
        if self._failures_loaded:
            self._sync_failures(now)

    def _write_fabric(self, now: float, spec: NodeFabricSpec) -> None:
        assert self.publisher is not None
        backoff = self._backoff["fabric"]
        if not significant(self.published, spec, self.s.change_threshold) or not backoff.ready(now):
            return
        try:
            self.publisher.write_fabric(spec)
        except CALL_ERRORS as exc:
            delay = backoff.failed(now)
            self.metrics.api_writes.labels(self.s.node, "NodeFabric", "error").inc()
            log.error(
                "NodeFabric write rejected: %s (keeping the last good one, retry in %.1f s)",
                describe(exc), delay,
            )  # fmt: skip
            return
        backoff.succeeded()
        self.metrics.api_writes.labels(self.s.node, "NodeFabric", "ok").inc()
        self.published = spec
        self._status_dirty = True
        gpus, links = status_counts(spec)
        log.info(
            "published NodeFabric %s: %d healthy GPUs, %d healthy links", self.s.node, gpus, links
        )

    def _write_status(self, now: float) -> None:
        assert self.publisher is not None
        backoff = self._backoff["status"]
        if not self._status_dirty or self.published is None or not backoff.ready(now):
            return
        gpus, links = status_counts(self.published)
        status = NodeFabricStatus(
            healthy_gpus=gpus, healthy_links=links, last_probe_time=self._last_probe_time,
            conditions=self._status_conditions(),
        )  # fmt: skip
        try:
            self.publisher.write_status(status)
        except CALL_ERRORS as exc:
            delay = backoff.failed(now)
            self.metrics.api_writes.labels(self.s.node, "NodeFabricStatus", "error").inc()
            log.error("NodeFabric status write rejected: %s (retry in %.1f s)",
                      describe(exc), delay)
            return
        backoff.succeeded()
        self.metrics.api_writes.labels(self.s.node, "NodeFabricStatus", "ok").inc()
        self._status_dirty = False

    def _status_conditions(self) -> tuple[Condition, ...]:
        bad = self.hysteresis.bad()
        if bad:
            shown = ", ".join(f"{k.label()} ({r})" for k, r in sorted(bad.items())[:10])
            healthy = ("False", "DevicesFailed", f"{len(bad)} device(s) failed: {shown}")
        else:
            healthy = ("True", "AllDevicesHealthy", "every GPU, link and NIC is healthy")
        if self._probe_ok is None:
            measured = ("False", "NotYetMeasured", "nominal values until the first probe")
        elif self._probe_ok:
            measured = ("True", "ProbeSucceeded", f"{len(self.fits)} link(s) have measured values")
        else:
            measured = ("False", "ProbeFailed", "the last probe produced no fit; values kept")
        return self._condition("Healthy", *healthy), self._condition("Measured", *measured)

    def _condition(self, kind: str, status: str, reason: str, message: str) -> Condition:
        old = self._conditions.get(kind)
        since = old.last_transition_time if old and old.status == status else now_rfc3339()
        cond = Condition.model_validate(
            {"type": kind, "status": status, "reason": reason, "message": message,
             "lastTransitionTime": since}
        )  # fmt: skip
        self._conditions[kind] = cond
        return cond

    def _sync_failures(self, now: float) -> None:
        """Open a DeviceFailure per failed device, resolve the ones that recovered."""
        assert self.publisher is not None
        backoff = self._backoff["failures"]
        if not backoff.ready(now):
            return
        bad = self.hysteresis.bad()
        known = self.publisher.failures
        todo = [(k, True, r) for k, r in sorted(bad.items()) if known.get(k, True)]
        todo += [
            (k, False, "") for k, resolved in sorted(known.items()) if not resolved and k not in bad
        ]
        for key, failed, reason in todo:
            try:
                self.publisher.write_failure(key, failed, reason)
            except CALL_ERRORS as exc:
                delay = backoff.failed(now)
                self.metrics.api_writes.labels(self.s.node, "DeviceFailure", "error").inc()
                log.error(
                    "DeviceFailure %s write rejected: %s (retry in %.1f s)",
                    failure_name(self.s.node, key), describe(exc), delay,
                )  # fmt: skip
                return
            backoff.succeeded()
            self.metrics.api_writes.labels(self.s.node, "DeviceFailure", "ok").inc()
            log.info(
                "DeviceFailure %s %s",
                failure_name(self.s.node, key), f"opened: {reason}" if failed else "resolved",
            )  # fmt: skip

    # ---- metrics -------------------------------------------------------------------------
    def _labels(self, link: LinkSpec) -> tuple[str, str, str, str]:
        return (self.s.node, str(link.src), link.peer.label, link.kind)

    def _update_link_metrics(self) -> None:
        assert self.inventory is not None
        bad = self.hysteresis.bad()
        for link in self.inventory.links:
            labels = self._labels(link)
            fit = self.fits.get((link.src, link.peer))
            alpha = fit.alpha if fit else link.alpha
            bandwidth = fit.bandwidth / link.count if fit else link.bandwidth
            self.metrics.link_alpha.labels(*labels).set(alpha)
            self.metrics.link_bandwidth.labels(*labels).set(bandwidth)
            self.metrics.link_healthy.labels(*labels).set(1 if link_healthy(link, bad) else 0)
            if fit:
                self.metrics.link_fit_error.labels(*labels).set(fit.relative_error)
        for gpu in self.inventory.gpus:
            key = Device.of_gpu(gpu.index)
            self.metrics.gpu_healthy.labels(self.s.node, str(gpu.index)).set(0 if key in bad else 1)
