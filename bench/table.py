"""The Markdown table of ``bench/results/*.json`` (``python -m bench.table [DIR]`` prints it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.common import RESULTS, fmt


def load(folder: Path) -> dict:
    """The records of :mod:`bench.run` in ``folder`` (files of another shape, e.g. a one-off's, skipped)."""
    out = {}
    for f in sorted(folder.glob("*.json")):
        try:
            rec = json.loads(f.read_text())
        except ValueError:
            continue
        if isinstance(rec.get("load_average"), dict) and "data" in rec:
            out[f.stem] = rec
    return out


def _mmm(s: dict | None, unit: str = "") -> str:
    if not s or s.get("median") is None:
        return "-"
    return f"{fmt(s['median'], unit)} ({fmt(s['min'])}-{fmt(s['max'])})"


def _x(ours, theirs) -> str:
    """How many times ours' time theirs is (above 1: ours is faster)."""
    if not ours or theirs is None or ours.get("median") in (None, 0) or theirs.get("median") is None:
        return "-"
    return f"{theirs['median'] / ours['median']:.2f}"


def render(folder: Path = RESULTS) -> str:
    r = load(folder)
    if not r:
        return "no results yet: run `make bench`.\n"
    any_rec = next(iter(r.values()))
    m = any_rec["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Measured {any_rec['date']} on {m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB, "
        f"Python {m['python']}; torch {any_rec['versions']['workbench env'].get('torch')}, "
        f"ipyparallel {any_rec['versions']['workbench env'].get('ipyparallel')}. "
        f"Anchors: {any_rec['anchors']}"
        + (f" ({_anchor_versions(any_rec)})" if any_rec["anchors"] == "ok" else "")
        + ".",
        "Load average (1/5/15 min) per benchmark, start -> end: "
        + "; ".join(
            f"{k} {v['load_average']['start'][0]}->{v['load_average']['end'][0]}" for k, v in r.items()
        )
        + ". Medians, (min-max); reproduce with `make bench`.",
        "",
    ]
    if any_rec.get("quick"):
        lines += ["**Quick run (smoke test sizes): not figures to quote.**", ""]
    if "cells" in r:
        lines += _cells(r["cells"])
    if "ready" in r:
        lines += _ready(r["ready"])
    if "training" in r:
        lines += _training(r["training"])
    if "dashboard" in r:
        lines += _dashboard(r["dashboard"])
    if "allreduce" in r:
        lines += _allreduce(r["allreduce"])
    if "memory" in r:
        lines += _memory(r["memory"])
    if "recovery" in r:
        lines += _recovery(r["recovery"])
    if "elastic" in r:
        lines += _elastic(r["elastic"], r.get("recovery"))
    if "scale" in r:
        lines += scale_table(r["scale"])
    if "faults" in r:
        lines += faults_table(r["faults"])
    if "submesh" in r:
        lines += _submesh(r["submesh"])
    if "goodput" in r:
        lines += goodput_table(r["goodput"])
    return "\n".join(lines) + "\n"


def _anchor_versions(rec) -> str:
    v = rec["versions"].get("anchors env")
    return ", ".join(f"{k} {x}" for k, x in v.items() if k != "torch") if isinstance(v, dict) else ""


def _error(rec) -> list[str]:
    data = rec.get("data", rec)  # a record of bench.run, or a benchmark's own result
    return [f"_failed: {data['error'].strip().splitlines()[-1]}_", ""] if "error" in data else []


def _cells(rec) -> list[str]:
    d = rec["data"]
    out = [
        "## Trivial cell (`x = 1`) on 2 ranks, ms",
        "",
        "| path | median (min-max) | runs | x ours |",
        "| --- | --- | --- | --- |",
    ] + _error(rec)
    for group, ours_key in (
        ("in_process", "workbench %%distributed"),
        ("ipykernel", "workbench %%distributed (ipykernel)"),
    ):
        if group not in d:
            continue
        res = d[group]["results"]
        ours = res.get(ours_key)
        for name, s in res.items():
            out.append(f"| `{name}` | {_mmm(s)} | {s['n']} | {_x(ours, s)} |")
        for name, note in d[group].get("notes", {}).items():
            out.append(f"| `{name}` | {note} | - | - |")
    out += [
        "",
        "_x ours: their median / ours (above 1: ours is faster). In-process: an IPython shell in the "
        "benchmark process; ipykernel: a real kernel driven by jupyter_client, request to reply + idle._",
        "",
    ]
    return out


def _ready(rec) -> list[str]:
    d = rec["data"]
    out = [
        "## Time to ready (nothing -> 2-rank group, all_reduce verified) and to stop, s",
        "",
        "| tool | ready | of which import | stop | x ours (ready) | leftover processes |",
        "| --- | --- | --- | --- | --- | --- |",
    ] + _error(rec)
    ours = d.get("workbench", {}).get("ready_s")
    for name, row in d.items() if isinstance(d, dict) and "error" not in d else ():
        err = f" ({len(row['errors'])} failed: {row['errors'][0][:80]})" if row.get("errors") else ""
        out.append(
            f"| {name} | {_mmm(row['ready_s'])}{err} | {_mmm(row.get('import_s'))} | {_mmm(row['stop_s'])} | "
            f"{_x(ours, row['ready_s'])} | {row['leftover_processes']} |"
        )
    for name, since in (("workbench", "`import workbench`"), ("workbench, spare ready", "`%dist start`")):
        marks = d.get(name, {}).get("marks") if isinstance(d, dict) and "error" not in d else None
        if marks:
            out += ["", f"Where one `{name}` start went (s since {since}): "
                    + ", ".join(f"{m} {t}" for m, t in marks) + "."]
    return out + [""]


def _training(rec) -> list[str]:
    d = rec["data"]
    out = [
        "## Training throughput, DDP on 2 CPU ranks (gloo, 1 thread each), samples/s",
        "",
        "| model | how | median (min-max) | x torchrun |",
        "| --- | --- | --- | --- |",
    ] + _error(rec)
    for model, res in d.items() if "error" not in d else ():
        for name, s in res.items():
            if isinstance(s, dict) and "median" in s:
                out.append(f"| {model} | {name} | {_mmm(s)} | {res['ratio_to_torchrun'].get(name, '-')} |")
    out += [
        "",
        '_The same loop (`bench/loop.py`) timed on rank 0 on both sides; "end to end" divides by the '
        "cell's wall time in the kernel instead (cell overhead included)._",
        "",
    ]
    return out


def _dashboard(rec) -> list[str]:
    d = rec["data"]
    if "error" in d:
        return ["## Live dashboard on vs off", ""] + _error(rec)
    bare, lab = d.get("no browser", {}), d.get("browser", {})
    cols = [("no browser", bare), ("JupyterLab + Chromium rendering it", lab)]
    shown = [(name, c) for name, c in cols if "on" in c]
    out = [
        "## Live dashboard on vs off (MLP, 2 ranks, samples/s)",
        "",
        "| dashboard | " + " | ".join(name for name, _ in shown) + " |",
        "| --- |" + " --- |" * len(shown),
        "| off | " + " | ".join(_mmm(c["off"]) for _, c in shown) + " |",
        "| on | " + " | ".join(_mmm(c["on"]) for _, c in shown) + " |",
        "| **on / off** | " + " | ".join(f"**{c['ratio_on_to_off']}**" for _, c in shown) + " |",
        "",
    ]
    for name, c in cols:
        if "error" in c or "skipped" in c:
            out += [f"_{name}: {c.get('error') or c['skipped']}_", ""]
    lat = bare.get("loss_point_to_widget_s")
    if lat:
        out += [f"A loss point reaches the widget in {_mmm(lat, 's')}, p95 {lat.get('p95', '-')} s "
                f"({lat['n']} points).", ""]
    cpu = lab.get("cpu_per_s")
    if cpu:
        parts = ", ".join(f"{part} {cpu['off'][part]['median']} -> {cpu['on'][part]['median']}"
                          for part in cpu["on"])
        out += [f"CPU seconds per second of a round, off -> on (medians): {parts}.", ""]
    return out


def _allreduce(rec) -> list[str]:
    d = rec["data"]
    out = [
        "## all_reduce, 2 ranks, gloo on loopback: algorithm bandwidth GB/s",
        "",
        "| size | workbench | raw gloo (2 processes) | x raw | latency us (wb / raw) |",
        "| --- | --- | --- | --- | --- |",
    ] + _error(rec)
    for size, row in d.get("sizes", {}).items():
        lat = row["latency_us"]
        out.append(
            f"| {size} | {_mmm(row['workbench'])} | {_mmm(row['raw gloo'])} | {row['ratio_to_raw']} | "
            f"{lat['workbench']} / {lat['raw gloo']} |"
        )
    return out + [""]


def _memory(rec) -> list[str]:
    d = rec["data"]
    if "error" in d:
        return ["## Memory", ""] + _error(rec)
    rows = [("workbench engine (torch, group formed, metrics on)", d["workbench engine (each rank)"][0]),
            ("the pool's zygote (one per pool, shared by its engines)", d.get("zygote (one per pool)")),
            ("bare python + `import torch`", d["bare python + import torch"]),
            ("torchrun worker (rank 0, group formed)", d.get("torchrun worker (rank 0)"))]
    out = ["## Memory of one rank, MiB", "", "| process | RSS | USS | PSS |", "| --- | --- | --- | --- |"]
    out += [f"| {name} | {m['rss_mib']} | {m['uss_mib']} | {m['pss_mib']} |" for name, m in rows if m]
    if "pool pss per rank" in d:
        out += ["", "The pool's PSS per rank (its engines and zygote, shared pages split among them): "
                f"{d['pool pss per rank']} MiB. Helper processes per engine: "
                f"{d['helper processes per engine']}."]
    return out + [""]


def _submesh(rec) -> list[str]:
    d = rec["data"]
    if "error" in d:
        return ["## Sub-meshes", ""] + _error(rec)
    return [
        "## Sub-meshes on a 4-rank pool (docs/submeshes.md)",
        "",
        "| what | median (min-max) |",
        "| --- | --- |",
        f"| split 2 + 2, s | {_mmm(d['split_2_2_s'])} |",
        f"| split 1 + 1 + 1 + 1, s | {_mmm(d['split_1_1_1_1_s'])} |",
        f"| join, s | {_mmm(d['join_s'])} |",
        f"| re-form of the group after a fault (abort + form), s | {_mmm(d['reform_s'])} |",
        f"| {d['steps']} steps (all_reduce + {d['sleep_s']:g} s sleep) on one 2-rank sub-mesh, s | "
        f"{_mmm(d['alone_s'])} |",
        f"| the same on both sub-meshes at once, s | {_mmm(d['both_s'])} |",
        f"| **both / alone** (1: side by side, 2: one after the other) | {_mmm(d['ratio'])} |",
        *([f"| `wb.Sweep` of 4 such trials on 2-rank sub-meshes (its split and join included), s | "
           f"{_mmm(d['sweep_4_s'])} |",
           "| **sweep / alone** (2: two trials at a time, 4: one after the other) | "
           f"{_mmm(d['sweep_ratio'])} |"]
          if "sweep_4_s" in d else []),
        *([f"| elastic regroup after a `kill -9` of 1 of the 4 (the group of 3 formed, state synced), s | "
           f"{_mmm(d['elastic_regroup_s'])} |",
           "| the same: `kill -9` to the next step of the elastic run, s | "
           f"{_mmm(d['elastic_kill_to_step_s'])} |"]
          if "elastic_regroup_s" in d else []),
        "",
    ]


def _recovery(rec) -> list[str]:
    d = rec["data"]
    if "error" in d:
        return ["## Recovery", ""] + _error(rec)
    ph = d["phases"]
    return [
        "## Recovery: kill -9 of rank 1 during training, s",
        "",
        "| phase | median (min-max) |",
        "| --- | --- |",
        f"| kill -> cell fails naming rank 1 (survivor stopped) | {_mmm(ph['detected_s'])} |",
        f"| `Session.restart()` (new engine, group re-formed) | {_mmm(ph['restart_s'])} |",
        f"| rebuild trainer + load checkpoint + first step | {_mmm(ph['resume_s'])} |",
        f"| **kill -> training resumed** | {_mmm(ph['total_s'])} |",
        "",
        f"_Resumed from step {d['resumed_from_step']} (checkpoint every {d['checkpoint_every']} steps)._"
        + (f" Notes: {'; '.join(d['notes'])}" if d["notes"] else ""),
        "",
    ]


def _elastic(rec, recovery) -> list[str]:
    d = rec["data"]
    if "error" in d:
        return ["## Elastic training: a rank lost mid-run", ""] + _error(rec)
    restart = (recovery or {}).get("data", {}).get("phases", {}).get("total_s")
    return [
        f"## Elastic training: kill -9 of one of {d['ranks']} ranks mid-run, s",
        "",
        "| path | kill -> next completed step | samples lost / doubled |",
        "| --- | --- | --- |",
        f"| `Trainer(elastic=True)`: the run goes on without the rank | {_mmm(d['kill_to_step_s'])} | "
        f"{d['samples_lost']} / {d['samples_doubled']} |",
        f"| today's path: the cell fails, `%dist restart`, resume from the checkpoint (above) | "
        f"{_mmm(restart)} | the steps since the checkpoint are taken again |",
        "",
        f"_{d['reps']} kills; bringing the rank back afterwards (`Session.restart()`, its setup replayed): "
        f"{_mmm(d['restart_s'])} s._" + (f" Notes: {'; '.join(d['notes'])}" if d["notes"] else ""),
        "",
    ]


def scale_table(rec) -> list[str]:
    """The scale sweep (:mod:`bench.scale`): a row per pool size. First cells: ours beside a bare
    ``ipyparallel.Cluster`` started in the same process; settled cells: ours beside ``%%px`` on the same
    engines, in alternating blocks."""
    d = rec["data"] if "data" in rec else rec
    sizes = d.get("sizes") or {}
    load = rec.get("load_average") or {}
    out = [
        "## Scale: N ranks on this machine (cold start, `--oversubscribe`)",
        "",
        f"Load average over the sweep: {load.get('start', ['?'])[0]} -> {load.get('end', ['?'])[0]} (per "
        "size in the last column); the ratios within one size are what count.",
        "",
        "First cells: ours vs a bare `ipyparallel.Cluster` (which forms no process group).",
        "",
        "| ranks | ready s: ours / ipyparallel | first 10 cells ms: ours / `%%px` | first-cell kernel CPU "
        "ms: ours / `%%px` | kernel RSS MiB | load |",
        "|" + " --- |" * 6,
    ] + _error(rec)
    for n, row in sizes.items():
        if "skipped" in row or "error" in row:
            out.append(f"| {n} | {'skipped' if 'skipped' in row else 'failed'}: "
                       f"{(row.get('skipped') or row.get('error'))[:160]} |" + " |" * 4)
            continue
        ipp_first = (row.get("ipp_first_cells_ms") or {}).get("median")
        ipp_ready = "failed" if "ipp_error" in row else fmt(row.get("ipp_ready_s"))
        out.append(
            f"| {n} | {fmt(row['ready_s'])} / {ipp_ready} | "
            f"{fmt(row['first_cells_ms']['median'])} / {fmt(ipp_first)} | "
            f"{fmt(row['first_cells_kernel_cpu_ms'])} / {fmt(row.get('ipp_first_cells_kernel_cpu_ms'))} | "
            f"{fmt(row['kernel_rss_mib'])} | {row['load_start'][0]}->{row['load_end'][0]} |")
    out += [f"\nThe bare ipyparallel cluster of {n} failed to start: {row['ipp_error']}"
            for n, row in sizes.items() if "ipp_error" in row]
    out += [
        "",
        "Settled cells (30 s after the start): ours vs `%%px` on the same engines; kernel CPU from "
        "`getrusage`, every thread of the kernel's process.",
        "",
        "| ranks | trivial cell ms: ours / `%%px` | kernel CPU per cell ms: ours / `%%px` (ratio) | print "
        "on every rank ms: ours / `%%px` | its kernel CPU ms (ratio) | pull ms: ours / DirectView | pool "
        "CPU per cell ms: ours / `%%px` | idle pool CPU % of a core: ours / ipyparallel |",
        "|" + " --- |" * 8,
    ]
    for n, row in sizes.items():
        if "skipped" in row or "error" in row:
            continue
        t, tp, p, pp = row["trivial_ours"], row["trivial_ipp"], row["print_ours"], row["print_ipp"]
        out.append(
            f"| {n} | {fmt(t['ms']['median'])} / {fmt(tp['ms']['median'])} | {fmt(t['kernel_cpu_ms'])} / "
            f"{fmt(tp['kernel_cpu_ms'])} ({_ratio(t['kernel_cpu_ms'], tp['kernel_cpu_ms'])}) | "
            f"{fmt(p['ms']['median'])} / {fmt(pp['ms']['median'])} | {fmt(p['kernel_cpu_ms'])} / "
            f"{fmt(pp['kernel_cpu_ms'])} ({_ratio(p['kernel_cpu_ms'], pp['kernel_cpu_ms'])}) | "
            f"{fmt(row['pull_ours']['ms']['median'])} / {fmt(row['pull_ipp']['ms']['median'])} | "
            f"{fmt(t['pool_cpu_ms'])} / {fmt(tp['pool_cpu_ms'])} | {fmt(row['idle_pool_cpu_pct'])} / "
            f"{fmt(row.get('ipp_idle_pool_cpu_pct'))} |")
    idle = [f"- {n} ranks: " + ", ".join(f"`{name}` {fmt(t['pct'])} ({t['threads']})"
                                         for name, t in row["idle_threads"].items() if t["pct"] > 0)
            for n, row in sizes.items() if row.get("idle_threads")]
    if idle:
        out += ["", "What an idle pool's CPU goes to, by thread name (% of a core, and how many such "
                "threads; `gloo_tcp_loop` is gloo's transport loop, which wakes every 10 ms in each rank "
                "whatever the group does; `... main`: the processes' main threads, the others carry the "
                "process's name):", "", *idle]
    return out + fanout_table(d.get("fanout")) + [""]


def fanout_table(d: dict | None) -> list[str]:
    """Fan-out per host (:mod:`bench.fanout`, issue 42): the three cells at each N with hubs off (before:
    a request and replies per rank) and on (after: one request, one merged reply per host), alternating."""
    if not d:
        return []
    from bench.fanout import table

    return ["", "### Fan-out per host: hubs off (before) and on (after), settled cells, medians", "",
            "Kernel CPU from `getrusage` (every thread of the kernel's process), per cell.", ""] + \
        (_error({"data": d}) or [table(d.get("runs") or [])])


def _ratio(ours, theirs) -> str:
    return f"{ours / theirs:.2f}x" if ours is not None and theirs else "-"


def faults_table(rec) -> list[str]:
    """A rank killed at scale (:mod:`bench.faults_at_scale`): a row per kill, then the elastic run."""
    d = rec["data"] if "data" in rec else rec
    kill = d.get("kill") or {}
    out = [f"## A rank killed in a {kill.get('n', '?')}-rank pool", ""] + _error(rec)
    if "error" in kill:
        return out + [f"failed: {kill['error'][:300]}", ""]
    out += [
        "Seconds after the `kill -9`, the machine's clock on both sides; aborted/released: median / max "
        "over the other ranks.",
        "",
        "| kill | named | abort sent | others aborted | others released | cell raised | one rank named "
        "| load |",
        "|" + " --- |" * 8,
    ]
    for i, k in enumerate(kill.get("kills", []), 1):
        if "error" in k:
            out.append(f"| {i} (rank {k['victim']}) | {k['error'][:160]} |" + " |" * 6)
            continue
        ab, rel = k["aborted_s"] or {}, k["released_s"] or {}
        out.append(
            f"| {i} (rank {k['victim']}) | {fmt(k['named_s'])} | {fmt(k['abort_sent_s'])} | "
            f"{fmt(ab.get('median'))} / {fmt(ab.get('max'))} | {fmt(rel.get('median'))} / "
            f"{fmt(rel.get('max'))} | {fmt(k['cell_s'])} | {'yes' if k['one_rank_named'] else 'no'} | "
            f"{k['load'][0]} |")
    el = d.get("elastic")
    if el:
        out += ["", f"Elastic Trainer, {el['ranks']} ranks: kill -> next completed step "
                f"{_mmm(el['kill_to_step_s'])} s over {el['kill_to_step_s'].get('n')} kills; samples lost "
                f"{el['samples_lost']}, doubled {el['samples_doubled']}; load {el['load'][0][0]} -> "
                f"{el['load'][1][0]}."
                + (f" Notes: {'; '.join(el['notes'])}" if el["notes"] else "")]
    return out + [""]


if __name__ == "__main__":
    print(render(Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS))



def goodput_table(rec) -> list[str]:
    """Goodput under a kill every N seconds (:mod:`bench.goodput`), then the figures others publish."""
    from bench.goodput import PUBLISHED

    d = rec["data"]
    head = "## Goodput: an elastic run under a kill -9 every N s"
    if "error" in d:
        return [head, ""] + _error(rec)

    def spread(s: dict) -> str:
        if not s or s.get("median") is None:
            return "-"
        return f"{fmt(s['median'])} / {fmt(s['p90'])} / {fmt(s['max'])}"

    out = [
        f"{head} ({d['ranks']} gloo ranks, {d['steps']} steps, `replace=True`, {len(d['rounds'])} rounds)",
        "",
        "| run | goodput: median (min-max) over the rounds | faults injected (fault records) "
        "| kill -> next step, s: median / p90 / max | kill -> back at full size, s: median / max "
        "| each sample once | largest size |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| fault-free | 1.0 ({_mmm(d['summary']['fault-free']['steps_per_s'])} steps/s) | 0 | - | - | "
        f"{'yes' if all(r['fault-free'].get('each_sample_once') for r in d['rounds']) else 'no'} | "
        f"{max(r['fault-free'].get('largest_size', 0) for r in d['rounds'])} |",
    ]
    for name, row in d["summary"].items():
        if name == "fault-free":
            continue
        full = row["kill_to_full_size_s"]
        back = "-" if full.get("median") is None else f"{fmt(full['median'])} / {fmt(full['max'])}"
        if row["kills_not_back_at_full_size_by_the_end"]:
            back += f" ({row['kills_not_back_at_full_size_by_the_end']} not back by the run's end)"
        failed = f" (failed: {'; '.join(e[:80] for e in row['failed'])})" if row["failed"] else ""
        out.append(
            f"| a kill {name}{failed} | {_mmm(row['goodput'])} "
            f"| {row['faults_injected']} ({row['fault_records']}) "
            f"| {spread(row['kill_to_step_s'])} | {back} | {'yes' if row['each_sample_once'] else 'no'} "
            f"| {row['largest_size']} |")
    out += ["", "Each round (steps/s, goodput, the 1-minute load average at the run's start):", ""]
    for i, rnd in enumerate(d["rounds"], 1):
        runs = [("fault-free", rnd["fault-free"]), *rnd["runs"].items()]
        out.append(f"- round {i}: " + "; ".join(
            f"{name} {fmt(row.get('steps_per_s'))} steps/s"
            + (f" ({row['goodput']})" if "goodput" in row else "")
            + f" at load {row.get('load_average', ['?'])[0]}"
            + ("" if row.get("each_sample_once", True) else f", samples: {row.get('check', '')}")
            for name, row in runs))
    out += [
        "",
        "_Goodput: steps/s from the first step to the last against the fault-free run's, the same job on a "
        "fresh pool in the same bench run. Kill -> next step: to the first step completed by a group without "
        "the killed rank; back at full size: to the first step completed again on all ranks (the replacement "
        "started, replayed the setup and joined). A step is a small MLP in float64 plus a 20 ms pause that "
        "stands for its compute; faults stop at 95 % of the steps. Reproduce: `python -m bench.run --only "
        "goodput`._",
        "",
        "Published fault-tolerance figures of others (different hardware, models and scale: the shape of "
        "the measure, not a race):",
        "",
    ] + [f"- {line}" for line in PUBLISHED] + [""]
    return out
