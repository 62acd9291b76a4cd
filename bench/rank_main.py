"""One rank outside the workbench: launched by ``torchrun`` or as a plain process pair (raw gloo).

    torchrun --nproc-per-node 2 bench/rank_main.py train mlp 200 OUT.json
    torchrun --nproc-per-node 2 bench/rank_main.py ready OUT.json
    torchrun --nproc-per-node 2 bench/rank_main.py memory OUT.json   # rank 0's RSS, USS and PSS
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=... \\
        python bench/rank_main.py allreduce 1024,65536 OUT.json

Rank 0 writes a JSON object to OUT; threads are pinned to 1 per rank like the workbench's 2-rank
pool on 2 cores, and gloo stays on loopback.
"""

from __future__ import annotations

import json
import os
import sys
import time

T_START = time.time()
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str]) -> None:
    mode, out = argv[0], argv[-1]
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    backend = os.environ.get("BENCH_BACKEND", "gloo")
    device = None
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(backend, device_id=device)
    result: dict = {"t_start": T_START}
    if mode == "ready":
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == dist.get_world_size()
        result["t_ready"] = time.time()
    elif mode == "memory":  # after a collective, as the workbench's engines are measured
        import psutil

        dist.all_reduce(torch.ones(1))
        m = psutil.Process().memory_full_info()
        result.update({k: round(getattr(m, k, 0) / 2**20, 1) for k in ("rss", "uss", "pss")})
        result = {f"{k}_mib": v for k, v in result.items() if k != "t_start"}
    elif mode == "train":
        import loop

        trainer = loop.build(argv[1], device=device)
        result.update(loop.measure(trainer, steps=int(argv[2])))
    elif mode == "allreduce":
        import loop

        sizes = [int(s) for s in argv[1].split(",")]
        result["seconds"] = {str(k): v for k, v in loop.allreduce_sweep(sizes).items()}
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
