"""Where the ranks of a pool meet: every store they rendezvous through is made here (issue 27).

A store is named by a small dict the kernel and the ranks pass around (it travels in the signed
ipyparallel call or the signed regroup plan):

- ``{"file": path}``: a torch ``FileStore`` in the pool's private folder (0700, owned by the pool's
  user): a local pool. Nothing listens; another user of the machine cannot open the folder, so
  cannot read, write or delete a key.
- ``{"tcp": [address, port]}``: a ``TCPStore`` that a rank hosts on its address of the cluster
  interface (never on every interface): pools across hosts, where a file is no meeting place. Anyone
  who reaches that address can connect, list the keys and write (torch's TCPStore has no
  authentication, and ``list_keys`` would show any secret prefix): the README says so.

Two kinds of store: the rendezvous store of each group the kernel forms, and the standby store every
engine keeps open for elastic regroups (the ranks left after a loss meet at one of them).

>>> spec = file_spec("/run/user/1000/workbench/stores-1a2b3c4d", "group-1")
>>> spec
{'file': '/run/user/1000/workbench/stores-1a2b3c4d/group-1'}
"""

from __future__ import annotations

import datetime
import os
import socket
import stat
from pathlib import Path

import torch.distributed as dist


def file_spec(folder: str, name: str) -> dict:
    """The spec of a file store called ``name`` in the pool's private ``folder``."""
    return {"file": str(Path(folder) / name)}


def pool_store(spec: dict, timeout_s: float) -> dist.Store:
    """Open the store ``spec`` names, as a client (a file store has no host: every rank opens it alike).

    >>> import tempfile; folder = tempfile.mkdtemp()    # 0700, ours
    >>> store = pool_store(file_spec(folder, "group-1"), timeout_s=5)
    >>> store.set("ready/0", "1"); store.get("ready/0")
    b'1'
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    if "file" in spec:
        path = Path(spec["file"])
        check_private(path.parent)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # 0600 whatever the umask (FileStore uses it)
        os.close(fd)
        store = dist.FileStore(str(path), -1)  # -1: no reference count; the folder goes with the pool
        store.set_timeout(timeout)
        return store
    address, port = spec["tcp"]
    return dist.TCPStore(address, port, is_master=False, timeout=timeout)


def host_store(where: dict, timeout_s: float, name: str) -> tuple[dist.Store, dict]:
    """Host a store here and return it with its spec: ``where`` is ``{"folder": path}`` (a file store
    ``name`` in it) or ``{"address": ip}`` (a TCPStore listening on ``ip`` only)."""
    if "folder" in where:
        spec = file_spec(where["folder"], name)
        return pool_store(spec, timeout_s), spec
    store, port = tcp_host(where["address"], timeout_s)
    return store, {"tcp": [where["address"], port]}


def tcp_host(address: str, timeout_s: float) -> tuple[dist.TCPStore, int]:
    """A TCPStore hosted here, listening on ``address`` only (given port 0, TCPStore listens on every
    interface); returns it and its port."""
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    store = dist.TCPStore(
        address, port, is_master=True, master_listen_fd=sock.fileno(),
        timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False,
    )
    # The store owns the listening fd now and closes it when it is destroyed (an aborted group may keep
    # it alive a while): closing it here too would later close whatever socket reused the number.
    sock.detach()
    return store, port


def check_private(folder: Path) -> None:
    """Refuse a store folder that another user could open: it must exist, be ours, and be 0700."""
    try:
        st = folder.stat()
    except FileNotFoundError:
        raise ValueError(f"the pool's store folder {folder} is missing (the pool was stopped, or its "
                         "state folder removed): start the pool again") from None
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.geteuid() or mode & 0o077 or not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"the pool's store folder {folder} is not private (owner uid {st.st_uid}, mode "
                         f"{mode:o}): other users could change the pool's rendezvous; remove it and start "
                         "the pool again")
