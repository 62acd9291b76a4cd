"""The cell lock names who holds it, also when a shorter record is written over a longer one."""

from __future__ import annotations

import pytest

from workbench.pool.records import sharing

pytestmark = pytest.mark.timeout(30)


def test_the_holder_is_the_last_one_written_over_a_longer_record(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STATE_DIR", str(tmp_path))
    lock = sharing.CellLock("1a2b3c4d")
    assert lock.holder() is None
    sharing.call_this_process("a notebook with a name " * 40)  # a record longer than RECORD_BYTES
    try:
        with lock.held():
            assert lock.holder() == "a notebook with a name " * 40
        sharing.call_this_process("short.ipynb")
        with lock.held():
            assert lock.holder() == "short.ipynb"  # not the tail of the longer one
    finally:
        sharing.call_this_process(None)
