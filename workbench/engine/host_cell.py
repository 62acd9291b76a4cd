"""A cell on this rank when its host has a hub: run in the engine's shell as ipyparallel's ``execute`` runs
one, its output and its end sent to the host's hub instead of to ipyparallel's iopub.

The kernel sends a cell to every rank as one broadcast call (:func:`workbench.remote.run_cell`); each rank
runs it here with ``shell.run_cell`` (the user's namespace, history, tracebacks and ``%dist debug``'s frames
as with ``execute``), and says to its hub, in signed records of :data:`workbench.wire.CELL_RECORD`:

- ``start``: the ranks of its host the cell runs on (the hub waits for their ends), and how to merge lines;
- ``out``: its printed text as the engine's output streams flush it (a hook in the streams' I/O thread takes
  the messages of this cell instead of ipyparallel's iopub: what C code writes to the file descriptors too);
- ``display``: a display it made (a hook in the display publisher);
- ``done``: how the cell ended: ``ok`` or ``error`` with the exception's name, value and IPython's
  traceback, the last expression's value as a display bundle, when it started and ended.

The hub merges the host's ranks' lines and sends the kernel one message for many
(:mod:`workbench.pool.processes.host_hub`). The last few ends are kept here (:func:`ended`): the kernel asks
for one whose record its hub never sent (a hub that was restarted).

Runs on the engines: imports no IPython display machinery beyond the shell's own.
"""

from __future__ import annotations

import collections
import json
import sys
import threading
import time
import traceback

from workbench import cell_targets, wire
from workbench.engine import hub_link

# Characters of printed text per record (a larger record goes in parts, wire.split: fewer is better).
TEXT_PART = 8_000
# A traceback is cut in the middle past this many characters (its first and last frames kept).
TRACEBACK_CHARS = 24_000
KEPT_ENDS = 8  # ends kept for the kernel to ask again

_link: _Link | None = None
_cell: dict | None = None  # the cell running now: {"id", "rank", "msg_id"}
_hooked: set[int] = set()  # ids of the streams and display publishers our hooks sit in
_ends: collections.OrderedDict = collections.OrderedDict()  # cell id -> this rank's end record


class _Link:
    """A PUSH socket to the hub, shared by the main thread (starts, displays, ends) and the output streams'
    I/O thread (their text), one send at a time: the text a cell printed before it ended is sent before its
    end (the streams are flushed, in their thread, before the end goes)."""

    def __init__(self, channel: dict):
        import zmq

        self.channel = channel
        self.signer = wire.Signer(channel["key"])
        self._ctx = zmq.Context()
        self._sock = wire.pusher(self._ctx, channel["up"], hwm=10_000)
        self._lock = threading.Lock()

    def send(self, record: dict) -> bool:
        import zmq

        bodies = wire.split(json.dumps(record).encode())  # a large display or traceback: in parts
        with self._lock:
            try:
                for body in bodies:
                    self._sock.send_multipart(self.signer.pack(wire.CELL_RECORD, body), zmq.NOBLOCK)
                return True
            except zmq.Again:  # the hub is not taking messages (gone): the kernel asks for the end itself
                return False

    def close(self) -> None:
        with self._lock:
            self._sock.close(0)
            self._ctx.term()


def _link_to(channel: dict) -> _Link:
    global _link
    mine = hub_link.via_hub(channel)
    if _link is None or _link.channel != mine:
        if _link is not None:
            _link.close()
        _link = _Link(mine)
    return _link


def run(code: str, plan: dict) -> None:
    """Run ``code`` as this rank's part of the cell ``plan`` describes (``cell``: its id, ``ranks``: engine
    id -> rank, ``hubs``: each hub's ranks of the cell, ``label``, ``spread``, ``hold``, ``channel``). Never
    raises: how the cell ended goes to the hub (and is kept, :func:`ended`)."""
    from IPython import get_ipython

    global _cell
    shell = get_ipython()
    kernel = shell.kernel
    rank = int(plan["ranks"][kernel.engine_id])
    link = _link_to(plan["channel"])
    cell_id = plan["cell"]
    _hook(shell)
    msg_id = (kernel.get_parent("shell") or {}).get("header", {}).get("msg_id")
    started = time.time()
    link.send({"cell": cell_id, "rank": rank, "kind": "start",
               "expect": plan["hubs"].get(hub_link.label(), [rank]), "spread": bool(plan.get("spread")),
               "hold": float(plan.get("hold", 0.1))})
    _cell = {"id": cell_id, "rank": rank, "msg_id": msg_id, "link": link}
    cell_targets.running.append(plan.get("label") or "")
    shown = getattr(shell, "_last_traceback", None)  # ipykernel's last traceback: a new one is this cell's
    result, outside = None, None
    try:
        try:
            result = shell.run_cell(code, store_history=True, silent=False)
        except BaseException as exc:  # a KeyboardInterrupt that came just before or after the user's code
            outside = exc
        end = _end(shell, result, outside, cell_id, rank, started, shown)
    finally:
        cell_targets.running.pop()
        _flush_streams()  # its last text goes (in the streams' thread) while the cell is still ours
        _cell = None
    _keep(cell_id, end)
    while True:  # a Ctrl-C of the ladder must not lose the end: the kernel waits for it
        try:
            link.send(end)
            return
        except KeyboardInterrupt:
            continue


