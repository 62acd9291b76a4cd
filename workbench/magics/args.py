"""Argument parsing for the magics: pure functions, every mistake a ``UsageError`` naming the choices."""

from __future__ import annotations

import argparse
import json
import shlex

from IPython.core.error import UsageError

from workbench.config import pool_options

SUBCOMMANDS = ("start", "status", "stop", "restart", "scale", "check", "push", "pull", "auto", "attach",
               "run", "stacks", "debug", "split", "join")


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


def _mapping(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, e.g. '{{\"ssh_args\": [\"-q\"]}}', "
                                         f"got {text!r}")
    return value


_TYPES = {"count": _positive_int, "seconds": _seconds, "text": str, "hosts": str, "mapping": _mapping}


def add_pool_options(parser: argparse.ArgumentParser) -> None:
    """One option per :class:`~workbench.config.PoolConfig` field (``%dist start``), made from its fields.

    An option not given takes the config's default (hosts and launcher options: ``None``, left out).

    >>> p = argparse.ArgumentParser(); add_pool_options(p)
    >>> p.parse_args(["--collective-timeout", "30", "--launcher-options", '{"delay": 0}']).launcher_options
    {'delay': 0}
    """
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for option in pool_options():
        where = parser
        if option.group is not None:
            if option.group not in groups:
                groups[option.group] = parser.add_mutually_exclusive_group()
            where = groups[option.group]
        default = None if option.kind in ("hosts", "mapping") else option.default
        kwargs: dict = {"dest": option.name, "help": option.help, "default": default}
        if option.kind == "switch":
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = _TYPES[option.kind]
            if option.choices:
                kwargs["choices"] = option.choices
        where.add_argument(option.flag, **kwargs)


def pool_config_options(args: argparse.Namespace) -> dict:
    """The :class:`~workbench.config.PoolConfig` keywords a ``%dist start`` line gave (nothing else).

    >>> sorted(pool_config_options(parse_dist("start -n 4 --hosts a,b --launcher ssh --keep")).items())[:5]
    [('address', '127.0.0.1'), ('backend', 'auto'), ('hosts', 'a,b'), ('keep', True), ('launcher', 'ssh')]
    """
    return {o.name: getattr(args, o.name) for o in pool_options() if getattr(args, o.name) is not None}


