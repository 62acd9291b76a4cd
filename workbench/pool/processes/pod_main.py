"""A Kubernetes pod's first process: it starts the pod's engines and ends them all at once.

The pod is one unit for the pool: it runs ``--engines K`` engines (one per GPU it holds; one for CPU
engines), each ``python -m workbench.pool.processes.engine_main`` with the arguments after ``--``.

- SIGTERM (the pod deleted, evicted, its node drained), SIGINT or SIGHUP: every engine is SIGKILLed at
  once and this process exits 143: a deletion never waits out the grace period (a PID 1 without a handler
  ignores SIGTERM, so the kubelet would wait ~30 s and then kill).
- An engine that exits with an error (killed by the kernel's OOM killer, a crash) ends the others: the pod
  fails with that engine's status, as one unit the pool replaces. One that exits 0 (the pool shrank) leaves
  the others running; once every engine has exited, so does this process, with 0.
- As PID 1 it also reaps whatever orphans the engines leave.
- ``--stdin-connection`` (engines started inside a pod that already runs, over ``exec``): the connection
  file comes as the first line of stdin (never an argument or an environment variable) into a private
  file, and stdin closing (the kernel gone, or the pool stopped) ends the engines as SIGTERM does.

Run as ``python -m workbench.pool.processes.pod_main --engines K [--stdin-connection] -- ENGINE_ARGS``.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time

ENGINE = [sys.executable, "-m", "workbench.pool.processes.engine_main"]


def parse(argv: list[str]) -> tuple[int, bool, list[str]]:
    """``(engines, stdin_connection, engine_args)`` of the command line.

    >>> parse(["--engines", "2", "--", "--file=/c.json", "--x"])
    (2, False, ['--file=/c.json', '--x'])
    >>> parse(["--engines", "1", "--stdin-connection", "--"])
    (1, True, [])
    """
    split = argv.index("--") if "--" in argv else len(argv)
    own, rest = argv[:split], argv[split + 1:]
    engines = int(own[own.index("--engines") + 1]) if "--engines" in own else 1
    return engines, "--stdin-connection" in own, rest


def exit_status(status: int) -> int:
    """A shell's exit status for a ``waitpid`` status: the code, or 128 + the signal.

    >>> exit_status(0), exit_status(9), exit_status(3 << 8)
    (0, 137, 3)
    """
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


class Pod:
    def __init__(self, engines: int, args: list[str]):
        self.engines, self.args = engines, args
        self.pids: set[int] = set()
        self.ending = threading.Event()

    def start(self) -> None:
        for i in range(self.engines):
            env = {**os.environ, "WORKBENCH_POD_ENGINE": str(i)}
            pid = os.fork()
            if pid == 0:
                try:
                    os.execve(ENGINE[0], [*ENGINE, *self.args], env)
                finally:
                    os._exit(127)
            self.pids.add(pid)
        print(f"workbench pod: {self.engines} engine(s) started: pids {sorted(self.pids)}", flush=True)

    def kill_all(self) -> None:
        for pid in list(self.pids):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def end(self, why: str) -> None:
        """End every engine now (SIGTERM, stdin closed): this process exits 143 once they are gone."""
        if not self.ending.is_set():
            self.ending.set()
            print(f"workbench pod: {why}: ending the engines", flush=True)
            self.kill_all()

    def run(self) -> int:
        """Reap until every engine has exited; the pod's exit status."""
        status = 0
        while self.pids:
            try:
                pid, raw = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            if pid not in self.pids:
                continue  # an orphan reaped
            self.pids.discard(pid)
            code = exit_status(raw)
            if code and not self.ending.is_set():
                print(f"workbench pod: engine pid {pid} exited with {code}: ending the pod", flush=True)
                status = status or code
                self.ending.set()
                self.kill_all()
        return 143 if self.ending.is_set() and not status else status


def take_connection_from_stdin(args: list[str]) -> list[str]:
    """The first line of stdin into a private file; ``args`` with ``--file`` pointing at it."""
    line = sys.stdin.buffer.readline()
    folder = tempfile.mkdtemp(prefix="workbench-")  # 0700
    path = os.path.join(folder, "engine.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(line)
    return [a for a in args if not a.startswith("--file=")] + [f"--file={path}"]


def main(argv: list[str]) -> int:
    engines, from_stdin, args = parse(argv)
    if from_stdin:
        args = take_connection_from_stdin(args)
    pod = Pod(engines, args)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: pod.end(signal.Signals(signum).name))
    pod.start()
    if from_stdin:
        def watch_stdin():
            while sys.stdin.buffer.read(4096):
                pass
            pod.end("stdin closed")
        threading.Thread(target=watch_stdin, daemon=True).start()
    started = time.monotonic()
    status = pod.run()
    print(f"workbench pod: every engine exited after {time.monotonic() - started:.1f} s; status {status}",
          flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
