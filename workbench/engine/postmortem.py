"""The frames of the last failed cell on this rank, with their locals, until the next cell.

When a cell raises, IPython keeps the traceback in ``sys.last_traceback`` (and with it every frame
and its locals). :func:`forget_on_next_cell` clears it when the next cell starts, so what
:func:`frames` shows is always the failure of the last cell, never an older one.

Values are shown short: a tensor as its shape, dtype, device and first few values, anything else as
its repr cut to :data:`MAX_REPR` characters. Runs on the engines; imports no torch (a tensor is known
by its attributes).

>>> value_text(list(range(100)))[:20]
'[0, 1, 2, 3, 4, 5, 6'
>>> len(value_text("x" * 1000)) <= MAX_REPR + 1
True
"""

from __future__ import annotations

import linecache
import sys
import types

from workbench.engine.stacks import cell_line, short_path

MAX_REPR = 160
MAX_LOCALS = 30  # per frame; the cell's own frame holds the whole namespace
FEW_VALUES = 4
_HIDDEN = frozenset({"In", "Out", "exit", "quit", "get_ipython", "rank", "local_rank", "world_size",
                     "device", "dist"})
_hooked: set[int] = set()


def forget_on_next_cell() -> None:
    """Clear the last failure's frames when the next cell starts on this engine (once per shell)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or id(shell) in _hooked:
        return
    shell.events.register("pre_run_cell", _forget)
    _hooked.add(id(shell))


def _forget(*_info) -> None:
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)


def value_text(value) -> str:
    """A short, safe description of ``value`` (a failing ``__repr__`` is named, not raised)."""
    if all(hasattr(value, a) for a in ("shape", "dtype", "device")) and hasattr(value, "flatten"):
        try:
            few = value.detach().flatten()[:FEW_VALUES].tolist()
            more = ", ..." if value.numel() > FEW_VALUES else ""
            values = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in few)
            return (f"{type(value).__name__}(shape={tuple(value.shape)}, dtype={value.dtype}, "
                    f"device={value.device}) [{values}{more}]")
        except Exception:
            pass
    try:
        text = repr(value)
    except Exception as exc:
        return f"<{type(value).__name__}: repr failed with {type(exc).__name__}>"
    return text if len(text) <= MAX_REPR else text[:MAX_REPR] + "…"


def _shown(name: str, value) -> bool:
    return not (name.startswith("_") or name in _HIDDEN or isinstance(value, (types.ModuleType, type))
                or callable(value))


def _user_frames(tb) -> list[tuple[types.FrameType, int]]:
    """The traceback's frames from the outermost cell frame inward (IPython's own frames left out)."""
    frames = []
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    first = next((i for i, (f, _) in enumerate(frames) if cell_line(f.f_code.co_filename)), 0)
    return frames[first:]


def frames() -> dict | None:
    """The last failed cell's frames, outermost first, each with its locals; None when the last cell
    on this rank did not fail (or no cell failed yet)."""
    tb = getattr(sys, "last_traceback", None)
    if tb is None:
        return None
    exc = getattr(sys, "last_value", None)
    out = []
    for frame, line in _user_frames(tb):
        filename = frame.f_code.co_filename
        names = [(k, v) for k, v in frame.f_locals.items() if _shown(k, v)]
        if frame.f_locals is frame.f_globals:  # a cell's own frame: the names it uses, not the namespace
            names = [(k, v) for k, v in names if k in frame.f_code.co_names]
        out.append({"name": frame.f_code.co_name, "line": line,
                    "where": f"cell line {line}" if cell_line(filename) else f"{short_path(filename)}:{line}",
                    "text": linecache.getline(filename, line).strip()[:MAX_REPR],
                    "locals": {k: value_text(v) for k, v in names[:MAX_LOCALS]},
                    "more": max(0, len(names) - MAX_LOCALS)})
    return {"error": f"{type(exc).__name__}: {exc}" if exc is not None else "", "frames": out}


def evaluate(expr: str, frame: int | None = None) -> dict:
    """``expr`` evaluated in frame ``frame`` (default: the innermost) of the last failed cell:
    ``{"value": text}``, or ``{"error": text}`` when it raised or there is no such frame."""
    tb = getattr(sys, "last_traceback", None)
    if tb is None:
        return {"error": "no failed cell on this rank (its frames are kept only until the next cell)"}
    found = _user_frames(tb)
    index = len(found) - 1 if frame is None else frame
    if not 0 <= index < len(found):
        return {"error": f"no frame {frame}: the failed cell has frames 0-{len(found) - 1}"}
    target = found[index][0]
    try:
        value = eval(compile(expr, "<dist debug>", "eval"), target.f_globals, target.f_locals)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"value": value_text(value), "frame": index}
