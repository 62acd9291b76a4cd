"""The controller's heartbeat: fast while engines come, slow once the pool is settled.

ipyparallel's controller pings every engine each heartbeat period, and counts an engine that registered
only once its heart has answered a ping. A start wants that period short (100 ms: an engine counts at
once), an idle pool does not: at 100 ms, 8 idle ranks cost 2% of a core in pings and pongs (the
controller's heart monitor, every engine's heart thread and ZMQ's I/O threads), more with every rank.
So the heart monitor beats fast while engines register and while any heart missed a beat, and slows
to :data:`SETTLED_MS` after :data:`QUIET_S` in which nothing changed; a registration request wakes it
up again at once (the hub signals the heart monitor's process), so a restart or a joining rank counts
as fast as at the start. An engine is dropped after the same time without an answer at either pace
(the controller's last resort: deaths are found by the workbench's own watch within a second).

Installed in the controller's process before ipyparallel starts it (:func:`install`); the heart
monitor's process is forked from it and inherits the change.

>>> misses_for(100, 10.0), misses_for(1000, 10.0)
(100, 10)
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

SETTLED_MS = 1000  # the period once nothing changed for QUIET_S
QUIET_S = 2.0  # after the last new heart or registration: the first cells after a start run at the slow pace
WAKE = signal.SIGUSR1  # sent by the hub to the heart monitor's process: an engine registers


@dataclasses.dataclass
class Pace:
    """What the heart monitor keeps of its pace: the fast period, the time to give up on a heart, and since
    when nothing changed."""

    fast_ms: int
    give_up_s: float
    quiet_from: float = dataclasses.field(default_factory=time.monotonic)


def misses_for(period_ms: int, give_up_s: float) -> int:
    """How many missed beats at ``period_ms`` make ``give_up_s`` seconds."""
    return max(1, round(give_up_s * 1000 / period_ms))


def install() -> None:
    """Make this controller's heart monitor adapt its period, and its hub wake it on a registration.
    The fast period and the time to give up are the controller's configured ``HeartMonitor.period``
    and ``period * max_heartmonitor_misses``."""
    from ipyparallel.controller.app import IPController
    from ipyparallel.controller.heartmonitor import HeartMonitor
    from ipyparallel.controller.hub import Hub

    start, beat, register = HeartMonitor.start, HeartMonitor.beat, Hub.register_engine
    signal.signal(WAKE, signal.SIG_IGN)  # until the heart monitor listens: its process inherits this

    def adaptive_start(self):
        self.workbench_pace = Pace(self.period, self.period * self.max_heartmonitor_misses / 1000)
        start(self)
        import asyncio

        asyncio.get_running_loop().add_signal_handler(WAKE, lambda: _pace(self, self.workbench_pace.fast_ms))

    def adaptive_beat(self):
        hearts = len(self.hearts)
        beat(self)
        now = time.monotonic()
        if len(self.hearts) != hearts or self.on_probation:
            self.workbench_pace.quiet_from = now
            if self.on_probation:  # a heart is late: look at it often again (the counts carry over)
                _pace(self, self.workbench_pace.fast_ms)
        elif self.period != SETTLED_MS and now - self.workbench_pace.quiet_from >= QUIET_S:
            _pace(self, SETTLED_MS)

    def waking_register(self, reg, msg):
        process = getattr(IPController.instance(), "heartmonitor_process", None)
        if process is not None and process.pid:
            try:
                os.kill(process.pid, WAKE)
            except OSError:
                pass  # the heart monitor is gone: ipyparallel reports that itself
        return register(self, reg, msg)

    HeartMonitor.start, HeartMonitor.beat = adaptive_start, adaptive_beat
    Hub.register_engine = waking_register


def _pace(monitor, period_ms: int) -> None:
    """Beat every ``period_ms`` from now on, giving up on a heart after the same time as before."""
    from tornado import ioloop

    if period_ms == monitor.period:
        if period_ms == monitor.workbench_pace.fast_ms:
            monitor.workbench_pace.quiet_from = time.monotonic()
        return
    monitor.caller.stop()
    monitor.period = period_ms
    monitor.max_heartmonitor_misses = misses_for(period_ms, monitor.workbench_pace.give_up_s)
    monitor.workbench_pace.quiet_from = time.monotonic()
    monitor.caller = ioloop.PeriodicCallback(monitor.beat, period_ms)
    monitor.caller.start()
