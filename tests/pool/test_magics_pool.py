"""The walking skeleton on a real 2-engine pool, driven through the magics in IPython."""

from __future__ import annotations

import contextlib
import os
import re
import time

import psutil
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from tests.conftest import alive, pool_through_magics, run_cell
from workbench import RankError

pytestmark = pytest.mark.timeout(90)


run = run_cell


@pytest.fixture(scope="module")
def pool(ipshell):
    yield from pool_through_magics(ipshell)


def test_start_forms_the_pool(pool):
    rows = pool.status()
    assert [r["rank"] for r in rows] == [0, 1]
    assert {r["device"] for r in rows} == {"cpu"} and {r["state"] for r in rows} == {"idle"}


def test_status_table(ipshell, pool):
    result, shown = run(ipshell, "%dist status")
    assert result.success
    lines = shown.splitlines()
    assert lines[1].split() == ["rank", "host", "pid", "device", "state"]
    assert [ln.split()[0] for ln in lines[2:4]] == ["0", "1"]
    assert str(pool.ranks[1].pid) in lines[3]


def test_all_reduce_sum_on_every_rank(ipshell, pool):
    cell = ("%%distributed\nimport torch\nt = torch.ones(3) * (rank + 1)\ndist.all_reduce(t)\n"
            "print(rank, t.tolist())")
    result, shown = run(ipshell, cell)
    assert result.success, shown
    assert "[rank 0] 0 [3.0, 3.0, 3.0]" in shown
    assert "[rank 1] 1 [3.0, 3.0, 3.0]" in shown
    assert pool.pull("t")[0].tolist() == [3.0, 3.0, 3.0]


def test_identical_output_shown_once_and_last_value_per_rank(ipshell, pool):
    result, shown = run(ipshell, "%%distributed\nprint('same everywhere')\nrank * 10")
    assert result.success, shown
    assert shown.count("same everywhere") == 1 and "[ranks 0-1] same everywhere" in shown
    assert "[rank 0] 0" in shown and "[rank 1] 10" in shown


def test_names_ready_in_every_cell(ipshell, pool):
    cell = "%%distributed\nprint(rank, local_rank, world_size, str(device), dist.is_initialized())"
    result, shown = run(ipshell, cell)
    assert result.success, shown
    assert "[rank 1] 1 1 2 cpu True" in shown


def test_ranks_option_targets_only_named_ranks(ipshell, pool):
    run(ipshell, "%%distributed\nmarker = 'unset'")
    result, shown = run(ipshell, "%%distributed --ranks 1\nmarker = f'set on {rank}'\nprint(marker)")
    assert result.success, shown
    assert "[rank 1] set on 1" in shown and "[rank 0]" not in shown
    assert pool.pull("marker") == ["unset", "set on 1"]


def test_state_persists_between_cells(ipshell, pool):
    run(ipshell, "%%distributed\ncounter = rank")
    run(ipshell, "%%distributed\ncounter += 100")
    assert pool.pull("counter") == [100, 101]


def test_exception_on_rank_1_names_rank_1(ipshell, pool):
    cell = "%%distributed\nprint('before', rank)\nif rank == 1:\n    raise ValueError('boom on one')"
    result, shown = run(ipshell, cell)
    err = result.error_in_exec
    assert isinstance(err, RankError) and err.rank == 1
    assert str(err).startswith(f"rank 1 ({pool.ranks[1].host}, cpu) raised ValueError: boom on one")
    assert "[rank 0] before 0" in shown  # the other rank's output is kept
    text = "\n".join(err._render_traceback_())
    assert text.index("rank 1") < text.index("ValueError")
    assert "2 ranks · 1 ok · 1 error (rank 1: ValueError: boom on one)" in text  # rank 0 had finished
    assert run(ipshell, "%%distributed\nrank")[0].success  # the pool goes on


def test_push_pull_round_trip(ipshell, pool):
    ipshell.user_ns["payload"] = {"a": [1, 2, 3]}
    assert run(ipshell, "%dist push payload")[0].success
    run(ipshell, "%%distributed\npayload['a'].append(rank)")
    result, _ = run(ipshell, "%dist pull payload --rank 1")
    assert result.success and result.result == {"a": [1, 2, 3, 1]}
    assert ipshell.user_ns["payload"] == {"a": [1, 2, 3, 1]}
    result, _ = run(ipshell, "%dist pull payload")
    assert result.result == [{"a": [1, 2, 3, 0]}, {"a": [1, 2, 3, 1]}]


