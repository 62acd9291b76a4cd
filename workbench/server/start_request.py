"""What the panel's Start dialog sends, checked before anything starts; and what it can offer.

A start request is a JSON object with the fields of :class:`~workbench.config.PoolConfig` the dialog
has (``n``, ``launcher``, ``backend``, ``timeout``, and per launcher ``nodes``, ``gpus_per_node``,
``partition``, ``time``, ``account``, ``hosts``, ``interface``, ``oversubscribe``). Every mistake is a
``ValueError`` whose sentence the dialog shows as it is; a request that passes here has named a launcher,
options, a network and a size the pool can start with.
"""

from __future__ import annotations

from typing import Any

from workbench.config import PoolConfig
from workbench.pool import capacity, launchers, netif

# field -> (type, how a sentence names it)
WHOLE = {"n": "engines", "nodes": "nodes", "gpus_per_node": "GPUs per node"}
TEXT = ("launcher", "backend", "partition", "time", "account", "interface")
FIELDS = ("n", "launcher", "backend", "timeout", "nodes", "gpus_per_node", "partition", "time", "account",
          "hosts", "interface", "oversubscribe")


def parse_start_request(body: Any) -> PoolConfig:
    """The pool config a POST asks for; ``ValueError`` with a sentence for anything wrong.

    >>> parse_start_request({"n": 2}).n
    2
    >>> parse_start_request({"launcher": "slurm", "nodes": 2, "gpus_per_node": 4, "interface": "lo"}).engines
    8
    >>> parse_start_request({"n": "two"})
    Traceback (most recent call last):
    ...
    ValueError: engines must be a whole number (got 'two').
    >>> parse_start_request({"launcher": "slurm", "time": "2 hours", "interface": "lo"})
    Traceback (most recent call last):
    ...
    ValueError: time '2 hours' is not a Slurm time limit: write minutes ('30'), 'HH:MM:SS' or 'D-HH:MM'.
    >>> parse_start_request({"engines": 2})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown field 'engines': a pool takes n, launcher, backend, timeout, nodes, ...
    """
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object, e.g. {\"n\": 2}.")
    for key in body:
        if key not in FIELDS:
            raise ValueError(f"unknown field {key!r}: a pool takes {', '.join(FIELDS)}.")
    # an empty field of the dialog means "the default"
    given = {k: v for k, v in body.items() if v is not None and v != ""}
    for key, words in WHOLE.items():
        value = given.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{words} must be a whole number (got {value!r}).")
    timeout = given.get("timeout", 60.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ValueError(f"timeout must be a number of seconds (got {timeout!r}).")
    given["timeout"] = float(timeout)
    for key in TEXT:
        if key in given and not isinstance(given[key], str):
            raise ValueError(f"{key} must be a string (got {given[key]!r}).")
    hosts = given.get("hosts", ())
    if isinstance(hosts, list) and all(isinstance(h, str) for h in hosts):
        hosts = ",".join(hosts)
    if not isinstance(hosts, (str, tuple)):
        raise ValueError(f"hosts must be host names separated by commas (got {hosts!r}).")
    given["hosts"] = hosts
    if not isinstance(given.get("oversubscribe", False), bool):
        raise ValueError(f"oversubscribe must be true or false (got {given['oversubscribe']!r}).")
    config = PoolConfig(**given)
    # the network too: a named interface must exist here, and engines elsewhere cannot use loopback
    resolved = netif.resolve(config)
    launchers.check_address(config, resolved.address)
    if config.launcher == "local" and config.n is not None:  # no more ranks than this machine holds
        capacity.check_this_machine(config.n, config.oversubscribe)
    return config


def start_options(config: PoolConfig) -> dict:
    """The request that starts a pool like ``config`` (what the dialog shows again on Retry).

    >>> start_options(PoolConfig(n=2))
    {'n': 2, 'launcher': 'local', 'backend': 'auto', 'timeout': 60.0}
    >>> start_options(PoolConfig(launcher="ssh", hosts="a,b", interface="eth0"))["hosts"]
    'a,b'
    """
    out = {}
    for key in FIELDS:
        value = getattr(config, key)
        if key == "hosts":
            value = ",".join(value)
        if value not in (None, "", False) or key in ("launcher", "backend"):
            out[key] = value
    return out


def interfaces() -> list[dict]:
    """The network interfaces of this machine with an IPv4 address, loopback first.

    >>> interfaces()[0]["name"], interfaces()[0]["loopback"]
    ('lo', True)
    """
    named = [{"name": name, "address": addrs[0], "loopback": netif.is_loopback(addrs[0])}
             for name, addrs in netif.ipv4_addresses().items() if addrs]
    return sorted(named, key=lambda i: (not i["loopback"], i["name"]))
