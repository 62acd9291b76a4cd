"""The zygote: one process per local pool that imports the engine and torch once, then forks the pool's
controller and one engine per rank on request.

A fresh engine spends nearly all of its start importing (ipyparallel, IPython, torch: seconds on a busy
core), and so did every engine a restart or a scale-up added. The zygote pays that once; a forked
engine registers within a few hundred milliseconds.

Fork safety: before it forks, the zygote runs no torch operation, starts no thread of its own (numpy's
OpenBLAS pool shuts itself down around a fork), opens no ZMQ context or socket and never touches CUDA or
NVML; each child builds all of these itself, so a GPU engine initialises CUDA only after the fork. A child
gets its own session, the environment the launcher asked for (``/proc/PID/environ`` still shows the
zygote's, which carries the pool's tag: :mod:`workbench.pool.processes.reap` finds every child by it), numpy's
global random state reseeded, and its output in the pool's log.

Lifetime: the zygote reads requests on stdin. When stdin closes (its owner exited, SIGKILL included) it
ends every process tagged with its pool and exits; so an unclaimed spare
(:mod:`workbench.pool.processes.spare`) needs no lease of its own.

Hosts: a local pool's engines stand for hosts of :data:`HOST_SIZE` engines each (a GPU node's eight), so that
the pool is shaped as a cluster is: each group of forks has its own hub
(:mod:`workbench.pool.processes.host_hub`, forked here beside its engines, forked again if it exits), and each
engine is told its group's label and hub in its environment (:data:`workbench.wire.HUB_ENV`). A new engine
fills the first group with room (a replacement goes where a rank was lost), then a new group begins.

Protocol, one JSON object a line. In: ``{"id": 1, "role": "engine" | "controller", "argv": [...],
"env": {...}, "cwd": "...", "log": "...", "hub": {...}}`` (``hub``, for an engine: ``size``, ``folder`` where
the hubs' sockets go, ``relay``: the pool's channel); out: ``{"id": 1, "pid": 4242}`` or
``{"id": 1, "error": "..."}``. ``{"id": 2, "role": "ready"}`` is answered with the zygote's own pid once
everything is imported.

>>> z = Zygote(pool_id="1a2b3c4d", log="/tmp/pool.log")       # doctest: +SKIP
>>> z.fork("engine", ["--cluster-id=x"], env=dict(os.environ), cwd=".", log="/tmp/l")  # doctest: +SKIP
4242
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

# What each kind of child needs imported; the zygote imports the controller's part first (a cold start
# forks the controller while the engine's part still loads), then the engine's with the torch sources an
# engine's first error report shows; once idle, the rest of those sources ("sources": the trainer's,
# which it imports), which each engine did on its own after the fork.
PRELOAD = {
    "controller": ("ipyparallel.controller.app", "workbench.pool.watch.heart"),
    "engine": ("ipyparallel.engine.app", "ipykernel.ipkernel", "ipykernel.debugger",
               "IPython.core.completerlib", "IPython.extensions.storemagic", "tornado.platform.asyncio",
               "tornado.queues", "pydoc",
               "workbench.pool.processes.engine_main", "workbench.remote", "workbench.engine.rendezvous",
               "workbench.engine.agent", "workbench.metrics.publisher"),
    "hub": ("workbench.pool.processes.host_hub",),
    "sources": (),
}
SOURCES_IDLE_S = 2.0  # idle this long before parsing the sources
# What a child calls its process (``ps``, ``top``, psutil's name()); the zygote's own name.
NAMES = {"engine": "wb-engine", "controller": "wb-controller", "hub": "wb-hub"}
# Engines a group of forks (a host) holds; WORKBENCH_HOST_SIZE sets it.
HOST_SIZE = 8
ZYGOTE_NAME = "wb-zygote"


# -- the kernel's side ---------------------------------------------------------------------------
class ZygoteError(RuntimeError):
    """The zygote could not fork (it exited, or the fork failed)."""


class Zygote:
    """A started zygote process for pool ``pool_id``; :meth:`fork` asks it for a child.

    Its environment is this process's plus the pool's tag (every child inherits the tag; each child gets
    the environment its launcher asks for besides); ``log``: where its own output goes; ``cwd``: the folder
    it starts in (the launchers' folder, first on the children's ``sys.path`` as with ``python -m``).
    """

    def __init__(self, *, pool_id: str, log: str, cwd: str | None = None):
        from workbench.pool.processes import reap

        self.pool_id = pool_id
        self.hubs: dict | None = None  # where the pool's engines get hubs: its launcher's hub settings
        with open(log or os.devnull, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "workbench.pool.processes.zygote"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=out,
                env={**os.environ, **reap.tag(pool_id)}, cwd=cwd,
                start_new_session=True)  # a Ctrl-C to the kernel's process group must not reach it
        self.pid = self.proc.pid
        self._lock = threading.Lock()
        self._next_id = 0
        self._buffer = b""

    def fork(self, role: str, argv: list[str], *, env: dict[str, str], cwd: str, log: str,
             connection_file: str | None = None, timeout: float = 120.0) -> int:
        """Fork a ``role`` child running ``argv`` (the engine's or controller's arguments); its pid.

        Waits while the zygote is still importing what the child needs. ``connection_file``: an engine
        reads the controller's connection info there once it is written (it may start before).
        """
        request = {"role": role, "argv": list(argv), "env": dict(env), "cwd": cwd, "log": log,
                   "connection_file": connection_file}
        if role == "engine" and self.hubs:
            request["hub"] = self.hubs
        return self._ask(request, timeout)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Return once the zygote has imported everything a child needs."""
        self._ask({"role": "ready"}, timeout)

    def _ask(self, request: dict, timeout: float) -> int:
        role = request["role"]
        with self._lock:
            self._next_id += 1
            request["id"] = self._next_id
            try:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                raise ZygoteError(self._gone()) from None
            deadline = time.monotonic() + timeout
            while True:  # a reply to an earlier, interrupted request may come first: skip it
                reply = self._read_line(deadline)
                if reply.get("id") == request["id"]:
                    break
        if "error" in reply:
            raise ZygoteError(f"the zygote could not start the {role}: {reply['error']}")
        return reply["pid"]

    def _read_line(self, deadline: float) -> dict:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ZygoteError(f"the zygote (pid {self.pid}) did not answer in time")
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise ZygoteError(self._gone())
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _gone(self) -> str:
        code = self.proc.poll()
        return f"the zygote (pid {self.pid}) exited{f' with {code}' if code is not None else ''}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Close its stdin: the zygote ends every process of its pool and exits (not waited for here)."""
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


