"""A stop asks the engines to exit, and they do, as a normal interpreter exit (their atexit handlers run):
only one that is still there after the grace is killed. The request had been dropped unsent (the client
closed at once), so every engine of every stop waited the whole grace and was SIGKILLed."""

from __future__ import annotations

import pytest

from tests.conftest import alive
from workbench import Session

pytestmark = pytest.mark.timeout(180)


def test_a_stop_lets_every_engine_exit_as_asked(tmp_path):
    s = Session(n=2, timeout=60).start()
    try:
        pids = s.pids()
        s.run(f"import atexit\natexit.register(lambda: open(r'{tmp_path}/bye-%d' % rank, 'w').close())")
    finally:
        s.stop()
    assert alive(pids) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bye-0", "bye-1"]  # their own exit, not SIGKILL
