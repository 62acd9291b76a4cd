"""Checkpoints across real gloo worlds: each rank seals its own files, damage found by one rank is named
on every rank, ``fallback=True`` resumes the previous checkpoint together, DCP reshards to another world
size."""

from __future__ import annotations

import pytest

from tests.multiproc.world_harness import run_world

pytestmark = pytest.mark.timeout(120)


def _trainer(strategy):
    from torch.utils.data import TensorDataset

    import workbench as wb

    model = wb.shard(wb.MLP(wb.MLPConfig(n_layers=2)), strategy)
    data = wb.make_loader(TensorDataset(*wb.regression_data(128)), 8, model=model)
    return model, wb.Trainer(model, data, optim="adamw", lr=0.01, clip=None)


def _params(model):
    full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
    return {k: v.tolist() for k, v in full.items()}


def _train_save_twice(rank, world, directory, strategy):
    """Saves at steps 4 and 8; the parameters at 4, 8 and 12 (what a resume at 4 must reach after 8 steps)."""
    from workbench.train.checkpoint import save_trainer

    model, trainer = _trainer(strategy)
    trainer.run(steps=4)
    save_trainer(directory, trainer)
    at_4 = _params(model)
    trainer.run(steps=4)
    save_trainer(directory, trainer)
    at_8 = _params(model)
    trainer.run(steps=4)
    return at_4, at_8, _params(model)


def _resume(rank, world, directory, strategy, fallback, then):
    import warnings

    from workbench.train.checkpoint import resume

    model, trainer = _trainer(strategy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            step = resume(directory, trainer, fallback=fallback)
        except ValueError as exc:
            return "error", str(exc)
    at_resume = _params(model)
    trainer.run(steps=then - step)
    return step, at_resume, _params(model), [str(w.message) for w in caught if "step-" in str(w.message)]


def assert_params(got, want):
    import torch

    torch.testing.assert_close({k: torch.tensor(v) for k, v in got.items()},
                               {k: torch.tensor(v) for k, v in want.items()})


def test_resume_at_another_world_size(tmp_path):
    _, at_8, _ = run_world(_train_save_twice, 2, str(tmp_path), "fsdp")[0]
    step, resumed, _, _ = run_world(_resume, 1, str(tmp_path), "fsdp", False, 8)[0]
    assert step == 8
    assert_params(resumed, at_8)


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_damage_in_one_ranks_file_is_named_on_every_rank_and_fallback_resumes_together(tmp_path, strategy):
    at_4, _, at_12 = run_world(_train_save_twice, 2, str(tmp_path), strategy)[0]
    folder = tmp_path / "step-000008"
    sums = dict(reversed(line.split("  ")) for line in (folder / "SHA256SUMS").read_text().splitlines())
    written = sorted(name for name in sums if name.endswith(".distcp"))
    if strategy == "fsdp":  # each rank holds its own shards: each wrote and sealed its own file
        assert written == ["__0_0.distcp", "__1_0.distcp"]
    victim = folder / max(written, key=lambda name: (folder / name).stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = bytes(64)
    victim.write_bytes(bytes(data))

    errors = run_world(_resume, 2, str(tmp_path), strategy, False, 12)
    assert errors[0] == errors[1] and errors[0][0] == "error"
    assert f"step-000008/{victim.name} is damaged" in errors[0][1]

    for step, resumed, continued, said in run_world(_resume, 2, str(tmp_path), strategy, True, 12):
        assert step == 4 and len(said) == 1 and victim.name in said[0] and "step-000004" in said[0]
        assert_params(resumed, at_4)
        assert_params(continued, at_12)  # data position, optimizer and RNG came back too

    step, resumed, _, said = run_world(_resume, 1, str(tmp_path), strategy, True, 4)[0]  # resharded
    assert step == 4 and said
    assert_params(resumed, at_4)
