"""Which ranks a cell was sent to, as a rank can see it.

The kernel labels each cell's execute request with its target ranks (ipyparallel's ``label``, an
identifier of the task that travels in the request's metadata); code running on a rank reads the label
of the request it runs in (:func:`current_cell`). A rank learns this way, with no message of its own,
that a cell runs on some ranks only: a ``Trainer.run`` there refuses at once instead of waiting in a
collective for ranks that never come.

Imports nothing of the package (the kernel writes labels, the engines read them).

>>> label = cell_label([0, 2], world_size=4)
>>> label
'workbench cell: {"ranks": [0, 2], "world_size": 4}'
>>> parse_label(label)
([0, 2], 4)
>>> parse_label("someone's own task") is None, parse_label(None) is None
(True, True)
"""

from __future__ import annotations

import json

PREFIX = "workbench cell: "


def cell_label(ranks: list[int], world_size: int) -> str:
    """The label of a cell sent to ``ranks`` of a pool of ``world_size`` ranks."""
    return PREFIX + json.dumps({"ranks": sorted(ranks), "world_size": world_size})


def parse_label(label) -> tuple[list[int], int] | None:
    """``(ranks, world_size)`` from a label :func:`cell_label` wrote; None for any other label."""
    if not isinstance(label, str) or not label.startswith(PREFIX):
        return None
    try:
        found = json.loads(label[len(PREFIX):])
        return [int(r) for r in found["ranks"]], int(found["world_size"])
    except (ValueError, KeyError, TypeError):
        return None


# On a rank: the label of the cell it runs now when the cell came as a call (a pool whose hosts have hubs
# runs a cell through one broadcast call, whose request carries no label of ipyparallel's): set around it.
running: list[str] = []


def current_cell() -> tuple[list[int], int] | None:
    """On a rank: ``(ranks, world_size)`` of the cell it runs now; None outside a labelled cell (a call
    through ``Session.apply``, a replay of the notebook's setup, plain Python)."""
    if running:
        return parse_label(running[-1])
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        return None
    parent = kernel.get_parent("shell") or {}
    return parse_label((parent.get("metadata") or {}).get("label"))
