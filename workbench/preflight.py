"""The preflight check (``%dist check``): can these ranks train together, and how fast do they talk?

One table a person can read before a workshop starts: every rank sees its device, the ranks can
all_reduce (and get the right sum), the measured all_reduce latency and bandwidth (across the whole
pool, and between nodes where there are several), each rank's clock offset from the kernel, and the
versions of Python, torch, CUDA/NCCL and the workbench on every rank, with any skew named.

This is the kernel half: :func:`run_check` (the table). The engine half, what every rank measures, is
:func:`workbench.engine.probe.probe`, reached through the door (:func:`workbench.remote.preflight_probe`,
called in a watched cell: it is a collective); this module imports no torch, so the kernel never touches
CUDA.

>>> report = run_check(session)          # doctest: +SKIP
>>> print(report)                        # doctest: +SKIP
rank  host  device  device ok  all_reduce  latency us  busbw GB/s  clock ms  torch
0     vm    cpu     yes        ok          85          1.92        +0.1      2.13.0
...
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from workbench import remote

# Versions compared across ranks: a difference in any of them is reported as skew.
VERSION_KEYS = ("python", "torch", "cuda", "nccl", "workbench", "ipyparallel", "numpy")
# Clock offsets beyond this (between any two ranks) are flagged: logs and traces stop lining up.
CLOCK_SKEW_WARN_MS = 100.0
COLUMNS = ["rank", "host", "device", "device ok", "all_reduce", "latency us", "busbw GB/s", "clock ms",
           "torch", "python"]


def clock_offsets(door, ranks: list, samples: int = 3) -> dict[int, float]:
    """Each rank's clock minus the kernel's, in seconds, by engine id (the sample with the shortest round
    trip); ``door``: the pool's :class:`~workbench.remote.door.Door`, ``ranks``: their ``RankInfo``.

    The error of each offset is at most half that round trip (a few ms on a LAN).
    """
    offsets = {}
    for info in ranks:
        best = None
        for _ in range(samples):
            t0 = time.time()
            theirs = door.call_one(remote.clock, info)
            t1 = time.time()
            if best is None or t1 - t0 < best[0]:
                best = (t1 - t0, theirs - (t0 + t1) / 2)
        offsets[info.engine_id] = best[1]
    return offsets


def version_skew(per_rank: dict[int, dict]) -> dict[str, dict[str, list[int]]]:
    """The versions that differ across ranks: ``{"torch": {"2.13.0": [0, 1], "2.12.0": [2]}}``.

    >>> version_skew({0: {"torch": "2.13.0"}, 1: {"torch": "2.13.0"}})
    {}
    >>> version_skew({0: {"torch": "2.13.0"}, 1: {"torch": "2.12.0"}})
    {'torch': {'2.13.0': [0], '2.12.0': [1]}}
    """
    skew = {}
    for key in VERSION_KEYS:
        seen: dict[str, list[int]] = {}
        for rank, vers in sorted(per_rank.items()):
            if key in vers:
                seen.setdefault(vers[key], []).append(rank)
        if len(seen) > 1:
            skew[key] = seen
    return skew


@dataclass
class CheckReport:
    """What ``%dist check`` found: one row per rank plus summary lines; ``ok`` when nothing failed."""

    rows: list[dict]
    summary: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    probes: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self) -> str:
        from workbench.tables import format_table

        lines = [format_table(self.rows, COLUMNS), "", *self.summary]
        lines += [f"PROBLEM: {p}" for p in self.problems] or ["all checks passed."]
        return "\n".join(lines)

    __str__ = format


def _fmt_bw(gbps: float) -> str:
    return f"{gbps:.2f}"


def run_check(session, *, size_mb: float = 4.0, iters: int = 10, timeout: float | None = None) -> CheckReport:
    """Run the preflight check on every rank of ``session`` at once and collect the table.

    ``size_mb``: the all_reduce message for the bandwidth figure (a few MB shows the link's bandwidth;
    raise it on fast GPU links). Raises what :meth:`Session.run` raises when a rank fails or hangs.

    >>> report = run_check(session, size_mb=16)    # doctest: +SKIP
    >>> report.ok, report.summary[0]              # doctest: +SKIP
    (True, 'all_reduce over 4 ranks on 2 nodes: latency 180 us, bus bandwidth 1.10 GB/s (16 MiB)')
    """
    timeout = timeout if timeout is not None else max(60.0, session.config.timeout)
    door, targets = session.rooms.door, session.view().alive()  # every rank; a dead one refused by name
    # on every rank at once in a cell (a collective the cell's ladder watches), each with its own device
    session.run(door.cell(remote.preflight_probe, targets, size_mb=float(size_mb), iters=int(iters)),
                timeout=timeout)
    probes = door.cell_results(remote.preflight_probe, targets)
    offsets = clock_offsets(door, targets)
    rows, problems = [], []
    for info, p in zip(session.ranks, probes, strict=True):
        offset_ms = offsets[info.engine_id] * 1e3
        rows.append({
            "rank": info.rank, "host": p["host"], "device": p["device"],
            "device ok": "yes" if p["device_ok"] else "NO",
            "all_reduce": "ok" if p["all_reduce_ok"] else "WRONG",
            "latency us": f"{p['latency_s'] * 1e6:.0f}", "busbw GB/s": _fmt_bw(p["busbw_gbps"]),
            "clock ms": f"{offset_ms:+.1f}", "torch": p["versions"]["torch"],
            "python": p["versions"]["python"],
        })
        if not p["device_ok"]:
            problems.append(f"rank {info.rank} ({p['host']}) cannot use {p['device']}: "
                            f"{p.get('device_error') or p.get('device_name')}.")
        if not p["all_reduce_ok"]:
            problems.append(f"rank {info.rank} ({p['host']}) got a wrong all_reduce sum.")
    p0 = probes[0]
    world = len(probes)
    summary = [f"all_reduce over {world} ranks on {p0['nodes']} node{'s' * (p0['nodes'] > 1)}: latency "
               f"{max(p['latency_s'] for p in probes) * 1e6:.0f} us, bus bandwidth "
               f"{min(p['busbw_gbps'] for p in probes):.2f} GB/s ({p0['bytes'] / 2**20:g} MiB)"]
    if any(p["collective_device"] != p["device"] for p in probes):
        summary.append("a device failed, so every rank measured on the CPU: these figures are not the GPUs'")
    inter = [p["internode"] for p in probes if "internode" in p]
    if inter:
        leaders = ", ".join(map(str, inter[0]["ranks"]))
        summary.append(f"between nodes (ranks {leaders}, one per node): latency "
                       f"{max(i['latency_s'] for i in inter) * 1e6:.0f} us, bus bandwidth "
                       f"{min(i['busbw_gbps'] for i in inter):.2f} GB/s")
    spread_ms = (max(offsets.values()) - min(offsets.values())) * 1e3
    summary.append(f"clocks: ranks within {spread_ms:.1f} ms of each other, "
                   f"{max(abs(v) for v in offsets.values()) * 1e3:.1f} ms at most from the kernel")
    if spread_ms > CLOCK_SKEW_WARN_MS:
        problems.append(f"clock skew of {spread_ms:.0f} ms across ranks: timestamps in logs and traces will "
                        "not line up; run NTP (chrony) on the nodes.")
    skew = version_skew({p["rank"]: p["versions"] for p in probes})
    if skew:
        for key, seen in skew.items():
            problems.append(f"{key} differs across ranks: " + "; ".join(
                f"{v} on rank{'s' * (len(r) > 1)} {','.join(map(str, r))}" for v, r in seen.items()) + ".")
    else:
        v = p0["versions"]
        summary.append(f"versions: the same on every rank (python {v['python']}, torch {v['torch']}, "
                       f"cuda {v['cuda']}, nccl {v['nccl']}, workbench {v['workbench']})")
    return CheckReport(rows=rows, summary=summary, problems=problems, probes=probes)
