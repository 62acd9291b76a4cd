"""The layering contract (issues 22, 36): arrows run down, one door to the engines, no privates across rooms,
no two modules with one file name, every send to the engines through the door, no per-launcher comparison
outside the launcher objects.

Each rule is a function over ``{module name: source}``, so the tests below run it on the package and on a
small crafted tree that breaks it (a rule that cannot fail would hold nothing).

Kernel side, top to bottom: the package's front (``workbench``, ``cli``) -> ``demo``, ``magics``, ``server``
-> ``widgets``, ``scatter``, ``preflight`` -> ``session`` -> ``remote`` (the door: the catalogue of
endpoints and the transport, ``remote.door``) -> ``pool`` and the kernel's metrics (``collector``,
``history``). Engine side: ``train`` and the engine's metrics
(``publisher``, ``sampler``) -> ``strategies`` -> ``engine``. Leaves (``config``, ``errors``, ``wire``,
``faults``, ``tables``, ``metrics.records``, ``walkthroughs``, ``cell_targets``, and ``pool.records.state``,
``pool.machine.devices``, ``pool.rankmap``, which import nothing of the package) may be imported from anywhere
and import only leaves.

Inside ``pool`` each subfolder is a room of its own, top to bottom: the pool's face (``cluster``: EnginePool;
``keeper``, ``overview``) -> ``launch`` (the launcher objects, over ipyparallel's launchers) -> ``processes``
(the pool's processes on this machine) -> ``records`` (what a pool writes for other processes), ``watch``
(how the kernel sees it alive) and ``machine`` (what this machine has).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import workbench
from workbench.config import LAUNCHERS

pytestmark = pytest.mark.timeout(60)

# (side, level): a module may import a module of its own unit, of a lower level on its side, or a leaf.
UNITS = {
    # the command line runs the demo (``workbench demo``): the demo is a step below it
    "workbench": ("kernel", 6), "workbench.cli": ("kernel", 6), "workbench.demo": ("kernel", 5),
    "workbench.magics": ("kernel", 5), "workbench.server": ("kernel", 5),
    "workbench.widgets": ("kernel", 4), "workbench.scatter": ("kernel", 4),
    "workbench.preflight": ("kernel", 4), "workbench.doctor": ("kernel", 4),
    "workbench.session": ("kernel", 3),
    "workbench.remote": ("door", 2),
    "workbench.pool": ("kernel", 1), "workbench.metrics": ("kernel", 1),
    # the pool's rooms (see POOL_ROOMS), below its face (cluster, keeper, overview)
    "workbench.pool.launch": ("kernel", 0.8), "workbench.pool.processes": ("kernel", 0.6),
    "workbench.pool.records": ("kernel", 0.4), "workbench.pool.watch": ("kernel", 0.4),
    "workbench.pool.machine": ("kernel", 0.4),
    "workbench.metrics.collector": ("kernel", 1), "workbench.metrics.history": ("kernel", 1),
    "workbench.metrics.publisher": ("engine", 4), "workbench.metrics.sampler": ("engine", 4),
    "workbench.train": ("engine", 3),
    "workbench.strategies": ("engine", 2),
    "workbench.engine": ("engine", 1),
    **{leaf: ("leaf", 0) for leaf in (
        "workbench.config", "workbench.errors", "workbench.wire", "workbench.faults", "workbench.tables",
        "workbench.metrics.records", "workbench.pool.records.state", "workbench.pool.machine.devices",
        "workbench.pool.rankmap", "workbench.walkthroughs", "workbench.cell_targets", "workbench.lines",
        "workbench.cell_output")},
}
# Subfolders of pool that are rooms of their own: arrows between them are checked, and privates stay in each.
POOL_ROOMS = ("workbench.pool.launch", "workbench.pool.processes", "workbench.pool.records",
              "workbench.pool.watch", "workbench.pool.machine")
# Arrows that are the design, not a slip: the zygote is the engines' parent (it imports what they import,
# once, then forks them).
ALLOWED = {("workbench.pool.processes.zygote", "workbench.engine.agent")}
# Privates of other libraries' objects that the package reads, and a room of ours also names.
FOREIGN_PRIVATES = {"_targets": "ipyparallel's AsyncResult._targets (the engine ids a cell went to)",
                    "_children": "ipyparallel's AsyncResult._children (a reply per engine; a HostCell's too)"}
# Collisions the other half of issue 22 (house-b) removes: remove the entry once it has landed.
PENDING_RENAMES: dict[str, str] = {}  # house-b renamed session/elastic.py (cell_elastic.py, recovery.py)
# A code string that imports a project module on the ranks: "import workbench..." / "from workbench... import"
CODE_IMPORT = re.compile(r"(^|[\n;])\s*(import|from)\s+workbench\b")
# Where per-launcher behaviour lives (issue 36): one class per launcher, chosen once from the config.
LAUNCHER_HOME = "workbench.pool.launch"
# Per-launcher comparisons still allowed while a room moves its sites to the launcher objects: module -> how
# many (none now: the session's went there when the funnel landed, issue 36).
PENDING_LAUNCHER_SITES: dict[str, int] = {}


def unit_of(module: str) -> str:
    """The longest entry of :data:`UNITS` that ``module`` is, or lies in."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in UNITS:
            return ".".join(parts[:n])
    raise AssertionError(f"{module} is in no unit of the layering contract: add it to UNITS")


