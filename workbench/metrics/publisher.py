"""Engine side: publish step records, run events and device samples to every session of the pool.

A :class:`Publisher` is a training-loop callback (``on_run_start``, ``on_step_end``,
``on_run_end``). A step only appends a row to an in-memory queue (a few microseconds, never a
socket call); one background thread per engine sends the queue in batches every
``flush_interval`` seconds up the pool's side channel (signed messages of at most
``wire.MAX_ROWS`` records, non-blocking sends), and samples the device every ``sample_interval``
seconds, between cells too. With nothing queued the thread sleeps until its next sample (an idle
pool wakes once a second per rank, not ten times); the first row queued wakes it. When the kernel
stops reading, rows wait in the queue (bounded: the oldest go first, and the sequence numbers show the gap).

Imports no IPython display, ipywidgets, plotly or tornado; torch only where already loaded.

>>> from workbench import wire
>>> from workbench.pool.watch.relay import Relay
>>> key = wire.new_key(); relay = Relay("127.0.0.1", key)
>>> pub = Publisher({"up": relay.up, "out": relay.out, "key": key}, rank=0, host="h", sample_interval=60)
>>> pub.step(step=1, loss=0.25, samples=8, step_time=0.01)
>>> pub.flush(5)
True
>>> pub.close(); relay.close()
"""

from __future__ import annotations

import collections
import math
import os
import socket
import sys
import threading
import time
import uuid

from workbench import wire
from workbench.engine import hub_link
from workbench.metrics import records
from workbench.metrics.sampler import make_sampler


def _callback_base():
    """The training loop's ``Callback`` when that module exists, else ``object`` (duck typing)."""
    try:
        from workbench.train.events import Callback
    except Exception:
        return object
    return Callback


