"""The engine's agent: a daemon thread that speaks for the rank while its main thread is busy.

While a cell runs, the engine's main thread is inside user code (a collective, a CUDA sync, a long
step), and anything sent through ipyparallel waits behind it. The agent does not. Four times a
second while a cell or call runs (once a second between them: the engine's request handlers wake it
when one begins) it sends a beacon (which collective is in flight, the last one completed, the line the main
thread is on, the Trainer's step) up the pool's side channel, and it takes signed commands from any
session of the pool:

- ``stop``: ask a running :class:`~workbench.train.Trainer` to stop at the next step boundary (every
  rank agrees on the step through the all-reduce the Trainer does anyway);
- ``checkpoint``: ask a running Trainer's ``Checkpoint`` callback to save at the next step boundary (the
  pool's Slurm job ends soon; every rank agrees on the step the same way, and a rank that hears the
  command after the others saved does not save again: :func:`checkpoint_requested`);
- ``abort``: abort this rank's process group from this thread, so the main thread, blocked in a
  collective with a rank that failed or stalled, is released and keeps its Python state;
- ``stacks``: every thread's stack, taken here (:mod:`workbench.engine.stacks`), sent up under the
  ``stacks`` topic; with ``native``, py-spy's native frames too, from a thread of its own so that
  beacons go on meanwhile;
- ``interrupt``: SIGINT the main thread; ``signal``: send this process the signal ``sig`` (for ranks on
  other machines, which the kernel cannot signal by pid; engines have no ipyparallel nanny);
- ``fence``: this engine (by host and pid) was declared lost and the run went on without it: it ends
  itself at once (a link that came back must not bring back a rank that trains on its own);
- ``regroup``: an elastic Trainer's group changes (a rank was lost, or ranks join or leave): the plan
  waits here for the Trainer (:func:`take_plan`); after a death (``abort``) the old group is aborted
  first, so that a main thread blocked in a collective with the lost rank is released at once.

A command counts only if it is signed with the pool's key, names this rank (a regroup: this engine,
by host and pid), is for the current process group (a regroup: for a newer one) and was not seen before.

>>> start(channel, rank=0, generation=1)     # doctest: +SKIP
>>> stop_requested()                          # doctest: +SKIP
False
"""

from __future__ import annotations

import collections
import json
import math
import os
import signal
import socket
import sys
import threading
import time
import uuid

from workbench import wire
from workbench.engine import guard, hub_link

BEACON_PERIOD_S = 0.25
FENCED_EXIT = 75  # the exit status of an engine that stopped itself because it was fenced
_HOST = socket.gethostname()  # with the pid, how a fenced engine is named
# Characters of a stacks answer per message: JSON-quoted again, a part stays under wire.MAX_BYTES.
STACKS_PART = 24_000
# Between cells a beacon that says what the last one said is sent only this often: it tells the kernel the
# rank is alive (a rank on another node counts as dead after 3 s of silence, session/health.py). While a
# cell or call runs every beat is sent (the kernel reads their timing as well as their content). Between
# cells the agent wakes only this often (a pool of 64 idle ranks woke 256 times a second); a request that
# begins wakes it at once (:func:`_wake_on_requests`).
IDLE_BEACON_S = 1.0
# The kernel's requests whose handling makes the main thread busy (guard.BUSY_FRAMES): each wakes the agent.
REQUESTS = ("execute_request", "apply_request")

# What the Trainer tells the beacon about itself ({"step": 12, "running": True, "step_time": 0.05}).
trainer_status: dict = {}
# An elastic regroup that waits for its members ({"generation": 3, "missing": [2], "since": t}): the kernel
# re-plans without members that do not answer.
regroup_status: dict = {}
_stop = threading.Event()
# checkpoint commands heard, and checkpoint steps taken (every rank takes them at the same steps): a rank has
# one to take while it heard more than were taken
_checkpoints = {"asked": 0, "taken": 0, "reason": ""}
_agent: Agent | None = None
_plans: collections.deque = collections.deque()  # regroup plans (None: the kernel gave up on regrouping)
_plan_posted = threading.Condition()


