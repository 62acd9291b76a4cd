"""Fencing engines on other hosts: an engine an elastic run declared lost is ended over ssh.

An engine started over ssh runs detached on its host (ipyparallel starts it in a session of its own and
the ssh connection ends at once), so nothing ends it when its host's link is cut. The kernel keeps
trying ``ssh host kill -9 PID`` in a background thread, each try bounded by a connect timeout, until
the host answers (the link came back: the engine ends within seconds) or the pool stops. The remote
command kills the pid only if that process carries the pool's tag (``WORKBENCH_POOL=<id>`` in its
environment): a pid reused on that host by someone else's process is never touched.

Engines on other launchers fence themselves when they hear the kernel again (see
:mod:`workbench.engine.agent`, ``fence``).

>>> remote_kill("1a2b", 4242)
'if grep -qzx WORKBENCH_POOL=1a2b /proc/4242/environ 2>/dev/null; then kill -9 4242; fi'
"""

from __future__ import annotations

import logging
import subprocess
import threading

from workbench.pool.processes.reap import MARKER

log = logging.getLogger("workbench.pool")
CONNECT_TIMEOUT_S = 3  # one try at a host whose link is cut
RETRY_S = 1.0  # between tries


def remote_kill(pool_id: str, pid: int) -> str:
    """The shell command that SIGKILLs ``pid`` on its host if it is an engine of ``pool_id``."""
    pid = int(pid)
    return f"if grep -qzx {MARKER}={pool_id} /proc/{pid}/environ 2>/dev/null; then kill -9 {pid}; fi"


class Fencer:
    """Ends engines of a pool on other hosts over ssh, retrying until each host answers.

    ``launchers``: a callable giving the pool's ssh engine launchers now (``ssh_cmd``, ``ssh_args``,
    ``location``, ``pid``). ``fenced`` holds what was done, ``"n2:4242": "ended"`` (or "trying").
    """

    def __init__(self, pool_id: str, launchers):
        self.pool_id, self.launchers = pool_id, launchers
        self.fenced: dict[str, str] = {}
        self._stop = threading.Event()

    def fence(self, pids: list[int]) -> None:
        """End the ssh engines with these pids (in the background)."""
        targets = [el for el in self.launchers() if el.pid in set(pids)]
        for el in targets:
            key = f"{el.location}:{el.pid}"
            if key in self.fenced:
                continue
            self.fenced[key] = "trying"
            threading.Thread(target=self._end, args=(el, key), name=f"workbench-fence-{key}",
                             daemon=True).start()

    def _end(self, el, key: str) -> None:
        argv = [*el.ssh_cmd, *el.ssh_args, "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", el.location,
                remote_kill(self.pool_id, el.pid)]
        while not self._stop.is_set():
            try:
                done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                      timeout=CONNECT_TIMEOUT_S + 10)
            except (subprocess.TimeoutExpired, OSError):
                done = None
            if done is not None and done.returncode != 255:  # 255: ssh itself failed (host unreachable)
                self.fenced[key] = "ended"
                log.info("fenced engine %s (ssh exit %s)", key, done.returncode)
                return
            self._stop.wait(RETRY_S)

    def ended(self) -> set[int]:
        """Pids of the engines whose host answered the kill."""
        return {int(key.rsplit(":", 1)[1]) for key, state in self.fenced.items() if state == "ended"}

    def close(self) -> None:
        self._stop.set()