def ended(cell_id: str) -> dict | None:
    """This rank's end record of cell ``cell_id`` if it is one of the last few (None: not here)."""
    return _ends.get(cell_id)


def _keep(cell_id: str, end: dict) -> None:
    _ends[cell_id] = end
    while len(_ends) > KEPT_ENDS:
        _ends.popitem(last=False)


def _end(shell, result, outside: BaseException | None, cell_id: str, rank: int, started: float,
         shown_before) -> dict:
    """The ``done`` record: how the cell ended on this rank (``shown_before``: ipykernel's last traceback
    before the cell; the one it keeps now, if another, is the cell's, as IPython formatted it)."""
    end = {"cell": cell_id, "rank": rank, "kind": "done", "started": started, "completed": time.time(),
           "status": "ok", "result": None}
    error = outside if outside is not None else (
        (result.error_before_exec or result.error_in_exec) if result is not None else None)
    if error is not None:
        shown = getattr(shell, "_last_traceback", None)
        # IPython's, as it showed it; where it showed none (its formatting cut short by the ladder's Ctrl-C,
        # an error outside the user's code), Python's: its frames say where it was raised (results'
        # raised_in_collective reads them: a collective's echo is not a rank's own error)
        lines = shown if shown and shown is not shown_before else \
            [line.rstrip("\n") for line in traceback.format_exception(error)]
        end.update(status="error", ename=type(error).__name__, evalue=_text(error), traceback=_cut(lines))
    elif result is not None and result.result is not None:
        try:
            data, _ = shell.display_formatter.format(result.result)
            end["result"] = data
        except Exception as exc:  # a __repr__ that raises: say so, as IPython would have shown it
            end["result"] = {"text/plain": f"<{type(exc).__name__} in repr: {exc}>"}
    return end


def _text(error: BaseException) -> str:
    try:
        return str(error)
    except Exception as exc:
        return f"<str() of {type(error).__name__} failed: {exc}>"


def _cut(lines: list[str]) -> list[str]:
    """A traceback within :data:`TRACEBACK_CHARS`: its middle frames left out where it is longer."""
    if sum(len(line) for line in lines) <= TRACEBACK_CHARS:
        return list(lines)
    head, tail, size = [], [], 0
    for a, b in zip(lines, reversed(lines), strict=True):
        if size + len(a) + len(b) > TRACEBACK_CHARS:
            break
        head.append(a)
        tail.append(b)
        size += len(a) + len(b)
    return [*head, f"... ({len(lines) - len(head) - len(tail)} frames not shown) ...", *reversed(tail)]


def _hook(shell) -> None:
    """Our hooks in the output streams (in their I/O thread: ipykernel keeps a stream's hooks per thread, and
    the thread that flushes is the one that runs them) and in the display publisher (per thread too: the
    main thread's, where cells display). Once per engine; they pass on every message of any other request."""
    for stream in (sys.stdout, sys.stderr):
        if id(stream) in _hooked or not hasattr(stream, "register_hook") or getattr(stream, "pub_thread",
                                                                                    None) is None:
            continue
        _hooked.add(id(stream))
        stream.pub_thread.schedule(lambda s=stream: s.register_hook(_stream_hook))
        stream.flush()  # returns once the I/O thread ran what was scheduled before: the hook is in
    publisher = shell.display_pub
    if id(publisher) not in _hooked and hasattr(publisher, "register_hook"):
        _hooked.add(id(publisher))
        publisher.register_hook(_display_hook)


def _ours(msg: dict) -> dict | None:
    cell = _cell
    if cell is None or (msg.get("parent_header") or {}).get("msg_id") != cell["msg_id"]:
        return None
    return cell


def _stream_hook(msg: dict) -> dict | None:
    """In the streams' I/O thread: the cell's printed text goes to the hub, not to ipyparallel's iopub."""
    cell = _ours(msg)
    if cell is None:
        return msg
    content = msg["content"]
    text, name = content.get("text", ""), content.get("name", "stdout")
    for i in range(0, len(text), TEXT_PART):
        cell["link"].send({"cell": cell["id"], "rank": cell["rank"], "kind": "out", "stream": name,
                           "text": text[i:i + TEXT_PART]})
    return None


def _display_hook(msg: dict) -> dict | None:
    """A display the cell made goes to the hub (an update of one too)."""
    cell = _ours(msg)
    if cell is None or msg["header"]["msg_type"] not in ("display_data", "update_display_data"):
        return msg
    cell["link"].send({"cell": cell["id"], "rank": cell["rank"], "kind": "display",
                       "content": msg["content"]})
    return None


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a stream that cannot flush loses its last text, never the end record
            pass
