"""The Trainer owns every change to itself (issue 36): no module writes a Trainer's fields from outside.

A Trainer changes its model, optimizer, counters and wrappers only in its own methods (``self.model =``
in :mod:`workbench.train.trainer`, or in a subclass's methods such as the elastic one's); the elastic run,
the feeds, checkpoints and callbacks ask it through a method. Checked over the package's source:
a store, augmented store or ``del`` of ``<trainer>.<field>``, or a ``setattr(<trainer>, ...)``, where
``<trainer>`` is a name the package gives Trainers (``trainer``, ``….trainer``, or a parameter annotated
``Trainer``/``ElasticTrainer``), is a write from outside. ``self.<field>`` is the Trainer's own.

Count them on any tree (the figure in the issue's closing note)::

    python -c "from tests.unit.train import test_trainer_owns_itself as t; \\
               from tests.unit.house import test_layers as l; \\
               print(len(t.trainer_fields_from_outside(l.package_sources())))"
"""

from __future__ import annotations

import ast

import pytest

from tests.unit.house.test_layers import package_sources

pytestmark = pytest.mark.timeout(60)

TRAINER_NAMES = {"trainer"}


def _trainer_names(function: ast.AST) -> set[str]:
    """The names bound to a Trainer in ``function``: ``trainer`` and parameters annotated as a Trainer."""
    names = set(TRAINER_NAMES)
    args = getattr(function, "args", None)
    if args is not None:
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if a.annotation is not None and "Trainer" in ast.unparse(a.annotation):
                names.add(a.arg)
    return names


def _is_trainer(node: ast.AST, names: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in names
    return isinstance(node, ast.Attribute) and node.attr in TRAINER_NAMES


def trainer_fields_from_outside(sources: dict[str, str]) -> list[str]:
    """Every write of a Trainer's field by code that is not the Trainer (``module:line writes ...``)."""
    bad = []
    for module, source in sources.items():
        tree = ast.parse(source)
        scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                          ast.Lambda)))]
        seen: set[int] = set()
        for scope in reversed(scopes):  # innermost first: a parameter's annotation holds in its function
            names = _trainer_names(scope)
            for node in ast.walk(scope):
                if id(node) in seen:
                    continue
                if (isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del))
                        and _is_trainer(node.value, names)):
                    seen.add(id(node))
                    bad.append(f"{module}:{node.lineno} writes {ast.unparse(node)}")
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                      and node.func.id in ("setattr", "delattr") and node.args
                      and _is_trainer(node.args[0], names)):
                    seen.add(id(node))
                    bad.append(f"{module}:{node.lineno} writes {ast.unparse(node)}")
    return sorted(bad, key=lambda line: (line.split(":")[0], int(line.split(":")[1].split()[0])))


def test_no_module_writes_a_trainers_fields_from_outside():
    assert trainer_fields_from_outside(package_sources()) == []


CRAFTED = {
    "workbench.train.elastic": (
        "def sync(trainer, c):\n"
        "    trainer.step, trainer.epoch = c['step'], c['epoch']\n"  # 2
        "    trainer.skipped += 1\n"  # 1
        "    setattr(trainer, 'model', None)\n"  # 1
        "def rebuild(t: 'Trainer'):\n"
        "    t.optimizer = None\n"  # 1
        "class Callback:\n"
        "    def on_step_end(self, stats):\n"
        "        del self.trainer.history\n"  # 1
        "        self.step = 3\n"  # its own field: not counted
        "        trainer_like = object()\n"
        "        trainer_like.step = 1\n"  # not a Trainer's name: not counted
    ),
    "workbench.train.trainer": (
        "class Trainer:\n"
        "    def _next_epoch(self):\n"
        "        self.epoch += 1\n"  # its own: not counted
        "class PlainFeed:\n"
        "    def _next_batch(self, trainer):\n"
        "        trainer.epoch = trainer.epoch + 1\n"  # 1: the feed is not the Trainer
        "        trainer.model.wb_layout = None\n"  # the model's field, not the Trainer's: not counted
    ),
}


def test_the_rule_fails_on_a_crafted_violation():
    found = trainer_fields_from_outside(CRAFTED)
    assert len(found) == 7, found
    assert "workbench.train.trainer:6 writes trainer.epoch" in found  # the feed, in the Trainer's own module
