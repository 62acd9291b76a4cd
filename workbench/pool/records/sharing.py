"""One pool, several notebooks: names people can say, who is attached, one cell at a time, who stopped it.

Everything lives beside the pool's state file in the Jupyter runtime folder, so every kernel of the
machine and the Jupyter server see the same picture:

- ``pool-<id>.clients/<pid>.json``: one file per session driving the pool (the one that started it,
  attached ones): its notebook and since when. Files of processes that are gone do not count.
- ``pool-<id>.lock``: the cell lock (``flock``). A cell holds it while it runs on the ranks, so two
  notebooks' cells never interleave on the engines; its content says who holds it.
- ``pool-<id>.stopped.json``: written when a pool is stopped, saying by whom and when, so a notebook
  still attached hears it in one line.

>>> name_for("1a2b3c4d"), name_for("1a2b3c4d") == name_for("1a2b3c4d")
('pool-bold-tapir', True)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import time
from pathlib import Path

from workbench.pool.records import state as pool_state

_ADJECTIVES = ("amber", "bold", "brisk", "calm", "clever", "crisp", "eager", "fair", "glad", "gentle",
               "jolly", "keen", "kind", "lucky", "merry", "neat", "noble", "proud", "quick", "quiet",
               "rapid", "shy", "snug", "steady", "sunny", "swift", "tidy", "warm", "wise", "witty")
_ANIMALS = ("badger", "beaver", "bison", "crane", "eagle", "falcon", "ferret", "finch", "fox", "gecko",
            "heron", "ibis", "koala", "lark", "lemur", "lynx", "marmot", "moose", "newt", "otter", "owl",
            "panda", "puffin", "quail", "raven", "robin", "seal", "stork", "tapir", "wren")
STOPPED_KEPT_S = 24 * 3600  # how long a stopped pool's note stays for notebooks that were attached


def name_for(pool_id: str) -> str:
    """A short name a person can say, derived from the pool id (the same id, the same name)."""
    pick = random.Random(pool_id)
    return f"pool-{pick.choice(_ADJECTIVES)}-{pick.choice(_ANIMALS)}"


_me: dict[str, str] = {}  # what this process is called when it is no kernel (see call_this_process)


def call_this_process(name: str | None) -> None:
    """Name this process for the notebooks attached to its pools (the Jupyter server: its panel);
    None: name it as before."""
    if name is None:
        _me.pop("name", None)
    else:
        _me["name"] = name


def this_notebook() -> str:
    """The notebook of this kernel (Jupyter tells kernels in ``JPY_SESSION_NAME``), else what this process
    was called (:func:`call_this_process`), else its process id."""
    if "name" in _me:
        return _me["name"]
    path = os.environ.get("JPY_SESSION_NAME")
    if path:
        return os.path.basename(path) if os.path.isabs(path) else path
    return f"process {os.getpid()}"


# -- who is attached -----------------------------------------------------------------------
def _clients_dir(pool_id: str) -> Path:
    return pool_state.state_dir() / f"pool-{pool_id}.clients"


def register(pool_id: str, role: str, notebook: str | None = None) -> None:
    """Say that this process drives the pool (``role``: "started" or "attached")."""
    folder = _clients_dir(pool_id)
    folder.mkdir(mode=0o700, exist_ok=True)
    record = {**pool_state.process_record(os.getpid()), "notebook": notebook or this_notebook(),
              "role": role, "since": time.time()}
    with pool_state.private_file(folder / f"{os.getpid()}.json", "w") as f:
        json.dump(record, f)


def unregister(pool_id: str) -> None:
    folder = _clients_dir(pool_id)
    (folder / f"{os.getpid()}.json").unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        folder.rmdir()  # the last one out: nothing of the pool is left in the runtime folder


def forget(pool_id: str) -> None:
    """After the pool ended without its owner's stop (its lease ended it): the records of sessions that
    are gone, and the folder once nobody is left (an attached session unregisters itself)."""
    clients(pool_id)
    with contextlib.suppress(OSError):
        _clients_dir(pool_id).rmdir()


def clients(pool_id: str) -> list[dict]:
    """The sessions driving the pool whose process is alive: ``[{"pid", "notebook", "role", "since"}]``."""
    out = []
    for path in sorted(_clients_dir(pool_id).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if pool_state.process_alive(record):
            out.append(record)
        else:
            path.unlink(missing_ok=True)
    return sorted(out, key=lambda r: (r["role"] != "started", r["since"]))


# -- one cell at a time ----------------------------------------------------------------------
RECORD_BYTES = 512  # the holder's record is written padded to this (or longer), over the last one


class CellLock:
    """The pool's cell lock, shared by every process on this machine (``flock`` on a file).

    >>> lock = CellLock("1a2b3c4d")                             # doctest: +SKIP
    >>> with lock.held(waiting=lambda who: print("busy:", who)):  # doctest: +SKIP
    ...     run_the_cell()
    """

    POLL_S = 0.05

    def __init__(self, pool_id: str, part: str | None = None):
        # ``part``: a sub-mesh's own lock (docs/submeshes.md); its cells hold the pool's lock shared
        self.path = pool_state.state_dir() / (f"pool-{pool_id}.lock" if part is None else
                                              f"pool-{pool_id}-{part}.lock")
        self._fd: int | None = None
        self._seen: int | None = None  # the record's mtime at the last look of used()

    @contextlib.contextmanager
    def held(self, waiting=lambda who: None, what: str = "a cell", shared: bool = False):
        """Hold the lock for the block; while another notebook holds it, ``waiting(who)`` once and wait
        (Ctrl-C cancels the wait: nothing was sent to the ranks). ``shared``: with the others that hold it
        shared (the cells on a split pool's sub-meshes), apart from one that holds it whole."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        told = False
        try:
            while True:
                try:
                    fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not told:
                        waiting(self.holder() or "another notebook")
                        told = True
                    time.sleep(self.POLL_S)
            # one write in place, no truncate (that cost ~2 ms a cell on a busy disk): padded over the
            # last holder's record; holder() reads the first JSON object
            record = json.dumps({"notebook": this_notebook(), "pid": os.getpid(), "what": what,
                                 "since": time.time()}).encode()
            os.pwrite(fd, record.ljust(RECORD_BYTES), 0)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def used(self) -> bool:
        """Whether any notebook holds the lock now, or took it since the last call (a cell ran meanwhile).

        What the owner's idle release asks, so cells from attached notebooks count as use (a kept pool is
        used from a kernel, its owner is the Jupyter server). Read from the outside only: the record's
        mtime (each holder writes it) and the kernel's table of flocks, never by taking the lock (a
        notebook trying it at that moment would be told the pool is busy).
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        taken, self._seen = st.st_mtime_ns != self._seen, st.st_mtime_ns
        return taken or _flocked(st)

    def holder(self) -> str | None:
        """Who holds the lock, as "<notebook>" (None if nobody says)."""
        try:
            info, _ = json.JSONDecoder().raw_decode(self.path.read_text())
        except (OSError, ValueError):
            return None
        return info.get("notebook") if isinstance(info, dict) else None


class StateWrite:
    """Held around one read-merge-write of the pool's state file, so two notebooks writing at once each
    merge into what the other wrote (``flock`` on ``pool-<id>.state.lock``)."""

    def __init__(self, pool_id: str):
        self.path = pool_state.state_dir() / f"pool-{pool_id}.state.lock"
        self._fd: int | None = None

    def __enter__(self) -> StateWrite:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # held for one file write: never long
        return self

    def __exit__(self, *exc) -> None:
        os.close(self._fd)  # closing releases the flock


def _flocked(st: os.stat_result) -> bool:
    """Whether a process holds a flock on the file ``st`` describes (Linux's ``/proc/locks``).

    >>> import tempfile; f = tempfile.NamedTemporaryFile(); fcntl.flock(f, fcntl.LOCK_EX)
    >>> _flocked(os.stat(f.name)), fcntl.flock(f, fcntl.LOCK_UN), _flocked(os.stat(f.name))
    (True, None, False)
    """
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            return any(len(p) > 5 and p[1] == "FLOCK" and p[5] == where for p in map(str.split, f))
    except OSError:
        return False


# -- who stopped it ------------------------------------------------------------------------------
def _stopped_path(pool_id: str) -> Path:
    return pool_state.state_dir() / f"pool-{pool_id}.stopped.json"


def note_stopped(pool_id: str, name: str | None, by: str) -> None:
    """Leave word that the pool was stopped, ``by`` whom (e.g. "the JupyterLab panel")."""
    with pool_state.private_file(_stopped_path(pool_id), "w") as f:
        json.dump({"id": pool_id, "name": name, "by": by, "at": time.time()}, f)
    for path in pool_state.state_dir().glob("pool-*.stopped.json"):  # forget old notes
        with contextlib.suppress(OSError):
            if time.time() - path.stat().st_mtime > STOPPED_KEPT_S:
                path.unlink()
    for lock in [pool_state.state_dir() / f"pool-{pool_id}.lock",  # its state-write and sub-meshes' locks
                 pool_state.state_dir() / f"pool-{pool_id}.state.lock",
                 *pool_state.state_dir().glob(f"pool-{pool_id}-*.lock")]:
        with contextlib.suppress(OSError):
            lock.unlink()


def stopped(pool_id: str) -> dict | None:
    """``{"by": ..., "at": ...}`` if the pool was stopped (and by whom), else None."""
    try:
        return json.loads(_stopped_path(pool_id).read_text())
    except (OSError, ValueError):
        return None


def describe_stop(pool_id: str, name: str | None) -> str:
    """The one line a notebook shows when its pool went away under it."""
    note = stopped(pool_id) or {}
    label = name or pool_id
    if note:
        when = time.strftime("%H:%M", time.localtime(note["at"]))
        return (f"pool {label} was stopped (by {note['by']} at {when}); `%dist start` starts a new one, "
                "`%dist attach` joins another.")
    return (f"pool {label} is gone (its processes ended); `%dist start` starts a new one, `%dist attach` "
            "joins another.")
