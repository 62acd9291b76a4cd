"""What the panel's Start dialog offers (:func:`start_form`, rendered by the page from the config's
fields), what it sends, checked before anything starts.

A start request is a JSON object with any of the fields of :class:`~workbench.config.PoolConfig`
(:func:`~workbench.config.pool_options`: the same list the magic's ``%dist start`` is made from; the
dialog sends ``n``, ``launcher``, ``backend``, ``timeout``, and per launcher ``nodes``, ``gpus_per_node``,
``partition``, ``time``, ``account``, ``hosts``, ``interface``, ``oversubscribe``). Every mistake is a
``ValueError`` whose sentence the dialog shows as it is; a request that passes here has named a launcher,
options, a network and a size the pool can start with.
"""

from __future__ import annotations

from typing import Any

from workbench.config import PoolConfig, PoolOption, options_schema, pool_options
from workbench.pool.launch import launcher_for
from workbench.pool.machine import netif

OPTIONS = {o.name: o for o in pool_options()}
FIELDS = tuple(OPTIONS)


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
    ValueError: unknown field 'engines': a pool takes n, launcher, backend, timeout, ...
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
    for key, value in list(given.items()):
        given[key] = _checked(OPTIONS[key], value)
    config = PoolConfig(**given)
    # the network too: a named interface must exist here, and engines elsewhere cannot use loopback
    resolved = netif.resolve(config)
    launcher = launcher_for(config)
    launcher.check_address(resolved.address)
    if config.n is not None:  # no more ranks than this machine holds (a local pool)
        launcher.check_capacity(config.n)
    return config


def _checked(option: PoolOption, value: Any) -> Any:
    """``value`` as the field takes it, or a ``ValueError`` saying what the field takes."""
    if option.kind == "count":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{option.words} must be a whole number (got {value!r}).")
    elif option.kind == "seconds":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{option.words} must be a number of seconds (got {value!r}).")
        value = float(value)
    elif option.kind == "switch":
        if not isinstance(value, bool):
            raise ValueError(f"{option.words} must be true or false (got {value!r}).")
    elif option.kind == "text":
        if not isinstance(value, str):
            raise ValueError(f"{option.name} must be a string (got {value!r}).")
    elif option.kind == "hosts":
        if isinstance(value, list) and all(isinstance(h, str) for h in value):
            value = ",".join(value)
        if not isinstance(value, str):
            raise ValueError(f"hosts must be host names separated by commas (got {value!r}).")
    elif not isinstance(value, dict):  # mapping
        raise ValueError(f"{option.name} must be a JSON object (got {value!r}).")
    return value


def start_options(config: PoolConfig) -> dict:
    """The request that starts a pool like ``config`` (what the dialog shows again on Retry).

    >>> start_options(PoolConfig(n=2))
    {'n': 2, 'launcher': 'local', 'backend': 'auto', 'timeout': 60.0}
    >>> start_options(PoolConfig(launcher="ssh", hosts="a,b", interface="eth0"))["hosts"]
    'a,b'
    """
    out = {}
    for key, option in OPTIONS.items():
        value = getattr(config, key)
        if key in ("launcher", "backend", "timeout") or value not in (None, "", False, option.default):
            out[key] = ",".join(value) if key == "hosts" else value
    return out


def interfaces() -> list[dict]:
    """The network interfaces of this machine with an IPv4 address, loopback first.

    >>> interfaces()[0]["name"], interfaces()[0]["loopback"]
    ('lo', True)
    """
    named = [{"name": name, "address": addrs[0], "loopback": netif.is_loopback(addrs[0])}
             for name, addrs in netif.ipv4_addresses().items() if addrs]
    return sorted(named, key=lambda i: (not i["loopback"], i["name"]))


def start_form(default_n: int) -> dict:
    """The start dialog's fields, for the page to render (``GET /workbench/options``): every option of
    :func:`~workbench.config.options_schema` (those with ``advanced`` are the dialog's, in their order),
    each choice with its label, the interface's choices this machine's, the hint of an empty box filled in
    (``default_n``: the engines a start without ``n`` gets here); and the sentence under the fields.

    >>> form = start_form(2)
    >>> [(o["name"], o["label"]) for o in form["options"] if o["advanced"]][:3]
    [('launcher', 'Launcher'), ('n', 'Engines'), ('hosts', 'Hosts')]
    >>> next(o["hint"] for o in form["options"] if o["name"] == "n")
    'default: 2 here, one per GPU on a cluster'
    >>> next(o for o in form["options"] if o["name"] == "interface")["choices"][0]
    {'value': 'lo', 'label': 'lo (127.0.0.1)'}
    >>> form["note"]
    "Interface: where engines on other machines reach this server's pool."
    """
    options = []
    for option in options_schema():
        choices = [{"value": c, "label": c} for c in option["choices"]]
        if option["name"] == "interface":
            choices = [{"value": i["name"], "label": f"{i['name']} ({i['address']})"} for i in interfaces()]
        hint = option["hint"]
        if hint is None and option["kind"] in ("count", "seconds") and option["default"] is not None:
            hint = f"{option['default']:g}"  # an empty box starts with the default: say which
        options.append({**option, "choices": choices,
                        "hint": hint.format(default_n=default_n) if hint is not None else None})
    label = OPTIONS["interface"].label
    return {"options": options, "note": f"{label}: where engines on other machines reach this server's pool."}
