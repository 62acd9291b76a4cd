"""The server's sentences as the panel says them, and a failure as the parts the panel shows.

The workbench words its errors once, for the magic (``--interface eth0``, ``-n 3``, ``%dist start -n 2``);
the panel's start dialog names the same options by their labels (``Interface``, ``Engines``). The server
says its sentences to the panel in the panel's words, with the table taken from
:func:`~workbench.config.pool_options` (each dialog field's flag, name and label: a field added to
:class:`~workbench.config.PoolConfig` is named right with no table kept by hand), and sends a failure as
parts, a :func:`problem`: what went wrong, the launcher's last lines, the log's path, what to do. The page
shows them as they come.
"""

from __future__ import annotations

import re
from typing import Any

from workbench.config import PoolOption, pool_options
from workbench.errors import PoolStartError

_OPTIONS = pool_options()
_DIALOG = [o for o in _OPTIONS if o.dialog is not None]
_BY_FLAG: dict[str, PoolOption] = {o.flag: o for o in _DIALOG}

# a Python class in front of a line ("PoolStartError: ...", "ipyparallel.error.TimeoutError: ...")
_CLASS = re.compile(r"^[ \t]*(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception):[ \t]*", re.M)
# what only code or the magics can do: the Python spelling, a magic to type
_CODE = re.compile(r" \(PoolConfig\([^)]*\)\)")
_MAGIC = re.compile(r":\s*`?%dist [^`.\n]*`?")


def _any(words) -> str:
    """A regex group matching any of ``words`` (the longest first)."""
    return "(" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + ")"


# a flag the dialog has no field for, offered as the other way ("--interface or --address")
_NOT_OFFERED = re.compile(r" or " + _any(o.flag for o in _OPTIONS if o.dialog is None) + r"(?![\w-])")
# a switch is a box in the dialog: ticked, not added
_ADD_SWITCH = re.compile(r"\badd " + _any(o.flag for o in _DIALOG if o.kind == "switch") + r"(?![\w-])")
# a field spelt as the config's messages spell it ("gpus-per-node must ...")
_SPELT = {o.name.replace("_", "-"): o for o in _DIALOG if "_" in o.name}
_SPELT_RE = re.compile(r"(^|[\s(;:,])" + _any(_SPELT) + r"\b")
# a field named as the code names it, where a sentence begins: "n must be at least 1"
_NAMED = {o.name: o for o in _DIALOG}
_NAMED_RE = re.compile(r"(^|[.;:]\s+)" + _any(_NAMED) + r"(?= (?:must|is|should)\b)")
# a flag of a dialog field, and the value after it
_FLAG = re.compile(r"(^|[\s(;:,])" + _any(_BY_FLAG) + r"(?![\w-])(?:[ =]([^\s(]+))?")
_VALUE_END = re.compile(r"^(.*?)([.,;:)]*)$")


def in_panel_words(text: str) -> str:
    """``text`` as the panel says it: no Python class in front, the dialog's field labels for the flags
    and names of its fields, what only code or the magic can do left out.

    >>> in_panel_words("-n 3 does not match 2 nodes x 4 GPUs = 8 engines: give one of them.")
    'Engines “3” does not match 2 nodes x 4 GPUs = 8 engines: give one of them.'
    >>> in_panel_words("--launcher ssh needs the hosts to start engines on: --hosts node1,node2.")
    'Launcher “ssh” needs the hosts to start engines on: Hosts “node1,node2”.'
    >>> in_panel_words("ValueError: n must be at least 1 (got 0).")
    'Engines must be at least 1 (got 0).'
    >>> in_panel_words("Start at most 8, or add --oversubscribe (PoolConfig(oversubscribe=True)) to start 9.")
    'Start at most 8, or tick Oversubscribe to start 9.'
    >>> in_panel_words("Check --interface or --address: it must name an address of this machine.")
    'Check Interface: it must name an address of this machine.'
    >>> in_panel_words("Run where `sbatch` is, or start a local pool: %dist start -n 2. All stopped.")
    'Run where `sbatch` is, or start a local pool. All stopped.'
    >>> in_panel_words("gpus-per-node must be at least 1 (got 0). --- engine 0 ---")
    'GPUs per node must be at least 1 (got 0). --- engine 0 ---'
    """
    text = _CLASS.sub("", text)
    text = _CODE.sub("", text)
    text = _NOT_OFFERED.sub("", text)
    text = _MAGIC.sub("", text)
    text = _ADD_SWITCH.sub(r"tick \1", text)
    text = _SPELT_RE.sub(lambda m: m[1] + _SPELT[m[2]].label, text)
    text = _NAMED_RE.sub(lambda m: m[1] + _NAMED[m[2]].label, text)
    return _FLAG.sub(_labelled, text)


def _labelled(m: re.Match) -> str:
    before, option, value = m[1], _BY_FLAG[m[2]], m[3]
    if option.kind == "switch":  # it takes no value: the word after it is the sentence's
        return f"{before}{option.label}{'' if value is None else ' ' + value}"
    bare, tail = _VALUE_END.match(value or "").groups()  # "--hosts a,b." -> Hosts “a,b”.
    return f"{before}{option.label} “{bare}”{tail}" if bare else f"{before}{option.label}{tail}"


def problem(error: BaseException | str) -> dict[str, Any]:
    """What the panel shows of a failure, in its words: ``what`` went wrong, the launcher's last lines
    (``tail``, as the launcher said them), the ``log``'s path and what to do (``todo``).

    >>> from workbench.pool.launch.start_errors import start_error
    >>> problem(start_error("only 0 of 2 engines registered within 0.5 s", "Try a longer --timeout.",
    ...                     log=None, output="no slots"))  # doctest: +NORMALIZE_WHITESPACE
    {'what': 'only 0 of 2 engines registered within 0.5 s:', 'tail': ['no slots'], 'log': None,
     'todo': 'Try a longer Start timeout. Every process started for the pool has been stopped.'}
    >>> problem(ValueError("time 'soon' is not a Slurm time limit."))["what"]
    "time 'soon' is not a Slurm time limit."
    """
    parts = error if isinstance(error, PoolStartError) else PoolStartError(str(error))
    return {"what": in_panel_words(parts.what), "tail": list(parts.tail), "log": parts.log,
            "todo": in_panel_words(parts.todo)}
