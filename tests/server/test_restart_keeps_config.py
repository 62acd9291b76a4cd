"""A pool the panel did not start, restarted from the panel, starts again with every setting it had.

Before the state file carried the whole :class:`PoolConfig` (one round trip, ``to_dict``/``from_dict``),
the server rebuilt it from a few keys: an MPI pool a notebook started came back without its interface,
its timeouts, its idle release and its launcher options.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap

import psutil
import pytest

from workbench.config import PoolConfig
from workbench.pool.machine import netif

from .conftest import owner_process, wait_for

# a non-local pool with every field away from its default that an MPI pool on this machine can take
CONFIG = dict(n=2, launcher="mpi", backend="gloo", timeout=45.0, interface="lo", idle_release=900.0,
              oversubscribe=True, name="mpi-team", collective_timeout=120.0, share_gpus=True,
              launcher_options={"mpi_args": ["--oversubscribe"]})

OWNER = textwrap.dedent(f"""
    import sys
    from workbench import Session
    s = Session(**{CONFIG!r}).start()
    print(s.pool_id, flush=True)
    sys.stdin.read()  # until the test closes it
    s.stop()
""")


def _manager(jp_serverapp):
    apps = jp_serverapp.extension_manager.extension_apps["workbench.server"]
    return next(iter(apps)).manager


@pytest.mark.timeout(240)
async def test_a_notebooks_mpi_pool_restarted_from_the_panel_keeps_every_field(api, jp_serverapp):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    fresh = None
    with owner_process(OWNER) as (_, pool_id):
        try:
            await wait_for(api, pool_id, "running")
            code, body, _ = await api("POST", "pools", pool_id, "restart", body={})
            assert code == 202, body
            fresh = await wait_for(api, body["pool"]["id"], "running", timeout=150)
            assert fresh["id"] == pool_id and fresh["name"] == "mpi-team"
            started = next(r for r in _manager(jp_serverapp)._started.values() if r.pool_id == pool_id)
            assert dataclasses.asdict(started.config) == \
                dataclasses.asdict(netif.resolve(PoolConfig(**CONFIG)))
        finally:
            if fresh is not None:
                code, _, _ = await api("DELETE", "pools", fresh["id"])
                assert code == 200
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not [p for p in left if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_the_state_file_round_trip_keeps_every_field():
    config = netif.resolve(PoolConfig(**CONFIG))
    again = PoolConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert dataclasses.asdict(again) == dataclasses.asdict(config)
