"""The Trainer on real gloo worlds: uneven data, NaN agreement, accumulation, resume, export."""

from __future__ import annotations

import pytest
import torch
from mp_common import LR, batches, dp_slice, make, reference
from world_harness import run_world

from workbench.strategies import shard
from workbench.train import (
    Callback,
    Trainer,
    export,
    generate,
    load_model,
    make_loader,
    predict,
    regression_data,
)

pytestmark = pytest.mark.slow


def _uneven(rank, world, strategy):
    data = batches("mlp", steps=3 + 2 * rank, batch=4)  # rank 0 has 3 batches, rank 1 has 5
    model = shard(make("mlp"), strategy)
    trainer = Trainer(model, data, lr=1e-2)
    first = trainer.run(steps=100)
    again = trainer.run(steps=10)  # out of data: returns at once, no hang
    return trainer.step, len(first.history), len(again.history)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_uneven_inputs_finish_on_the_same_step(strategy):
    assert run_world(_uneven, 2, strategy) == [(3, 3, 0), (3, 3, 0)]


def _nonfinite(rank, world, mode):
    data = batches("mlp", steps=4, batch=4)
    if rank == 1:
        data[1] = (torch.full_like(data[1][0], float("nan")), data[1][1])
    model = shard(make("mlp"), "ddp")
    trainer = Trainer(model, data, lr=1e-2, on_nonfinite=mode)
    try:
        trainer.run(steps=4)
    except FloatingPointError as exc:
        return ("raised", trainer.step, str(exc))
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.isfinite(params).all()
    return ("ran", trainer.step, trainer.skipped)


@pytest.mark.timeout(60)
def test_nan_loss_on_one_rank_is_skipped_on_every_rank():
    assert run_world(_nonfinite, 2, "skip") == [("ran", 3, 1), ("ran", 3, 1)]


@pytest.mark.timeout(60)
def test_nan_loss_on_one_rank_raises_on_every_rank():
    results = run_world(_nonfinite, 2, "raise")
    assert [r[:2] for r in results] == [("raised", 1), ("raised", 1)]
    assert "step 2" in results[0][2]


def _accumulate(rank, world):
    data = batches("mlp", steps=2)
    ref, _ = reference("mlp", data)
    model = shard(make("mlp"), "ddp")
    halves = [h for x, y in dp_slice(data, model.wb_layout) for h in zip(x.chunk(2), y.chunk(2), strict=True)]
    trainer = Trainer(model, halves, optim="sgd", lr=LR, clip=None, grad_accum=2)
    trainer.run(steps=2)
    assert trainer.step == 2
    torch.testing.assert_close(dict(model.module.state_dict()), ref, atol=2e-5, rtol=1e-4)


@pytest.mark.timeout(60)
def test_gradient_accumulation_equals_the_full_batch():
    run_world(_accumulate, 2)


class Recorder(Callback):
    def __init__(self):
        self.events = []

    def on_run_start(self, trainer):
        self.events.append("start")

    def on_step_end(self, trainer, stats):
        self.events.append(stats)

    def on_run_end(self, trainer):
        self.events.append("end")


def _clone(tree):
    if isinstance(tree, dict):
        return {k: _clone(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_clone(v) for v in tree]
    return tree.detach().clone() if isinstance(tree, torch.Tensor) else tree


def _resume_and_events(rank, world):
    x, y = regression_data(64, d_in=8, d_out=4)
    ds = torch.utils.data.TensorDataset(x, y)

    def fresh():
        model = shard(make("mlp"), "fsdp")
        return model, Trainer(model, make_loader(ds, 4, model=model, seed=1), lr=1e-2, seed=1)

    model, trainer = fresh()
    rec = Recorder()
    trainer.callbacks.append(rec)
    trainer.run(steps=5)
    saved = _clone(trainer.state_dict())  # what DCP would write: a copy, not live tensors
    cont = trainer.run(steps=6)  # crosses into epoch 1 (8 batches per rank per epoch)
    model2, trainer2 = fresh()
    trainer2.load_state_dict(saved)
    again = trainer2.run(steps=6)
    assert trainer.epoch == trainer2.epoch == 1 and trainer2.step == 11
    torch.testing.assert_close([s.loss for s in again.history], [s.loss for s in cont.history])
    stats = [e for e in rec.events if not isinstance(e, str)]
    assert rec.events[0] == "start" and rec.events[6] == "end" and len(stats) == 11
    s = stats[-1]
    assert s.samples == 4 * world and s.tokens == s.samples and s.lr == 1e-2
    assert s.step_time >= s.compute_time > 0 and s.comm_time > 0 and s.data_time > 0


@pytest.mark.timeout(60)
def test_resume_from_state_dict_and_step_events():
    run_world(_resume_and_events, 2)


def _export(rank, world, tmp, options, kind):
    data = batches(kind)
    ref, _ = reference(kind, data)
    model = shard(make(kind), **options)
    Trainer(model, dp_slice(data, model.wb_layout), optim="sgd", lr=LR, clip=None).run(steps=len(data))
    path = export(model, tmp)
    if rank == 0:
        loaded = load_model(path)
        torch.testing.assert_close(loaded.state_dict(), ref, atol=2e-5, rtol=1e-4)
        x = data[0][0]
        if kind == "mlp":
            assert predict(loaded, x).shape == (x.shape[0], 4)
        else:
            assert generate(loaded, "the ", max_new_tokens=10).startswith("the ")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("kind", "options"), [("mlp", {"strategy": "pp"}), ("gpt", {"strategy": "fsdp"}),
                                               ("gpt", {"strategy": "tp"})])
def test_export_is_whole_and_loads_in_one_process(tmp_path, kind, options):
    run_world(_export, 2, str(tmp_path / "model"), options, kind)
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["config.json", "model.safetensors"]


def _elastic(rank, world, strategy, tmp):
    from torch.utils.data import TensorDataset

    from workbench.train import ElasticLoader, full_state_dict
    from workbench.train.checkpoint import Checkpoint

    x, y = regression_data(64, d_in=8, d_out=4, seed=0)
    loader = ElasticLoader(TensorDataset(x, y), global_batch=16, seed=0)  # 4 steps an epoch
    steps = [loader.permutation(s // 4)[16 * (s % 4):16 * (s % 4 + 1)] for s in range(6)]
    ref, ref_losses = reference("mlp", [(x[i], y[i]) for i in steps])
    model = shard(make("mlp"), strategy)
    callbacks = [Checkpoint(tmp, every=100)] if strategy == "fsdp" else []
    trainer = Trainer(model, loader, optim="sgd", lr=LR, clip=None, elastic=True, callbacks=callbacks)
    history = trainer.run(steps=4).history + trainer.run(steps=2).history  # the second crosses an epoch
    torch.testing.assert_close([s.loss for s in history], ref_losses, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(full_state_dict(model), ref, atol=2e-5, rtol=1e-4)
    return type(trainer).__name__, trainer.step, trainer.elastic.committed


@pytest.mark.timeout(90)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_an_elastic_run_without_faults_equals_a_single_process(strategy, tmp_path):
    """The elastic Trainer's batches (an epoch's permutation split over the ranks), losses and parameters
    are a single process's on the same global batches."""
    assert run_world(_elastic, 2, strategy, str(tmp_path / "ckpt"), timeout=90) == [
        ("ElasticTrainer", 6, (1, 32))] * 2
