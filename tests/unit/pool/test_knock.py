"""knock: a silent rank's gloo port tells up from gone (real sockets and processes), and Health knocks
without waiting."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import until
from workbench import wire
from workbench.pool.rankmap import RankInfo
from workbench.pool.watch.beacons import BeaconReceiver
from workbench.pool.watch.knock import ANSWERS, REFUSED, SILENT, knock
from workbench.session import health
from workbench.session.health import Health

LISTEN = """import socket, sys, time
s = socket.create_server(("127.0.0.1", 0))
print(s.getsockname()[1], flush=True)
time.sleep(120)"""


@pytest.fixture
def listener_process():
    """A process that listens on a port (as gloo's listener does), and the port."""
    child = subprocess.Popen([sys.executable, "-c", LISTEN], stdout=subprocess.PIPE, text=True)
    port = int(child.stdout.readline())
    yield child, port
    child.kill()
    child.wait()
    child.stdout.close()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.timeout(30)
def test_a_stopped_process_still_answers_on_its_port(listener_process):
    """What a rank holding the interpreter (or starved of CPU) looks like: no thread of it runs, yet its
    operating system completes the handshake."""
    child, port = listener_process
    child.send_signal(signal.SIGSTOP)
    try:
        assert knock({3: [["127.0.0.1", port]]}, timeout=2.0) == {3: ANSWERS}
    finally:
        child.send_signal(signal.SIGCONT)


@pytest.mark.timeout(30)
def test_a_killed_process_port_is_refused(listener_process):
    child, port = listener_process
    child.kill()
    child.wait()
    assert knock({3: [["127.0.0.1", port]]}, timeout=2.0) == {3: REFUSED}


@pytest.fixture
def unanswered_port():
    """A port whose handshake never completes: its listener's accept queue is full, so Linux drops every
    further SYN (as a cut link drops them)."""
    server = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = server.getsockname()[1]
    fillers = []
    while not fillers or knock({0: [["127.0.0.1", port]]}, timeout=0.2) != {0: SILENT}:
        assert len(fillers) < 8, "the accept queue never filled"
        filler = socket.socket()
        filler.settimeout(0.2)
        try:
            filler.connect(("127.0.0.1", port))
        except OSError:
            pass
        fillers.append(filler)
    yield port
    for filler in fillers:
        filler.close()
    server.close()


@pytest.mark.timeout(30)
def test_no_answer_is_silent_and_every_rank_is_knocked_at_once(listener_process, unanswered_port):
    """Knocked side by side: silent ranks beside ones that answer or refuse, each gets its own verdict."""
    _, port = listener_process
    found = knock({0: [["127.0.0.1", unanswered_port]], 1: [["127.0.0.1", unanswered_port]],
                   2: [["127.0.0.1", port]], 4: [["127.0.0.1", _closed_port()]]}, timeout=1.0)
    assert found == {0: SILENT, 1: SILENT, 2: ANSWERS, 4: REFUSED}


@pytest.mark.timeout(30)
def test_one_answering_endpoint_is_enough_and_unknown_ones_are_left_out(listener_process):
    _, port = listener_process
    assert knock({5: [["127.0.0.1", _closed_port()], ["::ffff:127.0.0.1", port]],  # a mesh of its own
                  6: [["0.0.0.0", port]], 7: None, 8: []}) == {5: ANSWERS}


def _tcp_to(port: int) -> int:
    return sum(1 for c in psutil.Process().net_connections(kind="tcp") if c.raddr and c.raddr[1] == port)


@pytest.mark.timeout(60)
def test_health_never_waits_for_a_knock_and_leaves_no_socket(channel, listener_process, unanswered_port,
                                                            monkeypatch, tmp_path):
    """Health knocks from its own poll loop. While a cut-off host's knock waits for an answer that does not
    come (30 s here), a rank on another host whose process is gone is found exited: neither held behind the
    knock nor taken for a cut link. Closing Health closes the knock's socket."""
    monkeypatch.setattr(health, "KNOCK_TIMEOUT_S", 30.0)
    monkeypatch.setenv("WORKBENCH_STATE_DIR", str(tmp_path))  # the fault log
    child, port = listener_process
    ranks = [RankInfo(0, 0, 0, "n1", 101, "cpu", 0), RankInfo(1, 0, 1, "n2", 102, "cpu", 1)]
    joined = {0: [["127.0.0.1", unanswered_port]], 1: [["127.0.0.1", port]]}
    before, reports = _tcp_to(unanswered_port), []
    rx = BeaconReceiver(channel)
    h = Health(pool_id=None, beacons=rx, report=reports.append,
               endpoints=lambda: joined)
    try:
        h.watch(ranks, local=False)  # both ranks' silence starts now; rank 1 beacons once more, then ends
        time.sleep(0.5)
        beat = {"rank": 1, "pub": "p102", "seq": 1, "generation": 0, "pid": 102, "host": "n2"}
        assert rx.take(wire.Signer(channel["key"]).pack(wire.BEACON, json.dumps(beat).encode()))
        child.kill()
        child.wait()
        assert until(lambda: 1 in h.dead, timeout=20), f"rank 1 never found dead: {h.dead}"
        assert h.dead == {1: "exited (its host answered, its process was gone)"}, "rank 0 is still knocked"
        assert until(lambda: reports, timeout=5)
        assert "rank 1 (n2, cpu) died while the pool was idle" in reports[0]
        assert _tcp_to(unanswered_port) == before + 1  # rank 0's knock, still waiting
    finally:
        h.close()
        rx.close()
    assert _tcp_to(unanswered_port) == before


@pytest.mark.timeout(60)
def test_a_rank_renumbered_by_a_regroup_is_knocked_at_its_own_port(channel, listener_process, monkeypatch,
                                                                   tmp_path):
    """After a regroup renumbers a silent survivor (rank 1 on n2 becomes rank 0), the number's latest beacon
    is still its previous holder's (killed: its port refuses), and the group's endpoints for it may be a
    group old (a regroup's ports are known once its ranks beacon). The survivor's silence and the port
    knocked at are its own, as its last beacon under its old number said: it answers, so it is up, not
    "exited"; once it is gone, its own port refuses (issue 38's host chaos finding)."""
    monkeypatch.setenv("WORKBENCH_STATE_DIR", str(tmp_path))  # the fault log
    child, port = listener_process
    joined = {0: [["127.0.0.1", _closed_port()]], 1: [["127.0.0.1", port]]}
    rx = BeaconReceiver(channel)
    h = Health(pool_id=None, beacons=rx, report=lambda text: None, endpoints=lambda: joined)
    try:
        h.watch([RankInfo(0, 0, 0, "n1", 101, "cpu", 0), RankInfo(1, 0, 1, "n2", 102, "cpu", 1)], local=False)
        signer = wire.Signer(channel["key"])
        beat = {"rank": 0, "pub": "p101", "seq": 1, "generation": 0, "pid": 101, "host": "n1",
                "endpoints": joined[0]}  # the engine holding rank 0 before, killed since
        assert rx.take(signer.pack(wire.BEACON, json.dumps(beat).encode()))
        beat = {"rank": 1, "pub": "p102", "seq": 1, "generation": 0, "pid": 102, "host": "n2",
                "endpoints": [["127.0.0.1", port]]}  # the survivor, as rank 1
        assert rx.take(signer.pack(wire.BEACON, json.dumps(beat).encode()))
        joined = {0: [["127.0.0.1", _closed_port()]]}  # the regroup: rank 1's engine is rank 0, its ports old
        h.watch([RankInfo(0, 0, 0, "n2", 102, "cpu", 1)], local=False)
        assert until(lambda: h._answer(0) == ANSWERS and h._silent_for(0) > health.REMOTE_SILENCE_S,
                     timeout=20), f"the survivor's own port never answered a knock: {h.dead}"
        assert h.dead == {}, "the survivor was judged by the number's previous holder"
        child.kill()
        child.wait()
        assert until(lambda: h.dead, timeout=20)
        assert h.dead == {0: "exited (its host answered, its process was gone)"}
    finally:
        h.close()
        rx.close()
