"""Bad degrees fail before any process-group work, naming every factor (no world needed)."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from mp_common import make

from workbench.strategies import ParallelConfig, plan, shard


@pytest.mark.parametrize(("options", "words"), [
    ({"dp": 2, "pp": 3}, ["dp=2", "tp=1", "pp=3", "= 6", "4 ranks"]),
    ({"pp": 4, "dp": 1, "tp": 1}, []),
    ({"dp": 1, "pp": 8, "tp": 1}, ["pp=8", "4 layers", "dp=1 x tp=1 x pp=8 = 8"]),
    ({"strategy": "tp", "tp": 3, "dp": 1}, ["tp=3", "d_hidden * expansion=32"]),
    ({"strategy": "zero"}, ["unknown strategy 'zero'", "ddp", "fsdp", "pp"]),
    ({"data_parallel": "ddp", "tp": 2, "dp": 2}, ["'fsdp'"]),
])
def test_plan_errors_list_every_factor(options, words):
    model = make("mlp")
    if not words:
        assert plan(model, world_size=4, **options).pp == 4
        return
    with pytest.raises(ValueError) as info:
        plan(model, world_size=4, **options)
    for word in words:
        assert word in str(info.value)


def test_shard_rejects_bad_degrees_without_touching_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="dp=3 x tp=1 x pp=1 = 3, but the world has 1 rank:"):
        shard(make("mlp"), dp=3)
    assert not dist.is_initialized()


def test_named_strategies_resolve_to_degrees():
    assert ParallelConfig.from_args(4, "fsdp").degrees == {"dp": 4}
    assert ParallelConfig.from_args(4, "fsdp").data_parallel == "fsdp"
    assert ParallelConfig.from_args(4, "tp", dp=2).degrees == {"dp": 2, "tp": 2}
    assert ParallelConfig.from_args(4, None, dp=2, pp=2).degrees == {"pp": 2, "dp": 2}
    assert ParallelConfig.from_args(4, None, dp=2, pp=2).data_parallel == "fsdp"
    assert ParallelConfig.from_args(2, "ddp").data_parallel == "ddp"


def test_1f1b_with_fewer_microbatches_than_stages_is_refused_up_front():
    from workbench.strategies.parallel_config import ParallelConfig

    with pytest.raises(ValueError, match="microbatches=1 < pp=2"):
        ParallelConfig(dp=1, pp=2, microbatches=1, schedule="1f1b").check(world_size=2, n_layers=4)
    ParallelConfig(dp=1, pp=2, microbatches=1, schedule="gpipe").check(world_size=2, n_layers=4)
