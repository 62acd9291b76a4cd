"""A pool's Slurm job has a time limit: warn before it, and stop the pool when the job is over.

The pool asks its launcher (:meth:`~workbench.pool.launch.base.Launcher.ends`) whether its Slurm job still
holds its nodes and when it ends: the job the kernel runs in (``--launcher allocation``), or the pool's own
(``--launcher slurm --time``). This thread asks once a minute (``squeue``: slurmctld is shared), at once when
one of the pool's ``srun`` steps ended (Slurm ends every step when the job ends), and every few seconds once
the end is near. ``warn(text)`` is called once, ``before`` seconds before the end (at once when less is
left); ``ended(text)`` once the job no longer holds its nodes. Pure threading: what to do is the caller's
(the session says it in the notebook and asks the ranks' Trainers to checkpoint; then it stops the pool).

>>> said, warned, over = [], threading.Event(), threading.Event()
>>> end = time.time() + 30
>>> watch = Walltime(lambda: (not over.is_set(), end), job="Slurm job 12 (1 node, 2 tasks, no GPU)",
...                  before=60, warn=lambda text: (said.append(text), warned.set()), ended=said.append,
...                  look=0.02, every=0.05)
>>> warned.wait(10)
True
>>> over.set(); watch._thread.join(10)  # Slurm says the job is over: the watch says so and ends
>>> len(said), said[0].startswith("workbench: Slurm job 12 (1 node, 2 tasks, no GPU) ends in "), said[1]
(2, True, 'workbench: Slurm job 12 (1 node, 2 tasks, no GPU) has ended (its time limit, or it was \
cancelled): Slurm ended its steps and the pool was stopped; start a new allocation, then `%dist start`.')
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime

# How often the job is asked about while its end is far (slurmctld answers everyone's squeue).
ASK_EVERY_S = 60.0
# Within this of the end, and after it, it is asked this often.
NEAR_S, NEAR_EVERY_S = 20.0, 2.0


def in_words(seconds: float) -> str:
    """A span as a warning says it.

    >>> in_words(605), in_words(59.5), in_words(3720)
    ('10 min', '59 s', '1 h 2 min')
    """
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def warning(job: str, left: float, end: float) -> str:
    """The notebook's one warning before the job's end.

    >>> warning("Slurm job 12 (2 nodes, 8 GPUs)", 600, 0.0)   # doctest: +ELLIPSIS
    'workbench: Slurm job 12 (2 nodes, 8 GPUs) ends in 10 min (at ...): a running Trainer with a \
wb.Checkpoint callback saves at its next step; save anything else you need now.'
    """
    at = datetime.fromtimestamp(end).strftime("%H:%M:%S")
    return (f"workbench: {job} ends in {in_words(left)} (at {at}): a running Trainer with a wb.Checkpoint "
            "callback saves at its next step; save anything else you need now.")


def over(job: str) -> str:
    """What the notebook is told once the job is over and the pool stopped."""
    return (f"workbench: {job} has ended (its time limit, or it was cancelled): Slurm ended its steps and "
            "the pool was stopped; start a new allocation, then `%dist start`.")


class Walltime:
    """Warns once before the end of a pool's Slurm job and says when it is over (see the module).

    ``ends()``: (whether the job still holds its nodes, its end in epoch seconds or None); ``job``: the job
    in words; ``before``: seconds before the end to warn; ``steps_ended()``: how many of the pool's steps
    have ended (a rise asks at once).
    """

    def __init__(self, ends: Callable[[], tuple[bool, float | None]], *, job: str, before: float,
                 warn: Callable[[str], None], ended: Callable[[str], None],
                 steps_ended: Callable[[], int] = lambda: 0, look: float = 1.0, every: float = ASK_EVERY_S):
        self._ends, self.job, self.before = ends, job, before
        self._warn, self._ended, self._steps_ended = warn, ended, steps_ended
        self._look, self._every = look, every
        self.end: float | None = None
        self.warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="workbench-walltime", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_ask, steps = 0.0, self._steps_ended()
        while not self._stop.is_set():
            now = time.time()
            ended = self._steps_ended()
            if now >= next_ask or ended > steps:
                steps = ended
                holding, self.end = self._ends()
                if self._stop.is_set():
                    return
                if not holding:
                    self._stop.set()
                    self._ended(over(self.job))
                    return
                near = self.end is not None and now >= self.end - NEAR_S
                next_ask = now + (min(NEAR_EVERY_S, self._every) if near else self._every)
            if self.end is not None and not self.warned and now >= self.end - self.before:
                self.warned = True
                self._warn(warning(self.job, self.end - now, self.end))
            self._stop.wait(self._look)

    def close(self) -> None:
        """Stop watching (the pool stopped)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(2)
