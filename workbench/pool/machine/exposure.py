"""Where a pool's control channels listen, checked at start: never beyond the named interface (issue 27).

The controller (ipyparallel, told ``--ip``) and the relay (the side channel) must listen only on the
pool's address (loopback, or the address of ``--interface``/``--address``): a start that finds one of
them listening on another address, or on every interface, is stopped and refused.

>>> beyond([(7, "10.0.0.1", 4000), (7, "0.0.0.0", 4001), (7, "::", 4002)], "10.0.0.1")
[(7, '0.0.0.0', 4001), (7, '::', 4002)]
>>> endpoint_address("tcp://[::1]:5000"), endpoint_address("ipc:///run/x/relay-up")
('::1', None)
"""

from __future__ import annotations

import ipaddress

import psutil

from workbench.errors import PoolStartError


def listeners(pids: list[int]) -> list[tuple[int, str, int]]:
    """``(pid, ip, port)`` of every TCP socket the processes ``pids`` listen on (gone ones: none)."""
    found = []
    for pid in pids:
        try:
            for conn in psutil.Process(pid).net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((pid, conn.laddr.ip, conn.laddr.port))
        except psutil.Error:
            pass
    return sorted(found)


def beyond(found: list[tuple[int, str, int]], address: str) -> list[tuple[int, str, int]]:
    """The listeners of ``found`` not on ``address`` (every-interface listeners always are)."""
    want = _norm(address)
    return [entry for entry in found if _norm(entry[1]) != want]


def endpoint_address(url: str) -> str | None:
    """The IP a ZMQ ``tcp://`` endpoint is bound to; None for a unix socket (``ipc://``)."""
    if not url.startswith("tcp://"):
        return None
    host = url.removeprefix("tcp://").rsplit(":", 1)[0]
    return host.strip("[]")


def check(pids: list[int], urls: list[str], address: str, interface: str | None) -> None:
    """Raise :class:`PoolStartError` naming each control channel that listens beyond ``address``.

    ``pids``: the controller's processes; ``urls``: the relay's endpoints."""
    wide = [f"pid {pid} on {ip}:{port}" for pid, ip, port in beyond(listeners(pids), address)]
    wide += [f"the side channel on {url}" for url in urls
             if endpoint_address(url) is not None and _norm(endpoint_address(url)) != _norm(address)]
    if wide:
        named = f"--interface {interface} ({address})" if interface else f"the address {address}"
        raise PoolStartError(f"the pool's control channels listened beyond {named}: {', '.join(wide)}; "
                             "it was refused, as other machines (or users) could reach them there")


def _norm(ip: str) -> str:
    ip = ip.removeprefix("::ffff:")
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError:
        return ip
