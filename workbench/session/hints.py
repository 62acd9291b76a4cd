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

from workbench.pool.rankmap import ranks_named

INIT_TWICE = "trying to initialize the default process group twice"
NOT_INITIALIZED = "Default process group has not been initialized"
GLOO_MISMATCH = "GLHF!"  # how gloo ends its message when the ranks' collectives do not match
RUN_NOT_FOUND = "` not found."  # the end of IPython's ``%run`` error: "File `'train.py'` not found."


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
        where = f" on {ranks_named(ranks)}" if ranks else ""
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


def file_not_found(ename: str, evalue: str) -> bool:
    """Whether an error says a file a rank was to read is not there (``%run``, ``open``, ``%dist run``).

    >>> file_not_found("Exception", "File `'train.py'` not found."), file_not_found("KeyError", "'x'")
    (True, False)
    >>> file_not_found("FileNotFoundError", "[Errno 2] No such file or directory: 'data.csv'")
    True
    """
    if ename == "FileNotFoundError":
        return "no such file in rank" not in evalue  # `%dist run`'s own error names the folder already
    return ename == "Exception" and evalue.startswith("File `") and evalue.endswith(RUN_NOT_FOUND)


def where_ranks_look(places: dict[int, tuple[str, str]], notebook_folder: str) -> str:
    """The line under a "not found" on ranks: the folder each looked in, on which host (``places``: rank ->
    (host, folder)), and whether that is the notebook's folder (a rank follows it where its host has it).

    >>> where_ranks_look({0: ("a", "/w"), 1: ("a", "/w")}, "/w")
    "the ranks look for files in their own folder: ranks 0-1 on a in /w (the notebook's folder)."
    >>> where_ranks_look({1: ("b", "/home/u")}, "/w")  # doctest: +NORMALIZE_WHITESPACE
    "the ranks look for files in their own folder: rank 1 on b in /home/u; the notebook's folder /w is not on
    b: copy the file there, or give its path on that host."
    """
    by_place: dict[tuple[str, str], list[int]] = {}
    for rank, place in sorted(places.items()):
        by_place.setdefault(place, []).append(rank)
    parts = [f"{ranks_named(ranks)} on {host} in {folder}"
             for (host, folder), ranks in by_place.items()]
    away = sorted({host for host, folder in by_place if folder != notebook_folder})
    if not away:
        return f"the ranks look for files in their own folder: {'; '.join(parts)} (the notebook's folder)."
    return (f"the ranks look for files in their own folder: {'; '.join(parts)}; the notebook's folder "
            f"{notebook_folder} is not on {', '.join(away)}: copy the file there, or give its path on that "
            f"host.")
