"""Network interfaces: name -> address for the kernel, and "which interface reaches the kernel" for ranks.

Pure socket/psutil code (no torch): runs in the kernel and, through ipyparallel, on engines.
"""

from __future__ import annotations

import ipaddress
import socket

import psutil


def ipv4_addresses() -> dict[str, list[str]]:
    """Every interface of this host with its IPv4 addresses.

    >>> "127.0.0.1" in ipv4_addresses().get("lo", ["127.0.0.1"])
    True
    """
    return {name: [a.address for a in addrs if a.family == socket.AF_INET]
            for name, addrs in psutil.net_if_addrs().items()}


def describe_interfaces() -> str:
    """``"lo 127.0.0.1, eth0 10.0.0.5"``: what a person can choose from."""
    named = sorted(ipv4_addresses().items())
    return ", ".join(f"{name} {addrs[0]}" for name, addrs in named if addrs) or "none"


def interface_address(name: str) -> str:
    """The IPv4 address of interface ``name`` on this host.

    >>> interface_address("lo")
    '127.0.0.1'
    >>> interface_address("nope0")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: no network interface 'nope0' with an IPv4 address here; interfaces: ...
    """
    addrs = ipv4_addresses().get(name)
    if not addrs:
        raise ValueError(f"no network interface {name!r} with an IPv4 address here; "
                         f"interfaces: {describe_interfaces()}.")
    return addrs[0]


def interface_of(address: str) -> str | None:
    """The name of the local interface that holds ``address`` (``None`` if none does).

    >>> interface_of("127.0.0.1")
    'lo'
    """
    for name, addrs in ipv4_addresses().items():
        if address in addrs:
            return name
    return None


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``.

    >>> is_loopback("127.0.0.1"), is_loopback("10.1.2.3")
    (True, False)
    """
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def route_to(address: str) -> dict:
    """On this host: the interface and source address that traffic to ``address`` leaves from.

    A rank calls this with the kernel's address: its gloo/NCCL traffic then uses the same network
    (``GLOO_SOCKET_IFNAME``), and rank 0 binds the rendezvous store on its own address there. No packet
    is sent (a UDP socket's connect only picks the route).

    >>> route_to("127.0.0.1")["ifname"]
    'lo'
    """
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((address, 9))
        source = s.getsockname()[0]
    return {"ifname": interface_of(source), "address": source, "host": socket.gethostname()}


def resolve(config):
    """The config with ``address`` set from ``interface`` (a :class:`~workbench.config.PoolConfig`).

    >>> from workbench.config import PoolConfig
    >>> resolve(PoolConfig(interface="lo")).address
    '127.0.0.1'
    """
    from dataclasses import replace

    if config.interface is None:
        return config
    address = interface_address(config.interface)
    if config.address not in ("127.0.0.1", address):
        raise ValueError(f"address {config.address} is not on interface {config.interface} ({address}): "
                         "give one of them.")
    return replace(config, address=address)


class UnauthenticatedNetworkWarning(UserWarning):
    """The pool listens on an address other machines can reach."""


UNAUTHENTICATED = (
    "the pool listens on {address}: torch.distributed traffic (the rendezvous store, gloo, NCCL) is neither "
    "authenticated nor encrypted, so anyone who can reach this network can join or read it. Use a private "
    "cluster network (ipyparallel's own connections are encrypted and authenticated with CurveZMQ, and the "
    "side channel's messages signed with the pool's key).")
