"""torchrun's world on the pool's ranks: a torchrun script runs here unchanged.

Installed on every rank when the pool's group forms (:func:`install`, from
:mod:`workbench.engine.rendezvous`):

- torchrun's environment (:func:`torchrun_environment`): ``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
  ``GROUP_RANK``, ``ROLE_*``, ``TORCHELASTIC_*``..., as torch's local elastic agent sets them;
- ``init_process_group`` that finds the pool's group formed and agreeing returns without forming a second
  one (saying so once, on rank 0); disagreeing arguments raise a ``ValueError`` naming what differs;
- ``destroy_process_group()`` on the default group is deferred: the pool keeps its group for the next cell
  (said once); subgroups a script made (``new_group``, ``init_device_mesh``) are destroyed for real;
- ``exit()``/``quit()``/``sys.exit()`` end the script, not the engine: a zero exit is ok, another code fails
  the cell on that rank; ``sys.argv`` is ``[""]`` (as in IPython's kernel), not ipengine's own options.

:func:`run_script` is what ``%dist run script.py -- args`` runs on each rank.
"""

from __future__ import annotations

import builtins
import functools
import os
import socket
import sys
import types

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from workbench.engine import children, frameworks, fresh

# torch's own functions, kept before the patch: the pool forms and ends its group with these
ORIGINAL = {"init_process_group": c10d.init_process_group,
            "destroy_process_group": c10d.destroy_process_group}
# the pool's group on this rank: backend, rank, world_size, device; "said": the notes already printed
_pool: dict = {"said": set()}
ROLE_NAME = "default"  # torchrun's --role default
_shell: dict = {}  # "patched": the engine's IPython shell once exit/quit and SystemExit(0) are taken care of


def torchrun_environment(*, rank: int, local_rank: int, world_size: int, local_world_size: int,
                         group_rank: int, group_world_size: int, address: str, port: int,
                         run_id: str, restart_count: int = 0) -> dict[str, str]:
    """The variables torch's local elastic agent gives each worker, for one rank of the pool.

    One role (torchrun's ``default``), so the role's rank and size are the global ones; no restarts
    (``%dist restart`` starts an engine, not a torchrun restart).

    >>> env = torchrun_environment(rank=3, local_rank=1, world_size=4, local_world_size=2, group_rank=1,
    ...                            group_world_size=2, address="127.0.0.1", port=29500, run_id="pool-a")
    >>> env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"], env["ROLE_RANK"], env["TORCHELASTIC_RUN_ID"]
    ('2', '1', '3', 'pool-a')
    """
    env = {"RANK": rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": world_size,
           "LOCAL_WORLD_SIZE": local_world_size, "GROUP_RANK": group_rank,
           "GROUP_WORLD_SIZE": group_world_size, "ROLE_RANK": rank, "ROLE_WORLD_SIZE": world_size,
           "ROLE_NAME": ROLE_NAME, "MASTER_ADDR": address, "MASTER_PORT": port,
           "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": restart_count,
           "TORCHELASTIC_MAX_RESTARTS": 0,
           # across hosts rank 0 hosts a TCPStore at MASTER_ADDR:MASTER_PORT (a script's own store joins it
           # as a client, as under torchrun); a local pool meets in a file (port 0): nothing listens
           "TORCHELASTIC_USE_AGENT_STORE": port > 0}
    return {k: str(v) for k, v in env.items()}


def set_environment(**facts) -> None:
    """Put :func:`torchrun_environment` into ``os.environ`` (torchrun sets ``OMP_NUM_THREADS=1`` only when
    unset; the pool sets it per engine already, which is kept)."""
    os.environ.update(torchrun_environment(**facts))
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def install(*, backend: str, rank: int, world_size: int, device: torch.device) -> None:
    """Record the pool's new group and patch torch so that scripts find it (idempotent)."""
    _pool.update(backend=backend, rank=rank, world_size=world_size, device=device, said=set(),
                 before_script=set())
    for module in (dist, c10d):  # `from torch.distributed import init_process_group` after this sees ours
        module.init_process_group = init_process_group
        module.destroy_process_group = destroy_process_group
    _install_shell()
    fresh.keep_torch_settings()  # what each `%dist run` starts from, as a new torchrun process would
    frameworks.install()  # Lightning, Accelerate, Transformers see a torchrun process here


