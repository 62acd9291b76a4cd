"""The "notebook" of a cluster test: runs on the head node (inside a test namespace), drives the
workbench through its magics in a real IPython shell, and writes what it saw as JSON.

Usage: ``python tests/cluster/driver.py SCENARIO SPEC_JSON RESULT_FILE`` (see tests/cluster/infra.py).
Whatever happens, the pool is stopped before the result is written.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable

import psutil

from tests.cluster import infra
from tests.conftest import until


def run(ip, cell: str) -> str:
    """Run a cell like a notebook would; raise with its output if it failed."""
    from IPython.utils.capture import capture_output

    with capture_output() as cap:
        result = ip.run_cell(cell)
    shown = cap.stdout + cap.stderr + "".join(o.data.get("text/plain", "") + "\n" for o in cap.outputs)
    print(shown, flush=True)
    if not result.success:
        raise RuntimeError(f"cell failed: {cell.splitlines()[0]}\n{shown}\n{result.error_in_exec!r}")
    return shown


def listening(pids: set[int] | None = None) -> list[list]:
    """TCP/UDP sockets listening in this network namespace: [ip, port, pid]."""
    out = []
    for c in psutil.net_connections(kind="inet"):
        if (c.status == psutil.CONN_LISTEN or (c.type == 2 and not c.raddr)) and c.laddr:
            if pids is None or c.pid in pids:
                out.append([c.laddr.ip, c.laddr.port, c.pid])
    return out


ALL_REDUCE = """%%distributed
import os, socket, torch
t = torch.ones(4) * (rank + 1)
dist.all_reduce(t)
where = {"rank": rank, "host": socket.gethostname(), "sum": t[0].item(),
         "ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "master": os.environ.get("MASTER_ADDR"),
         "slurm_job": os.environ.get("SLURM_JOB_ID"), "slurm_procid": os.environ.get("SLURM_PROCID"),
         "mpi_rank": os.environ.get("OMPI_COMM_WORLD_RANK"), "pid": os.getpid()}
"""


def scenario_slurm(ip, spec: dict) -> dict:
    from workbench import session

    t0 = time.perf_counter()
    run(ip, "%dist start --launcher slurm -n 2 --interface lo --partition debug --time 10 --timeout 120")
    start_s = time.perf_counter() - t0
    s = session.current()
    jobs = s.pool.jobs()
    state = subprocess.run(["squeue", "-h", "-o", "%i %T %D %C"], capture_output=True, text=True).stdout
    run(ip, ALL_REDUCE)
    where = s.pull("where")
    check = run(ip, "%dist check --size-mb 1")
    pids = s.pids()
    run(ip, "%dist stop")
    t1 = time.perf_counter()
    queue = "?"
    while time.perf_counter() - t1 < 30:
        queue = subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip()
        if not queue:
            break
        time.sleep(0.2)
    return {"start_s": start_s, "ready_s": s.start_seconds, "jobs": jobs, "squeue_running": state,
            "where": where, "check": check, "squeue_after_stop": queue,
            "release_s": time.perf_counter() - t1,
            "left": [p for p in pids if psutil.pid_exists(p)]}


HOLD_THE_GIL = """%%distributed
import ctypes
if rank == 1:
    ctypes.PyDLL(None).sleep(5)  # libc's sleep through a PyDLL: the GIL is held all along
held = rank
"""


def scenario_mpi(ip, spec: dict) -> dict:
    from workbench import session

    t0 = time.perf_counter()
    run(ip, f"%dist start --launcher mpi -n 2 --idle-release {spec['idle']} --timeout 120")
    start_s = time.perf_counter() - t0
    s = session.current()
    pids = s.pids()
    names = [psutil.Process(p).name() for p in pids if psutil.pid_exists(p)]
    run(ip, ALL_REDUCE)
    where = s.pull("where")
    # rank 1 holds the interpreter for 5 s (a C call that keeps the GIL, as unpickling a big checkpoint
    # does): its beacons stop, but its gloo port answers, so it is up, not lost
    try:
        held = run(ip, HOLD_THE_GIL)
    except RuntimeError as exc:
        held = str(exc)
    held_ranks = s.pull("held") if s.running else None
    # the idle timer prints from its own thread: catch what it prints, as the notebook would show it
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        deadline = time.monotonic() + spec["idle"] + 20
        while "stopped the idle pool" not in printed.getvalue() and time.monotonic() < deadline:
            time.sleep(0.1)
    return {"start_s": start_s, "where": where, "process_names": names, "idle_output": printed.getvalue(),
            "held_output": held, "held_ranks": held_ranks, "faults": [f.__dict__ for f in s.faults],
            "running_after_idle": s.running, "left": [p for p in pids if psutil.pid_exists(p)]}


DDP_TRAIN = """%%distributed
import torch, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from workbench.train import checkpoint as ckpt
torch.manual_seed(0)
model = DDP(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
X = torch.randn(96, 8, generator=g); Y = X @ torch.randn(8, 1, generator=g)
def train(steps):
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(X[rank::world_size]) - Y[rank::world_size]) ** 2).mean()
        loss.backward(); opt.step(); out.append(loss.item())
    return out
