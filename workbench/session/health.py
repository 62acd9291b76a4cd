"""Which ranks are alive, and the record of every fault.

A watcher thread notices a death as it happens and pushes it: a local engine's exit wakes the thread
through a pidfd (no /proc reads per cell), a rank on another node is dead once its beacon has been
silent for ``REMOTE_SILENCE_S``. The cell path only reads :attr:`Health.dead`; listeners (a running
cell's wait loop) are woken. A death while no cell runs is reported at once, with what to do.

>>> h = Health(pool_id="demo")                          # doctest: +SKIP
>>> h.watch(ranks, local=True)                          # doctest: +SKIP
>>> h.dead                                              # doctest: +SKIP
{1: 'exited'}
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable

import psutil

from workbench import faults
from workbench.pool.rankmap import RankInfo, format_ranks
from workbench.pool.records.state import close_handle, exit_handle, handle_exited
from workbench.pool.watch.beacons import BeaconReceiver, NullBeacons
from workbench.pool.watch.knock import ANSWERS, REFUSED, Knock
from workbench.session.losses import lost_hosts

# Silence after which a rank on another node counts as dead.
REMOTE_SILENCE_S = 3.0
# A rank silent this long on the host of a rank found silent is lost with it (a busy rank beacons every
# 0.25 s, an idle one every 1 s).
HOST_SILENCE_S = 2.0
# A silent rank whose process still answers on its gloo port is up (see workbench.pool.watch.knock): lost only
# after this long. Knocked once silent for KNOCK_AFTER_S, then at most every KNOCK_EVERY_S; an answer
# within KNOCK_TIMEOUT_S (in by the time REMOTE_SILENCE_S passed).
HUNG_SILENCE_S = 60.0
KNOCK_AFTER_S, KNOCK_EVERY_S, KNOCK_TIMEOUT_S = 2.0, 1.0, 1.0
# How often the watcher looks at beacons (and, without pidfds, at local processes).
LOOK_S = 0.05
# ...and where every rank has a pidfd (a local pool) and no knock is in flight: a death wakes the watcher at
# once through its pidfd; the look then only retries a death not yet reported (a cell ran meanwhile).
PIDFD_LOOK_S = 0.5


class Health:
    """Dead ranks (pushed by a watcher thread) and the fault log of one pool.

    ``quiet``: given the ranks that died, a turn on them if no cell runs there (a callable that ends it),
    else None; a death seen where no cell runs is reported at once through ``report`` (a cell reports the
    deaths it sees itself; in a split pool a death in an idle sub-mesh is reported while another sub-mesh's
    cell runs). The default: a lock of its own, never held by a cell. ``beacons``: the pool's receiver (a
    :class:`~workbench.pool.watch.beacons.NullBeacons` by default: no rank is ever silent, only an exit
    says a rank died).
    """

    def __init__(self, *, pool_id: str | None,
                 beacons: BeaconReceiver | NullBeacons | None = None,
                 report: Callable[[str], None] = lambda text: print(text, flush=True),
                 pool_running: Callable[[], bool] = lambda: True,
                 endpoints: Callable[[], dict[int, list]] = dict,
                 lost_hosts: Callable[[], dict[str, str]] = dict,
                 quiet: Callable[[list[int]], Callable[[], None] | None] | None = None):
        self.pool_id = pool_id
        self.beacons = beacons if beacons is not None else NullBeacons()
        self.dead: dict[int, str] = {}  # rank -> how it died
        self.faults: list[faults.FaultEvent] = []
        self._report = report
        self._quiet = quiet or _free_lock(threading.Lock())
        self._pool_running = pool_running  # a pool stopped on purpose elsewhere: its ends are no faults
        self._endpoints = endpoints  # rank -> its gloo listeners as the group's join said (before any beacon)
        self._lost_hosts = lost_hosts  # host -> how its engines were lost, as the launcher's system says
        self._pending: faults.FaultEvent | None = None  # written to the log once recovered (or at close)
        self._ranks: list[RankInfo] = []
        self._holders: dict[int, tuple[str, int]] = {}  # rank -> (host, pid) of the engine holding it now
        self._was: dict[tuple[str, int], int] = {}  # (host, pid) -> its rank before the last watch()
        self._watched = time.monotonic()  # the last watch(): where a renumbered engine's silence starts
        # rank -> pidfd (or a Process where there are no pidfds); only the watcher thread closes them
        self._local: dict[int, int | psutil.Process] = {}
        self._retired: list = []  # handles of an earlier watch, closed by the watcher once it let go
        self._announced: set[int] = set()
        self._knocked: dict[int, tuple] = {}  # silent rank -> (when knocked, how its port answered)
        self._knocks: list[tuple[int, float, Knock]] = []  # in flight: (watch generation, started, knock)
        self._generation = 0  # counts watch(): a knock started before the last one is not heard
        self._listeners: list[Callable[[], None]] = []
        self._lock = threading.Lock()  # watch() against the watcher: a death of an old rank never counts
        self._wake_r, self._wake_w = os.pipe()  # wakes the watcher out of its poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="workbench-health", daemon=True)
        self._thread.start()

    # -- what is watched ---------------------------------------------------------------
    def watch(self, ranks: list[RankInfo], local: bool, announced=()) -> None:
        """Watch these ranks from now on (after the group formed); deaths seen before are forgotten, but for
        ``announced``: ranks whose death was reported already (a sub-mesh's elastic run went on without
        them), never again as "died while idle"."""
        handles, dead = {}, {}
        if local:
            for r in ranks:
                try:
                    handles[r.rank] = exit_handle(r.pid)
                except psutil.NoSuchProcess:
                    dead[r.rank] = "exited"
        with self._lock:
            self._retired += self._local.values()
            self._was = {(r.host, r.pid): r.rank for r in self._ranks}
            self._local, self._ranks, self.dead, self._announced = handles, list(ranks), dead, set(announced)
            self._holders = {r.rank: (r.host, r.pid) for r in ranks}
            self._knocked, self._generation, self._watched = {}, self._generation + 1, time.monotonic()
        self.beacons.expect(r.rank for r in ranks)
        os.write(self._wake_w, b"w")

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (from the watcher thread) whenever a rank is found dead."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[], None]) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        os.write(self._wake_w, b"w")
        if self._thread is not threading.current_thread():
            self._thread.join(2)
        if not self._thread.is_alive():
            for handle in [*self._retired, *self._local.values()]:
                close_handle(handle)
            for _, _, pending in self._knocks:
                pending.close()
            self._retired, self._local = [], {}
            os.close(self._wake_r)
            os.close(self._wake_w)
        self.flush()

    # -- the watcher -------------------------------------------------------------------
    def _loop(self) -> None:
        # The poller and the ranks without a pidfd are made again only when what is watched changed (a
        # watch, a death) or while knocks are in flight (their sockets come and go: rare, remote ranks
        # only): rebuilt at every look they cost the kernel ~50 us a rank a second.
        key, poller, fds, knocking, unwatched = None, None, {}, {}, []
        while not self._stop.is_set():
            with self._lock:
                retired, self._retired = self._retired, []
                local, dead = self._local, self.dead
            for handle in retired:
                close_handle(handle)
            knocks = [pending for _, _, pending in self._knocks]
            now_key = (id(local), self._generation, len(dead))
            if knocks or now_key != key:
                key, poller = (None if knocks else now_key), select.poll()
                poller.register(self._wake_r, select.POLLIN)
                fds = {h: rank for rank, h in local.items() if isinstance(h, int) and rank not in dead}
                for fd in fds:
                    poller.register(fd, select.POLLIN)
                knocking = {fd: pending for pending in knocks for fd in pending.fds()}
                for fd in knocking:  # a knock's handshake, answered beside the exits: nothing waits for it
                    poller.register(fd, select.POLLOUT)
                # the ranks a look must visit: those no pidfd watches (remote, or a Process without pidfds)
                unwatched = [r for r in self._ranks if not isinstance(local.get(r.rank), int)]
            for fd, events in poller.poll((LOOK_S if unwatched or knocks else PIDFD_LOOK_S) * 1000):
                if fd == self._wake_r:
                    os.read(self._wake_r, 4096)
                elif fd in knocking:
                    knocking[fd].answered(fd)
                elif events & select.POLLIN:  # the process exited
                    self._found(fds[fd], "exited", local)
            self._look(local, unwatched)

    def _look(self, local: dict, unwatched: list[RankInfo] | None = None) -> None:
        """One look at the ranks no pidfd watches (``unwatched``; default: every rank without one)."""
        if unwatched is None:
            unwatched = [r for r in self._ranks if not isinstance(local.get(r.rank), int)]
        self._knock_silent(local, unwatched)
        for host, how in self._lost_hosts().items():  # e.g. a pod deleted, as the Kubernetes API said
            ranks = [r.rank for r in self._ranks if r.host == host and r.rank not in self.dead]
            if ranks:
                self._found_together(ranks, how, local)
        for r in unwatched:
            if r.rank in self.dead:
                continue
            handle = local.get(r.rank)
            if isinstance(handle, psutil.Process) and handle_exited(handle):
                self._found(r.rank, "exited", local)
            elif handle is None and self._silent_for(r.rank) > REMOTE_SILENCE_S:
                # its host's other ranks that fell silent with it are lost with it: one fault, one regroup
                host = silent_with(r, self._ranks, self._silent_for, set(self.dead))
                if any(self._awaits_knock(rank) for rank in host):
                    continue  # judged with its host once the knock is answered (KNOCK_TIMEOUT_S at most)
                for how, ranks in self._silent_verdict(host).items():
                    self._found_together(ranks, how, local)
        # one snapshot: watch() may swap the dead and the ranks meanwhile (a sub-mesh regroup, from the cell)
        dead, known = self.dead, {r.rank: r for r in self._ranks}
        fresh = sorted((dead.keys() & known.keys()) - self._announced)
        done = self._quiet(fresh) if fresh and self._pool_running() else None
        if done is not None:
            try:  # no cell runs there: nobody else will say it
                new = [known[rank] for rank in fresh]
                hosts = lost_hosts(new, self._ranks) if len(new) > 1 and not self._local else []
                for host in hosts:  # a whole host: one fault, one line
                    infos = [r for r in new if r.host == host]
                    ranks = format_ranks(r.rank for r in infos)
                    how = dead[infos[0].rank]
                    self.record("died", infos[0], f"host {host} lost while idle: ranks {ranks} {how}",
                                abort_s=0.0)
                    self._announced |= {r.rank for r in infos}
                    self._report(f"workbench: host {host} lost while the pool was idle: ranks {ranks} {how}; "
                                 "`%dist restart` brings them back.")
                for info in [r for r in new if r.host not in hosts]:
                    rank = info.rank
                    self.record("died", info, f"rank {rank} {dead[rank]} while idle", abort_s=0.0)
                    self._report(f"workbench: rank {rank} ({info.host}, {info.device}) died while the pool "
                                 "was idle; `%dist restart` brings it back.")
            finally:
                done()

    def _knock_silent(self, local: dict, unwatched: list[RankInfo]) -> None:
        """Knock at the gloo ports of the remote ranks silent for ``KNOCK_AFTER_S`` (all due at once, each
        at most every ``KNOCK_EVERY_S``), and take in the knocks that are answered or out of time. The
        knocks' sockets are polled in :meth:`_loop`: the watcher never waits for an answer."""
        now = time.monotonic()
        for entry in [k for k in self._knocks if k[2].done()]:
            self._knocks.remove(entry)
            generation, started, pending = entry
            found = pending.result()
            if generation == self._generation:
                self._knocked.update((r, (started, found.get(r))) for r in pending.keys)
        in_flight = {r for _, _, pending in self._knocks for r in pending.keys}
        due = [r.rank for r in unwatched if r.rank not in self.dead and local.get(r.rank) is None
               and r.rank not in in_flight and self._silent_for(r.rank) > KNOCK_AFTER_S
               and now - self._knocked.get(r.rank, (float("-inf"), None))[0] >= KNOCK_EVERY_S]
        if due:
            joined = self._endpoints()
            ports = {r: (self._own_beat(r) or (r, {}))[1].get("endpoints") or joined.get(r) for r in due}
            pending = Knock(ports, KNOCK_TIMEOUT_S)
            # a rank with no port to knock at is knocked all the same: nothing will answer for it
            self._knocked.update((r, (now, None)) for r in due if r not in pending.keys)
            self._knocks.append((self._generation, now, pending))

    def _answer(self, rank: int) -> str | None:
        """How ``rank``'s port answered a knock made since its last beacon (None: no such answer yet)."""
        when, answer = self._knocked.get(rank, (None, None))
        fresh = when is not None and when >= time.monotonic() - self._silent_for(rank)
        return answer if fresh else None

    def _own_beat(self, rank: int) -> tuple[int, dict] | None:
        """The latest beacon of the engine holding ``rank`` now, and the number it came under: ``rank``'s, or,
        where that is another engine's (a regroup renumbered this one; the number still shows its previous
        holder's last beacon: its ports, its silence), the engine's number before the regroup."""
        holder = self._holders.get(rank)
        for number in (rank, self._was.get(holder)):
            beat = self.beacons.latest.get(number) if number is not None else None
            if beat is not None and (beat.get("host"), beat.get("pid")) == holder:
                return number, beat
        return None

    def _silent_for(self, rank: int) -> float:
        """Seconds since the engine holding ``rank`` now was heard: the rank's silence clock, unless the
        number's latest beacon is another engine's (a regroup renumbered this one, not heard under the number
        yet): then since its last beacon under its number before, or the regroup (:meth:`watch`) if later."""
        if self.beacons.latest.get(rank) is None:
            return self.beacons.silent_for(rank)
        own = self._own_beat(rank)
        if own is not None and own[0] == rank:
            return self.beacons.silent_for(rank)
        since = time.monotonic() - self._watched
        return since if own is None else min(since, self.beacons.silent_for(own[0]))

    def _awaits_knock(self, rank: int) -> bool:
        """A knock at ``rank`` is in flight and no answer of this silence is in yet."""
        return self._answer(rank) is None and any(rank in pending.keys for _, _, pending in self._knocks)

    def _silent_verdict(self, ranks: list[int]) -> dict[str, list[int]]:
        """Of remote ranks silent too long, the dead ones by how they died. A rank whose gloo port answered
        the last knock is up (holding the interpreter, or starved of CPU), not lost, until
        ``HUNG_SILENCE_S``; one whose host refused its port has exited; no answer (or nothing to knock at):
        the host or its link is gone."""
        verdict: dict[str, list[int]] = {}
        for r in ranks:
            answer = self._answer(r)
            if self._silent_for(r) > HUNG_SILENCE_S:
                how = f"sent no heartbeat for {HUNG_SILENCE_S:g} s, its process up (hung)"
            elif answer == ANSWERS:
                continue
            elif answer == REFUSED:
                how = REFUSED
            else:
                how = f"sent no heartbeat for {REMOTE_SILENCE_S:g} s"
            verdict.setdefault(how, []).append(r)
        if REFUSED in verdict:  # the host answered for their ports: those processes are gone
            gone = verdict.pop(REFUSED)
            whose, what = ("its", "its process was") if len(gone) == 1 else ("their", "their processes were")
            verdict[f"exited ({whose} host answered, {what} gone)"] = gone
        return verdict

    def _found(self, rank: int, how: str, local: dict) -> None:
        self._found_together([rank], how, local)

    def _found_together(self, ranks: list[int], how: str, local: dict) -> None:
        """``ranks`` are dead, all at once (a cell sees them in one look)."""
        with self._lock:
            if local is not self._local or not set(ranks) - self.dead.keys():
                return  # the ranks were re-formed meanwhile: that process is not one of ours any more
            for rank in ranks:
                self.dead.setdefault(rank, how)
        for fn in list(self._listeners):
            fn()

    # -- the fault log -----------------------------------------------------------------
    def record(self, kind: str, info: RankInfo | None, text: str, detect_s: float | None = None,
               abort_s: float | None = None) -> faults.FaultEvent:
        """A new fault; it goes to ``faults.jsonl`` once recovered from (or when the pool stops)."""
        self.flush()
        event = faults.FaultEvent(pool=self.pool_id, kind=kind, rank=info.rank if info else None,
                                  host=info.host if info else None, device=info.device if info else None,
                                  first_failure=text, time=faults.now(), detect_s=detect_s, abort_s=abort_s)
        if kind == "died" and info is not None:
            self._announced.add(info.rank)
        self.faults.append(event)
        self._pending = event
        return event

    def note(self, kind: str, info: RankInfo | None, text: str) -> faults.FaultEvent:
        """A fault that needs no recovery of its own (a new engine that died before it joined an elastic
        run): in the list and the log at once, leaving the fault being recovered from pending."""
        event = faults.FaultEvent(pool=self.pool_id, kind=kind, rank=info.rank if info else None,
                                  host=info.host if info else None, device=info.device if info else None,
                                  first_failure=text, time=faults.now(), detect_s=None, abort_s=0.0)
        self.faults.append(event)
        faults.append(event)
        return event

    def forget(self, event: faults.FaultEvent) -> None:
        """``event`` was no fault after all (every rank raised its own error, none was cut short)."""
        if self._pending is event:
            self._pending = None
        if event in self.faults:
            self.faults.remove(event)

    def announce(self, ranks) -> None:
        """These deaths were reported already (a cell's one fault for a whole host): not again as idle."""
        self._announced |= set(ranks)

    def recovered(self, seconds: float) -> None:
        """The pending fault was recovered from in ``seconds`` (the group re-formed)."""
        if self._pending is not None:
            self._pending.recover_s = seconds
        self.flush()

    def flush(self) -> None:
        if self._pending is not None:
            faults.append(self._pending)
            self._pending = None


