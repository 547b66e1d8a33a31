"""Loopback ports for servers to listen on, chosen so that servers started side by side (and
the connections a control plane opens) never take each other's."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

HOST = "127.0.0.1"


def is_free(port: int, host: str = HOST) -> bool:
    """Whether a server could listen on ``host:port`` right now.

    SO_REUSEADDR mirrors what the Go servers do, so a port held only by TIME_WAIT
    connections of a previous run counts as free, as it will for them.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def ephemeral_port(host: str = HOST) -> int:
    """A port the kernel considers free at this moment."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (Linux's default where unreadable)."""
    try:
        low, high = (int(x) for x in
                     Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


_HANDED_OUT: set[int] = set()
_HANDED_LOCK = threading.Lock()


def listen_port(host: str = HOST) -> int:
    """A free port for a server to listen on: below the kernel's ephemeral range, and never
    one this process handed out before. The kernel takes outgoing connections' source ports
    from that range, and a control plane opens many, so a port it chose there (``bind`` to
    port 0) can be some connection's by the time the server starts (``make demo`` once
    failed so: an agent's metrics port was taken)."""
    low, _ = ephemeral_range()
    first = 10000 if low > 12000 else 1024
    with _HANDED_LOCK:
        for _ in range(1000):
            port = random.randrange(first, low)
            if port not in _HANDED_OUT and is_free(port, host):
                _HANDED_OUT.add(port)
                return port
        port = ephemeral_port(host)  # a crowded loopback: the kernel's choice after all
        _HANDED_OUT.add(port)
        return port
