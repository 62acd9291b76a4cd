"""Pure parts of the metrics: records, bounded history, sequence checks, rank states, samplers, helpers."""

from __future__ import annotations

import math

import pytest

from tests.unit.fake_nvml import FakeNVML
from workbench.metrics import records
from workbench.metrics.collector import Collector
from workbench.metrics.history import Series
from workbench.metrics.sampler import NvmlSampler, PsutilSampler, make_sampler
from workbench.widgets.panels import load_colour

pytestmark = pytest.mark.timeout(30)


def test_series_downsamples_in_bounded_memory_and_keeps_every_point_counted():
    s = Series(records.STEP_FIELDS, capacity=64)
    for i in range(10_000):
        s.append(i, records.step_row(t=float(i), step=i, loss=float(i)))
    assert len(s) <= 64
    assert s.received == 10_000 and sum(s.column("n")) == 10_000
    steps = s.column("step")
    assert steps == sorted(steps) and steps[-1] == 9_999  # in order, newest kept exactly
    assert s.column("loss")[-1] == 9_999.0
    # a merged point's loss is the mean of the steps it stands for
    n, loss, step = s.column("n")[0], s.column("loss")[0], s.column("step")[0]
    assert loss == pytest.approx((step - n + 1 + step) / 2)


def test_wire_roundtrip_and_bad_messages():
    row = records.step_row(t=1.0, step=2, loss=float("nan"), samples=10, step_time=0.5)
    msg = records.decode(records.encode(pub="p", rank=1, host="h", steps=[[0, *row]]))
    values = dict(zip(records.STEP_FIELDS, msg["step"][0][1:], strict=True))
    assert values["samples_per_s"] == 20.0 and math.isnan(values["loss"])
    for bad in (b"not json", b"[1]", b'{"pub": "p", "rank": 0, "host": "h", "step": [[1, 2]]}'):
        with pytest.raises(ValueError):
            records.decode(bad)


def _msg(rank, seqs, pub="p", run=1, events=()):
    steps = [[q, *records.step_row(t=100.0 + q, run=run, step=q + 1, loss=1.0)] for q in seqs]
    return records.encode(pub=pub, rank=rank, host="h", steps=steps, events=list(events))


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.close()


def test_collector_drops_duplicates_and_counts_gaps(collector):
    c = collector
    c.ingest(_msg(0, [0, 1, 2]))
    c.ingest(_msg(0, [1, 2, 3]))  # 1 and 2 again
    c.ingest(_msg(0, [6, 7]))  # 4 and 5 never came
    c.ingest(b"garbage")  # never raises
    assert c.stats["duplicates"] == 2 and c.stats["missing"] == 2 and c.stats["bad_messages"] == 1
    assert c.gaps == [(0, "step", 4, 6)]
    assert [r["seq"] for r in c.history().records()] == [0, 1, 2, 3, 6, 7]


def test_a_collector_that_attached_late_counts_no_gap_before_its_first_record(collector):
    """The dashboard docked from the sidebar subscribes mid-run: a first message without step records
    (device samples only) must not make the first step record it sees look like a gap."""
    collector.ingest(_msg(0, []))
    collector.ingest(_msg(0, [46, 47], events=[[5, 100.0, "run_start", {"run": 1}]]))
    collector.ingest(_msg(0, [48]))
    assert collector.stats["missing"] == 0 and collector.gaps == []
    assert collector.stats["step"] == 3


def test_new_publisher_restarts_numbering(collector):
    collector.ingest(_msg(0, [0, 1]))
    collector.ingest(_msg(0, [0, 1], pub="q"))  # the engine restarted: a fresh source
    assert collector.stats["duplicates"] == 0 and collector.stats["step"] == 4


def test_ranks_join_one_run_and_states_follow_records():
    c = Collector(stall_after=3.0, lost_after=5.0)
    try:
        start = [0, 100.0, "run_start", {"run": 1}]
        c.ingest(_msg(0, [], events=[start]), now=0.0)
        c.ingest(_msg(1, [0], events=[start]), now=0.0)
        assert [(r.id, sorted(r.ranks)) for r in c.runs] == [(1, [0, 1])]
        assert c.status(now=1.0) == {0: "running", 1: "running"}
        assert c.status(now=4.0) == {0: "stalled", 1: "stalled"}  # no step for 4 s > 3 s
        device = [[0, *records.device_row(t=104.5)]]
        c.ingest(records.encode(pub="p", rank=1, host="h", devices=device), now=4.5)
        assert c.status(now=6.0) == {0: "lost", 1: "stalled"}  # rank 0 went silent altogether
        c.mark_failed(1)
        assert c.status(now=6.0)[1] == "failed" and c.runs[0].failed == {1}
        c.ingest(_msg(0, [], events=[[1, 101.0, "run_end", {"run": 1}]]), now=20.0)
        assert c.runs[0].done and c.status(now=20.5)[0] == "idle"
    finally:
        c.close()


def test_nvml_sampler_with_fake_nvml():
    nv = FakeNVML({"GPU-a": [], "GPU-b": []})
    s = NvmlSampler(nv, index=1, uuid="GPU-123")  # an unknown UUID: the index-th visible device
    assert s.handle == "GPU-b"
    assert s.info() == {"kind": "gpu", "name": "Fake H200", "mem_total": 140 * 2**30,
                        "unsupported": ["clock_mhz"]}
    assert s.read() == {"util": 87, "mem_used": 30 * 2**30, "mem_total": 140 * 2**30, "power_w": 412.0,
                        "temp_c": 61, "clock_mhz": None}
    s.close()
    assert nv.calls == ["init", "shutdown"]
    assert isinstance(make_sampler("cuda:0", nvml=nv), NvmlSampler)


def test_no_nvml_falls_back_to_psutil():
    class Broken(FakeNVML):
        def nvmlInit(self):
            raise self.NVMLError("NVML Shared Library Not Found")

    assert isinstance(make_sampler("cuda:0", nvml=Broken({})), PsutilSampler)
    assert isinstance(make_sampler("cpu"), PsutilSampler)


def test_helpers():
    assert load_colour(50) == "hsl(60, 65%, 85%)"


def test_runs_side_by_side_on_sub_meshes_are_two_runs():
    """Trainings that start together on two sub-meshes of a split pool are two runs, each its own dashboard's
    (before, ranks starting within the join window made one run of all of them)."""
    c = Collector()
    try:
        c.set_meshes({"a": [0, 1], "b": [2, 3]})
        start = [0, 100.0, "run_start", {"run": 1}]
        for rank in (0, 2, 1, 3):  # interleaved, as two cells' ranks start
            c.ingest(_msg(rank, [], events=[start]), now=0.0)
        assert [(r.id, sorted(r.ranks)) for r in c.runs] == [(1, [0, 1]), (2, [2, 3])]
        assert c.latest_run([0, 1]).id == 1 and c.latest_run([2, 3]).id == 2 and c.latest_run().id == 2
        c.set_meshes({})  # joined: one run of all again
        for rank in range(4):
            c.ingest(_msg(rank, [], run=2, events=[[1, 200.0, "run_start", {"run": 2}]]), now=1.0)
        assert sorted(c.runs[-1].ranks) == [0, 1, 2, 3]
    finally:
        c.close()
