"""A local pool's side channel is unix sockets in its private folder (issue 27): a signed message still
goes through, and nothing of it listens on TCP."""

from __future__ import annotations

import pytest
import zmq

from tests.conftest import until
from workbench import wire
from workbench.pool.machine.exposure import endpoint_address
from workbench.pool.watch.relay import Relay

pytestmark = pytest.mark.timeout(60)


def test_a_relay_in_a_folder_binds_unix_sockets_there_and_forwards_what_is_signed(tmp_path):
    folder = tmp_path / "stores"
    folder.mkdir(mode=0o700)
    key = wire.new_key()
    relay = Relay("127.0.0.1", key, str(folder))
    ctx = zmq.Context()
    sub = wire.subscriber(ctx, relay.out, wire.BEACON)
    push = wire.pusher(ctx, relay.up)
    try:
        assert relay.up == f"ipc://{folder}/relay-up" and relay.out == f"ipc://{folder}/relay-out"
        assert endpoint_address(relay.up) is None and sorted(p.name for p in folder.iterdir()) == [
            "relay-out", "relay-up"]
        # the subscription has reached the relay once a signed probe comes through (awaited, not slept for)
        assert until(lambda: push.send_multipart(wire.Signer(key).pack(wire.BEACON, b"{}")) or sub.poll(50),
                     timeout=10)
        while sub.poll(100):  # the probes that came
            sub.recv_multipart()
        assert until(lambda: relay.dropped == 0 and relay.forwarded >= 1)
        forwarded = relay.forwarded
        push.send_multipart(wire.Signer(key).pack(wire.BEACON, b"{}"))
        push.send_multipart(wire.Signer(wire.new_key()).pack(wire.BEACON, b"{}"))
        assert until(lambda: relay.forwarded == forwarded + 1 and relay.dropped == 1)
        assert sub.poll(5000) and sub.recv_multipart()[0] == wire.BEACON
    finally:
        sub.close(0)
        push.close(0)
        ctx.term()
        relay.close()


def test_a_folder_too_deep_for_a_unix_socket_falls_back_to_the_address(tmp_path):
    deep = tmp_path / ("d" * 120)
    deep.mkdir(mode=0o700)
    relay = Relay("127.0.0.1", wire.new_key(), str(deep))
    try:
        assert endpoint_address(relay.up) == "127.0.0.1" and endpoint_address(relay.out) == "127.0.0.1"
    finally:
        relay.close()
