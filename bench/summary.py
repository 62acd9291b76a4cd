"""The Performance page's table: each figure a notebook user feels (issue 14), ours beside the others.

``python -m bench.summary`` prints it from ``bench/results/*.json``; ``make bench`` (``bench.run``) writes it
into docs/performance.md between the ``<!-- bench:summary -->`` markers. Every row says the load average its
benchmark ran at; a row whose benchmark is missing says so.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from bench.common import RESULTS, ROOT, fmt
from bench.table import load

PAGE = ROOT / "docs" / "performance.md"  # the docs site's Performance page
BEGIN, END = "<!-- bench:summary -->", "<!-- /bench:summary -->"
SCALE_MARKERS = ("<!-- bench:scale -->", "<!-- /bench:scale -->")  # the scale sweep's tables


def _med(s: dict | None, unit: str = "") -> str:
    return fmt(s["median"], unit) if s and s.get("median") is not None else "-"


def _load(rec: dict) -> str:
    return f"load {rec['load_average']['start'][0]:g}"


def _ready(rec: dict) -> tuple[str, str]:
    d = rec["data"]
    if "error" in d:
        return "failed", "-"
    ours = [f"{_med(d.get('workbench', {}).get('ready_s'), 's')} cold"]
    if "workbench, spare ready" in d:
        ours.append(f"{_med(d['workbench, spare ready']['ready_s'], 's')} with `%load_ext`'s spare ready")
    others = [f"{name} {_med(row['ready_s'], 's')}" for name, row in d.items()
              if not name.startswith("workbench")]
    return "; ".join(ours), ", ".join(others)


def _cell(rec: dict) -> tuple[str, str]:
    res = rec["data"].get("in_process", {}).get("results", {})
    ours = res.get("workbench %%distributed")
    others = [f"{name} {_med(s, 'ms')}" for name, s in res.items() if not name.startswith("workbench")]
    return _med(ours, "ms"), ", ".join(others)


def _restart(rec: dict) -> tuple[str, str]:
    phases = rec["data"].get("phases", {})
    resumed = _med(phases.get("total_s"), "s")
    return f"{_med(phases.get('restart_s'), 's')} (kill -9 -> training resumed {resumed})", "-"


def _dashboard(rec: dict) -> tuple[str, str]:
    d = rec["data"]
    sides = [f"{d[side]['ratio_on_to_off']} {side}" for side in ("browser", "no browser")
             if "ratio_on_to_off" in d.get(side, {})]
    if "ratio_on_to_off" in d:  # a run from before the browser side existed
        sides.append(f"{d['ratio_on_to_off']} no browser")
    return ("; ".join(sides) + " (on / off, samples/s)" if sides else "-"), "-"


def _memory(rec: dict) -> tuple[str, str]:
    d = rec["data"]
    if "error" in d:
        return "failed", "-"
    engine, bare = d["workbench engine (each rank)"][0], d["bare python + import torch"]
    ours = f"USS {engine['uss_mib']} MiB, PSS {engine['pss_mib']} MiB"
    if d.get("pool pss per rank") is not None:
        ours += f"; pool PSS per rank (engines + zygote) {d['pool pss per rank']} MiB"
    ours += f"; {d.get('helper processes per engine', '?')} helper processes per engine"
    others = f"bare `import torch` USS {bare['uss_mib']} / PSS {bare['pss_mib']} MiB"
    worker = d.get("torchrun worker (rank 0)")
    if worker:
        others += f"; torchrun worker USS {worker['uss_mib']} / PSS {worker['pss_mib']} MiB"
    return ours, others


def _training(rec: dict) -> tuple[str, str]:
    d = rec["data"]
    parts = []
    for model in ("mlp", "gpt"):
        ratios = d.get(model, {}).get("ratio_to_torchrun", {})
        one = ratios.get("workbench %%distributed (one cell)")
        per = ratios.get("workbench, one step per cell (end to end)")
        if one is not None:
            parts.append(f"{model} {one} / {per}")
    return ", ".join(parts) or "-", "torchrun 1.0"


def _allreduce(rec: dict) -> tuple[str, str]:
    lat = rec["data"].get("sizes", {}).get("1 KiB", {}).get("latency_us", {})
    return (f"{lat['workbench']} us" if "workbench" in lat else "-"), (f"raw gloo {lat['raw gloo']} us"
                                                                         if "raw gloo" in lat else "-")


def _goodput(rec: dict) -> tuple[str, str]:
    d = rec["data"]
    if "error" in d:
        return "failed", "-"
    parts = []
    for name, row in d["summary"].items():
        if name != "fault-free":
            parts.append(f"{_med(row['goodput'])} at a kill {name} (kill -> next step "
                         f"{_med(row['kill_to_step_s'], 's')})")
    return "; ".join(parts) or "-", "torchft, Monarch: no goodput figure found (sources: RESULTS.md)"


# (row, result file, how to read it, the aim)
ROWS = [
    ("nothing -> 2-rank group verified", "ready", _ready,
     "<= 1.5 s cold; <= 0.5 s when a pool was started before"),
    ("trivial `%%distributed` cell (`x = 1`)", "cells", _cell, "<= ipyparallel `execute`; stretch <= 3 ms"),
    ("`%dist restart` of one rank", "recovery", _restart, "<= 2 s"),
    ("live dashboard on / off, samples/s", "dashboard", _dashboard,
     ">= 0.99 with a real browser rendering it"),
    ("engine memory", "memory", _memory, "<= bare torch + 30 MiB, no helper process per engine"),
    ("DDP loop, samples/s vs torchrun (one cell / one step per cell)", "training", _training,
     ">= 0.98 / >= 0.95"),
    ("all_reduce 1 KiB latency", "allreduce", _allreduce, "within 10 % of raw gloo"),
    ("goodput of an elastic run (4 ranks, `replace=True`) under a kill -9 every N s", "goodput", _goodput,
     "every step, each sample once; kill -> next step <= 3 s"),
]


def render(folder: Path = RESULTS) -> str:
    results = load(folder)
    lines = ["| what | workbench | the others | aim | measured at |", "| --- | --- | --- | --- | --- |"]
    for what, name, read, aim in ROWS:
        rec = results.get(name)
        if rec is None:
            lines.append(f"| {what} | not measured in this run | - | {aim} | - |")
            continue
        try:
            ours, others = read(rec)
        except (KeyError, TypeError, IndexError) as exc:  # a benchmark whose output changed shape
            ours, others = f"unreadable ({type(exc).__name__}: {exc})", "-"
        lines.append(f"| {what} | {ours} | {others} | {aim} | {rec['date'][:16]}, {_load(rec)} |")
    return "\n".join(lines) + "\n"


def write_page(table: str, page: Path = PAGE, markers: tuple[str, str] = (BEGIN, END)) -> bool:
    """Put ``table`` between the ``markers`` in ``page``; False when the markers are missing.

    >>> write_page("| a |\\n", Path("docs/performance.md"), SCALE_MARKERS)   # doctest: +SKIP
    True
    """
    begin, end = markers
    text = page.read_text()
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        return False
    page.write_text(pattern.sub(lambda _: f"{begin}\n{table}{end}", text))
    return True


if __name__ == "__main__":
    print(render(Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS))
