"""The docked dashboard's source in a real Jupyter server: GET /workbench/pools/<id>/dashboard.

A pool another process started (as a notebook would) trains; the server subscribes to its relay when a
page first asks, answers with the run's header and figure, lets its dashboard sleep when no page asked for
a while (the collector stays: the relay keeps no history), and keeps the last picture when the pool stops.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
from urllib.parse import urlparse

import psutil
import pytest

from tests.metrics.test_polled_dashboard import Page
from tests.server.conftest import wait_for

DASHBOARD_THREADS = ("workbench-collector", "workbench-dashboard")

# a notebook elsewhere: start a pool, train `argv[1]` steps when told, stop when its stdin closes
TRAINS = textwrap.dedent("""
    import sys
    from workbench import Session
    steps = int(sys.argv[1])
    s = Session(n=2).start()
    s.run('''
    import time, torch
    from torch.utils.data import TensorDataset
    from workbench.train import MLP, Callback, MLPConfig, Trainer, make_loader, regression_data
    class Slow(Callback):
        def on_step_end(self, trainer, stats):
            time.sleep(0.05)
    torch.manual_seed(0)
    loader = make_loader(TensorDataset(*regression_data(256, d_in=8, d_out=2)), batch_size=8)
    trainer = Trainer(MLP(MLPConfig(d_in=8, d_hidden=16, d_out=2, n_layers=1)), loader, lr=1e-2,
                      callbacks=[Slow()])
    ''')
    print(s.pool_id, flush=True)
    sys.stdin.readline()
    s.run(f"trainer.run(steps={steps})")
    print("trained", flush=True)
    sys.stdin.read()  # until the test closes it
    s.stop()
""")


@pytest.fixture
def jp_server_config(jp_server_config):
    """The server of the conftest, with dashboards asleep 2 s after the last page asked (not 30)."""
    return {**jp_server_config, "WorkbenchServerExtension": {"dashboard_idle_s": 2.0}}


def _sources(jp_serverapp):
    ext = next(iter(jp_serverapp.extension_manager.extension_apps["workbench.server"]))
    return ext.manager.dashboards


def _relay_sockets(out_url: str) -> list:
    """This process's connections to the pool's relay: TCP ones by port; a local pool's relay is a unix
    socket (ipc://), whose client ends have no path: those whose peer is one of the relay's own ends
    (``ss`` gives each unix socket's peer)."""
    if not out_url.startswith("ipc://"):
        port = urlparse(out_url).port
        return [c for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port == port]
    path = out_url[len("ipc://"):]
    rows = [r.split() for r in subprocess.run(["ss", "-xpn"], capture_output=True, text=True,
                                               timeout=30).stdout.splitlines()[1:]]
    rows = [r for r in rows if len(r) >= 8]
    relay_ends = {r[5] for r in rows if r[4] == path}
    mine = f"pid={os.getpid()},"
    return [r for r in rows if r[7] in relay_ends and mine in " ".join(r[8:])]


def _dashboard_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name in DASHBOARD_THREADS]


async def _poll(api, pool_id: str, page: Page) -> tuple[dict, str]:
    """One look of a docked page at the pool's dashboard: what came since its last look, applied to it;
    the answer and its raw text."""
    code, body, raw = await api("GET", "pools", pool_id, "dashboard",
                                params={"since": str(page.seq), "view": page.view})
    assert code == 200, body
    page.apply(body)
    return body, raw


async def _until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout} s")
        await asyncio.sleep(0.2)


@pytest.mark.timeout(30)
async def test_an_unknown_pool_has_no_dashboard(api, jp_serverapp):
    code, body, _ = await api("GET", "pools", "nosuch", "dashboard")
    assert code == 404 and "no pool 'nosuch'" in body["message"]
    code, body, _ = await api("GET", "pools", "nosuch", "dashboard", params={"since": "x"})
    assert code == 400 and "since must be a whole number" in body["message"]
    assert _sources(jp_serverapp).pools == []


