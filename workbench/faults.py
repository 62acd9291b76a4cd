"""Fault events: one structured record per fault, shown in the notebook and appended to a JSONL log."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from workbench.pool.records import state as pool_state

# Errors a rank raises *because another rank failed*: never the root cause.
SECONDARY_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "aborted",
                     "Timed out", "timed out", "Socket Timeout", "ProcessGroup", "has been destroyed")


@dataclass
class FaultEvent:
    """What failed, where, and how long detecting, stopping and recovering took (seconds)."""

    pool: str | None
    kind: str  # "exception", "died", "hang" or "interrupt"
    rank: int | None
    host: str | None
    device: str | None
    first_failure: str
    time: float
    detect_s: float | None = None
    abort_s: float | None = None
    recover_s: float | None = None

    def summary(self) -> str:
        parts = [f"fault: {self.kind} on rank {self.rank} ({self.host}, {self.device})"]
        if self.detect_s is not None:
            parts.append(f"detected in {self.detect_s:.2f} s")
        if self.abort_s is not None:
            parts.append(f"other ranks stopped in {self.abort_s:.2f} s")
        if self.recover_s is not None:
            parts.append(f"recovered in {self.recover_s:.2f} s")
        return ", ".join(parts)


def is_secondary(ename: str, evalue: str, origin: str | None = None) -> bool:
    """Whether an error is the echo of another rank's failure (a closed connection, an abort).

    ``origin`` is what the rank itself knows (:func:`origin_of` its beacon): ``"local"`` (its own backend
    failed: a root cause even as a ``DistBackendError``), ``"peer"`` or ``"aborted"`` (an echo). Without
    it, the error's type and text decide.

    >>> is_secondary("RuntimeError", "[pair.cc:553] Connection closed by peer [127.0.0.1]:1234")
    True
    >>> is_secondary("ValueError", "bad shape")
    False
    >>> is_secondary("DistBackendError", "NCCL error: unhandled cuda error", origin="local")
    False
    """
    if origin == "local":
        return False
    if origin in ("peer", "aborted"):
        return True
    # KeyboardInterrupt on a rank is our own escalation's SIGINT (Ctrl-C in the notebook raises in the kernel)
    return (ename in ("DistBackendError", "DistNetworkError", "KeyboardInterrupt")
            or any(m in evalue for m in SECONDARY_MARKERS))


def seconds(when) -> float | None:
    """A POSIX time from what ipyparallel reports (a datetime, or an ISO string like its ``completed``).

    >>> seconds("1970-01-01T00:00:02.500000Z")
    2.5
    >>> seconds(None) is None
    True
    """
    if hasattr(when, "timestamp"):
        return when.timestamp()
    if isinstance(when, str):
        from datetime import datetime

        try:
            return datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def origin_of(beat: dict | None, since: float, failed_at: float | None = None) -> str | None:
    """Where a rank's failure at ``failed_at`` in a cell that started at ``since`` came from, as its beacon
    says (engine clocks): the origin of a collective that failed in the cell, else an abort of its group
    before the failure. An error raised before the abort (the root cause, which the abort answered) has none.

    >>> origin_of({"aborted_at": None, "failure": {"t": 12.0, "origin": "local"}}, since=10.0)
    'local'
    >>> origin_of({"aborted_at": 11.0, "failure": None}, since=10.0, failed_at=12.0)
    'aborted'
    >>> origin_of({"aborted_at": 11.0, "failure": None}, since=10.0, failed_at=10.5) is None
    True
    >>> origin_of({"aborted_at": None, "failure": {"t": 9.0, "origin": "local"}}, since=10.0) is None
    True
    """
    if not beat:
        return None
    failure = beat.get("failure") or {}
    if failure.get("t", 0) >= since and (failed_at is None or failure["t"] <= failed_at + 1.0):
        return failure.get("origin")
    aborted = beat.get("aborted_at") or 0
    if aborted >= since and (failed_at is None or aborted <= failed_at):
        return "aborted"
    return None


def log_path():
    return pool_state.state_dir() / "faults.jsonl"


def append(event: FaultEvent) -> None:
    with pool_state.private_file(log_path()) as f:
        f.write(json.dumps(asdict(event)) + "\n")


def now() -> float:
    return time.time()
