"""Faults that keep coming (issue 38): an elastic run with ``replace=True`` survives any sequence of losses.

Reproducers of the findings first (each failed on the code before its fix), then seeded random schedules
of combined faults over one run (:mod:`tests.faults.chaos`): every step done, every sample taken once, the
fault-free run's parameters, the asked size restored and never exceeded, one fault record per lost engine
naming each of its ranks once.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from tests.conftest import PidsLimit, alive, until
from tests.faults import chaos
from tests.faults.chaos import finished_as_asked
from tests.faults.test_elastic import permutation, step_reached
from workbench import Session

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def pool(request):
    n = getattr(request, "param", 4)
    with PidsLimit(900):
        s = Session(n=n, timeout=60).start()
        started = set(s.pids())
        try:
            yield s
        finally:
            started |= set(s.pids()) | set(chaos.engines_outside(s))
            s.stop()
        assert until(lambda: alive(sorted(started)) == [], 10), "processes of the pool survived its stop"


def start_run(s: Session, folder, steps: int, pause: float = 0.02, extra: str = "") -> chaos.Chaos:
    """The chaos setup (and ``extra`` code after it), then ``steps`` steps in the background, past their
    third step."""
    s.run(chaos.setup_code(str(folder), pause=pause) + extra)
    run = chaos.Chaos(seed=-1, faults_before=len(s.faults))
    run.result = s.submit(f"result = trainer.run(steps={steps})")  # the handle until the run ends
    run.watch = run.result.cell.elastic
    assert step_reached(s, 3)
    return run


def ended(s: Session, run: chaos.Chaos, folder, timeout: float = 300) -> chaos.Chaos:
    """``run``'s handle waited for: its result (or error) and every rank's step records."""
    handle, run.result = run.result, None
    try:
        run.result = handle.wait(timeout)
    except BaseException as exc:  # noqa: BLE001 (finished_as_asked says it)
        run.error = exc
    run.records = chaos.read_records(str(folder))
    return run


def new_engine(s: Session, known: set[int], timeout: float = 60) -> int:
    """The pid of the next engine process of the pool that is not a rank and not in ``known``."""
    found: list[int] = []

    def there() -> bool:
        found[:] = [p for p in chaos.engines_outside(s) if p not in known]
        return bool(found)

    assert until(there, timeout, every=0.002), "no new engine started"
    return found[0]


def joined_pid(s: Session, first: list[int], timeout: float = 120) -> int:
    """The pid of a rank (in the rank map) that is not one of ``first``, once there is one."""
    found: list[int] = []

    def there() -> bool:
        found[:] = [r.pid for r in s.ranks if r.pid not in first]
        return bool(found)

    assert until(there, timeout, every=0.002), "no new rank joined"
    return found[0]


# -- the findings, one by one -----------------------------------------------------------------------------
@pytest.mark.parametrize("pool", [2], indirect=True)
def test_a_rank_that_joined_mid_run_is_a_member_like_any_other(pool, tmp_path):
    """F1: kill rank 0, its replacement joins, then kill the last rank the run started with: the run
    failed with a bare ``KeyError: <engine id>`` (a joined rank's standby store was never recorded, so it
    could not host the regroup)."""
    steps = 400
    first = [r.pid for r in pool.ranks]
    run = start_run(pool, tmp_path, steps)
    os.kill(first[0], signal.SIGKILL)
    assert until(lambda: pool.world_size == 2 and first[0] not in [r.pid for r in pool.ranks]
                 and not run.watch.joining and run.watch.recovering is None, 120), \
        "the replacement of rank 0 never joined"
    os.kill(first[1], signal.SIGKILL)
    run.killed = first
    ended(pool, run, tmp_path)
    finished_as_asked(pool, run, steps, 2)
    assert not set(first) & {r.pid for r in pool.ranks}


@pytest.mark.parametrize("pool", [3], indirect=True)
def test_a_loss_while_a_rank_joins_is_one_re_plan_that_takes_the_joiner_along(pool, tmp_path):
    """F2: a member lost while a replacement joins. The joiner, which had no agent until it formed the
    group, never heard the re-plan: it waited in the old group, the others in the new one, until the
    kernel killed it 5 s later ("did not answer the regroup for 5 s") and started another."""
    steps = 400
    first = [r.pid for r in pool.ranks]
    run = start_run(pool, tmp_path, steps)
    os.kill(first[2], signal.SIGKILL)
    joiner = joined_pid(pool, first)  # listed in the rank map: its join plan is out
    os.kill(joiner, signal.SIGSTOP)  # held before it forms the group...
    os.kill(first[1], signal.SIGKILL)  # ...while a member is lost
    time.sleep(0.3)
    os.kill(joiner, signal.SIGCONT)
    run.killed = [first[2], first[1]]
    ended(pool, run, tmp_path)
    texts = [f.first_failure for f in pool.faults[run.faults_before:]]
    assert not [t for t in texts if "did not answer" in t], texts
    assert joiner in [r.pid for r in pool.ranks], "the joiner was not taken along"
    finished_as_asked(pool, run, steps, 3)


# A member that said it is ready for a join plan (as the others and the joiner did) dies before it connects:
# the others are then in ``init_process_group`` of that plan, which no newer plan interrupted before the fix
# (rendezvous.InterruptibleStore). The pool's timeout is raised to 900 s on the engines, so that the time the
# others stayed there is longer than this test waits for the run (with the pool's 60 s, the survivor went on
# 57 s after the last loss, in a script run). Before the fix: the run never ended within the 240 s (failed).
DIE_IN_JOIN_INIT = """
from workbench.engine import rendezvous as _rv
_rv._state["timeout_s"] = 900
_init_group_before = _rv._init_group

