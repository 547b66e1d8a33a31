"""Health signals from a DCGM exporter's Prometheus endpoint, where one is deployed.

The exporter already owns the GPUs' counters, so reading it avoids a second NVML client
doing the same work. It exposes per-GPU NVLink error totals and the last XID code; a new
XID shows up as a change of that value.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from choreo_agents.backends import BackendError

METRICS = {
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "crc",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "crc",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "replay",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "recovery",
}
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"


@dataclass(slots=True)
class DcgmReading:
    counters: dict[int, dict[str, float]] = field(default_factory=dict)
    """GPU index -> counter name -> cumulative count (summed over the GPU's NVLinks)."""
    last_xid: dict[int, int] = field(default_factory=dict)


def parse_metrics(text: str) -> DcgmReading:
    """Read the NVLink error totals and last XIDs per GPU from exposition text."""
    reading = DcgmReading()
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise BackendError(f"DCGM exporter output is not Prometheus text: {exc}") from exc
    for family in families:
        for sample in family.samples:
            counter = METRICS.get(sample.name) or METRICS.get(family.name)
            gpu_label = sample.labels.get("gpu")
            if gpu_label is None or not gpu_label.isdigit():
                continue
            gpu = int(gpu_label)
            if counter is not None:
                per_gpu = reading.counters.setdefault(gpu, {})
                per_gpu[counter] = per_gpu.get(counter, 0.0) + float(sample.value)
            elif XID_METRIC in (sample.name, family.name):
                reading.last_xid[gpu] = int(sample.value)
    return reading


class DcgmSource:
    """Polls one exporter URL and turns last-XID changes into XID events."""

    def __init__(self, url: str, timeout: float = 2.0) -> None:
        self.url = url
        self.timeout = timeout
        self._last_xid: dict[int, int] = {}

    def read(self) -> tuple[DcgmReading, list[tuple[int, int]]]:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as resp:
                text = resp.read().decode("utf-8", errors="replace")
        except OSError as exc:
            raise BackendError(f"DCGM exporter {self.url}: {exc}") from exc
        reading = parse_metrics(text)
        events = self.new_xids(reading)
        return reading, events

    def new_xids(self, reading: DcgmReading) -> list[tuple[int, int]]:
        """XIDs whose value changed since the previous read (the first read only primes)."""
        events = [
            (gpu, code)
            for gpu, code in reading.last_xid.items()
            if code and gpu in self._last_xid and self._last_xid[gpu] != code
        ]
        self._last_xid.update(reading.last_xid)
        return events
