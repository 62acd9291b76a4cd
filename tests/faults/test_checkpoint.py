"""Checkpoints: complete or absent, bad input refused without touching the model, no foreign pickle run."""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch

from workbench.train import checkpoint

pytestmark = pytest.mark.timeout(60)


def model_and_opt(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.fixture(autouse=True)
def _single_process_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def test_round_trip_and_latest_pointer(tmp_path):
    model, opt = model_and_opt(0)
    checkpoint.save(tmp_path, model=model, optimizer=opt, step=20)
    checkpoint.save(tmp_path, model=model, optimizer=opt, step=30)
    assert checkpoint.latest(tmp_path).name == "step-000030"
    other, other_opt = model_and_opt(1)
    assert checkpoint.load(tmp_path, model=other, optimizer=other_opt) == 30
    torch.testing.assert_close(other.state_dict(), model.state_dict())


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    model, _ = model_and_opt(0)
    with pytest.raises(ValueError, match="no complete checkpoint"):
        checkpoint.load(tmp_path, model=model)


def test_incomplete_save_leaves_previous_latest(tmp_path):
    model, opt = model_and_opt(0)
    checkpoint.save(tmp_path, model=model, optimizer=opt, step=20)
    (tmp_path / "step-000030").mkdir()  # a save that died half-way: no pointer moved
    (tmp_path / "step-000030" / "__0_0.distcp").write_bytes(b"partial")
    assert checkpoint.latest(tmp_path).name == "step-000020"


class Payload:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path('PWNED').write_text('x')",))


@pytest.mark.parametrize("metadata", [b"\x80\x04truncated", "pickle"])
def test_truncated_or_foreign_metadata_is_refused_and_model_unchanged(tmp_path, monkeypatch, metadata):
    monkeypatch.chdir(tmp_path)
    model, opt = model_and_opt(0)
    checkpoint.save(tmp_path / "ck", model=model, optimizer=opt, step=5)
    meta = tmp_path / "ck" / "step-000005" / ".metadata"
    meta.write_bytes(pickle.dumps(Payload()) if metadata == "pickle" else metadata)
    target, target_opt = model_and_opt(1)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ValueError, match="checkpoint"):
        checkpoint.load(tmp_path / "ck", model=target, optimizer=target_opt)
    assert not (tmp_path / "PWNED").exists()
    torch.testing.assert_close(target.state_dict(), before)