def _dist_parser() -> _Parser:
    p = _Parser(prog="%dist", add_help=False, allow_abbrev=False,
                description="Start, inspect and stop the pool of ranks.")
    sub = p.add_subparsers(dest="command", parser_class=_Parser, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    start = sub.add_parser("start", prog="%dist start", add_help=False, allow_abbrev=False)
    add_pool_options(start)
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
    push.add_argument("--on", default=None, help="the sub-mesh to push to (`%%dist split`)")
    pull = sub.add_parser("pull", prog="%dist pull", add_help=False, allow_abbrev=False)
    pull.add_argument("name")
    pull.add_argument("--rank", type=int, default=None)
    pull.add_argument("--on", default=None, help="the sub-mesh to pull from (`%%dist split`)")
    auto = sub.add_parser("auto", prog="%dist auto", add_help=False, allow_abbrev=False)
    auto.add_argument("mode", choices=("on", "off"))
    attach = sub.add_parser("attach", prog="%dist attach", add_help=False, allow_abbrev=False)
    attach.add_argument("pool", nargs="?", default=None, help="the pool's name or id")
    attach.add_argument("--on", default=None, help="the sub-mesh handed to this notebook (`%%dist split`)")
    run = sub.add_parser("run", prog="%dist run", add_help=False, allow_abbrev=False,
                         usage="%dist run script.py [--ranks R | --on SUBMESH] [--timeout S] [--quiet] "
                               "[-- args...]")
    run.add_argument("script", help="the script, as you would give it to torchrun")
    run.add_argument("--ranks", default=None, help="ranks to run on, e.g. 0,2-3 (default: all)")
    run.add_argument("--on", default=None, help="the sub-mesh to run on (`%%dist split`)")
    run.add_argument("--timeout", type=_seconds, default=None)
    run.add_argument("--quiet", action="store_true", help="show errors only, not the ranks' output")
    stacks = sub.add_parser("stacks", prog="%dist stacks", add_help=False, allow_abbrev=False)
    stacks.add_argument("--ranks", default=None, help="ranks to look at, e.g. 0,2-3 (default: all)")
    stacks.add_argument("--on", default=None, help="the sub-mesh to look at (`%%dist split`)")
    stacks.add_argument("--native", action="store_true",
                        help="native frames too (gloo, NCCL, C++), through py-spy where it can attach")
    debug = sub.add_parser("debug", prog="%dist debug", add_help=False, allow_abbrev=False)
    debug.add_argument("rank", type=int, help="the rank whose failed cell to look at")
    debug.add_argument("--frame", type=int, default=None, help="frame to evaluate in (default: innermost)")
    debug.add_argument("-e", dest="expr", default=None, help="an expression to evaluate in that frame")
    split = sub.add_parser("split", prog="%dist split", add_help=False, allow_abbrev=False,
                           usage="%dist split SIZE SIZE... [--names a,b,...]")
    split.add_argument("sizes", nargs="+", type=_positive_int, help="ranks of each sub-mesh, in rank order")
    split.add_argument("--names", default=None, help="their names, comma-separated (default m0,m1,...)")
    sub.add_parser("join", prog="%dist join", add_help=False, allow_abbrev=False)
    return p


def _cell_parser() -> _Parser:
    p = _Parser(prog="%%distributed", add_help=False, allow_abbrev=False)
    p.add_argument("--ranks", default=None, help="ranks to run on, e.g. 0,2-3 (default: all)")
    p.add_argument("--on", default=None, help="the sub-mesh to run on (`%%dist split`)")
    p.add_argument("--timeout", type=_seconds, default=None)
    p.add_argument("--quiet", action="store_true", help="show errors only, not the ranks' output")
    p.add_argument("--spread", dest="spread", action="store_true", default=None,
                   help="lines that differ only in numbers: one line with each number's range "
                        "(the default above 8 ranks)")
    p.add_argument("--no-spread", dest="spread", action="store_false", help="a line per rank instead")
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
    >>> a = parse_dist("run train.py --ranks 0,1 -- 10 --lr 0.1")
    >>> a.script, a.ranks, a.script_args
    ('train.py', '0,1', ['10', '--lr', '0.1'])
    >>> a = parse_dist("debug 3 --frame 1 -e 'x.shape'")
    >>> a.rank, a.frame, a.expr
    (3, 1, 'x.shape')
    >>> a = parse_dist("split 2 2 --names a,b")
    >>> a.sizes, a.names
    ([2, 2], 'a,b')
    >>> parse_dist("run train.py --on b").on
    'b'
    >>> parse_dist("launch")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    IPython.core.error.UsageError: %dist: argument ...: invalid choice: 'launch' ...
    """
    words = _split(line)
    script_args = []
    if words[:1] == ["run"] and "--" in words:  # the script's own arguments, as after torchrun's script
        cut = words.index("--")
        words, script_args = words[:cut], words[cut + 1:]
    args = DIST_PARSER.parse_args(words)
    args.script_args = script_args
    if args.command is None:
        raise UsageError(f"%dist needs a command: one of {', '.join(SUBCOMMANDS)}.")
    return args


def parse_cell(line: str) -> argparse.Namespace:
    """Parse the options of a ``%%distributed`` cell.

    >>> parse_cell("--ranks 0,2-3 --quiet").ranks
    '0,2-3'
    >>> parse_cell("--on a --async").on
    'a'
    >>> parse_cell("").spread, parse_cell("--spread").spread, parse_cell("--no-spread").spread
    (None, True, False)
    """
    return CELL_PARSER.parse_args(_split(line))


def _split(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"cannot read the options {line!r}: {exc}") from None
