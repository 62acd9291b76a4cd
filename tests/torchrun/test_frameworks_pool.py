"""The frameworks' own kind of script, unchanged, in a real 2-rank pool through the magics (issue 39): a
transformers ``Trainer`` with ``TrainingArguments``, an Accelerate loop (``prepare``/``backward``/
``save_state``), a Lightning ``Trainer`` + ``LightningModule`` (``ddp`` and ``auto``) and Fabric; each under
real torchrun once, then in one pool, three times in different orders, its printed numbers equal to
torchrun's every time. Then what made a rerun differ from a new torchrun process (an edited helper module, the
frameworks' singletons, torch's settings, the environment), Lightning's launchers that start processes of
their own, the processes a rank starts, and an error raised on every rank.

On the code before issue 39: every Lightning and Fabric case fails ("not compatible with an interactive
environment"); ``accelerate-bf16`` after ``accelerate`` fails ("AcceleratorState has already been
initialized"), ``accelerate`` after ``accelerate-bf16`` prints 2 processes where torchrun prints 2 single
processes; the edited helper prints torchrun's old step count; the state script differs in 6 lines;
``ddp_notebook`` hangs until the cell's timeout, its forked children alive; the error raised on every rank
shows a KeyboardInterrupt and a fault; the failed cell's and the timed-out cell's children stay.
"""

from __future__ import annotations

import re
import shutil
import time

import psutil
import pytest

from tests.conftest import until
from tests.torchrun.common import SCRIPTS, figures, on_both_ranks, run, torchrun
from workbench.pool.rankmap import parse_ranks

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

CASES = {
    "transformers-trainer": ("hf_trainer.py", ["--max-steps", "6"]),
    "accelerate": ("accelerate_loop.py", ["--cpu"]),
    "accelerate-bf16": ("accelerate_loop.py", ["--mixed_precision", "bf16"]),  # no --cpu: 2 single processes
    "lightning-ddp": ("lightning_ddp.py", ["--strategy", "ddp"]),
    "lightning-auto": ("lightning_ddp.py", ["--strategy", "auto"]),
    "fabric": ("fabric_loop.py", ["--strategy", "ddp"]),
}
# three runs of every case in one pool, in three orders (each case after a different one each time)
ORDERS = [
    list(CASES),
    list(reversed(CASES)),
    ["accelerate-bf16", "lightning-auto", "accelerate", "fabric", "transformers-trainer", "lightning-ddp"],
]
MERGED = re.compile(r"^\[ranks ([0-9,\- ]+)\]")  # a line the notebook merged: ranks 0-1 printed it alike
TIMES: dict[str, list] = {}  # case -> [torchrun seconds, pool seconds...], printed at the module's end


def numbers(text: str) -> list[str]:
    """The lines with figures, once per rank that printed them (the notebook shows a line both ranks printed
    once, as ``[ranks 0-1] ...``), without the Trainer's own log dicts (their runtime is a clock's)."""
    lines = []
    for line in text.splitlines():
        merged = MERGED.match(line)
        lines += [line] * (len(parse_ranks(merged.group(1), 64)) if merged else 1)
    return [line for line in figures("\n".join(lines)) if not line.startswith("{")]


def tree() -> set[int]:
    """This process's descendants that still run (the pool's controller and engines, and their children)."""
    found = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                found.add(p.pid)
        except psutil.Error:
            pass
    return found


def nothing_stray(before: set[int]) -> None:
    """No process below this one that was not there before (the engines' children are ended)."""
    assert until(lambda: tree() <= before, timeout=15), \
        f"processes left: {[(p, psutil.Process(p).cmdline()[:3]) for p in tree() - before]}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Each case's numbers under real torchrun, run once per module (``reference(name)``)."""
    cache: dict[str, list[str]] = {}

    def get(name: str) -> list[str]:
        if name not in cache:
            script, args = CASES[name]
            folder = tmp_path_factory.mktemp(f"torchrun-{name}")
            shutil.copy(SCRIPTS / "datautils.py", folder)
            t0 = time.perf_counter()
            cache[name] = numbers(torchrun(script, args, folder))
            TIMES.setdefault(name, []).insert(0, round(time.perf_counter() - t0, 1))
            assert cache[name], f"{name} printed no figures under torchrun"
        return cache[name]

    yield get
    for name, times in TIMES.items():
        print(f"\n{name}: torchrun {times[0]} s; in the pool {times[1:]} s")


