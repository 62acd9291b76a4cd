"""The quickstart notebook runs headless, start to end, with no error output."""

from __future__ import annotations

import pytest

from workbench.demo import DEFAULT, run_notebook

pytestmark = pytest.mark.timeout(240)


def test_quickstart_runs_clean(tmp_path):
    import nbformat

    summary = run_notebook(DEFAULT, tmp_path, log=lambda line: None)
    assert summary["ranks"] == 2 and summary["steps"] == 50 and summary["final_loss"] < 0.01
    nb = nbformat.read(tmp_path / DEFAULT.name, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "[rank 0] I am rank 0 of 2, on cpu" in text and "[ranks 0-1] hello from every rank" in text
    assert "replicas identical: True" in text
