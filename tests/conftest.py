"""Shared fixtures: a real IPython shell with the magics, a real 2-engine pool."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from unittest import mock

import psutil
import pytest

# A suite started in the background (`pytest ... &` in a script) inherits SIGINT ignored, and Python then
# installs no KeyboardInterrupt handler, here or in the kernels and pools the tests start (an ignored signal
# stays ignored across exec): every Ctrl-C test would fail for a reason of the harness. Put the handler back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def alive(pids: list[int]) -> list[int]:
    """The pids that still run (zombies do not count: their memory is gone)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def output_hook(out: list[str]):
    """An ``output_hook`` for jupyter_client's ``execute_interactive``: what a cell shows as text (streams,
    results, displays, an error's traceback) appended to ``out``."""
    def hook(msg):
        c = msg["content"]
        if msg["msg_type"] == "stream":
            out.append(c["text"])
        elif msg["msg_type"] in ("execute_result", "display_data"):
            out.append(c["data"].get("text/plain", "") + "\n")
        elif msg["msg_type"] == "error":
            out.append("\n".join(c["traceback"]) + "\n")

    return hook


def run_cell(ip, cell: str):
    """Run a cell in the real IPython shell, as a notebook would: (its result, all it showed as text)."""
    from IPython.utils.capture import capture_output

    with capture_output() as cap:
        result = ip.run_cell(cell)
    shown = cap.stdout + cap.stderr + "".join(o.data.get("text/plain", "") + "\n" for o in cap.outputs)
    return result, shown


def pool_through_magics(ip, start: str = "%dist start -n 2 --timeout 60"):
    """The body of a module-scoped pool fixture: started with ``start``, stopped with ``%dist stop``, and
    then none of its processes is left (``yield from pool_through_magics(ipshell)``)."""
    from workbench import session

    result, shown = run_cell(ip, start)
    assert result.success, shown
    s = session.current()
    pids = s.pids()
    yield s
    result, shown = run_cell(ip, "%dist stop")
    assert result.success, shown
    assert alive(pids) == [], "processes of the pool survived %dist stop"


@pytest.fixture(scope="module")
def monkeypatch_module():
    """``monkeypatch`` for a module-scoped fixture: undone when the module's tests are done."""
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module", autouse=True)
def environment_kept():
    """What a module's tests set in ``os.environ`` ends with the module. A bench run in-process once set
    WORKBENCH_PREWARM=0 for every later test, and a kernel started later had no spare zygote."""
    with mock.patch.dict(os.environ):
        yield


@pytest.fixture(scope="session")
def ipshell():
    """The IPython shell the magics run in, with ``%load_ext workbench`` done."""
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()  # start_ipython() returns None once another test has started the shell
    ip.run_line_magic("load_ext", "workbench")
    return ip


def until(predicate, timeout: float = 10.0, every: float = 0.02) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes (a hard bound, never a speed check)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


@pytest.fixture
def channel():
    """A pool's side channel without a pool: a real relay and its key, as ``EnginePool`` records them."""
    from workbench import wire
    from workbench.pool.watch.relay import Relay

    key = wire.new_key()
    relay = Relay("127.0.0.1", key)
    yield {"up": relay.up, "out": relay.out, "key": key, "relay": relay}
    relay.close()


class PidsLimit:
    """A cgroup v1 pids group that caps every task (process or thread) a test starts.

    Processes stay in it when they are orphaned (PPID 1), so ``pids()`` is exactly what the test
    started, whoever else runs on the machine.
    """

    ROOT = Path("/sys/fs/cgroup/pids")

    def __init__(self, max_tasks: int):
        self.max_tasks = max_tasks
        self.path = self.ROOT / f"workbench-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.home = self.ROOT / self._own_group().lstrip("/")

    @staticmethod
    def _own_group() -> str:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, group = line.split(":", 2)
            if "pids" in controllers.split(","):
                return group
        return "/"

    def __enter__(self) -> PidsLimit:
        if not os.access(self.ROOT / "cgroup.procs", os.W_OK):
            pytest.skip("needs a writable cgroup v1 pids controller to bound the processes it may start")
        self.path.mkdir()
        (self.path / "pids.max").write_text(str(self.max_tasks))
        (self.path / "cgroup.procs").write_text(str(os.getpid()))  # children inherit the group
        return self

    def pids(self) -> list[int]:
        """Every process in the group except this test process."""
        text = (self.path / "cgroup.procs").read_text()
        return [int(p) for p in text.split() if int(p) != os.getpid()]

    def __exit__(self, *exc) -> None:
        (self.home / "cgroup.procs").write_text(str(os.getpid()))
        deadline = time.monotonic() + 10
        while self.pids() and time.monotonic() < deadline:
            for pid in self.pids():  # only what this test started: nothing else is in the group
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        self.path.rmdir()


@contextlib.contextmanager
def ctrl_c_after(seconds: float):
    """Ctrl-C in the notebook: SIGINT to this (main) thread ``seconds`` into the block. Cancelled when
    the block ends, so a test that ended early never interrupts a later one."""
    main = threading.get_ident()
    timer = threading.Timer(seconds, lambda: signal.pthread_kill(main, signal.SIGINT))
    timer.start()
    try:
        yield timer
    finally:
        timer.cancel()


@contextlib.contextmanager
def running_pool(**session_options):
    """A started :class:`workbench.Session`; after the block it is stopped and every process it had (at
    its start or its end) is checked gone."""
    from workbench import Session

    s = Session(**session_options).start()
    pids = s.pids()
    try:
        yield s
    finally:
        pids = sorted(set(pids) | set(s.pids()))
        s.stop()
        assert until(lambda: alive(pids) == [], 10), f"processes of the pool survived stop: {alive(pids)}"