first = train(20)
ckpt.save(CKPT, model=model, optimizer=opt, step=20)
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
every = [torch.zeros_like(flat) for _ in range(world_size)]
dist.all_gather(every, flat)
same = all(torch.equal(every[0], e) for e in every)
"""

DDP_RESUME = """%%distributed
import torch, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from workbench.train import checkpoint as ckpt
torch.manual_seed(123)  # different init: the checkpoint must overwrite it
model = DDP(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
X = torch.randn(96, 8, generator=g); Y = X @ torch.randn(8, 1, generator=g)
step = ckpt.load(CKPT, model=model, optimizer=opt)
def train(steps):
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(X[rank::world_size]) - Y[rank::world_size]) ** 2).mean()
        loss.backward(); opt.step(); out.append(loss.item())
    return out
second = train(10)
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
every = [torch.zeros_like(flat) for _ in range(world_size)]
dist.all_gather(every, flat)
same = all(torch.equal(every[0], e) for e in every)
"""

LISTEN = """%%distributed
import psutil
listen = [[c.laddr.ip, c.laddr.port, c.pid] for c in psutil.net_connections(kind="inet")
          if c.status == psutil.CONN_LISTEN]
"""


def scenario_ssh(ip, spec: dict) -> dict:
    from workbench import PoolConfig, Session, session
    from workbench.preflight import run_check

    opts = {"ssh_args": spec["ssh_args"], "scp_args": spec["ssh_args"], "remote_python": spec["python"]}
    config = PoolConfig(launcher="ssh", hosts=spec["hosts"], interface=spec["interface"], timeout=120,
                        launcher_options=opts)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = Session(config).start(progress=lambda m: print(m, flush=True))
    start_s = time.perf_counter() - t0
    out: dict = {"start_s": start_s, "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
                 "address": s.config.address, "ranks": [r.__dict__ for r in s.ranks],
                 "state_remote": json.load(open(s.pool.state_file)).get("remote")}
    run(ip, ALL_REDUCE)
    out["where"] = s.pull("where")
    s.push({"CKPT": spec["ckpt"]})
    run(ip, DDP_TRAIN)
    out["ddp_first"] = s.pull("first")
    out["ddp_same"] = s.pull("same")
    # who listens where, on every "host", while the process group is up and has trained
    run(ip, LISTEN)
    out["listen_engines"] = {r["host"]: v for r, v in zip(out["where"], s.pull("listen"), strict=True)}
    out["listen_head"] = listening()
    report = run_check(s, size_mb=4)
    print(report, flush=True)
    out["check"] = report.format()
    out["check_ok"] = report.ok
    out["check_probe"] = {k: v for k, v in report.probes[0].items() if k != "versions"}
    # elastic: a third rank (on the first host), then resume from the checkpoint at world size 3
    t1 = time.perf_counter()
    run(ip, "%dist scale 3")
    out["scale_s"] = time.perf_counter() - t1
    out["ranks_after_scale"] = [r.__dict__ for r in s.ranks]
    s.push({"CKPT": spec["ckpt"]})
    run(ip, DDP_RESUME)
    out["resumed_step"] = s.pull("step")
    out["ddp_second"] = s.pull("second")
    out["ddp_same_after"] = s.pull("same")
    # sub-meshes across hosts (docs/submeshes.md): rank 0 (n1) alone, ranks 1-2 (n2, n1) meeting at the store
    # of their first rank, on n2; then one group of all again
    run(ip, "%dist split 1 2 --names solo,pair")
    run(ip, ALL_REDUCE)
    out["where_split"] = s.pull("where")
    run(ip, "%dist join")
    run(ip, ALL_REDUCE)
    out["where_joined"] = s.pull("where")
    run(ip, "%dist stop")
    out["running_after_stop"] = session.current_or_none() is not None
    return out


def wait_for_step(s, step: int, timeout: float = 90) -> bool:
    """Until every rank's beacon shows its Trainer past ``step`` (the engines are busy with the cell)."""
    from bench.elastic import _under_way
    from workbench.pool.watch.beacons import BeaconReceiver

    beacons = BeaconReceiver(s.pool.channel)
    try:
        return _under_way(s, beacons, step, timeout)
    finally:
        beacons.close()


def link(port: str, state: str) -> None:
    """The switch side of a host's cable (the bridge port in this, the head, namespace) up or down."""
    subprocess.run(["ip", "link", "set", port, state], check=True)


def netns_left(name: str, keep: list[int]) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if int(p) not in keep]


def second_cut_when_planned(s, port: str, timeout: float = 30) -> float | None:
    """Cut ``port`` as soon as the kernel has planned the regroup after the first cut (its fault is
    recorded when the plan goes out), so that host is lost while the regroup waits for it."""
    if not until(lambda: s.faults, timeout, every=0.005):
        return None
    link(port, "down")
    return time.time()


