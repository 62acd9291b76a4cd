"""A second user of the machine (uid 65534) that attacks every port and file of a running pool.

The test process (root, the pool's owner) finds what to attack: the listening sockets of its own
process (the relay) and of every process it started (zygote, controller, engines; psutil), and the
files of the pool's folders. It hands each new one to :mod:`tests.security.attacker`, run as the other
user, and keeps its answers. Only the pool's own ports are attacked, never other listeners of the
machine (other people's pools).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

NOBODY = 65534
VENV_SITE = next(p for p in sys.path if p.endswith("site-packages"))
SYSTEM_PYTHON = "/usr/bin/python3"  # the venv's interpreter lies under /root, closed to uid 65534
ATTACKER = Path(__file__).with_name("attacker.py")


def listening(procs: list[psutil.Process]) -> set[tuple[str, int]]:
    """(ip, port) of every TCP socket ``procs`` listen on (one read of the machine's table: reading it
    per process would cost a busy machine more than the attack)."""
    return set(owners(procs))


def owners(procs: list[psutil.Process]) -> dict[tuple[str, int], int]:
    """(ip, port) -> pid, of every TCP socket ``procs`` listen on."""
    pids = {p.pid for p in procs}
    found = {}
    for conn in psutil.net_connections(kind="inet"):
        if conn.pid in pids and conn.status == psutil.CONN_LISTEN:
            ip = conn.laddr.ip
            found[("127.0.0.1" if ip in ("0.0.0.0", "::") else ip, conn.laddr.port)] = conn.pid
    return found


class Intruder:
    """The attacker process and a thread that feeds it what appears; ``phase`` names the answers.

    >>> with Intruder(folders=[state_dir]) as bad:      # doctest: +SKIP
    ...     bad.phase = "cell"; bad.sweep(); bad.settle()
    """

    def __init__(self, folders: list[Path], urls: tuple[str | dict, ...] = ()):
        self.folders, self.urls = folders, urls
        self.phase = "start"
        self.answers: list[dict] = []
        self.owner: dict[int, str] = {}  # port -> which process of the pool listened there
        self._asked: set = set()
        self._pending = 0
        self._lock = threading.Condition()
        self._stop = threading.Event()
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": VENV_SITE, "HOME": "/tmp"}
        self.proc = subprocess.Popen(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", SYSTEM_PYTHON,
             str(ATTACKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd="/tmp",
            stderr=subprocess.DEVNULL)  # torch's C++ traces of each refused store client
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._feeder = threading.Thread(target=self._feed, daemon=True)
        self._feeder.start()

    # what there is to attack
    def _pool_procs(self) -> list[psutil.Process]:
        me = psutil.Process()
        ours = [p for p in me.children(recursive=True) if p.pid != self.proc.pid]
        mine = {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)} | {self.proc.pid}
        return [me, *(p for p in ours if p.pid not in mine)]

    def targets(self) -> list[dict]:
        procs = self._pool_procs()
        found = owners(procs)
        names = {p.pid: _name(p) for p in procs}
        asks = [{"port": list(p)} for p in sorted(found)]
        with self._lock:
            self.owner.update({p[1]: names.get(pid, "?") for p, pid in found.items()})
        for folder in self.folders:
            if folder.exists():
                asks.append({"file": str(folder)})
                asks += [{"file": str(p)} for p in sorted(folder.rglob("*"))]
        return asks + [url if isinstance(url, dict) else {"http": url} for url in self.urls]

    def _feed(self) -> None:
        while not self._stop.wait(0.25):
            self.sweep()

    def sweep(self) -> None:
        """Ask the attacker about every target not yet attacked in this phase."""
        for ask in self.targets():
            key = (self.phase, json.dumps(ask, sort_keys=True))
            with self._lock:
                if key in self._asked:
                    continue
                self._asked.add(key)
                self._pending += 1
            try:
                self.proc.stdin.write(json.dumps({**ask, "phase": self.phase}) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                return

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._lock:
                self.answers.append(json.loads(line))
                self._pending -= 1
                self._lock.notify_all()

    def settle(self, timeout: float = 300) -> bool:
        """Wait until every attack asked so far has been made (True), or ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    return False
                self._lock.wait(min(left, 0.5))
        return True

    def of(self, phase: str) -> list[dict]:
        with self._lock:
            return [a for a in self.answers if a["phase"] == phase]

    def close(self) -> None:
        self._stop.set()
        self._feeder.join(5)
        try:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._reader.join(5)

    def __enter__(self) -> Intruder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _name(proc: psutil.Process) -> str:
    try:
        env = proc.environ()
        return env.get("WORKBENCH_ROLE") or " ".join(proc.cmdline()[-2:])
    except psutil.Error:
        return "?"


def can_run_as_nobody() -> str | None:
    """Why the other user cannot be played here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root to run a process as uid 65534 (setpriv)"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"needs {SYSTEM_PYTHON} (Python {sys.version_info.major}.{sys.version_info.minor})"
    probe = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", SYSTEM_PYTHON, "-c",
         "import torch.distributed, zmq, psutil"], capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": VENV_SITE, "HOME": "/tmp"}, cwd="/tmp")
    if probe.returncode:
        return f"uid 65534 cannot import torch from {VENV_SITE}: {probe.stderr.strip()[-300:]}"
    return None
