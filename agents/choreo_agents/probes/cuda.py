"""CUDA peer-to-peer copies through cupy: a direct GPU-to-GPU timing without nccl-tests.

Timed with CUDA events on the source device's stream, which measures the copy itself and
not Python overhead; one warm-up copy per size enables peer access and pages in buffers.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from choreo_agents.probes import DEFAULT_REPEATS, DEFAULT_SIZES, ProbeError, Samples


def load_cupy() -> ModuleType | None:
    """cupy if it is installed and sees a GPU, else None."""
    try:
        cp = importlib.import_module("cupy")
        if cp.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:  # ImportError, or a CUDA runtime that cannot start
        return None
    return cp


def peer_copy(
    cp: Any,
    src: int,
    dst: int,
    sizes: Sequence[float] = DEFAULT_SIZES,
    repeats: int = DEFAULT_REPEATS,
) -> Samples:
    """Time ``cudaMemcpyPeerAsync`` from GPU ``src`` to GPU ``dst`` at each size."""
    rt = cp.cuda.runtime
    out_sizes: list[float] = []
    out_times: list[float] = []
    try:
        largest = int(max(sizes))
        with cp.cuda.Device(dst):
            dst_buf = cp.empty(largest, dtype=cp.uint8)
        with cp.cuda.Device(src):
            if rt.deviceCanAccessPeer(src, dst):
                with contextlib.suppress(cp.cuda.runtime.CUDARuntimeError):
                    rt.deviceEnablePeerAccess(dst)  # raises if already enabled
            src_buf = cp.empty(largest, dtype=cp.uint8)
            stream = cp.cuda.Stream(non_blocking=True)
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            for size in sizes:
                nbytes = int(size)
                rt.memcpyPeerAsync(dst_buf.data.ptr, dst, src_buf.data.ptr, src, nbytes, stream.ptr)
                for _ in range(repeats):
                    start.record(stream)
                    rt.memcpyPeerAsync(
                        dst_buf.data.ptr, dst, src_buf.data.ptr, src, nbytes, stream.ptr
                    )
                    stop.record(stream)
                    stop.synchronize()
                    out_sizes.append(float(nbytes))
                    out_times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3)
    except Exception as exc:  # CUDA errors surface as several cupy types
        raise ProbeError(f"cupy peer copy gpu{src}->gpu{dst}: {exc}") from exc
    return Samples(np.array(out_sizes), np.array(out_times))
