"""``workbench`` command line: the demo, the walkthroughs, this user's pools, the kernel specs.

- ``workbench demo [NOTEBOOK...]``: run the quickstart (or the walkthroughs named) headless on a local
  2-rank CPU pool, from any folder.
- ``workbench notebooks [DIR]``: copy the walkthroughs into DIR (``./workbench-notebooks``) to open;
  a file changed since it was copied is kept, and named.
- ``workbench pools [--json]``: every pool of this user on this machine.
- ``workbench stop NAME|ID|--all [--yes]``: stop pools the way the JupyterLab panel does.
- ``workbench kernels install|uninstall|list-specs``: the workbench kernel specs.
- ``workbench stacks NAME|ID [--native]``: every rank's stacks now, as the sidebar's "Stacks" shows them.
- ``workbench doctor``: which environment the Jupyter server and the kernel run in, the version of each
  piece, the Slurm allocation, and what to install where.

>>> main(["kernels", "list-specs"])          # doctest: +SKIP
workbench-cpu  Python 3 (workbench, CPU)
workbench-gpu  Python 3 (workbench, GPU)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

KERNEL_NAMES = ("workbench-cpu", "workbench-gpu")


def spec_source() -> Path:
    """Where the kernel spec folders are: the repository's ``kernels/`` in a source checkout,
    else ``<prefix>/share/distributed-workbench/kernels`` where the wheel put them."""
    here = Path(__file__).resolve().parent.parent / "kernels"
    if (here / KERNEL_NAMES[0] / "kernel.json").exists():
        return here
    installed = Path(sys.prefix) / "share" / "distributed-workbench" / "kernels"
    if (installed / KERNEL_NAMES[0] / "kernel.json").exists():
        return installed
    raise FileNotFoundError(
        f"the workbench kernel specs are missing (looked in {here} and {installed}): reinstall "
        "distributed-workbench."
    )


def load_spec(name: str) -> dict:
    """A kernel spec as it will be installed: ``argv[0]`` is this Python, so the kernel runs where
    the workbench is installed, whichever Jupyter starts it."""
    spec = json.loads((spec_source() / name / "kernel.json").read_text())
    spec["argv"][0] = sys.executable
    return spec


def _location(args) -> dict:
    if args.user:
        return {"user": True}
    if args.prefix:
        return {"prefix": args.prefix}
    return {"prefix": sys.prefix}  # --sys-prefix, the default


def install(args) -> int:
    from jupyter_client.kernelspec import KernelSpecManager

    ksm = KernelSpecManager()
    for name in args.names or KERNEL_NAMES:
        spec = load_spec(name)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / name
            folder.mkdir()
            for extra in (spec_source() / name).iterdir():
                if extra.name != "kernel.json":
                    shutil.copy(extra, folder / extra.name)
            (folder / "kernel.json").write_text(json.dumps(spec, indent=1))
            dest = ksm.install_kernel_spec(str(folder), kernel_name=name, **_location(args))
        print(f"installed {name} ({spec['display_name']}) in {dest}")
    return 0


def uninstall(args) -> int:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    ksm = KernelSpecManager()
    where = _location(args)
    status = 0
    for name in args.names or KERNEL_NAMES:
        if "user" in where:
            folder = Path(ksm.user_kernel_dir) / name
        else:
            folder = Path(where["prefix"]) / "share" / "jupyter" / "kernels" / name
        if folder.is_dir():
            shutil.rmtree(folder)
            print(f"removed {name} from {folder}")
        else:
            try:
                other = ksm.get_kernel_spec(name).resource_dir
                print(f"{name} is not installed there (it is in {other}); nothing removed.")
            except NoSuchKernel:
                print(f"{name} is not installed; nothing removed.")
    return status


def list_specs(args) -> int:
    for name in KERNEL_NAMES:
        print(f"{name}  {load_spec(name)['display_name']}")
    return 0


def demo(args) -> int:
    from workbench.demo import run

    return run(args)


def notebooks(args) -> int:
    from workbench.walkthroughs import copy_walkthroughs

    try:
        report = copy_walkthroughs(args.dir)
    except ValueError as exc:
        print(f"workbench notebooks: {exc}", file=sys.stderr)
        return 2
    print(f"the walkthroughs in {report.folder}:")
    for line in report.lines():
        print(f"  {line}")
    return 0


def pools(args) -> int:
    from workbench.pool.overview import COLUMNS, pools
    from workbench.tables import format_table

    found = pools()
    if args.json:
        print(json.dumps(found, indent=1))
    elif not found:
        print("no pool of this user runs on this machine (`%dist start` in a notebook starts one).")
    else:
        print(format_table(found, COLUMNS))
    return 0


def stacks(args) -> int:
    from workbench.pool import overview
    from workbench.pool.records import state as pool_state
    from workbench.session.stack_report import PoolStacks

    try:
        pool = overview.find(args.pool)
    except ValueError as exc:
        print(f"workbench stacks: {exc}", file=sys.stderr)
        return 1
    state = pool_state.read_state(pool_state.state_path(pool["id"]))
    if state is None or not state.channel:
        print(f"workbench stacks: pool {pool['name']} has no side channel to ask its ranks through.",
              file=sys.stderr)
        return 1
    asker = PoolStacks(state.channel)
    try:
        ranks = [r["rank"] for r in state.ranks]
        found = asker.gather(ranks, generation=state.generation, native=args.native)
    finally:
        asker.close()
    print(found.format())
    return 0


def doctor(args) -> int:
    from workbench.doctor import report

    found = report()
    print(found.format())
    return 0


STOPPED_BY = "`workbench stop` in a terminal"


def stop(args) -> int:
    from workbench.pool import overview

    if bool(args.pools) == args.all:
        print("workbench stop: name the pools to stop (NAME or ID), or --all; not both.", file=sys.stderr)
        return 2
    try:
        chosen = overview.pools() if args.all else [overview.find(ref) for ref in args.pools]
    except ValueError as exc:
        print(f"workbench stop: {exc}", file=sys.stderr)
        return 1
    if not chosen:
        print("no pool of this user runs on this machine: nothing to stop.")
        return 0
    for pool in chosen:
        what = f"pool {pool['name']} ({pool['id']}, {pool['launcher']}, {pool['ranks']} ranks)"
        question = f"stop {what}? {overview.who_drives(pool)}."
        if not args.yes:
            if not sys.stdin.isatty():
                print(f"workbench stop: not stopping {what}: {overview.who_drives(pool)}, and there is no "
                      "terminal to ask; add --yes to stop it.", file=sys.stderr)
                return 1
            if input(f"{question} [y/N] ").strip().lower() not in ("y", "yes"):
                print(f"kept {what}.")
                continue
        reason = overview.stop(pool, STOPPED_BY)
        how = f" (its controller did not answer, {reason}: ended from its state file)" if reason else ""
        told = "" if not pool["drivers"] else " The notebooks attached are told who stopped it."
        print(f"stopped {what}{how}; no process of it is left.{told}")
    return 0


def build_parser(command: str | None = "demo") -> argparse.ArgumentParser:
    """The parser; the demo's options (which import nbformat and nbclient, about a second) only when the
    command is ``demo`` (or unknown: None), so that ``workbench pools`` and the others answer fast."""
    parser = argparse.ArgumentParser(prog="workbench", description="distributed-workbench tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="run the quickstart (or the walkthroughs named) on a local CPU pool")
    if command in ("demo", None):
        from workbench.demo import add_arguments

        add_arguments(p)
    p.set_defaults(fn=demo)
    p = sub.add_parser("notebooks", help="copy the walkthrough notebooks into a folder to open")
    p.add_argument("dir", nargs="?", type=Path, default=Path("workbench-notebooks"), metavar="DIR",
                   help="where (default: ./workbench-notebooks); changed files are kept")
    p.set_defaults(fn=notebooks)
    p = sub.add_parser("pools", help="list this user's pools on this machine")
    p.add_argument("--json", action="store_true", help="one JSON list, for scripts")
    p.set_defaults(fn=pools)
    p = sub.add_parser("stop", help="stop pools the way the JupyterLab panel does")
    p.add_argument("pools", nargs="*", metavar="NAME|ID", help="the pools' names or ids")
    p.add_argument("--all", action="store_true", help="every pool of this user on this machine")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask first")
    p.set_defaults(fn=stop)
    p = sub.add_parser("stacks", help="every rank's stacks now, as the sidebar's Stacks shows them")
    p.add_argument("pool", metavar="NAME|ID", help="the pool's name or id")
    p.add_argument("--native", action="store_true", help="with native frames (py-spy)")
    p.set_defaults(fn=stacks)
    p = sub.add_parser("doctor", help="where the server and the kernel run, each piece's version, the "
                                      "allocation, and what to install where")
    p.set_defaults(fn=doctor)
    kernels = sub.add_parser("kernels", help="install or remove the workbench kernel specs")
    ksub = kernels.add_subparsers(dest="action", required=True)
    for action, fn, text in (("install", install, "install the kernel specs"),
                             ("uninstall", uninstall, "remove the kernel specs")):
        p = ksub.add_parser(action, help=text)
        where = p.add_mutually_exclusive_group()
        where.add_argument("--user", action="store_true", help="for this user (~/.local/share/jupyter)")
        where.add_argument("--sys-prefix", action="store_true",
                           help=f"for this Python environment ({sys.prefix}); the default")
        where.add_argument("--prefix", metavar="PATH", help="under PATH/share/jupyter/kernels")
        p.add_argument("names", nargs="*", metavar="NAME",
                       help=f"which specs (default: all of {', '.join(KERNEL_NAMES)})")
        p.set_defaults(fn=fn)
    p = ksub.add_parser("list-specs", help="show the kernel specs this package provides")
    p.set_defaults(fn=list_specs)
    return parser


def main(argv: list[str] | None = None) -> int:
    first = (sys.argv[1:] if argv is None else argv)[:1]
    parser = build_parser(first[0] if first and not first[0].startswith("-") else None)
    args = parser.parse_args(argv)
    unknown = [n for n in getattr(args, "names", None) or [] if n not in KERNEL_NAMES] \
        if args.command == "kernels" else []
    if unknown:
        parser.error(f"unknown kernel spec {unknown[0]!r}: choose from {', '.join(KERNEL_NAMES)}.")
    try:
        return args.fn(args)
    except (FileNotFoundError, PermissionError) as exc:
        print(f"workbench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("workbench: interrupted.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