def trainer_says(*, fresh: bool = False, **status) -> None:
    """Update what the beacon says of the Trainer, and beat within a fifth of a period: a Ctrl-C picks the
    step-boundary stop from the beacons only once they say a Trainer runs (``session/cell_run.py``).
    ``fresh``: what it said of an earlier Trainer or run is forgotten first (a plain Trainer's run after an
    elastic one's must not say "elastic")."""
    if fresh:
        trainer_status.clear()
    trainer_status.update(status)
    if _agent is not None:
        _agent.wake()


def stop_requested() -> bool:
    """Whether a session asked the running Trainer to stop at the next step boundary."""
    return _stop.is_set()


def clear_stop() -> None:
    """Forget a stop request (a new run begins)."""
    _stop.clear()


def checkpoint_requested() -> bool:
    """Whether this rank heard a checkpoint command the ranks have not yet saved for.

    >>> checkpoint_requested(); _checkpoints["asked"] += 1; checkpoint_requested()
    False
    True
    >>> _ = checkpoint_taken(); checkpoint_requested()
    False
    """
    return _checkpoints["asked"] > _checkpoints["taken"]


def checkpoint_taken() -> str:
    """Every rank saved at this step because some rank had heard a checkpoint command: one command served
    (a rank that hears it only now does not save again). Returns why it was asked for."""
    _checkpoints["taken"] += 1
    return _checkpoints["reason"]


def plan_pending() -> bool:
    """Whether a regroup plan (or a refusal) waits for the Trainer."""
    return bool(_plans)


def take_plan(timeout: float) -> dict | None:
    """The newest regroup plan, waiting up to ``timeout`` s for one; None when none came or the kernel
    stopped the cell instead (an ``abort`` that is no regroup: the error is the user's, or too few
    ranks are left)."""
    with _plan_posted:
        _plan_posted.wait_for(lambda: _plans, timeout)
        plan = _plans[-1] if _plans else None
        _plans.clear()
    return plan


def clear_plans() -> None:
    """Forget plans and refusals of an earlier run."""
    with _plan_posted:
        _plans.clear()


def _post(plan: dict | None) -> None:
    with _plan_posted:
        _plans.append(plan)
        _plan_posted.notify_all()


