"""``--launcher ssh``: engines started over ssh on each of ``--hosts``.

ipyparallel's ssh engine-set launcher (:class:`~workbench.pool.launch.spawn.CancellableSSHEngineSetLauncher`,
``engines={host: count}``) starts them with this kernel's interpreter path (a shared file system, or the
same install on every host); ssh itself is tagged as the pool's process and writes its own messages into
the pool's log (:func:`ssh_command`). A lost rank's new engine starts on its own host when that host
answers over ssh, else on another host of the list (:mod:`workbench.pool.launch.ssh_places`); an engine
declared lost is ended over ssh once its host answers again (:mod:`workbench.pool.launch.fence`).

>>> launcher = SSH(PoolConfig(launcher="ssh", hosts="a,b"))
>>> kw = launcher.engine_set_kwargs(3, work_dir="/tmp/x", env={}, engine_args=[])
>>> kw["engines"], kw["remote_python"] == sys.executable, launcher.default_engines()
({'a': 2, 'b': 1}, True, 2)
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ipyparallel.cluster.launcher import SSHLauncher

from workbench.config import PoolConfig
from workbench.errors import PoolStartError
from workbench.pool.launch import ssh_places
from workbench.pool.launch.base import Launcher, Pool, spread
from workbench.pool.launch.fence import Fencer
from workbench.pool.launch.spawn import CancellableSSHEngineSetLauncher
from workbench.pool.launch.start_errors import start_error
from workbench.pool.processes.reap import MARKER


class SSH(Launcher):
    """Engines over ssh on the config's hosts."""

    name = "ssh"
    engine_set = CancellableSSHEngineSetLauncher
    failed_todo = "Check that ssh reaches each host from here without a password prompt."

    def __init__(self, config: PoolConfig):
        super().__init__(config)
        self._fencer: Fencer | None = None

    def traits(self, n: int, *, work_dir: str, env: dict[str, str], log: str) -> dict:
        """``n`` engines spread over the hosts; ssh engines write on their own host (ipyparallel fetches
        it), ssh's own messages go to the pool's log."""
        return {"engines": spread(n, list(self.config.hosts)), "remote_python": sys.executable,
                "ssh_cmd": ssh_command(env.get(MARKER), log)}

    def engine_set_kwargs(self, n: int, *, work_dir: str, env: dict[str, str], engine_args: list[str],
                          log: str = "", placement: dict | None = None) -> dict:
        """As every launcher's, with replacements on the hosts chosen for them (``placement``).

        >>> SSH(PoolConfig(launcher="ssh", hosts="a,b")).engine_set_kwargs(
        ...     1, work_dir="/tmp/x", env={}, engine_args=[], placement={"b": 1})["engines"]
        {'b': 1}
        """
        kwargs = super().engine_set_kwargs(n, work_dir=work_dir, env=env, engine_args=engine_args, log=log)
        if placement:
            kwargs["engines"] = dict(placement)
        return kwargs

    def where_to_start(self, pool: Pool | None, lost: list, ranks: list,
                       progress: Callable[[str], None]) -> dict[str, int]:
        """``{host: n}``: on the lost rank's own host when it answers over ssh, else on another host of the
        list (``progress`` hears which). See :mod:`workbench.pool.launch.ssh_places`."""
        ssh = [el for el in pool.engine_launchers() if isinstance(el, SSHLauncher)]
        pids: dict[str, set[int]] = {}
        for r in [*ranks, *lost]:
            pids.setdefault(r.host, set()).add(r.pid)
        where = ssh_places.locations(ssh, pids)
        command = [*ssh[0].ssh_cmd, *ssh[0].ssh_args] if ssh else ["ssh"]
        alive: dict[str, int] = {}  # engines per host now (a dead rank's among them until it is replaced)
        for r in ranks:
            alive[where.get(r.host, r.host)] = alive.get(where.get(r.host, r.host), 0) + 1
        placement, notes = ssh_places.place([r.host for r in lost], where, list(self.config.hosts),
                                            lambda location: ssh_places.answers(command, location), alive)
        for note in notes:
            progress(note)
        return placement

    def fence(self, pool: Pool, pids: list[int]) -> None:
        """End these engines on their hosts over ssh, in the background, once their hosts answer (see
        :mod:`workbench.pool.launch.fence`)."""
        if self._fencer is None:
            self._fencer = Fencer(pool.pool_id, lambda: [el for el in pool.engine_launchers()
                                                         if isinstance(el, SSHLauncher) and el.pid > 0])
        self._fencer.fence(pids)

    def fenced_ended(self, pids: set[int]) -> set[int]:
        """Of the engines declared lost, those whose host answered the ssh kill."""
        return self._fencer.ended() & pids if self._fencer is not None else set()

    def close(self) -> None:
        if self._fencer is not None:
            self._fencer.close()

    def explain(self, exc: BaseException, log: Path | None) -> PoolStartError | None:
        """ipyparallel's "Unable to get remote shell information. Are the ssh connection data correct?": the
        host ssh could not reach, and what to check."""
        host = ssh_host(exc)
        if not host:
            return None
        said = exc.__context__.returncode
        return start_error(f"ssh could not reach {host} (ssh exited with {said})",
                           f"Check that `ssh {host} true` works from here without a password prompt "
                           "(the host name, your key, the host's key in known_hosts).", log=log)


def ssh_command(pool_id: str | None, log: str) -> list[str]:
    """ssh, tagged as the pool's process, its own messages (stderr) going to the pool's log.

    ipyparallel runs ssh with the kernel's stderr: its messages would land in the Jupyter server's log.

    >>> ssh_command("1a2b", "/run/pool-1a2b.log")
    ['env', 'WORKBENCH_POOL=1a2b', 'sh', '-c', 'exec ssh "$@" 2>>/run/pool-1a2b.log', 'ssh']
    >>> ssh_command(None, "")
    ['ssh']
    """
    command = ["env", f"{MARKER}={pool_id}"] if pool_id else []
    if log:
        return [*command, "sh", "-c", f'exec ssh "$@" 2>>{shlex.quote(log)}', "ssh"]
    return [*command, "ssh"]


def ssh_host(exc: BaseException) -> str | None:
    """The host an ssh check failed on, from the ssh command ipyparallel ran (``exc``'s cause), if any.

    >>> try:
    ...     try:
    ...         raise subprocess.CalledProcessError(255, ["ssh", "-o", "X=1", "node7", "echo hi"])
    ...     except subprocess.CalledProcessError:
    ...         raise Exception("Unable to get remote shell information.")
    ... except Exception as e:
    ...     print(ssh_host(e))
    node7
    """
    cause = exc.__context__
    if not isinstance(cause, subprocess.CalledProcessError) or not isinstance(cause.cmd, list):
        return None
    if len(cause.cmd) < 3 or not any(Path(str(part)).name == "ssh" for part in cause.cmd[:-2]):
        return None  # not ssh (ours is wrapped: env WORKBENCH_POOL=.. sh -c 'exec ssh ..' ssh ARGS HOST CMD)
    return str(cause.cmd[-2])