def run_in_pool(ip, name: str, folder) -> str:
    script, args = CASES[name]
    t0 = time.perf_counter()
    result, shown = run(ip, f"%dist run {SCRIPTS / script} -- {' '.join(args)}")
    TIMES.setdefault(name, [None]).append(round(time.perf_counter() - t0, 1))
    assert result.success, shown
    return shown


def group_alive(ip) -> None:
    cell = ("%%distributed\nimport torch\nt = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)\n"
            "print('sum', t.item())")
    result, shown = run(ip, cell)
    assert result.success and on_both_ranks(shown, "sum 3.0"), shown


@pytest.mark.parametrize("name", list(CASES))
def test_framework_script_runs_unchanged_with_torchruns_numbers(ipshell, pool, reference, tmp_path,
                                                                 monkeypatch, name):
    expected = reference(name)
    monkeypatch.chdir(tmp_path)
    before = tree()
    shown = run_in_pool(ipshell, name, tmp_path)
    assert numbers(shown) == expected, shown
    assert "interactive environment" not in shown
    nothing_stray(before)
    group_alive(ipshell)


def test_three_runs_in_one_pool_in_different_orders(ipshell, pool, reference, tmp_path, monkeypatch):
    """A framework's state never reaches the next script: every run prints torchrun's numbers."""
    monkeypatch.chdir(tmp_path)
    before = tree()
    for order in ORDERS:
        for name in order:
            shown = run_in_pool(ipshell, name, tmp_path)
            assert numbers(shown) == reference(name), f"{name} in the order {order}:\n{shown}"
    nothing_stray(before)
    group_alive(ipshell)


def test_an_edited_helper_module_is_read_again(ipshell, pool, tmp_path, monkeypatch):
    """``datautils.py`` beside the script, edited between two runs: the second run reads it, as torchrun."""
    for folder in ("pool", "torchrun"):
        (tmp_path / folder).mkdir()
    shutil.copy(SCRIPTS / "accelerate_loop.py", tmp_path / "pool")
    shutil.copy(SCRIPTS / "datautils.py", tmp_path / "pool")
    monkeypatch.chdir(tmp_path / "pool")
    result, shown = run(ipshell, "%dist run accelerate_loop.py -- --cpu --epochs 1")
    assert result.success and "Steps: 4" in shown, shown
    helper = tmp_path / "pool" / "datautils.py"
    helper.write_text(helper.read_text().replace("SAMPLES = 32", "SAMPLES = 16"))
    # the edited copy under torchrun (an absolute path: SCRIPTS / it is itself), in a folder of its own
    expected_text = torchrun(str(tmp_path / "pool" / "accelerate_loop.py"), ["--cpu", "--epochs", "1"],
                             tmp_path / "torchrun")
    result, shown = run(ipshell, "%dist run accelerate_loop.py -- --cpu --epochs 1")
    assert result.success, shown
    assert "Steps: 2" in expected_text and "Steps: 2" in shown, shown
    assert numbers(shown) == numbers(expected_text), shown


def test_each_run_starts_from_a_new_processs_state(ipshell, pool, reference, tmp_path, monkeypatch):
    """After Lightning (``PL_GLOBAL_SEED``), Accelerate (its singletons, ``ACCELERATE_*``), a helper module
    and a cell that changed torch's settings, a script sees what it sees under torchrun."""
    (tmp_path / "torchrun").mkdir()
    expected = [line for line in torchrun("process_state.py", [], tmp_path / "torchrun").splitlines()
                if line.startswith("state ")]
    assert len(expected) == 15, expected
    monkeypatch.chdir(tmp_path)
    for name in ("lightning-ddp", "accelerate-bf16", "accelerate"):
        run_in_pool(ipshell, name, tmp_path)
    result, shown = run(ipshell, "%%distributed\nimport torch\ntorch.set_default_dtype(torch.float64)\n"
                                 "torch.manual_seed(1234)\ntorch.set_float32_matmul_precision('medium')")
    assert result.success, shown
    result, shown = run(ipshell, f"%dist run {SCRIPTS / 'process_state.py'}")
    assert result.success, shown
    got = [line.removeprefix("[rank 0] ") for line in shown.splitlines()
           if line.startswith("[rank 0] state ")]
    assert got == expected, shown
    # the script's globals are the rank's afterwards, on purpose: the next cell can look at them
    result, shown = run(ipshell, "%%distributed\nprint('kept', type(main).__name__)")
    assert result.success and on_both_ranks(shown, "kept function"), shown
    result, shown = run(ipshell, "%%distributed\nprint(torch.get_default_dtype())")
    assert result.success and on_both_ranks(shown, "torch.float32"), shown


