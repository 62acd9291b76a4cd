"""GPU checks and measurements (``bench/gpu.sh``): one report, ``bench/results/gpu.json``.

On one GPU (a world of 1 on NCCL, backend ``cpu:gloo,cuda:nccl``), in under 8 minutes:

1. every strategy (DDP, FSDP2, TP, PP) against a single process on the same GPU (assert_close), in fp32
   and, where the GPU does bf16 natively, in bf16;
2. the abort: with 2+ GPUs a rank blocked in an NCCL all_reduce (and ``.item()``) is released by an abort
   from a background thread, and the engine keeps its state and re-forms; with one GPU the abort from a
   thread ends every group (a mesh, a subgroup) and the engine re-forms with its state;
3. NVML: the rank's GPU found by the UUID recorded at join, one read's cost, samples/s with sampling
   off / every 1 s / every 0.05 s;
4. the dashboard's communication bar: comm time over step time of a DDP step (CUDA events);
5. FSDP sharding a model still on the CPU: peak GPU memory over the model's size;
6. throughput of one rank vs ``torchrun`` (NCCL, world of 1);
7. ``pytest -m gpu``.

Needs a CUDA build of torch and a visible GPU; refuses to run without them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench.common import BENCH, RESULTS, ROOT, load_now, machine, summary, versions
from bench.training import _torchrun

# the same CPU threads as the workbench gives a lone rank (every core of the host)
_THREADS = str(os.cpu_count() or 1)
NCCL_ENV = {"BENCH_BACKEND": "nccl", "OMP_NUM_THREADS": _THREADS, "BENCH_THREADS": _THREADS}
PYTEST_TIMEOUT_S = 170


def _part(record: dict, name: str, fn, *args) -> None:
    """Run one part; a failure is recorded and the others still run (one report either way)."""
    t0 = time.time()
    try:
        record[name] = fn(*args)
    except Exception as exc:
        record[name] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    print(f"== {name} ({time.time() - t0:.0f} s): {json.dumps(record[name], default=str)[:600]}", flush=True)


def strategies(s) -> dict:
    s.run("import torch\nbf16_native = torch.cuda.is_bf16_supported(including_emulation=False)\n"
          "fp32 = gpu_cells.compare_strategies(device, 'fp32')\n"
          "bf16 = gpu_cells.compare_strategies(device, 'bf16') if bf16_native else 'not native on this GPU'")
    return {"fp32": s.pull("fp32", rank=0), "bf16": s.pull("bf16", rank=0),
            "bf16_native": s.pull("bf16_native", rank=0)}


def abort_one_gpu(s) -> dict:
    pid = s.ranks[0].pid
    s.run("kept = torch.arange(4.0, device=device)\nabort = gpu_cells.abort_from_a_thread(device)")
    out = s.pull("abort", rank=0)
    t0 = time.perf_counter()
    s.restart()  # no dead rank: re-forms the group
    out["reform_s"] = time.perf_counter() - t0
    s.run("t = torch.ones(2, device=device)\ndist.all_reduce(t)\nafter = (t.tolist(), kept.sum().item())")
    out["after_reform"] = s.pull("after", rank=0)
    out["same_engine"] = s.ranks[0].pid == pid
    return out


def abort_blocked(hold_s: float = 8.0) -> dict:
    """Two GPUs: rank 0 blocked in an NCCL collective, released by an abort from its own background thread."""
    from workbench import Session

    with Session(n=2, timeout=120) as s:
        pids = [r.pid for r in s.ranks]
        s.run(f"import sys, torch\nsys.path.insert(0, {str(BENCH)!r})\nimport gpu_cells\n"
              "kept = torch.full((2,), float(rank), device=device)")
        t0 = time.perf_counter()
        s.run(f"blocked = gpu_cells.blocked_then_aborted(device, rank, hold_s={hold_s})", timeout=120)
        out = {"cell_s": time.perf_counter() - t0, "ranks": s.pull("blocked")}
        s.restart()
        s.run("t = torch.ones(1, device=device)\ndist.all_reduce(t)\nafter = (t.item(), kept.tolist())")
        out["after_reform"] = s.pull("after")
        out["same_engines"] = [r.pid for r in s.ranks] == pids
    return out


def nvml(s, rounds: int, steps: int) -> dict:
    """The sampler by the join's UUID, one read's cost, and samples/s with sampling off / 1 s / 0.05 s."""
    from workbench import remote

    url = s.pool.channel  # the side channel the publishers send up
    s.run("trainer_n = loop.build('mlp', device=device)")
    settings = {"off": None, "sampling 1 s": 1.0, "sampling 0.05 s": 0.05}
    rates: dict[str, list[float]] = {k: [] for k in settings}
    try:
        for i in range(rounds):
            names = list(settings) if i % 2 == 0 else list(reversed(settings))
            for name in names:
                s.apply(remote.disconnect_metrics)
                if settings[name] is not None:
                    s.apply(remote.connect_metrics, url, sample_interval=settings[name])
                s.run(f"loop.set_metrics(trainer_n, {settings[name] is not None})")
                s.run(f"r = loop.measure(trainer_n, steps={steps})")
                rates[name].append(s.pull("r", rank=0)["samples_per_s"])
        s.run(
            "from workbench.engine import rendezvous\nfrom workbench.metrics.sampler import make_sampler\n"
            "import time as _t\n_s = make_sampler(str(device), uuid=rendezvous.identity()['gpu_uuid'])\n"
            "_t0 = _t.perf_counter()\nfor _ in range(200):\n    _s.read()\n"
            "read_us = (_t.perf_counter() - _t0) / 200 * 1e6\nsampler_info = _s.info()\n_s.close()"
        )
        read_us, info = s.pull("read_us", rank=0), s.pull("sampler_info", rank=0)
    finally:
        s.apply(remote.disconnect_metrics)
        s.apply(remote.connect_metrics, url)
    res = {k: summary(v, 1, 1) for k, v in rates.items()}
    off = res["off"]["median"]
    res["ratio_to_off"] = {k: round(v["median"] / off, 3) for k, v in res.items() if "median" in v}
    res["nvml_read_us"] = round(read_us, 1)
    res["sampler"] = info
    res["gpu_uuid_at_join"] = s.ranks[0].gpu_uuid
    return res


def comm_and_memory(s) -> dict:
    s.run("trainer_c = loop.build('mlp', device=device)\ncomm = gpu_cells.comm_share(trainer_c, steps=50)\n"
          "del trainer_c\nfsdp_peak = gpu_cells.fsdp_peak_ratio(device)")
    return {"dashboard_comm_bar": s.pull("comm", rank=0), "fsdp_shard_peak": s.pull("fsdp_peak", rank=0)}


def throughput(s, rounds: int, steps: dict[str, int]) -> dict:
    out = {}
    for model, n in steps.items():
        s.run(f"trainer_{model} = loop.build({model!r}, device=device)")
        rates: dict[str, list[float]] = {"workbench (one cell)": [], "torchrun": []}
        for i in range(rounds):
            for side in ("ours", "torchrun") if i % 2 == 0 else ("torchrun", "ours"):
                if side == "ours":
                    s.run(f"r = loop.measure(trainer_{model}, steps={n})")
                    rates["workbench (one cell)"].append(s.pull("r", rank=0)["samples_per_s"])
                else:
                    got = _torchrun(["train", model, str(n)], nproc=1, env=NCCL_ENV)
                    rates["torchrun"].append(got["samples_per_s"])
        s.run(f"del trainer_{model}")
        res = {k: summary(v, 1, 1) for k, v in rates.items()}
        res["ratio_to_torchrun"] = round(res["workbench (one cell)"]["median"] / res["torchrun"]["median"], 3)
        out[model] = res
    return out


def gpu_tests() -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests"]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=PYTEST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"returncode": None, "summary": f"pytest -m gpu ran past {PYTEST_TIMEOUT_S} s"}
    lines = done.stdout.strip().splitlines()
    return {"returncode": done.returncode, "summary": lines[-1] if lines else "",
            "failures": [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round, few steps (a smoke run)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device (or a CPU build of torch): nothing to measure.", file=sys.stderr)
        return 2
    from workbench import Session

    rounds, steps = (1, {"mlp": 20, "gpt": 5}) if args.quick else (3, {"mlp": 300, "gpt": 60})
    t0 = time.time()
    record = {"benchmark": "gpu", "machine": machine(), "versions": versions(),
              "date": time.strftime("%F %T %z"), "gpu": torch.cuda.get_device_name(0),
              "gpus": torch.cuda.device_count(),
              "load_average": {"start": load_now()}}
    s = Session(n=1, timeout=120).start(progress=print)
    try:
        s.run(f"import sys, torch\nsys.path.insert(0, {str(BENCH)!r})\nimport loop, gpu_cells")
        record["backend"], record["rank0"] = s.backend, s.ranks[0].__dict__
        _part(record, "strategies", strategies, s)
        _part(record, "dashboard_and_memory", comm_and_memory, s)
        _part(record, "nvml", nvml, s, rounds, steps["mlp"])
        _part(record, "throughput", throughput, s, rounds, steps)
        _part(record, "abort_one_gpu", abort_one_gpu, s)
    finally:
        s.stop()
    if torch.cuda.device_count() >= 2:
        _part(record, "abort_blocked_nccl_rank", abort_blocked)
    else:
        record["abort_blocked_nccl_rank"] = {"skipped": "needs 2 GPUs (NCCL refuses two ranks on one GPU)"}
    _part(record, "pytest_gpu", gpu_tests)
    record["load_average"]["end"] = load_now()
    record["seconds"] = round(time.time() - t0, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gpu.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"bench/gpu.py: {record['seconds']} s, report in {RESULTS / 'gpu.json'}")
    failed = [k for k, v in record.items() if isinstance(v, dict) and "error" in v]
    return 1 if failed or record["pytest_gpu"].get("returncode") else 0


if __name__ == "__main__":
    sys.exit(main())