def test_auto_mode_and_local(ipshell, pool):
    ipshell.user_ns["where"] = "notebook"
    assert run(ipshell, "%dist auto on")[0].success
    try:
        result, shown = run(ipshell, "where = f'rank {rank}'\nprint(where)")
        assert result.success and "[rank 1] rank 1" in shown
        result, shown = run(ipshell, "%%local\nprint('here:', where)")
        assert "here: notebook" in shown
    finally:
        assert run(ipshell, "%dist auto off")[0].success
    assert pool.pull("where") == ["rank 0", "rank 1"]
    assert ipshell.user_ns["where"] == "notebook"


@pytest.mark.parametrize("cell, message", [
    ("%%distributed --ranks 0,7\nx = 1", "out of range"),
    ("%%distributed --ranks x\nx = 1", "bad rank list"),
    ("%dist start -n 2", "already running"),
    ("%dist pull nothing_here --rank 9", "out of range"),
    ("%dist push not_defined_anywhere", "not defined in the notebook"),
])
def test_usage_errors_touch_nothing(ipshell, pool, cell, message):
    pids = pool.pids()
    result, _ = run(ipshell, cell)
    assert isinstance(result.error_in_exec, UsageError) and message in str(result.error_in_exec)
    assert pool.pids() == pids and alive(pids) == pids


def test_every_listening_socket_is_on_loopback(pool):
    listening = []
    for pid in pool.pids():
        for conn in psutil.Process(pid).net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                listening.append((pid, conn.laddr.ip, conn.laddr.port))
    assert listening, "the controller at least must listen"
    assert {ip for _, ip, _ in listening} == {"127.0.0.1"}, listening
    # the store is rank 0's and listens too
    assert pool.ranks[0].pid in {pid for pid, _, _ in listening}


@pytest.mark.parametrize(("cell", "says"), [
    ("gen = (i for i in range(3))\n%dist push gen",
     "cannot send gen to the ranks: cannot pickle 'generator'"),
    ("%dist pull nosuchname",
     "'nosuchname' is not defined on rank 0-1: set it in a %%distributed cell first."),
])
def test_push_and_pull_mistakes_are_one_sentence(ipshell, pool, cell, says):
    result, shown = run(ipshell, cell)
    err = result.error_in_exec
    assert isinstance(err, UsageError) and says in str(err), shown
    assert "\n" not in str(err) and "Traceback" not in shown  # one sentence, no internals


class _Stamped:
    """A stdout that notes when each write came (the notebook's view of a line appearing)."""

    def __init__(self):
        self.writes: list[tuple[float, str]] = []

    def write(self, text):
        self.writes.append((time.time(), text))

    def flush(self):
        pass


def test_a_rank_0_progress_line_shows_while_the_cell_still_runs(ipshell, pool):
    out = _Stamped()
    cell = ("%%distributed\nimport time\nif rank == 0:\n    print('progress', time.time())\n"
            "time.sleep(3)")
    with contextlib.redirect_stdout(out):
        t_end = (ipshell.run_cell(cell), time.time())[1]
    line = [(t, text) for t, text in out.writes if "progress" in text]
    assert line, out.writes
    shown_at, text = line[0]
    printed_at = float(text.split()[-1])
    # the line was on screen while the ranks still slept, not one line late at the end of the cell
    assert t_end - shown_at > 2.0, (t_end - shown_at, out.writes)
    print(f"rank 0's line shown {1000 * (shown_at - printed_at):.0f} ms after its print")


def test_a_display_on_one_rank_is_forwarded_while_the_cell_still_runs(pool):
    """A tick forwards the displays of the ranks that sent one (not a look at every rank's outputs each
    tick): rank 1's display comes while the ranks still sleep, once, and rank 0's display at the end."""
    got = []
    code = ("import time\nfrom IPython.display import display\nif rank == 1:\n"
            "    time.sleep(0.5)\n    display({'text/plain': 'early'}, raw=True)\ntime.sleep(2.5)\n"
            "if rank == 0:\n    display({'text/plain': 'late'}, raw=True)")
    t0 = time.monotonic()
    pool.run(code, on_output=lambda rank, kind, payload: got.append((time.monotonic() - t0, rank, kind,
                                                                     payload)))
    end = time.monotonic() - t0
    displays = [(t, rank, p["data"]["text/plain"]) for t, rank, kind, p in got if kind == "display"]
    assert [(rank, text) for _, rank, text in displays] == [(1, "early"), (0, "late")], got
    assert end - displays[0][0] > 1.5, f"rank 1's display came {end - displays[0][0]:.2f} s before the end"