# -- the zygote's side ---------------------------------------------------------------------------
def _name(name: str) -> None:
    """Set this process's name (``/proc/self/comm``), Linux only."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _preload(role: str, loaded: set[str]) -> None:
    import gc
    import importlib

    for module in PRELOAD[role]:
        importlib.import_module(module)
    if role in ("engine", "sources"):
        from workbench.engine import agent

        # torch's files in every fault's traceback, before the first engine is forked (~0.5 s here once,
        # not 0.5 s in each of 31 ranks at the first fault); the trainer's once idle
        agent.parse_traceback_sources(only_loaded=role == "engine")
        if role == "engine":  # and the rest of formatting such a traceback, once (not in each rank at once)
            agent.format_a_collective_traceback()
    loaded.add(role)
    gc.collect()
    gc.freeze()  # what is loaded now stays put: the children's garbage collections do not copy its pages


def _child(role: str, request: dict, keep_fds: set[int]) -> None:
    """In the forked child: become a fresh ``role`` process; never returns."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in keep_fds:  # the zygote's pipes: the child must not hold them open
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["log"] or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        _name(NAMES[role])
        cwd = request["cwd"] or os.getcwd()
        if sys.path and sys.path[0] == os.getcwd():  # ``-m`` put the zygote's folder first: now the child's
            sys.path[0] = os.path.abspath(cwd)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(request["env"])
        if "numpy.random" in sys.modules:  # a fresh process would have drawn its own seed
            sys.modules["numpy.random"].seed()
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and "torch" in sys.modules:  # what torch reads at import in a fresh process
            sys.modules["torch"].set_num_threads(int(threads))
        if role == "hub":
            from workbench.pool.processes import host_hub

            host_hub.serve(request["settings"])
            code = 0
            return
        if role == "engine":
            import importlib.util

            from workbench.engine import agent
            from workbench.pool.processes.engine_main import engine_argv

            agent.skip_warming()  # what the zygote warmed is warm here; the rest is not done N times

            main = _engine(request.get("connection_file"))
            have_mpi4py = importlib.util.find_spec("mpi4py") is not None
            sys.argv = engine_argv(["ipengine", *request["argv"]], have_mpi4py)
        else:
            from ipyparallel.controller.app import main

            from workbench.pool.watch import heart

            sys.argv = ["ipcontroller", *request["argv"]]
            _skip_database_pause()
            heart.install()
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        _exit(code)


