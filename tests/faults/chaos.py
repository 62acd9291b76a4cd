"""A seeded schedule of combined faults over one elastic run (issue 38), shared by the tests and the bench.

:func:`run_chaos` starts ``steps`` steps of an elastic Trainer (``replace=True``) in the background on a local
pool and, at seeded random times, does one of :data:`KINDS` to a rank chosen at random (no rank spared: the
victims include the ranks that joined meanwhile); it never takes the last rank alive. It samples the pool's
membership meanwhile, waits for the run's end, and returns what happened: the schedule, the result, the
largest world size seen, every step record of every rank (each rank writes its own file, so the records of
killed ranks survive them) and the time the run took.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

N, G, LR = 960, 48, 0.05  # as tests/faults/test_elastic.py: 20 steps an epoch at any world size

KINDS = ("kill", "stop", "two_kills", "kill_joining", "scale")  # built in; run_chaos(more=...) adds others

SETUP = """
import json, os, time
import torch, torch.distributed as dist
import workbench as wb
from torch.utils.data import TensorDataset
torch.manual_seed(0)
x, y = wb.regression_data({n}, d_in=8, d_out=2)
cfg = wb.MLPConfig(d_in=8, d_hidden=32, d_out=2, n_layers=2)
model = wb.shard(wb.MLP(cfg).double(), "ddp")
data = wb.make_loader(TensorDataset(x.double(), y.double()), batch_size={g} // world_size, model=model)

class FileLog(wb.Callback):
    def __init__(self, folder):
        self.folder = folder
    def on_step_end(self, trainer, stats):
        s = trainer.elastic.last_step
        record = [trainer.step, list(s["position"]), s["size"], s["world_size"], list(s["indices"]),
                  time.time()]
        with open(os.path.join(self.folder, f"steps-{{os.getpid()}}.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\\n")
        time.sleep({pause})

trainer = wb.Trainer(model, data, lr={lr}, optim="sgd", clip=None, callbacks=[FileLog({folder!r})],
                     elastic=wb.ElasticConfig(hang_timeout={hang}, replace=True,
                                              rebuild=lambda: wb.MLP(cfg).double()))
"""


def setup_code(folder: str, pause: float = 0.02, hang_timeout: float = 3) -> str:
    return SETUP.format(n=N, g=G, lr=LR, folder=folder, pause=pause, hang=hang_timeout)


@dataclass
class Chaos:
    seed: int
    schedule: list = field(default_factory=list)  # (seconds into the run, kind, what was done)
    result: object = None
    error: BaseException | None = None
    largest: int = 0  # the largest world size the kernel's rank map ever held
    sizes: list = field(default_factory=list)  # (t, world size) samples
    seconds: float = 0.0
    records: list = field(default_factory=list)  # every rank's step records, one list per process
    killed: list = field(default_factory=list)  # pids of the ranks killed (members, joining ones too)
    doubled: list = field(default_factory=list)  # samples of the rank map naming one engine twice
    faults_before: int = 0  # how many fault records the session held when the run began
    watch: object = None  # the run's ElasticWatch (what the kernel decided)
    started: float = 0.0  # time.time() when the run was submitted (the step records' clock)

    @property
    def done(self) -> list:
        """The faults that happened (a fault with nothing to do it to is not counted)."""
        return [f for f in self.schedule if not f[2].startswith("none")]

    def said(self) -> str:
        return "\n".join(f"  {t:7.2f} s {kind:12s} {did}" for t, kind, did in self.schedule)


@dataclass
class Turn:
    """What a fault kind of :func:`run_chaos`'s ``more`` is given, at its turn; it does its fault and returns
    what it did (a text starting with "none" when there was nothing to do it to: not counted)."""
    s: object  # the Session
    rng: random.Random
    members: list[int]  # pids of the ranks now
    keep: list[int]  # pids of the ranks that hold the run's state: one of them must stay
    kill: Callable[[int], None]  # kill -9 one process, counted among the run's kills

    def spare(self, victims) -> bool:
        """Whether a rank that holds the run's state is left when ``victims`` (pids) are gone."""
        return bool(set(self.keep) - set(victims))


def engines_outside(s) -> list[int]:
    """The pool's engine processes that are not ranks now (replacements starting or replaying the setup,
    or leaving)."""
    zygote = s.pool.zygote
    if zygote is None or not zygote.alive():
        return []
    ranks = {r.pid for r in s.ranks}
    controller = s.pool.cluster.controller if s.pool.cluster is not None else None
    if controller is not None:
        ranks.add(controller.pid)  # forked by the zygote too
    try:
        kids = psutil.Process(zygote.pid).children()
    except psutil.Error:
        return []
    out = []
    for p in kids:
        try:
            if p.pid not in ranks and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


def trained(s, watch) -> list[int]:
    """Pids of the ranks that hold the run's state: members that are not joining."""
    joining = set(watch.joining) if watch is not None else set()
    return [r.pid for r in s.ranks if r.engine_id not in joining]


def _kill(pid: int, sig=signal.SIGKILL) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def trainer_step(s) -> int:
    """The furthest step a rank's beacon shows."""
    latest = s.rooms.beacons.latest
    return max([((b or {}).get("trainer") or {}).get("step", 0) for b in latest.values()] or [0])


def run_chaos(s, folder: str, seed: int, faults: int, steps: int, gap=(1.0, 3.0), size: int = 4,
              kinds=KINDS, wait_s: float = 600.0, until: float = 0.9,
              deadline_s: float | None = None, more: dict[str, Callable[[Turn], str]] | None = None) -> Chaos:
    """``faults`` faults of ``kinds`` at seeded random gaps (seconds) over a run of ``steps`` steps on ``s``
    (a pool of ``size`` ranks, the setup of :func:`setup_code` already run), none after ``until`` of the
    steps (the run's end is not a fault's). Never the last rank that holds the run's state; any other,
    joining ones too. ``deadline_s``: the whole run, faults and wait, is given up after that many seconds
    (its error then says so; the caller stops the pool), so that a run that stands still ends. ``more``:
    fault kinds of the caller's by name (a host's link cut, a host's engines killed: see
    ``scenario_ssh_chaos`` in tests/cluster/driver.py), each a function of a :class:`Turn`; ``kinds`` may
    name them beside the built-in ones."""
    rng = random.Random(seed)
    out = Chaos(seed, faults_before=len(s.faults))
    stopped: list[int] = []
    sampling = threading.Event()

    def sample():
        while not sampling.wait(0.05):
            ranks = s.ranks
            n = len(ranks)
            out.largest = max(out.largest, n)
            out.sizes.append((time.monotonic() - t0, n))
            if len({r.pid for r in ranks}) != n:
                out.doubled.append([r.pid for r in ranks])

    t0 = time.monotonic()
    out.started = time.time()
    handle = s.submit(f"result = trainer.run(steps={steps})")
    out.watch = handle.cell.elastic
    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()

    def kill(pid: int) -> None:
        if _kill(pid):
            out.killed.append(pid)

    def left() -> float:
        return wait_s if deadline_s is None else min(wait_s, deadline_s - (time.monotonic() - t0))

    try:
        while len(out.done) < faults and left() > 0:
            time.sleep(rng.uniform(*gap))
            if handle.done() or trainer_step(s) >= until * steps:
                break
            members = [r.pid for r in s.ranks]
            keep = trained(s, out.watch)  # at least one of them stays
            kind = rng.choice(kinds)
            at = round(time.monotonic() - t0, 2)

            def spare(victims: list[int], keep=keep) -> bool:
                return bool(set(keep) - set(victims))

            if kind in (more or {}):
                did = more[kind](Turn(s, rng, members, keep, kill))
            elif kind == "scale":
                target = size - 1 if len(members) >= size else size
                try:
                    s.scale(target)
                    did = f"scale {target}"
                except Exception as exc:  # noqa: BLE001 (said in the schedule; the test judges it)
                    did = f"scale {target} refused: {type(exc).__name__}: {exc}"
            elif kind == "stop" and len(members) > 1:
                victim = rng.choice(members)
                _kill(victim, signal.SIGSTOP)
                stopped.append(victim)
                pause = rng.uniform(2.0, 5.0)
                threading.Timer(pause, _kill, (victim, signal.SIGCONT)).start()
                did = f"SIGSTOP {victim} for {pause:.1f} s"
            elif kind == "two_kills" and len(members) > 2:
                a, b = rng.sample(members, 2)
                if not spare([a, b]):
                    out.schedule.append((at, kind, "none (the last trained ranks)"))
                    continue
                kill(a)
                time.sleep(rng.uniform(0.0, 1.0))
                kill(b)
                did = f"kill {a}, then {b}"
            elif kind == "kill_joining":
                deadline = time.monotonic() + 10
                while not engines_outside(s) and not out.watch.joining and time.monotonic() < deadline \
                        and not handle.done():
                    time.sleep(0.02)
                if handle.done() or trainer_step(s) >= until * steps:  # the run neared its end meanwhile
                    break
                joining = engines_outside(s) + [r.pid for r in s.ranks if r.engine_id in out.watch.joining]
                members = [r.pid for r in s.ranks]
                if joining and rng.random() < 0.5:
                    victim = rng.choice(joining)
                    did = f"kill joining engine {victim}"
                else:
                    choice = [p for p in members if spare([p])]
                    victim = rng.choice(choice) if choice else None
                    did = f"kill member {victim} while {len(joining)} joining" if victim else "none (1 rank)"
                if victim:
                    kill(victim)
            elif len(members) > 1:
                choice = [p for p in members if spare([p])]
                victim = rng.choice(choice)
                kill(victim)
                did = f"kill {victim}"
            else:
                did = "none (1 rank)"
            out.schedule.append((at, kind, did))
        if len(s.ranks) != size and not handle.done() and left() > 0:  # back to the size asked
            try:
                s.scale(size)
                out.schedule.append((round(time.monotonic() - t0, 2), "scale", f"scale {size} (back)"))
            except Exception as exc:  # noqa: BLE001 (the test judges it)
                out.schedule.append((round(time.monotonic() - t0, 2), "scale",
                                     f"scale {size} (back) refused: {type(exc).__name__}: {exc}"))
        try:
            if left() <= 0:
                raise TimeoutError(f"the run did not end within {deadline_s:g} s")
            out.result = handle.wait(left())
        except BaseException as exc:  # noqa: BLE001 (the test says what went wrong)
            out.error = exc
    finally:
        sampling.set()
        for pid in stopped:
            _kill(pid, signal.SIGCONT)
        out.seconds = time.monotonic() - t0
    out.records = read_records(folder)
    return out


def records_by_pid(folder: str) -> dict[int, list]:
    """The step records every rank wrote into ``folder``, by the pid of the process that wrote them:
    ``[step, [epoch, offset], size, world size, indices, time.time()]`` each."""
    return {int(path.stem.split("-")[1]): [json.loads(line) for line in path.read_text().splitlines()
                                           if line.strip()]
            for path in sorted(Path(folder).glob("steps-*.jsonl"))}


def read_records(folder: str) -> list[list]:
    """The step records every rank wrote into ``folder``, one list per process."""
    return list(records_by_pid(folder).values())


def committed(records: list[list]) -> dict[int, list]:
    """The committed attempt of every step: of all ranks' records of a step, those of its latest attempt
    (a step cut off by a loss is taken again in the new group)."""
    attempts: dict[int, dict[tuple, list]] = {}
    for rank_records in records:
        for step, position, size, world, indices, t in rank_records:
            attempts.setdefault(step, {}).setdefault((tuple(position), size, world), []).append((t, indices))
    out = {}
    for step, tries in attempts.items():
        key = max(tries, key=lambda k: max(t for t, _ in tries[k]))
        out[step] = [(key[0], key[1], key[2], indices) for _, indices in tries[key]]
    return out


def check_once(records: list[list], steps: int) -> None:
    """Every committed step's slice of its epoch taken once; the steps of an epoch tile it (raises
    AssertionError saying which step or epoch is wrong)."""
    from tests.faults.test_elastic import permutation  # torch: imported only by the check

    by_step = committed(records)
    assert sorted(by_step) == list(range(1, steps + 1)), \
        f"steps missing: {sorted(set(range(1, steps + 1)) - set(by_step))[:20]}"
    covered: dict[int, list[int]] = {}
    for step, recs in sorted(by_step.items()):
        (epoch, offset), size, world = recs[0][0], recs[0][1], recs[0][2]
        covered.setdefault(epoch, []).append(offset)
        window = permutation(epoch)[offset:offset + size]
        mine = [i for r in recs for i in r[3]]
        assert len(mine) == len(set(mine)) and set(mine) <= set(window), f"step {step}: foreign samples"
        if len(recs) == world:
            assert sorted(mine) == sorted(window), f"step {step} skipped samples"
    for epoch, offsets in covered.items():
        assert sorted(offsets) == list(range(0, G * len(offsets), G)), f"epoch {epoch}: {offsets}"


# -- the checks, shared by the local chaos test and the host chaos scenario (tests/cluster/driver.py) -------
def rank_lists(text: str) -> list[list[int]]:
    """The rank numbers a fault text names, per list ("ranks 1-2, 4 died" -> [[1, 2, 4]])."""
    lists = []
    for found in re.finditer(r"\branks? ((?:\d+(?:-\d+)?)(?:,\s?\d+(?:-\d+)?)*)", text):
        numbers = []
        for part in re.split(r",\s?", found.group(1)):
            a, _, b = part.partition("-")
            numbers += list(range(int(a), int(b or a) + 1))
        lists.append(numbers)
    return lists


def faults_true(s, run: Chaos) -> None:
    """Every engine the run lost is in exactly one fault record, and no record names a rank twice."""
    records = s.faults[run.faults_before:]
    for event in records:
        for numbers in rank_lists(event.first_failure):
            assert len(numbers) == len(set(numbers)), f"a rank named twice: {event.first_failure!r}"
    watch = run.watch
    killed = set(run.killed)
    lost = {r.pid: r.engine_id for r, _ in watch.children if r.engine_id in watch.dropped}
    for pid, engine in lost.items():
        assert watch.how_lost(engine) is not None, f"engine {pid} was lost without a fault record"
    events = {id(watch._lost_in[e]) for e in lost.values()}
    assert events <= {id(e) for e in records}, "a lost engine's fault record is not in the session's faults"
    members = {r.pid for r, _ in watch.children}
    missing = (killed & members) - set(lost) - {r.pid for r in s.ranks}
    # what the watch last knew of each (for the next reader)
    where = {pid: [(r.rank, "leaving" if r.engine_id in watch.leaving else
                    "joining" if r.engine_id in watch.joining else "member") for r, _ in watch.children
                   if r.pid == pid] for pid in missing}
    assert not missing or run.error is not None, \
        f"seed {run.seed}: killed ranks the run never routed around: {where}\n{run.said()}"


def finished_as_asked(s, run: Chaos, steps: int, size: int) -> None:
    """The run did every step, each sample once, on ``size`` ranks at the end (never more meanwhile), with
    the fault-free run's parameters; the fault records are true."""
    import torch  # imported only by the checks (the bench's kernel side needs no torch)

    from tests.conftest import alive
    from tests.faults.test_elastic import reference

    said = run.said()
    assert run.error is None, f"seed {run.seed}: the run failed: {run.error!r}\n{said}"
    assert run.largest <= size, \
        f"seed {run.seed}: the pool grew to {run.largest} ranks (asked {size})\n{said}"
    assert not run.doubled, f"seed {run.seed}: the rank map named an engine twice: {run.doubled[:3]}"
    now = {r.engine_id: r.rank for r in s.ranks}
    # the ranks that ran the run to its end (a scale that ended after the run adds ranks that did not)
    finished = sorted(now[r.rank.engine_id] for r in run.result.ranks
                      if r.outcome == "ok" and r.rank.engine_id in now)
    assert len(finished) == size, \
        f"seed {run.seed}: the run ended on {len(finished)} ranks, not {size}\n{said}\n{run.result}"
    assert s.world_size == size, f"seed {run.seed}: the pool is at {s.world_size} ranks, not {size}\n{said}"
    assert [s.pull("trainer.step", rank=r) for r in finished] == [steps] * size, said
    check_once(run.records, steps)
    s.run("from workbench.train import full_state_dict\nfull = full_state_dict(trainer.model)",
          ranks=finished)
    want = reference(steps)
    for r in finished:
        torch.testing.assert_close(s.pull("full", rank=r), want)
    rows = s.status()
    assert sorted(row["rank"] for row in rows if row["rank"] != "-") == list(range(size)), rows
    assert all(row["state"] in ("idle", "busy") for row in rows if row["rank"] != "-"), rows
    pids = [row["pid"] for row in rows if row["rank"] != "-"]
    assert sorted(alive(pids)) == sorted(pids), rows
    faults_true(s, run)
