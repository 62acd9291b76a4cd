"""The pool's state files, its log and faults.jsonl are readable by their owner only (issue 18, item 8)."""

from __future__ import annotations

import os
import stat

import pytest

from workbench import faults
from workbench.pool.records import state as pool_state

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STATE_DIR", str(tmp_path / "workbench"))
    umask = os.umask(0o022)  # the usual umask: a plain open() makes 0644
    yield tmp_path / "workbench"
    os.umask(umask)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_state_file_and_folder_are_private(state_dir):
    path = pool_state.write_state("1a2b3c4d", pool_state.PoolState(id="1a2b3c4d"))
    assert mode(path) == 0o600
    assert mode(state_dir) == 0o700


def test_fault_log_is_private_also_when_an_older_version_made_it_0644(state_dir):
    state_dir.mkdir()
    (state_dir / "faults.jsonl").write_text("")
    os.chmod(state_dir / "faults.jsonl", 0o644)
    faults.append(faults.FaultEvent(pool="1a2b3c4d", kind="died", rank=1, host="h", device="cpu",
                                    first_failure="killed", time=0.0))
    assert mode(faults.log_path()) == 0o600
    assert '"rank": 1' in faults.log_path().read_text()
