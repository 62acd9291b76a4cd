"""The launcher objects (issue 36): one per launcher, chosen once from the config, each answering what
differs (pure: no pool is started; the signal test signals a process of its own)."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import fields

import pytest

from workbench.config import LAUNCHERS, PoolConfig
from workbench.pool.launch import KINDS, launcher_for, start_errors
from workbench.pool.launch.allocation import Job, Node
from workbench.pool.rankmap import RankInfo

pytestmark = pytest.mark.timeout(30)

CONFIGS = {"local": PoolConfig(launcher="local"), "ssh": PoolConfig(launcher="ssh", hosts="n1,n2"),
           "slurm": PoolConfig(launcher="slurm", nodes=2, new_job=True), "mpi": PoolConfig(launcher="mpi"),
           "kubernetes": PoolConfig(launcher="kubernetes", image="wb:1"),
           "allocation": PoolConfig(launcher="allocation")}
# the Slurm job an allocation pool runs in, as scontrol and the job's environment say it
JOB = Job("12", (Node("n1", tasks=2, cpus=2, gpus=0), Node("n2", tasks=2, cpus=2, gpus=0)), ends=None)


def made(name: str):
    """The launcher object for ``CONFIGS[name]`` (an allocation's inside :data:`JOB`)."""
    launcher = launcher_for(CONFIGS[name])
    if name == "allocation":
        launcher._job = JOB
    return launcher


def test_every_launcher_of_the_config_has_its_class_and_every_option_names_launchers_that_exist():
    assert sorted(KINDS) == sorted(LAUNCHERS) == sorted(CONFIGS)
    for name, config in CONFIGS.items():
        assert launcher_for(config).name == name
    for f in fields(PoolConfig):
        assert set(f.metadata["launchers"]) <= set(LAUNCHERS), f.name
        assert set(f.metadata["needed_by"]) <= set(f.metadata["launchers"] or LAUNCHERS), f.name


@pytest.mark.parametrize("name, here, fences, adds, forks, meets_in_files", [
    ("local", True, False, True, True, True),
    ("ssh", False, True, True, False, False),
    ("slurm", False, True, True, False, False),
    ("mpi", False, True, False, False, False),
    ("allocation", False, True, True, False, False),
    ("kubernetes", False, True, True, False, False),
])
def test_what_each_launcher_says(name, here, fences, adds, forks, meets_in_files, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STATE_DIR", str(tmp_path))
    launcher = made(name)
    assert (launcher.on_this_machine, launcher.fences, launcher.can_add_engines, launcher.forks) == (
        here, fences, adds, forks)
    assert bool(launcher.cannot_add) == (not adds)  # a sentence says why where engines cannot be added
    folder = launcher.store_folder("1a2b3c4d")
    assert (folder is not None) == meets_in_files
    if folder:
        assert folder.startswith(str(tmp_path))
    assert ("GLOO_SOCKET_IFNAME" in launcher.engine_env(2)) == here  # gloo over loopback, here only
    assert launcher.via == ("" if here else " as steps of Slurm job 12 (2 nodes, 4 tasks, no GPU)"
                            if name == "allocation" else f" through {name}")


def test_a_local_pool_with_its_own_engine_command_is_not_forked():
    assert not launcher_for(PoolConfig(launcher_options={"engine_cmd": ["ipengine"]})).forks


def test_local_engines_are_signalled_by_pid_the_others_through_their_agents():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rank = RankInfo(0, 0, 0, "here", proc.pid, "cpu", 0)
        told = []
        launcher_for(CONFIGS["local"]).signal([rank], signal.SIGTERM, lambda ranks, sig: told.append(sig))
        assert proc.wait(10) == -signal.SIGTERM and told == []
        for name in ("ssh", "slurm", "mpi", "allocation"):
            made(name).signal([rank], signal.SIGINT, lambda *sent: told.append(sent))
        assert told == [([rank], signal.SIGINT)] * 4
    finally:
        proc.kill()
        proc.wait()


def test_a_refused_start_is_explained_in_each_launchers_words():
    refused = subprocess.CalledProcessError(1, ["sbatch", "x"], output=b"invalid partition")
    text = {name: str(start_errors.explain(refused, launcher=made(name), address="10.0.0.1", log=None,
                                           launched=0, n=2)) for name in CONFIGS}
    assert text["slurm"].startswith("slurm could not start the engines: `sbatch x` exited with 1")
    assert "`sinfo` lists the partitions" in text["slurm"]
    assert all("Check the hosts and the launcher's options." in text[n] for n in ("local", "ssh", "mpi"))
    try:
        try:
            raise subprocess.CalledProcessError(255, ["ssh", "-o", "X=1", "node7", "echo hi"])
        except subprocess.CalledProcessError as err:  # ipyparallel's words for it
            raise RuntimeError("Unable to get remote shell information.") from err
    except RuntimeError as exc:
        unreachable = exc
    said = {name: str(start_errors.explain(unreachable, launcher=made(name), address="10.0.0.1",
                                           log=None, launched=0, n=2)) for name in CONFIGS}
    assert said["ssh"].startswith("ssh could not reach node7 (ssh exited with 255)")
    assert said["mpi"].startswith("the start failed: RuntimeError: Unable to get remote shell information")


def test_lost_ranks_come_back_where_each_launcher_can_start_them():
    ranks = [RankInfo(i, i, 0, "n1", 100 + i, "cpu", i, None, "7", "n1") for i in range(3)]
    assert launcher_for(CONFIGS["local"]).where_to_start(None, ranks[1:2], ranks, print) is None
    with pytest.raises(ValueError, match="cannot add a process to it; go on with the 2 ranks left"):
        launcher_for(CONFIGS["mpi"]).where_to_start(None, ranks[1:2], ranks, print)


def test_capacity_is_a_local_question():
    with pytest.raises(ValueError, match="more than this machine holds"):
        launcher_for(CONFIGS["local"]).check_capacity(100_000)
    for name in ("ssh", "slurm", "mpi"):
        launcher_for(CONFIGS[name]).check_capacity(100_000)  # their nodes hold them, not this machine
    # an allocation holds what its job holds: more is refused with the numbers
    made("allocation").check_capacity(4)
    with pytest.raises(ValueError, match=r"-n 5 is more than Slurm job 12 holds: 2 nodes x 2 tasks = 4 "):
        made("allocation").check_capacity(5)
