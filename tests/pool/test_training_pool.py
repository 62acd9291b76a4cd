"""Shard, scatter, train and export through ``%%distributed`` cells on a real 2-engine pool."""

from __future__ import annotations

import pytest
import torch
from IPython.utils.capture import capture_output

import workbench as wb
from tests.conftest import alive
from workbench import session

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def run(ip, cell):
    with capture_output() as cap:
        result = ip.run_cell(cell)
    shown = cap.stdout + cap.stderr + "".join(o.data.get("text/plain", "") + "\n" for o in cap.outputs)
    assert result.success, shown
    return shown


@pytest.fixture(scope="module")
def pool(ipshell):
    run(ipshell, "%dist start -n 2 --timeout 60")
    s = session.current()
    pids = s.pids()
    yield s
    run(ipshell, "%dist stop")
    assert alive(pids) == [], "processes of the pool survived %dist stop"


SETUP = """%%distributed
import torch, workbench as wb
torch.manual_seed(0)
model = wb.TinyGPT(wb.GPTConfig(vocab=wb.char_vocab(), block_size=16, n_layers=2, n_head=2, d_model=32))
model = wb.shard(model, "fsdp")
loader = wb.make_loader(wb.char_dataset(block_size=16), batch_size=8, model=model)
trainer = wb.Trainer(model, loader, lr=3e-3)
"""


def test_shard_then_train_cell_after_cell(ipshell, pool):
    run(ipshell, SETUP)
    run(ipshell, "%%distributed\nfirst = trainer.run(steps=50)\nfirst")
    shown = run(ipshell, "%%distributed\nsecond = trainer.run(steps=50)\nsecond")
    assert "RunResult(steps 51-100" in shown
    run(ipshell, "%%distributed\nlosses = [s.loss for s in first.history + second.history]\n"
                 "step = trainer.step")
    assert pool.pull("step") == [100, 100]
    losses = pool.pull("losses")
    assert losses[0] == losses[1], "ranks disagree on the loss"
    early, late = sum(losses[0][:10]) / 10, sum(losses[0][-10:]) / 10
    assert late < 0.8 * early, f"loss did not go down: {early:.3f} -> {late:.3f}"


def test_export_then_generate_in_the_notebook(ipshell, pool, tmp_path):
    run(ipshell, f"%%distributed\nwb.export(model, {str(tmp_path / 'gpt')!r})")
    gpt = wb.load_model(tmp_path / "gpt")
    text = wb.generate(gpt, "the ", max_new_tokens=20)
    assert text.startswith("the ") and len(text) == 24


def test_scatter_and_gather_split_along_dim_0(ipshell, pool):
    assert wb.scatter(torch.arange(10.0).reshape(5, 2), "part") == [3, 2]
    shown = run(ipshell, "%%distributed\nprint(rank, part.shape[0])\npart = part * 2")
    assert "[rank 0] 0 3" in shown and "[rank 1] 1 2" in shown
    torch.testing.assert_close(wb.gather("part"), torch.arange(10.0).reshape(5, 2) * 2)
    wb.scatter(list(range(5)), "items")
    assert wb.gather("items") == [0, 1, 2, 3, 4]
