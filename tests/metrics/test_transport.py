"""Publisher -> relay -> collector over real ZMQ sockets, in one process (threads): no loss, no blocking."""

from __future__ import annotations

import pytest

from workbench.metrics.collector import Collector
from workbench.metrics.publisher import Publisher
from workbench.metrics.sampler import PsutilSampler

pytestmark = pytest.mark.timeout(60)


def test_steps_taken_while_nobody_reads_all_arrive_once_in_order(channel):
    """No session subscribes yet: steps never block, the relay holds them, all arrive once one does."""
    pubs = [Publisher(channel, rank=r, host="h", flush_interval=0.001, sample_interval=60) for r in range(2)]
    collector = None
    try:
        for i in range(5000):
            for p in pubs:
                p.step(step=i + 1, loss=1.0 / (i + 1), samples=8, step_time=0.001)
        assert all(p.dropped == 0 for p in pubs)
        for p in pubs:
            assert p.flush(10)  # handed to the relay, which holds them: nobody subscribed
        assert channel["relay"].forwarded == 0
        collector = Collector(channel)
        for p in pubs:
            p.on_run_end(None)
        assert collector.wait_for(lambda c: c.count("step") >= 10_000, 30)
        steps = collector.history().dataframe()
        for rank in (0, 1):
            mine = steps[steps["rank"] == rank]
            assert mine["step"].tolist() == list(range(1, 5001))
            assert mine["seq"].tolist() == list(range(5000))
        assert collector.stats["duplicates"] == 0 and collector.stats["missing"] == 0
        assert [(r.id, sorted(r.ranks), sorted(r.ended)) for r in collector.runs] == [(1, [0, 1], [0, 1])]
    finally:
        for p in pubs:
            p.close()
        if collector is not None:
            collector.close()


def test_device_samples_through_psutil_for_real(channel):
    collector = Collector(channel)
    pub = Publisher(channel, rank=0, host="h", sampler=PsutilSampler(threads=1), sample_interval=0.05)
    try:
        assert collector.wait_for(lambda c: c.count("device") >= 3, 20)
        samples = collector.history().records("device")
        assert collector.ranks[0].info["kind"] == "cpu"
        assert all(0 <= s["util"] <= 100 and s["mem_used"] > 0 and s["mem_total"] >= s["mem_used"]
                   for s in samples)
        assert [s["seq"] for s in samples] == list(range(len(samples)))
    finally:
        pub.close()
        collector.close()