def silent_with(lost: RankInfo, ranks: list[RankInfo], silent_for: Callable[[int], float],
                dead: set[int] = frozenset(), host_silence: float = HOST_SILENCE_S) -> list[int]:
    """``lost`` and the ranks of its host that fell silent with it (silent for ``host_silence`` s or
    more): a host that lost its link, or died, is one fault. Ranks in ``dead`` are left out.

    >>> hosts = ["n1", "n1", "n2", "n2"]
    >>> ranks = [RankInfo(i, i % 2, i // 2, h, 100 + i, "cpu", i) for i, h in enumerate(hosts)]
    >>> silent = {0: 0.1, 1: 0.2, 2: 3.1, 3: 2.9}.get
    >>> silent_with(ranks[2], ranks, silent)
    [2, 3]
    >>> silent_with(ranks[2], ranks, {0: 0.1, 1: 0.2, 2: 3.1, 3: 0.2}.get)
    [2]
    """
    return [r.rank for r in ranks if r.rank == lost.rank or r.host == lost.host and r.rank not in dead
            and silent_for(r.rank) >= host_silence]


__all__ = ["Health", "REMOTE_SILENCE_S"]


def _free_lock(lock: threading.Lock) -> Callable[[list[int]], Callable[[], None] | None]:
    """A ``quiet`` for :class:`Health` from one lock: taken if free (its release), else None."""
    return lambda ranks: lock.release if lock.acquire(blocking=False) else None
