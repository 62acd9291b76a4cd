"""Our launcher options -> ipyparallel's launchers, and the options' validation (pure: no processes)."""

from __future__ import annotations

import json
import sys

import pytest
from IPython.core.error import UsageError

from workbench.config import PoolConfig
from workbench.magics.args import parse_dist
from workbench.pool.launch import launcher_for
from workbench.pool.machine import netif
from workbench.pool.rankmap import EngineInfo, build_rank_map, remap_engines


def kwargs(config, n):
    return launcher_for(config).engine_set_kwargs(n, work_dir="/scratch", env={"A": "1"}, engine_args=["--x"])


def test_slurm_one_engine_per_gpu_on_every_node():
    config = PoolConfig(launcher="slurm", nodes=2, gpus_per_node=4, partition="gpu", time="1:00:00",
                        account="proj", interface="lo")
    assert launcher_for(config).default_engines() == 8
    kw = kwargs(config, 8)
    script = kw["batch_template"]
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --partition=gpu", "#SBATCH --time=1:00:00", "#SBATCH --account=proj",
                 "#SBATCH --export=ALL", "srun --kill-on-bad-exit=0 {program_and_args}"):
        assert line in script.splitlines()
    assert kw["batch_file_name"] == "/scratch/slurm_engine.sbatch", "never into the notebook's folder"
    assert kw["environment"] == {"A": "1"} and kw["engine_args"] == ["--x"]
    # every engine sees its node's GPUs; the rank map pins local rank i to cuda:i, ranks contiguous per node
    engines = [EngineInfo(i, f"node{i % 2}", 100 + i, gpus=4) for i in range(8)]
    ranks = build_rank_map(engines)
    node0 = [(r.host, r.local_rank, r.device) for r in ranks[:4]]
    assert node0 == [("node0", i, f"cuda:{i}") for i in range(4)]
    assert [r.node_rank for r in ranks] == [0] * 4 + [1] * 4
    # an engine-set restart: new engine ids, same ranks on the same host and device
    again = remap_engines(ranks, [EngineInfo(20 + i, f"node{i % 2}", 200 + i, gpus=4) for i in range(8)])
    assert [(r.rank, r.host, r.device) for r in again] == [(r.rank, r.host, r.device) for r in ranks]
    assert {r.engine_id for r in again}.isdisjoint({r.engine_id for r in ranks})


def test_slurm_cpu_tasks_and_user_options():
    kw = kwargs(PoolConfig(launcher="slurm", launcher_options={"options": "--qos=high"}), 3)
    assert "#SBATCH --ntasks=3" in kw["batch_template"] and kw["options"] == "--qos=high"


def test_mpi_and_ssh():
    kw = kwargs(PoolConfig(launcher="mpi", hosts="a,b"), 4)
    assert kw["mpi_args"] == ["--host", "a:2,b:2"]
    assert kw["engine_cmd"] == [sys.executable, "-m", "workbench.pool.processes.engine_main"]
    assert kw["environment"]["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    kw = kwargs(PoolConfig(launcher="ssh", hosts=("n1", "n2"), gpus_per_node=2), 4)
    assert kw["engines"] == {"n1": 2, "n2": 2} and kw["remote_python"] == sys.executable


@pytest.mark.parametrize("options, message", [
    ({"launcher": "ssh"}, "needs the hosts"),
    ({"launcher": "local", "nodes": 2}, "nodes apply to --launcher slurm or allocation"),
    ({"launcher": "local", "hosts": "a"}, "hosts apply to"),
    ({"launcher": "slurm", "time": "soon"}, "not a Slurm time limit"),
    ({"launcher": "slurm", "nodes": 2, "gpus_per_node": 2, "n": 3}, "does not match"),
    ({"launcher": "local", "gpus_per_node": 2}, "for cluster launchers"),
    ({"idle_release": 0}, "idle_release"),
])
def test_config_rejects(options, message):
    with pytest.raises(ValueError, match=message):
        PoolConfig(**options)


def test_loopback_refused_where_engines_are_elsewhere():
    with pytest.raises(ValueError, match="cannot reach this kernel on loopback.*here: .*lo 127.0.0.1"):
        launcher_for(PoolConfig(launcher="ssh", hosts="n1,n2")).check_address("127.0.0.1")
    launcher_for(PoolConfig(launcher="ssh", hosts="localhost")).check_address("127.0.0.1")
    launcher_for(PoolConfig(launcher="slurm", interface="lo")).check_address("127.0.0.1")  # one-node box
    assert netif.resolve(PoolConfig(interface="lo")).address == "127.0.0.1"
    with pytest.raises(ValueError, match="no network interface 'nope0'"):
        netif.resolve(PoolConfig(interface="nope0"))


def test_start_options_parse():
    a = parse_dist("start --launcher ssh --hosts n1,n2 --interface wb0 --idle-release 600 -n 2")
    assert (a.launcher, a.hosts, a.interface, a.idle_release, a.n) == ("ssh", "n1,n2", "wb0", 600.0, 2)
    with pytest.raises(UsageError, match="not allowed with argument"):
        parse_dist("start --interface lo --address 127.0.0.1")
    with pytest.raises(UsageError, match="invalid choice"):
        parse_dist("start --launcher k8s")
    assert parse_dist("check --size-mb 16").size_mb == 16.0


def test_lease_cancels_jobs_and_remote_engines_of_a_dead_owner(tmp_path):
    """A kernel that is SIGKILLed runs no atexit: its lease (a real ``python -m
    workbench.pool.processes.lease``, recorded among the pool's processes as the pool does) stops the engines,
    cancels the Slurm job, ends ssh engines and removes the files."""
    import subprocess
    import time

    from workbench.pool.records import state as pool_state

    owner = subprocess.Popen(["sleep", "60"])
    engine = subprocess.Popen(["sleep", "60"])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    path = tmp_path / "pool-x.json"
    state = {"owner": pool_state.process_record(owner.pid), "dirs": [str(scratch)],
             "processes": [pool_state.process_record(engine.pid)],
             "jobs": [{"id": "7", "cancel": ["touch", str(tmp_path / "scancel-7")]}],
             "remote": [{"id": "n1:42", "cancel": ["touch", str(tmp_path / "kill-n1-42")]}]}
    path.write_text(json.dumps(state))
    lease = subprocess.Popen([sys.executable, "-m", "workbench.pool.processes.lease", str(path)])
    try:
        state["processes"].append(pool_state.process_record(lease.pid))
        path.write_text(json.dumps(state))
        time.sleep(0.2)
        owner.kill()
        owner.wait()
        assert lease.wait(20) == 0
        assert engine.wait(10) is not None
        assert (tmp_path / "scancel-7").exists() and (tmp_path / "kill-n1-42").exists()
        assert not scratch.exists() and not path.exists()
    finally:
        for proc in (owner, engine, lease):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
