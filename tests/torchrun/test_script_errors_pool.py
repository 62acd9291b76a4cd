"""What a torchrun script does that used to break the pool, in a real 2-rank pool through the magics: each
case failed on the code before torchrun scripts were supported (issue 23)."""

from __future__ import annotations

import textwrap

import pytest
from IPython.core.error import UsageError

from tests.conftest import alive, until
from tests.torchrun.common import on_both_ranks, run

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]




@pytest.fixture
def engines(pool):
    """The engines' pids before and after: a script's exit must end the script, never an engine."""
    before = [r.pid for r in pool.ranks]
    yield before
    assert [r.pid for r in pool.ranks] == before and alive(before) == before, "an engine ended"


def write(folder, name: str, body: str):
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def all_reduce_works(ip) -> None:
    cell = "%%distributed\nimport torch\nt = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item())"
    result, shown = run(ip, cell)
    assert result.success and on_both_ranks(shown, "sum 2.0"), shown


def test_torchruns_environment_on_every_rank(ipshell, pool):
    names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
             "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
             "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
             "OMP_NUM_THREADS"]
    cell = f"%%distributed\nimport os\nenv = {{n: os.environ[n] for n in {names!r}}}"
    result, shown = run(ipshell, cell)
    assert result.success, shown
    envs = pool.pull("env")
    for rank, env in enumerate(envs):
        assert env["RANK"] == env["ROLE_RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["ROLE_NAME"]) == ("0", "1", "default")
        assert env["TORCHELASTIC_RUN_ID"] == pool.pool_id and env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["MASTER_ADDR"] == "127.0.0.1"  # a local pool meets in a file: no port, no agent store
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == str(int(env["MASTER_PORT"]) > 0)


def test_init_process_group_finds_the_pools_group(ipshell, pool, engines):
    cell = ("%%distributed\nimport torch\nimport torch.distributed as d\n"
            "from torch.distributed import init_process_group\n"
            "init_process_group(backend='gloo', init_method='env://', rank=rank, world_size=2, "
            "device_id=torch.device('cpu'))\n"
            "d.distributed_c10d.init_process_group()\nprint('world', d.get_world_size())")
    result, shown = run(ipshell, cell)
    assert result.success, shown
    assert on_both_ranks(shown, "world 2")
    assert shown.count("init_process_group(): the pool's process group is formed already (backend gloo, "
                       "world size 2)") == 1, shown
    all_reduce_works(ipshell)


def test_init_process_group_that_disagrees_says_what_differs(ipshell, pool, engines):
    result, shown = run(ipshell, "%%distributed\ndist.init_process_group('nccl', world_size=4)")
    assert not result.success
    assert "backend 'nccl' (the pool's group: 'gloo')" in shown, shown
    assert "world_size=4 (the pool's group: 2)" in shown, shown
    all_reduce_works(ipshell)


def test_destroy_process_group_keeps_the_pools_group(ipshell, pool, engines):
    cell = ("%%distributed\nimport torch.distributed as d\nsub = d.new_group([0, 1])\n"
            "d.destroy_process_group()\nprint('groups', len(d.distributed_c10d._world.pg_map))")
    result, shown = run(ipshell, cell)
    assert result.success, shown
    assert on_both_ranks(shown, "groups 1"), "the script's subgroup was not destroyed"
    assert shown.count("destroy_process_group(): the pool keeps its process group") == 1, shown
    all_reduce_works(ipshell)
    result, shown = run(ipshell, "%dist check")  # failed with a traceback through a probe on main
    assert result.success, shown
    result, shown = run(ipshell, "%dist status")
    assert "process group: formed (backend gloo, world size 2)" in shown, shown


def test_exit_ends_the_script_not_the_engine(ipshell, pool, engines, tmp_path):
    script = write(tmp_path, "ends.py", """\
        import sys
        print("before", sys.argv[1:])
        if sys.argv[1] == "exit":
            exit()
        elif sys.argv[1] == "quit":
            quit(0)
        sys.exit(int(sys.argv[1]))
        print("never")
        """)
    for how in ("exit", "quit", "0"):
        result, shown = run(ipshell, f"%dist run {script} -- {how}")
        assert result.success, shown
        assert "before" in shown and "never" not in shown and "SystemExit" not in shown, shown
    result, shown = run(ipshell, f"%%distributed\n%run {script} 0")
    assert result.success and "never" not in shown, shown
    result, shown = run(ipshell, "%%distributed\nimport sys\nsys.exit(0)\nprint('never')")
    assert result.success and "never" not in shown, shown
    all_reduce_works(ipshell)


def test_a_non_zero_exit_fails_the_cell_naming_the_rank(ipshell, pool, engines, tmp_path):
    script = write(tmp_path, "fails.py", "import os, sys\nif os.environ['RANK'] == '1':\n    sys.exit(3)\n")
    result, shown = run(ipshell, f"%dist run {script}")
    assert not result.success
    assert "rank 1 (" in shown and "SystemExit: 3" in shown, shown
    result, shown = run(ipshell, f"%%distributed\n%run {script}")
    assert not result.success and "rank 1 (" in shown and "SystemExit: 3" in shown, shown
    result, shown = run(ipshell, "%%distributed\nexit(2)")
    assert not result.success and "SystemExit: 2" in shown, shown
    all_reduce_works(ipshell)


def test_a_pasted_script_does_not_parse_ipengines_argv(ipshell, pool, engines):
    cell = ("%%distributed\nimport argparse\nif __name__ == '__main__':\n"
            "    parser = argparse.ArgumentParser()\n"
            "    parser.add_argument('--epochs', type=int, default=2)\n"
            "    args = parser.parse_args()\n    print('epochs', args.epochs)")
    result, shown = run(ipshell, cell)
    assert result.success, shown
    assert on_both_ranks(shown, "epochs 2")


def test_the_ranks_follow_the_notebooks_folder(ipshell, pool, tmp_path, monkeypatch):
    folder = tmp_path / "project"
    folder.mkdir()
    write(folder, "train.py", "import os\nprint('here', os.getcwd())\nopen('out.txt', 'w').write('x')\n")
    monkeypatch.chdir(tmp_path)
    result, shown = run(ipshell, "%cd project")
    assert result.success, shown
    result, shown = run(ipshell, "%%distributed\n%run train.py")
    assert result.success and on_both_ranks(shown, f"here {folder}"), shown
    result, shown = run(ipshell, "%dist run train.py")
    assert result.success and (folder / "out.txt").is_file(), shown


def test_a_missing_script_names_the_folder(ipshell, pool, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=f"nope.py: no such file \\(the notebook's folder is {tmp_path}"):
        ipshell.run_line_magic("dist", "run nope.py -- 1")


def test_a_syntax_error_is_found_before_anything_is_sent(ipshell, pool, tmp_path):
    script = write(tmp_path, "broken.py", "print('sent')\ndef f(:\n    pass\n")
    with pytest.raises(SyntaxError):
        pool.run_script(str(script))
    result, shown = run(ipshell, f"%dist run {script}")
    assert not result.success and f"syntax error in {script}, line 2" in shown, shown
    assert "'sent'" not in shown and "[rank" not in shown, shown


def test_a_syntax_error_in_a_cell_is_found_in_the_kernel(ipshell, pool):
    faults = len(pool.faults)
    result, shown = run(ipshell, "%%distributed\nprint('sent')\ndef f(:\n    pass")
    assert isinstance(result.error_in_exec, UsageError), shown
    assert "syntax error in the cell, line 2: invalid syntax: def f(:; nothing was sent" in shown, shown
    assert "'sent'" not in shown and "[rank" not in shown and len(pool.faults) == faults, shown


def test_the_same_error_on_every_rank_is_named_once_and_promises_no_reform(ipshell, pool):
    result, shown = run(ipshell, "%%distributed\nraise ValueError('the same everywhere')")
    assert not result.success
    assert "ranks 0-1 raised ValueError: the same everywhere" in shown, shown
    assert "re-forms the process group" not in shown, shown  # nothing touched the group
    all_reduce_works(ipshell)


def test_a_group_destroyed_by_torch_itself_says_so_and_the_next_cell_reforms_it(ipshell, pool, engines):
    cell = ("%%distributed\nimport torch\nfrom torch.distributed import distributed_c10d as c10d\n"
            "real = getattr(c10d.destroy_process_group, '__wrapped__', c10d.destroy_process_group)\n"
            "if rank == 0:\n    real()  # a library holding torch's own function\n"
            "dist.all_reduce(torch.ones(1))")
    result, shown = run(ipshell, cell)
    assert not result.success and "Default process group has not been initialized" in shown, shown
    assert "the process group was destroyed on rank 0: the next cell re-forms it." in shown, shown
    all_reduce_works(ipshell)


def test_an_exception_in_a_percent_run_script_still_fails_the_cell(ipshell, pool, engines, tmp_path):
    script = write(tmp_path, "raises.py",
                   "import os\nif os.environ['RANK'] == '0':\n    raise ValueError('boom')\n")
    result, shown = run(ipshell, f"%%distributed\n%run {script}")
    assert not result.success and "rank 0 (" in shown and "ValueError: boom" in shown, shown
    all_reduce_works(ipshell)


TRAINER = """\
import torch, workbench as wb
from torch.utils.data import TensorDataset
x, y = wb.regression_data(64, d_in=8, d_out=2)
model = wb.shard(wb.MLP(wb.MLPConfig(d_in=8, d_hidden=16, d_out=2, n_layers=2)), 'ddp')
data = wb.make_loader(TensorDataset(x, y), batch_size=8, model=model)
trainer = wb.Trainer(model, data, lr=1e-3, elastic=True)
"""


def test_trainer_run_on_some_ranks_fails_at_once_naming_them(ipshell, pool, engines):
    result, shown = run(ipshell, "%%distributed\n" + TRAINER)
    assert result.success, shown
    # on main rank 0 waited in its first collective for rank 1 until the cell's timeout
    result, shown = run(ipshell, "%%distributed --ranks 0 --timeout 40\ntrainer.run(3)")
    assert not result.success
    assert ("rank 0 (" in shown and "raised ValueError: the elastic Trainer (trainer.run) needs every rank: "
            "this cell runs on rank 0 of the 2 in the process group") in shown, shown
    assert "timeout" not in shown, shown
    result, shown = run(ipshell, "%%distributed\nr = trainer.run(3)\nprint('steps', len(r.history))")
    assert result.success and on_both_ranks(shown, "steps 3"), shown


def test_status_names_the_ranks_a_cell_destroyed_the_group_on_and_the_reform(ipshell, pool, engines):
    cell = ("%%distributed\nfrom torch.distributed import distributed_c10d as c10d\n"
            "if rank == 1:\n    c10d.destroy_process_group.__wrapped__()  # torch's own, raising nothing")
    result, shown = run(ipshell, cell)
    assert result.success, shown
    # the rank's beacon says so (the kernel waits for it here; a bound, not a speed check)
    assert until(lambda: "destroyed on rank 1" in pool.group_state(), timeout=20), pool.group_state()
    result, shown = run(ipshell, "%dist status")
    assert ("process group: destroyed on rank 1 (torch's own destroy_process_group, not the pool's deferred "
            "one); the next cell re-forms it") in shown, shown
    all_reduce_works(ipshell)  # that next cell
    result, shown = run(ipshell, "%dist status")
    assert "process group: formed (backend gloo, world size 2)" in shown, shown


def test_status_after_an_abort_says_aborted_not_destroyed(ipshell, pool, engines):
    """A rank raises while the other waits in a collective: the kernel aborts the group, which leaves
    ``dist.is_initialized()`` False on the ranks; their beacons say so, and ``%dist status`` read that as
    "destroyed ... (torch's own destroy_process_group...)" (issue 40, point 9)."""
    cell = ("%%distributed\nimport torch\nif rank == 1:\n    raise ValueError('boom on rank 1')\n"
            "t = torch.ones(1)\ndist.all_reduce(t)")
    result, shown = run(ipshell, cell)
    assert not result.success and "boom on rank 1" in shown, shown
    beacons = pool.rooms.beacons

    def no_group_heard() -> bool:  # both ranks' beacons of this generation say they have no group now
        beats = beacons.latest
        return all((beats.get(r.rank) or {}).get("group") is False for r in pool.ranks)

    assert until(no_group_heard, timeout=20), beacons.latest  # a bound, not a speed check
    result, shown = run(ipshell, "%dist status")
    assert "process group: aborted after a fault; the next cell re-forms it" in shown, shown
    assert "destroyed" not in shown, shown
    all_reduce_works(ipshell)  # the next cell re-forms it
    result, shown = run(ipshell, "%dist status")
    assert "process group: formed (backend gloo, world size 2)" in shown, shown


def test_a_file_percent_run_misses_names_the_ranks_folder_and_host(ipshell, pool, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result, shown = run(ipshell, "%%distributed\n%run nope.py")
    assert not result.success and "File `'nope.py'` not found." in shown, shown
    host = pool.ranks[0].host
    assert (f"the ranks look for files in their own folder: ranks 0-1 on {host} in {tmp_path} (the "
            "notebook's folder).") in shown, shown
