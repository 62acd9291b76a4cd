"""Argument parsing for the magics: pure functions, every mistake a ``UsageError`` naming the choices."""

from __future__ import annotations

import argparse
import shlex

from IPython.core.error import UsageError

from workbench.config import BACKENDS, LAUNCHERS

SUBCOMMANDS = ("start", "status", "stop", "restart", "scale", "check", "push", "pull", "auto", "attach",
               "stacks", "debug")


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing and exiting."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}\n{self.format_usage().strip()}")

    def exit(self, status=0, message=None):
        raise UsageError(message or self.format_help())


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value}): the pool needs one engine "
                                         "per rank")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds (got {value:g})")
    return value


def _dist_parser() -> _Parser:
    p = _Parser(prog="%dist", add_help=False, allow_abbrev=False,
                description="Start, inspect and stop the pool of ranks.")
    sub = p.add_subparsers(dest="command", parser_class=_Parser, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    start = sub.add_parser("start", prog="%dist start", add_help=False, allow_abbrev=False)
    start.add_argument("-n", type=_positive_int, default=None, help="number of ranks (default: GPUs, else 2)")
    start.add_argument("--launcher", choices=LAUNCHERS, default="local")
    start.add_argument("--backend", choices=BACKENDS, default="auto")
    start.add_argument("--timeout", type=_seconds, default=60.0)
    start.add_argument("--share-gpus", dest="share_gpus", action="store_true",
                       help="let more ranks than GPUs share them (over gloo) instead of refusing")
    # cluster launchers (see workbench.pool.launchers)
    start.add_argument("--nodes", type=_positive_int, default=None, help="Slurm: nodes to run engines on")
    start.add_argument("--gpus-per-node", dest="gpus_per_node", type=_positive_int, default=None,
                       help="one engine per GPU on every node or host, each pinned to its GPU")
    start.add_argument("--partition", default=None, help="Slurm partition")
    start.add_argument("--time", default=None, help="Slurm time limit, e.g. 30 or 2:00:00")
    start.add_argument("--account", default=None, help="Slurm account")
    start.add_argument("--hosts", default=None, help="ssh/mpi: hosts to start engines on, e.g. node1,node2")
    net = start.add_mutually_exclusive_group()
    net.add_argument("--interface", default=None,
                     help="network interface the engines reach this kernel on (default: loopback)")
    net.add_argument("--address", default=None, help="IP address to listen on instead of an interface name")
    start.add_argument("--name", default=None,
                       help="what to call the pool (default: made up from its id, e.g. pool-glad-heron)")
    start.add_argument("--idle-release", dest="idle_release", type=_seconds, default=None,
                       help="stop the pool (release its nodes) after this many idle seconds")
    start.add_argument("--oversubscribe", action="store_true",
                       help="start more local ranks than this machine holds (4 per core, ~330 MiB each)")
    sub.add_parser("status", prog="%dist status", add_help=False, allow_abbrev=False)
    stop = sub.add_parser("stop", prog="%dist stop", add_help=False, allow_abbrev=False)
    stop.add_argument("--all", dest="everyone", action="store_true",
                      help="stop the pool for every notebook attached to it, not only detach this one")
    sub.add_parser("restart", prog="%dist restart", add_help=False, allow_abbrev=False)
    scale = sub.add_parser("scale", prog="%dist scale", add_help=False, allow_abbrev=False)
    scale.add_argument("n", type=_positive_int, help="the new number of ranks")
    check = sub.add_parser("check", prog="%dist check", add_help=False, allow_abbrev=False)
    check.add_argument("--size-mb", dest="size_mb", type=_seconds, default=4.0,
                       help="all_reduce message size for the bandwidth figure")
    push = sub.add_parser("push", prog="%dist push", add_help=False, allow_abbrev=False)
    push.add_argument("names", nargs="+")
    push.add_argument("--ranks", default=None)
    pull = sub.add_parser("pull", prog="%dist pull", add_help=False, allow_abbrev=False)
    pull.add_argument("name")
    pull.add_argument("--rank", type=int, default=None)
    auto = sub.add_parser("auto", prog="%dist auto", add_help=False, allow_abbrev=False)
    auto.add_argument("mode", choices=("on", "off"))
    attach = sub.add_parser("attach", prog="%dist attach", add_help=False, allow_abbrev=False)
    attach.add_argument("pool", nargs="?", default=None, help="the pool's name or id")
    stacks = sub.add_parser("stacks", prog="%dist stacks", add_help=False, allow_abbrev=False)
    stacks.add_argument("--ranks", default=None, help="ranks to look at, e.g. 0,2-3 (default: all)")
    stacks.add_argument("--native", action="store_true",
                        help="native frames too (gloo, NCCL, C++), through py-spy where it can attach")
    debug = sub.add_parser("debug", prog="%dist debug", add_help=False, allow_abbrev=False)
    debug.add_argument("rank", type=int, help="the rank whose failed cell to look at")
    debug.add_argument("--frame", type=int, default=None, help="frame to evaluate in (default: innermost)")
    debug.add_argument("-e", dest="expr", default=None, help="an expression to evaluate in that frame")
    return p


def _cell_parser() -> _Parser:
    p = _Parser(prog="%%distributed", add_help=False, allow_abbrev=False)
    p.add_argument("--ranks", default=None, help="ranks to run on, e.g. 0,2-3 (default: all)")
    p.add_argument("--timeout", type=_seconds, default=None)
    p.add_argument("--quiet", action="store_true", help="show errors only, not the ranks' output")
    p.add_argument("--monitor", action="store_true", help="show the live dashboard even without a Trainer")
    p.add_argument("--async", dest="async_", action="store_true",
                   help="return at once; the cell's value is a handle with wait(), stop(), done()")
    return p


DIST_PARSER = _dist_parser()
CELL_PARSER = _cell_parser()


def parse_dist(line: str) -> argparse.Namespace:
    """Parse a ``%dist`` line.

    >>> parse_dist("start -n 4 --backend gloo").n
    4
    >>> a = parse_dist("start --launcher slurm --nodes 2 --gpus-per-node 4 --partition gpu --interface ib0")
    >>> a.nodes, a.gpus_per_node, a.partition, a.interface
    (2, 4, 'gpu', 'ib0')
    >>> parse_dist("scale 3").n
    3
    >>> parse_dist("start -n 64 --oversubscribe").oversubscribe
    True
    >>> a = parse_dist("debug 3 --frame 1 -e 'x.shape'")
    >>> a.rank, a.frame, a.expr
    (3, 1, 'x.shape')
    >>> parse_dist("launch")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    IPython.core.error.UsageError: %dist: argument ...: invalid choice: 'launch' ...
    """
    args = DIST_PARSER.parse_args(_split(line))
    if args.command is None:
        raise UsageError(f"%dist needs a command: one of {', '.join(SUBCOMMANDS)}.")
    return args


def parse_cell(line: str) -> argparse.Namespace:
    """Parse the options of a ``%%distributed`` cell.

    >>> parse_cell("--ranks 0,2-3 --quiet").ranks
    '0,2-3'
    """
    return CELL_PARSER.parse_args(_split(line))


def _split(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"cannot read the options {line!r}: {exc}") from None
