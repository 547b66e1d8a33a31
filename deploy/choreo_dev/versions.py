"""The pinned control-plane components and how each one is built from the Go module proxy.

Versions are exact so that every developer, every CI run and the demo talk to the same
API server. Changing a version here gives it a new cache directory; old ones stay valid.
"""

from __future__ import annotations

from dataclasses import dataclass

ETCD_VERSION = "v3.6.8"
KUBERNETES_VERSION = "v1.34.4"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.22.0"

# Stamped into the Kubernetes binaries so that /version and kubectl report the real
# release instead of the placeholder a plain `go build` of the module leaves behind.
_K8S_MAJOR, _K8S_MINOR = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
_K8S_VERSION_FLAGS: tuple[str, ...] = tuple(
    f"-X {pkg}.{key}={value}"
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
    for key, value in (
        ("gitVersion", KUBERNETES_VERSION),
        ("gitMajor", _K8S_MAJOR),
        ("gitMinor", _K8S_MINOR),
    )
)

# Stage files that drive kwok's fake nodes and pods, copied from the kwok module at build
# time so that starting the cluster never needs the Go module cache. Nodes heartbeat as
# kubelets do since node leases: the Lease every 10 s, the status every 10-20 min (kwokctl's
# stages with leases on). Re-posting 1000 nodes' status every 20-45 s instead kept the API
# server and a node-watching operator busy with traffic no real cluster sends.
KWOK_STAGE_FILES: tuple[str, ...] = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "node/chaos/node-not-ready.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)


@dataclass(frozen=True)
class Binary:
    """One executable of the local cluster.

    ``module_dir`` names a wrapper module under ``deploy/local`` that is built with
    ``go build``; when it is empty the package is fetched with ``go install pkg@version``.
    """

    name: str
    version: str
    package: str
    module_dir: str = ""
    ldflags: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """Cache directory name, unique per component and version."""
        return f"{self.name}-{self.version}"


BINARIES: tuple[Binary, ...] = (
    Binary("etcd", ETCD_VERSION, ".", module_dir="etcd"),
    Binary("kwok", KWOK_VERSION, f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}"),
    *(
        Binary(
            name,
            KUBERNETES_VERSION,
            f"k8s.io/kubernetes/cmd/{name}",
            module_dir="k8s",
            ldflags=_K8S_VERSION_FLAGS,
        )
        for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
    ),
    Binary("helm", HELM_VERSION, f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}"),
)

# What `cluster up` needs; helm is built for the chart workflow but never started.
CONTROL_PLANE: tuple[str, ...] = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
)


def binary(name: str) -> Binary:
    """Look up a pinned binary by name."""
    for item in BINARIES:
        if item.name == name:
            return item
    known = ", ".join(b.name for b in BINARIES)
    raise KeyError(f"unknown component {name!r} (known: {known})")
