"""GET /workbench/pools/<id>/stacks: the sidebar's look at every rank while a notebook's cell runs.

A real Jupyter server with the extension, a pool started from the panel, a notebook (a real kernel of
that server) attached to it running an ``--async`` cell in which rank 1 holds back and rank 0 waits in
an all_reduce; the server, a third process, asks the ranks' agents.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.faults.test_stacks import Release
from tests.server.test_sharing import sharing

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

HELD = """%%distributed --async
import io, torch
t = torch.ones(1)
if rank == 1:
    io.open({go!r}).read()
dist.all_reduce(t)
"""


async def _stacks_until(api, pool_id: str, predicate, timeout: float = 60.0) -> dict:
    deadline, body = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        code, body, _ = await api("GET", "pools", pool_id, "stacks")
        assert code == 200, body
        if predicate(body):
            return body
        await asyncio.sleep(0.3)
    pytest.fail(f"the stacks never matched; last: {body and body['text']}")


async def test_the_stacks_route_sees_a_running_cell_of_an_attached_notebook(api, jp_fetch, jp_serverapp,
                                                                            tmp_path):
    go = Release(tmp_path / "go")  # rank 1 waits in open() of this FIFO
    async with sharing(api, jp_fetch, jp_serverapp) as (pool, notebook):
        code, body, _ = await api("GET", "pools", pool["id"], "stacks")
        assert code == 200 and body["missing"] == [], body
        assert body["groups"] == [{"ranks": [0, 1], "headline": "idle (no cell running)"}], body["text"]
        nb = await notebook("held.ipynb")
        assert (await nb.run(f"%dist attach {pool['name']}"))[0] == "ok"
        status, shown = await nb.run(HELD.format(go=str(go.path)))
        assert status == "ok", shown
        try:
            def held(b):  # the ranks run the cell's first lines a moment apart: until rank 1 waits at line 4
                return [g["ranks"] for g in b["groups"]] == [[0], [1]] and \
                    b["groups"][1]["headline"] == "<module> at cell line 4" and \
                    b["groups"][0]["headline"].endswith("<- cell line 5")
            body = await _stacks_until(api, pool["id"], held)
            first, second = body["groups"]
            assert first["ranks"] == [0] and first["headline"].startswith("all_reduce at "), body["text"]
            assert first["headline"].endswith("<- cell line 5"), body["text"]
            assert second == {"ranks": [1], "headline": "<module> at cell line 4"}, body["text"]
            assert body["text"].startswith("stacks of 2 ranks in 2 groups")
        finally:
            go.touch()
        await _stacks_until(api, pool["id"], lambda b: len(b["groups"]) == 1)
        code, body, _ = await api("GET", "pools", pool["id"], "stacks", params={"native": "yes"})
        assert code == 400 and body["message"] == "native must be 0 or 1.", body
        code, body, _ = await api("GET", "pools", "nosuchpool", "stacks")
        assert code == 404 and "no pool 'nosuchpool'" in body["message"], body
