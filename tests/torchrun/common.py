"""Running a script under real torchrun and in the pool, and reading the numbers it printed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import run_cell

SCRIPTS = Path(__file__).parent / "scripts"
TORCHRUN = Path(sys.executable).with_name("torchrun")
LABEL = re.compile(r"^\[ranks? [0-9,\- ]+\] ?")  # how the notebook labels a rank's line
NUMBER = re.compile(r"-?\d+\.\d{6}")  # the scripts print their figures with 6 decimals
TEARDOWN_ABORT = "terminate called without an active exception"  # std::terminate in a C++ thread's end


run = run_cell  # (result, everything the cell showed as text)


def torchrun(script: str, args: list[str], cwd: Path, timeout: float = 240) -> str:
    """``torchrun --nproc-per-node 2 script args`` in ``cwd``: what its ranks printed (stdout).

    Each rank's stdout goes to its own file (``--redirects 1``): on one pipe two ranks' lines interleave.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKBENCH_POOL", "OMP_NUM_THREADS"))}
    logs = cwd / "torchrun-logs"
    command = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "--log-dir", str(logs),
               "--redirects", "1", str(SCRIPTS / script), *args]
    before = set(cwd.iterdir())
    for _ in range(3):
        for made in set(cwd.iterdir()) - before:  # a retry starts afresh: no snapshot to resume
            shutil.rmtree(made) if made.is_dir() else made.unlink()
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        # torch 2.13's gloo sometimes aborts a rank in its teardown, after the script's last line (2 of 20
        # plain torchrun runs of nanogpt_style.py here): the reference is run again, never our side
        if done.returncode == 0 or TEARDOWN_ABORT not in done.stderr:
            break
    assert done.returncode == 0, done.stderr[-3000:]
    return "".join(p.read_text() for p in sorted(logs.glob("**/stdout.log")))


def figures(text: str) -> list[str]:
    """The lines that carry numbers, without the notebook's rank labels, sorted (ranks interleave)."""
    lines = (LABEL.sub("", line).strip() for line in text.splitlines())
    return sorted(line for line in lines if NUMBER.search(line))


def on_both_ranks(shown: str, text: str) -> bool:
    """Whether both ranks printed the line ``text`` (merged as ``[ranks 0-1]`` or one line each)."""
    lines = set(shown.splitlines())
    return f"[ranks 0-1] {text}" in lines or {f"[rank 0] {text}", f"[rank 1] {text}"} <= lines