def _engine(connection_file: str | None):
    """ipyparallel's engine entry point; given ``connection_file``, the engine is forked before the controller
    has written it: the engine sets itself up meanwhile and reads the file once it is complete."""
    from ipyparallel.engine.app import IPEngine, main

    if not connection_file:
        return main

    class ForkedEngine(IPEngine):
        def init_engine(self):
            self.connection_info_env = json.dumps(_read_when_written(connection_file, self.wait_for_url_file))
            super().init_engine()

    return ForkedEngine.launch_instance


def _read_when_written(path: str, timeout: float) -> dict:
    """The JSON in ``path`` once it is there and whole (ipyparallel writes it in place, not atomically)."""
    deadline = time.monotonic() + max(timeout, 60.0)
    while True:
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the controller's connection file {path} did not appear") from None
            time.sleep(0.005)


def _skip_database_pause() -> None:
    """ipyparallel's controller sleeps 0.25 s in ``init_hub`` after opening its task database (a pause kept
    from its MongoDB days), before it writes the connection files every engine waits for. With the in-memory
    database there is nothing to wait for: in this (single-threaded, still starting) controller process,
    ``time.sleep`` does nothing during that one call."""
    import time as time_module

    from ipyparallel.controller.app import IPController
    from ipyparallel.controller.dictdb import DictDB

    init_hub = IPController.init_hub

    def without_pause(self):
        if not issubclass(self.db_class, DictDB):
            return init_hub(self)
        sleep, time_module.sleep = time_module.sleep, lambda seconds: None
        try:
            return init_hub(self)
        finally:
            time_module.sleep = sleep

    IPController.init_hub = without_pause


