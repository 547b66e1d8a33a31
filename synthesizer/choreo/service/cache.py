"""Content-addressed result cache: identical fabric, tenants and options give identical bytes.

Entries are serialized responses, so a hit costs a dictionary lookup and no re-encoding, and
the bound is on what actually sits in memory: least recently used entries go first once the
total passes ``max_bytes``. Keys are SHA-256 digests of the fabric's fingerprint and the
normalized tenants and options, never of anything a client can vary without changing the result
(the idempotency key, the deadline).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")


def cache_key(fingerprint: str, spec: bytes) -> str:
    """The result's content address; the code version is in it because results from another
    release may differ (clients hold these ids across server restarts and replicas)."""
    return hashlib.sha256(VERSION.encode() + b"\0" + fingerprint.encode() + b"\0"
                          + spec).hexdigest()


def _version() -> str:
    import choreo

    try:
        import choreo_engine

        engine = str(choreo_engine.__version__)
    except ImportError:
        engine = "none"
    return f"choreo {choreo.__version__} engine {engine}"


VERSION = _version()


class ResultCache:
    """LRU over byte strings, bounded by their total length."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: str, value: bytes) -> None:
        """Store ``value``; one larger than the whole cache is not kept at all."""
        if len(value) > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._size -= len(old)
            self._entries[key] = value
            self._size += len(value)
            while self._size > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._size -= len(evicted)

    @property
    def size(self) -> int:
        return self._size

    def __len__(self) -> int:
        return len(self._entries)


class Memo(Generic[V]):
    """A small LRU by entry count (parsed fabrics by the hash of their wire bytes)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> V | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: str, value: V) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