def retarget(*, rank: int, world_size: int) -> None:
    """An elastic regroup changed this rank's place: the checks and the environment follow."""
    _pool.update(rank=rank, world_size=world_size)
    os.environ.update(RANK=str(rank), ROLE_RANK=str(rank), WORLD_SIZE=str(world_size),
                      ROLE_WORLD_SIZE=str(world_size))


def _say(key: str, text: str) -> None:
    """Print ``text`` once per group, on rank 0 only."""
    if key not in _pool["said"]:
        _pool["said"].add(key)
        if _pool.get("rank") == 0:
            print(f"workbench: {text}", flush=True)


def differences(*, pool: dict, backend=None, init_method: str | None = None, world_size: int = -1,
                rank: int = -1, device_id=None) -> list[str]:
    """What a script's ``init_process_group`` arguments ask for that the pool's group is not.

    >>> pool = {"backend": "gloo", "rank": 1, "world_size": 2, "device": torch.device("cpu")}
    >>> differences(pool=pool, backend="gloo", world_size=2, rank=1, init_method="env://")
    []
    >>> differences(pool=pool, backend="nccl", world_size=4)
    ["backend 'nccl' (the pool's group: 'gloo')", "world_size=4 (the pool's group: 2)"]
    """
    found = []
    asked = str(backend).lower() if backend is not None else None
    have = str(pool["backend"]).lower()
    if asked and asked not in _backends(have):
        found.append(f"backend {asked!r} (the pool's group: {have!r})")
    if world_size not in (-1, None) and int(world_size) != pool["world_size"]:
        found.append(f"world_size={world_size} (the pool's group: {pool['world_size']})")
    if rank not in (-1, None) and int(rank) != pool["rank"]:
        found.append(f"rank={rank} (this rank of the pool: {pool['rank']})")
    if init_method not in (None, "", "env://"):
        found.append(f"init_method={init_method!r} (the pool's group is torchrun's env://)")
    dev = pool["device"]
    if device_id is not None and dev.type != "cpu" and torch.device(device_id) != dev:
        found.append(f"device_id={device_id} (this rank's device: {dev})")
    return found


def _backends(have: str) -> set[str]:
    """The backend strings a script may ask for of a group formed with ``have`` ("cpu:gloo,cuda:nccl")."""
    names = {have, *(part.split(":")[-1] for part in have.split(","))}
    return names | ({"cuda:nccl", "cpu:gloo,cuda:nccl"} if "nccl" in names else set())


@functools.wraps(ORIGINAL["init_process_group"])
def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                       group_name="", pg_options=None, device_id=None, **kwargs):
    """torch's ``init_process_group``, which finds the pool's group formed and agreeing and keeps it."""
    if "backend" not in _pool or not dist.is_initialized():
        raise RuntimeError("the pool's process group is down on this rank (a fault aborted it): run the "
                           "cell again, the next cell re-forms it; `%dist restart` if that fails.")
    wrong = differences(pool=_pool, backend=backend, init_method=init_method, world_size=world_size,
                        rank=rank, device_id=device_id)
    if wrong:
        raise ValueError(f"init_process_group asks for {'; '.join(wrong)}. The pool formed its process group "
                         f"already (backend {_pool['backend']}, world size {_pool['world_size']}) and keeps "
                         "it: call init_process_group() with no arguments (or env://, as under torchrun), "
                         "or start a pool that fits (`%dist stop`, then `%dist start -n N --backend B`).")
    _script_starts()
    _say("init", f"init_process_group(): the pool's process group is formed already (backend "
                 f"{_pool['backend']}, world size {_pool['world_size']}): the script uses it.")


