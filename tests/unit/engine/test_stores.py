"""A local pool's stores: files in a folder only the pool's user can open (issue 27)."""

from __future__ import annotations

import datetime
import os
import stat
import subprocess
import sys

import pytest

from workbench.engine import stores
from workbench.pool.records import state as pool_state

pytestmark = pytest.mark.timeout(240)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def private(tmp_path):
    folder = tmp_path / "stores"
    folder.mkdir(mode=0o700)
    return folder


def test_the_store_file_is_0600_whatever_the_umask(private):
    umask = os.umask(0o022)  # FileStore itself creates its file 0644 under the usual umask
    try:
        store = stores.pool_store(stores.file_spec(str(private), "group-1"), 5)
        store.set("k", "v")
    finally:
        os.umask(umask)
    assert mode(private / "group-1") == 0o600


def test_what_the_rendezvous_and_a_regroup_ask_of_a_file_store_works_across_processes(private):
    """set/get/add/wait/check/compare_set/delete_key/num_keys, with a PrefixStore per generation; the
    other side is a second process, as the ranks are."""
    spec = stores.file_spec(str(private), "standby-1")
    store = stores.pool_store(spec, 90)  # the other process imports torch first: seconds on a busy machine
    gen = __import__("torch").distributed.PrefixStore("workbench-elastic/2/", store)
    other = subprocess.Popen([sys.executable, "-c", f"""
import torch.distributed as dist
from workbench.engine import stores
s = dist.PrefixStore("workbench-elastic/2/", stores.pool_store({spec!r}, 90))
s.set("ready/1", "1")
s.wait(["ready/0"])
s.add("count", 5)
"""])
    try:
        gen.set("ready/0", "1")
        gen.wait(["ready/0", "ready/1"], datetime.timedelta(seconds=90))
        assert other.wait(90) == 0
    finally:
        other.kill()
        other.wait()
    assert gen.add("count", 1) == 6 and gen.check(["count"])
    assert gen.compare_set("leader", "", "0") == b"0" and gen.compare_set("leader", "", "1") == b"0"
    assert gen.delete_key("ready/1") and not gen.check(["ready/1"])
    assert store.num_keys() >= 3


def test_a_folder_others_can_open_is_refused(private):
    os.chmod(private, 0o755)
    with pytest.raises(ValueError, match="not private .*mode 755.*remove it and start the pool again"):
        stores.pool_store(stores.file_spec(str(private), "group-1"), 5)
    assert not (private / "group-1").exists()


def test_a_folder_of_another_user_is_refused(private):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the folder to another user")
    os.chown(private, 65534, 65534)
    with pytest.raises(ValueError, match="owner uid 65534"):
        stores.pool_store(stores.file_spec(str(private), "group-1"), 5)


def test_a_missing_folder_says_the_pool_was_stopped(tmp_path):
    with pytest.raises(ValueError, match="missing .*start the pool again"):
        stores.pool_store(stores.file_spec(str(tmp_path / "gone"), "group-1"), 5)
    assert not (tmp_path / "gone").exists()


def test_the_pool_store_folder_is_0700_and_goes_with_the_pool(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STATE_DIR", str(tmp_path / "workbench"))
    umask = os.umask(0o000)
    try:
        folder = pool_state.store_dir("1a2b3c4d")
    finally:
        os.umask(umask)
    assert mode(folder) == 0o700 and folder.parent == tmp_path / "workbench"
    (folder / "group-1").touch()
    pool_state.remove_files(pool_state.PoolState(dirs=[str(folder)]))
    assert not folder.exists()
