"""Error types: what went wrong, on which rank, and what to do next.

User mistakes are ``ValueError`` (the magics turn them into ``UsageError``); the
classes here are for failures of the pool or of a cell on the ranks.
"""

from __future__ import annotations

import re


class WorkbenchError(RuntimeError):
    """Base class for failures of the pool or the process group."""

    def _render_traceback_(self) -> list[str]:
        # the message says what happened and what to do; the kernel-side frames would only bury it
        return [f"\x1b[1;31m{type(self).__name__}\x1b[0m: {self}"]


class PoolStartError(WorkbenchError):
    """The engines or the process group did not come up.

    The message says which step failed, what the engines printed, and that every
    process started for the pool has been stopped again. Its parts, for a page that shows them apart:
    ``what`` failed (the message's first sentence), the launcher's last lines (``tail``), the ``log``'s
    path and what to do (``todo``); one made from a sentence alone has that sentence as ``what``.

    >>> e = PoolStartError("it failed.\\nLog: /tmp/x.log\\nRetry.", what="it failed.", log="/tmp/x.log",
    ...                    todo="Retry.")
    >>> (e.what, e.tail, e.log, e.todo)
    ('it failed.', (), '/tmp/x.log', 'Retry.')
    >>> PoolStartError("no engine came.").what
    'no engine came.'
    """

    def __init__(self, message: str = "", *, what: str | None = None, tail: tuple[str, ...] = (),
                 log: str | None = None, todo: str = ""):
        super().__init__(message)
        self.what = message if what is None else what
        self.tail = tuple(tail)
        self.log = log
        self.todo = todo


class NoPoolError(WorkbenchError, ValueError):
    """An operation needs a running pool and this notebook drives none.

    ``running``: the pools of this machine another notebook or the JupyterLab panel runs, as
    ``(name, ranks)``: the message offers to attach to them.

    A running pool is offered first (after a kernel restart that is the pool this notebook kept).

    >>> str(NoPoolError("%%distributed", running=[("pool-glad-heron", 2)])).split(": ", 1)[1]
    'attach to one with `%dist attach pool-glad-heron` (2 ranks), or start one with `%dist start -n 2`.'
    >>> str(NoPoolError("%%distributed")).split(": ", 1)[1]
    'start one with `%dist start -n 2` (or `workbench.Session(n=2).start()`).'
    """

    def __init__(self, what: str = "this", running=()):
        offer = "; ".join(f"`%dist attach {name}` ({n} rank{'s' * (n != 1)})" for name, n in running)
        super().__init__(
            f"{what} needs a running pool: "
            + (f"attach to one with {offer}, or start one with `%dist start -n 2`." if offer else
               "start one with `%dist start -n 2` (or `workbench.Session(n=2).start()`).")
        )


class PoolGone(WorkbenchError, ValueError):
    """The pool this notebook drove was stopped elsewhere (another notebook, the panel, its lease)."""


class CannotKeep(WorkbenchError, ValueError):
    """``keep=True`` (``%dist start --keep``) where no Jupyter server can take the pool; nothing was started.

    The message says why (no server started this kernel, it takes no token, it refused) and what to do.
    """


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
        """One line, the word said once ("Interrupted at step 711 on all ranks; ...", not "Interrupted:
        interrupted at step 711").

        >>> CellInterrupted("interrupted at step 7 on all ranks")._render_traceback_()
        ['\\x1b[1;33mInterrupted\\x1b[0m at step 7 on all ranks']
        >>> CellInterrupted("rank 0 stopped at cell line 2")._render_traceback_()
        ['\\x1b[1;33mInterrupted\\x1b[0m: rank 0 stopped at cell line 2']
        """
        text = str(self)
        if text.startswith("interrupted "):
            return [f"\x1b[1;33mInterrupted\x1b[0m {text.removeprefix('interrupted ')}"]
        return [f"\x1b[1;33mInterrupted\x1b[0m: {text}"]


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
        if others and len({(e.ename, str(e.evalue)) for _, e in self.failures}) == 1:  # every one the same
            ranks = sorted(i.rank for i, _ in self.failures)
            span = f"{ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) else \
                ", ".join(map(str, ranks))
            super().__init__(f"ranks {span} raised {err.ename}: {err.evalue}")
            return
        what = f"died: {err.evalue}" if _died(err) else f"raised {err.ename}: {err.evalue}"
        super().__init__(f"rank {info.rank} ({info.host}, {info.device}) {what}{more}")

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
        lines += relabel_cells(err.render_traceback(), _notebook_cell())
        for info, err in self.failures[1:]:
            if (err.ename, str(err.evalue)) != (self.failures[0][1].ename, str(self.failures[0][1].evalue)):
                what = f"died: {err.evalue}" if _died(err) else f"{err.ename}: {err.evalue}"
                lines.append(f"rank {info.rank} ({info.host}, {info.device}): {what}")
        stopped = self.result.ranks_with("stopped")
        if stopped:
            lines.append(f"stopped (cut short when rank {self.rank} failed): rank "
                         + ", ".join(map(str, stopped)))
        dead = self.result.ranks_with("died", "killed")
        back = f"`%dist restart` brings rank {', '.join(map(str, dead))} back"
        if self.result.fault is not None and self.result.fault.abort_s:
            broken = getattr(self.result, "group_broken", True)
            promise = "; the process group was not touched." if not broken else \
                f"; {back}" if dead else "; the next cell re-forms the process group."
            lines.append(self.result.fault.summary() + promise)
        elif dead:  # said once: by the fault's line where there is one
            lines.append(f"{back} (Session.restart()); the other ranks keep their state.")
        lines += getattr(self.result, "hints", [])
        return lines


def _died(err) -> bool:
    """A rank whose process is gone (session.results.RankDied: this leaf knows it by name)."""
    return getattr(err, "ename", None) == "RankDied"


def _notebook_cell() -> int | None:
    """The number of the notebook cell running now (``In [4]``), if this is an IPython kernel."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    # the running cell's result holds its number (shell.execution_count is the next cell's by then)
    running = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    return getattr(running, "execution_count", None)


# "Cell In[2]" in a rank's traceback, colours and all: the engine's own count of the cells it ran
_CELL_LABEL = re.compile(r"(Cell(?:\x1b\[[0-9;]*m)*\s(?:\x1b\[[0-9;]*m)*In\[)\d+(\])")


def relabel_cells(lines: list[str], number: int | None) -> list[str]:
    """A rank's traceback with its cell frames labelled as the notebook's cell ``number`` (``In [4]``), not
    with the engine's count of the cells it ran; as it was when ``number`` is None.

    >>> coloured = "\\x1b[36mCell\\x1b[39m\\x1b[36m \\x1b[39m\\x1b[32mIn[1]\\x1b[39m"
    >>> relabel_cells(["Cell In[2], line 3", coloured], 4)
    ['Cell In[4], line 3', '\\x1b[36mCell\\x1b[39m\\x1b[36m \\x1b[39m\\x1b[32mIn[4]\\x1b[39m']
    """
    if number is None:
        return list(lines)
    return [_CELL_LABEL.sub(lambda m: f"{m.group(1)}{number}{m.group(2)}", line) for line in lines]
