"""What a cluster user does: build the wheel, install it into a fresh venv (the pinned torch first), and
from an empty folder run the demo, copy the walkthroughs, and see the Lab and server extensions enabled.

The wheel is built from a copy of this checkout (tracked files and new ones not ignored), so the build
runs the extension builder (jlpm) as ``pip wheel .`` does anywhere and writes nothing into the checkout.
The venv is built once for the module (about 4 minutes on 2 loaded cores, most of it pip); pip's cache
is used where there is one. Nothing here imports the checkout: PYTHONPATH is cleared.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PidsLimit, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # the first test builds the venv

ROOT = Path(__file__).resolve().parents[2]
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _run(cmd: list[str], cwd: Path, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} exited with {done.returncode}:\n" \
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _source_copy(dest: Path) -> Path:
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to know which files are the source")
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    modules = ROOT / "extension" / "node_modules"
    if modules.exists():  # jlpm install then has nothing to fetch
        (dest / "extension" / "node_modules").symlink_to(modules.resolve())
    return dest


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv with the pinned torch and the wheel built from this checkout: its ``bin``."""
    base = tmp_path_factory.mktemp("install")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    src = _source_copy(base / "src")
    _run([sys.executable, "-m", "venv", str(base / "venv")], base, env)
    py = base / "venv" / "bin" / "python"
    # the wheel builds (jlpm: mostly one core) while the pinned torch installs into the venv beside it;
    # --no-compile: pip's byte-compiling of every module of torch and Jupyter was 35 s of the 110 (what is
    # imported compiles as it is imported, as in any venv)
    build = subprocess.Popen([str(py), "-m", "pip", "wheel", "--no-deps", ".", "-w", str(base / "dist")],
                             cwd=src, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _run([str(py), "-m", "pip", "install", "-q", "--no-compile", TORCH_SPEC], base, env)
        built = build.communicate(timeout=900)[0]
    finally:
        if build.poll() is None:
            build.kill()
            build.communicate()
    assert build.returncode == 0, f"pip wheel exited with {build.returncode}:\n{built[-3000:]}"
    wheel = next((base / "dist").glob("distributed_workbench-*.whl"))
    _run([str(py), "-m", "pip", "install", "-q", "--no-compile", str(wheel)], base, env)
    return base / "venv" / "bin"


@pytest.fixture
def user(tmp_path):
    """An empty folder to work in, and the environment of a user of the venv (own Jupyter folders)."""
    here = tmp_path / "here"
    here.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "JPY_SESSION_NAME")}
    for var, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"),
                     ("JUPYTER_RUNTIME_DIR", "runtime"), ("WORKBENCH_STATE_DIR", "state")):
        env[var] = str(tmp_path / "jupyter" / sub)
    return here, env


def test_the_installed_package_is_the_one_that_runs(venv, user):
    here, env = user
    where = _run([str(venv / "python"), "-c", "import workbench, workbench.walkthroughs as w; "
                  "print(workbench.__file__); print(w.notebooks_dir())"], here, env).stdout.split()
    site = str(venv.parent / "lib")
    assert where[0].startswith(site) and where[1].startswith(site), where
    assert where[1].endswith("site-packages/workbench/notebooks")


def test_the_wheel_carries_the_compiled_dashboard_module(venv, user):
    """workbench/widgets/dashboard.js is compiled by the build from extension/src/widget/dashboard.ts (git
    ignores it, so the wheel's copy can only come from the build); the widget and the server load it."""
    here, env = user
    code = ("from workbench.widgets.assets import dashboard_js\n"
            "from workbench.widgets.view import DashboardView\n"
            "p = dashboard_js(); print(p); print(str(DashboardView._esm) == p.read_text())")
    path, same = _run([str(venv / "python"), "-c", code], here, env).stdout.split()
    assert path.startswith(str(venv.parent / "lib")), path
    assert path.endswith("site-packages/workbench/widgets/dashboard.js"), path
    assert same == "True"
    module = Path(path).read_text()
    # an ES module (no CDN, nothing imported), compiled: no TypeScript left in it
    assert "export default dashboard;" in module and "export function fit(layout, width)" in module
    assert not re.search(r"^\s*import\b", module, re.M) and "http" not in module
    assert ": ILayout" not in module and "interface " not in module


def test_workbench_demo_runs_the_quickstart_in_an_empty_folder(venv, user):
    here, env = user
    with PidsLimit(4000) as group:
        done = _run([str(venv / "workbench"), "demo"], here, env, timeout=600)
        assert until(lambda: group.pids() == [], timeout=15), f"the demo left processes: {group.pids()}"
    assert "running 01_quickstart.ipynb on a local 2-engine CPU pool" in done.stdout
    assert re.search(r"summary: ranks 2, steps 50, final_loss [0-9.e-]+$", done.stdout, re.M), done.stdout
    assert "executed notebook: workbench-demo/01_quickstart.ipynb" in done.stdout
    assert sorted(p.name for p in here.rglob("*")) == ["01_quickstart.ipynb", "workbench-demo"]


def test_workbench_notebooks_copies_the_walkthroughs_and_keeps_a_changed_one(venv, user):
    here, env = user
    first = _run([str(venv / "workbench"), "notebooks"], here, env).stdout
    copied = sorted(p.name for p in (here / "workbench-notebooks").iterdir() if not p.name.startswith("."))
    assert copied[0] == "01_quickstart.ipynb" and "09_elastic.ipynb" in copied and "README.md" in copied
    assert f"copied: {', '.join(n for n in copied if n != 'README.md')}, README.md" in first, first
    mine = here / "workbench-notebooks" / "01_quickstart.ipynb"
    mine.write_text(mine.read_text().replace("%dist start -n 2", "%dist start -n 3"))
    again = _run([str(venv / "workbench"), "notebooks"], here, env).stdout
    assert "kept (changed since they were copied, not overwritten): 01_quickstart.ipynb" in again
    assert "%dist start -n 3" in mine.read_text()
    assert "already up to date: 02_data_parallel.ipynb" in again


