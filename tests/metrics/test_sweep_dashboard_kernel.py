"""The sweep's comparison dashboard in a real notebook: through a real kernel (nbclient), ``wb.Sweep.run()``
shows it by itself (a front end that can show widgets), and the saved notebook keeps its last picture, one
static plotly figure of every trial's loss (workbench/widgets/sweep_dashboard.py)."""

from __future__ import annotations

import json

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import alive

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PLOTLY = "application/vnd.plotly.v1+json"

FIT = """%%distributed
import torch, workbench as wb
from torch.utils.data import TensorDataset
def fit(lr, steps=15):
    torch.manual_seed(0)
    model = wb.shard(wb.MLP(wb.MLPConfig(d_in=8, d_hidden=16, d_out=2, n_layers=1)), "ddp")
    loader = wb.make_loader(TensorDataset(*wb.regression_data(256, d_in=8, d_out=2)), batch_size=16)
    result = wb.Trainer(model, loader, lr=lr).run(steps=steps)
    return {"loss": result.history[-1].loss}"""

SWEEP = """import workbench as wb
sweep = wb.Sweep("fit", [{"lr": 0.1}, {"lr": 0.03}, {"lr": 0.01, "steps": 10}], ranks_per_trial=2)
results = sweep.run()
print("BEST", sweep.best("loss").index)"""


def test_a_sweep_in_a_notebook_leaves_one_static_figure_of_every_trial(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in (
        "%load_ext workbench\n%dist start -n 4", FIT, SWEEP,
        "import json\nprint('PIDS', json.dumps(wb.current().pids()))", "%dist stop")])
    NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                   ).execute()
    outputs = nb.cells[2].outputs
    shown = [o for o in outputs if o.output_type == "display_data"]
    assert len(shown) == 1, outputs  # one figure, replaced in place while the sweep ran
    data = shown[0].data
    assert "3 done" in data["text/plain"], data["text/plain"]
    best = int("".join(o.get("text", "") for o in outputs).split("BEST", 1)[1].split()[0])
    loss = [t for t in data[PLOTLY]["data"] if t["xaxis"] == "x"]
    names = ["trial 0: lr=0.1 (done)", "trial 1: lr=0.03 (done)", "trial 2: lr=0.01, steps=10 (done)"]
    names[best] = f"best · {names[best]}"
    assert [t["name"] for t in loss] == names
    assert [len(t["y"]) for t in loss] == [15, 15, 10]
    assert "<svg" in data["text/html"] and "<script" not in data["text/html"]  # nbviewer, GitHub
    nbformat.validate(nb)
    pids = json.loads(nb.cells[3].outputs[0].text.split("PIDS", 1)[1])
    assert alive(pids) == []
