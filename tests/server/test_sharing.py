"""One pool, several notebooks (issue 13): real kernels of a real Jupyter server with the extension.

A pool started from the JupyterLab panel (POST /workbench/pools), driven from notebooks whose kernels
the same server runs: attached notebooks get everything a starting notebook gets; cells of two
notebooks never interleave on the ranks; a stop elsewhere is one line; `%dist stop` detaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time

import pytest

from tests.conftest import alive, output_hook
from tests.server.conftest import wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Notebook:
    """A notebook of the server: its kernel (started through /api/sessions) and a client to run cells."""

    def __init__(self, jp_fetch, serverapp, path: str):
        self.jp_fetch, self.serverapp, self.path = jp_fetch, serverapp, path

    async def open(self) -> Notebook:
        r = await self.jp_fetch("api", "sessions", method="POST", body=json.dumps(
            {"path": self.path, "type": "notebook", "kernel": {"name": "python3"}}))
        self.session = json.loads(r.body)
        km = self.serverapp.kernel_manager.get_kernel(self.session["kernel"]["id"])
        self.client = km.client()
        self.client.start_channels()
        await self.client.wait_for_ready(timeout=60)
        await self.run("%load_ext workbench\nimport workbench\nimport workbench as wb")
        return self

    async def run(self, code: str, timeout: float = 120) -> tuple[str, str]:
        """Run a cell; ``(status, everything it showed)``, colours removed."""
        out: list[str] = []
        reply = await self.client.execute_interactive(code, timeout=timeout, output_hook=output_hook(out))
        return reply["content"]["status"], ANSI.sub("", "".join(out))

    async def close(self) -> None:
        self.client.stop_channels()
        await self.jp_fetch("api", "sessions", self.session["id"], method="DELETE")


@contextlib.asynccontextmanager
async def sharing(api, jp_fetch, jp_serverapp):
    """A 2-rank pool started from the panel, and a way to open notebooks of the same server. The pool is
    stopped and nothing of it is left afterwards; the notebooks' kernels are shut down."""
    code, body, _ = await api("POST", "pools", body={"n": 2, "timeout": 90})
    assert code == 202, body
    pool = await wait_for(api, body["pool"]["request_id"], "running")
    pids = [r["pid"] for r in pool["ranks"]]
    opened = []

    async def notebook(path: str) -> Notebook:
        nb = await Notebook(jp_fetch, jp_serverapp, path).open()
        opened.append(nb)
        return nb

    try:
        yield pool, notebook
    finally:
        code, now, _ = await api("GET", "pools", pool["id"])
        if code == 200:  # engines started since (a restart from an attached notebook) end with the pool too
            pids += [r["pid"] for r in now["pool"]["ranks"] if r.get("pid")]
        for nb in opened:
            await nb.close()
        await api("DELETE", "pools", pool["id"])
        deadline = time.monotonic() + 15
        while alive(pids) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert alive(pids) == []


TRAIN = """%%distributed
import torch
import workbench as wb
from torch.utils.data import TensorDataset
torch.manual_seed(0)
model = wb.shard(wb.MLP(wb.MLPConfig(d_in=8, d_hidden=16, d_out=2, n_layers=1)), "ddp")
data = wb.make_loader(TensorDataset(*wb.regression_data(256, d_in=8, d_out=2)), batch_size=16)
trainer = wb.Trainer(model, data, lr=1e-2)
trainer.run(steps=30)
"""


async def test_an_attached_notebook_gets_the_dashboard_deaths_hangs_and_restart(api, jp_fetch, jp_serverapp):
    async with sharing(api, jp_fetch, jp_serverapp) as (panel_pool, notebooks):
        nb = await notebooks("attached.ipynb")
        status, shown = await nb.run(f"%dist attach {panel_pool['name']}")
        assert status == "ok" and f"attached to pool {panel_pool['name']}" in shown, shown
        assert "attached.ipynb" in shown  # the notebooks driving the pool are listed, the panel by name
        assert "the JupyterLab panel (started it)" in shown, shown
        status, shown = await nb.run(TRAIN)
        assert status == "ok", shown
        status, shown = await nb.run(
            "s = workbench.current()\nrun = s.metrics.latest_run()\n"
            "s.metrics.wait_for(lambda c: run.done, 10), run.id, s.metrics.count('step', run.id)")
        assert status == "ok" and "(True, 1, 60)" in shown, shown  # 30 steps x 2 ranks reached us
        code, body, _ = await api("GET", "pools", panel_pool["id"])
        notebooks = [n["notebook"] for n in body["pool"]["notebooks"]]
        assert notebooks == ["the JupyterLab panel", "attached.ipynb"]

        # a hang is named at the timeout, from the beacons this notebook now receives
        status, shown = await nb.run("%%distributed --timeout 2\nimport time\nif rank == 1:\n"
                                     "    time.sleep(30)\ndist.all_reduce(torch.ones(1))")
        assert status == "error" and "Stalled: rank 1" in shown and "cell line 4" in shown, shown

        # a killed rank is named at once, from the death this notebook's watcher sees
        victim = body["pool"]["ranks"][1]["pid"]
        cell = asyncio.ensure_future(nb.run("%%distributed\nfor i in range(400):\n"
                                            "    dist.all_reduce(torch.ones(1))\n    time.sleep(0.05)"))
        await asyncio.sleep(1.5)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        status, shown = await cell
        named_in = time.monotonic() - killed_at
        # the dead rank named first, in one line (after the per-rank view's one-line text)
        first = [line for line in shown.strip().splitlines() if not line.startswith("per rank")][0]
        assert status == "error" and "rank 1 (" in first and ("died" in first or "dead" in first), shown
        assert named_in < 10, f"{named_in:.1f} s"  # a hang guard; the figure is in bench/
        status, shown = await nb.run("%dist restart")
        assert status == "ok" and "restarted rank 1" in shown, shown
        status, shown = await nb.run(
            "%%distributed\nimport torch\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()")
        assert status == "ok" and "2.0" in shown, shown


