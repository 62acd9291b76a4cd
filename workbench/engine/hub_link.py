"""Where this engine's side channel goes: its host's hub, when the launcher started the engine beside one.

A hub (:mod:`workbench.pool.processes.host_hub`, one per host) takes the relay's place for the engines of its
host: they send it their beacons, metrics, stacks and cells' output, and it sends the kernel one message per
host for many of theirs; commands come down through it. The launcher tells an engine its hub in the
environment (:data:`workbench.wire.HUB_ENV` and the two sockets); an engine without one talks to the relay.

>>> via_hub({"up": "ipc://relay-up", "out": "ipc://relay-out", "key": "k"}, env={})["up"]
'ipc://relay-up'
>>> env = {"WORKBENCH_HUB": "h0", "WORKBENCH_HUB_UP": "ipc://h0-up", "WORKBENCH_HUB_OUT": "ipc://h0-out"}
>>> sorted(via_hub({"up": "ipc://relay-up", "out": "ipc://relay-out", "key": "k"}, env=env).items())
[('key', 'k'), ('out', 'ipc://h0-out'), ('up', 'ipc://h0-up')]
>>> label(env), label({})
('h0', '')
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from workbench import wire


def label(env: Mapping[str, str] | None = None) -> str:
    """This engine's hub ("" where it has none)."""
    env = os.environ if env is None else env
    return env.get(wire.HUB_ENV, "") if env.get(wire.HUB_UP_ENV) and env.get(wire.HUB_OUT_ENV) else ""


def via_hub(channel: dict | None, env: Mapping[str, str] | None = None) -> dict | None:
    """The pool's ``channel`` as this engine uses it: its hub's sockets in the relay's place, the key kept."""
    env = os.environ if env is None else env
    if not channel or not label(env):
        return channel
    return {**channel, "up": env[wire.HUB_UP_ENV], "out": env[wire.HUB_OUT_ENV]}
