"""Every ``%dist run`` starts as clean as a new torchrun process (:func:`begin`, then :func:`end`).

A pool's rank lives on between scripts; a torchrun process does not. What a new process would not have,
a script run here does not find either:

- **modules from the user's folders** (any ``.py`` outside the standard library, site-packages and the
  workbench): read again, all of them, as a new process reads them (a ``datautils.py`` beside the script
  that was edited since the last run, and whatever imported from it);
- **the frameworks' process-wide state**: Accelerate's ``AcceleratorState``/``PartialState``/
  ``GradientState`` (which Transformers' ``TrainingArguments`` uses too), Lightning's reading of
  "interactive" (see :mod:`workbench.engine.frameworks`);
- **torch's process-wide settings**: default dtype and device, thread count, float32 matmul precision,
  deterministic algorithms, anomaly detection, grad mode as the rank had them when its group formed; the
  random generators (torch's, ``random``'s, NumPy's) seeded afresh from the system, as a new process is;
- **environment variables a script set** (``PL_GLOBAL_SEED``, ``ACCELERATE_USE_FSDP``...): undone at the
  next run, unless something changed them again since; what a cell set stays (as an exported shell variable
  before ``torchrun``).

What carries over, on purpose: the script's globals, in the rank's namespace for the next cells to look at
(a new run starts from its own fresh ``__main__`` all the same), the pool's process group and torchrun's
environment, the working folder.

>>> is_user_file(os.__file__), is_user_file(__file__)
(False, False)
"""

from __future__ import annotations

import linecache
import os
import random
import site
import sys
import sysconfig

import torch

# Variables the pool keeps up to date itself (torchrun's environment): never undone.
POOL_VARIABLES = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                            "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
                            "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                            "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS"})
_state: dict = {"torch": None, "env_before": None, "left": {}, "roots": None}


def _library_roots() -> tuple[str, ...]:
    """The folders whose modules are libraries, not the user's: the standard library, site-packages,
    the interpreter's prefixes and the workbench itself."""
    if _state["roots"] is None:
        paths = {*sysconfig.get_paths().values(), sys.prefix, sys.base_prefix, sys.exec_prefix,
                 sys.base_exec_prefix, *site.getsitepackages(),
                 os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}  # workbench/
        if site.ENABLE_USER_SITE:
            paths.add(site.getusersitepackages())
        roots = {os.path.abspath(p) for p in paths if p} | {os.path.realpath(p) for p in paths if p}
        _state["roots"] = tuple(sorted(r.rstrip("/") + "/" for r in roots))
    return _state["roots"]


def is_user_file(path: str | None) -> bool:
    """Whether a module read from ``path`` is the user's (a ``.py`` outside every library folder)."""
    if not isinstance(path, str) or not path.endswith(".py") or not os.path.isabs(path):
        return False  # built in, frozen, a namespace package, compiled (never read again), or not a file
    roots = _library_roots()  # the path as imported first: a realpath (a few stats) only where that misses
    return not path.startswith(roots) and not os.path.realpath(path).startswith(roots)


def user_modules() -> list[str]:
    """The names of the modules in ``sys.modules`` read from the user's folders (``torch.ops`` and the
    like, objects that call themselves ``_ops.py`` but were read from no file, are not)."""
    return [name for name, module in list(sys.modules.items())
            if is_user_file(getattr(module, "__file__", None))
            and getattr(getattr(module, "__spec__", None), "origin", None) == module.__file__]


def forget_user_modules() -> list[str]:
    """Drop the user's modules from ``sys.modules`` (and from their parent package's attributes), so that
    the next import reads them from their files; their names."""
    names = user_modules()
    for name in names:
        module = sys.modules.pop(name, None)
        parent, _, child = name.rpartition(".")
        if parent and getattr(sys.modules.get(parent), child, None) is module:
            delattr(sys.modules[parent], child)  # `from pkg import mod` looks here first
    linecache.checkcache()  # tracebacks and stacks show the lines as they are now
    return names


def _torch_settings() -> dict:
    return {"dtype": torch.get_default_dtype(), "threads": torch.get_num_threads(),
            "matmul": torch.get_float32_matmul_precision(),
            "deterministic": (torch.are_deterministic_algorithms_enabled(),
                              torch.is_deterministic_algorithms_warn_only_enabled()),
            "anomaly": torch.is_anomaly_enabled(), "grad": torch.is_grad_enabled()}


def keep_torch_settings() -> None:
    """Take the rank's torch settings as a new process's (when the pool's group forms, before user code)."""
    if _state["torch"] is None:
        _state["torch"] = _torch_settings()


def reset_torch() -> None:
    """torch's process-wide settings as :func:`keep_torch_settings` found them; fresh random seeds."""
    base = _state["torch"]
    if base is not None:
        torch.set_default_dtype(base["dtype"])
        if torch.get_num_threads() != base["threads"]:
            torch.set_num_threads(base["threads"])
        torch.set_float32_matmul_precision(base["matmul"])
        torch.use_deterministic_algorithms(base["deterministic"][0], warn_only=base["deterministic"][1])
        torch.autograd.set_detect_anomaly(base["anomaly"])
        torch.set_grad_enabled(base["grad"])
    torch.set_default_device(None)
    torch.seed()  # every device's generator, from the system's entropy: a new process's are so seeded
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def reset_frameworks() -> list[str]:
    """The frameworks' process-wide singletons back to "never made"; the names of those that were made."""
    reset = []
    state = sys.modules.get("accelerate.state")
    if state is not None:
        if state.AcceleratorState._shared_state or state.PartialState._shared_state:
            reset.append("AcceleratorState")
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()
    from workbench.engine import frameworks

    frameworks.not_interactive()
    return reset


def _undo_environment() -> None:
    """Undo what the last script set in ``os.environ`` (where nothing changed it again since)."""
    for key, (before, after) in _state["left"].items():
        if os.environ.get(key) != after:
            continue
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
    _state["left"] = {}


def begin() -> None:
    """A script is about to run: clean what a new torchrun process would not have."""
    _undo_environment()
    forget_user_modules()
    reset_frameworks()
    reset_torch()
    _state["env_before"] = dict(os.environ)


def end() -> None:
    """The script ended (however): note what it set in the environment, for the next :func:`begin`."""
    before = _state["env_before"] or {}
    now = dict(os.environ)
    _state["left"] = {k: (before.get(k), now.get(k)) for k in before.keys() | now.keys()
                      if before.get(k) != now.get(k) and k not in POOL_VARIABLES}
    _state["env_before"] = None
