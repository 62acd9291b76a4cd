"""What the training frameworks read to decide how to run, made to read as a torchrun process on the ranks.

- **Not interactive.** IPython sets ``sys.ps1`` "so that scripts can decide if they are running
  interactively" (``InteractiveShell.init_prompts``); nobody types at an engine, and Lightning reads
  ``sys.ps1`` as a notebook: ``Trainer(strategy="ddp")`` was refused ("not compatible with an interactive
  environment") and ``"auto"`` picked ``ddp_fork``. The ranks have no ``sys.ps1``, and a Lightning imported
  before that reads it again (:func:`not_interactive`).
- **No second launcher.** Lightning's multiprocessing launchers (``ddp_spawn``, ``ddp_fork``,
  ``ddp_notebook``, Fabric's the same) start N more processes on each rank, which is a torchrun process
  already (under torchrun they hang or fail too): they are refused at once, in one sentence that says to
  use ``ddp`` (:func:`refuse_launcher`), through a hook that patches Lightning's module when it is imported.

>>> print(refusal("Trainer", "fork", 2))  # doctest: +NORMALIZE_WHITESPACE
Trainer(strategy='ddp_notebook' or 'ddp_fork') would fork 2 more processes on each rank of the pool, which is
one of torchrun's processes already: use strategy='ddp' (or 'auto'), which trains across the pool's ranks here
as under torchrun.
"""

from __future__ import annotations

import functools
import importlib.abc
import sys

# Lightning's modules of its multiprocessing launcher (the unified package and the standalone ones).
LAUNCHERS = {
    "lightning.pytorch.strategies.launchers.multiprocessing": "Trainer",
    "pytorch_lightning.strategies.launchers.multiprocessing": "Trainer",
    "lightning.fabric.strategies.launchers.multiprocessing": "Fabric",
    "lightning_fabric.strategies.launchers.multiprocessing": "Fabric",
}
LIGHTNING = ("lightning", "pytorch_lightning", "lightning_fabric")
INTERACTIVE_FLAG = "_IS_INTERACTIVE"  # lightning.fabric.utilities.imports: hasattr(sys, "ps1") at import
STRATEGIES = {"spawn": "'ddp_spawn'", "fork": "'ddp_notebook' or 'ddp_fork'",
              "forkserver": "'ddp_forkserver'"}


def refusal(owner: str, start_method: str, processes) -> str:
    """The one sentence a multiprocessing launcher gets in the pool."""
    strategy = STRATEGIES.get(start_method, f"a '{start_method}' launcher")
    verb = "fork" if start_method == "fork" else "start"
    return (f"{owner}(strategy={strategy}) would {verb} {processes} more processes on each rank of the pool, "
            "which is one of torchrun's processes already: use strategy='ddp' (or 'auto'), which trains "
            "across the pool's ranks here as under torchrun.")


def refuse_launcher(module) -> None:
    """Make ``module``'s ``_MultiProcessingLauncher`` refuse to be made (idempotent)."""
    cls = getattr(module, "_MultiProcessingLauncher", None)
    if cls is None or getattr(cls.__init__, "__workbench_refuses__", False):
        return
    owner = LAUNCHERS.get(module.__name__, "Trainer")

    @functools.wraps(cls.__init__)
    def __init__(self, strategy, start_method="spawn", *args, **kwargs):
        raise ValueError(refusal(owner, start_method, getattr(strategy, "num_processes", "N")))

    __init__.__workbench_refuses__ = True
    cls.__init__ = __init__


def not_interactive() -> None:
    """No ``sys.ps1`` on this rank, and a Lightning imported while there was one reads so."""
    for name in ("ps1", "ps2", "ps3"):
        if hasattr(sys, name):
            delattr(sys, name)
    for name, module in list(sys.modules.items()):
        if name.startswith(LIGHTNING) and getattr(module, INTERACTIVE_FLAG, False) is True:
            # Lightning's own module constant, as it computes it without sys.ps1 (each module that did
            # `from ...imports import _IS_INTERACTIVE` holds a copy)
            setattr(module, INTERACTIVE_FLAG, False)


class _Patched(importlib.abc.Loader):
    """A module's own loader, then ``patch(module)``."""

    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):  # get_source, get_filename, ...: the module's own loader answers
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the modules in ``patches`` it wraps the loader the other finders give."""

    def __init__(self, patches: dict):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        patch = self.patches.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _Patched):
                    spec.loader = _Patched(spec.loader, patch)
                return spec
        return None


def install() -> None:
    """On a rank of the pool (when its group forms; idempotent)."""
    not_interactive()
    patches = dict.fromkeys(LAUNCHERS, refuse_launcher)
    for name in LAUNCHERS:
        if name in sys.modules:  # imported before: patched now
            refuse_launcher(sys.modules[name])
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(patches))
