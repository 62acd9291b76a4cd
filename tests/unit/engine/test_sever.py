"""Which connections an abort cuts: gloo pairs by (ip, port), never a port alone, never the control plane."""

import socket
import subprocess
import sys
import textwrap

import pytest

from workbench.engine.guard import _connections, to_sever

pytestmark = pytest.mark.timeout(10)

HERE, PEER, OTHER = "10.0.0.2", "10.0.0.3", "10.0.0.9"
CONTROLLER = ("10.0.0.1", 5000)  # the kernel's controller: ipyparallel and the beacon connect here


def test_only_gloo_pairs_are_cut():
    own = [(HERE, 41000)]  # this rank's gloo listeners (a subgroup's included: read at abort time)
    peers = [(PEER, 5000), (PEER, 42000)]  # the other ranks' listeners, from the join and the beacons
    conns = [
        (3, "ESTABLISHED", (HERE, 41000), (PEER, 50123)),  # a peer connected to our listener: cut
        (4, "ESTABLISHED", (HERE, 50200), (PEER, 42000)),  # we connected to a peer's listener: cut
        (5, "ESTABLISHED", (HERE, 50300), CONTROLLER),  # the control plane, same port number as a peer: kept
        (6, "ESTABLISHED", (HERE, 50400), (OTHER, 5000)),  # another host's port 5000 (a user's server): kept
        (7, "LISTEN", (HERE, 41000), None),  # the listener itself: kept
        (8, "ESTABLISHED", (f"::ffff:{HERE}", 41000), (f"::ffff:{PEER}", 50999)),  # IPv4-mapped: cut
    ]
    assert to_sever(conns, own, peers) == [3, 4, 8]


def test_a_listener_on_every_interface_matches_its_port_on_this_rank_only():
    conns = [(3, "ESTABLISHED", ("127.0.0.1", 41000), ("127.0.0.1", 50000)),  # accepted by our listener
             (4, "ESTABLISHED", (HERE, 50001), (OTHER, 41000))]  # port 41000 of another host
    assert to_sever(conns, [("0.0.0.0", 41000)], []) == [3]


def test_this_process_sockets_are_listed_from_its_own_descriptors():
    """What an abort reads: a listener and both ends of a connection, as psutil would list them."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    try:
        found = {fd: (status, laddr, raddr) for fd, status, laddr, raddr in _connections()}
        port = listener.getsockname()[1]
        assert found[listener.fileno()] == ("LISTEN", ("127.0.0.1", port), None)
        assert found[client.fileno()] == ("ESTABLISHED", client.getsockname(), ("127.0.0.1", port))
        assert found[accepted.fileno()] == ("ESTABLISHED", ("127.0.0.1", port), client.getsockname())
        cut = to_sever(_connections(), [("127.0.0.1", port)], [])
        assert cut == [accepted.fileno()]  # accepted by our "gloo" listener; the client end is not
    finally:
        for sock in (accepted, client, listener):
            sock.close()


@pytest.mark.timeout(120)  # a fresh interpreter imports torch (guard's import), slow on a loaded machine
def test_listing_this_process_sockets_reads_no_machine_wide_table():
    """With N ranks on a host /proc/net/tcp has ~N² gloo pairs; each rank's abort must not parse it."""
    code = textwrap.dedent("""
        import socket, sys
        from workbench.engine.guard import _connections
        opened = []
        sys.addaudithook(lambda event, args: event == "open" and opened.append(str(args[0])))
        server = socket.create_server(("127.0.0.1", 0))
        assert len(_connections()) >= 1
        print([path for path in opened if path.startswith("/proc/net")])
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
