"""Port choice for the local cluster: explicit, reused, or fresh, and never duplicated."""

from __future__ import annotations

import socket

import pytest

from choreo.service.ports import ephemeral_port, ephemeral_range, is_free, listen_port
from choreo_dev.errors import DevClusterError
from choreo_dev.ports import choose_ports


def test_requested_port_in_use_is_a_clear_error() -> None:
    with pytest.raises(DevClusterError, match=r"port 6443 .*kube-apiserver.* in use"):
        choose_ports(["kube-apiserver"], {"kube-apiserver": 6443}, free=lambda p: False)


def test_requested_free_port_is_used() -> None:
    ports = choose_ports(["a", "b"], {"a": 7000}, free=lambda p: True, pick=iter([9000]).__next__)
    assert ports == {"a": 7000, "b": 9000}


def test_previous_port_is_reused_when_free_and_replaced_when_taken() -> None:
    fresh = iter([9100, 9101])
    ports = choose_ports(
        ["a", "b"],
        previous={"a": 7001, "b": 7002},
        free=lambda p: p != 7002,
        pick=fresh.__next__,
    )
    assert ports == {"a": 7001, "b": 9100}


def test_no_two_roles_share_a_port() -> None:
    picks = iter([9200, 9200, 9201])
    ports = choose_ports(["a", "b"], free=lambda p: True, pick=picks.__next__)
    assert ports == {"a": 9200, "b": 9201}


def test_same_requested_port_twice_is_rejected() -> None:
    with pytest.raises(DevClusterError, match="7003"):
        choose_ports(["a", "b"], {"a": 7003, "b": 7003}, free=lambda p: True)


def test_is_free_sees_a_listening_socket() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not is_free(port)
    assert is_free(ephemeral_port())


def test_listening_ports_come_from_below_the_ephemeral_range_and_never_twice() -> None:
    """Outgoing connections take their source ports from the ephemeral range, so a port a
    server is to listen on is picked below it, free, and not handed out before."""
    low, high = ephemeral_range()
    assert 1024 <= low <= high
    ports = [listen_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(port < low and is_free(port) for port in ports)
