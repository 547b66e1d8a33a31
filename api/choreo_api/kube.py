"""The official Kubernetes client, set up once for the node agent and the dev tooling.

Credentials come from the client's own loaders: every path of ``$KUBECONFIG`` merged, client
certificates, token files, and in a pod the ServiceAccount token, re-read as the kubelet
rotates it. Calls go by API path (``/apis/choreo.dev/v1alpha1/...``) through the client's
connection pool, auth and TLS, because the agent and the tooling handle plain JSON documents
that the ``choreo_api`` models validate; the generated typed models would be a second copy of
each resource. Every failure is the client's :class:`ApiException`.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Self

from kubernetes import client, config
from kubernetes.client import ApiException
from kubernetes.config import ConfigException
from kubernetes.config.incluster_config import InClusterConfigLoader
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import HTTPError

__all__ = ["CALL_ERRORS", "ApiException", "ConfigException", "Kube", "describe"]

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

CALL_ERRORS = (ApiException, HTTPError, OSError)
"""What a call fails with when the API server refuses it or cannot be reached."""


def describe(err: BaseException) -> str:
    """One line for a log or a status. A refusal by the API server, from either client
    library (sync or async, whose ``ApiException`` classes differ but carry the same fields),
    gives its status and the server's own message (``HTTP 422: spec.links: Invalid value``)
    instead of the exception's dump of response headers."""
    status, reason, body = (getattr(err, a, None) for a in ("status", "reason", "body"))
    if status is None or not hasattr(err, "body"):  # not a refusal (aiohttp's has no body)
        return str(err) or type(err).__name__
    text = body.decode(errors="replace") if isinstance(body, bytes) else body or ""
    with contextlib.suppress(ValueError, AttributeError):
        text = json.loads(text).get("message", text)
    return f"HTTP {status}: {str(text or reason or '')[:300]}"


class Kube:
    """JSON requests by path through one official ``ApiClient``."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None, account: Path = SERVICE_ACCOUNT,
                         environ: Mapping[str, str] = os.environ) -> Self:
        """``kubeconfig``, else ``$KUBECONFIG``, else the ServiceAccount mounted at ``account``
        (its token is read again a minute after it was last read, so a rotation is seen).

        Raises :class:`ConfigException` when none of them gives credentials.
        """
        cfg = client.Configuration()
        path = kubeconfig or environ.get("KUBECONFIG")
        if path:
            config.load_kube_config(config_file=path, client_configuration=cfg,
                                    persist_config=False)
        else:
            InClusterConfigLoader(token_filename=str(account / "token"),
                                  cert_filename=str(account / "ca.crt"),
                                  try_refresh_token=True, environ=environ).load_and_set(cfg)
        return cls(client.ApiClient(cfg))

    @classmethod
    def with_token(cls, server: str, token: str, ca_file: Path) -> Self:
        """A bearer token against one server, verifying TLS against ``ca_file``."""
        cfg = client.Configuration(host=server.rstrip("/"),
                                   api_key={"authorization": token},
                                   api_key_prefix={"authorization": "Bearer"})
        cfg.ssl_ca_cert = str(ca_file)
        return cls(client.ApiClient(cfg))

    @property
    def server(self) -> str:
        return str(self.api.configuration.host)

    def _send(self, method: str, path: str, body: Any, content_type: str,
              timeout: float, query: dict[str, str] | None = None) -> Any:
        headers = {"Accept": JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, headers, body, _ = self.api.param_serialize(
            method, path, query_params=list((query or {}).items()), header_params=headers,
            body=body, auth_settings=["BearerToken"])
        return self.api.call_api(method, url, headers, body, _request_timeout=timeout)

    def request(self, method: str, path: str, body: Any = None, content_type: str = JSON,
                timeout: float = 10.0) -> Any:
        """The decoded JSON answer (the raw text where it is not JSON, e.g. ``/readyz``)."""
        resp = self._send(method, path, body, content_type, timeout)
        raw = resp.read()
        if not 200 <= resp.status <= 299:
            raise ApiException.from_response(http_resp=resp, body=raw.decode(errors="replace"),
                                             data=None)
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def create(self, path: str, obj: dict[str, Any]) -> Any:
        return self.request("POST", path, obj)

    def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
        return self.request("PATCH", path, patch, content_type=MERGE_PATCH)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def watch(self, path: str, params: dict[str, str],
              timeout_seconds: int = 60) -> Iterator[dict[str, Any]]:
        """Watch events until the server ends the watch (after ``timeout_seconds``)."""
        query = {**params, "watch": "true", "timeoutSeconds": str(timeout_seconds)}
        resp = self._send("GET", path, None, JSON, timeout_seconds + 5.0, query)
        if not 200 <= resp.status <= 299:
            raw = resp.read()
            raise ApiException.from_response(http_resp=resp, body=raw.decode(errors="replace"),
                                             data=None)
        try:
            for line in iter_resp_lines(resp.response):
                if line.strip():
                    yield json.loads(line)
        finally:
            resp.response.release_conn()

    def close(self) -> None:
        self.api.close()
