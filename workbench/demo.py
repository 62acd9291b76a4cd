"""``workbench demo``: run walkthrough notebooks headless on a local CPU pool (``python -m workbench.demo``).

Prints each cell as it runs, writes the executed notebook into ``--out`` (``workbench-demo/`` in the
current folder) and ends with the notebook's ``summary`` (ranks, steps, final loss). The notebooks
come with the package (:mod:`workbench.walkthroughs`), so this runs from an installed package in any
folder; a name alone (``workbench demo 02_data_parallel``) picks a walkthrough. ``make demo`` runs
the quickstart; ``make notebooks`` runs every walkthrough and renders it to HTML (``--html``). Cells
tagged ``gpu`` run only where a GPU is visible.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from workbench.walkthroughs import QUICKSTART, notebooks_dir

ROOT = Path(__file__).resolve().parent.parent  # the source checkout (in one)
DEFAULT = notebooks_dir() / QUICKSTART
DEFAULT_OUT = Path("workbench-demo")
GPU_TAG = "gpu"  # cells that need a GPU: skipped where there is none


def run_notebook(path: Path, out_dir: Path, timeout: int = 600, log=print,
                 gpu: bool | None = None) -> dict | None:
    """Execute ``path`` cell by cell, save it to ``out_dir``; return its ``summary`` variable if any.

    ``gpu``: run the cells tagged ``gpu`` (default: only where a GPU is visible).
    """
    # here, not at the top: nbformat's schema validation takes seconds to import, and `workbench pools`
    # (which builds the demo's arguments) must answer at once
    import nbformat
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient
    from traitlets.config import Config

    if gpu is None:
        from workbench.pool.machine.devices import visible_gpu_count

        gpu = visible_gpu_count() > 0
    nb = nbformat.read(path, as_version=4)
    out_dir.mkdir(parents=True, exist_ok=True)
    # the kernel runs in out_dir: the installed package's folder may be read-only, and nothing the
    # notebook writes lands beside the source. It listens on unix sockets in a private folder, not on TCP:
    # nothing else on the machine can connect (and it has no reason to warn of TCP without encryption)
    sockets = tempfile.mkdtemp(prefix="workbench-demo-")
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(out_dir.resolve())}},
                            config=Config({"KernelManager": {"transport": "ipc",
                                                             "ip": os.path.join(sockets, "kernel")}}))
    code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    summary = None
    out = out_dir / path.name
    try:
        with client.setup_kernel():
            for n, index in enumerate(code_cells, 1):
                cell = nb.cells[index]
                lines = cell.source.strip().splitlines() or [""]
                first = lines[0] if len(lines) == 1 else f"{lines[0]}  {lines[1]}"
                if not gpu and GPU_TAG in cell.metadata.get("tags", []):
                    log(f"[{n}/{len(code_cells)}] skipped (needs a GPU)  {first[:50]}")
                    continue
                t0 = time.perf_counter()
                client.execute_cell(cell, index)
                log(f"[{n}/{len(code_cells)}] {time.perf_counter() - t0:5.1f} s  {first[:70]}")
            reply = []
            run_sync(client.kc.execute_interactive)(
                "import json as _j; print(_j.dumps(globals().get('summary')))",
                output_hook=lambda m: reply.append(m["content"].get("text", "")), timeout=30)
            text = "".join(reply).strip()
            summary = json.loads(text) if text else None
    finally:
        nbformat.write(nb, out)
        shutil.rmtree(sockets, ignore_errors=True)
    return summary


def to_html(executed: Path) -> Path:
    """Render an executed notebook to a standalone HTML file next to it."""
    import nbformat
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nbformat.read(executed, as_version=4))
    out = executed.with_suffix(".html")
    out.write_text(body, encoding="utf-8")
    return out


def resolve(name: str | Path) -> Path:
    """A notebook path, or the name of a walkthrough (``02_data_parallel``, with or without ``.ipynb``).

    >>> resolve("01_quickstart") == DEFAULT
    True
    """
    path = Path(name)
    if path.is_file():
        return path
    shipped = notebooks_dir() / (path.name if path.suffix == ".ipynb" else f"{path.name}.ipynb")
    if shipped.is_file():
        return shipped
    names = ", ".join(p.stem for p in sorted(notebooks_dir().glob("*.ipynb")))
    raise ValueError(f"no notebook {str(name)!r}: give a path to one, or a walkthrough: {names}.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``workbench demo`` (also ``python -m workbench.demo``)."""
    parser.add_argument("notebooks", nargs="*", default=[DEFAULT], metavar="NOTEBOOK",
                        help="a notebook path or a walkthrough's name (default: the quickstart)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"where the executed notebooks go (default: ./{DEFAULT_OUT})")
    parser.add_argument("--html", action="store_true", help="also render each executed notebook to HTML")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run ``args.notebooks`` one after another; 1 at the first that fails."""
    from nbclient.exceptions import CellExecutionError

    try:
        notebooks = [resolve(n) for n in args.notebooks]
    except ValueError as exc:
        print(f"workbench demo: {exc}", file=sys.stderr)
        return 2
    for notebook in notebooks:
        print(f"running {notebook.name} on a local 2-engine CPU pool")
        t0 = time.perf_counter()
        try:
            summary = run_notebook(notebook, args.out)
        except CellExecutionError as exc:
            print(f"\nthe notebook failed:\n{exc}", file=sys.stderr)
            return 1
        print(f"\nexecuted notebook: {args.out / notebook.name}  ({time.perf_counter() - t0:.1f} s)")
        if args.html:
            print(f"rendered: {to_html(args.out / notebook.name)}")
        if summary:
            print("summary: " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
