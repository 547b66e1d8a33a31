"""Developer tooling for choreo: a real local Kubernetes control plane without Docker.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as plain
processes on loopback, built once from the Go module proxy and cached per version.
"""
