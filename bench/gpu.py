"""GPU benchmarks (``bench/gpu.sh``): one rank on CUDA (NCCL, world of 1) vs torchrun, and the
cost of NVML sampling. Writes ``bench/results/gpu.json``.

Needs a CUDA build of torch in ``.venv`` and one visible GPU; refuses to run without them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from bench.common import BENCH, RESULTS, load_now, machine, summary, versions
from bench.training import _torchrun

# the same CPU threads as the workbench gives a lone rank (every core of the host)
_THREADS = str(os.cpu_count() or 1)
NCCL_ENV = {"BENCH_BACKEND": "nccl", "OMP_NUM_THREADS": _THREADS, "BENCH_THREADS": _THREADS}


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


def nvml_overhead(s, rounds: int, steps: int) -> dict:
    """Samples/s with the publisher off, sampling every 1 s (default) and every 0.05 s; one NVML read."""
    from workbench.metrics import remote

    url = s.pool.channel  # the side channel the publishers send up
    s.run("trainer_n = loop.build('mlp', device=device)")
    settings = {"off": None, "sampling 1 s": 1.0, "sampling 0.05 s": 0.05}
    rates: dict[str, list[float]] = {k: [] for k in settings}
    try:
        for i in range(rounds):
            names = list(settings) if i % 2 == 0 else list(reversed(settings))
            for name in names:
                s.apply(remote.disconnect)
                if settings[name] is not None:
                    s.apply(remote.connect, url, sample_interval=settings[name])
                s.run(f"loop.set_metrics(trainer_n, {settings[name] is not None})")
                s.run(f"r = loop.measure(trainer_n, steps={steps})")
                rates[name].append(s.pull("r", rank=0)["samples_per_s"])
        s.run(
            "from workbench.metrics.sampler import make_sampler\nimport time as _t\n"
            "_s = make_sampler(str(device))\n"
            "_t0 = _t.perf_counter()\nfor _ in range(200):\n    _s.read()\n"
            "read_us = (_t.perf_counter() - _t0) / 200 * 1e6\nsampler_kind = _s.info()['kind']"
        )
        read_us, kind = s.pull("read_us", rank=0), s.pull("sampler_kind", rank=0)
    finally:
        s.apply(remote.disconnect)
        s.apply(remote.connect, url)
    res = {k: summary(v, 1, 1) for k, v in rates.items()}
    off = res["off"]["median"]
    res["ratio_to_off"] = {k: round(v["median"] / off, 3) for k, v in res.items() if "median" in v}
    res["nvml_read_us"] = round(read_us, 1)
    res["sampler"] = kind
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device (or a CPU build of torch): nothing to measure.", file=sys.stderr)
        return 2
    from workbench import Session

    rounds, steps = (1, {"mlp": 20, "gpt": 5}) if args.quick else (3, {"mlp": 400, "gpt": 100})
    t0 = time.time()
    record = {
        "benchmark": "gpu",
        "machine": machine(),
        "versions": versions(),
        "date": time.strftime("%F %T %z"),
        "gpu": torch.cuda.get_device_name(0),
        "load_average": {"start": load_now()},
    }
    s = Session(n=1, timeout=120).start(progress=print)
    try:
        s.run(f"import sys\nsys.path.insert(0, {str(BENCH)!r})\nimport loop")
        record["backend"] = s.backend
        record["throughput"] = throughput(s, rounds, steps)
        record["nvml"] = nvml_overhead(s, rounds, steps["mlp"])
    finally:
        s.stop()
    record["load_average"]["end"] = load_now()
    record["seconds"] = round(time.time() - t0, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gpu.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("gpu", "backend", "throughput", "nvml")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
