"""The typed pool state (issue 36): the state file round-trips through PoolState, and a file that is not a
pool state is a clear error that loses nothing (the file stays, the other pools still list, an attached
session writes nothing over it, the lease keeps the owner it knew)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import until
from workbench.config import PoolConfig
from workbench.pool.cluster import EnginePool
from workbench.pool.records import state as pool_state
from workbench.pool.records.state import PoolState, StateFileError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STATE_DIR", str(tmp_path / "workbench"))
    return tmp_path / "workbench"


def full_state(**changes) -> PoolState:
    """A state with every field set, as an owner and a session write it."""
    fields = dict(
        id="1a2b3c4d", name="pool-bold-tapir", owner=pool_state.process_record(os.getpid()), n=2,
        config=PoolConfig(launcher="ssh", hosts="n1,n2", interface="lo", address="127.0.0.1", name="team-a",
                          launcher_options={"ssh_args": ["-q"]}),
        jobs=[{"id": "12", "cancel": ["scancel", "12"]}], remote=[{"id": "n1:42", "cancel": ["ssh", "n1"]}],
        dirs=["/tmp/x"], cluster_file="/run/cluster.json", processes=[pool_state.process_record(os.getpid())],
        controller={"pid": 1, "create_time": 0.5},
        channel={"up": "tcp://a:1", "out": "tcp://a:2", "key": "ab"},
        files=["/run/f.json"], log="/run/pool.log", created=1234.5,
        ranks=[{"rank": 0, "local_rank": 0, "node_rank": 0, "host": "n1", "pid": 7, "device": "cpu",
                "engine_id": 3, "gpu_uuid": None, "slurm_job": "", "slurm_node": ""}],
        backend="gloo", backend_requested="auto", generation=3, endpoints={0: [["10.0.0.1", 4000]]},
        group_ok=False)
    return PoolState(**{**fields, **changes})


def test_every_field_round_trips_through_the_file(state_dir):
    state = full_state()
    assert PoolState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    path = pool_state.write_state(state.id, state)
    assert pool_state.read_state(path) == state
    raw = json.loads(path.read_text())  # the layout other versions read: launcher and address beside
    assert (raw["launcher"], raw["address"], raw["config"]["hosts"]) == ("ssh", "127.0.0.1", ["n1", "n2"])
    assert pool_state.list_states() == [state]


def test_keys_of_another_version_are_kept_and_a_state_from_before_the_config_still_reads(state_dir):
    data = {**full_state().to_dict(), "colour": "red"}
    again = PoolState.from_dict(data)
    assert again.to_dict()["colour"] == "red"
    old = {"id": "1a2b3c4d", "owner": {}, "launcher": "mpi", "address": "10.0.0.1", "n": 4,
           "backend_requested": "gloo"}
    config = pool_state.config_of(PoolState.from_dict(old))
    assert (config.launcher, config.address, config.backend, config.n) == ("mpi", "10.0.0.1", "gloo", 4)


@pytest.mark.parametrize("text, why", [
    ("{not json", "Expecting property name"),
    ("[1, 2]", "a pool state is a JSON object, not list"),
    ('{"id": "1a2b3c4d", "n": "two"}', "n must be int, not str"),
    ('{"id": "1a2b3c4d", "processes": {"pid": 1}}', "processes must be list, not dict"),
    ('{"id": "1a2b3c4d", "config": {"launcher": "moon"}}', "unknown launcher 'moon'"),
])
def test_a_file_that_is_not_a_pool_state_is_a_clear_error_and_is_left_as_it_is(state_dir, text, why):
    good = full_state(id="good0000")
    pool_state.write_state(good.id, good)
    path = pool_state.state_path("1a2b3c4d")
    path.write_text(text)
    with pytest.raises(StateFileError) as err:
        pool_state.read_state(path)
    assert str(path) in str(err.value) and why in str(err.value)
    assert pool_state.list_states() == [good]  # the others still list
    assert path.read_text() == text  # nothing written over it, nothing removed

    # an attached session writes nothing over it either: it hears what is wrong
    pool = EnginePool(n=2, pool_id="1a2b3c4d")
    pool.state_file, pool.attached = path, True
    with pytest.raises(StateFileError):
        pool.update_state(generation=4)
    assert path.read_text() == text


def test_a_field_nobody_reads_cannot_be_written():
    with pytest.raises(TypeError):
        PoolState(generaton=2)


def test_the_lease_keeps_watching_the_owner_it_knew_when_the_file_turns_bad(tmp_path):
    """The owner dies after its state file was made unreadable: the lease still ends the pool's processes
    from the last state it read, removes its folders and the file, and says why in its output."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    path = tmp_path / "pool-x.json"
    state = PoolState(owner=pool_state.process_record(owner.pid), dirs=[str(scratch)],
                      processes=[pool_state.process_record(engine.pid)])
    path.write_text(json.dumps(state.to_dict()))
    lease = subprocess.Popen([sys.executable, "-m", "workbench.pool.processes.lease", str(path)],
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "WORKBENCH_STATE_DIR": str(tmp_path / "wb")})
    try:
        # the lease has read the good state once it waits on the owner (a pidfd of the owner's among its fds)
        assert until(lambda: waits_on(lease.pid, owner.pid), 20), "the lease never waited on the owner"
        path.write_text('{"owner": "broken')
        owner.kill()
        owner.wait()
        assert lease.wait(20) == 0
        assert engine.wait(10) is not None
        assert not scratch.exists() and not path.exists()
        assert "is not a pool state file" in lease.stdout.read()
    finally:
        for proc in (owner, engine, lease):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def waits_on(pid: int, owner: int) -> bool:
    """Whether process ``pid`` holds a pidfd of ``owner`` (Linux: /proc/PID/fdinfo says ``Pid: N``)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return False
    for fd in fds:
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                if f"Pid:\t{owner}\n" in f.read():
                    return True
        except OSError:
            continue
    return False
