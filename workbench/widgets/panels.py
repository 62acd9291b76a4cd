"""The dashboard's HTML parts: the header line and the device table (pure functions of what the
collector knows). A CPU pool shows no power, temperature or clock columns: it says "no GPU" instead.

>>> print(header_html("run 1 training · step 3", {0: "running"}, [0], 0))  # doctest: +NORMALIZE_WHITESPACE
<div class='workbench-dash-title'><b>run 1 training · step 3</b> ·
<span style='color:#2e7d32'>1 running</span></div>
"""

from __future__ import annotations

import collections
import html
import math

STATE_COLOURS = {"running": "#2e7d32", "idle": "#607d8b", "stalled": "#ef6c00", "failed": "#c62828",
                 "lost": "#c62828", "busy": "#1565c0", "unknown": "#9e9e9e"}


def said_states(status: dict[int, str], words: dict[int, str]) -> dict[int, str]:
    """Each rank's word: the collector's (``status``: it knows training records only) where it knows more
    (running, stalled, a failed cell), else what the pool's controller says (``words``: idle, busy, failed,
    unknown), which knows whether a cell runs and whether the engine is there. The collector's "idle" of a
    rank busy in a cell that trains nothing, or its "lost" of an engine that is back and quiet, is not said.

    >>> said_states({0: "idle", 1: "lost", 2: "running", 3: "idle"}, {0: "busy", 1: "idle", 2: "busy"})
    {0: 'busy', 1: 'idle', 2: 'running', 3: 'idle'}
    """
    return {rank: words.get(rank, word) if word in ("idle", "lost") else word
            for rank, word in status.items()}


def describe(run, step: int, has_points: bool, state: str | None = None, reason: str | None = None) -> str:
    """A run (a collector ``Run``) and how it stands, in words; ``state`` and ``reason`` stand in for the
    run's own (the cell's outcome when a rank never said how its run ended).

    >>> from workbench.metrics.collector import Run
    >>> describe(Run(3, 0.0, ranks={0, 1}, ended={0, 1}, interrupted={0, 1}), 120, True)
    'run 3 interrupted at step 120'
    >>> describe(Run(4, 0.0, ranks={0}), 0, False)
    'run 4 started · waiting for the first step'
    >>> describe(Run(5, 0.0, ranks={0}, errors={0: "OSError: no data"}), 0, False)
    'run 5 failed before its first step: rank 0: OSError: no data'
    """
    if run is None:
        return "no training run yet"
    state = state or run.state
    if state == "failed":
        reason = run.reason or reason or "the cell raised"
        return f"run {run.id} failed: {reason} · last step {step}" if has_points else \
            f"run {run.id} failed before its first step: {reason}"
    if state == "training":
        return f"run {run.id} training · step {step}" if has_points else \
            f"run {run.id} started · waiting for the first step"
    return f"run {run.id} {state} " + (f"at step {step}" if has_points else "before its first step")


def load_colour(percent: float) -> str:
    """Background colour for a load in percent: green (idle) through yellow to red (saturated).

    >>> load_colour(0), load_colour(100), load_colour(float("nan"))
    ('hsl(120, 65%, 85%)', 'hsl(0, 65%, 85%)', '#eeeeee')
    """
    if percent is None or math.isnan(percent):
        return "#eeeeee"
    hue = round(120 * (1 - min(max(percent, 0.0), 100.0) / 100))
    return f"hsl({hue}, 65%, 85%)"


def _bytes(n) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "–"


def _num(v, spec: str, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:{spec}}{unit}"


def _states(status: dict[int, str], ranks) -> str:
    counts = collections.Counter(status.get(r, "idle") for r in ranks)
    return " · ".join(f"<span style='color:{STATE_COLOURS.get(s, '#333')}'>{n} {s}</span>"
                      for s, n in sorted(counts.items()))


def header_html(summary: str, status: dict[int, str], run_ranks: list[int], missing: int) -> str:
    """One line: the run in words, then how many ranks are in each state, then lost records if any."""
    ranks = run_ranks or sorted(status)
    lost = f" · <b style='color:#c62828'>{missing} records missing</b>" if missing else ""
    states = _states(status, ranks)
    return (f"<div class='workbench-dash-title'><b>{html.escape(summary)}</b>"
            f"{' · ' + states if states else ''}{lost}</div>")


STEP_PARTS = {"compute": "#1f77b4", "communication": "#d62728", "data wait": "#ff7f0e", "other": "#bbbbbb"}


