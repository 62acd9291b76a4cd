"""A checkpoint saved by 2 FSDP ranks resumes on 1 rank (DCP reshards) with the same parameters."""

from __future__ import annotations

import pytest

from tests.multiproc.world_harness import run_world

pytestmark = pytest.mark.timeout(90)


def _train_save(rank, world, directory):
    from torch.utils.data import TensorDataset

    import workbench as wb
    from workbench.train.checkpoint import save_trainer

    model = wb.shard(wb.MLP(wb.MLPConfig(n_layers=2)), "fsdp")
    data = wb.make_loader(TensorDataset(*wb.regression_data(128)), 8, model=model)
    trainer = wb.Trainer(model, data, optim="sgd", lr=0.05, clip=None)
    trainer.run(steps=4)
    save_trainer(directory, trainer)
    full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
    return {k: v.tolist() for k, v in full.items()}


def _resume(rank, world, directory):
    from torch.utils.data import TensorDataset

    import workbench as wb
    from workbench.train.checkpoint import resume

    model = wb.shard(wb.MLP(wb.MLPConfig(n_layers=2)), "fsdp")
    data = wb.make_loader(TensorDataset(*wb.regression_data(128)), 8, model=model)
    trainer = wb.Trainer(model, data, optim="sgd", lr=0.05, clip=None)
    step = resume(directory, trainer)
    full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
    return step, {k: v.tolist() for k, v in full.items()}


def test_resume_at_another_world_size(tmp_path):
    import torch

    saved = run_world(_train_save, 2, str(tmp_path))[0]
    step, resumed = run_world(_resume, 1, str(tmp_path))[0]
    assert step == 4
    torch.testing.assert_close({k: torch.tensor(v) for k, v in resumed.items()},
                               {k: torch.tensor(v) for k, v in saved.items()})
