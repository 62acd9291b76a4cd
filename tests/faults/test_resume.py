"""kill -9 of a rank at step 30 of 100, restart, resume from the step-20 checkpoint: same parameters as
no fault."""

from __future__ import annotations

import json
import time

import pytest
import torch

from workbench import RankError, Session, faults

pytestmark = pytest.mark.timeout(180)

SETUP = """
import os, signal, torch
import workbench as wb
from workbench.train.checkpoint import Checkpoint, resume, save_trainer, latest
from torch.utils.data import TensorDataset

class KillAt(wb.Callback):
    def __init__(self, step, victim):
        self.step, self.victim = step, victim
    def on_step_end(self, trainer, stats):
        if trainer.step == self.step and rank == self.victim:
            os.kill(os.getpid(), signal.SIGKILL)

def make_trainer(callbacks=()):
    torch.manual_seed(0)
    model = wb.shard(wb.MLP(wb.MLPConfig(n_layers=2)), "ddp")
    data = wb.make_loader(TensorDataset(*wb.regression_data(256)), 8, model=model)
    return model, wb.Trainer(model, data, optim="sgd", lr=0.05, clip=None, callbacks=list(callbacks))
"""


def params(s):
    s.run("flat = torch.cat([p.detach().flatten() for p in model.parameters()])")
    return s.pull("flat")


@pytest.fixture(scope="module", autouse=True)
def _setup(pool):
    pool.run(SETUP)


def test_kill_at_step_30_restart_resume_equals_run_without_fault(pool, tmp_path):
    pool.run("model, trainer = make_trainer()\ntrainer.run(steps=100)")
    reference = params(pool)

    ckpt = tmp_path / "ckpt"
    pool.push({"ckpt": str(ckpt)})
    lines_before = faults.log_path().read_text().count("\n") if faults.log_path().exists() else 0
    t_kill = time.monotonic()
    with pytest.raises(RankError) as info:
        pool.run("model, trainer = make_trainer([Checkpoint(ckpt, every=20), KillAt(30, victim=1)])\n"
                 "trainer.run(steps=100)")
    failed_s = time.monotonic() - t_kill
    err = info.value
    assert err.rank == 1 and err.failures[0][1].ename == "RankDied"
    assert (ckpt / "latest").read_text() == "step-000020"

    t0 = time.monotonic()
    assert pool.restart() == [1]
    pool.run(SETUP, ranks=[1])  # the new engine starts with a fresh namespace
    pool.push({"ckpt": str(ckpt)}, ranks=[1])
    pool.run("model, trainer = make_trainer()\nresumed = resume(ckpt, trainer)\n"
             "trainer.run(steps=100 - resumed)")
    recover_s = time.monotonic() - t0
    assert pool.pull("resumed") == [20, 20]
    for got, want in zip(params(pool), reference, strict=True):
        torch.testing.assert_close(got, want)

    fault = err.result.fault
    assert fault.kind == "died" and fault.recover_s is not None
    logged = [json.loads(line) for line in faults.log_path().read_text().splitlines()[lines_before:]]
    assert any(e["kind"] == "died" and e["rank"] == 1 and e["recover_s"] is not None for e in logged)
    print(f"\nkill test: cell failed {failed_s:.2f} s after start (kill at step 30), other ranks stopped in "
          f"{fault.abort_s:.2f} s after detection, restart+resume+70 steps {recover_s:.2f} s")


def test_rank_killed_during_checkpoint_save_leaves_previous_latest(pool, tmp_path):
    ckpt = tmp_path / "ck2"
    pool.push({"ckpt": str(ckpt)})
    pool.run("model, trainer = make_trainer()\ntrainer.run(steps=5)\nsave_trainer(ckpt, trainer)")
    assert (ckpt / "latest").read_text() == "step-000005"
    with pytest.raises(RankError) as info:
        pool.run("import threading\ntrainer.run(steps=5)\n"
                 "if rank == 1:\n    threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGKILL)).start()\n"
                 "save_trainer(ckpt, trainer)")
    assert info.value.rank == 1
    assert (ckpt / "latest").read_text() == "step-000005"
    pool.restart()
    pool.run(SETUP, ranks=[1])
    pool.push({"ckpt": str(ckpt)}, ranks=[1])
    pool.run("model, trainer = make_trainer()\nresumed = resume(ckpt, trainer)")
    assert pool.pull("resumed") == [5, 5]


def test_a_taken_master_port_never_matters(monkeypatch):
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    monkeypatch.setenv("MASTER_PORT", str(taken.getsockname()[1]))  # engines inherit it
    try:
        with Session(n=2, timeout=30) as s:
            s.run("import torch\nt = torch.ones(1)\ndist.all_reduce(t)")
            assert [t.item() for t in s.pull("t")] == [2.0, 2.0]
            s.run("import os\nport = int(os.environ['MASTER_PORT'])")
            assert s.pull("port")[0] != taken.getsockname()[1]  # rank 0 bound a free port itself
    finally:
        taken.close()
