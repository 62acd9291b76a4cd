"""The controller's heartbeat slows down in a settled pool and speeds up when an engine registers.

A real 2-rank pool; the pings are counted as an engine's heart gets them (a SUB socket on the controller's
ping address, through its CURVE encryption), never timed: what is checked is how many came.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import zmq

from tests.conftest import running_pool
from workbench.pool.watch import heart

pytestmark = pytest.mark.timeout(180)


@pytest.fixture()
def pool():
    with running_pool(n=2, timeout=120) as s:
        yield s


def _pings(pool, seconds: float) -> int:
    """How many pings the controller sent in ``seconds``, as an engine's heart would receive them."""
    c = pool.pool.cluster
    info = json.loads(Path(c.profile_dir, "security", f"ipcontroller-{c.cluster_id}-engine.json").read_text())
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    public, secret = zmq.curve_keypair()
    sub.curve_serverkey, sub.curve_publickey, sub.curve_secretkey = \
        info["curve_serverkey"].encode(), public, secret
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"{info['interface']}:{info['hb_ping']}")
    try:
        sub.poll(3000)  # the first ping once connected (at the slow pace, within a period)
        count, end = 0, time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if sub.poll(left * 1000):
                sub.recv_multipart()
                count += 1
        return count
    finally:
        sub.close(0)
        ctx.term()


def test_a_settled_pool_pings_slowly_and_a_registration_speeds_it_up(pool):
    time.sleep(heart.QUIET_S + 1)  # nothing changed since the start
    settled = _pings(pool, 3.0)
    # 1 s period: 3 (4 with the edges); the start's 100 ms would give ~30
    assert settled <= 5, f"{settled} pings in 3 s of a settled pool"
    # a new engine registers (the pool grows; no heart was late): the hub wakes the heart monitor at once
    pool.scale(3)
    woken = _pings(pool, 1.0)
    assert woken >= 5, f"only {woken} pings in the second after a registration"
    pool.run("import torch.distributed as dist\nx = dist.get_world_size()")
    assert pool.pull("x") == [3, 3, 3]
