"""The zygote (issue 14): a real one, real forks of a controller and an engine, a process-tree diff.

Each test starts a real ``python -m workbench.pool.processes.zygote`` under a cgroup pids limit (a regression
that forks without end cannot take the machine down; the group also holds orphans) and ends with
nothing of it left: the zygote ends its whole pool when its stdin closes, as when its owner dies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import ipyparallel as ipp
import psutil
import pytest

from tests.conftest import PidsLimit, alive, until
from workbench.pool.processes import reap
from workbench.pool.processes.zygote import NAMES, ZYGOTE_NAME, Zygote, ZygoteError

pytestmark = pytest.mark.timeout(240)

MAX_TASKS = 200  # the zygote, a controller and an engine with their threads, with room to spare
# Imported by the engine's preload only; here it records each try and fails.
FAILING_MODULE = """
import os
with open(os.environ["IMPORT_TRIES"], "a") as f:
    f.write("try\\n")
raise ImportError("pydoc is broken on purpose")
"""


def describe(pid: int) -> str:
    try:
        return f"{pid}: {psutil.Process(pid).cmdline()[:4]}"
    except psutil.Error:
        return f"{pid} (gone)"


def tree(group: PidsLimit) -> set[int]:
    return set(alive(group.pids()))


def threads_of_numpy_alone() -> int:
    count = "import os, numpy; print(len(os.listdir('/proc/self/task')))"
    return int(subprocess.run([sys.executable, "-c", count], capture_output=True, text=True, timeout=60,
                              check=True).stdout)


def idle_for_a_second(pid: int) -> bool:
    """Whether ``pid`` spent under 0.2 s of CPU in the next second."""
    before = sum(psutil.Process(pid).cpu_times()[:2])
    time.sleep(1.0)
    return sum(psutil.Process(pid).cpu_times()[:2]) - before < 0.2


def wait_for_json(path: Path, timeout: float) -> bool:
    def whole():
        try:
            json.loads(path.read_text())
            return True
        except (OSError, ValueError):
            return False

    return until(whole, timeout, every=0.05)


@pytest.fixture
def group():
    with PidsLimit(MAX_TASKS) as limit:
        yield limit


def test_forks_a_controller_and_an_engine_and_ends_them_with_itself(tmp_path, group):
    pool_id = uuid.uuid4().hex[:8]
    before = tree(group)
    zygote = Zygote(pool_id=pool_id, log=str(tmp_path / "zygote.log"), cwd=str(tmp_path))
    try:
        zygote.wait_ready(timeout=180)
        me = psutil.Process(zygote.pid)
        assert me.name() == ZYGOTE_NAME
        # fork safety: everything imported, yet no thread (bar numpy's OpenBLAS pool, which stops itself
        # around a fork), no socket and no CUDA in the process that forks
        assert me.num_threads() == threads_of_numpy_alone()
        fds = [os.readlink(f) for f in Path(f"/proc/{zygote.pid}/fd").iterdir()]
        assert not [fd for fd in fds if fd.startswith("socket:")], fds
        assert "libcuda" not in Path(f"/proc/{zygote.pid}/maps").read_text()

        profile = tmp_path / "profile"
        common = [f"--profile-dir={profile}", "--cluster-id=ztest"]
        env = dict(os.environ, WB_CHILD_ONLY="yes")
        controller = zygote.fork("controller", [*common, "--ip=127.0.0.1"], env=env, cwd=str(tmp_path),
                                 log=str(tmp_path / "controller.log"))
        engine_file = profile / "security" / "ipcontroller-ztest-engine.json"
        engine = zygote.fork("engine", common, env=env, cwd=str(tmp_path), log=str(tmp_path / "engine.log"),
                             connection_file=str(engine_file))  # forked before the controller wrote it
        assert wait_for_json(engine_file, 60), "".join(p.read_text() for p in tmp_path.glob("*.log"))
        for pid, role in ((controller, "controller"), (engine, "engine")):
            child = psutil.Process(pid)
            assert child.ppid() == zygote.pid
            assert child.name() == NAMES[role]
            assert os.getsid(pid) == pid  # its own session: a Ctrl-C to the zygote's group misses it
            assert child.cwd() == str(tmp_path)
        # the engine registers with the forked controller: a real engine, not merely a live process
        client = ipp.Client(str(profile / "security" / "ipcontroller-ztest-client.json"))
        try:
            client.wait_for_engines(1, timeout=60)
            assert client[0].apply_sync(os.getpid) == engine
            assert client[0].apply_sync(os.getenv, "WB_CHILD_ONLY") == "yes"
            # formatting a collective's traceback was done once in the zygote, not at the first fault in
            # each forked engine at once (pygments' Python lexer compiled, the files split)
            assert client[0].apply_sync(_lexer_ready)
        finally:
            client.close()
        assert {controller, engine} <= {p.pid for p in reap.tagged(pool_id)}
        # an engine that dies: its parent, the zygote, reaps it and the pool's log says how it ended
        os.kill(engine, signal.SIGKILL)
        log = tmp_path / "zygote.log"
        ended = f"workbench zygote: engine {engine} was killed by SIGKILL"
        assert until(lambda: ended in log.read_text(), 20), log.read_text()[-2000:]
    finally:
        zygote.close()  # stdin closed: the zygote ends every process of its pool, then exits
    assert until(lambda: not (tree(group) - before), 20), [describe(pid) for pid in tree(group) - before]
    assert zygote.proc.wait(timeout=5) == 0


def test_a_preload_that_fails_is_not_retried_while_idle_and_a_request_says_why(tmp_path, group):
    tries = tmp_path / "tries"
    (tmp_path / "pydoc.py").write_text(FAILING_MODULE)  # the zygote's folder is first on its sys.path
    before = tree(group)
    os.environ["IMPORT_TRIES"] = str(tries)
    try:
        zygote = Zygote(pool_id=uuid.uuid4().hex[:8], log=str(tmp_path / "zygote.log"), cwd=str(tmp_path))
    finally:
        del os.environ["IMPORT_TRIES"]
    try:
        log = tmp_path / "zygote.log"
        assert until(lambda: "pydoc is broken on purpose" in log.read_text(), 180)  # the failed preload
        tried = tries.read_text().count("try")
        # it goes idle (after parsing the sources, past SOURCES_IDLE_S): a loop that kept retrying never does
        assert until(lambda: idle_for_a_second(zygote.pid), 60, every=0)
        assert tries.read_text().count("try") == tried
        with pytest.raises(ZygoteError, match="could not start the engine: ImportError: pydoc is broken"):
            zygote.fork("engine", [], env=dict(os.environ), cwd=str(tmp_path), log=str(tmp_path / "e.log"))
        assert tries.read_text().count("try") > tried  # a request tries again
        assert zygote.alive()
    finally:
        zygote.close()
    assert until(lambda: not (tree(group) - before), 20)
    assert zygote.proc.wait(timeout=5) == 0


def _lexer_ready() -> bool:
    """In the engine, before any error: whether pygments' Python lexer has its rules compiled."""
    from pygments.lexers.python import PythonLexer

    return "_tokens" in PythonLexer.__dict__