@functools.wraps(ORIGINAL["destroy_process_group"])
def destroy_process_group(group=None):
    """torch's ``destroy_process_group``: the pool's default group stays (deferred); others end for real."""
    if group is None or group is dist.group.WORLD:
        _destroy_subgroups()
        _say("destroy", "destroy_process_group(): the pool keeps its process group for the next cell "
                        "(`%dist stop` ends it); subgroups the script made are destroyed.")
        return
    ORIGINAL["destroy_process_group"](group)


def _script_starts() -> None:
    """A script begins (its ``init_process_group``, or ``%dist run``): the groups there are now are not
    its own, and outlive its ``destroy_process_group()`` (a Trainer's mesh of an earlier cell, say)."""
    _pool["before_script"] = set(c10d._world.pg_map) if dist.is_initialized() else set()


def _destroy_subgroups() -> None:
    """What torch's ``destroy_process_group()`` does to the groups a script made (``new_group``, a
    device mesh's dimensions): they end; the pool's default group and the groups from before the script
    are kept."""
    if not dist.is_initialized():
        return
    keep = {c10d._get_default_group(), *_pool.get("before_script", ())}
    for group in list(c10d._world.pg_map):
        if group not in keep:
            ORIGINAL["destroy_process_group"](group)


class Exit:
    """``exit``/``quit`` on a rank: end the script (``SystemExit``), never the engine.

    >>> Exit("exit")(0)
    Traceback (most recent call last):
    SystemExit: 0
    """

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"Use {self.name}() to end the script on the ranks (the engine stays)."

    def __call__(self, code=None):
        raise SystemExit(code)


