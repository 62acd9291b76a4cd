"""A cell's output, bounded: the first and last lines of each rank, the whole of it in a log.

ipyparallel keeps every rank's whole output of a cell in memory as one string it extends with each message
(200,000 lines per rank grew the kernel by 370 MB and put 12 MB into the notebook). Here each message's
text is taken as it comes into a :class:`CellOutput` (in the kernel from ipyparallel, its copy emptied; on a
host with a hub, in the hub, :mod:`workbench.pool.processes.host_hub`, which keeps its ranks'): a rank's
stream is kept whole while it is short; past :data:`HEAD_LINES` lines the rest is not shown live, only
its last :data:`TAIL_LINES` lines are kept (shown when the cell ends), and once lines would be dropped the
whole output of the cell, every rank's, goes to a log file (``output-<pool>-<time>.log`` beside the
pool's log) that the cell's last lines name.

>>> import tempfile; out = CellOutput(log_dir=Path(tempfile.mkdtemp()), head=2, tail=1)
>>> out.feed(0, "stdout", "a\\nb\\nc\\nd\\n")
>>> out.drain()
[(0, 'stdout', 'a\\nb\\n')]
>>> out.close()[0][2].startswith("… 1 line not shown; the cell's whole output is in ")
True
>>> out.text(0, "stdout").splitlines()[-1]
'd'
"""

from __future__ import annotations

import collections
import os
import threading
import time
from pathlib import Path

HEAD_LINES = 200  # per rank and stream: shown as they come, kept
TAIL_LINES = 50  # per rank and stream: the last ones, shown at the end
HEAD_CHARS = 256 * 1024  # a head of few but very long lines ends here too
LINE_CHARS = 10_000  # a kept tail line is cut here (the log has all of it)
KEEP_LOGS = 20  # output logs kept (the newest)


class _Stream:
    """One rank's stdout or stderr in one cell."""

    def __init__(self, tail: int):
        self.head: list[str] = []  # text, shown and kept whole
        self.head_lines = self.head_chars = 0
        self.tail: collections.deque[str] = collections.deque(maxlen=tail)  # complete lines past the head
        self.partial = ""  # an unfinished line past the head
        self.hidden = 0  # lines past the head, not shown live (the tail's among them)
        self.over = False
        self.cut = False  # a kept tail line was cut at LINE_CHARS
        self.unsent: list[str] = []  # head text not yet handed to the display
        self.log_partial = ""  # an unfinished line, written to the log once it is whole (or at the end)

    def text(self, notice: str) -> str:
        if not self.over:
            return "".join(self.head)
        return "".join(self.head) + (notice if self.dropped or self.cut else "") + "".join(self.tail) + \
            self.partial

    @property
    def dropped(self) -> int:
        """Lines past the head that are in the log only."""
        return self.hidden - len(self.tail)