async def test_a_pool_stopped_from_the_panel_is_one_line_in_the_attached_notebook(api, jp_fetch,
                                                                                   jp_serverapp):
    async with sharing(api, jp_fetch, jp_serverapp) as (panel_pool, notebooks):
        nb = await notebooks("left.ipynb")
        assert (await nb.run(f"%dist attach {panel_pool['name']}"))[0] == "ok"
        code, _, _ = await api("DELETE", "pools", panel_pool["id"])
        assert code == 200
        status, shown = await nb.run("%%distributed\nx = 1")
        lines = [ln for ln in shown.strip().splitlines() if ln.strip()]
        assert status == "error" and len(lines) == 1, shown
        assert re.search(rf"pool {panel_pool['name']} was stopped \(by the JupyterLab panel at \d\d:\d\d\); "
                         r"`%dist start` starts a new one", lines[0]), shown
        status, shown = await nb.run("%dist status")
        assert "this notebook drives no pool" in shown, shown


async def test_dist_stop_in_an_attached_notebook_detaches_and_stop_all_stops(api, jp_fetch, jp_serverapp):
    async with sharing(api, jp_fetch, jp_serverapp) as (panel_pool, notebooks):
        nb = await notebooks("guest.ipynb")
        assert (await nb.run(f"%dist attach {panel_pool['id']}"))[0] == "ok"  # by id works too
        status, shown = await nb.run("%dist stop")
        assert status == "ok" and f"detached from pool {panel_pool['name']}; it keeps running" in shown, shown
        assert "`%dist stop --all` stops it for everyone" in shown
        code, body, _ = await api("GET", "pools", panel_pool["id"])
        assert body["pool"]["state"] == "running" and [n["notebook"] for n in body["pool"]["notebooks"]] == [
            "the JupyterLab panel"]
        status, shown = await nb.run("%%distributed\nx = 1")  # after detaching: the running pools are offered
        assert status == "error" and f"`%dist attach {panel_pool['name']}` (2 ranks)" in shown, shown
        assert (await nb.run(f"%dist attach {panel_pool['name']}"))[0] == "ok"
        status, shown = await nb.run("%dist stop --all")
        assert status == "ok" and f"stopped pool {panel_pool['name']}" in shown, shown
        code, body, _ = await api("GET", "pools")
        assert [p["id"] for p in body["pools"]] == []


ORDER = """%%distributed
import torch
log = globals().get("log", [])
for i in range(5):
    t = torch.ones(1)
    dist.all_reduce(t)  # a collective: cells in a different order on two ranks would deadlock
    log.append(("{who}", i))
    time.sleep(0.05)
"""


async def test_two_notebooks_cells_never_interleave_on_the_ranks(api, jp_fetch, jp_serverapp):
    async with sharing(api, jp_fetch, jp_serverapp) as (panel_pool, notebooks):
        a, b = await notebooks("a.ipynb"), await notebooks("b.ipynb")
        for nb in (a, b):
            assert (await nb.run(f"%dist attach {panel_pool['name']}"))[0] == "ok"
        assert (await a.run("%%distributed\nimport time\nlog = []"))[0] == "ok"
        async def three_cells(nb, who):  # one notebook runs its cells one after the other
            return [await nb.run(ORDER.format(who=who)) for _ in range(3)]

        results = [r for rs in await asyncio.gather(three_cells(a, "a"), three_cells(b, "b")) for r in rs]
        assert all(status == "ok" for status, _ in results), results
        assert any("pool busy: running a cell from" in shown and "waiting" in shown for _, shown in results)
        status, shown = await a.run("import json\n%dist pull log\nprint(json.dumps(log))")
        assert status == "ok", shown
        per_rank = json.loads(shown.strip().splitlines()[-1])
        assert per_rank[0] == per_rank[1] and len(per_rank[0]) == 30, per_rank  # the same order on both ranks
        seq = per_rank[0]
        runs = [seq[i:i + 5] for i in range(0, 30, 5)]  # each cell's 5 entries together: no interleaving
        assert all(len({who for who, _ in run}) == 1 and [i for _, i in run] == list(range(5))
                   for run in runs), seq
