"""What :func:`workbench.pool.watch.queues.answered_here` relies on, on a real 2-engine pool (issue 40, point
9): after a call on every rank, ipyparallel's client has dropped the calls' results from ``client.results``
(which is why the start's table, which asked it, said ranks busy while the hub had not yet filed their
replies), and keeps them in ``history``, no longer ``outstanding``; the table after the start says idle."""

from __future__ import annotations

import pytest

from tests.conftest import running_pool
from workbench import remote
from workbench.pool.watch.queues import answered_here

pytestmark = pytest.mark.timeout(180)


def test_the_clients_books_say_which_requests_were_answered():
    with running_pool(n=2, timeout=60) as s:
        client = s.client
        before = len(client.history)
        s.rooms.door.call(remote.connect_metrics, s.ranks, s.pool.channel)  # the start's last call, again
        sent = set(client.history[before:])
        assert len(sent) >= 1  # one request a rank, or one broadcast for all (WORKBENCH_FANOUT=1)
        assert not sent & set(client.results), "ipyparallel kept the results: the old filter would work"
        assert not sent & client.outstanding
        assert answered_here(client, sent | {"another-clients-request"}) == sent
        assert [row["state"] for row in s.status()] == ["idle", "idle"]
