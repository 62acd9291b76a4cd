"""A dashboard view that a page polls instead of a widget: what the Jupyter server's docked dashboard uses.

:class:`workbench.widgets.live_dashboard.Dashboard` pushes to it exactly as to the notebook's widget
(traits set, ``{"extend": ...}`` messages); it numbers each change, so a page that asks "what came
since N" gets only the new points, or the whole figure when it is behind (it just opened, the figure
was rebuilt, or too much came since). Pure: no widgets, no server, no network.

>>> view = PolledView()
>>> view.figure = {"data": [{"x": [1], "y": [0.9]}], "layout": {}}
>>> view.send({"extend": {"indices": [0], "x": [[2]], "y": [[0.7]]}})
>>> first = view.since(0, "")                       # a page that has nothing yet: the whole figure
>>> first["figure"]["data"][0]["y"], first["extend"], first["seq"]
([0.9, 0.7], [], 2)
>>> view.send({"extend": {"indices": [0], "x": [[3]], "y": [[0.6]]}})
>>> later = view.since(first["seq"], first["view"])  # then only what came since
>>> "figure" in later, later["extend"]
(False, [{'indices': [0], 'x': [[3]], 'y': [[0.6]]}])
"""

from __future__ import annotations

import collections
import contextlib
import copy
import threading
import uuid

TEXTS = ("header", "note", "devices", "bars")
# Point messages kept for pages that are behind; a page further behind gets the whole figure.
KEEP_MESSAGES = 600


class PolledView:
    """The texts, the figure (with every point sent since it was set) and the numbered point messages."""

    def __init__(self):
        self.uid = uuid.uuid4().hex  # a new view (a new run): the page starts over
        self.header = self.note = self.devices = self.bars = ""
        self.closed = False  # its run ended: the page keeps the last picture
        self._figure: dict = {}
        self._seq = 0  # numbers every figure and every point message
        self._figure_seq = 0
        self._messages: collections.deque = collections.deque(maxlen=KEEP_MESSAGES)  # (seq, extend)
        self._lock = threading.Lock()

    @property
    def figure(self) -> dict:
        return self._figure

    @figure.setter
    def figure(self, value: dict) -> None:
        with self._lock:
            self._figure = copy.deepcopy(value)
            self._seq += 1
            self._figure_seq = self._seq
            self._messages.clear()

    def send(self, msg: dict) -> None:
        """A point message (``{"extend": {"indices", "x", "y"}}``): kept, its points added to the figure."""
        ext = msg.get("extend")
        if not ext:
            return
        with self._lock:
            data = self._figure.get("data", [])
            for k, i in enumerate(ext["indices"]):
                data[i]["x"] = [*data[i]["x"], *ext["x"][k]]
                data[i]["y"] = [*data[i]["y"], *ext["y"][k]]
            self._seq += 1
            self._messages.append((self._seq, copy.deepcopy(ext)))

    @contextlib.contextmanager
    def hold_sync(self):
        yield  # nothing is sent from here: the page asks

    def close(self) -> None:
        self.closed = True

    def since(self, seq: int, view: str) -> dict:
        """What a page that has seen up to ``seq`` of view ``view`` needs: texts, and the new points or
        the whole figure (``"figure"`` present only then)."""
        with self._lock:
            out = {"view": self.uid, "seq": self._seq, "live": not self.closed, "extend": [],
                   **{name: getattr(self, name) for name in TEXTS}}
            oldest = self._messages[0][0] if self._messages else self._seq + 1
            behind = view != self.uid or seq < self._figure_seq or seq + 1 < oldest
            if behind or seq > self._seq:
                out["figure"] = copy.deepcopy(self._figure)
            else:
                out["extend"] = [copy.deepcopy(ext) for s, ext in self._messages if s > seq]
            return out
