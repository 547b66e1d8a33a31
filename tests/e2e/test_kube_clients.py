"""The official clients against the real API server: a rotated ServiceAccount token is seen,
and the operator's client follows kopf's logins."""

from __future__ import annotations

import asyncio
import datetime
import shutil
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes.config import incluster_config as sync_incluster
from kubernetes_asyncio.config import incluster_config as async_incluster

from choreo_api.kube import ApiException, ConfigException, Kube
from choreo_dev.testing import LocalCluster
from choreo_operator import kube as operator_kube

pytestmark = pytest.mark.e2e


class Clock:
    """``datetime`` for the client's in-cluster loader, with a hand that can move on."""

    def __init__(self) -> None:
        self.ahead = datetime.timedelta()
        clock = self

        class Now(datetime.datetime):
            @classmethod
            def now(cls, tz: Any = None) -> Any:
                return datetime.datetime.now(tz) + clock.ahead

        self.module = types.SimpleNamespace(datetime=Now, timedelta=datetime.timedelta)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    c = Clock()
    monkeypatch.setattr(sync_incluster, "datetime", c.module)
    monkeypatch.setattr(async_incluster, "datetime", c.module)
    yield c


def account(cluster: LocalCluster, tmp_path: Path, token: str) -> tuple[Path, dict[str, str]]:
    """A mounted ServiceAccount as a pod sees it, and the pod's service environment."""
    folder = tmp_path / "serviceaccount"
    folder.mkdir(exist_ok=True)
    (folder / "token").write_text(token)
    shutil.copy(cluster.cluster.layout.ca_cert, folder / "ca.crt")
    url = urlsplit(cluster.info.server)
    return folder, {"KUBERNETES_SERVICE_HOST": str(url.hostname),
                    "KUBERNETES_SERVICE_PORT": str(url.port)}


def admin_token(cluster: LocalCluster) -> str:
    return cluster.cluster.layout.token.read_text().strip()


def test_agent_client_reads_a_rotated_token(cluster: LocalCluster, tmp_path: Path,
                                            clock: Clock) -> None:
    folder, environ = account(cluster, tmp_path, "expired-token")
    kube = Kube.from_environment(account=folder, environ=environ)
    try:
        with pytest.raises(ApiException) as refused:
            kube.get("/api/v1/namespaces/default")
        assert refused.value.status == 401
        (folder / "token").write_text(admin_token(cluster))  # the kubelet rotates it
        clock.ahead = datetime.timedelta(minutes=2)
        assert kube.get("/api/v1/namespaces/default")["metadata"]["name"] == "default"
    finally:
        kube.close()


def test_operator_client_reads_a_rotated_token(cluster: LocalCluster, tmp_path: Path,
                                               clock: Clock) -> None:
    folder, environ = account(cluster, tmp_path, "expired-token")

    async def scenario() -> None:
        kube = operator_kube.Kube()
        try:
            await kube.login(await operator_kube.load_configuration(
                None, account=folder, environ=environ))
            with pytest.raises(operator_kube.ApiException) as refused:
                await kube.get("/api/v1/namespaces/default")
            assert refused.value.status == 401
            (folder / "token").write_text(admin_token(cluster))
            clock.ahead = datetime.timedelta(minutes=2)
            got = await kube.get("/api/v1/namespaces/default")
            assert got["metadata"]["name"] == "default"
        finally:
            await kube.close()

    asyncio.run(scenario())


def test_operator_client_follows_each_login_and_shares_it_with_kopf(
        cluster: LocalCluster, tmp_path: Path) -> None:
    folder, environ = account(cluster, tmp_path, "revoked-token")

    async def scenario() -> None:
        kube = operator_kube.Kube()
        try:
            stale = await operator_kube.load_configuration(None, account=folder,
                                                           environ=environ)
            await kube.login(stale)
            with pytest.raises(operator_kube.ApiException) as refused:
                await kube.get("/api/v1/namespaces/default")
            assert refused.value.status == 401
            # kopf logs in again after its own 401: the handler loads the credentials anew
            (folder / "token").write_text(admin_token(cluster))
            fresh = await operator_kube.load_configuration(None, account=folder,
                                                           environ=environ)
            await kube.login(fresh)
            assert (await kube.get("/api/v1/namespaces/default"))["kind"] == "Namespace"
            info = await operator_kube.connection_info(fresh)
            assert (info.server, info.token) == (cluster.info.server, admin_token(cluster))
            assert info.scheme == "Bearer"
        finally:
            await kube.close()

    asyncio.run(scenario())


def test_operator_calls_stay_on_the_event_loop(cluster: LocalCluster, tmp_path: Path) -> None:
    """A call is no thread hop: aiohttp, trusting the environment, would look for ~/.netrc in
    the default executor before every request, on every write of a publication."""
    folder, environ = account(cluster, tmp_path, admin_token(cluster))
    handed: list[str] = []

    class Counting(ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            handed.append(getattr(fn, "__qualname__", repr(fn)))
            return super().submit(fn, *args, **kwargs)

    async def scenario() -> None:
        asyncio.get_running_loop().set_default_executor(Counting(max_workers=2))
        kube = operator_kube.Kube()
        try:
            await kube.login(await operator_kube.load_configuration(
                None, account=folder, environ=environ))
            handed.clear()  # what loading the credentials did is not a call
            for _ in range(20):
                assert (await kube.get("/api/v1/namespaces/default"))["kind"] == "Namespace"
        finally:
            await kube.close()

    asyncio.run(scenario())
    assert handed == []


def test_no_credentials_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigException, match="Service host/port is not set"):
        Kube.from_environment(account=tmp_path, environ={})