def clean_exit(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a ``SystemExit`` that a shell would call success (code 0 or None).

    >>> clean_exit(SystemExit(0)), clean_exit(SystemExit()), clean_exit(SystemExit(2)), clean_exit(None)
    (True, True, False, False)
    """
    return isinstance(exc, SystemExit) and not exc.code


def _install_shell() -> None:
    """The engine's IPython shell: our ``exit``/``quit``, a zero ``sys.exit`` is success, ``sys.argv``."""
    from IPython import get_ipython

    if sys.argv and "ipengine" in os.path.basename(sys.argv[0] or ""):
        sys.argv = [""]  # as IPython's kernel: a pasted `__main__` block must not parse ipengine's options
    ip = get_ipython()
    if ip is None or _shell.get("patched") is ip:
        return
    _shell["patched"] = ip
    names = {"exit": Exit("exit"), "quit": Exit("quit")}
    ip.user_ns.update(names)  # ipengine's own exit() would end the engine
    ip.builtin_trap.auto_builtins.update(names)  # also in a %run script's fresh namespace
    run_code, showtraceback = ip.run_code, ip.showtraceback

    async def run_code_exit_ok(code_obj, result=None, *, async_=False):
        failed = await run_code(code_obj, result, async_=async_)
        if result is not None and clean_exit(result.error_in_exec):
            result.error_in_exec = None  # the cell ends here, and succeeded
        return failed

    def showtraceback_exit_ok(*args, **kwargs):
        if clean_exit(sys.exc_info()[1]):
            return None
        return showtraceback(*args, **kwargs)

    safe_execfile = ip.safe_execfile

    def safe_execfile_exit_fails(fname, *where, exit_ignore=False, raise_exceptions=False, **kwargs):
        # %run: IPython shows a non-zero exit as text and the cell's reply says ok; here it fails the cell
        try:
            return safe_execfile(fname, *where, exit_ignore=exit_ignore, raise_exceptions=True, **kwargs)
        except SystemExit as exc:
            if exc.code and not exit_ignore:
                raise
            return None
        except Exception:
            if raise_exceptions:
                raise
            ip.showtraceback(tb_offset=2)  # as IPython's own safe_execfile does
            return None

    ip.run_code, ip.showtraceback = run_code_exit_ok, showtraceback_exit_ok
    ip.safe_execfile = safe_execfile_exit_fails
    ip.events.register("pre_run_cell", _cell_begins)  # a whole cell (run_code runs each statement)
    ip.events.register("post_run_cell", _cell_ended)
    import warnings

    warnings.filterwarnings("ignore", message="To exit: use 'exit', 'quit'")  # IPython's, after a SystemExit


def _cell_begins(info=None) -> None:
    """When a cell began: the processes started since are the cell's."""
    _shell["began"] = children.now()


def _cell_ended(result) -> None:
    """A cell that failed ends the processes it started; one interrupted (a timeout, Ctrl-C, another rank's
    failure) ends every process this rank started: each says how many."""
    error = getattr(result, "error_in_exec", None)
    if isinstance(error, KeyboardInterrupt):
        children.end_started(None, _pool.get("rank"), "it was interrupted", "this rank")
    elif error is not None and not clean_exit(error):
        children.end_started(_shell.get("began", 0.0), _pool.get("rank"), f"it raised {type(error).__name__}",
                             "this cell")


def missing_script(path: str, rank, host: str, folder: str, notebook_folder: str | None) -> str:
    """What a rank says when the script is not in its folder (``notebook_folder``: the notebook's folder
    where this host does not have it, else None).

    >>> missing_script("train.py", 1, "node2", "/home/u", "/w")  # doctest: +NORMALIZE_WHITESPACE
    "train.py: no such file in rank 1's folder /home/u on node2 (the notebook's folder /w is not on node2:
    copy the script there, or give its path on that host)."
    >>> missing_script("train.py", 0, "vm", "/w", None)
    "train.py: no such file in rank 0's folder /w on vm."
    """
    away = (f" (the notebook's folder {notebook_folder} is not on {host}: copy the script there, or give its "
            "path on that host)") if notebook_folder is not None else ""
    return f"{path}: no such file in rank {rank}'s folder {folder} on {host}{away}."


def run_script(path: str, argv: list[str], cwd: str | None = None) -> None:
    """Run the script at ``path`` as ``python path *argv`` would in a new torchrun process.

    It runs as a fresh ``__main__`` module (``sys.modules["__main__"]`` while it runs: pickle and
    multiprocessing find its classes there), with ``sys.argv`` ``[path, *argv]`` and the script's folder first
    on ``sys.path``, after :func:`workbench.engine.fresh.begin` (the user's modules read again, the
    frameworks' singletons, torch's settings and seeds, the environment as a new process has them); ``cwd``
    (the notebook's folder): the rank works there where its host has it. The script's globals go to the
    rank's namespace afterwards, for the next cells. A zero exit is success, another raises; a script that
    is not there raises naming the rank's folder and host (:func:`missing_script`).
    """
    followed = cwd is not None and os.path.isdir(cwd)
    if followed:
        os.chdir(cwd)
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise FileNotFoundError(missing_script(path, _pool.get("rank"), socket.gethostname(), os.getcwd(),
                                               None if followed else cwd))
    with open(full, "rb") as f:
        code = compile(f.read(), full, "exec")
    _script_starts()
    from IPython import get_ipython

    ip = get_ipython()
    ns = ip.user_ns if ip is not None else {}
    saved_argv, saved_main = sys.argv, sys.modules.get("__main__")
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=full, __builtins__=builtins, exit=Exit("exit"), quit=Exit("quit"))
    folder = os.path.dirname(full)
    fresh.begin()
    sys.argv = [path, *argv]
    sys.path.insert(0, folder)
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    except SystemExit as exc:
        if exc.code:
            raise
    finally:
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        sys.argv = saved_argv
        if sys.path and sys.path[0] == folder:
            del sys.path[0]
        fresh.end()
        ns.update({k: v for k, v in main.__dict__.items() if not (k.startswith("__") and k.endswith("__"))})
