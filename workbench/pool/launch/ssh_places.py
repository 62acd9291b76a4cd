"""Where new engines for lost ranks start on an ssh pool: on the lost rank's host when it answers, else
on another host of the pool's list (saying which).

The rank map names hosts as the engines do (``socket.gethostname()``); ssh reaches them by the names or
addresses of ``--hosts``. The launchers that started the lost engines say which entry of the list each
hostname was (:func:`locations`).

>>> place(["n1", "n2", "n2"], {"n1": "10.0.0.1", "n2": "10.0.0.2"}, ["10.0.0.1", "10.0.0.2"],
...       answers={"10.0.0.1": True, "10.0.0.2": False}.get, alive={"10.0.0.1": 2})
({'10.0.0.1': 3}, ['host n2 does not answer over ssh: 2 engines start on n1 instead'])
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Callable

ANSWER_TIMEOUT_S = 3  # ssh's connect timeout when asking whether a host answers


def locations(launchers, pids_by_host: dict[str, set[int]]) -> dict[str, str]:
    """Hostname -> the ``--hosts`` entry ssh reached it by, from the launchers whose pids ran there."""
    by_pid = {el.pid: el.location for el in launchers if getattr(el, "pid", 0) > 0}
    found = {}
    for host, pids in pids_by_host.items():
        for pid in pids:
            if pid in by_pid:
                found[host] = by_pid[pid]
    return found


def answers(ssh: list[str], location: str, timeout: int = ANSWER_TIMEOUT_S) -> bool:
    """Whether ``location`` runs a command over ssh (``ssh``: the pool's ssh command and options)."""
    try:
        done = subprocess.run([*ssh, "-o", f"ConnectTimeout={timeout}", location, "true"],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout + 10)
    except (subprocess.TimeoutExpired, OSError):
        return False
    return done.returncode == 0


def place(lost_hosts: list[str], where: dict[str, str], hosts: list[str],
          answers: Callable[[str], bool], alive: dict[str, int] | None = None) -> tuple[dict[str, int], list]:
    """``{location: engines}`` for one new engine per entry of ``lost_hosts`` (hostnames, one per lost
    rank), and the lines that say where they moved. A host that does not answer is replaced by the
    answering host of ``hosts`` with the fewest engines (``alive``: engines per location now). Raises
    ValueError when no host of the list answers."""
    alive = Counter(alive or {})
    asked: dict[str, bool] = {}

    def ok(location: str) -> bool:
        if location not in asked:
            asked[location] = bool(answers(location))
        return asked[location]

    placement: Counter = Counter()
    moved: dict[str, tuple[str, int]] = {}
    for host in lost_hosts:
        location = where.get(host, host)
        if not ok(location):
            others = [h for h in hosts if h != location and ok(h)]
            if not others:
                raise ValueError(f"no host of the pool answers over ssh ({', '.join(hosts)}): the lost ranks "
                                 "cannot be started again; go on with the ranks left, or stop the pool.")
            target = min(others, key=lambda h: (alive[h] + placement[h], hosts.index(h)))
            moved[host] = (target, moved.get(host, (target, 0))[1] + 1)
            location = target
        placement[location] += 1
    name = {location: host for host, location in where.items()}
    notes = [f"host {host} does not answer over ssh: {n} engine{'s' if n != 1 else ''} start on "
             f"{name.get(target, target)} instead" for host, (target, n) in moved.items()]
    return dict(placement), notes
