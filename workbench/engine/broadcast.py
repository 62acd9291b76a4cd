"""A call the kernel sends every rank at once as one broadcast request, whose replies come back as one.

ipyparallel's coalescing ``BroadcastView`` gathers the ranks' replies in its scheduler tree and hands the
kernel their results only: a rank's exception would not come back as its own. So each rank's part is wrapped
(:func:`guarded`): its result, or how it failed (the name, value and IPython's traceback, formatted here as
ipyparallel formats an apply's), which the kernel's door raises as ipyparallel would
(:meth:`workbench.remote.door.Door.call`).

>>> guarded(divmod, (7, 2), {})
(True, (3, 1))
>>> ok, (ename, evalue, _) = guarded(divmod, (7, 0), {}); ok, ename, evalue
(False, 'ZeroDivisionError', 'integer division or modulo by zero')
"""

from __future__ import annotations

import traceback


def guarded(fn, args: tuple, kwargs: dict) -> tuple[bool, object]:
    """``(True, fn(*args, **kwargs))``, or ``(False, (ename, evalue, traceback text))`` if it raised."""
    try:
        return True, fn(*args, **kwargs)
    except BaseException as exc:
        return False, (type(exc).__name__, _text(exc), _traceback(exc))


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as failed:
        return f"<str() of {type(exc).__name__} failed: {failed}>"


def _traceback(exc: BaseException) -> str:
    """IPython's traceback of ``exc``, as ipyparallel sends an apply's (``shell.showtraceback``: it also keeps
    the frames for ``%dist debug``); plain Python's outside an engine."""
    try:
        from ipykernel.zmqshell import ZMQInteractiveShell
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    # an engine's (kernel) shell only: a terminal IPython's showtraceback would print it, keeping nothing
    if shell is not None and isinstance(shell, ZMQInteractiveShell):
        try:
            before = getattr(shell, "_last_traceback", None)  # ipykernel keeps the one it showed last
            shell.showtraceback()
            lines = getattr(shell, "_last_traceback", None)
            if lines and lines is not before:
                return "\n".join(lines)
        except Exception:
            pass
    return "".join(traceback.format_exception(exc))
