"""ProcessWatch and exit handles: the controller's liveness, asked before every cell, and the local ranks'
deaths (real processes)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import psutil
import pytest

from tests.conftest import until
from workbench.pool.records.state import (
    ProcessWatch,
    close_handle,
    exit_handle,
    handle_exited,
    process_record,
)


@pytest.fixture
def sleeper():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child
    child.kill()
    child.wait()


@pytest.mark.timeout(30)
def test_a_watch_sees_its_process_exit_at_once_even_unreaped(sleeper):
    watch = ProcessWatch(process_record(sleeper.pid))
    try:
        assert not watch.exited() and not watch.exited()
        sleeper.kill()
        assert until(watch.exited, timeout=10), "the watch never saw the kill"  # a zombie, not reaped yet
        sleeper.wait()  # reaped now: still exited
        assert watch.exited()
    finally:
        watch.close()


@pytest.mark.timeout(30)
def test_a_record_of_another_process_behind_the_same_pid_is_not_alive(sleeper):
    """A recycled pid (the record's start time is not this process's) never passes for the recorded one."""
    record = process_record(sleeper.pid)
    watch = ProcessWatch({**record, "create_time": record["create_time"] - 100})
    assert watch.exited()
    watch.close()


@pytest.mark.timeout(30)
def test_a_record_of_a_process_gone_before_the_watch_began():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    record = process_record(child.pid)
    child.wait()
    watch = ProcessWatch(record)
    assert watch.exited()
    watch.close()
    with pytest.raises(psutil.NoSuchProcess):
        exit_handle(child.pid)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["pidfd", "process"])
def test_an_exit_handle_sees_a_zombie_as_exited(sleeper, kind):
    """Both kinds of handle: the pidfd, and the polled Process used where pidfds do not exist."""
    handle = exit_handle(sleeper.pid) if kind == "pidfd" else psutil.Process(sleeper.pid)
    try:
        assert not handle_exited(handle)
        sleeper.kill()
        assert until(lambda: handle_exited(handle), timeout=10)
    finally:
        close_handle(handle)


@pytest.mark.timeout(30)
def test_a_watch_works_in_a_process_with_more_than_1024_files_open(sleeper):
    """A kernel with many sockets (64 ranks' ZMQ connections) has fds past select()'s FD_SETSIZE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may open only {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if hard == resource.RLIM_INFINITY
                                                 else min(max(soft, 1200), hard), hard))
    fds = []
    try:
        while not fds or fds[-1] < 1100:
            fds.append(os.open(os.devnull, os.O_RDONLY))
        watch = ProcessWatch(process_record(sleeper.pid))
        assert not watch.exited()
        sleeper.kill()
        sleeper.wait()
        assert watch.exited()
        watch.close()
    finally:
        for fd in fds:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
