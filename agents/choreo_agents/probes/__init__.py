"""Ways to time transfers between GPUs: nccl-tests, CUDA peer copies through cupy, simulation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_SIZES = tuple(float(4**k) for k in range(5, 15))
"""1 KiB .. 256 MiB by factors of 4: small sizes pin alpha, large ones beta."""
DEFAULT_REPEATS = 5


class ProbeError(RuntimeError):
    """A probe could not produce usable timings (tool failed, output unusable, GPU gone)."""


@dataclass(frozen=True, slots=True)
class Samples:
    """Timed transfers: ``times[i]`` seconds to move ``sizes[i]`` bytes over one link."""

    sizes: np.ndarray
    times: np.ndarray

    def __len__(self) -> int:
        return len(self.sizes)
