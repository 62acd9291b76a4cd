"""The in-cell dashboard where no page can draw its widget (issue 37 part 6: VS Code without the widget's
module, Notebook 7 or JupyterLab without ipywidgets' manager, a headless run): plain HTML, updated in place.

Through a real kernel and no front end at all (nothing creates the widget's model, so nothing says it can
draw it): ``auto`` shows the widget, waits ``WORKBENCH_DASHBOARD_WAIT`` seconds, then goes on as HTML (the
header, an SVG of the lines, the devices) updated through the display's updates while the run lasts, and
ends on the static figure as before. ``WORKBENCH_DASHBOARD=html`` chooses HTML from the start: a notebook run
by nbclient then holds no widget at all. (The browser's side: tests/ui/test_dashboard_fallback_browser.py.)
"""

from __future__ import annotations

import json
import re

import nbformat
import pytest
from jupyter_client.manager import start_new_kernel
from nbclient import NotebookClient

from tests.conftest import alive, until
from tests.metrics.test_dashboard_kernel import PLOTLY, TRAIN, WIDGET, start_pool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
SLOW_TRAIN = TRAIN.replace("trainer = Trainer(model, loader, lr=1e-2)", """\
import time
from workbench.train import Callback
class Slow(Callback):
    def on_step_end(self, trainer, stats):
        time.sleep(0.05)
trainer = Trainer(model, loader, lr=1e-2, callbacks=[Slow()])""").replace("steps=40", "steps=160")


def test_auto_falls_back_to_html_updates_where_no_page_draws_the_widget(monkeypatch):
    monkeypatch.setenv("WORKBENCH_DASHBOARD_WAIT", "1")
    km, kc = start_new_kernel(kernel_name="python3")
    pids = []
    try:
        pids = start_pool(kc)
        out = []
        hook = out.append
        reply = kc.execute_interactive(SLOW_TRAIN, timeout=180, output_hook=hook)
        assert reply["content"]["status"] == "ok", [m["content"] for m in out]
        shown = [m["content"] for m in out if m["msg_type"] == "display_data"]
        assert len(shown) == 1 and WIDGET in shown[0]["data"], shown  # first the widget, as always
        display_id = shown[0]["transient"]["display_id"]
        updates = [m["content"]["data"] for m in out if m["msg_type"] == "update_display_data"
                   and m["content"]["transient"]["display_id"] == display_id]
        live = [u for u in updates if "(live, HTML)" in u["text/plain"]]
        steps = [int(s) for u in live for s in re.findall(r"training · step (\d+)", u["text/html"])[:1]]
        said = [u["text/plain"] for u in updates]
        assert len(live) >= 2 and steps == sorted(steps) and steps[-1] > steps[0], said
        assert all(WIDGET not in u and "<script" not in u["text/html"] for u in live)
        assert any("<svg" in u["text/html"] and "<polyline" in u["text/html"] for u in live)
        assert any("data-rank='1'" in u["text/html"] for u in live), "the device table"
        assert PLOTLY in updates[-1] and "finished at step 160" in updates[-1]["text/plain"]  # as before
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    assert until(lambda: alive(pids) == [], 15), alive(pids)


def test_html_chosen_up_front_leaves_no_widget_in_an_nbclient_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_DASHBOARD", "html")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in (
        "%load_ext workbench\n%dist start -n 2", SLOW_TRAIN.replace("steps=160", "steps=40"),
        "import json, workbench\nprint('PIDS', json.dumps(workbench.current().pids()))", "%dist stop")])
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                   ).execute()
    saved = json.dumps(nb)
    assert WIDGET not in saved and "widget-view" not in saved, "no widget in the notebook"
    assert "application/vnd.jupyter.widget-state+json" not in saved  # no widget state kept either
    [shown] = [o for o in nb.cells[1].outputs if o.output_type == "display_data"]
    assert "finished at step 40" in shown.data["text/plain"] and PLOTLY in shown.data
    pids = json.loads(nb.cells[2].outputs[0].text.split("PIDS", 1)[1])
    assert until(lambda: alive(pids) == [], 15), alive(pids)
