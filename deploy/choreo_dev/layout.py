"""The files of one cluster's state directory, named in one place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Layout:
    """Paths inside a state directory; creating the directories is the caller's job."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def ca_cert(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.pki / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.pki / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.pki / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.pki / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.pki / "sa.pub"

    @property
    def token(self) -> Path:
        return self.pki / "admin.token"

    @property
    def token_file(self) -> Path:
        """The apiserver's static token file (``--token-auth-file``)."""
        return self.pki / "tokens.csv"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def kwok_config(self) -> Path:
        return self.root / "kwok-stages.yaml"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def run(self) -> Path:
        """One JSON record per running process (pid and start time)."""
        return self.root / "run"

    @property
    def info(self) -> Path:
        """Ports and versions of the last start."""
        return self.root / "cluster.json"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"