def restart_and_reduce(ip, s, out: dict, said: str, ranks: str, sums: str, error: str) -> None:
    """``%dist restart``, then an all_reduce across the pool: what it said, the ranks and the sums go into
    ``out`` under those keys, or what it raised under ``error``."""
    try:
        out[said] = run(ip, "%dist restart")
        out[ranks] = [[r.rank, r.host, r.pid] for r in s.ranks]
        s.run("t = torch.ones(1)\ndist.all_reduce(t)")
        out[sums] = [t.item() for t in s.pull("t")]
    except Exception as exc:
        out[error] = f"{type(exc).__name__}: {exc}"


def ssh_config(spec: dict):
    """The PoolConfig of ``spec["n"]`` ranks over ssh on ``spec["hosts"]`` (the test's client options)."""
    from workbench import PoolConfig

    opts = {"ssh_args": spec["ssh_args"], "scp_args": spec["ssh_args"], "remote_python": spec["python"]}
    return PoolConfig(launcher="ssh", hosts=spec["hosts"], n=spec["n"], interface=spec["interface"],
                      timeout=spec.get("timeout", 60), launcher_options=opts)


def started(config) -> tuple:
    """A Session started on ``config``, and the first entries of the scenario's result: its ranks
    ``[rank, host, pid]`` and the seconds its start took."""
    from workbench import Session

    t0 = time.perf_counter()
    s = Session(config).start(progress=lambda m: print(m, flush=True))
    return s, {"ranks": [[r.rank, r.host, r.pid] for r in s.ranks], "start_s": time.perf_counter() - t0}


def scenario_ssh_cut(ip, spec: dict) -> dict:
    """Ranks on several hosts over ssh (``plain_cell``: an all_reduce cell first), an elastic run, and one
    host's link cut mid-run (``kill_host``: its engines killed instead; ``stall``: then the ranks of
    ``stall["host"]`` stopped for ``stall["seconds"]``; ``second``: another host's link cut once the regroup
    is planned); then ``%dist restart`` (unless ``restart`` is false) and the
    links restored: the cut-off engines fence themselves (``restart_after_up``: then ``%dist restart``
    again). ``allocation``: the ranks are steps of the Slurm job the driver runs in, not ssh engines."""
    from workbench import PoolConfig

    if spec.get("allocation"):  # the Slurm job this driver runs in: every slot of its nodes, as its steps
        config = PoolConfig(launcher="allocation", interface=spec["interface"],
                            timeout=spec.get("timeout", 60))
    else:
        config = ssh_config(spec)
    s, out = started(config)
    if spec.get("plain_cell"):  # a plain cell across every host first
        run(ip, ALL_REDUCE)
        out["sums"] = sorted({w["sum"] for w in s.pull("where")})
    cut = {spec["netns"]: (spec["port"], spec["keep"])} if "port" in spec else {}
    if spec.get("second"):
        cut[spec["second"]["netns"]] = (spec["second"]["port"], spec["second"]["keep"])
    run(ip, "%%distributed\n" + spec["setup"])
    handle = s.submit(f"result = trainer.run(steps={spec['steps']})")
    if not wait_for_step(s, spec["at_step"]):
        raise RuntimeError("the run did not get going")
    t_cut = time.time()
    if "kill_host" in spec:  # kill -9 every engine of that host (they run in this pid namespace)
        for r in [r for r in s.ranks if r.host == spec["kill_host"]]:
            os.kill(r.pid, signal.SIGKILL)
    else:
        link(spec["port"], "down")
    if spec.get("stall"):  # then the ranks of that host held (SIGSTOP) that long: silent, alive, ports up
        held = [r.pid for r in s.ranks if r.host == spec["stall"]["host"]]
        for pid in held:
            os.kill(pid, signal.SIGSTOP)
        threading.Timer(spec["stall"]["seconds"], lambda: [os.kill(p, signal.SIGCONT) for p in held]).start()
    if spec.get("second"):
        out["t_second_cut"] = second_cut_when_planned(s, spec["second"]["port"])
    try:
        result = handle.wait(spec["wait"])
        out["outcomes"] = [[r.rank.rank, r.rank.host, r.outcome] for r in result.ranks]
    except Exception as exc:  # what the cell raised: the test says what it expected instead
        out["cell_error"] = f"{type(exc).__name__}: {exc}"
    out["cut_s"] = time.time() - t_cut
    out["t_cut"] = t_cut
    out["faults"] = [f.__dict__ for f in s.faults]
    out["ranks_after"] = [[r.rank, r.host, r.pid] for r in s.ranks]
    try:
        out["steps"] = s.pull("trainer.step")
        out["events"] = s.pull("trainer.elastic.events")
        out["step_log"] = s.pull("log.steps")
        s.run("from workbench.train import full_state_dict\n"
              "full = {k: v.tolist() for k, v in full_state_dict(trainer.model).items()}")
        out["params"] = s.pull("full")
        s.run("t = torch.ones(1)\ndist.all_reduce(t)")
        out["all_reduce"] = [t.item() for t in s.pull("t")]
    except Exception as exc:
        out["after_error"] = f"{type(exc).__name__}: {exc}"
    # the cut host does not answer: the lost ranks come back on the other host, set up by the replay
    if spec.get("restart", True):
        restart_and_reduce(ip, s, out, "restart_output", "ranks_restarted", "all_reduce_restarted",
                           "restart_error")
    for port, _ in cut.values():
        link(port, "up")
    t_up = time.monotonic()
    left = {name: netns_left(name, keep) for name, (_, keep) in cut.items()}
    while any(left.values()) and time.monotonic() - t_up < spec["fence_wait"]:
        time.sleep(0.2)
        left = {name: netns_left(name, keep) for name, (_, keep) in cut.items()}
    out["fenced_s"] = time.monotonic() - t_up
    beacons = s.rooms.beacons
    out["fence_heard"] = {f"{h}:{p}": beacons.heard_since_fenced(h, p) for h, p in beacons.fenced}
    fencer = getattr(s.pool, "_fencer", None)
    out["fence_ssh"] = dict(fencer.fenced) if fencer is not None else {}
    out["left_on_cut_host"] = [p for pids in left.values() for p in pids]
    out["status_after"] = s.status()
    if spec.get("restart_after_up"):  # the link back: the lost ranks come back where they were
        restart_and_reduce(ip, s, out, "restart_up_output", "ranks_restarted_up", "all_reduce_restarted_up",
                           "restart_up_error")
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed), contextlib.redirect_stdout(printed):
        s.stop()
        time.sleep(1.0)  # ipyparallel's launcher threads report an ssh exit after the stop returns
    out["stop_output"] = printed.getvalue()
    return out


