"""One real 2-engine gloo pool per fault module; at the end no process it ever had is left."""

from __future__ import annotations

import pytest

from tests.conftest import alive
from workbench import Session


@pytest.fixture(scope="module")
def pool():
    s = Session(n=2, timeout=30).start()
    started = set(s.pids())
    yield s
    started |= set(s.pids())  # the engines that restarts brought in
    s.stop()
    assert alive(sorted(started)) == []
