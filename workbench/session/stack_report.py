"""Every rank's stacks, asked of all ranks at once and grouped: the odd ranks first.

The kernel (or an attached notebook, or the server) sends one signed ``stacks`` command to every
rank's agent (:mod:`workbench.engine.agent`); each agent takes its process's stacks from its own
thread, so the answer comes while a cell runs and while the main thread is blocked in a collective,
and sends them up the pool's relay under the ``stacks`` topic. Ranks that did not answer within
0.4 s are asked again (a command can be lost), then after twice as long, and so on; ranks silent
at the deadline are named.

Ranks whose threads stand at the same frames form one group; the engine's own threads
(:data:`MACHINERY`) never make two ranks differ.

>>> a = {"threads": [{"name": "MainThread", "main": True, "cut": 0, "frames": [
...     {"name": "all_reduce", "where": "torch/distributed/distributed_c10d.py:2799", "text": ""},
...     {"name": "<module>", "where": "cell line 5", "text": "dist.all_reduce(t)"}]}]}
>>> b = {"threads": [{"name": "MainThread", "main": True, "cut": 0, "frames": [
...     {"name": "sleep", "where": "cell line 3", "text": "time.sleep(30)"}]}]}
>>> for g in group_stacks({0: a, 1: b, 2: a}):
...     print(g.ranks, g.headline)
[1] sleep at cell line 3
[0, 2] all_reduce at torch/distributed/distributed_c10d.py:2799 <- cell line 5
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field

from workbench import wire
from workbench.pool.rankmap import format_ranks
from workbench.remote.door import Commands

RESEND_S = 0.4
PYSPY_TIMEOUT_S = wire.NATIVE_STACKS_TIMEOUT_S
# Threads of our own and of the engine's machinery (the agent names its py-spy thread
# workbench-stacks): shown, but they never make two ranks differ.
MACHINERY = ("workbench-agent", "workbench-metrics", "workbench-warm", "workbench-stacks", "Control", "IOPub")
TIMEOUT_S = 3.0  # Python stacks; with native frames py-spy's own bound comes on top
ENGINE_FRAMES = 3  # frames shown of an idle main thread's event loop
IDLE_AT = ("selectors.py:", "asyncio/", "tornado/")  # where an engine's main thread waits for work
EVENT_LOOP = "asyncio/base_events.py:"  # below every message the engine's loop handles
SYSTEM_LIBS = ("libc.", "libpthread", "libstdc++", "libpython", "ld-linux")


def _machinery(name: str) -> bool:
    return name.startswith(MACHINERY)


def _key(frames: list[dict]) -> tuple:
    return tuple((f["name"], f["where"]) for f in frames)


def _thread_key(thread: dict) -> tuple:
    """A thread by what it does: ``Thread-3 (run)`` is ``Thread-5 (run)`` on another rank."""
    return re.sub(r"^Thread-\d+ ", "", thread["name"]), _key(thread["frames"])


IDLE = {"name": "idle", "where": "the engine's event loop", "text": ""}


def _trim_main(thread: dict) -> list[dict]:
    """The main thread's frames from the innermost to the cell's own (below it: IPython and the
    engine's event loop, the same on every rank); an engine waiting for a cell is :data:`IDLE`
    (where in its loop it waits differs from rank to rank and says nothing); else its innermost few."""
    frames = thread["frames"]
    cells = [i for i, f in enumerate(frames) if f["where"].startswith("cell line")]
    if cells:
        return frames[:cells[-1] + 1]
    applying = [i for i, f in enumerate(frames) if f["name"] == "do_apply"]
    if applying:  # a function sent with apply (Session.apply, %dist pull...): its frames, down to the call
        return frames[:applying[-1] + 1]
    python = [f for f in frames if not f.get("native")]
    if python and (python[0]["where"].startswith(IDLE_AT) or any(f["where"].startswith(EVENT_LOOP)
                                                                 for f in python)):
        return [IDLE]  # waiting in its event loop, or handling a control message there (a probe, a beat)
    return frames[:ENGINE_FRAMES]


def _native_hint(frames: list[dict]) -> str | None:
    """The innermost native frame of a library of note above the innermost Python frame
    (``c10d::Work::wait``, not ``pthread_cond_wait`` or pybind11's glue)."""
    for f in frames:
        if not f.get("native"):
            return None
        if not f["where"].startswith(SYSTEM_LIBS) and not f["name"].startswith("pybind11"):
            return f["name"]
    return None


def headline(frames: list[dict]) -> str:
    """``"all_reduce at .../distributed_c10d.py:2799 <- cell line 5"``: the innermost Python frame,
    the innermost line of the cell below it and, with native frames, the native call it waits in.

    >>> headline([{"name": "f", "where": "cell line 2"}, {"name": "<module>", "where": "cell line 4"}])
    'f at cell line 2'
    >>> headline([{"name": "c10d::Work::wait", "where": "libtorch_cpu.so", "native": True},
    ...           {"name": "all_reduce", "where": "c10d.py:9"}, {"name": "<module>", "where": "cell line 5"}])
    'all_reduce at c10d.py:9 <- cell line 5 (native: c10d::Work::wait)'
    """
    if frames == [IDLE]:
        return "idle (no cell running)"
    python = [f for f in frames if not f.get("native")]
    if not python:
        return "no Python frames"
    top = python[0]
    text = f"{top['name']} at {top['where']}"
    if not top["where"].startswith("cell line"):
        cell = next((f for f in python if f["where"].startswith("cell line")), None)
        if cell is not None:
            text += f" <- {cell['where']}"
    hint = _native_hint(frames)
    return text + (f" (native: {hint})" if hint else "")


def started_lines(started: dict[int, list]) -> list[str]:
    """One line per rank that started processes still running (``{rank: [[pid, command line], ...]}``, from
    its beacon or its stacks' answer): they are the pool's, ended with a failed cell and with the pool.

    >>> started_lines({0: [[41, "python -c from multiprocessing.spawn ..."]], 1: []})
    ['rank 0 started 1 process that still runs: pid 41 (python -c from multiprocessing.spawn ...)']
    """
    lines = []
    for rank in sorted(started):
        procs = started[rank] or []
        if procs:
            listed = ", ".join(f"pid {pid} ({_short_command(line)})" for pid, line in procs)
            lines.append(f"rank {rank} started {len(procs)} process{'es' * (len(procs) != 1)} that still "
                         f"run{'s' * (len(procs) == 1)}: {listed}")
    return lines


def _short_command(line: str, limit: int = 60) -> str:
    return line if len(line) <= limit else line[:limit - 1] + "…"


@dataclass
class StackGroup:
    """Ranks whose threads stand at the same frames."""

    ranks: list[int]
    headline: str
    threads: list[dict]  # of the lowest rank: name, frames (innermost first), whether native


def common_threads(answers: dict[int, dict]) -> set[tuple]:
    """Threads (other than main) that stand at the same frames on every rank: shown once, by name."""
    if len(answers) < 2:
        return set()
    keys = [{_thread_key(t) for t in a["threads"] if not t.get("main")} for a in answers.values()]
    return set.intersection(*keys)


def _signature(answer: dict) -> tuple:
    sig = []
    for t in answer["threads"]:
        if t.get("main"):
            sig.append(("main", _key(_trim_main(t))))
        elif not _machinery(t["name"]):
            sig.append(("thread", _thread_key(t)))
    return tuple(sorted(sig, key=lambda s: (s[0] != "main", s[1])))


def group_stacks(answers: dict[int, dict]) -> list[StackGroup]:
    """Ranks grouped by identical stacks, the smallest groups (the odd ranks) first; threads that are
    the same on every rank (:func:`common_threads`) and the engine's own are left out of each group."""
    groups: dict[tuple, list[int]] = {}
    for rank in sorted(answers):
        groups.setdefault(_signature(answers[rank]), []).append(rank)
    common = common_threads(answers)
    out = []
    for ranks in groups.values():
        threads = []
        for t in answers[ranks[0]]["threads"]:
            if not t.get("main") and (_machinery(t["name"]) or _thread_key(t) in common):
                continue
            frames = _trim_main(t) if t.get("main") else t["frames"]
            threads.append({"name": t["name"], "main": bool(t.get("main")), "frames": frames,
                            "native": bool(t.get("native"))})
        main = next((t for t in threads if t["main"]), None)
        out.append(StackGroup(ranks, headline(main["frames"]) if main else "no main thread", threads))
    out.sort(key=lambda g: (len(g.ranks), g.ranks[0]))
    return out


@dataclass
class Stacks:
    """What :meth:`Session.stacks` returns: each rank's answer, the groups, who did not answer."""

    answers: dict[int, dict]
    missing: list[int]
    seconds: float
    groups: list[StackGroup] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.groups = group_stacks(self.answers)

    def native_note(self) -> str | None:
        """Why native frames are missing, if they were asked for and some rank could not give them."""
        why = {a["native"] for a in self.answers.values() if a.get("native") not in (None, "ok")}
        return "; ".join(sorted(why)) or None

    def format(self) -> str:
        """The text ``%dist stacks`` prints."""
        n = len(self.answers)
        lines = [f"stacks of {n} rank{'s' * (n != 1)} in {len(self.groups)} "
                 f"group{'s' * (len(self.groups) != 1)} ({self.seconds:.2f} s)"]
        if self.missing:
            lines.append(f"rank {format_ranks(self.missing)}: no answer (dead, or its agent is not running)")
        note = self.native_note()
        if note:
            lines.append(f"native frames: not shown ({note}); Python stacks below")
        shared = common_threads(self.answers)
        first = self.answers[min(self.answers)]["threads"] if self.answers else []
        common = sorted({t["name"] for t in first if not t.get("main") and not _machinery(t["name"])
                         and _thread_key(t) in shared})
        for g in self.groups:
            label = f"rank {g.ranks[0]}" if len(g.ranks) == 1 else f"ranks {format_ranks(g.ranks)}"
            lines.append(f"{label}: {g.headline}")
            for t in g.threads:
                if t["frames"] == [IDLE]:
                    lines.append(f"  thread {t['name']}: waiting for a cell")
                    continue
                lines.append(f"  thread {t['name']}" + (" (with native frames)" if t["native"] else ""))
                for f in t["frames"]:
                    text = f": {f['text']}" if f.get("text") else ""
                    lines.append(f"    {f['where']} in {f['name']}{text}" if not f.get("native")
                                 else f"    {f['name']} ({f['where']})")
        if common:
            lines.append(f"threads the same on every rank (not shown): {', '.join(common)}")
        lines += started_lines({rank: a.get("children") or [] for rank, a in self.answers.items()})
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.format()


class StackGatherer:
    """Asks the agents for their stacks and gathers the answers (one request at a time).

    ``send(ranks, **details)``: sends the signed ``stacks`` command to those ranks' agents (through the
    door's :class:`~workbench.remote.door.Commands`).
    """

    def __init__(self, channel: dict):
        import zmq

        self._signer = wire.Signer(channel["key"])
        self._ctx = zmq.Context()
        self._sock = wire.subscriber(self._ctx, channel["out"], wire.STACKS)
        self._lock = threading.Lock()
        self.bad = 0  # messages dropped: forged or malformed

    def gather(self, ranks: list[int], send, native: bool = False, timeout: float | None = None) -> Stacks:
        """Every rank's stacks, asked of all of them at once."""
        if timeout is None:
            timeout = TIMEOUT_S + (PYSPY_TIMEOUT_S if native else 0.0)
        with self._lock:
            started = time.monotonic()
            request = uuid.uuid4().hex
            parts: dict[int, dict[int, str]] = {}
            answers: dict[int, dict] = {}
            deadline, asked = started + timeout, None
            # a command lost on its way is sent again; py-spy is never started twice at once on a rank
            resend = PYSPY_TIMEOUT_S + 0.5 if native else RESEND_S
            while len(answers) < len(ranks) and time.monotonic() < deadline:
                if asked is None or time.monotonic() - asked >= resend:
                    if asked is not None:
                        resend *= 2  # a loaded machine answers late: asking again only adds to its load
                    send([r for r in ranks if r not in answers], request=request, native=native)
                    asked = time.monotonic()
                wait_ms = int((min(deadline, asked + resend) - time.monotonic()) * 1000)
                if self._sock.poll(max(1, wait_ms)):
                    while self._sock.poll(0):
                        self._take(self._sock.recv_multipart(), request, set(ranks), parts, answers)
            return Stacks(answers, [r for r in ranks if r not in answers], time.monotonic() - started)

    def _take(self, frames, request: str, ranks: set[int], parts: dict, answers: dict) -> None:
        try:
            _, body = self._signer.unpack(frames)
            msg = json.loads(body)
            rank, part, count = int(msg["rank"]), int(msg["part"]), int(msg["parts"])
            if msg["request"] != request or rank not in ranks or rank in answers:
                return  # an answer to an earlier request, or a second answer to this one
            parts.setdefault(rank, {})[part] = str(msg["data"])
            if len(parts[rank]) == count:
                answers[rank] = json.loads("".join(parts[rank][i] for i in range(count)))
        except (wire.BadMessage, ValueError, KeyError, TypeError):
            self.bad += 1

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()


class PoolStacks:
    """Stacks of a pool this process does not drive, from its state file's channel (the server's
    sidebar): the same command (sent by the door's :class:`~workbench.remote.door.Commands`) and answers
    as :meth:`Session.stacks`.

    >>> asker = PoolStacks(state["channel"])                                   # doctest: +SKIP
    >>> asker.gather([0, 1], generation=state["generation"]).format()           # doctest: +SKIP
    """

    def __init__(self, channel: dict):
        self._gatherer = StackGatherer(channel)
        self._commands = Commands(channel)
        self._lock = threading.Lock()

    def gather(self, ranks: list[int], generation: int, native: bool = False) -> Stacks:
        def send(targets: list[int], **details) -> None:  # a relay that is gone: named as not answering
            self._commands.send(wire.Command.STACKS, targets, generation, **details)

        with self._lock:
            return self._gatherer.gather(ranks, send, native=native)

    def close(self) -> None:
        with self._lock:  # after a gather in flight
            self._gatherer.close()
            self._commands.close()
