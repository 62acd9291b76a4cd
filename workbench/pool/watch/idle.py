"""Release an idle pool: cluster GPUs must not sit reserved and unused.

Pure threading (no torch, no ipyparallel): the session tells the timer when the pool is used, and the
timer calls back to warn, then to release.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class IdleRelease:
    """Calls ``warn(seconds_left)`` once the pool has been idle for ``after - warn_before`` seconds and
    ``release()`` after ``after`` seconds; any :meth:`touch` (a cell, a push, a pull) starts over.
    ``busy()`` says whether a cell is running right now (a long training run is not idle).

    >>> events = []
    >>> timer = IdleRelease(0.3, warn=lambda left: events.append("warn"),
    ...                     release=lambda: events.append("stop"), warn_before=0.2, poll=0.02)
    >>> time.sleep(0.6); events
    ['warn', 'stop']
    >>> timer.close()
    """

    def __init__(self, after: float, *, warn: Callable[[float], None], release: Callable[[], None],
                 busy: Callable[[], bool] = lambda: False, warn_before: float | None = None,
                 poll: float = 0.5):
        self.after = after
        self.warn_before = min(after / 2, 60.0) if warn_before is None else min(warn_before, after)
        self._warn, self._release, self._busy, self._poll = warn, release, busy, poll
        self._last = time.monotonic()
        self._warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="workbench-idle", daemon=True)
        self._thread.start()

    def touch(self) -> None:
        """The pool was used just now."""
        self._last = time.monotonic()
        self._warned = False

    def idle_for(self) -> float:
        return time.monotonic() - self._last

    def _loop(self) -> None:
        while not self._stop.wait(self._poll):
            if self._busy():
                self.touch()
                continue
            idle = self.idle_for()
            if idle >= self.after:
                self._stop.set()
                self._release()
                return
            if not self._warned and idle >= self.after - self.warn_before:
                self._warned = True
                self._warn(self.after - idle)

    def close(self) -> None:
        """Stop the timer (the pool was stopped)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(2)
