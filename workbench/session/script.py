"""A torchrun script run on the ranks (``%dist run script.py -- args``), seen from the kernel.

The kernel reads the script only to find a syntax error before anything is sent; the ranks run it
(:func:`workbench.remote.run_script`, called in a cell the kernel watches through the door's one way of
doing so, :meth:`workbench.remote.door.Door.cell`), so its output streams and its failures are reported as
a cell's are.
"""

from __future__ import annotations

import ast
import os


def check_script(path: str, local: bool) -> None:
    """Before anything is sent: a script this kernel can read must compile (a ``SyntaxError`` here, not
    on every rank), and a local pool's script must exist (the ranks work in the notebook's folder).

    >>> check_script("/no/such/train.py", local=True)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    FileNotFoundError: /no/such/train.py: no such file (the notebook's folder is ...).
    """
    if not path.endswith(".py"):
        raise ValueError(f"{path}: `%dist run` runs a Python script (a .py file), as torchrun does.")
    if not os.path.isfile(path):
        if local:
            raise FileNotFoundError(f"{path}: no such file (the notebook's folder is {os.getcwd()}; a "
                                    "local pool's ranks work there too).")
        return  # the ranks of another host may have it: they say so if not
    with open(path, "rb") as f:
        compile(f.read(), os.path.abspath(path), "exec")


def check_cell(code: str) -> None:
    """Before a cell is sent: a ``SyntaxError`` here, in the kernel, not one on every rank (and no fault).
    IPython's own syntax (``%run``, ``!ls``) is read as the ranks' shell reads it.

    >>> check_cell("%run train.py 2 1\\nx = 1")
    >>> check_cell("def f(:\\n    pass")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    SyntaxError: invalid syntax
    """
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:  # plain Python, the usual cell: IPython's transforms would leave it as it is (0.6 ms saved a cell)
        compile(code, "<cell>", "exec", flags=flags, dont_inherit=True)
        return
    except SyntaxError:
        pass
    from IPython.core.inputtransformer2 import TransformerManager

    python = TransformerManager().transform_cell(code)
    compile(python, "<cell>", "exec", flags=flags, dont_inherit=True)