ENGINE_MAIN = "workbench.pool.processes.engine_main"  # in every engine's command line (pool/launch/spawn)


def engines_in(netns: str, keep: list[int]) -> list[int]:
    """The pool's engine processes running in ``netns`` (a host), ranks or not (a replacement starting)."""
    return [p for p in netns_left(netns, keep) if ENGINE_MAIN in " ".join(infra.describe([p]))]


def scenario_ssh_chaos(ip, spec: dict) -> dict:
    """Host-level chaos (issue 38): an elastic run (``replace=True``) of ``n`` ranks over ssh on the hosts,
    and a seeded schedule (:func:`tests.faults.chaos.run_chaos`) of host faults while replacements join:
    ``cut`` (a host's link down for ``cut_s`` seconds, then up again), ``kill_host`` (every engine process
    of a host killed, joining ones too) and ``kill_rank`` (one rank killed). Never the last rank that holds
    the run's state (ranks of a host whose link is down count as gone). Then every link up, the checks of
    :func:`tests.faults.chaos.finished_as_asked` (their failure under ``check_error``), and what the test
    checks on its own: the schedule, the fault texts, the ranks by host, what was left on the hosts."""
    from tests.faults import chaos

    hosts = spec["names"]  # hostname -> {"port", "netns", "keep"}
    s, out = started(ssh_config(spec))
    s.run(chaos.setup_code(spec["folder"], pause=spec["pause"], hang_timeout=spec["hang_timeout"]))
    down: dict[str, threading.Timer] = {}  # host -> the timer that brings its link back
    lock = threading.Lock()
    cut_off: list[int] = []  # rank pids on a host while its link was cut

    def up(host: str) -> None:
        with lock:
            if down.pop(host, None) is not None:
                link(hosts[host]["port"], "up")

    def holding(turn: chaos.Turn) -> set[int]:
        """The ranks that hold the run's state and can go on: alive, on a host whose link is up."""
        with lock:
            off = {r.pid for r in s.ranks if r.host in down}
        return {p for p in turn.keep if psutil.pid_exists(p)} - off

    def victims(turn: chaos.Turn) -> dict[str, list[int]]:
        """Hosts with ranks now, link up, whose loss leaves a rank that holds the run's state: their ranks."""
        on: dict[str, list[int]] = {}
        for r in s.ranks:
            on.setdefault(r.host, []).append(r.pid)
        keep = holding(turn)
        with lock:
            return {h: pids for h, pids in sorted(on.items()) if h not in down and keep - set(pids)}

    def cut(turn: chaos.Turn) -> str:
        choice = victims(turn)
        if not choice:
            return "none (no host can be cut)"
        host = turn.rng.choice(sorted(choice))
        seconds = turn.rng.uniform(*spec["cut_s"])
        with lock:
            link(hosts[host]["port"], "down")
            cut_off.extend(choice[host])
            down[host] = threading.Timer(seconds, up, (host,))
            down[host].start()
        return f"cut {host} (ranks {sorted(choice[host])}) for {seconds:.1f} s"

    def kill_host(turn: chaos.Turn) -> str:
        choice = victims(turn)
        if not choice:
            return "none (no host can lose its engines)"
        host = turn.rng.choice(sorted(choice))
        pids = sorted(set(choice[host]) | set(engines_in(hosts[host]["netns"], hosts[host]["keep"])))
        for pid in pids:
            turn.kill(pid)
        return f"kill every engine of {host}: {pids}"

    def kill_rank(turn: chaos.Turn) -> str:
        keep = holding(turn)
        with lock:
            choice = [r.pid for r in s.ranks if r.host not in down and keep - {r.pid}]
        if not choice:
            return "none (no rank can be killed)"
        victim = turn.rng.choice(choice)
        turn.kill(victim)
        return f"kill rank pid {victim} (holding the run: {sorted(keep)})"

    more = {"cut": cut, "kill_host": kill_host, "kill_rank": kill_rank}
    steps, size = spec["steps"], spec["n"]
    try:
        run = chaos.run_chaos(s, spec["folder"], spec["seed"], faults=spec["faults"], steps=steps,
                              gap=tuple(spec["gap"]), size=size, kinds=tuple(more), more=more,
                              deadline_s=spec["deadline_s"], until=spec["until"])
    finally:
        for host in list(down):
            down[host].cancel()
            up(host)
    run.killed += cut_off  # routed around as the killed ones are
    print(f"seed {run.seed}: {run.seconds:.1f} s, largest {run.largest}, {len(run.done)} faults\n"
          f"{run.said()}", flush=True)
    out.update(schedule=run.schedule, done=len(run.done), seconds=run.seconds, largest=run.largest,
               run_error=None if run.error is None else f"{type(run.error).__name__}: {run.error}",
               faults=[f.first_failure for f in s.faults],
               ranks_after=[[r.rank, r.host, r.pid, psutil.pid_exists(r.pid)] for r in s.ranks])
    try:
        chaos.finished_as_asked(s, run, steps, size)
    except AssertionError as exc:
        out["check_error"] = str(exc) or traceback.format_exc()
    # the links are up: the cut-off engines end (fenced); only the ranks' engines are left on the hosts
    ranks = {r.pid for r in s.ranks}

    def strays() -> dict[str, list[int]]:
        return {h: [p for p in engines_in(v["netns"], v["keep"]) if p not in ranks] for h, v in hosts.items()}

    until(lambda: not any(strays().values()), spec["fence_wait"], every=0.2)
    out["strays"] = {h: infra.describe(p) for h, p in strays().items() if p}
    s.stop()
    return out


