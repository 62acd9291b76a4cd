"""Worker threads that never hold the server's exit.

``concurrent.futures.ThreadPoolExecutor`` joins its workers when the interpreter exits: one worker stuck in
a call that never returns (an ipyparallel request to a controller that no longer answers) kept a Jupyter
server from exiting for minutes after SIGTERM. These workers are daemon threads: the server's exit does not
wait for them, and whatever they were doing ends with the process (a pool the server started is ended by its
lease when the server is gone).

>>> with DaemonExecutor(2) as pool:
...     pool.submit(sum, [1, 2, 3]).result(timeout=5)
6
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Executor, Future


class DaemonExecutor(Executor):
    """``max_workers`` daemon threads, started as work comes, taking calls in order."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "workbench"):
        self._max, self._prefix = max_workers, thread_name_prefix
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._shut = False

    def submit(self, fn, /, *args, **kwargs) -> Future:
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            future: Future = Future()
            self._work.put((future, fn, args, kwargs))
            if self._idle == 0 and len(self._threads) < self._max:
                thread = threading.Thread(target=self._worker, daemon=True,
                                          name=f"{self._prefix}_{len(self._threads)}")
                self._threads.append(thread)
                thread.start()
            else:
                self._idle -= 1 if self._idle else 0
            return future

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 (handed to whoever waits on the future)
                    future.set_exception(exc)
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            threads = list(self._threads)
        while cancel_futures:
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                thread.join()
