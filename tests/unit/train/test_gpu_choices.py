"""Choices the Trainer makes for a GPU, on a fake one: bf16 only where native, flags on the NCCL device."""

from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist

from workbench.train import trainer

pytestmark = pytest.mark.timeout(10)

GPU = torch.device("cuda", 0)


def test_auto_precision_is_bf16_only_where_the_gpu_does_it_natively(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert isinstance(trainer._autocast("auto", GPU), nullcontext)  # emulated bf16 (e.g. a V100): fp32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    with pytest.warns(UserWarning):  # this CPU build of torch has no CUDA autocast to enter
        assert isinstance(trainer._autocast("auto", GPU), torch.autocast)
    assert isinstance(trainer._autocast("auto", torch.device("cpu")), nullcontext)


def test_the_step_flags_live_where_the_group_reduces_them(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")
    assert trainer._flag_device(GPU) == GPU  # an NCCL-only group could not reduce CPU flags at all
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    assert trainer._flag_device(GPU) == torch.device("cpu")
    assert trainer._flag_device(torch.device("cpu")) == torch.device("cpu")


def test_a_cpu_model_goes_to_the_ranks_gpu(monkeypatch):
    from workbench.strategies.compose import rank_device

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert rank_device(torch.device("cpu")) == torch.device("cuda", 3)  # not trained on the CPU over gloo
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    assert rank_device(torch.device("cpu")) == torch.device("cpu")