def scenario_ssh_plain(ip, spec: dict) -> dict:
    """4 ranks on 2 hosts over ssh: a host's link cut during a plain cell, then back and `%dist restart`;
    then every engine of that host killed while idle, and `%dist restart` again."""
    from workbench import PoolConfig, Session

    opts = {"ssh_args": spec["ssh_args"], "scp_args": spec["ssh_args"], "remote_python": spec["python"]}
    config = PoolConfig(launcher="ssh", hosts=spec["hosts"], n=4, interface=spec["interface"], timeout=60,
                        launcher_options=opts)
    s = Session(config).start(progress=lambda m: print(m, flush=True))
    out: dict = {"ranks": [[r.rank, r.host, r.pid] for r in s.ranks]}
    handle = s.submit("import time\nfor _ in range(600):\n    time.sleep(0.05)")
    time.sleep(1.0)
    t_cut = time.time()
    link(spec["port"], "down")
    try:
        handle.wait(60)
        out["cell_error"] = None
    except Exception as exc:
        out["cell_error"] = f"{type(exc).__name__}: {exc}"
    out["cell_s"] = time.time() - t_cut
    out["faults_cut"] = [f.__dict__ for f in s.faults]
    link(spec["port"], "up")
    old = [r.pid for r in s.ranks if r.host == "n2"]
    out["restart_1"] = run(ip, "%dist restart")
    out["ranks_1"] = [[r.rank, r.host, r.pid] for r in s.ranks]
    run(ip, ALL_REDUCE)
    out["sum_1"] = [w["sum"] for w in s.pull("where")]
    deadline = time.monotonic() + spec["fence_wait"]
    while any(psutil.pid_exists(p) for p in old) and time.monotonic() < deadline:
        time.sleep(0.2)
    out["old_left"] = [p for p in old if psutil.pid_exists(p)]
    # every engine of n2 killed while idle: one line, one fault, then back on n2
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for r in s.ranks:
            if r.host == "n2":
                os.kill(r.pid, 9)
        deadline = time.monotonic() + 30
        while "while the pool was idle" not in printed.getvalue() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # a second line would come now
    out["idle_output"] = printed.getvalue()
    out["restart_2"] = run(ip, "%dist restart")
    out["ranks_2"] = [[r.rank, r.host, r.pid] for r in s.ranks]
    run(ip, ALL_REDUCE)
    out["sum_2"] = [w["sum"] for w in s.pull("where")]
    out["faults"] = [f.__dict__ for f in s.faults]
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed), contextlib.redirect_stdout(printed):
        s.stop()
        time.sleep(1.0)
    out["stop_output"] = printed.getvalue()
    return out


SLURM_START = "%dist start --launcher slurm -n 2 --interface lo --partition debug --time 10 --timeout 120"


def cell_error(ip, cell: str) -> str:
    """Run a cell that must fail; return what the notebook shows (the error's text)."""
    from IPython.utils.capture import capture_output

    with capture_output() as cap:
        result = ip.run_cell(cell)
    if result.success:
        raise RuntimeError(f"cell did not fail: {cell}\n{cap.stdout}")
    shown = cap.stdout + cap.stderr
    print(shown, flush=True)
    return shown


