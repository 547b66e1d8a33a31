"""Where things live: the source of the Go wrapper modules, the binary cache, the state dir.

Everything is derived from environment overrides first so that tests and CI can point the
tooling at throw-away directories without touching a developer's real cluster.
"""

from __future__ import annotations

import os
from pathlib import Path

from choreo_dev.errors import DevClusterError

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent.parent


def source_dir() -> Path:
    """The directory holding the Go wrapper modules (``deploy/local``)."""
    override = os.environ.get("CHOREO_SOURCE_DIR")
    path = Path(override) if override else PACKAGE_DIR.parent / "local"
    if not (path / "k8s" / "go.mod").is_file():
        raise DevClusterError(
            f"the Go wrapper modules are not at {path}; building the control plane needs a "
            "source checkout of choreo (or set CHOREO_SOURCE_DIR to its deploy/local directory)"
        )
    return path


def cache_dir() -> Path:
    """Root of the per-version binary cache, shared by every checkout on the machine."""
    override = os.environ.get("CHOREO_CACHE_DIR")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "choreo"


def state_dir() -> Path:
    """Default state directory of the developer cluster (certs, logs, pids, etcd data)."""
    override = os.environ.get("CHOREO_STATE_DIR")
    return Path(override) if override else REPO_ROOT / ".state" / "cluster"