def room_of(module: str) -> str:
    """``workbench.session.cell`` -> ``workbench.session``; a top-level module is its own room; a module of
    one of :data:`POOL_ROOMS` is in that room (``workbench.pool.launch.ssh`` -> ``workbench.pool.launch``)."""
    for room in POOL_ROOMS:
        if module == room or module.startswith(room + "."):
            return room
    return ".".join(module.split(".")[:2])


def package_sources(root: Path = Path(workbench.__file__).parent) -> dict[str, str]:
    sources = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("workbench", *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        sources[".".join(parts)] = path.read_text()
    return sources


def imports(module: str, tree: ast.AST, known: set[str]):
    """``(imported module, lazily, line)`` for every import of the package in ``tree``."""
    top = {id(node) for node in getattr(tree, "body", [])}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""  # the package uses no relative imports
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for name in names:
            if name.startswith("workbench.") or name == "workbench":
                yield name, id(node) not in top, node.lineno


def _is_package(module: str, known: set[str]) -> bool:
    return any(k.startswith(module + ".") for k in known)


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def arrows_up(sources: dict[str, str]) -> list[str]:
    """Rule (a): every import runs down the layers. The door reaches the engine side by lazy imports only
    (its job: the engines import the catalogue, ``workbench.remote``, which imports nothing at its top);
    its transport imports the leaves and the kernel below it (``pool``), never a room above it (the
    preflight check once made a circle with it)."""
    known, bad = set(sources), []
    for module, source in sources.items():
        side, level = UNITS[unit_of(module)]
        for target, lazy, line in imports(module, ast.parse(source), known):
            if room_of(target) == room_of(module) or (module, target) in ALLOWED:
                continue
            to_side, to_level = UNITS[unit_of(target)]
            if side == "door":
                below = to_side in ("engine", "leaf") or (to_side == "kernel" and to_level < level)
                ok = below and (lazy or (module != "workbench.remote" and to_side != "engine"))
            elif to_side == "leaf":
                ok = True
            elif to_side == "door":
                ok = side == "kernel" and level > to_level
            else:
                ok = side == to_side and level > to_level
            if not ok:
                bad.append(f"{module}:{line} imports {target} ({side} {level} -> {to_side} {to_level})")
    return bad


def second_doors(sources: dict[str, str]) -> list[str]:
    """Rule (b): the kernel reaches the engine side only through :mod:`workbench.remote`: it imports no
    engine-side module (not even lazily) and sends no code string that imports a project module."""
    known, bad = set(sources), []
    for module, source in sources.items():
        if UNITS[unit_of(module)][0] != "kernel":
            continue
        tree = ast.parse(source)
        for target, _, line in imports(module, tree, known):
            if (target != "workbench" and UNITS[unit_of(target)][0] == "engine"
                    and (module, target) not in ALLOWED):
                bad.append(f"{module}:{line} imports the engine side ({target}) past workbench.remote")
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                    and CODE_IMPORT.search(node.value)):
                bad.append(f"{module}:{node.lineno} sends code that imports a project module: {node.value!r}")
    return bad


