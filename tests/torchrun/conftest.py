"""A real 2-rank pool for the torchrun tests, started through the magics (one per test module)."""

from __future__ import annotations

import pytest

from tests.conftest import pool_through_magics

# the scripts are torchrun's, not tests: importing them (doctest collection) would run them
collect_ignore = ["scripts"]


@pytest.fixture(scope="module")
def pool(ipshell):
    yield from pool_through_magics(ipshell)
