"""What the pool's sockets need not say: jupyter_client's "Message signing is disabled" warning.

A pool's controller speaks CurveZMQ (:meth:`workbench.pool.cluster.EnginePool._curve`): every socket is
encrypted and authenticated with the controller's key, and ipyparallel leaves out the HMAC digest, as it
would only repeat that. jupyter_client does not know it, and warns "This is insecure and not recommended!"
from every session made for the pool: in the controller and each engine (their log, whose last lines a
failed start shows on its card) and in each kernel or server that connects a client (a Jupyter server's
log had it 16 times). That sentence is wrong for these sessions only, so it is left out for them only:

- :func:`curve_client`: while a client of one of our pools is made (nothing else is left out, and only
  for that moment: a cluster of the person's own without a key, where the warning is true, still says it);
- :func:`pool_process`: in the controller and engine processes a pool starts (all their sessions are
  the pool's); in a local pool's zygote, once for all it forks.

>>> import logging
>>> log = logging.getLogger("quiet-doctest"); log.propagate = False
>>> shown = []; handler = logging.Handler(); handler.emit = lambda r: shown.append(r.getMessage())
>>> log.addHandler(handler)
>>> with curve_client(log):
...     log.warning("Message signing is disabled.  This is insecure and not recommended!")
...     log.warning("something else")
>>> log.warning("Message signing is disabled.  This is insecure and not recommended!")
>>> shown
['something else', 'Message signing is disabled.  This is insecure and not recommended!']
"""

from __future__ import annotations

import contextlib
import logging
import threading

SIGNING_OFF = "Message signing is disabled."
# the loggers of the pool's own processes (traitlets names an application's logger by its class)
POOL_LOGGERS = ("IPController", "IPEngine", "ForkedEngine")


class CurveSessions(logging.Filter):
    """Drops the "signing is disabled" warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(SIGNING_OFF)


_lock = threading.Lock()
_making = 0  # clients of our pools being made now, in this process


@contextlib.contextmanager
def curve_client(logger: logging.Logger | logging.LoggerAdapter | None = None):
    """While a client of one of our pools is made: the logger jupyter_client warns through (traitlets'
    global one: the running application's, e.g. the kernel's or the Jupyter server's) drops the warning.
    Any thread's: ipyparallel makes the client in a thread of its own where an event loop runs (a kernel)."""
    global _making
    if logger is None:
        from traitlets.log import get_logger

        logger = get_logger()
    target = getattr(logger, "logger", logger)  # a LoggerAdapter logs through its logger
    with _lock:
        _making += 1
        target.addFilter(_QUIET)  # once, however many are made at once
    try:
        yield
    finally:
        with _lock:
            _making -= 1
            if not _making:
                target.removeFilter(_QUIET)


_QUIET = CurveSessions()


def pool_process() -> None:
    """In a controller or engine of a pool: none of its sessions warns that signing is off."""
    for name in POOL_LOGGERS:
        logging.getLogger(name).addFilter(CurveSessions())
