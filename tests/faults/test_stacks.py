"""`%dist stacks`: every rank's stacks while a cell runs, taken by the ranks' agents, grouped.

A real 3-rank gloo pool; rank 1 holds back (it waits for a file the test creates) while ranks 0 and
2 wait for it inside an all_reduce: the main threads of 0 and 2 are blocked in gloo, so nothing
could reach them through ipyparallel, and the stacks still come.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from tests.conftest import alive, until
from workbench import Session, session

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
PYSPY_HERE = ROOT / "build" / "pyspy" / "bin"  # a developer's py-spy outside the venv (CI: in the venv)

# rank 1 waits in open() of a FIFO (one C call: its stack holds still) until the test opens the other end
HUNG = """\
import io, torch
t = torch.ones(1)
if rank == 1:
    io.open({go!r}).read()
dist.all_reduce(t)
"""

DATALOADER = """\
import os, time, torch
from torch.utils.data import DataLoader, Dataset
class Slow(Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        while not os.path.exists({go!r}):
            time.sleep(0.02)
        return torch.tensor([i])
batches = [b for b in DataLoader(Slow(), batch_size=2, num_workers=2)]
"""


@pytest.fixture(scope="module")
def pool(monkeypatch_module):
    if PYSPY_HERE.is_dir():
        monkeypatch_module.setenv("PATH", f"{PYSPY_HERE}:{os.environ['PATH']}")  # the engines inherit it
    s = Session(n=3, timeout=30).start()
    started = set(s.pids())
    yield s
    s.stop()
    assert alive(sorted(started)) == []


def _tree() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


class Release:
    """A FIFO the held rank opens for reading; ``touch()`` opens it for writing, which lets it go."""

    def __init__(self, path: Path):
        self.path = path
        if not path.exists():
            os.mkfifo(path)

    def touch(self) -> None:
        try:
            os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: nobody waits on it (yet)
            pass


def _hold(tmp_path, name: str) -> tuple[str, Release]:
    return str(tmp_path / name), Release(tmp_path / name)


def _file(tmp_path, name: str) -> tuple[str, Path]:
    return str(tmp_path / name), tmp_path / name


def _held(found) -> bool:
    """Rank 1 waits in io.open, ranks 0 and 2 in the all_reduce (the ranks run the first lines a moment
    apart: a look before that sees them on their way)."""
    return [g.ranks for g in found.groups] == [[1], [0, 2]] and \
        found.groups[0].headline == "<module> at cell line 4" and \
        found.groups[1].headline.endswith("<- cell line 5")


def test_stacks_of_a_hung_all_reduce_name_the_odd_rank_first(pool, tmp_path):
    before = _tree()
    path, go = _hold(tmp_path, "go")
    handle = pool.submit(HUNG.format(go=path))
    try:
        assert until(lambda: _held(pool.stacks()), 20, every=0.2)
        found = pool.stacks()
        assert found.missing == []
        odd, rest = found.groups
        assert odd.ranks == [1] and odd.headline == "<module> at cell line 4", found.format()  # in time.sleep
        assert rest.ranks == [0, 2], found.format()
        assert rest.headline.startswith("all_reduce at torch/distributed/distributed_c10d.py:"), \
            found.format()
        assert rest.headline.endswith("<- cell line 5"), found.format()
        main = next(t for t in rest.threads if t["main"])
        cell = {"name": "<module>", "where": "cell line 5", "text": "dist.all_reduce(t)"}
        assert main["frames"][-1] == cell
        text = found.format()
        assert text.index("rank 1:") < text.index("ranks 0,2:")  # the odd one first
        # native frames through py-spy, which the agent starts and names as its tracer
        native = pool.stacks(native=True)
        assert native.native_note() is None, native.format()
        odd, rest = native.groups
        assert rest.ranks == [0, 2] and "(native: c10d::Work::wait)" in rest.headline, native.format()
        main = next(t for t in rest.threads if t["main"])
        assert main["native"] and any(f.get("native") for f in main["frames"])
        assert "cell line 5" in rest.headline
    finally:
        go.touch()
        result = handle.wait(30)
    assert [r.outcome for r in result.ranks] == ["ok"] * 3  # looking changed nothing
    assert until(lambda: _tree() <= before, 10)  # no py-spy left behind


def test_stacks_without_py_spy_say_why_and_show_the_python_stacks(pool):
    pool.run("import os; os.environ['WORKBENCH_PYSPY'] = '/nonexistent/py-spy'")
    try:
        found = pool.stacks(native=True)
    finally:
        pool.run("del os.environ['WORKBENCH_PYSPY']")
    assert found.native_note() == "py-spy is not installed on this rank (pip install py-spy)"
    assert "native frames: not shown (py-spy is not installed" in found.format()
    assert found.groups and all(t["frames"] for g in found.groups for t in g.threads if t["main"])


def test_stacks_during_a_dataloader_with_workers(pool, tmp_path):
    before = _tree()
    path, go = _file(tmp_path, "go")
    handle = pool.submit(DATALOADER.format(go=path))
    try:
        def in_next():  # every rank's main thread waits in the DataLoader's __next__, at the same frames
            found = pool.stacks()
            mains = [t for g in found.groups for t in g.threads if t["main"]]
            ok = len(found.groups) == 1 and "__next__" in [f["name"] for f in mains[0]["frames"]]
            return ok and found
        found = until(in_next, 30, every=0.3) and in_next()
        assert found, pool.stacks().format()
        main = next(t for t in found.groups[0].threads if t["main"])
        names = [f["name"] for f in main["frames"]]
        assert "__next__" in names and main["frames"][-1]["where"] == "cell line 10", found.format()
        # with native frames the workers come too: each waits in the cell's own __getitem__
        native = pool.stacks(ranks=[0], native=True)
        workers = [t for t in native.groups[0].threads if t["name"].startswith("subprocess ")]
        assert len({t["name"].split(":")[0] for t in workers}) == 2, native.format()
        # py-spy names a method with its class ("Slow.__getitem__")
        assert any(f["where"] in ("cell line 7", "cell line 8") and f["name"].split(".")[-1] == "__getitem__"
                   for t in workers for f in t["frames"]), native.format()  # in the while, or the sleep
    finally:
        go.touch()
        result = handle.wait(60)
    assert [r.outcome for r in result.ranks] == ["ok"] * 3
    assert until(lambda: _tree() <= before, 10)


ATTACHED = """\
import json, sys
from workbench import Session
s = Session.attach(sys.argv[1])
found = s.stacks()
print(json.dumps({"groups": [[g.ranks, g.headline] for g in found.groups], "missing": found.missing}))
s.detach()
"""


def test_stacks_from_a_second_process_attached_to_the_pool(pool, tmp_path):
    path, go = _hold(tmp_path, "go")
    handle = pool.submit(HUNG.format(go=path))
    try:
        assert until(lambda: _held(pool.stacks()), 20, every=0.2)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(ATTACHED), pool.pool_id], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        seen = json.loads(out.stdout.strip().splitlines()[-1])
        assert seen["missing"] == [] and [g[0] for g in seen["groups"]] == [[1], [0, 2]], seen
        assert seen["groups"][1][1].endswith("<- cell line 5"), seen
    finally:
        go.touch()
        result = handle.wait(30)
    assert [r.outcome for r in result.ranks] == ["ok"] * 3


def test_dist_stacks_magic_and_its_bad_input(ipshell, pool):
    # the test before ends a cell: a rank may still be leaving it (its reply came first) for a moment
    assert until(lambda: [g.headline for g in pool.stacks().groups] == ["idle (no cell running)"], 20,
                 every=0.1)
    session.use(pool)
    try:
        with capture_output() as cap:
            ipshell.run_line_magic("dist", "stacks")
        assert cap.stdout.startswith("stacks of 3 ranks in 1 group"), cap.stdout
        assert "ranks 0-2: idle (no cell running)" in cap.stdout, cap.stdout  # wherever in its loop
        with capture_output() as cap:
            ipshell.run_line_magic("dist", "stacks --ranks 2")
        assert cap.stdout.startswith("stacks of 1 rank in 1 group") and "rank 2:" in cap.stdout, cap.stdout
        with pytest.raises(UsageError, match="rank 5 is out of range: this pool has ranks 0-2"):
            ipshell.run_line_magic("dist", "stacks --ranks 5")
        with pytest.raises(UsageError, match="unrecognized arguments: --nativ"):
            ipshell.run_line_magic("dist", "stacks --nativ")
    finally:
        session.use(None)


MANY_THREADS = """\
import threading
release = threading.Event()
def deep(n):
    return deep(n - 1) if n else release.wait(60)
workers = [threading.Thread(target=deep, args=(30,), name=f"deep-{i}") for i in range(30)]
for w in workers:
    w.start()
"""


def test_a_large_answer_comes_in_parts_and_whole(pool):
    """30 threads 30 frames deep on every rank: each answer is several side-channel messages."""
    pool.run(MANY_THREADS)
    try:
        found = pool.stacks()
        assert found.missing == [] and len(found.answers) == 3
        for answer in found.answers.values():
            deep = [t for t in answer["threads"] if t["name"].startswith("deep-")]
            assert len(deep) == 30 and all(len(t["frames"]) >= 31 for t in deep)
        assert len(str(found.answers[0])) > 2 * 24_000  # over two parts
        # the same threads on every rank: one group, the threads listed once by name
        assert [g.ranks for g in found.groups] == [[0, 1, 2]]
        assert "deep-29" in found.format().splitlines()[-1]
    finally:
        pool.run("release.set()\nfor w in workers:\n    w.join(10)")
