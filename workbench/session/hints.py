"""One added line for the torch errors a pool user meets: what the pool did, and what to do now.

Pure: no torch, no ipyparallel. :class:`workbench.session.cell.CellRun` adds these under a failed cell.

>>> hint("ValueError", "trying to initialize the default process group twice!", "gloo", 2)
'the pool formed the process group already (backend gloo, world size 2): use it as it is.'
>>> hint("ValueError", "Default process group has not been initialized, please make sure to call "
...      "init_process_group.", "gloo", 2, ranks=[0, 1])
'the process group was destroyed on ranks 0-1: the next cell re-forms it.'
>>> hint("KeyError", "'x'", "gloo", 2) is None
True
"""

from __future__ import annotations

from workbench.pool.rankmap import format_ranks

INIT_TWICE = "trying to initialize the default process group twice"
NOT_INITIALIZED = "Default process group has not been initialized"
GLOO_MISMATCH = "GLHF!"  # how gloo ends its message when the ranks' collectives do not match


def hint(ename: str, evalue: str, backend: str | None, world_size: int, ranks=(),
         subset: bool = False) -> str | None:
    """The line to add under the error ``ename: evalue`` (None: nothing to add).

    ``ranks``: the ranks that raised it; ``subset``: whether the cell ran on some of the ranks only.

    >>> "trainer.run" in hint("RuntimeError", "op.preamble.length <= op.nbytes. GLHF!", "gloo", 2,
    ...                       subset=True)
    True
    """
    if INIT_TWICE in evalue:
        return (f"the pool formed the process group already (backend {backend}, world size {world_size}): "
                "use it as it is.")
    if NOT_INITIALIZED in evalue:
        where = f" on rank{'s' if len(ranks) > 1 else ''} {format_ranks(list(ranks))}" if ranks else ""
        return f"the process group was destroyed{where}: the next cell re-forms it."
    if GLOO_MISMATCH in evalue and subset:
        return ("a collective of this cell found a peer in another collective: the elastic Trainer "
                "(trainer.run) needs every rank: run it in a cell without --ranks.")
    return None


def broke_the_group(evalue: str) -> bool:
    """Whether an error says the default group is gone on that rank (so the next cell must re-form it).

    >>> broke_the_group("Default process group has not been initialized, please make sure ...")
    True
    """
    return NOT_INITIALIZED in evalue