class Agent:
    """The thread: beacons up, commands down, over the pool's relay (see :mod:`workbench.wire`)."""

    def __init__(self, channel: dict, rank: int, generation: int):
        import zmq

        # through the host's hub where the engine has one (it forwards beacons as one table per host)
        self.channel, self.rank, self.generation = dict(hub_link.via_hub(channel)), rank, generation
        self._target_lock = threading.Lock()  # rank and generation change under an elastic regroup
        self.planned = generation  # the newest regroup plan posted (the kernel sends a plan again to a member
        # it does not see in the new group yet: a plan already posted is not posted twice)
        self.signer = wire.Signer(channel["key"])
        self.pub = uuid.uuid4().hex[:12]
        self.seq = 0
        self._last_beat: dict | None = None  # the last beacon sent, and when (monotonic)
        self._last_sent = 0.0
        self.bad = 0  # commands dropped: forged, malformed, for another group or seen before
        self.done: list[str] = []  # the commands carried out, in order
        self.wakeups = 0  # rounds of the loop (between cells about one a second)
        self._seen: collections.deque = collections.deque(maxlen=512)
        self._ctx = zmq.Context()
        self._push = wire.pusher(self._ctx, self.channel["up"], hwm=8)  # a slow kernel drops old beats
        self._sub = wire.subscriber(self._ctx, self.channel["out"], wire.COMMAND)
        self._wake_r, self._wake_w = os.pipe()  # a byte here: a request began (see wake)
        os.set_blocking(self._wake_w, False)
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="workbench-agent", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        next_beat = 0.0
        try:
            while not self._halt.is_set():
                self.wakeups += 1
                now = time.monotonic()
                if now >= next_beat:  # the first beat at once, then one a period (a long one when idle)
                    busy = self._beat(now)
                    next_beat = now + (BEACON_PERIOD_S if busy else IDLE_BEACON_S)
                # whole milliseconds, rounded up: zmq truncates, and a beat 0.9 ms away would spin until it
                ready = dict(poller.poll(math.ceil(max(0.0, next_beat - time.monotonic()) * 1000)))
                if self._wake_r in ready:  # a request began: beat now, and every period while it runs
                    os.read(self._wake_r, 4096)
                    next_beat = min(next_beat, time.monotonic() + BEACON_PERIOD_S / 5)
                if self._sub in ready:
                    while self._sub.poll(0):
                        self.handle(self._sub.recv_multipart())
        except zmq.ZMQError:
            pass  # the context went away under us: the engine is shutting down
        finally:
            self._push.close(0)
            self._sub.close(0)
            self._ctx.term()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def wake(self) -> None:
        """A request began on the main thread: beat within a fifth of a period, then every period."""
        try:
            os.write(self._wake_w, b"!")
        except (BlockingIOError, OSError):  # already woken (the pipe is full), or closed
            pass

    def _beat(self, now: float) -> bool:
        """Send a beacon if it is due (:func:`should_send`); whether the main thread is busy."""
        import zmq

        with self._target_lock:
            beat = guard.snapshot(self.rank)
            beat.update(generation=self.generation, trainer=dict(trainer_status), host=_HOST,
                        regroup=dict(regroup_status) or None, children=_started())
        if not should_send(beat, self._last_beat, now - self._last_sent):
            return beat["busy"]
        self._last_beat, self._last_sent = beat, now
        beat = {**beat, "pub": self.pub, "seq": self.seq}
        self.seq += 1
        try:
            self._push.send_multipart(self.signer.pack(wire.BEACON, json.dumps(beat).encode()), zmq.NOBLOCK)
        except zmq.Again:
            pass
        return beat["busy"]

    def handle(self, frames: list[bytes]) -> str | None:
        """Carry out one command message; returns what it did (None when it was dropped)."""
        try:
            _, body = self.signer.unpack(frames)
            cmd = json.loads(body)
            what, ranks, gen, cmd_id = wire.Command(cmd["do"]), cmd["ranks"], cmd["generation"], cmd["id"]
        except (wire.BadMessage, ValueError, KeyError, TypeError):  # an unknown "do" too (ValueError)
            self.bad += 1
            return None
        with self._target_lock:
            if what is wire.Command.FENCE:  # addressed to engines (host, pid): a fenced one has no rank
                if [socket.gethostname(), os.getpid()] not in cmd.get("engines", []):
                    return None
                current = True
            elif what is wire.Command.REGROUP:  # addressed to engines (host, pid): ranks are what it changes
                plan = cmd.get("plan") or {}
                me = [socket.gethostname(), os.getpid()]
                if me not in [*plan.get("members", []), *plan.get("leaving", [])]:
                    return None
                current = plan.get("generation", -1) > max(self.generation, self.planned)
                if current:
                    self.planned = plan["generation"]
            else:
                if self.rank not in ranks:
                    return None
                current = gen == self.generation
            if not current or cmd_id in self._seen:
                self.bad += 1
                return None
        self._seen.append(cmd_id)
        done = str(what)
        if what is wire.Command.STOP:
            _stop.set()
        elif what is wire.Command.CHECKPOINT:
            _checkpoints["asked"] += 1
            _checkpoints["reason"] = str(cmd.get("reason", ""))
        elif what is wire.Command.ABORT:  # peers: where the group's ranks listen, [ip, port] each
            _post(None)  # an elastic Trainer waiting for a regroup plan: none will come
            cut = guard.abort(cmd.get("peers", []))
            done = f"abort ({cut} connections cut)" if cut is not None else "abort (no group)"
        elif what is wire.Command.REGROUP:
            if cmd.get("abort"):  # a rank was lost: release a main thread blocked in a collective with it,
                guard.abort(cmd.get("peers", []))  # before the plan is posted (the new group forms after)
            _post(plan)
        elif what is wire.Command.FENCE:
            fence_self()
        elif what is wire.Command.STACKS:
            self._stacks(str(cmd.get("request", "")), bool(cmd.get("native")))
        elif what is wire.Command.INTERRUPT:
            os.kill(os.getpid(), signal.SIGINT)
        elif what is wire.Command.SIGNAL and isinstance(cmd.get("sig"), int):
            done = f"signal {cmd['sig']}"
            self.done.append(done)  # before: the signal may end this process
            os.kill(os.getpid(), cmd["sig"])
            return done
        else:
            self.bad += 1
            return None
        self.done.append(done)
        return done

    def _stacks(self, request: str, native: bool) -> None:
        from workbench.engine import stacks

        with self._target_lock:
            rank, generation = self.rank, self.generation
        if not native:  # at once, from this thread (it owns the push socket)
            self._send_stacks(self._push, request, rank, generation, stacks.take())
            return

        def take_native() -> None:
            import zmq

            ctx = zmq.Context()
            push = wire.pusher(ctx, self.channel["up"], hwm=64)
            try:
                self._send_stacks(push, request, rank, generation, stacks.take(native_frames=True))
            finally:
                push.close(1000)  # what is queued still goes
                ctx.term()

        threading.Thread(target=take_native, name="workbench-stacks", daemon=True).start()

    def _send_stacks(self, push, request: str, rank: int, generation: int, taken: dict) -> None:
        """Send ``taken`` in parts that each fit a side-channel message."""
        import zmq

        taken.update(rank=rank, generation=generation, host=socket.gethostname())
        text = json.dumps(taken)
        parts = [text[i:i + STACKS_PART] for i in range(0, len(text), STACKS_PART)] or [""]
        for i, part in enumerate(parts):
            body = {"request": request, "rank": rank, "part": i, "parts": len(parts), "data": part}
            try:
                push.send_multipart(self.signer.pack(wire.STACKS, json.dumps(body).encode()), zmq.NOBLOCK)
            except zmq.Again:
                return  # the relay is not taking messages: the kernel says this rank did not answer

    def retarget(self, rank: int, generation: int) -> None:
        """Speak for ``rank`` of group ``generation`` from now on (an elastic regroup renumbered us)."""
        with self._target_lock:
            self.rank, self.generation = rank, generation

    def close(self) -> None:
        self._halt.set()
        if self._thread is not threading.current_thread():
            self._thread.join(2)


