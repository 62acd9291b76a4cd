"""``workbench`` command line: install and remove the workbench kernel specs.

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description="distributed-workbench tools.")
    sub = parser.add_subparsers(dest="command", required=True)
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
    parser = build_parser()
    args = parser.parse_args(argv)
    unknown = [n for n in getattr(args, "names", None) or [] if n not in KERNEL_NAMES]
    if unknown:
        parser.error(f"unknown kernel spec {unknown[0]!r}: choose from {', '.join(KERNEL_NAMES)}.")
    try:
        return args.fn(args)
    except (FileNotFoundError, PermissionError) as exc:
        print(f"workbench: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