class Publisher(_callback_base()):
    """Sends this rank's metrics up the pool's side channel (``channel``: the relay's ``up`` and the key).

    >>> pub = Publisher(channel, rank=0, host="h", sample_interval=60)               # doctest: +SKIP
    >>> trainer.callbacks.append(pub)                                                 # doctest: +SKIP
    """

    def __init__(self, channel: dict, *, rank: int, host: str | None = None, device: str = "cpu",
                 threads: int = 1, flush_interval: float = 0.1, sample_interval: float = 1.0,
                 max_queue: int = 200_000, sampler=None):
        self.channel = dict(hub_link.via_hub(channel))  # the host's hub batches the host's metrics
        self.rank = rank
        self.host = host or socket.gethostname()
        self.device = str(device)
        self.flush_interval = flush_interval
        self.sample_interval = sample_interval
        self.token = uuid.uuid4().hex[:12]
        self.run = 0  # local run counter: 1 for this rank's first run
        self.seq = {s: 0 for s in records.STREAMS}
        self.dropped = 0
        self._queue: collections.deque = collections.deque(maxlen=max_queue)
        self._enqueued = 0
        self._sent = 0
        self._sent_cv = threading.Condition()
        self._wake = threading.Event()
        self.wakeups = 0  # rounds of the background thread (an idle one sleeps until its next sample)
        self._idle = False  # the thread sleeps with nothing queued (no wake-ups every flush interval)
        self._closing = False
        self._close_by = float("inf")
        self._mem = None
        self.sampler = sampler if sampler is not None else make_sampler(self.device, threads)
        self.info = {**self.sampler.info(), "device": self.device, "pid": os.getpid()}
        self._thread = threading.Thread(target=self._loop, name=f"workbench-metrics-{rank}", daemon=True)
        self._thread.start()

    # -- training-loop events ------------------------------------------------------------
    def on_run_start(self, trainer=None) -> None:
        """A run begins: a new local run number and a ``run_start`` event, sent at once."""
        self.run += 1
        self._mem = _memory_probe(getattr(trainer, "device", None) or self.device)
        details = {"run": self.run}
        for name in ("max_steps", "steps", "world_size"):
            value = getattr(trainer, name, None)
            if isinstance(value, (int, float)):
                details[name] = value
        self.event("run_start", **details)

    def on_step_end(self, trainer, stats) -> None:
        """One step ended: queue its record (never blocks). Its loss is this rank's own (``rank_loss``),
        the world's mean where the rank holds none (a pipeline stage before the last)."""
        get = lambda name: getattr(stats, name, None)
        own = get("rank_loss")
        loss = own if own is not None and math.isfinite(own) else get("loss")
        self.step(step=get("step"), loss=loss, lr=get("lr"), samples=get("samples"),
                  tokens=get("tokens"), step_time=get("step_time"), compute_time=get("compute_time"),
                  comm_time=get("comm_time"), data_time=get("data_time"), mem_bytes=get("mem_peak"),
                  mem_reserved_bytes=get("mem_reserved_peak"))

    def on_run_end(self, trainer=None, error: BaseException | None = None) -> None:
        """The run ended: a ``run_end`` event, and everything queued is sent before returning (<= 2 s).

        ``error`` (default: the Trainer's ``run_error``): what ended the run early. The event says
        ``interrupted`` for a KeyboardInterrupt (Ctrl-C, a stop), else ``error: "Type: message"``.
        """
        error = getattr(trainer, "run_error", None) if error is None else error
        details = {"run": self.run}
        if isinstance(error, KeyboardInterrupt):
            details["interrupted"] = True
        elif error is not None:
            details["error"] = f"{type(error).__name__}: {error}"[:300]
        self.event("run_end", **details)
        self.flush(2.0)

    def on_regroup(self, trainer, event: dict) -> None:
        """An elastic run lost or gained ranks and goes on: a ``regroup`` event, sent at once. This rank's
        series keeps its number (the engine's), so each curve runs on across the regroup."""
        self.event("regroup", **{k: event[k] for k in ("step", "world_size", "lost", "joined", "text",
                                                        "source") if k in event})

    # -- plain API (for loops without a Trainer) -----------------------------------------------
    def step(self, *, step, **fields) -> None:
        """Queue one step record; ``fields`` as in :func:`workbench.metrics.records.step_row`."""
        if self.run == 0:
            self.on_run_start(None)
        if fields.get("mem_bytes") is None and self._mem is not None:  # a loop that measures no peak
            fields["mem_bytes"] = self._mem()
        row = records.step_row(t=time.time(), run=self.run, step=step, **fields)
        self._put("step", row)

    def event(self, name: str, **details) -> None:
        """Queue an event (``run_start``, ``run_end``...) and send it without waiting for the next flush."""
        self._put("event", [time.time(), name, details])
        self._wake.set()

    def _put(self, stream: str, row: list) -> None:
        seq = self.seq[stream]
        self.seq[stream] = seq + 1
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        self._queue.append((stream, [seq, *row]))
        self._enqueued += 1
        if self._idle:  # the thread sleeps until its next sample: the first row of a burst wakes it
            self._idle = False
            self._wake.set()

    def flush(self, timeout: float = 2.0) -> bool:
        """Wait until every record queued so far was handed to the socket; False on timeout."""
        target = self._enqueued
        self._wake.set()
        deadline = time.monotonic() + timeout
        with self._sent_cv:
            while self._sent + self.dropped < target:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._sent_cv.wait(left)
        return True

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closing

    def renumber(self, rank: int) -> None:
        """This engine now holds ``rank``: publish as a new source (fresh token and sequence numbers)."""
        self.flush(2.0)
        self.rank, self.token = rank, uuid.uuid4().hex[:12]
        self.seq = {s: 0 for s in records.STREAMS}

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (up to ``timeout``), stop sampling, close the socket."""
        self._close_by = time.monotonic() + timeout
        self._closing = True
        self._wake.set()
        self._thread.join(timeout + 1)
        self.sampler.close()

    # -- background thread -----------------------------------------------------------------
    def _loop(self) -> None:
        import zmq

        signer = wire.Signer(self.channel["key"])
        ctx = zmq.Context()
        sock = wire.pusher(ctx, self.channel["up"], hwm=1000)  # messages (batches), not records
        sock.setsockopt(zmq.LINGER, 1000)
        pending = None  # a message the socket would not take yet (kernel not reading)
        next_sample = 0.0
        sent = False  # a batch went in this round: wait one flush interval for more before sleeping
        try:
            while True:
                self.wakeups += 1
                now = time.monotonic()
                if now >= next_sample and not self._closing:
                    self._sample()
                    next_sample = now + self.sample_interval
                if pending is None and self._queue:
                    pending = self._build()
                if pending is not None:
                    data, count = pending
                    try:
                        sock.send_multipart(signer.pack(wire.METRICS, data), zmq.NOBLOCK)
                        pending = None
                        sent = True
                        with self._sent_cv:
                            self._sent += count
                            self._sent_cv.notify_all()
                        if self._queue:
                            continue  # more arrived while sending: next batch at once
                    except zmq.Again:
                        pass
                if self._closing and (pending is None or time.monotonic() > self._close_by):
                    break
                until_sample = max(0.0, next_sample - time.monotonic())
                if pending is None and not sent:
                    # nothing to send: sleep until the next sample; a row queued meanwhile wakes us
                    self._idle = True
                    if not self._queue:
                        self._wake.wait(until_sample)
                    self._idle = False
                else:  # rows are coming (or the socket is full): gather them for one flush interval
                    self._wake.wait(min(self.flush_interval, until_sample))
                sent = False
                self._wake.clear()
        finally:
            sock.close()
            ctx.term()
            with self._sent_cv:
                self._sent_cv.notify_all()

    def _build(self) -> tuple[bytes, int]:
        rows = {s: [] for s in records.STREAMS}
        count = 0
        q = self._queue
        while q and count < wire.MAX_ROWS:  # a message stays well under the side channel's size limit
            stream, row = q.popleft()
            rows[stream].append(row)
            count += 1
        info = self.info if rows["device"] or rows["event"] else None
        data = records.encode(pub=self.token, rank=self.rank, host=self.host, steps=rows["step"],
                              devices=rows["device"], events=rows["event"], info=info)
        return data, count

    def _sample(self) -> None:
        try:
            values = self.sampler.read()
        except Exception:  # a sampler must never stop the metrics of this rank
            return
        self._put("device", records.device_row(t=time.time(), **values))


def _memory_probe(device):
    """A function returning allocated CUDA bytes for a CUDA device, else None (no probe)."""
    if "torch" not in sys.modules or not str(device).startswith("cuda"):
        return None
    import torch

    dev = torch.device(device)
    return lambda: torch.cuda.memory_allocated(dev)


# -- one publisher per engine ------------------------------------------------------------------
_publisher: Publisher | None = None


def current() -> Publisher | None:
    """This engine's publisher (None before :func:`connect`); use it from a hand-written loop.

    >>> pub = current()                                   # doctest: +SKIP
    >>> pub.step(step=i, loss=loss.item(), samples=64)    # doctest: +SKIP
    """
    return _publisher


def connect(channel: dict, *, rank: int | None = None, device: str | None = None,
            flush_interval: float = 0.1, sample_interval: float = 1.0) -> dict:
    """Start this engine's publisher and device sampler, and register it with every new Trainer.

    Called by the Session on every rank each time the process group is formed; rank and device
    default to this engine's (``workbench.engine.rendezvous``). A publisher already sending to ``channel``
    is kept (Trainers made earlier hold it), taking the new rank if it changed.
    """
    global _publisher
    uuid = None
    if rank is None or device is None:
        from workbench.engine import rendezvous

        here = rendezvous.identity()
        rank = here["rank"] if rank is None else rank
        device = str(here["device"]) if device is None else device
        uuid = here.get("gpu_uuid")  # the GPU this rank joined on, whatever CUDA_VISIBLE_DEVICES says
    pub = _publisher
    mine = hub_link.via_hub(channel)  # through the host's hub where it has one
    if pub is not None and pub.channel == mine and pub.alive and pub.device == str(device):
        if pub.rank != rank:
            pub.renumber(rank)
        registered = _register(pub)
        return {"rank": rank, "device": device, "sampler": pub.info["kind"], "registered": registered}
    disconnect()
    threads = 1
    if "torch" in sys.modules:
        threads = sys.modules["torch"].get_num_threads()
    sampler = make_sampler(str(device), threads, uuid=uuid)
    _publisher = Publisher(channel, rank=rank, device=device, threads=threads, flush_interval=flush_interval,
                           sample_interval=sample_interval, sampler=sampler)
    registered = _register(_publisher)
    return {"rank": rank, "device": device, "sampler": _publisher.info["kind"], "registered": registered}


def disconnect() -> None:
    """Stop this engine's publisher (sending what is queued first)."""
    global _publisher
    if _publisher is None:
        return
    _unregister(_publisher)
    _publisher.close()
    _publisher = None


def _register(pub: Publisher) -> bool:
    try:
        from workbench.train import events
    except Exception:
        return False
    events.default_callbacks[:] = [c for c in events.default_callbacks if not isinstance(c, Publisher)]
    events.default_callbacks.append(pub)
    return True


def _unregister(pub: Publisher) -> None:
    events = sys.modules.get("workbench.train.events")
    if events is not None:
        events.default_callbacks[:] = [c for c in events.default_callbacks if c is not pub]