def test_a_failed_cell_gets_a_tab_per_rank_with_the_failing_rank_selected(ipshell, pool):
    cell = "%%distributed\nprint('hello from', rank)\nif rank == 1:\n    raise ValueError('bad batch')"
    with capture_output() as cap:
        result = ipshell.run_cell(cell)
    assert not result.success
    views = [o.data for o in cap.outputs if "text/html" in o.data and "wb-RankTabs" in o.data["text/html"]]
    assert len(views) == 1, [o.data for o in cap.outputs]
    page, plain = views[0]["text/html"], views[0]["text/plain"]
    assert plain == "per rank (world size 2): rank 0 ok · rank 1 error"
    # rank 1's tab is the one selected, and marked; its pane holds its output and its traceback
    assert re.search(r'checked><label class="wb-fail" for="[^"]+" title="error">rank 1 ✗</label>', page), page
    panes = re.findall(r"<div>(.*?)</div>", page, re.S)
    assert "hello from 0" in panes[0] and "ValueError" not in panes[0]
    assert "hello from 1" in panes[1] and "ValueError: bad batch" in panes[1]


def test_a_rank_error_shows_its_traceback_once_labelled_with_the_notebook_cell(ipshell, pool):
    for _ in range(7):  # the notebook's count moves on apart from the engines' own
        ipshell.run_cell("1", store_history=True)
    number = ipshell.execution_count  # the cell's number in the notebook: In [number]
    cell = "%%distributed\nx = 1\nif rank == 1:\n    raise ValueError('bad shard')"
    with capture_output() as cap:
        result = ipshell.run_cell(cell, store_history=True)
    shown = (cap.stdout, cap.stderr, [o.data for o in cap.outputs])
    assert isinstance(result.error_in_exec, RankError), shown
    text = re.sub(r"\x1b\[[0-9;]*m", "", cap.stdout + cap.stderr)  # the error block as the cell showed it
    assert "raised ValueError: bad shard" in text, text
    assert set(re.findall(r"Cell In\[(\d+)\]", text)) == {str(number)}, (number, text)  # not the engine count
    # the traceback is in the error block only; the rank's tab says what it raised and points there
    page = next(o.data["text/html"] for o in cap.outputs if "wb-RankTabs" in o.data.get("text/html", ""))
    pane = re.findall(r"<div>(.*?)</div>", page, re.S)[1]
    assert "raised ValueError: bad shard (its traceback is in the error below)" in pane, pane
    assert "Cell In" not in pane and "Traceback" not in pane, pane


def test_a_short_clean_cell_gets_no_per_rank_view(ipshell, pool):
    with capture_output() as cap:
        assert ipshell.run_cell("%%distributed\nprint(rank)").success
    assert not [o for o in cap.outputs if "wb-RankTabs" in o.data.get("text/html", "")]


def test_engines_are_forks_of_the_pools_zygote_without_helpers(pool):
    """One zygote per local pool forks the engines; no engine has a helper process (ipyparallel's nanny)."""
    zygote = psutil.Process(pool.pool.zygote.pid)
    assert zygote.name() == "wb-zygote" and zygote.pid in pool.pids()
    for r in pool.ranks:
        engine = psutil.Process(r.pid)
        assert engine.ppid() == zygote.pid and engine.name() == "wb-engine"
        assert engine.children() == [], f"rank {r.rank} has helper processes"
        assert os.getsid(r.pid) == r.pid  # a session of its own, as a launched engine has
    assert psutil.Process(pool.pool.cluster.controller.pid).ppid() == zygote.pid


def test_forked_ranks_do_not_share_random_state(ipshell, pool):
    result, shown = run(ipshell, "%%distributed\nimport numpy, random\n"
                                 "draws = (numpy.random.rand(), random.random())")
    assert result.success, shown
    numpy_draws, python_draws = zip(*pool.pull("draws"), strict=True)
    assert len(set(numpy_draws)) == 2 and len(set(python_draws)) == 2
