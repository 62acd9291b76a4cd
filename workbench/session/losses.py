"""How a loss of ranks is told: a whole host lost is one fault named after the host, never a survivor.

Pure functions over the rank map (kernel side; no torch), used by the in-cell elastic watch.

>>> from workbench.pool.rankmap import RankInfo
>>> hosts = ["n1", "n1", "n2", "n2"]
>>> ranks = [RankInfo(i, i % 2, i // 2, h, 100 + i, "cpu", i) for i, h in enumerate(hosts)]
>>> loss_text(ranks[2:], ranks, "sent no heartbeat for 3 s", step=21, left=2)
'host n2 lost: ranks 2-3, link silent for 3 s after step 21; continuing on 2 ranks'
>>> loss_text(ranks[3:], ranks, "died", step=21, left=3)
'rank 3 died after step 21; continuing on 3 ranks'
"""

from __future__ import annotations

from workbench.pool.rankmap import RankInfo, format_ranks
from workbench.pool.watch.beacons import NullBeacons

NULL_BEACONS = NullBeacons()  # nothing heard: what a pool without beacons says of its fenced engines

SILENT = "sent no heartbeat for "


def lost_hosts(lost: list[RankInfo], ranks: list[RankInfo]) -> list[str]:
    """The hosts all of whose ranks (in ``ranks``, the group before the loss) are in ``lost``.

    >>> from workbench.pool.rankmap import RankInfo
    >>> ranks = [RankInfo(i, 0, i, f"n{i}", 100 + i, "cpu", i) for i in range(2)]
    >>> lost_hosts(ranks[1:], ranks)
    ['n1']
    """
    gone = {r.engine_id for r in lost}
    hosts = dict.fromkeys(r.host for r in lost)
    return [h for h in hosts if all(r.engine_id in gone for r in ranks if r.host == h)]


def loss_text(lost: list[RankInfo], ranks: list[RankInfo], how: str, *, step: int | str, left: int,
              fsdp: bool = False) -> str:
    """One line for ranks ``lost`` out of ``ranks`` (``how``: what the watcher saw), the run going on
    with ``left`` ranks after ``step`` (the last step completed; ``"{step}"``: the ranks fill it in).
    Where every rank of a host is lost, the host is named."""
    hosts = lost_hosts(lost, ranks)
    numbers = format_ranks(r.rank for r in lost)
    plural = "s" if len(lost) != 1 else ""
    if hosts and len(hosts) == len({r.host for r in lost}):
        how = ("link silent for " + how[len(SILENT):]) if how.startswith(SILENT) else how
        head = f"host{'s' if len(hosts) != 1 else ''} {', '.join(hosts)} lost: rank{plural} {numbers}, {how}"
    else:
        head = f"rank{plural} {numbers} {how}"
    return (f"{head} after step {step}; continuing on {left} rank{'s' if left != 1 else ''}"
            + (" (its shards from the last checkpoint)" if fsdp else ""))


def fenced_rows(lost: list[RankInfo], beacons=NULL_BEACONS, ended: set[int] = frozenset(),
                quiet_s: float = 1.0) -> list[dict]:
    """``%dist status`` rows for the engines an elastic run went on without: "lost, fenced" (refused,
    told to stop if heard again), "lost, stopped" once its host answered the kill over ssh (``ended``:
    those pids), or it was heard, told, and is silent since.

    >>> from workbench.pool.rankmap import RankInfo
    >>> fenced_rows([RankInfo(2, 0, 1, "n2", 4242, "cpu", 7)])
    [{'rank': '-', 'host': 'n2', 'pid': 4242, 'device': 'cpu', 'state': 'lost, fenced'}]
    """
    rows = []
    for r in lost:
        heard = beacons.heard_since_fenced(r.host, r.pid)
        stopped = r.pid in ended or heard is not None and heard > quiet_s
        state = "lost, stopped" if stopped else "lost, fenced"
        rows.append({"rank": "-", "host": r.host, "pid": r.pid, "device": r.device, "state": state})
    return rows


def death_text(lost: list[RankInfo], ranks: list[RankInfo], how: dict[int, str]) -> str:
    """What a plain cell's fault record says of ranks found dead (``how``: rank -> what was seen): the
    host where all of its ranks are gone, else the first rank.

    >>> from workbench.pool.rankmap import RankInfo
    >>> hosts = ["n1", "n1", "n2", "n2"]
    >>> ranks = [RankInfo(i, i % 2, i // 2, h, 100 + i, "cpu", i) for i, h in enumerate(hosts)]
    >>> death_text(ranks[2:], ranks, {2: "sent no heartbeat for 3 s", 3: "sent no heartbeat for 3 s"})
    'host n2 lost: ranks 2-3 sent no heartbeat for 3 s'
    >>> death_text(ranks[3:], ranks, {3: "exited"})
    'rank 3 exited'
    """
    hosts = lost_hosts(lost, ranks) if len(lost) > 1 else []
    if len(hosts) == 1:
        return f"host {hosts[0]} lost: ranks {format_ranks(r.rank for r in lost)} {how[lost[0].rank]}"
    return f"rank {lost[0].rank} {how[lost[0].rank]}"
