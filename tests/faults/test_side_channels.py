"""The side channel (beacons, metrics, commands) takes only what the pool itself signed.

An attacker here is any process that can reach the relay's port: it knows the port (it is
listening on an interface), not the pool's key (in the 0600 state file and in the ranks' memory).
"""

from __future__ import annotations

import json
import os
import signal
import stat

import psutil
import pytest
import zmq

from tests.conftest import until
from workbench import wire
from workbench.metrics import records
from workbench.metrics.collector import Collector
from workbench.pool.watch.beacons import BeaconReceiver

pytestmark = pytest.mark.timeout(120)


def _beat(rank: int, seq: int, **extra) -> bytes:
    return json.dumps({"rank": rank, "pub": "p", "seq": seq, "inflight": None, "done": 0, **extra}).encode()


def _metrics(rank: int, seq: int, loss: float) -> bytes:
    return records.encode(pub="p", rank=rank, host="h",
                          steps=[[seq, *records.step_row(t=1.0, step=seq + 1, loss=loss, run=1)]])


PROBE = 99  # a rank no test speaks for: its beacons only show that the subscriptions reached the relay


def _subscribed(push, signer: wire.Signer, rx: BeaconReceiver, collector: Collector, relay) -> int:
    """Await the receivers' subscriptions at the relay (a subscription takes a moment to get there, and
    what the relay sends before is lost): a probe beacon and an empty metrics batch, sent again until each
    arrived. Returns how many messages the relay has forwarded by then."""
    sent = 0

    def arrived() -> bool:
        nonlocal sent
        push.send_multipart(signer.pack(wire.BEACON, _beat(PROBE, sent)))
        push.send_multipart(signer.pack(wire.METRICS, records.encode(pub="probe", rank=PROBE, host="h")))
        sent += 1
        return PROBE in rx.latest and collector.stats["messages"] > 0

    assert until(arrived, every=0.05)
    assert until(lambda: relay.forwarded >= 2 * sent)  # every probe has passed the relay
    return relay.forwarded


def test_forged_beacons_and_metrics_are_dropped_and_counted(channel):
    rx, collector = BeaconReceiver(channel), Collector(channel)
    ctx = zmq.Context()
    honest = wire.pusher(ctx, channel["up"])
    attacker = wire.pusher(ctx, channel["up"])
    ours, theirs = wire.Signer(channel["key"]), wire.Signer(wire.new_key())
    try:
        probes = _subscribed(honest, ours, rx, collector, channel["relay"])
        honest.send_multipart(ours.pack(wire.BEACON, _beat(0, 0)))
        honest.send_multipart(ours.pack(wire.METRICS, _metrics(0, 0, loss=1.0)))
        assert until(lambda: 0 in rx.latest and collector.count("step") == 1)
        # a beacon signed with another key, an unsigned one, a metric with a fake loss curve
        attacker.send_multipart(theirs.pack(wire.BEACON, _beat(0, 5, inflight="all_reduce")))
        attacker.send_multipart([wire.BEACON, _beat(1, 0), b""])
        attacker.send_multipart(theirs.pack(wire.METRICS, _metrics(0, 1, loss=1e9)))
        attacker.send_multipart(ours.pack(wire.BEACON, _beat(0, 0, inflight="replayed")))  # a replay
        assert until(lambda: channel["relay"].dropped == 3 and channel["relay"].forwarded == probes + 3)
        # a mark sent after them on the same socket reaches the receiver after the replay did
        attacker.send_multipart(ours.pack(wire.BEACON, _beat(2, 0, inflight="mark")))
        assert until(lambda: 2 in rx.latest)
        assert rx.latest[0]["inflight"] is None and 1 not in rx.latest
        # a receiver checks too: what reaches it without the relay is dropped there
        assert not rx.take(theirs.pack(wire.BEACON, _beat(1, 9))) and rx.bad == 1 and 1 not in rx.latest
        assert collector.count("step") == 1
        assert collector.history().dataframe()["loss"].tolist() == [1.0]
        honest.send_multipart(ours.pack(wire.BEACON, _beat(0, 1, inflight="barrier")))
        assert until(lambda: rx.latest[0]["inflight"] == "barrier")  # the channel still works
    finally:
        honest.close(0)
        attacker.close(0)
        ctx.term()
        rx.close()
        collector.close()


