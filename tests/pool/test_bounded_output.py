"""A cell that prints without bound (issue 25): each rank's first and last lines with a count, the whole of
it in a log the cell names, and the kernel keeps no more than that (a real 2-rank pool, the magics).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.pool import test_magics_pool
from workbench import cell_output as bounded

pytestmark = pytest.mark.timeout(300)

pool = test_magics_pool.pool  # a 2-rank pool of this module's own, started and stopped through the magics
run = test_magics_pool.run
LINES = 30_000  # per rank: 150 times the lines a rank shows


def test_unbounded_print_shows_head_and_tail_and_logs_everything(ipshell, pool, tmp_path):
    cwd_before = set(os.listdir())
    cell = f"%%distributed\nfor i in range({LINES}):\n    print(f'line {{i}} of rank {{rank}}')"
    result, shown = run(ipshell, cell)
    assert result.success, shown[-2000:]
    lines = shown.splitlines()
    per_rank = bounded.HEAD_LINES + bounded.TAIL_LINES + 1
    assert len(lines) <= 2 * per_rank + 5, f"{len(lines)} lines shown for {2 * LINES} printed"
    # the head as it came, the count naming the log, the tail
    assert "[rank 0] line 0 of rank 0" in lines and "[rank 1] line 0 of rank 1" in lines
    assert f"[rank 1] line {LINES - 1} of rank 1" in lines
    notices = [ln for ln in lines if "not shown; the cell's whole output is in" in ln]
    assert notices, shown[-3000:]
    hidden = LINES - bounded.HEAD_LINES - bounded.TAIL_LINES
    assert f"… {hidden:,} lines not shown" in notices[0]
    log = Path(re.search(r"whole output is in (\S+)", notices[0]).group(1))
    try:
        written = log.read_text().splitlines()
        for rank in (0, 1):
            mine = [ln for ln in written if ln.startswith(f"[rank {rank}] ")]
            assert mine == [f"[rank {rank}] line {i} of rank {rank}" for i in range(LINES)]
        assert oct(log.stat().st_mode & 0o777) == "0o600"
    finally:
        log.unlink(missing_ok=True)
    assert set(os.listdir()) == cwd_before, "the cell left files in the notebook's folder"


def test_bounded_text_of_the_rank_results(pool):
    result = pool.run(f"for i in range({LINES}):\n    print(i)")
    for r in result.ranks:
        kept = r.stdout.splitlines()
        assert kept[0] == "0" and kept[bounded.HEAD_LINES - 1] == str(bounded.HEAD_LINES - 1)
        assert kept[-1] == str(LINES - 1)
        assert len(kept) == bounded.HEAD_LINES + 1 + bounded.TAIL_LINES
        log = Path(re.search(r"whole output is in (\S+)", r.stdout).group(1))
    log.unlink(missing_ok=True)


def test_output_within_head_and_tail_is_kept_whole_and_writes_no_log(ipshell, pool):
    from workbench.pool.records import state as pool_state

    before = set(pool_state.state_dir().glob("output-*.log"))
    result, shown = run(ipshell, "%%distributed\nfor i in range(250):\n    print(i, rank)")
    assert result.success, shown
    assert "not shown" not in shown and "[rank 1] 249 1" in shown
    assert set(pool_state.state_dir().glob("output-*.log")) == before