def fence_self() -> None:
    """The kernel declared this engine lost and went on without it: it must never train or answer
    again. Say so where the engine's log goes, then end the process at once (no cleanup: it holds
    nothing the others need, and its group is gone)."""
    import sys

    print(f"workbench: this engine ({socket.gethostname()}, pid {os.getpid()}) was declared lost and "
          "fenced; it stops", file=sys.__stderr__, flush=True)
    os._exit(FENCED_EXIT)


def _started() -> list[list]:
    """The processes this rank started and that still run: ``[[pid, command line], ...]`` (a few)."""
    from workbench.engine import children

    return [[pid, line[:80]] for pid, line in children.descendants()[:16]]


def should_send(beat: dict, last: dict | None, since_last: float) -> bool:
    """Whether this beat goes up: always while the main thread is busy (``beat["busy"]``) or when it says
    something new (its time aside), else once every :data:`IDLE_BEACON_S`.

    >>> idle = {"t": 1.0, "busy": False, "where": "x"}
    >>> should_send(idle, None, 0.0), should_send({**idle, "t": 2.0}, idle, 0.3)
    (True, False)
    >>> should_send({**idle, "where": "y"}, idle, 0.3), should_send(idle, idle, 1.0)
    (True, True)
    >>> should_send({**idle, "busy": True}, {**idle, "busy": True}, 0.25)
    True
    """
    if last is None or beat.get("busy") or since_last >= IDLE_BEACON_S:
        return True
    return any(v != last.get(k) for k, v in beat.items() if k != "t")


def start(channel: dict, rank: int, generation: int) -> Agent:
    """(Re)start this engine's agent for a newly formed group."""
    global _agent
    stop()
    clear_plans()
    _agent = Agent(channel, rank, generation)
    _wake_on_requests()
    global _warm_thread
    if not _warmed.is_set():
        _warmed.set()
        _warm_thread = threading.Thread(target=_warm_tracebacks, name="workbench-warm", daemon=True)
        _warm_thread.start()
    return _agent


