"""Credentials through the official clients' loaders: every path of ``$KUBECONFIG`` counts."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import yaml

from choreo_api.kube import ApiException, ConfigException, Kube, describe
from choreo_operator import kube as operator_kube

SERVER = "https://127.0.0.1:6443"


def split_kubeconfig(tmp_path: Path) -> str:
    """The cluster and context in one file, the user in another: a merge needs both."""
    first, second = tmp_path / "cluster.yaml", tmp_path / "user.yaml"
    first.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "ctx",
        "clusters": [{"name": "c", "cluster": {"server": SERVER,
                                               "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}]}))
    second.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "users": [{"name": "u", "user": {"token": "from-the-second-file"}}]}))
    return f"{first}{os.pathsep}{second}"


def test_agent_client_merges_every_kubeconfig_path(tmp_path: Path) -> None:
    kube = Kube.from_environment(environ={"KUBECONFIG": split_kubeconfig(tmp_path)})
    try:
        cfg = kube.api.configuration
        assert cfg.host == SERVER
        assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer from-the-second-file"
    finally:
        kube.close()


def test_operator_client_merges_every_kubeconfig_path(tmp_path: Path) -> None:
    async def load() -> tuple[str, str | None]:
        cfg = await operator_kube.load_configuration(
            None, environ={"KUBECONFIG": split_kubeconfig(tmp_path)})
        info = await operator_kube.connection_info(cfg)
        return info.server, info.token

    assert asyncio.run(load()) == (SERVER, "from-the-second-file")


def test_the_kubeconfig_proxy_and_no_other_serves_watches_and_writes(tmp_path: Path) -> None:
    """kopf's watches and the operator's writes go the same way: through the kubeconfig's
    ``proxy-url``, and not through a proxy or ``~/.netrc`` taken from the environment."""
    path = tmp_path / "proxied.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "ctx",
        "clusters": [{"name": "c", "cluster": {"server": SERVER, "proxy-url":
                                               "http://proxy.example:3128",
                                               "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))

    async def load() -> tuple[str | None, str | None, bool]:
        cfg = await operator_kube.load_configuration(str(path), environ={})
        kube = operator_kube.Kube()
        await kube.login(cfg)
        try:
            info = await operator_kube.connection_info(cfg)
            api = kube._client
            assert api is not None
            rest = api.rest_client
            return info.proxy_url, rest.proxy, rest.pool_manager.trust_env
        finally:
            await kube.close()

    assert asyncio.run(load()) == ("http://proxy.example:3128", "http://proxy.example:3128",
                                   False)


def test_a_kubeconfig_without_the_user_is_an_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config",
                                      "current-context": "nowhere"}))
    with pytest.raises(ConfigException):
        Kube.from_environment(environ={"KUBECONFIG": str(broken)})


def test_a_refusal_is_one_line_from_either_client_library() -> None:
    body = '{"kind": "Status", "message": "spec.links: Invalid value", "code": 422}'
    sync = ApiException(status=422, reason="Unprocessable Entity")
    sync.body = body
    refused = operator_kube.ApiException(status=422, reason="Unprocessable Entity")
    refused.body = body
    for err in (sync, refused):
        assert describe(err) == "HTTP 422: spec.links: Invalid value"
    assert describe(TimeoutError()) == "TimeoutError"
    assert describe(OSError("connection refused")) == "connection refused"
