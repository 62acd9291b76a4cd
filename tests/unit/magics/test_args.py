import pytest
from IPython.core.error import UsageError

from workbench.magics.args import parse_cell, parse_dist


def test_start_defaults():
    args = parse_dist("start")
    assert (args.command, args.n, args.launcher, args.backend, args.timeout) == (
        "start", None, "local", "auto", 60.0)


def test_start_options():
    args = parse_dist("start -n 4 --backend gloo --timeout 7.5")
    assert (args.n, args.backend, args.timeout) == (4, "gloo", 7.5)
    assert not args.share_gpus and parse_dist("start -n 4 --share-gpus").share_gpus


@pytest.mark.parametrize(
    "line, expected",
    [
        ("start -n 0", "at least 1"),
        ("start -n two", "whole number"),
        ("start --backend mpi", "choose from"),
        ("start --launcher yarn", "choose from"),
        ("start --timeout -3", "positive"),
        ("start --frobnicate", "unrecognized arguments"),
        ("", "needs a command"),
        ("launch", "invalid choice"),
        ("auto maybe", "choose from"),
        ("push", "required"),
        ("pull x --rank one", "invalid int"),
    ],
)
def test_mistakes_are_usage_errors(line, expected):
    with pytest.raises(UsageError, match=expected):
        parse_dist(line)


def test_cell_options():
    args = parse_cell("--ranks 0,2-3 --timeout 5 --quiet")
    assert (args.ranks, args.timeout, args.quiet) == ("0,2-3", 5.0, True)
    with pytest.raises(UsageError, match="unrecognized"):
        parse_cell("--rank 1")
    with pytest.raises(UsageError, match="cannot read"):
        parse_cell("--ranks '0")