def _exit(code: int) -> None:
    """What a normal interpreter exit does (atexit handlers, flushed output), then leave the child."""
    import atexit

    try:
        atexit._run_exitfuncs()  # the handlers the modules registered, as at the end of any interpreter
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def serve() -> None:
    """The zygote's loop: preload, fork on request, reap children, end the pool when stdin closes."""
    from workbench.pool.processes import quiet

    _name(ZYGOTE_NAME)
    quiet.pool_process()  # once, for every child: their sessions speak CurveZMQ (no "signing is disabled")
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)  # SIGCHLD wakes the loop: exited children are reaped at once
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    keep = {stdin, stdout, wake_r, wake_w}
    loaded: set[str] = set()
    failed: set[str] = set()  # not tried again while idle; a request for it tries again (and says why)
    children: dict[int, str] = {}  # pid -> role, for the log line that says how each one ended
    hosts = Hosts()
    buffer = b""
    while True:
        for pid in _reap(children):
            hosts.ended(pid, keep, children)
        pending = [role for role in PRELOAD if role not in loaded | failed]
        if b"\n" in buffer or (pending and pending != ["sources"]):
            wait = 0.0  # something to do: only look whether more came
        else:  # the sources once idle a while: after a start's burst of requests, not competing with it
            wait = SOURCES_IDLE_S if pending else None
        ready = select.select([stdin, wake_r], [], [], wait)[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
        if stdin in ready:
            chunk = os.read(stdin, 65536)
            if not chunk:
                break
            buffer += chunk
        if b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            role = request["role"]
            try:
                for needed in PRELOAD if role == "ready" else (role,):
                    if needed not in loaded:
                        _preload(needed, loaded)
                group = hosts.place(request, keep, children) if role == "engine" else None
                pid = os.getpid() if role == "ready" else os.fork()
                if pid == 0:
                    _child(role, request, keep)
                if role != "ready":
                    children[pid] = role
                if group is not None:
                    hosts.joined(group, pid)
                reply = {"id": request["id"], "pid": pid}
            except Exception as exc:  # an import or the fork failed: the kernel says so
                reply = {"id": request["id"], "error": f"{type(exc).__name__}: {exc}"}
            os.write(stdout, (json.dumps(reply) + "\n").encode())
        elif pending and not ready:
            try:
                _preload(pending[0], loaded)
            except Exception:  # the pool's log shows it; a child that needs it gets the error
                import traceback

                traceback.print_exc()
                failed.add(pending[0])
    _end_pool()


def _reap(children: dict[int, str]) -> list[int]:
    """Reap the children that exited (their pids); the pool's log (our stderr) says how each one ended."""
    gone = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return gone
        if pid == 0:
            return gone
        gone.append(pid)
        role = children.pop(pid, "child")
        print(f"workbench zygote: {role} {pid} {_how_it_ended(status)} at {time.strftime('%H:%M:%S')}",
              file=sys.stderr, flush=True)


class Hosts:
    """The groups of forked engines that stand for hosts, and their hubs (see the module's docstring).

    >>> hosts = Hosts(size=2)
    >>> [hosts.label_for() for _ in range(1)], hosts.endpoints("/run/p", "h0")["WORKBENCH_HUB_UP"]
    (['h0'], 'ipc:///run/p/hub-h0-up')
    >>> hosts.joined("h0", 11); hosts.joined("h0", 12); hosts.label_for()
    'h1'
    >>> hosts.ended(11, set()); hosts.label_for()
    'h0'
    """

    def __init__(self, size: int | None = None):
        self.size = size or int(os.environ.get("WORKBENCH_HOST_SIZE", HOST_SIZE))
        self.groups: dict[str, set[int]] = {}  # label -> its engines' pids
        self.hubs: dict[str, int] = {}  # label -> its hub's pid
        self.requests: dict[str, dict] = {}  # label -> the request its hub was forked with

    def label_for(self) -> str:
        """The group a new engine joins: the first with room, else a new one."""
        for label, pids in self.groups.items():
            if len(pids) < self.size:
                return label
        return f"h{len(self.groups)}"

    @staticmethod
    def endpoints(folder: str, label: str) -> dict[str, str]:
        """A hub's sockets (unix sockets in the pool's private folder) as its engines' environment."""
        return {"WORKBENCH_HUB": label, "WORKBENCH_HUB_UP": f"ipc://{folder}/hub-{label}-up",
                "WORKBENCH_HUB_OUT": f"ipc://{folder}/hub-{label}-out"}

    def place(self, request: dict, keep: set[int], children: dict[int, str]) -> str | None:
        """Put the engine of ``request`` in a group (its hub forked first if it has none): its label, with the
        group's hub in its environment; None where the pool has no hubs (or their paths would be too long)."""
        hub = request.get("hub")
        if not hub:
            return None
        label = self.label_for()
        env = self.endpoints(hub["folder"], label)
        if max(len(v) for v in env.values()) - len("ipc://") >= 107:  # a unix socket's path: the relay then
            return None  # is on TCP and the engines talk to it directly
        self.groups.setdefault(label, set())
        self.requests[label] = {"role": "hub", "env": dict(request["env"]), "cwd": request.get("cwd"),
                                "log": request.get("log"),
                                "settings": {"label": label, "up": env["WORKBENCH_HUB_UP"],
                                             "out": env["WORKBENCH_HUB_OUT"], "relay": hub["relay"],
                                             "pool": hub.get("pool")}}
        if label not in self.hubs:
            self._fork_hub(label, keep, children)
        request["env"] = {**request["env"], **env}
        return label

    def _fork_hub(self, label: str, keep: set[int], children: dict[int, str]) -> None:
        _preload_once("hub")
        pid = os.fork()
        if pid == 0:
            _child("hub", self.requests[label], keep)
        children[pid] = "hub"
        self.hubs[label] = pid

    def joined(self, label: str, pid: int) -> None:
        self.groups.setdefault(label, set()).add(pid)

    def ended(self, pid: int, keep: set[int], children: dict[int, str] | None = None) -> None:
        """A child exited: an engine leaves its group; a hub is forked again while its group has engines."""
        for pids in self.groups.values():
            pids.discard(pid)
        for label, hub_pid in list(self.hubs.items()):
            if hub_pid == pid:
                del self.hubs[label]
                if self.groups.get(label) and children is not None:
                    self._fork_hub(label, keep, children)


def _preload_once(role: str) -> None:
    import importlib

    for module in PRELOAD[role]:
        importlib.import_module(module)


def _how_it_ended(status: int) -> str:
    """``os.waitpid``'s status in words.

    >>> _how_it_ended(0), _how_it_ended(256), _how_it_ended(9)
    ('exited with code 0', 'exited with code 1', 'was killed by SIGKILL')
    """
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def _end_pool() -> None:
    """The owner closed our stdin (it stopped, or died): end every process of the pool, then exit."""
    from workbench.pool.processes import reap

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    reap.end_pool(os.environ.get(reap.MARKER), grace=0.0)


if __name__ == "__main__":
    serve()
