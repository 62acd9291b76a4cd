"""A real 2-rank pool for the torchrun tests, started through the magics (one per test module)."""

from __future__ import annotations

import pytest

from tests.conftest import alive
from tests.torchrun.common import run
from workbench import session

# the scripts are torchrun's, not tests: importing them (doctest collection) would run them
collect_ignore = ["scripts"]


@pytest.fixture(scope="module")
def pool(ipshell):
    result, shown = run(ipshell, "%dist start -n 2 --timeout 60")
    assert result.success, shown
    s = session.current()
    pids = s.pids()
    yield s
    result, shown = run(ipshell, "%dist stop")
    assert result.success, shown
    assert alive(pids) == [], "processes of the pool survived %dist stop"
