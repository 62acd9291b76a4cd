"""ProcessWatch: the controller's liveness, asked before every cell, through a pidfd (real processes)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from workbench.pool.state import ProcessWatch, process_record


@pytest.mark.timeout(30)
def test_a_watch_sees_its_process_exit_at_once_even_unreaped():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = ProcessWatch(process_record(child.pid))
        assert not watch.exited() and not watch.exited()
        child.kill()
        deadline = time.monotonic() + 10
        while not watch.exited():  # a zombie (not reaped yet) counts as exited
            assert time.monotonic() < deadline, "the watch never saw the kill"
            time.sleep(0.01)
        child.wait()  # reaped now: still exited
        assert watch.exited()
    finally:
        child.kill()
        child.wait()
        watch.close()


@pytest.mark.timeout(30)
def test_a_record_of_another_process_behind_the_same_pid_is_not_alive():
    """A recycled pid (the record's start time is not this process's) never passes for the recorded one."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = process_record(child.pid)
        forged = {**record, "create_time": record["create_time"] - 100}
        watch = ProcessWatch(forged)
        assert watch.exited()
        watch.close()
    finally:
        child.kill()
        child.wait()


@pytest.mark.timeout(30)
def test_a_record_of_a_process_gone_before_the_watch_began():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    record = process_record(child.pid)
    child.wait()
    watch = ProcessWatch(record)
    assert watch.exited()
    watch.close()


@pytest.mark.timeout(30)
def test_a_watch_works_in_a_process_with_more_than_1024_files_open():
    """A kernel with many sockets (64 ranks' ZMQ connections) has fds past select()'s FD_SETSIZE."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may open only {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if hard == resource.RLIM_INFINITY
                                                 else min(max(soft, 1200), hard), hard))
    fds = []
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        while not fds or fds[-1] < 1100:
            fds.append(os.open(os.devnull, os.O_RDONLY))
        watch = ProcessWatch(process_record(child.pid))
        assert not watch.exited()
        child.kill()
        child.wait()
        assert watch.exited()
        watch.close()
    finally:
        for fd in fds:
            os.close(fd)
        child.kill()
        child.wait()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