def test_lab_and_server_extensions_are_enabled(venv, user):
    here, env = user
    lab = _run([str(venv / "jupyter"), "labextension", "list"], here, env)
    text = ANSI.sub("", lab.stdout + lab.stderr)
    ours = r"distributed-workbench v0\.1\.0 enabled\s+OK \(python, distributed-workbench\)"
    assert re.search(ours, text), text
    server = _run([str(venv / "jupyter"), "server", "extension", "list"], here, env)
    text = ANSI.sub("", server.stdout + server.stderr)
    assert re.search(r"workbench\.server enabled", text) and re.search(r"workbench\.server\s+OK", text), text
    pools = _run([str(venv / "workbench"), "pools"], here, env).stdout
    assert "no pool of this user runs on this machine" in pools
    assert list(here.iterdir()) == []


def _catches_import_error(node) -> bool:
    import ast

    names = [h.type for h in node.handlers if h.type is not None]
    names = [e for n in names for e in (n.elts if isinstance(n, ast.Tuple) else [n])]
    return any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names)


def _walkthrough_imports(folder: Path) -> dict[str, set[str]]:
    """The top-level modules each walkthrough's code cells import (magic lines left out), by the extra the
    notebook names in its metadata ("" for none); the modules it writes itself (`%%writefile`) and those it
    imports only under ``try:`` / ``except ImportError:`` (an optional section: 12's Optuna sweep) left out.
    """
    import ast
    import json

    from IPython.core.inputtransformer2 import TransformerManager

    python = TransformerManager()  # magics and `x = %dist ...` into Python, as the kernel runs them
    found: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.ipynb")):
        notebook = json.loads(path.read_text())
        extra = notebook["metadata"].get("workbench", {}).get("extra", "")
        imports, written = found.setdefault(extra, set()), set()
        for cell in notebook["cells"]:
            if cell["cell_type"] != "code":
                continue
            lines = "".join(cell["source"]).splitlines()
            if lines and lines[0].startswith("%%writefile"):
                written.add(Path(lines[0].split()[-1]).stem)
            if lines and lines[0].startswith("%%"):
                continue  # a cell magic's body runs elsewhere (the ranks: the same environment)
            tree = ast.parse(python.transform_cell("\n".join(lines)))
            optional = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) and _catches_import_error(t)
                        for statement in t.body for n in ast.walk(statement)}
            for node in ast.walk(tree):
                if id(node) in optional:
                    continue  # `try: import optuna` / `except ImportError:` saying what to install
                if isinstance(node, ast.Import):
                    imports |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    imports.add(node.module.split(".")[0])
        imports -= written
    return found


def test_every_walkthrough_imports_only_what_the_wheel_brings(venv, user):
    """Notebook 06 failed from the wheel with "No module named 'pandas'" (only the test extra had it). A
    notebook that needs more names the extra that brings it (11: `[frameworks]`) and says so in its words."""
    here, env = user
    folder = Path(_run([str(venv / "python"), "-c", "import workbench.walkthroughs as w; "
                        "print(w.notebooks_dir())"], here, env).stdout.strip())
    by_extra = _walkthrough_imports(folder)
    assert "workbench" in by_extra[""] and "pandas" in by_extra[""], by_extra
    assert set(by_extra) == {"", "frameworks"}, by_extra
    find = "import importlib.util as u, sys; print(*[m for m in sys.argv[1:] if u.find_spec(m) is None])"
    modules = sorted(set().union(*by_extra.values()))
    missing = set(_run([str(venv / "python"), "-c", find, *modules], here, env).stdout.split())
    # what the extra brings, from the installed wheel's own metadata
    # the marker as the wheel wrote it (hatchling quotes the extra's name with ' , others with ")
    code = ("import importlib.metadata as m, re, sys; print(*[re.split('[ ;=<>!]', r)[0] for r in "
            "m.requires('distributed-workbench') if re.search(r'extra *== *.' + sys.argv[1] + '.$', r)])")
    extra = set(_run([str(venv / "python"), "-c", code, "frameworks"], here, env).stdout.split())
    assert {"lightning", "accelerate"} <= extra, extra
    lacking = missing & by_extra[""]
    assert not lacking, f"the walkthroughs import {lacking}, which a `pip install` of the wheel lacks"
    assert missing <= extra, f"11_frameworks imports {missing - extra}, which [frameworks] does not bring"
    words = "".join(json.loads((folder / "11_frameworks.ipynb").read_text())["cells"][0]["source"])
    assert 'pip install "distributed-workbench[frameworks]"' in words, words


def test_the_dashboard_walkthrough_runs_from_the_wheel_and_leaves_nothing(venv, user):
    here, env = user
    with PidsLimit(4000) as group:
        done = _run([str(venv / "workbench"), "demo", "06_watching_a_run"], here, env, timeout=600)
        assert until(lambda: group.pids() == [], timeout=15), f"the notebook left processes: {group.pids()}"
    assert "executed notebook: workbench-demo/06_watching_a_run.ipynb" in done.stdout, done.stdout[-2000:]