def squeue(*args: str) -> str:
    return subprocess.run(["squeue", "-h", *args], capture_output=True, text=True).stdout.strip()


def until_dead(s, rank: int, timeout: float = 60) -> bool:
    return until(lambda: rank in s.dead_ranks(), timeout, every=0.1)


def until_gone(timeout: float = 30) -> tuple[str, str]:
    """squeue's jobs and steps once Slurm has let go of them (or what is left after ``timeout``)."""
    until(lambda: not (squeue() or squeue("-s")), timeout, every=0.2)
    return squeue(), squeue("-s")


STEP = """%%distributed
import os
step = [os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID"), os.getpid()]
"""


def scenario_slurm_restart(ip, spec: dict) -> dict:
    """A 2-rank Slurm pool: rank 1 killed, `%dist restart` (a new step of the job on its node); then a
    third rank in a job of its own, that job cancelled, and `%dist restart` refused in one sentence."""
    from workbench import session
    from workbench.pool.cluster import EnginePool

    run(ip, SLURM_START)
    s = session.current()
    out: dict = {"jobs": s.pool.jobs(), "ranks": [r.__dict__ for r in s.ranks]}
    run(ip, "%%distributed\nimport os\nkept = [rank, os.getpid()]")
    run(ip, STEP)
    out["steps_before"] = s.pull("step")
    os.kill(s.ranks[1].pid, 9)
    out["seen_dead"] = until_dead(s, 1)
    t0 = time.perf_counter()
    out["restart"] = run(ip, "%dist restart")
    out["restart_s"] = time.perf_counter() - t0
    out["ranks_restarted"] = [r.__dict__ for r in s.ranks]
    out["squeue_steps"] = squeue("-s", "-o", "%i %N")
    run(ip, ALL_REDUCE)
    out["sums"] = [w["sum"] for w in s.pull("where")]
    run(ip, STEP)
    out["steps_after"] = s.pull("step")
    out["kept"] = s.pull("kept", rank=0)
    other = EnginePool.attach(s.pool.pool_id)  # as another notebook or the sidebar does, from the files
    out["attached_jobs"] = other.jobs()
    other.close()
    # a third rank in a job of its own; that job cancelled: its node is no longer the allocation's
    run(ip, "%dist scale 3")
    out["jobs_scaled"] = s.pool.jobs()
    third = s.ranks[2]
    out["third"] = third.__dict__
    subprocess.run(["scancel", third.slurm_job], check=True)
    out["seen_dead_third"] = until_dead(s, 2)
    out["refused"] = cell_error(ip, "%dist restart")
    out["scaled_back"] = run(ip, "%dist scale 2")
    run(ip, ALL_REDUCE)
    out["sums_after"] = [w["sum"] for w in s.pull("where")]
    out["kept_after"] = s.pull("kept", rank=0)
    pids = s.pids()
    run(ip, "%dist stop")
    out["squeue_after_stop"], out["steps_after_stop"] = until_gone()
    out["left"] = [p for p in pids if psutil.pid_exists(p)]
    return out


def scenario_slurm_replace(ip, spec: dict) -> dict:
    """A 2-rank Slurm pool, an elastic run with ``ElasticConfig(replace=True)``, rank 1 killed mid-run:
    its replacement starts by itself (a new step of the job) and joins at a step boundary."""
    from workbench import session

    run(ip, SLURM_START)
    s = session.current()
    out: dict = {"jobs": s.pool.jobs()}
    run(ip, "%%distributed\n" + spec["setup"])
    handle = s.submit(f"result = trainer.run(steps={spec['steps']})")
    if not wait_for_step(s, spec["at_step"]):
        raise RuntimeError("the run did not get going")
    os.kill(s.ranks[1].pid, 9)
    result = handle.wait(spec["wait"])
    out["outcomes"] = sorted(r.outcome for r in result.ranks)
    out["squeue_steps"] = squeue("-s", "-o", "%i %N")
    out["world_size"] = s.world_size
    out["steps"] = s.pull("trainer.step")
    out["events"] = s.pull("trainer.elastic.events", rank=1)
    out["step_log"] = s.pull("log.steps")
    s.run("from workbench.train import full_state_dict\n"
          "full = {k: v.tolist() for k, v in full_state_dict(trainer.model).items()}")
    out["params"] = s.pull("full")
    pids = s.pids()
    run(ip, "%dist stop")
    out["squeue_after_stop"], out["steps_after_stop"] = until_gone()
    out["left"] = [p for p in pids if psutil.pid_exists(p)]
    return out


SLURM_ENV = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_NTASKS",
             "SLURM_JOB_CPUS_PER_NODE", "SLURM_CPUS_ON_NODE", "SLURM_STEP_ID", "SLURMD_NODENAME",
             "SLURM_JOB_PARTITION", "SLURM_SUBMIT_HOST")


