"""A small async Kubernetes REST client for the writes kopf does not do for us.

It reuses the credentials kopf logged in with (kubeconfig or the pod's ServiceAccount), so the
operator's RBAC is exactly what the ServiceAccount grants.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
from typing import Any

import aiohttp
import kopf

JSON = "application/json"
MERGE = "application/merge-patch+json"
# A list of objects without their contents: what garbage collection needs, not megabytes of
# ConfigMap data.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:300]}")
        self.status = status


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _pem(data: str | bytes) -> str:
    text = _text(data)
    return text if "-----BEGIN" in text else base64.b64decode(text).decode()


def ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    if info.insecure:
        return False
    ctx = ssl.create_default_context()
    if info.ca_path:
        ctx.load_verify_locations(cafile=os.fsdecode(info.ca_path))
    elif info.ca_data:
        ctx.load_verify_locations(cadata=_pem(info.ca_data))
    if info.certificate_path and info.private_key_path:
        ctx.load_cert_chain(os.fsdecode(info.certificate_path), os.fsdecode(info.private_key_path))
    return ctx


class Kube:
    """JSON requests against one API server."""

    def __init__(self, info: kopf.ConnectionInfo) -> None:
        self.server = info.server.rstrip("/")
        self._headers = {"Accept": JSON}
        if info.token:
            self._headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
        self._ssl = ssl_context(info)
        self._session: aiohttp.ClientSession | None = None

    async def request(self, method: str, path: str, body: Any = None,
                      content_type: str = JSON, timeout: float = 15.0, accept: str = JSON,
                      answer: bool = True) -> Any:
        """The decoded answer, or None with ``answer=False`` (a created ConfigMap is echoed
        back whole, megabytes nobody reads)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=16))
        headers = {**self._headers, "Accept": accept}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = content_type
        async with self._session.request(method, self.server + path, data=data, headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            raw = await resp.read()
            if resp.status >= 300:
                raise ApiError(resp.status, method, path, raw.decode(errors="replace"))
            return json.loads(raw) if raw and answer else None

    async def get(self, path: str) -> Any:
        return await self.request("GET", path)

    async def list_metadata(self, path: str) -> Any:
        return await self.request("GET", path, accept=METADATA_LIST)

    async def create(self, path: str, body: dict[str, Any]) -> Any:
        """Create; the created object is not returned."""
        return await self.request("POST", path, body, answer=False)

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
        return await self.request("PATCH", path, patch, content_type=MERGE)

    async def replace(self, path: str, body: dict[str, Any]) -> Any:
        """PUT: fails with 409 unless ``body``'s resourceVersion is still current."""
        return await self.request("PUT", path, body)

    async def delete(self, path: str) -> Any:
        return await self.request("DELETE", path)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
