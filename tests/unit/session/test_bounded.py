"""The kernel's bounded copy of a cell's output (issue 25): head, tail, count and the whole log."""

from __future__ import annotations

import pytest

from workbench.cell_output import CellOutput

pytestmark = pytest.mark.timeout(30)


def test_interleaved_partial_lines_of_two_ranks_stay_whole_in_the_log(tmp_path):
    out = CellOutput(log_dir=tmp_path, pool_id="p", head=2, tail=2)
    for i in range(20):  # each line in two pieces, the ranks taking turns mid-line
        for rank in (0, 1):
            out.feed(rank, "stdout", f"line {i} of")
        for rank in (0, 1):
            out.feed(rank, "stdout", f" rank {rank}\n")
    out.feed(1, "stderr", "warn\nno newline")
    out.close()
    logged = out.log_path.read_text().splitlines()
    for rank in (0, 1):
        assert [ln for ln in logged if ln.startswith(f"[rank {rank}] ")] == \
            [f"[rank {rank}] line {i} of rank {rank}" for i in range(20)]
    assert [ln for ln in logged if "stderr" in ln] == ["[rank 1 stderr] warn", "[rank 1 stderr] no newline"]


def test_head_shown_live_then_count_and_tail_at_the_end(tmp_path):
    out = CellOutput(log_dir=tmp_path, head=3, tail=2)
    out.feed(0, "stdout", "".join(f"{i}\n" for i in range(10)))
    assert out.drain() == [(0, "stdout", "0\n1\n2\n")]
    out.feed(0, "stdout", "10\n")
    assert out.drain() == []  # past the head nothing more is shown live
    [(rank, kind, end)] = out.close()
    assert end.splitlines()[1:] == ["9", "10"]
    assert end.startswith(f"… 6 lines not shown; the cell's whole output is in {out.log_path}")
    assert out.text(0, "stdout").splitlines() == ["0", "1", "2", end.splitlines()[0], "9", "10"]


def test_output_within_head_and_tail_opens_no_log(tmp_path):
    out = CellOutput(log_dir=tmp_path, head=3, tail=2)
    out.feed(0, "stdout", "a\nb\nc\nd\ne\n")
    assert out.drain() == [(0, "stdout", "a\nb\nc\n")] and out.close() == [(0, "stdout", "d\ne\n")]
    assert out.text(0, "stdout") == "a\nb\nc\nd\ne\n"
    assert not out.bounded and list(tmp_path.iterdir()) == []


def test_a_few_enormous_lines_are_bounded_by_characters_too(tmp_path):
    out = CellOutput(log_dir=tmp_path, head=100, tail=1, head_chars=1000)
    for _ in range(5):
        out.feed(0, "stdout", "x" * 100_000 + "\n")
    out.close()
    kept = out.text(0, "stdout")
    assert len(kept) < 20_000 and "the cell's whole output is in" in kept  # the log has it all
    assert out.log_path.stat().st_size > 500_000
