"""Training side by side on a real 4-rank pool split 2 + 2 (issue 43, docs/submeshes.md): a ``wb.Trainer``
over a DDP model runs unchanged on each sub-mesh, two learning rates at the same time; each sub-mesh's ranks
agree, the two differ, the live metrics keep them as two runs, and a configuration trained on one sub-mesh
while the other trained ends with the same parameters as when trained again alone on the other sub-mesh
(``assert_close``)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import running_pool, until

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

TRAIN = """
import torch, workbench as wb
torch.manual_seed(0)
model = wb.TinyGPT(wb.GPTConfig(vocab=wb.char_vocab(), block_size=16, n_layers=1, n_head=2, d_model=16))
model = wb.shard(model, "ddp")
loader = wb.make_loader(wb.char_dataset(block_size=16), batch_size=8, model=model)
trainer = wb.Trainer(model, loader, lr={lr})
result = trainer.run(steps=20)
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
"""


@pytest.fixture(scope="module")
def pool():
    with running_pool(n=4, timeout=60, backend="gloo") as s:
        s.split([2, 2], names=["a", "b"])
        yield s


def test_two_learning_rates_at_once_each_as_if_alone(pool):
    s = pool
    fast = s.submit(TRAIN.format(lr=3e-3), on="a")
    slow = s.submit(TRAIN.format(lr=1e-3), on="b")
    fast.wait(240), slow.wait(240)
    a0, a1, b0, b1 = s.pull("flat")
    torch.testing.assert_close(a0, a1)  # DDP kept each sub-mesh's ranks in step
    torch.testing.assert_close(b0, b1)
    assert not torch.allclose(a0, b0)  # two experiments, not one
    # and two runs for the dashboards, one per sub-mesh (their run_start events come on their own channel)
    assert until(lambda: sorted(sorted(r.ranks) for r in s.metrics.runs) == [[0, 1], [2, 3]], timeout=30), \
        [sorted(r.ranks) for r in s.metrics.runs]
    # the fast configuration again, alone, on sub-mesh b: the same parameters as on a beside the slow one
    s.run(TRAIN.format(lr=3e-3), on="b")
    again = s.view([2, 3]).pull("flat")
    torch.testing.assert_close(again[0], a0)
    torch.testing.assert_close(again[1], a0)
