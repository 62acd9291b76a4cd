"""Live dashboard on vs off: samples/s of the same Trainer run, and step-end-to-widget delay.

    .venv/bin/python bench/dashboard_overhead.py [--steps 1500] [--rounds 3]

One 2-engine CPU pool. Rounds alternate "off" (no publisher on the ranks, no dashboard) and "on"
(every rank's publisher and device sampler, a kernel-side Dashboard refreshing every 0.25 s).
Samples/s is each run's samples over its wall time, measured on rank 0 around ``trainer.run``.
The delay is, for every step of every rank, the time from the step's end (engine clock) to the
dashboard refresh that put it in the widget model (kernel clock; same host).
"""

from __future__ import annotations

import argparse
import statistics
import time

from workbench.metrics import remote
from workbench.session import Session
from workbench.widgets.dashboard import Dashboard

SETUP = """
import time, torch
from torch.utils.data import TensorDataset
from workbench.strategies import shard
from workbench.train import MLP, MLPConfig, Trainer, make_loader, regression_data
torch.manual_seed(0)
model = shard(MLP(MLPConfig(d_in=64, d_hidden=128, d_out=8, n_layers=2)), "ddp")
loader = make_loader(TensorDataset(*regression_data(4096, d_in=64, d_out=8)), batch_size=32)
trainer = Trainer(model, loader, lr=1e-3)
trainer.run(steps=50)  # warm up
"""

RUN = """
trainer.callbacks = [c for c in trainer.callbacks if type(c).__name__ != "Publisher"]
if {on}:
    from workbench.metrics.publisher import current
    trainer.callbacks.append(current())
t0 = time.perf_counter()
r = trainer.run(steps={steps})
rate = sum(s.samples for s in r.history) / (time.perf_counter() - t0)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    s = Session(n=2, timeout=60).start()
    try:
        s.run(SETUP)
        warm = Dashboard(s.metrics, run="latest", start=False)
        warm.refresh()  # plotly's first import takes seconds: pay it before measuring, as a notebook has
        warm.close()
        rates = {"off": [], "on": []}
        delays: list[float] = []
        for _ in range(args.rounds):
            for mode in ("off", "on"):
                dash = None
                if mode == "on":
                    s.apply(remote.connect, s.pool.channel)
                    dash = Dashboard(s.metrics, run="next", interval=0.25)
                else:
                    s.apply(remote.disconnect)
                s.run(RUN.format(on=mode == "on", steps=args.steps))
                rates[mode].append(s.pull("rate", rank=0))
                if dash is not None:
                    run = s.metrics.latest_run()
                    s.metrics.wait_for(lambda c, run=run: c.count("step", run.id) >= 2 * args.steps, 30)
                    end = time.monotonic() + 10
                    while len(dash.delays) < 2 * args.steps and time.monotonic() < end:
                        time.sleep(0.05)
                    delays.extend(dash.delays)
                    dash.close()
        off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
        q = statistics.quantiles(delays, n=100)
        print(f"steps per run {args.steps}, rounds {args.rounds}, 2 ranks (gloo, CPU)")
        print(f"samples/s  off: {off:,.0f}  on: {on:,.0f}  on/off: {on / off:.3f}")
        print("  runs off: " + ", ".join(f"{r:,.0f}" for r in rates["off"]))
        print("  runs on:  " + ", ".join(f"{r:,.0f}" for r in rates["on"]))
        print(
            f"step end -> widget delay over {len(delays)} points: p50 {q[49]:.3f} s, p95 {q[94]:.3f} s, "
            f"max {max(delays):.3f} s"
        )
    finally:
        s.stop()


if __name__ == "__main__":
    main()
