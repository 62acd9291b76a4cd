"""Another user of the machine attacking a running pool (issue 27): run as uid 65534.

Reads what to attack from stdin, one JSON object a line, and writes one JSON line per attempt:

- ``{"port": [ip, port]}``: connect; as a torch TCPStore client list the keys, write one, delete every
  key it listed (``store`` says how far it got); send random bytes; listen as a ZMQ subscriber for a
  second (``heard``: how many messages came); send unsigned ZMQ messages.
- ``{"file": path}``: read the file (or list the folder).
- ``{"http": url, "method": "GET"}``: an HTTP request (GET, or POST/DELETE with an empty JSON body),
  with no token or a forged one in the URL (``status``: the HTTP code, -1 when nothing answered).
- ``{"quit": true}``: stop.

It runs with Debian's python and the venv's site-packages on PYTHONPATH (the venv's own interpreter
lies under /root, which uid 65534 cannot open), so torch, zmq and psutil are the ones the pool uses.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

STORE_TIMEOUT = datetime.timedelta(seconds=1)
STORE_WAIT_S = 2.0


def attack_store(ip: str, port: int) -> str:
    """How far a TCPStore client got: "no store", "connected", "listed", "wrote".

    In a thread with a time limit: torch's client waits for ever (past its timeout) on a port that
    accepts and never answers, as gloo's and ZMQ's do. A stuck attempt keeps its connection open, one
    more attack: a connection held."""
    got = ["no store"]
    thread = threading.Thread(target=_store_client, args=(ip, port, got), daemon=True)
    thread.start()
    thread.join(STORE_WAIT_S)
    return got[0]


def _store_client(ip: str, port: int, got: list) -> None:
    import torch.distributed as dist

    try:
        store = dist.TCPStore(ip, port, is_master=False, timeout=STORE_TIMEOUT, wait_for_workers=False)
        got[0] = "connected"
        keys = store.list_keys()
        got[0] = "listed"
        store.set("intruder", "was here")
        got[0] = "wrote"
        for key in keys:  # what a forged regroup or start would need: the ranks' keys gone
            store.delete_key(key)
    except Exception:
        pass


def garbage(ip: str, port: int) -> bool:
    """Whether the port took a connection and 64 KiB of random bytes."""
    try:
        with socket.create_connection((ip, port), timeout=1) as sock:
            sock.sendall(os.urandom(65536))
            return True
    except OSError:
        return False


def unsigned_zmq(ip: str, port: int) -> None:
    """An ipyparallel-shaped message with no signature, as a DEALER (controller) and a PUSH (relay)."""
    import zmq

    ctx = zmq.Context.instance()
    for kind in (zmq.DEALER, zmq.PUSH):
        sock = ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 200)
        sock.connect(f"tcp://{ip}:{port}")
        try:
            sock.send_multipart([b"<IDS|MSG>", b"", b'{"msg_type": "shutdown_request"}', b"{}", b"{}",
                                 b'{"restart": false}'], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        sock.close()


def eavesdrop(ip: str, port: int, seconds: float = 1.0) -> tuple[int, str]:
    """How many messages a SUB socket subscribed to everything hears on the port in ``seconds``, and the
    start of the first one."""
    import zmq

    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(f"tcp://{ip}:{port}")
    heard, first, deadline = 0, "", time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if sock.poll(int(left * 1000)):
            frames = sock.recv_multipart()
            first = first or repr(b"|".join(frames))[:400]
            heard += 1
    sock.close()
    return heard, first


def read(path: str) -> str:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
        return "read"
    except OSError as exc:
        return type(exc).__name__


def http(url: str, method: str = "GET") -> int:
    data = b"{}" if method in ("POST", "PUT") else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return -1


def attempt(ask: dict) -> dict:
    if "port" in ask:
        ip, port = ask["port"]
        heard, sample = eavesdrop(ip, port)
        out = {"port": [ip, port], "store": attack_store(ip, port), "garbage": garbage(ip, port),
               "heard": heard, "sample": sample}
        unsigned_zmq(ip, port)
    elif "file" in ask:
        out = {"file": ask["file"], "got": read(ask["file"])}
    else:
        method = ask.get("method", "GET")
        out = {"http": ask["http"], "method": method, "status": http(ask["http"], method)}
    out.update(uid=os.getuid(), phase=ask.get("phase"))
    return out


def main() -> None:
    import torch.distributed  # noqa: F401  (now, not inside the first attempt's time limit)
    import zmq  # noqa: F401

    printing = threading.Lock()

    def run(ask: dict) -> None:
        out = attempt(ask)
        with printing:
            print(json.dumps(out), flush=True)

    # many at once: a port takes seconds (a store client's time limit, a second of listening)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for line in sys.stdin:
            ask = json.loads(line)
            if ask.get("quit"):
                break
            pool.submit(run, ask)
        pool.shutdown(wait=True)
        os._exit(0)  # store clients stuck on a silent port are threads that never end


if __name__ == "__main__":
    main()