@pytest.mark.timeout(30)
async def test_the_page_code_comes_from_the_installed_packages(jp_fetch):
    from tornado.httpclient import HTTPClientError

    from workbench.widgets.assets import DASHBOARD_JS, plotly_js

    for name, path in (("dashboard.js", DASHBOARD_JS), ("plotly.min.js", plotly_js())):
        r = await jp_fetch("workbench", "dashboard", name)
        assert r.code == 200 and r.body == path.read_bytes()
        assert r.headers["Content-Type"].startswith("text/javascript")
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("workbench", "dashboard", "other.js")
    assert err.value.code == 404


@pytest.mark.timeout(240)
async def test_a_pool_of_another_notebook_docks_its_live_dashboard_until_it_stops(api, jp_serverapp):
    sources = _sources(jp_serverapp)
    assert sources.idle_s == 2.0
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    threads = _dashboard_threads()
    proc = subprocess.Popen([sys.executable, "-c", TRAINS, "60"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        pool_id = proc.stdout.readline().strip()
        assert pool_id, "the other process did not start its pool"
        await wait_for(api, pool_id, "running")
        from workbench.pool.records import state as pool_state

        out = pool_state.read_state(pool_state.state_path(pool_id)).channel["out"]

        async def poll(page: Page) -> dict:
            body, raw = await _poll(api, pool_id, page)
            assert out not in raw and "key" not in body  # never how to reach the relay, nor its key
            return body

        def closed() -> bool:  # its thread and its socket gone
            return _dashboard_threads() == threads and not _relay_sockets(out)

        page = Page()
        first = await poll(page)
        assert first["pool"] == pool_id and first["figure"] == {} and first["live"]
        assert sources.pools == [pool_id] and len(_relay_sockets(out)) == 1
        proc.stdin.write("go\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 120
        while "training · step" not in (a := await poll(page))["header"]:
            assert time.monotonic() < deadline, f"no step shown; last: {a['header']} {a['note']}"
            await asyncio.sleep(1.0)
        assert "rank 0" in [t["name"] for t in page.figure["data"]]
        deadline = time.monotonic() + 30
        while "finished at step 60" not in (a := await poll(page))["header"]:
            assert time.monotonic() < deadline, a["header"]
            await asyncio.sleep(0.5)
        assert len(page.figure["data"][0]["y"]) > 10  # the points it saw, kept

        # nobody asks: after idle_s its dashboard sleeps (its thread ends); the collector stays subscribed
        await _until(lambda: not sources.awake and "workbench-dashboard" not in _dashboard_threads(), 10,
                     "the idle dashboard did not sleep")
        assert sources.pools == [pool_id] and len(_relay_sockets(out)) == 1

        # asked again (a page that opens later): the whole run, from the collector it kept
        again = Page()
        body = await poll(again)
        assert "finished at step 60" in body["header"] and sources.awake == [pool_id], body["header"]
        assert again.figure["data"][0]["x"] == page.figure["data"][0]["x"]

        # the pool stops (its owner stops it): thread and socket gone, its last picture answered, stopped
        proc.stdin.close()
        await asyncio.to_thread(proc.wait, 30)
        await _until(lambda: not sources.pools and closed(), 10, "the stopped pool's source was not closed")
        code, body, _ = await api("GET", "pools", pool_id, "dashboard")
        assert code == 200 and body["stopped"] and not body["live"], body
        assert "finished at step 60" in body["header"] and body["figure"]["data"], body["header"]
        code, body, _ = await api("GET", "pools", pool_id, "dashboard",
                                  params={"since": str(again.seq), "view": again.view})
        assert code == 200 and body["stopped"] and "figure" not in body and body["extend"] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    await _until(lambda: {p.pid for p in psutil.Process().children(recursive=True)} <= before, 20,
                 "processes of the pool were left")


@pytest.mark.timeout(180)
async def test_stopping_a_pool_from_the_panel_keeps_its_last_picture(api, jp_serverapp):
    code, body, _ = await api("POST", "pools", body={"n": 2})
    pool = await wait_for(api, body["pool"]["request_id"], "running")
    code, body, _ = await api("GET", "pools", pool["id"], "dashboard")
    assert code == 200 and "No training run yet" in body["note"]
    assert _sources(jp_serverapp).pools == [pool["id"]]
    code, _, _ = await api("DELETE", "pools", pool["id"])
    assert code == 200 and _sources(jp_serverapp).pools == []
    code, body, _ = await api("GET", "pools", pool["id"], "dashboard")  # its last picture, said stopped
    assert code == 200 and body["stopped"] and "No training run yet" in body["note"], body


@pytest.mark.timeout(240)
async def test_a_dashboard_opened_after_the_run_shows_it_whole_when_the_panel_listed_the_pool(api):
    """The relay keeps no history: the panel's listing makes the pool's source, so a dashboard opened only
    after the run (before: "No training run yet") has the whole run, from when the panel saw the pool."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    proc = subprocess.Popen([sys.executable, "-c", TRAINS, "40"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        pool_id = proc.stdout.readline().strip()
        assert pool_id, "the other process did not start its pool"
        await wait_for(api, pool_id, "running")  # the panel lists the pool
        proc.stdin.write("go\n")
        proc.stdin.flush()
        trained = asyncio.ensure_future(asyncio.to_thread(proc.stdout.readline))
        while not trained.done():  # the panel lists the pools every 1.5 s while the run goes on
            code, _, _ = await api("GET", "pools")
            assert code == 200
            await asyncio.sleep(1.0)
        assert (await trained).strip() == "trained"
        page = Page()
        code, body, _ = await api("GET", "pools", pool_id, "dashboard")
        assert code == 200, body
        page.apply(body)
        assert "finished at step 40" in body["header"], body["header"]
        steps = page.figure["data"][0]["x"]
        assert min(steps) <= 2 and max(steps) == 40, steps  # from its first steps on
    finally:
        proc.stdin.close()
        await asyncio.to_thread(proc.wait, 60)
    await _until(lambda: {p.pid for p in psutil.Process().children(recursive=True)} <= before, 20,
                 "processes of the pool were left")


# the notebook elsewhere again: a run, rank 1 killed and restarted, a second run (issue 24 item 5)
TRAINS_RESTARTED = TRAINS.replace("s.run('''", "SETUP = '''").replace(
    "''')\nprint(s.pool_id", "'''\ns.run(SETUP)\nprint(s.pool_id").replace(
    'print("trained", flush=True)',
    'import os, signal, time\n'
    'os.kill(s.ranks[1].pid, signal.SIGKILL)\n'
    'deadline = time.monotonic() + 20\n'
    'while not s.dead_ranks() and time.monotonic() < deadline:\n'
    '    time.sleep(0.1)\n'
    's.restart()\n'
    's.run(SETUP)\n'
    's.run(f"trainer.run(steps={steps})")\n'
    'print("trained", flush=True)')


@pytest.mark.timeout(180)
async def test_the_docked_dashboard_after_a_restart_shows_every_rank_of_the_next_run(api, jp_serverapp):
    """After ``%dist restart`` the next run's figure had only "rank 0" though both ranks trained."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    proc = subprocess.Popen([sys.executable, "-c", TRAINS_RESTARTED, "30"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        pool_id = proc.stdout.readline().strip()
        assert pool_id, "the other process did not start its pool"
        await wait_for(api, pool_id, "running")
        page = Page()

        async def poll() -> dict:
            return (await _poll(api, pool_id, page))[0]

        await poll()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        def until_trained() -> list[str]:  # its lines (the death notice among them) up to "trained"
            lines = []
            while (line := proc.stdout.readline()) and line.strip() != "trained":
                lines.append(line)
            return lines + [line]

        done = asyncio.ensure_future(asyncio.to_thread(until_trained))
        while not done.done():
            await poll()
            await asyncio.sleep(0.5)
        assert done.result()[-1].strip() == "trained", done.result()
        deadline = time.monotonic() + 30
        while "run 2 finished at step 30" not in (body := await poll())["header"]:
            assert time.monotonic() < deadline, body["header"]
            await asyncio.sleep(0.5)
        names = [t["name"] for t in page.figure["data"]]
        assert "rank 0" in names and "rank 1" in names, names
        counts = {t["name"]: len(t["y"]) for t in page.figure["data"] if t["name"].startswith("rank")}
        assert counts["rank 1"] > 10, counts
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(30)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    await _until(lambda: {p.pid for p in psutil.Process().children(recursive=True)} <= before, 20,
                 "processes of the pool were left")