def privates_across_rooms(sources: dict[str, str]) -> list[str]:
    """Rule (c): no ``_name`` (dunders aside) read off a module or object of another room.

    Off an imported module or name, the room is the import's; off any other object (``trainer._data``),
    a ``_name`` that only classes of other rooms define (``self._data = ...``, ``def _data``) is theirs.
    Writing a private of any object but ``self`` (``trainer._pending = None``) is flagged in any room: the
    object changes through its own methods.
    """
    known, trees = set(sources), {m: ast.parse(s) for m, s in sources.items()}
    owners: dict[str, set[str]] = {}  # private name -> rooms that define it
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = node.name
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                name = node.attr
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                name = node.id
            else:
                continue
            if _private(name):
                owners.setdefault(name, set()).add(room_of(module))
    bad = []
    for module, tree in trees.items():
        room, bound, foreign = room_of(module), {}, set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):  # torch's c10d._world is not ours
                foreign |= {(a.asname or a.name).split(".")[0] for a in node.names}
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workbench"):
                for a in node.names:
                    if _private(a.name) and room_of(node.module) != room:
                        bad.append(f"{module}:{node.lineno} imports {node.module}.{a.name}")
                    bound[a.asname or a.name] = room_of(node.module if f"{node.module}.{a.name}" not in known
                                                        else f"{node.module}.{a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("workbench."):
                        bound[a.asname or a.name.split(".")[0]] = room_of(a.name) if a.asname else "workbench"
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            value = node.value
            mine = isinstance(value, ast.Name) and value.id in ("self", "cls")
            if isinstance(node.ctx, ast.Store) and not mine:
                bad.append(f"{module}:{node.lineno} writes {ast.unparse(node)}")
                continue
            if isinstance(value, ast.Name) and value.id in bound:
                theirs = {bound[value.id]}
            elif isinstance(value, ast.Name) and value.id in ("self", "cls", *foreign):
                continue
            elif node.attr in FOREIGN_PRIVATES:
                continue
            else:
                theirs = owners.get(node.attr, set())
            if theirs and room not in theirs:
                bad.append(f"{module}:{node.lineno} reads {ast.unparse(node)} of {', '.join(sorted(theirs))}")
    return bad


# What makes ipyparallel send to the engines: a view's methods that always send, those that send when given
# ``block=`` (ours of the same names, Session.push and RankView.pull, take no ``block``), and making a view.
VIEW_SENDS = {"apply_sync", "apply_async", "execute", "map_sync", "map_async"}
BLOCKING_SENDS = {"push", "pull", "apply", "scatter", "gather", "map", "run"}
VIEW_MAKERS = {"direct_view", "load_balanced_view", "broadcast_view"}
# The side channel's own carriers besides the relay: a host's hub takes the relay's commands (COMMAND) and
# passes them on to its engines unchanged, and pushes its engines' messages up to the relay. It may
# subscribe to commands and push up, but it packs no command and holds no view: what reaches the engines
# is what the door sent (the rule still counts those in a carrier).
SIDE_CHANNEL_CARRIERS = {"workbench.pool.processes.host_hub"}


def sends_outside_the_door(sources: dict[str, str]) -> list[str]:
    """Rule (e): on the kernel side, only the door (``workbench.remote``: its transport, one object per
    process group) sends to the engines: no ipyparallel view made (``client[...]``, ``direct_view``...), no
    view's send (``apply_sync``, ``apply_async``, ``execute``, ``map_*``, or ``push``/``pull``/``apply``/
    ``scatter``/``gather`` given ``block=``), and no side-channel command (the ``COMMAND`` topic, a ``PUSH``
    socket up the channel: ``wire.pusher``) anywhere else. The user's own data and cells (``RankView``,
    ``%%distributed``) go through the door's user verbs. The engine side (its beacons, its metrics) is
    another direction: not counted."""
    bad = []
    for module, source in sources.items():
        if UNITS[unit_of(module)][0] != "kernel":
            continue
        carrier = module in SIDE_CHANNEL_CARRIERS
        for node in ast.walk(ast.parse(source)):
            what = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                name = node.func.attr
                if name in VIEW_SENDS or name in VIEW_MAKERS:
                    what = f"{name}()"
                elif name in BLOCKING_SENDS and any(k.arg == "block" for k in node.keywords):
                    what = f"{name}(block=...)"
                elif name == "pusher" and not carrier:
                    what = "a PUSH socket up the side channel"
                elif carrier and name == "pack" and node.args and _names_command(node.args[0]):
                    what = "a side-channel command made by a carrier (pack(COMMAND, ...))"
            elif isinstance(node, ast.Subscript) and (
                    isinstance(node.value, ast.Name) and node.value.id == "client"
                    or isinstance(node.value, ast.Attribute) and node.value.attr == "client"):
                what = "a view (client[...])"
            elif isinstance(node, ast.Attribute) and node.attr == "COMMAND" and not carrier:
                what = "a side-channel command (COMMAND)"
            elif isinstance(node, ast.ImportFrom) and any(a.name == "COMMAND" for a in node.names) \
                    and not carrier:
                what = "a side-channel command (COMMAND)"
            if what is not None:
                bad.append(f"{module}:{node.lineno} sends past the door: {what}")
    return bad


def _names_command(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "COMMAND" or \
        isinstance(node, ast.Name) and node.id == "COMMAND"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def shared_file_names(sources: dict[str, str]) -> list[str]:
    """Rule (d): no two modules with one file name (``__init__`` aside)."""
    seen: dict[str, list[str]] = {}
    for module in sources:
        if not _is_package(module, set(sources)):
            seen.setdefault(module.rsplit(".", 1)[-1], []).append(module)
    return [f"{name}.py: {', '.join(mods)}" for name, mods in sorted(seen.items()) if len(mods) > 1]


def launcher_comparisons(sources: dict[str, str]) -> list[str]:
    """Rule (e): what differs between launchers is asked of the launcher objects (:data:`LAUNCHER_HOME`),
    never decided elsewhere by a launcher's name: outside them no comparison (``==``, ``!=``, ``in``,
    ``not in``) of a launcher's name written out (``"slurm"``, or a tuple of names) with a value that holds
    one (``config.launcher``, ``launcher``, ``state.get("launcher")``, ``pool.launcher.name``), no ``match``
    on one with such a case, no table looked up by one (``ADVICE[config.launcher]``, ``.get(launcher)``),
    and no ``isinstance`` against a launcher class.

    Not an exemption but how it holds there: the config declares in each option's metadata which launchers
    take it (``launchers``, ``needed_by``: the options schema the magic and the panel are made from), and its
    validation reads that table without naming a launcher. A word that is also a launcher's name but means
    something else (a fault's origin ``"local"``) compares with no launcher, so it passes.
    """
    names, bad = set(LAUNCHERS), []
    for module, source in sources.items():
        if module == LAUNCHER_HOME or module.startswith(LAUNCHER_HOME + "."):
            continue
        tree = ast.parse(source)
        classes = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                   and (node.module or "").startswith(LAUNCHER_HOME) for a in node.names
                   if a.name[:1].isupper() and a.name not in ("Launcher", "KINDS", "LAUNCHERS")}
        for node in ast.walk(tree):
            what = None
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any(_launcher_names(o, names) for o in operands) and any(map(_holds_launcher, operands)):
                    what = "compares a launcher's name"
            elif isinstance(node, ast.Match) and _holds_launcher(node.subject) and any(
                    isinstance(p, ast.MatchValue) and _launcher_names(p.value, names)
                    for case in node.cases for p in ast.walk(case.pattern)):
                what = "matches a launcher's name"
            elif isinstance(node, ast.Subscript) and _keyed_by_launcher(node.slice):
                what = "looks up a table by launcher"
            elif _called(node, "get") and node.args and _keyed_by_launcher(node.args[0]):
                what = "looks up a table by launcher"
            elif _called(node, "isinstance") and len(node.args) == 2 and classes & {
                    n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}:
                what = "tests for a launcher class"
            if what:
                bad.append(f"{module}:{node.lineno} {what}: {ast.unparse(node)[:80]}")
    return bad


def _called(node: ast.AST, name: str) -> bool:
    """A call of ``name(...)`` or ``something.name(...)``."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == name) or (isinstance(func, ast.Attribute)
                                                                  and func.attr == name)


def _launcher_names(node: ast.AST, names: set[str]) -> bool:
    """A launcher's name written out: ``"slurm"``, or a tuple, list or set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_launcher_names(e, names) for e in node.elts)
    return False


def _holds_launcher(node: ast.AST) -> bool:
    """An expression that holds a launcher (its name or its object): it reads a ``launcher`` (a name, an
    attribute, or the key ``"launcher"``)."""
    return any((isinstance(n, ast.Name) and n.id == "launcher") or (isinstance(n, ast.Attribute)
               and n.attr == "launcher") or (isinstance(n, ast.Constant) and n.value == "launcher")
               for n in ast.walk(node))


def _keyed_by_launcher(key: ast.AST) -> bool:
    """A lookup key that is a launcher (``config.launcher``), not the key ``"launcher"`` of a record."""
    return not isinstance(key, ast.Constant) and _holds_launcher(key)


def _pending_launcher_sites(found: list[str]) -> list[str]:
    """``found`` less the sites :data:`PENDING_LAUNCHER_SITES` still allows (never more than it counts)."""
    seen: dict[str, int] = {}
    left = []
    for line in found:
        module = line.split(":")[0]
        seen[module] = seen.get(module, 0) + 1
        if seen[module] > PENDING_LAUNCHER_SITES.get(module, 0):
            left.append(line)
    return left


RULES = [arrows_up, second_doors, privates_across_rooms, shared_file_names, sends_outside_the_door,
         launcher_comparisons]


def in_a_fresh_interpreter(rule) -> list:
    """``rule`` over the package, run in a new interpreter. CPython 3.11's AST builder counts its recursion
    per interpreter, not per thread (python/cpython#106905): a parse in this test process while one of its
    other threads compiled raised "SystemError: AST constructor recursion depth mismatch" once in make test.
    """
    code = ("import json; from tests.unit.house import test_layers as t; "
            f"print(json.dumps(t.{rule.__name__}(t.package_sources())))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50,
                          cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_the_package_keeps_the_rule(rule):
    found = in_a_fresh_interpreter(rule)
    if rule is shared_file_names:
        found = [line for line in found if line.split(":")[0] not in PENDING_RENAMES]
    if rule is launcher_comparisons:
        found = _pending_launcher_sites(found)
    assert found == []


# Crafted trees: each breaks one rule (the real package's units, a few lines each).
BROKEN = {
    arrows_up: {"workbench.pool.cluster": "from workbench.session import Session\n",
                "workbench.session": "", "workbench.errors": "from workbench.pool import cluster\n",
                "workbench.pool": "", "workbench.remote": "from workbench.engine import guard\n",
                "workbench.engine.guard": "", "workbench.engine": "",
                # inside the pool: a launcher reaching up to the pool, a record down to the processes
                "workbench.pool.launch.ssh": "from workbench.pool.cluster import EnginePool\n",
                "workbench.pool.records.sharing": "def f():\n    from workbench.pool.processes import reap\n",
                "workbench.pool.processes.reap": "", "workbench.pool.launch": "",
                "workbench.pool.records": "", "workbench.pool.processes": "",
                # the circle that was: the door reaching up to the preflight check, which imports it
                "workbench.remote.door": "def f():\n    from workbench.preflight import run_check\n",
                "workbench.preflight": "from workbench import remote\n"},
    second_doors: {"workbench.session.group": "def f():\n    from workbench.engine import guard\n",
                   "workbench.session.elastic": 'JOIN = "x = 1\\nimport workbench.train.elastic as e"\n',
                   "workbench.engine.guard": "", "workbench.engine": "", "workbench.session": ""},
    privates_across_rooms: {"workbench.train.elastic": "def f(trainer):\n    trainer._cut = 1\n"
                                                       "    return trainer._pending\n",
                            "workbench.session.group": "from workbench.pool.machine import netif\n"
                                                       "netif._route()\n",
                            "workbench.magics.args": "from workbench.config import _FIELDS\n",
                            "workbench.strategies.x": "class T:\n    def f(self):\n        self._pending = 0",
                            "workbench.pool.machine.netif": "", "workbench.config": "_FIELDS = ()\n"},
    shared_file_names: {"workbench.widgets.cell": "", "workbench.session.cell": "", "workbench.session": "",
                        "workbench.widgets": ""},
    launcher_comparisons: {
        "workbench.session.group": 'def local(self):\n    return self.config.launcher == "local"\n',
        "workbench.pool.cluster": 'SET = {"mpi": "mpiexec"}\ndef f(self):\n'
                                  '    if self.launcher.name in ("mpi", "slurm"):\n'
                                  '        return SET[self.launcher.name] + ADVICE.get(launcher)\n',
        "workbench.server.manager": 'def f(state):\n    match state.get("launcher"):\n'
                                    '        case "ssh" | "mpi":\n            return state["launcher"]\n',
        "workbench.session.recovery": "from workbench.pool.launch.mpi import MPI\n"
                                      "def f(pool):\n    return isinstance(pool.launcher, MPI)\n",
        # not broken: a fault's origin "local" is no launcher; the launcher objects compare their own names
        "workbench.faults": 'def f(origin):\n    return origin == "local"\n',
        "workbench.pool.launch": 'def launcher_for(config):\n    return KINDS[config.launcher]\n',
        "workbench.pool.launch.ssh": 'def f(config):\n    return config.launcher == "ssh"\n'},
    sends_outside_the_door: {
        "workbench.session.group": "def f(pool, fn):\n    return pool.client[[0, 1]].apply_sync(fn)\n",
        "workbench.session.cell_elastic": "def f(view, plan):\n    view.push({'p': plan}, block=True)\n"
                                          "    return view.execute('x = 1', block=False)\n",
        "workbench.preflight": "import time\ndef f(client):\n    return client[0].apply_async(time.time)\n",
        "workbench.session.stack_report": "from workbench import wire\ndef f(sock, s, b):\n"
                                          "    sock.send_multipart(s.pack(wire.COMMAND, b))\n",
        # the door's own sends, the user's verbs that take no block=, the engine's beacons: none counted
        "workbench.remote.door": "def f(view, fn):\n    return view.apply_sync(fn)\n",
        "workbench.session.session": "def f(s):\n"
                                     "    return s.push({'x': 1}), s.pull('x'), s.view(0).apply(len)\n",
        "workbench.engine.agent": "from workbench import wire\n"
                                  "def f(ctx):\n    return wire.pusher(ctx, 'u')\n",
        # a host's hub carries commands down and pushes up (not counted), but makes none (counted)
        "workbench.pool.processes.host_hub": "from workbench import wire\ndef f(s, sock, b, ctx):\n"
                                             "    sock.send_multipart(s.pack(wire.COMMAND, b))\n"
                                             "    return wire.subscriber(ctx, 'o', wire.COMMAND), "
                                             "wire.pusher(ctx, 'u')\n",
        "workbench.pool.processes": "", "workbench.pool": "",
        "workbench.session": "", "workbench.remote": "", "workbench.engine": "", "workbench.wire": ""},
}
EXPECTED = {arrows_up: 6, second_doors: 2, privates_across_rooms: 4, shared_file_names: 1,
            sends_outside_the_door: 8, launcher_comparisons: 6}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_the_rule_fails_on_a_crafted_violation(rule):
    found = rule(BROKEN[rule])
    assert len(found) == EXPECTED[rule], found


def test_a_lazy_import_is_still_an_arrow():
    assert arrows_up({"workbench.pool.launch.spawn": "def f():\n    from workbench.magics import args\n",
                      "workbench.magics": "", "workbench.magics.args": "", "workbench.pool": ""})


def test_docstrings_may_show_imports_but_code_strings_may_not():
    doc = '"""Use it so:\n\n>>> import workbench as wb\n"""\n'
    assert second_doors({"workbench.session.x": doc, "workbench.session": ""}) == []
    sent = doc + 'CODE = f"from workbench.preflight import probe\\n_wb = probe({1})"\n'
    assert len(second_doors({"workbench.session.x": sent, "workbench.session": ""})) == 1