class CellOutput:
    """Every rank's stdout and stderr of one cell, bounded; thread-safe (ipyparallel's IO thread
    feeds it, the kernel's main thread drains it).

    ``log_dir``: where the log of an output that outgrew the bound goes (None: beside the pools' logs, in
    the workbench's state folder; looked up only when a log is needed).
    """

    def __init__(self, *, log_dir: Path | None, pool_id: str | None = None,
                 head: int = HEAD_LINES, tail: int = TAIL_LINES, head_chars: int = HEAD_CHARS):
        self.head_max, self.head_chars_max = head, head_chars
        self.tail_max = tail
        self.streams: dict[tuple[int, str], _Stream] = {}  # made as ranks print (a quiet cell makes none)
        self.log_dir, self.pool_id = log_dir, pool_id
        self.log_path: Path | None = None
        self._log = None
        self._closed = False  # the cell ended: a late message is kept, no new log opened
        self._lock = threading.Lock()

    def feed(self, rank: int, kind: str, text: str) -> None:
        """Take ``text`` that ``rank`` wrote to ``kind`` (``stdout``/``stderr``)."""
        if not text:
            return
        with self._lock:
            st = self.streams.get((rank, kind))
            if st is None:
                st = self.streams[(rank, kind)] = _Stream(self.tail_max)
            if self._log is not None:
                self._write(rank, kind, text)
            if not st.over:
                room = self._room(st, text)
                shown, text = text[:room], text[room:]
                if shown:
                    st.head.append(shown)
                    st.unsent.append(shown)
                    st.head_lines += shown.count("\n")
                    st.head_chars += len(shown)
                if not text:
                    return
                st.over = True
            complete = (st.partial + text).count("\n")
            dropping = len(st.tail) + complete > st.tail.maxlen or len(st.partial) + len(text) > LINE_CHARS
            if self._log is None and not self._closed and dropping:
                self._open_log()  # lines (or their ends) are about to be dropped: the log gets everything
                self._write(rank, kind, text)
            lines = (st.partial + text).split("\n")
            st.cut = st.cut or any(len(line) > LINE_CHARS for line in lines[-st.tail.maxlen:]) \
                or len(lines[-1]) > LINE_CHARS
            st.partial = lines.pop()[:LINE_CHARS]
            st.hidden += len(lines)
            st.tail.extend(line[:LINE_CHARS] + "\n" for line in lines)

    def _room(self, st: _Stream, text: str) -> int:
        """How much of ``text`` still fits in the head (it ends at the line that fills it)."""
        lines_left = self.head_max - st.head_lines
        chars_left = self.head_chars_max - st.head_chars
        if text.count("\n") < lines_left and len(text) <= chars_left:
            return len(text)
        end, pos = 0, 0
        for _ in range(max(0, lines_left)):
            pos = text.find("\n", end)
            if pos < 0 or pos + 1 > chars_left:
                break
            end = pos + 1
        return end

    def drain(self) -> list[tuple[int, str, str]]:
        """What to show now: ``[(rank, kind, text)]`` of the head text that came since the last drain."""
        out = []
        with self._lock:
            for (rank, kind), st in self.streams.items():
                if st.unsent:
                    out.append((rank, kind, "".join(st.unsent)))
                    st.unsent.clear()
        return out

    def close(self) -> list[tuple[int, str, str]]:
        """The cell ended: what is left to show (each bounded stream's count of hidden lines, naming the
        log, then its last lines); the log is closed."""
        out = self.drain()
        with self._lock:
            for (rank, kind), st in self.streams.items():
                if st.over:
                    notice = self.notice(st) if st.dropped or st.cut else ""
                    out.append((rank, kind, notice + "".join(st.tail) + st.partial))
            self._closed = True
            if self._log is not None:
                for (rank, kind), st in self.streams.items():
                    if st.log_partial:
                        self._write(rank, kind, "\n")
                self._log.close()
                self._log = None
        return out

    def text(self, rank: int, kind: str) -> str:
        """The rank's kept output: all of it, or its head, the count of lines left out and its tail."""
        with self._lock:
            st = self.streams.get((rank, kind))
            return "" if st is None else st.text(self.notice(st))

    @property
    def bounded(self) -> bool:
        """Whether some rank's output outgrew the bound (the log then has all of it)."""
        return self.log_path is not None

    def notice(self, st: _Stream) -> str:
        lines = "line" if st.dropped == 1 else "lines"
        what = f"{st.dropped:,} {lines} not shown" if st.dropped else \
            f"lines cut at {LINE_CHARS:,} characters"
        return f"… {what}; the cell's whole output is in {self.log_path}\n"

    # -- the log ----------------------------------------------------------------------------------
    def _open_log(self) -> None:
        from workbench.pool.records import state as pool_state

        folder = Path(self.log_dir) if self.log_dir is not None else pool_state.state_dir()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.log_path = folder / f"output-{self.pool_id or os.getpid()}-{stamp}-{os.urandom(3).hex()}.log"
        _prune(folder)
        self._log = pool_state.private_file(self.log_path, "w")
        for (rank, kind), st in self.streams.items():
            self._write(rank, kind, "".join(st.head) + "".join(st.tail) + st.partial)

    def _write(self, rank: int, kind: str, text: str) -> None:
        if not text:
            return
        label = f"[rank {rank}] " if kind == "stdout" else f"[rank {rank} {kind}] "
        st = self.streams[(rank, kind)]
        lines = (st.log_partial + text).split("\n")
        st.log_partial = lines.pop()  # whole lines only: the ranks' lines interleave in the one file
        self._log.write("".join(label + line + "\n" for line in lines))


def _prune(folder: Path, keep: int = KEEP_LOGS) -> None:
    """Remove all but the newest ``keep`` output logs in ``folder``."""
    logs = sorted(folder.glob("output-*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in logs[keep - 1:]:
        old.unlink(missing_ok=True)
