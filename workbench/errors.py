"""Error types: what went wrong, on which rank, and what to do next.

User mistakes are ``ValueError`` (the magics turn them into ``UsageError``); the
classes here are for failures of the pool or of a cell on the ranks.
"""

from __future__ import annotations


class WorkbenchError(RuntimeError):
    """Base class for failures of the pool or the process group."""

    def _render_traceback_(self) -> list[str]:
        # the message says what happened and what to do; the kernel-side frames would only bury it
        return [f"\x1b[1;31m{type(self).__name__}\x1b[0m: {self}"]


class PoolStartError(WorkbenchError):
    """The engines or the process group did not come up.

    The message says which step failed, what the engines printed, and that every
    process started for the pool has been stopped again.
    """


class NoPoolError(WorkbenchError, ValueError):
    """An operation needs a running pool and this notebook drives none.

    ``running``: the pools of this machine another notebook or the JupyterLab panel runs, as
    ``(name, ranks)``: the message offers to attach to them.

    >>> str(NoPoolError("%%distributed", running=[("pool-glad-heron", 2)])).split(", or ")[1]
    'attach to a running one: `%dist attach pool-glad-heron` (2 ranks).'
    """

    def __init__(self, what: str = "this", running=()):
        offer = "; ".join(f"`%dist attach {name}` ({n} ranks)" for name, n in running)
        super().__init__(
            f"{what} needs a running pool: start one with `%dist start -n 2`"
            + (f", or attach to a running one: {offer}." if offer else
               " (or `workbench.Session(n=2).start()`).")
        )


class PoolGone(WorkbenchError, ValueError):
    """The pool this notebook drove was stopped elsewhere (another notebook, the panel, its lease)."""


class RankDiedError(WorkbenchError):
    """A rank's engine is gone; ``%dist restart`` brings it back."""


class CellTimeout(WorkbenchError):
    """A cell ran past its timeout on some ranks; ``result`` holds what every rank produced."""

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result


class CellInterrupted(WorkbenchError, KeyboardInterrupt):
    """Ctrl-C stopped a cell on its ranks. The message says where each rank stopped and what holds now.

    A ``KeyboardInterrupt`` too, so code that stops on Ctrl-C stops here as well; ``result`` holds
    what every rank produced.
    """

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[1;33mInterrupted\x1b[0m: {self}"]


class RankError(WorkbenchError):
    """A cell raised on one or more ranks.

    ``failures`` holds ``(rank_info, remote_error)`` pairs, the first failure first;
    ``result`` is the whole :class:`~workbench.session.CellResult`, so the output of
    the ranks that did not fail is kept.
    """

    def __init__(self, failures, result):
        self.failures = list(failures)
        self.result = result
        info, err = self.failures[0]
        others = ", ".join(str(i.rank) for i, _ in self.failures[1:])
        more = f" (also failed: rank {others})" if others else ""
        super().__init__(
            f"rank {info.rank} ({info.host}, {info.device}) raised "
            f"{err.ename}: {err.evalue}{more}"
        )

    @property
    def rank(self) -> int:
        """The rank that failed first: the root cause."""
        return self.failures[0][0].rank

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of the kernel-side frames: one line saying how every rank
        # ended, the failing rank's own traceback, then one line per other failure or cut-short rank.
        # The result (a session.results.CellResult) says its own summary: this leaf imports nothing above it.
        lines = [f"\x1b[1;31m{self}\x1b[0m", self.result.summary_line()]
        info, err = self.failures[0]
        lines += err.render_traceback()
        for info, err in self.failures[1:]:
            lines.append(f"rank {info.rank} ({info.host}, {info.device}): {err.ename}: {err.evalue}")
        stopped = self.result.ranks_with("stopped")
        if stopped:
            lines.append(f"stopped (cut short when rank {self.rank} failed): rank "
                         + ", ".join(map(str, stopped)))
        if self.result.fault is not None and self.result.fault.abort_s:
            lines.append(self.result.fault.summary() + "; the next cell re-forms the process group.")
        return lines
