"""The public face: ``workbench.__all__`` is the lazy map's names plus the IPython hook, once each, and every
name resolves to what its module defines (the API reference is generated from exactly these names)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import workbench

pytestmark = pytest.mark.timeout(60)
HOOKS = ("load_ipython_extension",)  # defined in workbench/__init__.py itself, not loaded lazily


def face_mismatch(names: list[str], lazy: dict[str, str]) -> list[str]:
    """What differs between ``__all__`` and the lazy map with the hooks: doubled, missing, extra names."""
    wrong = [f"{n} twice in __all__" for n in sorted({n for n in names if names.count(n) > 1})]
    wrong += [f"{n} is loaded lazily but not in __all__" for n in sorted(set(lazy) - set(names))]
    extra = set(names) - set(lazy) - set(HOOKS)
    wrong += [f"{n} is in __all__ but neither lazy nor a hook" for n in sorted(extra)]
    wrong += [f"{n} (a hook) is not in __all__" for n in HOOKS if n not in names]
    return wrong


def test_all_is_the_lazy_map_and_the_hook():
    assert face_mismatch(list(workbench.__all__), workbench._LAZY) == []


def test_the_check_fails_on_a_crafted_face():
    lazy = {"Session": "workbench.session", "Trainer": "workbench.train"}
    assert len(face_mismatch(["Session", "Session", "Ghost", "load_ipython_extension"], lazy)) == 3
    hook_left_out = ["load_ipython_extension (a hook) is not in __all__"]
    assert face_mismatch(["Session", "Trainer"], lazy) == hook_left_out


def unresolved(names: list[str], lazy: dict[str, str]) -> list[str]:
    """The names that do not give what their module defines (the hook: something callable)."""
    wrong = []
    for name in names:
        found = getattr(workbench, name)
        if name in HOOKS:
            if not callable(found):
                wrong.append(name)
            continue
        if isinstance(found, types.ModuleType):
            # ``workbench.scatter`` is also a submodule: once imported, Python binds the module to the
            # package's name, and that module calls the function (workbench/scatter.py); a module that does
            # not is a name shadowed by its own module
            if not callable(found):
                wrong.append(f"{name}: {found!r}")
        elif found is not getattr(importlib.import_module(lazy[name]), name):
            wrong.append(f"{name}: {found!r}")
    return wrong


def test_each_public_name_resolves_to_what_its_module_defines():
    assert unresolved(list(workbench.__all__), workbench._LAZY) == []


def test_each_public_name_resolves_after_every_submodule_was_imported():
    """Worst case: the defining modules imported first, as other code of the package or a user may (importing
    ``workbench.train.export`` binds that module to ``workbench.train.export``, the function's own name)."""
    code = (
        "import importlib, json, pkgutil, workbench\n"
        "from tests.unit.house.test_public_face import unresolved\n"
        "for module in sorted(set(workbench._LAZY.values())):\n"
        "    package = importlib.import_module(module)\n"
        "    for sub in pkgutil.iter_modules(getattr(package, '__path__', [])):\n"
        "        importlib.import_module(f'{module}.{sub.name}')\n"
        "print(json.dumps(unresolved(list(workbench.__all__), workbench._LAZY)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50,
                          cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_dir_lists_the_face():
    assert set(workbench.__all__) <= set(dir(workbench))