def scenario_allocation_env(ip, spec: dict) -> dict:
    """What a kernel inside an allocation sees: the job's variables, the job in squeue, and a step of the
    job on each of its nodes (``srun --jobid=J --overlap``, how part 1 of issue 37 starts engines)."""
    job = os.environ["SLURM_JOB_ID"]
    nodes = os.environ["SLURM_JOB_NUM_NODES"]
    step = subprocess.run(["srun", f"--jobid={job}", "--overlap", f"--nodes={nodes}",
                           f"--ntasks={nodes}", "hostname"], capture_output=True, text=True, timeout=60)
    doctor = subprocess.run([sys.executable, "-m", "workbench.cli", "doctor"], capture_output=True, text=True,
                            timeout=60)
    return {"hostname": os.uname().nodename, "env": {k: os.environ.get(k) for k in SLURM_ENV},
            "squeue": squeue("-o", "%i %T %D %N %C"), "step_hosts": sorted(step.stdout.split()),
            "step_error": step.stderr.strip(), "magics": run(ip, "%dist status"),
            "doctor": doctor.stdout + doctor.stderr}


def scenario_allocation_slurm_start(ip, spec: dict) -> dict:
    """Issue 37's first finding: ``%dist start -n 2 --launcher slurm`` from a kernel inside an allocation
    that holds every CPU of a partition that is not oversubscribed. Every job squeue shows while the start
    runs is recorded; the start's error, if it fails, is kept (before part 1: a second job pended behind
    ours)."""
    from workbench import session

    own = os.environ["SLURM_JOB_ID"]
    _, jobs_seen = jobs_watch()
    out: dict = {"own_job": own}
    t0 = time.perf_counter()
    try:
        out["started"] = run(ip, f"%dist start -n 2 --launcher slurm --partition {spec['partition']} "
                                 f"--interface {spec['interface']} --timeout {spec['timeout']}")
    except RuntimeError as exc:
        out["start_error"] = str(exc)
    out["start_s"] = time.perf_counter() - t0
    s = session.current_or_none()
    if s is not None:
        run(ip, ALL_REDUCE)
        out["where"] = s.pull("where")
        pids = s.pids()
        run(ip, "%dist stop")
        out["left"] = [p for p in pids if psutil.pid_exists(p)]
    out["jobs_seen"] = jobs_seen()
    out["squeue_after"] = squeue("-o", "%i %T")
    return out