@pytest.mark.parametrize(("script", "strategy", "owner"), [
    ("lightning_ddp.py", "ddp_notebook", "Trainer"),
    ("lightning_ddp.py", "ddp_spawn", "Trainer"),
    ("fabric_loop.py", "ddp_notebook", "Fabric"),
])
def test_lightnings_own_launchers_are_refused_at_once(ipshell, pool, tmp_path, monkeypatch, script, strategy,
                                                      owner):
    """Each rank is a torchrun process already: a launcher that would start more is refused in one sentence,
    one error for both ranks, no fault, no process left (the code before hung until the timeout)."""
    monkeypatch.chdir(tmp_path)
    before = tree()
    t0 = time.perf_counter()
    result, shown = run(ipshell, f"%dist run {SCRIPTS / script} --timeout 60 -- --strategy {strategy}")
    elapsed = time.perf_counter() - t0
    assert not result.success
    assert f"{owner}(strategy=" in shown and "use strategy='ddp' (or 'auto')" in shown, shown
    assert "ranks 0-1 raised ValueError" in shown, shown
    assert "KeyboardInterrupt" not in shown and "fault:" not in shown and "timeout" not in shown, shown
    assert elapsed < 60, f"{elapsed:.0f} s: not at once"  # a hang guard: the old code ran into the timeout
    nothing_stray(before)
    group_alive(ipshell)


def test_an_error_raised_on_every_rank_is_one_error(ipshell, pool):
    """Rank 1 raises the same error a second later, busy until then: it is not interrupted (no
    KeyboardInterrupt, nothing "stopped"), and nothing died, so no fault is recorded."""
    faults_before = len(pool.faults)
    # rank 1 moves on from line to line (as while importing or building a model) for ~1.5 s
    cell = ("%%distributed\nimport time\nif rank == 1:\n    for _ in range(4):\n        time.sleep(0.13)\n"
            "        time.sleep(0.17)\n        time.sleep(0.09)\n"
            "raise ValueError('no such model size: tiny2')")
    result, shown = run(ipshell, cell)
    assert not result.success
    assert "ranks 0-1 raised ValueError: no such model size: tiny2" in shown, shown
    assert "KeyboardInterrupt" not in shown and "stopped" not in shown and "fault:" not in shown, shown
    assert "rank 1 (" not in shown, shown  # no second line for the same error
    assert len(pool.faults) == faults_before
    group_alive(ipshell)


START = ("%%distributed\nimport multiprocessing as mp, time\n"
         "ps = [mp.get_context('fork').Process(target=time.sleep, args=(300,)) for _ in range(2)]\n"
         "for p in ps:\n    p.start()\n")


def test_processes_a_rank_started_are_listed_and_end_with_a_failed_cell(ipshell, pool):
    before = tree()
    result, shown = run(ipshell, START + "raise RuntimeError('the loader failed after starting its workers')")
    assert not result.success
    for rank in (0, 1):
        assert f"workbench: rank {rank}: ended 2 processes this cell had started" in shown, shown
    nothing_stray(before)


def test_processes_a_rank_started_are_in_status_and_stacks_and_end_at_a_timeout(ipshell, pool):
    before = tree()
    result, shown = run(ipshell, START)
    assert result.success, shown
    started = "rank {} started 2 processes that still run: pid"

    def status() -> str:
        return run(ipshell, "%dist status")[1]

    assert until(lambda: all(started.format(r) in status() for r in (0, 1)), timeout=10), status()
    result, shown = run(ipshell, "%dist stacks")
    assert all(started.format(r) in shown for r in (0, 1)), shown
    result, shown = run(ipshell, "%%distributed --timeout 3\nfor p in ps:\n    p.join()")
    assert not result.success
    for rank in (0, 1):
        assert f"workbench: rank {rank}: ended 2 processes" in shown, shown
        assert f"rank {rank} stopped at" in shown, shown  # where each was, truly
    nothing_stray(before)
    assert until(lambda: "that still run" not in status(), timeout=10), status()
    group_alive(ipshell)
