"""A Griffe extension: the package's docstrings as the API reference shows them.

The docstrings are written for ``help()`` and doctest, in reST habits; two of them would render badly:

- a Sphinx role (``:class:`~workbench.session.Session```) becomes a cross-reference that links when its
  target is on a reference page and is plain code otherwise (autorefs' ``optional`` reference: a role
  naming an internal room is not a broken link);
- a doctest (``>>>`` lines and their output, up to a blank line) becomes a ``pycon`` code block, its
  ``# doctest:`` flags removed.

Loaded by ``mkdocs.yml`` (``extensions:`` of the python handler); nothing here runs the code it documents.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|data|attr|exc|obj|const):"
                  r"`(?P<tilde>~?)(?P<target>[^`]+)`")
FLAGS = re.compile(r"\s*#\s*doctest:.*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def _target(obj: griffe.Object, target: str) -> str:
    """The full path ``target`` names, seen from ``obj`` (``.x`` relative to its package)."""
    target = target.strip().rstrip("()")
    if target.startswith("workbench"):
        return target
    if target.startswith("."):
        package = obj.module if obj.module.is_package else obj.module.parent
        return f"{package.path}{target}" if package is not None else target.lstrip(".")
    head, _, rest = target.partition(".")
    scope = obj if (obj.is_class or obj.is_module) else obj.parent
    try:
        found = scope.resolve(head) if scope is not None else head
    except griffe.NameResolutionError:
        return target
    return f"{found}.{rest}" if rest else found


def roles(obj: griffe.Object, text: str) -> str:
    def link(match: re.Match) -> str:
        shown = match["target"].strip()
        if match["tilde"]:
            shown = shown.rsplit(".", 1)[-1]
        identifier = _target(obj, match["target"])
        return f'<autoref identifier="{identifier}" optional><code>{shown}</code></autoref>'

    return ROLE.sub(link, text)


def rewrite(obj: griffe.Object, text: str) -> str:
    """Fence every run of ``>>>`` lines (with their continuation and output lines) as ``pycon``; turn the
    roles outside code blocks into references."""
    out, lines, i, fenced = [], text.splitlines(), 0, False
    while i < len(lines):
        line = lines[i]
        if FENCE.match(line):
            fenced = not fenced
        if fenced or not line.lstrip().startswith(">>>"):
            out.append(line if fenced else roles(obj, line))
            i += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        block = []
        while i < len(lines) and lines[i].strip():
            block.append(FLAGS.sub("", lines[i][len(indent):] if lines[i].startswith(indent) else lines[i]))
            i += 1
        if out and out[-1].strip():
            out.append("")
        out += [f"{indent}```pycon", *(f"{indent}{b}" for b in block), f"{indent}```"]
    return "\n".join(out)


class WorkbenchDocstrings(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs) -> None:
        if obj.docstring is not None and not obj.is_alias:
            obj.docstring.value = rewrite(obj, obj.docstring.value)
