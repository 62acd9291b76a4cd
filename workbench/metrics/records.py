"""Plain metric records and their wire format, shared by engines and kernel.

Three streams per rank, each with its own sequence numbers (0, 1, 2, ...), so the kernel can
tell a lost or duplicated record from a slow one:

- ``step``: one row per training step (fields ``STEP_FIELDS``),
- ``device``: one row per device sample (fields ``DEVICE_FIELDS``),
- ``event``: run start and end, with a small dict of details.

On the wire a message is one JSON object: ``{"pub": token, "rank": r, "host": h, "info": {...},
"step": [[seq, *values]], "device": [[seq, *values]], "event": [[seq, t, name, details]]}``.
JSON, not pickle: the collector's socket must not run what it receives.

>>> msg = encode(pub="a1", rank=0, host="h", steps=[[0, *step_row(step=1, loss=0.5, t=10.0)]])
>>> decoded = decode(msg)
>>> decoded["rank"], decoded["step"][0][0], dict(zip(STEP_FIELDS, decoded["step"][0][1:]))["loss"]
(0, 0, 0.5)
"""

from __future__ import annotations

import json
import math

STREAMS = ("step", "device", "event")

# Every step: when it ended (engine wall clock), which local run of this rank, what the loop reported,
# and the rates derived from it. Times in seconds, memory in bytes (a GPU's peak allocated and reserved during
# the step); NaN where unknown. ``samples`` and ``tokens`` are the whole step's, over all data-parallel ranks
# (as the Trainer's StepStats report them).
STEP_FIELDS = (
    "t", "local_run", "step", "loss", "lr", "samples", "tokens", "step_time", "compute_time", "comm_time",
    "data_time", "samples_per_s", "tokens_per_s", "mem_bytes", "mem_reserved_bytes",
)

# Every device sample: utilisation in percent (GPU busy, or this engine's CPU share), memory in bytes,
# power in watts, temperature in degrees Celsius, SM clock in MHz. NaN where the device cannot say.
DEVICE_FIELDS = ("t", "util", "mem_used", "mem_total", "power_w", "temp_c", "clock_mhz")

NAN = float("nan")


def _num(value) -> float:
    """A plain float from a number, a 0-d tensor or None (NaN)."""
    if value is None:
        return NAN
    try:
        return float(value)
    except (TypeError, ValueError):
        return NAN


def step_row(*, t: float, step: int, run: int = 0, loss=None, lr=None, samples=None, tokens=None,
             step_time=None, compute_time=None, comm_time=None, data_time=None,
             mem_bytes=None, mem_reserved_bytes=None) -> list[float]:
    """The values of one step record, in ``STEP_FIELDS`` order; rates derived from the step time.

    >>> row = step_row(t=1.0, step=3, samples=64, step_time=0.5)
    >>> dict(zip(STEP_FIELDS, row))["samples_per_s"]
    128.0
    """
    st = _num(step_time)
    n_samples, n_tokens = _num(samples), _num(tokens)
    rate = lambda n: n / st if st > 0 and not math.isnan(n) else NAN
    return [float(t), float(run), float(step), _num(loss), _num(lr), n_samples, n_tokens, st,
            _num(compute_time), _num(comm_time), _num(data_time), rate(n_samples), rate(n_tokens),
            _num(mem_bytes), _num(mem_reserved_bytes)]


def device_row(*, t: float, util=None, mem_used=None, mem_total=None, power_w=None, temp_c=None,
               clock_mhz=None) -> list[float]:
    """The values of one device record, in ``DEVICE_FIELDS`` order.

    >>> device_row(t=2.0, util=50)[:2]
    [2.0, 50.0]
    """
    return [float(t), _num(util), _num(mem_used), _num(mem_total), _num(power_w), _num(temp_c),
            _num(clock_mhz)]


def encode(*, pub: str, rank: int, host: str, steps=(), devices=(), events=(), info=None) -> bytes:
    """One wire message (JSON bytes) carrying rows of every stream."""
    msg = {"pub": pub, "rank": rank, "host": host}
    if info:
        msg["info"] = info
    if steps:
        msg["step"] = list(steps)
    if devices:
        msg["device"] = list(devices)
    if events:
        msg["event"] = list(events)
    return json.dumps(msg, separators=(",", ":")).encode()


def decode(data: bytes) -> dict:
    """Parse and check one wire message; ``ValueError`` if it is not one of ours.

    >>> decode(b'{"rank": 0}')
    Traceback (most recent call last):
    ...
    ValueError: not a metrics message: missing 'pub'
    """
    msg = json.loads(data)
    if not isinstance(msg, dict):
        raise ValueError("not a metrics message: not an object")
    for key, kind in (("pub", str), ("rank", int), ("host", str)):
        if key not in msg:
            raise ValueError(f"not a metrics message: missing {key!r}")
        if not isinstance(msg[key], kind):
            raise ValueError(f"not a metrics message: {key!r} is not {kind.__name__}")
    widths = {"step": len(STEP_FIELDS) + 1, "device": len(DEVICE_FIELDS) + 1, "event": 4}
    for stream, width in widths.items():
        rows = msg.setdefault(stream, [])
        if not isinstance(rows, list) or any(not isinstance(r, list) or len(r) != width for r in rows):
            raise ValueError(f"not a metrics message: bad {stream} rows")
    return msg
