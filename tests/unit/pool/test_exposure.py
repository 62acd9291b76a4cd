"""A pool whose control channels listen beyond its address is refused (issue 27): the check, run on
real listening processes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from workbench.errors import PoolStartError
from workbench.pool.machine import exposure

pytestmark = pytest.mark.timeout(60)

LISTEN = """
import socket, sys
socks = []
for ip in sys.argv[1:]:
    s = socket.socket(); s.bind((ip, 0)); s.listen(); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def listener():
    procs = []

    def start(*ips):
        proc = subprocess.Popen([sys.executable, "-c", LISTEN, *ips], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc.pid, [int(p) for p in proc.stdout.readline().split()]

    yield start
    for proc in procs:
        proc.stdin.close()
        proc.wait(10)


def test_a_controller_on_every_interface_is_refused_and_named(listener):
    pid, (narrow, wide) = listener("127.0.0.1", "0.0.0.0")
    with pytest.raises(PoolStartError) as err:
        exposure.check([pid], ["ipc:///tmp/x/relay-up"], "127.0.0.1", None)
    assert f"pid {pid} on 0.0.0.0:{wide}" in str(err.value) and str(narrow) not in str(err.value)


def test_a_side_channel_on_another_address_is_refused(listener):
    pid, _ = listener("127.0.0.1")
    with pytest.raises(PoolStartError, match=r"beyond --interface eth0 \(127.0.0.1\): the side channel on "
                                             r"tcp://0.0.0.0:5000"):
        exposure.check([pid], ["tcp://127.0.0.1:5001", "tcp://0.0.0.0:5000"], "127.0.0.1", "eth0")


def test_channels_on_the_address_only_pass(listener):
    pid, _ = listener("127.0.0.1", "127.0.0.1")
    exposure.check([pid], ["tcp://127.0.0.1:5001", "ipc:///tmp/x/relay-out"], "127.0.0.1", None)