def test_ten_thousand_garbage_and_oversize_messages_change_nothing(channel):
    rx, collector = BeaconReceiver(channel), Collector(channel)
    ctx = zmq.Context()
    honest = wire.pusher(ctx, channel["up"])
    ours = wire.Signer(channel["key"])
    me = psutil.Process()
    try:
        _subscribed(honest, ours, rx, collector, channel["relay"])
        honest.send_multipart(ours.pack(wire.METRICS, _metrics(0, 0, loss=0.5)))
        assert until(lambda: collector.count("step") == 1)
        before = me.memory_info().rss
        attacker = ctx.socket(zmq.PUSH)
        attacker.setsockopt(zmq.LINGER, 0)
        attacker.connect(channel["up"])
        for i in range(10_000):
            kind = i % 4
            if kind == 0:
                attacker.send(os.urandom(64))
            elif kind == 1:
                attacker.send_multipart([wire.METRICS, os.urandom(200), os.urandom(32)])
            elif kind == 2:
                attacker.send_multipart([wire.BEACON, b"{not json", b"x" * 32])
            else:
                attacker.send_multipart([wire.METRICS, b"\0" * 60_000, b"x"])
        for _ in range(20):  # over the size limit: refused before it is read (and the sender cut off)
            big = ctx.socket(zmq.PUSH)
            big.setsockopt(zmq.LINGER, 2000)
            big.connect(channel["up"])
            big.send(b"\0" * (2 * wire.MAX_BYTES), copy=False)
            big.close()
        assert until(lambda: channel["relay"].dropped == 10_000, 60), channel["relay"].dropped
        honest.send_multipart(ours.pack(wire.METRICS, _metrics(0, 1, loss=0.25)))
        assert until(lambda: collector.count("step") == 2, 30)  # still listening, still right
        assert collector.history().dataframe()["loss"].tolist() == [0.5, 0.25]
        assert collector.stats["step"] == 2 and collector.stats["missing"] == 0
        assert collector.stats["bad_messages"] == 0 and rx.bad == 0  # none got past the relay
        grown = (me.memory_info().rss - before) / 2**20
        assert grown < 64, f"the kernel grew by {grown:.0f} MiB on garbage"
        attacker.close(0)
    finally:
        honest.close(0)
        ctx.term()
        rx.close()
        collector.close()


def test_a_forged_abort_leaves_the_group_alone_and_a_signed_command_is_obeyed(pool):
    """The engines' agents take commands only signed with the pool's key and for the current group."""
    pool.run("import torch\ndist.all_reduce(torch.ones(1))")
    state = json.loads(pool.pool.state_file.read_text())
    assert stat.S_IMODE(os.stat(pool.pool.state_file).st_mode) == 0o600  # the key's file
    channel, generation = state["channel"], state["generation"]
    ctx = zmq.Context()
    sock = wire.pusher(ctx, channel["up"])
    try:
        forged = {"do": "abort", "ranks": [0, 1], "generation": generation, "id": "x1", "ports": []}
        sock.send_multipart(wire.Signer(wire.new_key()).pack(wire.COMMAND, json.dumps(forged).encode()))
        stale = {**forged, "generation": generation - 1, "id": "x2"}
        sock.send_multipart(wire.Signer(channel["key"]).pack(wire.COMMAND, json.dumps(stale).encode()))
        # the forged one stops at the relay; the stale one (an old group's) at each agent
        assert until(lambda: pool.pool.relay.dropped >= 1 and pool.apply(_dropped_commands) == [1, 1])
        assert pool.apply(_group_works) == [True, True]
        signed = {"do": "stop", "ranks": [1], "generation": generation, "id": "x3"}
        sock.send_multipart(wire.Signer(channel["key"]).pack(wire.COMMAND, json.dumps(signed).encode()))
        assert until(lambda: pool.apply(_stop_requested) == [False, True])
        sock.send_multipart(wire.Signer(channel["key"]).pack(wire.COMMAND, json.dumps(signed).encode()))
        assert until(lambda: pool.apply(_dropped_commands) == [1, 2])  # the same command again: a replay
    finally:
        sock.close(0)
        ctx.term()
        pool.apply(_clear_stop)


def test_a_signal_command_reaches_a_rank_without_a_nanny(pool):
    """Ranks on other machines are signalled through their agent (engines have no ipyparallel nanny)."""
    pool.run("import signal\nsignalled = []\n"
             "signal.signal(signal.SIGUSR1, lambda *a: signalled.append(rank))")
    # what signal() does off this host
    pool.rooms.group.command(wire.Command.SIGNAL, pool.ranks[1:], sig=int(signal.SIGUSR1))
    assert until(lambda: pool.pull("signalled") == [[], [1]])


def _group_works() -> bool:
    import datetime

    import torch
    import torch.distributed as dist

    try:
        return bool(dist.all_reduce(torch.ones(1), async_op=True).wait(timeout=datetime.timedelta(seconds=5)))
    except Exception:
        return False


def _stop_requested() -> bool:
    from workbench.engine import agent

    return agent.stop_requested()


def _clear_stop() -> None:
    from workbench.engine import agent

    agent.clear_stop()


def _dropped_commands() -> int:
    from workbench.engine import agent

    return agent.current().bad
