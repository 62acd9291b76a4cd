"""One short message for each way a start fails: what failed, the launcher's last lines, the log, what to do.

Whatever ended a start (a launcher binary missing, sbatch/mpiexec/ssh refusing, engines crashing,
a timeout, Ctrl-C) becomes one :class:`~workbench.errors.PoolStartError`, never a traceback through
ipyparallel's internals.
"""

from __future__ import annotations

import errno
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import zmq

from workbench.errors import PoolStartError
from workbench.pool.launch.spawn import LaunchCancelled

if TYPE_CHECKING:
    from workbench.pool.launch.base import Launcher

TAIL_LINES = 8
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# ipyparallel's own INFO lines ("2026-11-30 20:54:50.299 [IPController] Hub listening ..."): chatter that
# would push the launcher's and the engines' own lines out of a short tail; its warnings and errors
# ("[IPController] ERROR | ...") stay.
IPP_INFO = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \[[^\]]+\] (?![A-Z]+ \|)")
STOPPED = "Every process started for the pool has been stopped."


class StartInterrupted(PoolStartError, KeyboardInterrupt):
    """Ctrl-C during a start: still a ``KeyboardInterrupt`` to code that catches one."""


def tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` of ``text`` that say something, colours removed, indented.

    >>> chatter = "2026-11-30 20:54:50.299 [IPController] Hub listening"
    >>> print(tail(f"a\\n\\nb\\n{chatter}\\n\\x1b[31mc\\x1b[0m\\n", lines=2))
      | b
      | c
    """
    said = [ln.rstrip() for ln in ANSI.sub("", text).splitlines() if ln.strip() and not IPP_INFO.match(ln)]
    kept = said[-lines:]
    return "\n".join(f"  | {ln}" for ln in kept)


def log_tail(log: Path | None) -> str:
    try:
        return tail(Path(log).read_text(errors="replace")) if log else ""
    except OSError:
        return ""


def start_error(what: str, todo: str, *, log: Path | None, output: str | None = None) -> PoolStartError:
    """The one error of a failed start; ``output`` defaults to the end of the pool's log.

    >>> print(start_error("mpiexec exited with 3", "Check the hosts.", log=None, output="no slots"))
    mpiexec exited with 3:
      | no slots
    Check the hosts. Every process started for the pool has been stopped.
    """
    shown = tail(output) if output is not None else log_tail(log)
    lines = [what + (":" if shown else ".")] + ([shown] if shown else [])
    if log:
        lines.append(f"Log: {log}")
    lines.append(f"{todo} {STOPPED}")
    said = tuple(ln.removeprefix("  | ") for ln in shown.splitlines())  # the parts, for the panel's card
    return PoolStartError("\n".join(lines), what=lines[0], tail=said, log=str(log) if log else None,
                          todo=lines[-1])


def explain(exc: BaseException, *, launcher: Launcher, address: str, log: Path | None, launched: int,
            n: int) -> BaseException:
    """The error to raise for ``exc``, which ended a start after ``launched`` of ``n`` engines; ``launcher``
    (:class:`~workbench.pool.launch.base.Launcher`) has its own words for what only it does.

    >>> from workbench.config import PoolConfig
    >>> from workbench.pool.launch import launcher_for
    >>> slurm = launcher_for(PoolConfig(launcher="slurm"))
    >>> print(explain(FileNotFoundError(2, "No such file", "sbatch"), launcher=slurm, address="10.0.0.1",
    ...               log=None, launched=0, n=2))  # doctest: +ELLIPSIS
    --launcher slurm runs `sbatch`, which is not on PATH here.
    Run where `sbatch` is (a cluster's login node, ...
    """
    if isinstance(exc, (KeyboardInterrupt, LaunchCancelled)):
        return StartInterrupted(f"the start was interrupted (Ctrl-C) after {launched} of {n} engines were "
                                f"launched. {STOPPED}")
    if isinstance(exc, PoolStartError):
        return exc if STOPPED in str(exc) else start_error(
            str(exc).rstrip("."), "The log has the engines' whole output.", log=log, output="")
    if isinstance(exc, FileNotFoundError) and exc.filename:
        name = Path(exc.filename).name
        return start_error(
            f"--launcher {launcher.name} runs `{name}`, which is not on PATH here",
            f"Run where `{name}` is (a cluster's login node, or after loading its module), or start a "
            "local pool: %dist start -n 2.", log=log, output="")
    if isinstance(exc, subprocess.CalledProcessError):
        out = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else exc.output or ""
        command = " ".join(map(str, exc.cmd)) if isinstance(exc.cmd, list) else str(exc.cmd)
        return start_error(f"{launcher.name} could not start the engines: `{command}` exited with "
                           f"{exc.returncode}", launcher.refusal_advice, log=log, output=out)
    if isinstance(exc, RuntimeError) and str(exc).startswith("Controller stopped"):
        return start_error(f"the controller exited while starting to listen on {address}",
                           "Check --interface or --address: it must name an address of this machine.",
                           log=log)
    if isinstance(exc, zmq.ZMQError) and exc.errno == errno.EADDRNOTAVAIL:  # the relay binds first
        return start_error(f"the controller and the pool's side channel cannot listen on {address}: it is "
                           "not an address of this machine",
                           "Check --interface or --address: it must name an address of this machine.",
                           log=log, output="")
    if isinstance(exc, ValueError):
        return exc  # a usage mistake found late: its own sentence says what to do
    own = launcher.explain(exc, log)  # e.g. the host ssh could not reach
    if own is not None:
        return own
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return start_error(f"the start failed: {type(exc).__name__}: {first}".rstrip(": "), launcher.failed_todo,
                       log=log)
