"""One time-to-ready trial in a fresh process (the project's environment); a JSON line on stdout.

    python bench/ready_trial.py workbench     # Session(n=2).start() + a verifying all_reduce
    python bench/ready_trial.py workbench-warm  # %dist start -n 2 once %load_ext's spare zygote is ready
    python bench/ready_trial.py ipyparallel   # bare ipyparallel.Cluster(n=2) + hand-written rendezvous

Ready: from the tool's first import to an all_reduce that gave the right sum on both ranks, the sums
back in this process as floats (as every tool here returns them: pulling the tensor itself would also
time torch's import into this process, 3 s on 2 cores, which no other tool here does); for
``workbench-warm``, from ``%dist start`` in a shell where ``%load_ext workbench`` ran earlier and its spare
zygote finished loading (what a notebook's second cell meets), through a verifying ``%%distributed`` cell.
Stop: until the tool's stop returned.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def workbench() -> dict:
    t0 = time.time()
    marks: list[tuple[str, float]] = []
    from workbench import Session

    t_import = time.time()
    s = Session(n=2, timeout=120)
    s.start(progress=lambda msg: marks.append((msg, time.time() - t0)))
    t_started = time.time()
    s.run("import torch\nt = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)\ntotal = t.item()")
    total = s.pull("total")  # a float, as the anchors return (a tensor would import torch into this process)
    t_ready = time.time()
    assert total == [3.0, 3.0], total
    s.stop()
    t_stop = time.time()
    return {
        "ready_s": t_ready - t0,
        "import_s": t_import - t0,
        "start_s": t_started - t0,
        "stop_s": t_stop - t_ready,
        "marks": [(m, round(t, 3)) for m, t in marks],
    }


def workbench_warm() -> dict:
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    from workbench import session
    from workbench.pool.processes import spare

    ip = start_ipython()
    ip.run_line_magic("load_ext", "workbench")
    spare.waiting().wait_ready()
    marks: list[tuple[str, float]] = []
    t0 = time.time()
    with capture_output() as shown:
        ip.run_line_magic("dist", "start -n 2")
        done = ip.run_cell("%%distributed\nimport torch\nt = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)\n"
                           "total = t.item()")
        s = session.current()
        total = s.pull("total")
    t_ready = time.time()
    assert done.success and total == [3.0, 3.0], shown.stdout
    marks.append((f"ready: 2 ranks, {s.start_seconds:.2f} s in %dist start", t_ready - t0))
    s.stop()
    return {"ready_s": t_ready - t0, "stop_s": time.time() - t_ready, "marks": marks}


def _join(rank: int, world: int, port: int) -> float:
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    return t.item()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ipyparallel() -> dict:
    t0 = time.time()
    import ipyparallel as ipp

    t_import = time.time()
    cluster = ipp.Cluster(n=2)
    rc = cluster.start_and_connect_sync()
    rc.wait_for_engines(2, timeout=120)
    t_engines = time.time()
    port = rc[rc.ids[0]].apply_sync(_free_port)  # rank 0 picks the port
    futures = [rc[eid].apply_async(_join, rank, 2, port) for rank, eid in enumerate(rc.ids[:2])]
    sums = [f.get(timeout=120) for f in futures]
    t_ready = time.time()
    assert sums == [3.0, 3.0], sums
    rc.close()
    cluster.stop_cluster_sync()
    t_stop = time.time()
    return {
        "ready_s": t_ready - t0,
        "import_s": t_import - t0,
        "engines_s": t_engines - t0,
        "stop_s": t_stop - t_ready,
    }


if __name__ == "__main__":
    real = sys.stdout
    sys.stdout = sys.stderr
    trials = {"workbench": workbench, "workbench-warm": workbench_warm, "ipyparallel": ipyparallel}
    result = trials[sys.argv[1]]()
    real.write(json.dumps(result) + "\n")