def _wake_on_requests() -> None:
    """Make the engine's handlers of :data:`REQUESTS` wake the current agent first (once per process), so
    that it sleeps between cells and beacons from a cell's first quarter second."""
    try:
        from IPython import get_ipython

        handlers = get_ipython().kernel.shell_handlers
    except AttributeError:  # no engine kernel (a test's bare process): the agent beats on its clock alone
        return
    for name in REQUESTS:
        handler = handlers.get(name)
        if handler is None or getattr(handler, "__wakes_agent__", False):
            continue

        def waking(*args, __handler=handler, **kwargs):
            if _agent is not None:
                _agent.wake()
            return __handler(*args, **kwargs)

        waking.__wakes_agent__ = True
        handlers[name] = waking


_warmed = threading.Event()
_warm_thread: threading.Thread | None = None  # started by an engine that was not forked from a zygote


def skip_warming() -> None:
    """This engine was forked from a zygote: the sources the zygote parsed before the fork are this engine's
    too (copy-on-write); what it had not parsed yet, the first error report parses. Nothing is repeated by
    every engine after the fork (importing the trainer and parsing for each of N engines at once is what
    made the first cells after a start slow)."""
    _warmed.set()
# Files that are in nearly every traceback a rank reports after a fault (the collective that failed):
# IPython reads and parses each one it shows, which takes ~0.4 s for distributed_c10d.py alone, once.
_TRACEBACK_MODULES = ("torch.distributed.distributed_c10d", "torch.distributed.c10d_logger",
                      "torch.nn.modules.module", "torch._tensor", "torch.autograd", "torch.autograd.graph",
                      "workbench.engine.guard", "workbench.train.trainer")


def _warm_tracebacks(delay: float = 0.2) -> None:
    """Parse ahead of time, at low priority, what IPython will parse when this rank first reports an
    error, so that the first fault of a session is stopped as fast as the later ones."""
    time.sleep(delay)  # after the first cells, not during the start
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux)
    except (AttributeError, OSError):
        pass
    parse_traceback_sources()


def parse_traceback_sources(only_loaded: bool = False) -> None:
    """Parse the files of :data:`_TRACEBACK_MODULES` into stack_data's cache (the zygote does it once for
    every engine it forks; an engine started on its own does it in the background). ``only_loaded``: skip
    the modules not imported yet (the trainer: seconds to import) rather than import them."""
    import importlib
    import sys

    try:
        import stack_data
    except ImportError:
        return
    for name in _TRACEBACK_MODULES:
        module = sys.modules.get(name)
        if module is None and name.startswith("workbench.") and not only_loaded:
            module = importlib.import_module(name)
        path = getattr(module, "__file__", None)
        if path:
            try:
                _ = stack_data.Source.for_filename(path).tree  # cached for the engine's lifetime
            except Exception:
                pass


def format_a_collective_traceback() -> None:
    """Format, as an engine's IPython does when a rank reports a failed collective, the traceback of a
    ``dist.all_reduce`` that raised (here: no group). A zygote does it once before its first fork: pygments
    compiles its Python lexer, asttokens and stack_data split the files shown, ``inspect`` maps every
    module's file. Left to the forked engines, each of them did all of it at the first fault, at once
    (~0.2 s of CPU per rank: 31 ranks released by an abort took 6-9 s to report on 2 cores).

    >>> format_a_collective_traceback()   # doctest: +SKIP
    """
    try:
        import torch
        import torch.distributed as dist
        from IPython.core.ultratb import AutoFormattedTB
    except ImportError:
        return
    if dist.is_initialized():
        return  # a rank in a group: its collective would run
    try:
        exec(compile("dist.all_reduce(torch.ones(1))\n", "<workbench-warm-up>", "exec"),
             {"dist": dist, "torch": torch})
    except Exception:  # ValueError: no default process group, raised inside distributed_c10d
        try:
            AutoFormattedTB(mode="Context", theme_name="neutral").structured_traceback(*sys.exc_info())
        except Exception:
            pass  # a warm-up only


def stop() -> None:
    """Stop this engine's agent (the group is being left)."""
    global _agent
    if _agent is not None:
        _agent.close()
        _agent = None


def current() -> Agent | None:
    return _agent