def jobs_watch() -> tuple[dict[str, set], Callable[[], dict]]:
    """Every job squeue shows from now on, with its states (the allocation's own, and any other): returns
    what was seen so far, and the function that stops watching and returns it as lists."""
    import threading

    seen: dict[str, set] = {}
    done = threading.Event()

    def watch():
        while not done.is_set():
            for line in squeue("-o", "%i %T %r").splitlines():
                job, state, reason = line.split(" ", 2)
                seen.setdefault(job, set()).add(f"{state} ({reason})")
            done.wait(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    def stop() -> dict:
        done.set()
        watcher.join(5)
        return {job: sorted(states) for job, states in seen.items()}

    return seen, stop


def own_steps(job: str) -> list[str]:
    """The numbered steps of ``job`` squeue shows (not its batch or extern step): ``["12.3 n2", ...]``."""
    lines = squeue("-s", "-j", job, "-o", "%i %N").splitlines()
    return [line for line in lines if line.split()[0].split(".")[-1].isdigit()]


def scenario_allocation_pool(ip, spec: dict) -> dict:
    """Issue 37 part 1, inside an allocation: ``-n`` above the job refused with the numbers; ``-n`` below it
    uses part of it and says so; ``%dist start`` with no launcher takes every slot of every node as steps of
    the job (no second job at any point); status, ``workbench pools``; a killed rank back as a new step on its
    node; scaled down and up inside the job; stopped with no step left."""
    from workbench import session

    own = os.environ["SLURM_JOB_ID"]
    _, jobs_seen = jobs_watch()
    out: dict = {"own_job": own}
    out["too_many"] = cell_error(ip, f"%dist start -n {spec['too_many']}")
    out["part"] = run(ip, f"%dist start -n {spec['part']}")
    s = session.current()
    out["part_ranks"] = [[r.rank, r.host] for r in s.ranks]
    run(ip, "%dist stop")
    t0 = time.perf_counter()
    out["started"] = run(ip, "%dist start")
    out["start_s"] = time.perf_counter() - t0
    s = session.current()
    out["steps_running"] = own_steps(own)
    out["ranks"] = [r.__dict__ for r in s.ranks]
    out["status"] = run(ip, "%dist status")
    out["pools_cli"] = subprocess.run([sys.executable, "-m", "workbench.cli", "pools"], capture_output=True,
                                      text=True, timeout=60).stdout
    run(ip, ALL_REDUCE)
    out["where"] = s.pull("where")
    run(ip, STEP)
    out["steps"] = s.pull("step")
    victim = s.ranks[-1]
    os.kill(victim.pid, 9)
    out["seen_dead"] = until_dead(s, victim.rank)
    out["restart"] = run(ip, "%dist restart")
    out["ranks_restarted"] = [r.__dict__ for r in s.ranks]
    run(ip, STEP)
    out["steps_restarted"] = s.pull("step")
    n = len(s.ranks)
    out["scale_down"] = run(ip, f"%dist scale {n - 1}")
    out["scale_up"] = run(ip, f"%dist scale {n}")
    out["too_many_scale"] = cell_error(ip, f"%dist scale {n + 1}")
    out["ranks_scaled"] = [[r.rank, r.host, r.slurm_job] for r in s.ranks]
    run(ip, ALL_REDUCE)
    out["sums_scaled"] = [w["sum"] for w in s.pull("where")]
    pids = s.pids()
    run(ip, "%dist stop")
    until(lambda: not own_steps(own), 30, every=0.2)
    out["steps_after_stop"] = own_steps(own)
    out["left"] = [p for p in pids if psutil.pid_exists(p)]
    out["jobs_seen"] = jobs_seen()
    out["squeue_after"] = squeue("-o", "%i %T")
    return out


WALLTIME_TRAIN = """%%distributed
import time, torch
import workbench as wb
from torch.utils.data import TensorDataset
torch.manual_seed(0)
model = wb.shard(wb.MLP(wb.MLPConfig(n_layers=2)), "ddp")
data = wb.make_loader(TensorDataset(*wb.regression_data(4096)), 8, model=model)
saver = wb.Checkpoint(CKPT, every=100_000)  # saves only where the notebook asks it to
trainer = wb.Trainer(model, data, optim="sgd", lr=0.05, clip=None, callbacks=[saver])
t0 = time.time()
while not saver.asked and time.time() - t0 < LIMIT:  # every rank sees the same asked steps: they agree
    trainer.run(steps=1)
    time.sleep(0.1)
asked = [list(saver.asked), trainer.step]
"""


def scenario_walltime(ip, spec: dict) -> dict:
    """Issue 37 part 2, inside an allocation with a short time limit: the pool's state, ``%dist status`` and
    ``workbench pools`` give the time left; ``walltime_warning`` s before the end the notebook is warned once
    and a running Trainer with a ``wb.Checkpoint`` callback saves at its next step; when Slurm ends the job
    (its steps with it) the pool stops by itself and says so, nothing of it left (the kernel, started by
    ``salloc`` without ``--kill-command``, outlives its job as a notebook on a login node does). The same
    outside an allocation for a pool's own job (``spec["start"]``: ``--launcher slurm --time 1 ...``)."""
    from workbench import session

    told: list[list] = []
    run(ip, f"%dist start --walltime-warning {spec['warning']} {spec.get('start', '')}")
    s = session.current()
    t_ready = time.time()
    own = os.environ.get("SLURM_JOB_ID") or s.pool.jobs()[0]  # the allocation, else the pool's own job
    out: dict = {"own_job": own}

    def notify(text: str) -> None:
        told.append([time.time(), text])
        print(text, flush=True)

    s.notify = notify
    out["ends"] = s.pool.state.ends
    out["ready"] = t_ready
    out["status"] = run(ip, "%dist status")
    out["pools_cli"] = subprocess.run([sys.executable, "-m", "workbench.cli", "pools"], capture_output=True,
                                      text=True, timeout=60).stdout
    s.push({"CKPT": spec["ckpt"], "LIMIT": spec["limit"]})
    out["train"] = run(ip, WALLTIME_TRAIN)
    out["asked"] = s.pull("asked")
    out["told_at_save"] = list(told)
    pids = s.pids()
    out["stopped_by_itself"] = until(lambda: not s.running and len(told) >= 2, spec["limit"] + 120,
                                     every=0.2)
    out["told"] = told
    out["stopped_at"] = time.time()
    out["steps_after"] = own_steps(own) if squeue("-j", own) else []
    out["left"] = [p for p in pids if psutil.pid_exists(p)]
    out["job_state"] = squeue("-j", own, "-o", "%T") or "gone"
    return out


SCENARIOS = {"slurm": scenario_slurm, "slurm_restart": scenario_slurm_restart,
             "slurm_replace": scenario_slurm_replace, "mpi": scenario_mpi, "ssh": scenario_ssh,
             "ssh_cut": scenario_ssh_cut, "ssh_plain": scenario_ssh_plain, "ssh_chaos": scenario_ssh_chaos,
             "allocation_env": scenario_allocation_env,
             "allocation_slurm_start": scenario_allocation_slurm_start,
             "allocation_pool": scenario_allocation_pool,
             "walltime": scenario_walltime}


def main() -> None:
    scenario, spec, result_file = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    result: dict = {"scenario": scenario, "host": os.uname().nodename}
    try:
        from IPython.testing.globalipapp import start_ipython

        ip = start_ipython()
        ip.run_line_magic("load_ext", "workbench")
        result.update(SCENARIOS[scenario](ip, spec))
    except BaseException:
        result["error"] = traceback.format_exc()
    finally:
        from workbench import session

        if session.current_or_none() is not None:
            session.current().stop()
    with open(result_file, "w") as f:
        json.dump(result, f, default=str)


if __name__ == "__main__":
    main()
