"""Issue 25 on real engines: nothing repeated by every engine after the fork, and an idle pool that is quiet.

A real 2-rank pool (forked from its zygote). What is checked is what the engines did (threads started,
beacons sent, wake-ups of the metrics thread), never how fast: less work under load only means fewer.
"""

from __future__ import annotations

import time

import pytest

from tests.conftest import running_pool, until

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def pool():
    with running_pool(n=2, timeout=120) as s:
        yield s


def _engine_state():
    import threading

    from workbench.engine import agent
    from workbench.metrics import publisher

    pub = publisher.current()
    return {"agent_wakeups": agent._agent.wakeups if agent._agent else None,
            "beacons": agent._agent.seq if agent._agent else None,  # beacons this rank's agent sent
            "warm_thread": getattr(agent, "_warm_thread", None) is not None, "warmed": agent._warmed.is_set(),
            "threads": sorted(t.name for t in threading.enumerate()),
            "wakeups": getattr(pub, "wakeups", None)}


def _idle_counts(pool, counter: str, seconds: float) -> list[int]:
    """How much each rank's ``counter`` (of :func:`_engine_state`) grew over ``seconds`` idle."""
    first = pool.apply(_engine_state)
    time.sleep(seconds)
    later = pool.apply(_engine_state)
    return [b[counter] - a[counter] for a, b in zip(first, later, strict=True)]


def test_forked_engines_start_no_warming_thread(pool):
    """The traceback-warming thread imported the trainer and parsed torch's sources in every engine at
    once after a start (the first cells were 5-7x slower); a forked engine shares the zygote's instead."""
    for rank, state in enumerate(pool.apply(_engine_state)):
        assert state["warmed"], f"rank {rank}: the agent would still warm in the background"
        assert not state["warm_thread"], f"rank {rank} started the warming thread after the fork"
        assert "workbench-warm" not in state["threads"], state["threads"]


def test_idle_metrics_thread_sleeps_until_its_next_sample(pool):
    """Between cells the metrics thread wakes about once per sample (1 s), not every flush interval
    (0.1 s)."""
    for rank, woke in enumerate(_idle_counts(pool, "wakeups", 3.0)):
        # 3 s idle: a sample a second, each followed by one short look for more (the apply calls'
        # own rows are none): at most ~8 with slack; the old loop woke ~30 times
        assert 1 <= woke <= 10, f"rank {rank}: the metrics thread woke {woke} times in 3 s idle"


def test_idle_beacons_slow_down_and_busy_ones_do_not(pool):
    """An idle rank beacons about once a second (its state has not changed), still well inside the 3 s of
    silence after which a remote rank counts as dead; a rank running a cell beacons every 0.25 s. Counted
    where they are sent, each rank's agent (with hubs, WORKBENCH_FANOUT=1, the kernel gets a host's table of
    what changed, and the ranks heard, not every beacon); the kernel's side: no rank silent, none busy."""
    from workbench.session.health import REMOTE_SILENCE_S

    beacons = pool.rooms.beacons
    assert until(lambda: all(r.rank in beacons.latest for r in pool.ranks), 10)
    for rank, sent in enumerate(_idle_counts(pool, "beacons", 3.0)):
        # 3 s idle: ~3 beats plus the apply calls' (each call makes the rank busy a moment)
        assert 1 <= sent <= 8, f"rank {rank} sent {sent} beacons in 3 s idle (4 Hz would be 12)"
    for r in pool.ranks:
        assert beacons.silent_for(r.rank) < REMOTE_SILENCE_S
        assert not beacons.latest[r.rank].get("busy")
    before = pool.apply(_engine_state)
    pool.submit("import time\ntime.sleep(4)").wait(60)
    after = pool.apply(_engine_state)
    for rank, (a, b) in enumerate(zip(before, after, strict=True)):
        # 4 s busy at 4 Hz: about 16 beats; the idle rate would give 4 or 5
        sent = b["beacons"] - a["beacons"]
        assert sent >= 8, f"rank {rank}: {sent} beacons in 4 s busy"


def test_idle_agent_sleeps_and_a_cell_wakes_it_at_once(pool):
    """Between cells the agent wakes about once a second, not four times (8 idle ranks spent 2.3% of a core
    in their agents alone); a cell that begins wakes it, so that even a cell shorter than the idle period
    is seen busy by the kernel (its first beat comes within a fraction of a period, not up to 1 s later)."""
    for rank, woke in enumerate(_idle_counts(pool, "agent_wakeups", 3.0)):
        # 3 s idle: ~3 beats plus the two apply calls' wake-ups (and their beats); 4 Hz would be 12+
        assert 1 <= woke <= 9, f"rank {rank}: the agent woke {woke} times in 3 s idle"
    beacons = pool.rooms.beacons
    for _ in range(3):  # each 0.6 s: with the idle period alone, a busy beat would be missed 2 times in 5
        before = {r.rank: beacons.latest[r.rank]["seq"] for r in pool.ranks}
        busy: dict[int, bool] = {r.rank: False for r in pool.ranks}
        time.sleep(0.3)  # idle since the last cell: the agents sleep their long period
        handle = pool.submit("import time\ntime.sleep(0.6)")
        try:
            while not handle.done():
                for r in pool.ranks:
                    beat = beacons.latest.get(r.rank) or {}
                    busy[r.rank] |= bool(beat.get("busy")) and beat["seq"] > before[r.rank]
                time.sleep(0.01)
        finally:
            handle.wait(60)
        assert all(busy.values()), f"a 0.6 s cell was not seen busy on every rank: {busy}"
