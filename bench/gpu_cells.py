"""What ``bench/gpu.py`` runs on a GPU rank, and ``tests/gpu`` checks: small, self-timing functions.

Imported on the engines (the cell puts this folder on ``sys.path``) and by the tests (``bench.gpu_cells``).
Every strategy is compared with a single process on the same device, in the same precision.
"""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist

CASES = [("mlp", "ddp"), ("mlp", "fsdp"), ("gpt", "fsdp"), ("gpt", "tp"), ("mlp", "pp")]
STEPS, LR, BATCH = 3, 0.1, 8
TOLERANCE = {"fp32": {"atol": 1e-4, "rtol": 1e-3}, "bf16": {"atol": 2e-2, "rtol": 2e-2}}


def make_model(kind: str):
    from workbench.train import MLP, GPTConfig, MLPConfig, TinyGPT, char_vocab

    torch.manual_seed(0)
    if kind == "mlp":
        return MLP(MLPConfig(d_in=8, d_hidden=16, d_out=4, n_layers=4, expansion=2))
    return TinyGPT(GPTConfig(vocab=char_vocab(), block_size=8, n_layers=2, n_head=2, d_model=16))


def batches(kind: str, device) -> list:
    from workbench.train import char_dataset, regression_data

    if kind == "mlp":
        data = [regression_data(BATCH, d_in=8, d_out=4, seed=s) for s in range(STEPS)]
    else:
        x, y = char_dataset(block_size=8).tensors
        data = [(x[s * BATCH:(s + 1) * BATCH], y[s * BATCH:(s + 1) * BATCH]) for s in range(STEPS)]
    return [(x.to(device), y.to(device)) for x, y in data]


def reference(kind: str, device, precision: str = "fp32") -> dict:
    """Plain SGD in one process on ``device``, under the autocast the Trainer uses for ``precision``."""
    model = make_model(kind).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in batches(kind, device):
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def train_sharded(kind: str, strategy: str, device, precision: str = "fp32") -> dict:
    """The model built on the CPU, sharded (``shard`` puts it on this rank's GPU), trained STEPS steps."""
    from workbench.strategies import shard
    from workbench.train import Trainer, full_state_dict

    model = shard(make_model(kind), strategy)
    Trainer(model, batches(kind, device), optim="sgd", lr=LR, clip=None, precision=precision).run(steps=STEPS)
    return full_state_dict(model)


def compare_strategies(device, precision: str = "fp32") -> dict:
    """Each case of CASES against :func:`reference`: ``{"mlp-ddp": {"ok": True, "max_abs_diff": ...}}``."""
    out = {}
    for kind, strategy in CASES:
        name = f"{kind}-{strategy}"
        try:
            got, want = train_sharded(kind, strategy, device, precision), reference(kind, device, precision)
            diff = max(float((got[k].float() - want[k].float()).abs().max()) for k in want)
            torch.testing.assert_close(got, want, **TOLERANCE[precision])
            out[name] = {"ok": True, "max_abs_diff": diff}
        except Exception as exc:  # one failing case must not hide the others
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return out


def fsdp_peak_ratio(device) -> dict:
    """Peak GPU memory while FSDP shards a model still on the CPU, over the model's size."""
    from workbench.strategies import shard
    from workbench.train import MLP, MLPConfig

    model = MLP(MLPConfig(d_in=256, d_hidden=1024, d_out=16, n_layers=8, expansion=4))
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    shard(model, "fsdp")
    peak = torch.cuda.max_memory_allocated(device) - before
    return {"model_bytes": size, "peak_bytes": peak, "ratio": peak / size}


def comm_share(trainer, steps: int = 50) -> dict:
    """What the dashboard's compute-vs-communication bar shows: comm time over step time, per step."""
    history = trainer.run(steps=steps).history
    shares = sorted(s.comm_time / s.step_time for s in history if s.step_time > 0)
    comm = sorted(s.comm_time for s in history)
    peaks = [s.mem_peak for s in history if s.mem_peak]
    return {"steps": len(history), "comm_share_median": shares[len(shares) // 2],
            "comm_ms_median": comm[len(comm) // 2] * 1e3, "mem_peak_max": max(peaks) if peaks else None}


def abort_from_a_thread(device) -> dict:
    """World of 1: a mesh and a subgroup, then the abort from a background thread ends every group."""
    from torch.distributed import distributed_c10d as c10d

    from workbench.engine import guard
    from workbench.strategies import shard

    shard(make_model("gpt"), "fsdp")
    dist.all_reduce(torch.ones(1, device=device), group=dist.new_group([0]))
    groups = len(c10d._world.pg_map)
    t0 = time.perf_counter()
    aborter = threading.Thread(target=guard.abort, args=([],))
    aborter.start()
    aborter.join(60)
    return {"groups_before": groups, "groups_after": len(c10d._world.pg_map),
            "abort_s": time.perf_counter() - t0, "group_left": dist.is_initialized()}


def blocked_then_aborted(device, rank: int, hold_s: float = 8.0, abort_after_s: float = 2.0) -> dict:
    """World of 2: rank 0 waits in an NCCL all_reduce (then ``.item()``) that rank 1, busy in Python,
    never joins; a background thread on rank 0 (what the engine's agent does) aborts the group."""
    from workbench.engine import guard

    t0 = time.perf_counter()
    if rank == 1:
        time.sleep(hold_s)
        return {"rank": 1, "slept_s": time.perf_counter() - t0}
    threading.Timer(abort_after_s, guard.abort, args=([],)).start()
    try:
        t = torch.ones(1, device=device)
        dist.all_reduce(t)
        outcome = f"returned {t.item()}"  # the CUDA sync waits for the NCCL kernel: the abort ends it
    except Exception as exc:
        outcome = f"raised {type(exc).__name__}"
    return {"rank": 0, "released_s": time.perf_counter() - t0, "outcome": outcome}