def _die_in_join_init(backend, store, rank, world_size, dev, rendezvous_s=None):
    if world_size == 4 and os.path.exists(os.path.join({folder!r}, f"die-{{os.getpid()}}")):
        os.kill(os.getpid(), 9)
    return _init_group_before(backend, store, rank, world_size, dev, rendezvous_s)

_rv._init_group = _die_in_join_init
"""


def test_a_member_lost_as_a_join_plan_s_group_forms_leaves_no_rank_deaf_to_the_re_plans(pool, tmp_path):
    """The goodput bench's stall (a kill every 2 s): a member was lost the moment a replacement's join plan
    went out, then another member, then the joiner ("regrouping on 1 rank", never "continuing"; the new
    engines were given up after 120 s each, "died before it joined (TimeoutError)"). The lost member had
    said it was ready for the join plan's group: the others sat in that group's ``init_process_group``
    (bounded only by the pool's timeout) and took none of the re-plans meanwhile."""
    steps = 600
    first = [r.pid for r in pool.ranks]
    run = start_run(pool, tmp_path, steps, extra=DIE_IN_JOIN_INIT.format(folder=str(tmp_path)))
    (tmp_path / f"die-{first[2]}").touch()  # dies in the 4-rank group of the next join plan
    os.kill(first[3], signal.SIGKILL)  # its replacement's join plan is that group
    assert until(lambda: first[2] not in [r.pid for r in pool.ranks], 120), \
        f"rank 2 ({first[2]}) never died forming the join plan's group"
    joiner = [r.pid for r in pool.ranks if r.pid not in first]
    os.kill(first[1], signal.SIGKILL)  # a member, while the re-plan that takes the joiner along forms
    for pid in joiner:
        os.kill(pid, signal.SIGKILL)  # and the joiner: rank 0 is left alone
    run.killed = [first[3], first[2], first[1], *joiner]
    ended(pool, run, tmp_path, timeout=240)
    finished_as_asked(pool, run, steps, 4)


@pytest.mark.parametrize("pool", [3], indirect=True)
def test_a_scale_down_while_a_replacement_starts_is_not_undone_by_it(pool, tmp_path):
    """F3: the pool over-replaced (5 ranks of 4 asked, once 8): a replacement was one per loss, not the
    size asked for, so a ``%dist scale 2`` while the replacement of a lost rank started was undone when
    it joined. The size asked is what the run aims at, and it is never above it."""
    steps = 300
    first = [r.pid for r in pool.ranks]
    run = start_run(pool, tmp_path, steps)
    sizes: list[int] = []
    sampling = threading.Event()

    def sample():
        while not sampling.wait(0.02):
            sizes.append(pool.world_size)

    os.kill(first[2], signal.SIGKILL)
    new_engine(pool, set())  # the replacement is starting
    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    pool.scale(2)
    time.sleep(3)  # a replacement started before the scale had joined by now
    sampling.set()
    watcher.join()
    run.killed = [first[2]]
    ended(pool, run, tmp_path)
    assert max(sizes) <= 2, f"the run went above the 2 ranks asked for: {sizes}"
    finished_as_asked(pool, run, steps, 2)


@pytest.mark.parametrize("pool", [2], indirect=True)
def test_a_replacement_killed_while_it_starts_is_started_again_at_once(pool, tmp_path):
    """F4: a replacement killed while it started blocked every later one for the pool's 60 s registration
    wait, and was then given up on ("`%dist restart` tries again"): the run stayed below its size. It is
    one fault record and is started again at once."""
    steps = 400
    first = [r.pid for r in pool.ranks]
    run = start_run(pool, tmp_path, steps)
    os.kill(first[1], signal.SIGKILL)
    doomed = new_engine(pool, set())
    os.kill(doomed, signal.SIGKILL)  # before it registered
    again = new_engine(pool, {doomed})
    os.kill(again, signal.SIGKILL)  # and the next one too, wherever it is by now
    run.killed = [first[1]]
    assert until(lambda: pool.world_size == 2 and not run.watch.joining, 120), "the run stayed below 2 ranks"
    ended(pool, run, tmp_path)
    texts = [f.first_failure for f in pool.faults[run.faults_before:]]
    assert len([t for t in texts if "died before it joined" in t]) == 2, texts
    finished_as_asked(pool, run, steps, 2)


@pytest.mark.parametrize("pool", [2], indirect=True)
def test_replacements_that_keep_dying_stop_at_a_bound_with_one_sentence(pool, tmp_path, capsys):
    """F4 (the bound) and F12: replacements that die before they join are retried a few times in a row,
    then the keeper says why in one sentence and the run goes on with the ranks it has; ``%dist restart``
    then brings the pool back to its size."""
    from workbench.session.target_size import TRIES

    steps = 300
    first = [r.pid for r in pool.ranks]
    run = start_run(pool, tmp_path, steps, pause=0.05)
    os.kill(first[1], signal.SIGKILL)
    seen: set[int] = set()
    for _ in range(TRIES):
        doomed = new_engine(pool, seen)
        seen.add(doomed)
        os.kill(doomed, signal.SIGKILL)
    run.killed = [first[1]]
    ended(pool, run, tmp_path)
    assert run.error is None, run.error
    out = capsys.readouterr().out
    assert f"{TRIES} new engines in a row died before they joined the run" in out, out
    assert "`%dist restart` tries again" in out
    chaos.check_once(run.records, steps)
    assert pool.world_size == 1
    pool.restart()
    assert pool.world_size == 2
    assert pool.run("result = trainer.run(steps=5)").ranks[1].outcome == "ok"
    assert pool.pull("trainer.step") == [steps + 5] * 2


@pytest.mark.parametrize("pool", [2], indirect=True)
def test_the_end_of_a_run_is_heard_at_once_while_a_replacement_hangs_in_its_start(pool, tmp_path):
    """F5: the cell's result waited for the replacement's thread (up to 60 s each, behind the registration
    wait): a run that ended, or failed, reached the notebook up to 120 s late. The run's end stops the
    new engines on their way."""
    steps = 60
    first = [r.pid for r in pool.ranks]
    run = start_run(pool, tmp_path, steps, pause=0.05)
    os.kill(first[1], signal.SIGKILL)
    hung = new_engine(pool, set())
    os.kill(hung, signal.SIGSTOP)  # it never registers
    try:
        run.result.wait(300)
        heard = time.time()
        last = max(t for records in chaos.read_records(str(tmp_path)) for *_, t in records)
        assert heard - last < 20, f"the run's end was heard {heard - last:.0f} s after its last step"
        assert until(lambda: alive([hung]) == [], 10), "the hung new engine was left behind"
    finally:
        chaos._kill(hung, signal.SIGCONT)


@pytest.mark.parametrize("pool", [2], indirect=True)
def test_a_joiner_that_stops_answering_is_routed_around_in_seconds(pool, tmp_path):
    """F6, F7: a replacement listed in the rank map that stops before it formed the group: the members
    waited for it the pool's whole timeout (60 s, no step meanwhile, `%dist status` listing it busy), then
    gave up with ``RegroupAbandoned`` and the run failed. It is listed as joining, killed once it has been
    silent a few seconds, and replaced."""
    steps = 300
    first = [r.pid for r in pool.ranks]
    run = start_run(pool, tmp_path, steps)
    os.kill(first[1], signal.SIGKILL)
    joiner = joined_pid(pool, first)
    os.kill(joiner, signal.SIGSTOP)
    try:
        rows = pool.status()
        assert [row["state"] for row in rows if row["pid"] == joiner] == ["joining"], rows
        assert until(lambda: alive([joiner]) == [], 30), "the silent joiner was waited for"
    finally:
        chaos._kill(joiner, signal.SIGCONT)
    run.killed = [first[1], joiner]
    ended(pool, run, tmp_path)
    texts = [f.first_failure for f in pool.faults[run.faults_before:]]
    assert [t for t in texts if "did not answer the regroup" in t and "joining" in t], texts
    steps_at = sorted(t for records in run.records for *_, t in records)
    still = max(b - a for a, b in zip(steps_at, steps_at[1:], strict=False))
    assert still < 20, f"the run stood still for {still:.0f} s"
    finished_as_asked(pool, run, steps, 2)


@pytest.mark.parametrize("pool", [2], indirect=True)
def test_a_scale_during_the_run_survives_its_new_engine_dying(pool, tmp_path):
    """F8: ``%dist scale 3`` during the run raised raw internal errors (``EngineError``, ``KeyError``) when
    its new engine died while it started. It starts another, and scale returns the grown rank map."""
    steps = 400
    run = start_run(pool, tmp_path, steps)
    grown: list = []
    scaling = threading.Thread(target=lambda: grown.append(pool.scale(3)), daemon=True)
    scaling.start()
    os.kill(new_engine(pool, set()), signal.SIGKILL)
    scaling.join(150)
    assert len(grown) == 1 and len(grown[0]) == 3, "the scale did not return the grown rank map"
    pool.scale(2)
    ended(pool, run, tmp_path)
    finished_as_asked(pool, run, steps, 2)


# While the flag file is there a rank holds in its backward (past the last layer's gradients, before the
# first's, so before DDP's gradient hook) until its group is aborted; the model and its numbers are unchanged.
# Meanwhile it holds the agent's plan box too, so the plan that comes with the abort is posted only once
# this thread waits for it: the order the suite's load made (the step raised before the plan was there),
# every time. The next step lets the box go.
HOLD_IN_BACKWARD = """
from workbench.engine import agent as _agent
_holding = []

def _hold(grad):
    if os.path.exists({flag!r}) and not _holding:
        _agent._plan_posted.acquire()
        _holding.append(True)
        open(os.path.join({folder!r}, f"held-{{os.getpid()}}"), "w").close()
        deadline = time.monotonic() + 60
        while dist.is_initialized() and time.monotonic() < deadline:
            time.sleep(0.001)

def _held_output(module, inputs, output):
    while _holding:
        _holding.pop()
        _agent._plan_posted.release()
    output.register_hook(_hold)

trainer.module.pre.register_forward_hook(_held_output)
"""


@pytest.mark.parametrize("pool", [2], indirect=True)
def test_a_loss_while_a_rank_computes_its_gradients_is_routed_around(pool, tmp_path):
    """Seeded chaos, seed 3: "rank 0 raised AttributeError: 'NoneType' object has no attribute 'size'" and
    the run failed. The kernel aborts a survivor's group before it posts the regroup plan; a survivor still
    in its backward then reached DDP's gradient hook, which after a first regroup looks the group up at each
    call, with no group (``dist.group.WORLD`` is None): an error no collective words, taken for the user's
    own unless the plan had come already."""
    steps = 400
    first = [r.pid for r in pool.ranks]
    flag = tmp_path / "hold"
    hold = HOLD_IN_BACKWARD.format(flag=str(flag), folder=str(tmp_path))
    run = start_run(pool, tmp_path, steps, extra=hold)
    os.kill(first[1], signal.SIGKILL)  # a first regroup, and its replacement joins
    assert until(lambda: pool.world_size == 2 and first[1] not in [r.pid for r in pool.ranks]
                 and not run.watch.joining and run.watch.recovering is None, 120), \
        "the replacement of rank 1 never joined"
    replacement = pool.ranks[1].pid
    flag.touch()
    held = tmp_path / f"held-{first[0]}"
    assert until(held.exists, 60), "rank 0 never held in its backward"
    flag.unlink()  # the steps after the regroup and the next replacement do not hold
    os.kill(replacement, signal.SIGKILL)  # rank 0 waits in its backward until its group is aborted
    run.killed = [first[1], replacement]
    ended(pool, run, tmp_path)
    finished_as_asked(pool, run, steps, 2)


@pytest.mark.parametrize("pool", [3], indirect=True)
def test_fault_records_name_each_lost_rank_once(pool, tmp_path):
    """Smaller finding: merged fault texts like "ranks 2,2 died": a rank that left kept its old number in
    the cell, so the death of the rank that later took that number named both."""
    steps = 300
    run = start_run(pool, tmp_path, steps)
    pool.scale(2)  # rank 2 leaves
    pool.scale(3)  # a new rank 2 joins
    newest = pool.ranks[2].pid
    os.kill(newest, signal.SIGKILL)
    run.killed = [newest]
    ended(pool, run, tmp_path)
    texts = [f.first_failure for f in pool.faults[run.faults_before:]]
    assert [t for t in texts if t.startswith("rank 2 died")], texts
    finished_as_asked(pool, run, steps, 3)


def kill_before_the_tick(s: Session, run: chaos.Chaos, what: str, victim: int) -> list[bool]:
    """The moment a ``what`` request ("join", "leave") waits for the run's next tick: kill ``victim`` and let
    that tick run only once the pool's health has found it dead, before the cell's wait loop has looked at
    the deaths (the order the suite's load made once, seed 1). Runs on the cell's thread; the list it
    returns says whether it happened (one entry: the death was seen)."""
    watch, tick = run.watch, run.watch.tick
    done: list[bool] = []

    def dead() -> bool:
        return any(r.pid == victim and r.rank in s.rooms.health.dead for r in s.ranks)

    def tick_after_the_death() -> None:
        if not done and watch.recovering is None and watch.settings is not None \
                and any(w == what for w, _, _ in list(watch.requests)):
            os.kill(victim, signal.SIGKILL)
            done.append(until(dead, 30, every=0.002))
        tick()

    watch.tick = tick_after_the_death
    return done


@pytest.mark.parametrize("pool", [3], indirect=True)
@pytest.mark.parametrize("what", ["join", "leave"])
def test_a_rank_killed_as_a_join_or_leave_is_planned_is_lost_not_left_out(pool, tmp_path, what):
    """Seeded chaos, seed 1: "killed ranks the run never routed around": a member killed a moment before the
    tick that carried out a join (or a leave) was left out of that plan (the plan counted only the living)
    without a fault record, before the wait loop routed around it: the run went on, the engine was in no
    record. A death not yet routed around is routed around first; the join or leave waits for that plan."""
    steps = 400
    first = [r.pid for r in pool.ranks]
    run = start_run(pool, tmp_path, steps)
    done = kill_before_the_tick(pool, run, what, first[0])
    if what == "join":
        os.kill(first[2], signal.SIGKILL)  # its replacement asks to join
        run.killed, size = [first[2], first[0]], 3
    else:
        pool.scale(2)  # the leave is asked for
        run.killed, size = [first[0]], 2
    assert until(lambda: done, 120), f"no {what} was asked for"
    assert done == [True], "the health watcher never found the victim dead"
    ended(pool, run, tmp_path)
    texts = [f.first_failure for f in pool.faults[run.faults_before:]]
    assert [t for t in texts if t.startswith("rank 0 died")], texts
    finished_as_asked(pool, run, steps, size)


UNEVEN = """
import torch, workbench as wb
from torch.utils.data import TensorDataset
torch.manual_seed(0)
x, y = wb.regression_data(960, d_in=8, d_out=2)
cfg = wb.MLPConfig(d_in=8, d_hidden=32, d_out=2, n_layers=2)
model = wb.shard(wb.MLP(cfg).double(), "ddp")
data = wb.ElasticLoader(TensorDataset(x.double(), y.double()), global_batch=50)
trainer = wb.Trainer(model, data, lr=0.05, optim="sgd", clip=None, elastic=True)
losses = [s.loss for s in trainer.run(steps=4).history]
"""


@pytest.mark.parametrize("pool", [3], indirect=True)
def test_the_loss_reported_at_an_uneven_world_size_is_the_whole_batch_s(pool):
    """Smaller finding: at world sizes 3 and 5 the reported loss differed from the reference by up to
    1.6 % (the parameters did not): the ranks' shares of a global batch that does not split evenly were
    averaged as if equal. 50 samples over 3 ranks are 17, 17 and 16."""
    from workbench import MLP, MLPConfig, regression_data

    pool.run(UNEVEN)
    got = pool.pull("losses", rank=0)
    torch.manual_seed(0)
    x, y = regression_data(960, d_in=8, d_out=2)
    x, y = x.double(), y.double()
    model = MLP(MLPConfig(d_in=8, d_hidden=32, d_out=2, n_layers=2)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    want = []
    for k in range(4):
        idx = permutation(0)[k * 50:(k + 1) * 50]
        loss = MLP.loss_fn(model(x[idx]), y[idx])
        want.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


# -- seeded random schedules of every fault kind ------------------------------------------------------------
# Two seeds run in make test (about 2 minutes each on 2 cores); WORKBENCH_CHAOS_SEEDS=1,2,3,4 picks others.
# Failures met under load and mended, each with its reproducer above: seed 3's (DDP's gradient hook raising
# AttributeError after the abort: test_a_loss_while_a_rank_computes_its_gradients_is_routed_around), seed 1's
# (a killed engine neither lost by the run nor in the pool: a member killed a moment before the tick that
# carried out a join was left out of the join's plan, unrecorded:
# test_a_rank_killed_as_a_join_or_leave_is_planned_is_lost_not_left_out).
@pytest.mark.parametrize("seed", [int(x) for x in os.environ.get("WORKBENCH_CHAOS_SEEDS", "1,2").split(",")])
def test_combined_random_faults_every_step_every_sample_once(pool, tmp_path, seed):
    steps = 3000
    pool.run(chaos.setup_code(str(tmp_path)))
    run = chaos.run_chaos(pool, str(tmp_path), seed, faults=20, steps=steps, gap=(0.5, 2.5))
    print(f"seed {seed}: {run.seconds:.1f} s, largest {run.largest}, {len(run.done)} faults\n{run.said()}")
    finished_as_asked(pool, run, steps, 4)
    assert len(run.done) >= 20, f"seed {seed}: only {len(run.done)} faults before the run neared its end"
