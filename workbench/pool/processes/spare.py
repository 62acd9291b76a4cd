"""A zygote started ahead of the first local pool, so that ``%dist start`` finds torch and the engine loaded.

``%load_ext workbench`` calls :func:`prepare`: a zygote (:mod:`workbench.pool.processes.zygote`) starts
importing in the background under a pool id of its own. The next local pool takes it (:func:`take`) and
becomes that pool id; its controller and engines are then forks of a process that has nothing left to import.
Until then the spare has no children and needs no lease: it exits when this process closes its stdin, which
also happens when this process dies. ``WORKBENCH_PREWARM=0`` turns it off (it costs about one ``import torch``
of memory while it waits).

>>> prepare()                  # doctest: +SKIP
>>> take().pool_id             # doctest: +SKIP
'1a2b3c4d'
"""

from __future__ import annotations

import atexit
import os
import threading
import uuid

from workbench.pool.processes.zygote import Zygote

_lock = threading.Lock()
_spare: Zygote | None = None


def enabled() -> bool:
    """Whether spares are started (``WORKBENCH_PREWARM=0`` turns them off)."""
    return os.environ.get("WORKBENCH_PREWARM", "1") != "0"


def prepare() -> None:
    """Start a spare zygote unless one is waiting already (or spares are off)."""
    global _spare
    if not enabled():
        return
    from workbench.pool.records import state as pool_state

    with _lock:
        if _spare is not None and _spare.alive():
            return
        pool_id = uuid.uuid4().hex[:8]
        log = pool_state.log_path(pool_id)
        pool_state.private_file(log).close()
        _spare = Zygote(pool_id=pool_id, log=str(log), cwd=os.getcwd())
    atexit.register(close)


def take() -> Zygote | None:
    """The waiting spare, now the caller's (None when there is none); the pool takes its id."""
    global _spare
    with _lock:
        spare, _spare = _spare, None
    if spare is not None and not spare.alive():
        return None
    return spare


def close() -> None:
    """End the waiting spare, if any: its zygote exits once its stdin is closed."""
    spare = take()
    if spare is not None:
        spare.close()
        try:
            spare.proc.wait(timeout=2)
        except Exception:
            pass


def waiting() -> Zygote | None:
    """The spare that waits for a pool (still this module's), if any."""
    return _spare
