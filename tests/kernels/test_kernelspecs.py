"""The workbench kernel specs: `workbench kernels install/uninstall`; a kernel from them has the magics."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient


@pytest.fixture
def jupyter_env(tmp_path, monkeypatch):
    """A private Jupyter data dir: specs installed with --user land there, nowhere else."""
    env = {"JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "WORKBENCH_STATE_DIR": str(tmp_path / "pool-state")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return tmp_path


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                          timeout=60)


def _kernelspecs() -> dict:
    out = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)["kernelspecs"]


@pytest.mark.timeout(60)
def test_install_lists_both_specs_and_uninstall_removes_them(jupyter_env):
    done = _cli("kernels", "install", "--user")
    assert done.returncode == 0, done.stderr
    specs = _kernelspecs()
    for name, label in (("workbench-cpu", "Python 3 (workbench, CPU)"),
                        ("workbench-gpu", "Python 3 (workbench, GPU)")):
        assert specs[name]["resource_dir"].startswith(str(jupyter_env / "data"))
        spec = specs[name]["spec"]
        assert spec["display_name"] == label
        assert spec["argv"][0] == sys.executable  # the Python the workbench is installed in
        assert "--ext=workbench" in spec["argv"]
    assert specs["workbench-cpu"]["spec"]["env"]["CUDA_VISIBLE_DEVICES"] == ""

    done = _cli("kernels", "uninstall", "--user")
    assert done.returncode == 0, done.stderr
    assert not {"workbench-cpu", "workbench-gpu"} & set(_kernelspecs())


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.mark.timeout(60)
def test_install_copies_each_kernels_logo(jupyter_env):
    """The launcher shows a logo for each workbench kernel (without one it shows the letter "P")."""
    from pathlib import Path

    assert _cli("kernels", "install", "--user").returncode == 0
    for name, spec in _kernelspecs().items():
        if not name.startswith("workbench"):
            continue
        folder = Path(spec["resource_dir"])
        assert _png_size(folder / "logo-32x32.png") == (32, 32)
        assert _png_size(folder / "logo-64x64.png") == (64, 64)
        svg = (folder / "logo-svg.svg").read_text()
        assert svg.lstrip().startswith("<svg") and 'viewBox="0 0 64 64"' in svg


def test_unknown_spec_names_the_choices():
    done = _cli("kernels", "install", "--user", "workbench-tpu")
    assert done.returncode == 2
    assert "workbench-cpu, workbench-gpu" in done.stderr


CHECK = """
ip = get_ipython()
import os, sys
print("line:", "dist" in ip.magics_manager.magics["line"])
print("cell:", "distributed" in ip.magics_manager.magics["cell"])
print("gpus hidden:", os.environ.get("CUDA_VISIBLE_DEVICES") == "")
print("torch imported:", "torch" in sys.modules)
"""


@pytest.mark.timeout(90)
def test_a_kernel_from_the_cpu_spec_has_the_magics_loaded(jupyter_env):
    assert _cli("kernels", "install", "--user", "workbench-cpu").returncode == 0
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CHECK),
                                         nbformat.v4.new_code_cell("%dist status")])
    NotebookClient(nb, kernel_name="workbench-cpu", timeout=60, startup_timeout=60,
                   allow_errors=True).execute()
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert "line: True" in text and "cell: True" in text and "gpus hidden: True" in text
    assert "torch imported: False" in text  # the kernel never pays for torch
    # the magic answers (no pool yet): a usage message, not "UsageError: Line magic function not found"
    status = json.dumps(nb.cells[1].outputs)
    assert "not found" not in status


@pytest.mark.gpu
@pytest.mark.timeout(180)
def test_the_gpu_spec_starts_a_pool_on_the_gpus(jupyter_env):
    from workbench.pool.machine.devices import visible_gpu_count

    if visible_gpu_count() == 0:
        pytest.skip("needs a CUDA GPU")
    assert _cli("kernels", "install", "--user", "workbench-gpu").returncode == 0
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("%dist start -n 1"),
        nbformat.v4.new_code_cell("%%distributed\nprint(device, dist.get_backend())"),
        nbformat.v4.new_code_cell("%dist stop"),
    ])
    NotebookClient(nb, kernel_name="workbench-gpu", timeout=150, startup_timeout=60).execute()
    text = "".join(o.get("text", "") for o in nb.cells[1].outputs)
    assert "cuda:0 cpu:gloo,cuda:nccl" in text  # the auto backend: gloo for CPU tensors, NCCL for CUDA ones