def step_time_bars(labels: list[str], parts: dict[str, list[float]], recent: int) -> str:
    """Where each rank's step time goes: one stacked bar per rank, plain HTML (nothing to lay out again
    but the bars when they change).

    >>> html_ = step_time_bars(["rank 0"], {"compute": [0.02], "communication": [0.01], "data wait": [0.0],
    ...                                     "other": [0.0]}, 50)
    >>> "width:66.7%" in html_ and "30.0 ms" in html_
    True
    """
    totals = [sum(parts[name][i] for name in parts) for i in range(len(labels))]
    scale = max(totals, default=0.0) or 1.0
    key = " ".join(f"<span style='color:{STEP_PARTS[name]}'>■</span> {name}" for name in parts)
    rows = []
    for i, label in enumerate(labels):
        segments = "".join(
            f"<div title='{name}: {v[i] * 1e3:.1f} ms' style='width:{v[i] / scale * 100:.1f}%;"
            f"background:{STEP_PARTS[name]}'></div>" for name, v in parts.items() if v[i] > 0)
        rows.append(f"<tr style='white-space:nowrap'><td>{html.escape(label)}</td><td style='width:100%'>"
                    f"<div style='display:flex;height:14px'>{segments}</div></td>"
                    f"<td>{totals[i] * 1e3:.1f} ms</td></tr>")
    return (f"<div class='workbench-step-time'><b>where step time goes</b> <span style='color:#666'>(mean of "
            f"the last {recent} steps)</span> · {key}<table style='width:100%;border-collapse:collapse'>"
            f"{''.join(rows)}</table></div>")


def _reading(sample: dict, info: dict, key: str, spec: str, unit: str) -> str:
    """One reading of a device sample; "not supported" where the device has none (a MIG instance's
    utilisation, power, clock), rather than a 0 or a dash that reads as "no data yet".

    >>> _reading({}, {"unsupported": ["util"]}, "util", ".0f", "%")
    'not supported'
    """
    if key in (info.get("unsupported") or ()):
        return "not supported"
    return _num(sample.get(key), spec, unit)


def device_table(ranks, devices: dict, infos: dict, status: dict, steps: dict) -> str:
    """One row per rank, grouped by host: state, device, utilisation and memory (coloured by load),
    power, temperature and clock where some rank has a GPU, and the rank's last step."""
    any_gpu = any(infos.get(r, ("", {}))[1].get("kind") == "gpu" for r in ranks)
    gpu_cols = ("power", "temp", "clock") if any_gpu else ()
    head = "".join(f"<th>{h}</th>" for h in ("rank", "state", "device", "util", "memory", *gpu_cols, "step"))
    hosts: dict[str, list[int]] = {}
    for r in ranks:
        hosts.setdefault(infos.get(r, ("?", {}))[0] or "?", []).append(r)
    rows = []
    width = 6 + len(gpu_cols)
    for host, host_ranks in hosts.items():
        cell = f"<td colspan='{width}' style='background:#f3f3f3'><b>{html.escape(host)}</b></td>"
        rows.append(f"<tr>{cell}</tr>")
        for r in host_ranks:
            info = infos.get(r, ("", {}))[1]
            d = devices.get(r) or {}
            util = d.get("util", math.nan)
            used, total = d.get("mem_used"), d.get("mem_total", info.get("mem_total"))
            mem_pct = used / total * 100 if used is not None and total and not math.isnan(used) else math.nan
            state = status.get(r, "idle")
            name = html.escape(str(info.get("name") or info.get("device") or "?"))
            gpu = "".join(f"<td>{_reading(d, info, k, '.0f', unit)}</td>" for k, unit in
                          (("power_w", " W"), ("temp_c", " °C"), ("clock_mhz", " MHz"))) if any_gpu else ""
            rows.append(
                f"<tr data-rank='{r}'><td>{r}</td>"
                f"<td style='color:{STATE_COLOURS.get(state, '#333')};font-weight:bold'>{state}</td>"
                f"<td>{name}</td>"
                f"<td style='background:{load_colour(util)}'>{_reading(d, info, 'util', '.0f', '%')}</td>"
                f"<td style='background:{load_colour(mem_pct)}'>{_bytes(used)} / {_bytes(total)}</td>{gpu}"
                f"<td>{steps.get(r, '–')}</td></tr>")
    note = "" if any_gpu else ("<span style='color:#666;font-size:90%'>· no GPU detected: util is each "
                               "engine's CPU share, memory its resident size</span>")
    return (f"<div class='workbench-devices'><b>devices</b> {note}<table style='border-collapse:collapse;"
            f"white-space:nowrap' cellpadding='4'><tr>{head}</tr>{''.join(rows)}</table></div>")
