"""This user's pools on this machine, from their state files, as ``workbench pools`` lists them and
``workbench stop`` ends them (outside any notebook: the one that started a pool may be gone or hung).

The state files live in this user's Jupyter runtime folder (:mod:`workbench.pool.records.state`), whoever
started the pool (a kernel, the JupyterLab panel, a script); who drives a pool comes from
:mod:`workbench.pool.records.sharing`. Stopping goes the panel's way
(:func:`workbench.pool.cluster.stop_pool`): attach, stop every process, tell the notebooks still attached who
stopped it.

>>> describe(pool_state.PoolState(id="1a2b3c4d", name="pool-bold-tapir", n=2, owner={"pid": 1}),
...          now=90.0)["state"]
'starting · 0/2 ranks'
"""

from __future__ import annotations

import socket
import time

from workbench.pool.records import sharing
from workbench.pool.records import state as pool_state

COLUMNS = ["name", "id", "launcher", "ranks", "where", "state", "slurm", "owner", "notebooks", "age",
           "log"]


def age(seconds: float) -> str:
    """A duration as a person says it.

    >>> age(42), age(125), age(7300), age(200000)
    ('42 s', '2 min', '2 h 1 min', '2 d 7 h')
    """
    seconds = int(max(seconds, 0))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def _state_word(state: pool_state.PoolState) -> str:
    n, ranks = state.n, state.ranks
    if len(ranks) < n:
        return f"starting · {len(ranks)}/{n} ranks"
    here = socket.gethostname()
    dead = [r["rank"] for r in ranks
            if r.get("host") == here and not pool_state.process_alive(_record(r["pid"]))]
    if dead:
        return f"running · rank{'s' if len(dead) > 1 else ''} {', '.join(map(str, dead))} dead"
    return "running"


def _record(pid: int) -> dict:
    try:
        return pool_state.process_record(pid)
    except Exception:  # gone
        return {}


def where(state: pool_state.PoolState) -> str:
    """Where a pool's ranks run: its hosts, or (a Kubernetes pool) how many pods on which nodes.

    >>> ranks = [{"host": "wb-1a-x"}, {"host": "wb-1a-y"}, {"host": "wb-1a-z"}]
    >>> where(pool_state.PoolState(ranks=ranks, places={"wb-1a-x": "n1", "wb-1a-y": "n2", "wb-1a-z": "n1"}))
    '3 pods on n1, n2'
    >>> where(pool_state.PoolState(ranks=[{"host": "a"}, {"host": "a"}])), where(pool_state.PoolState())
    ('a', '-')
    """
    hosts = list(dict.fromkeys(r.get("host", "?") for r in state.ranks))
    if hosts and state.places:
        nodes = sorted({state.places.get(h, "?") for h in hosts})
        return f"{len(hosts)} pod{'s' if len(hosts) != 1 else ''} on {', '.join(nodes)}"
    return ", ".join(hosts) or "-"


def describe(state: pool_state.PoolState, now: float | None = None) -> dict:
    """One pool as a row: name, id, launcher, ranks, where they run, state, the Slurm job it runs in with its
    time left, owner, attached notebooks, age, log.

    >>> job = {"job": "12", "nodes": ["n1", "n2"], "gpus": 8, "inside": True}
    >>> describe(pool_state.PoolState(id="1a2b3c4d", n=2, owner={"pid": 1}, ends=3600.0, allocation=job),
    ...          now=0.0)["slurm"]
    'inside Slurm job 12 (2 nodes, 8 GPUs) · 1 h 0 min left'
    """
    clients = sharing.clients(state.id)
    owner_pid = state.owner.get("pid")
    starter = next((c for c in clients if c["pid"] == owner_pid), None)
    owner = f"process {owner_pid}"
    if starter and starter["notebook"] != owner:
        owner = f"{starter['notebook']} (pid {owner_pid})"
    attached = [c["notebook"] for c in clients if c["pid"] != owner_pid]
    ranks = state.ranks
    return {
        "name": state.name or state.id,
        "id": state.id,
        "launcher": state.launcher,
        "ranks": f"{len(ranks)}/{state.n or len(ranks)}",
        "where": where(state),
        "state": _state_word(state),
        "slurm": pool_state.allocation_words(state.allocation, state.ends, now) or "-",
        "owner": owner,
        "notebooks": ", ".join(attached) or "-",
        "age": age((now if now is not None else time.time()) - state.created),
        "log": state.log or "-",
        # for stop's question and --json: every notebook driving it, the one that started it first
        "drivers": [{"notebook": c["notebook"], "role": c["role"], "pid": c["pid"]} for c in clients],
    }


def pools() -> list[dict]:
    """Every running pool of this user on this machine, oldest first.

    >>> isinstance(pools(), list)
    True
    """
    states = sorted(pool_state.list_states(), key=lambda s: s.created)
    return [describe(s) for s in states]


def find(ref: str) -> dict:
    """The pool named ``ref`` (its name or id, or a unique start of its id).

    >>> find("no-such-pool")                  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: no running pool 'no-such-pool' of this user on this machine; running pools: ...
    """
    running = pools()
    exact = [p for p in running if ref in (p["name"], p["id"])]
    matches = exact or [p for p in running if p["id"].startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    names = ", ".join(f"{p['name']} ({p['id']})" for p in running) or "none"
    if not matches:
        raise ValueError(f"no running pool {ref!r} of this user on this machine; running pools: {names}.")
    raise ValueError(f"{ref!r} names more than one pool ({names}): give the whole id.")


def who_drives(pool: dict) -> str:
    """The notebooks driving ``pool``, in words, for the question before it is stopped.

    >>> who_drives({"drivers": []})
    'no notebook is attached'
    >>> who_drives({"drivers": [{"notebook": "a.ipynb", "role": "started", "pid": 7}]})
    'a.ipynb (started it, pid 7) is attached'
    """
    drivers = pool["drivers"]
    if not drivers:
        return "no notebook is attached"
    words = [f"{d['notebook']} ({'started it' if d['role'] == 'started' else 'attached'}, pid {d['pid']})"
             for d in drivers]
    return f"{', '.join(words)} {'is' if len(words) == 1 else 'are'} attached"


def stop(pool: dict, by: str) -> str | None:
    """Stop ``pool`` the way the panel does (:func:`workbench.pool.cluster.stop_pool`); the notebooks
    still attached are told ``by`` whom.

    A pool whose controller does not answer (a rank gone, the controller hung) cannot be attached:
    it is ended from its state file, as its lease would end it, and the reason is returned.
    """
    from workbench.pool.cluster import stop_pool
    from workbench.pool.processes.reap import clean_up

    try:
        stop_pool(pool["id"], by)
        return None
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
    state = next((s for s in pool_state.list_states() if s.id == pool["id"]), None)
    if state is not None:  # else it ended meanwhile
        clean_up(state, grace=1.0)
        pool_state.state_path(pool["id"]).unlink(missing_ok=True)
        sharing.note_stopped(pool["id"], state.name, by)
    return reason
