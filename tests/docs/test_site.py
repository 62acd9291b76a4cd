"""The docs site builds with every warning an error (``mkdocs build --strict``, as ``make docs`` does), and
the same configuration fails on a crafted page that breaks it: a link to no page, an anchor that is not
there, a cross-reference to no object, an API entry for no object.

The crafted sites are the project's own ``mkdocs.yml`` (theme, plugins, validation, the docstring
extension) over a folder of two pages, so they take a few seconds each; nothing is fetched from the network.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "mkdocs.yml"
pytestmark = pytest.mark.timeout(240)


def mkdocs_build(config: Path, out: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of ``config`` into ``out``, from the repository's root, within 150 s."""
    try:
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError as exc:  # make test installs the extra: a missing one is a broken set-up, not a skip
        pytest.fail(f"{exc.name} is not installed: pip install -e '.[docs]' (make test does)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # the theme's notice about its successor, not a warning
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(out)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    began = time.monotonic()
    done = mkdocs_build(CONFIG, tmp_path / "site")
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr[-4000:]
    assert "WARNING" not in done.stderr, done.stderr[-4000:]
    print(f"the site built in {took:.1f} s")
    site = tmp_path / "site"
    session = (site / "reference" / "session" / "index.html").read_text()
    # the API reference is rendered from the docstrings, their doctests as highlighted Python sessions
    assert 'id="workbench.session.Session"' in session and '<span class="gp">&gt;&gt;&gt; </span>' in session
    assert ":class:`" not in session and ":meth:`" not in session
    assert (site / "security" / "index.html").is_file() and (site / "scaling" / "index.html").is_file()
    assert not (site / "_ext").exists()


def crafted_site(tmp_path: Path, page: str) -> subprocess.CompletedProcess:
    """The project's configuration over two pages: a home page with one API entry, and ``page``."""
    config = yaml.safe_load(CONFIG.read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n## A heading\n\n::: workbench.config.PoolConfig\n")
    (docs / "page.md").write_text(f"# A page\n\n{page}\n")
    config.update(docs_dir=str(docs), nav=["index.md", "page.md"])
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            python = plugin["mkdocstrings"]["handlers"]["python"]
            python["paths"] = [str(ROOT)]
            python["options"]["extensions"] = [str(ROOT / e) for e in python["options"]["extensions"]]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    return mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")


def test_a_crafted_site_that_breaks_nothing_builds(tmp_path):
    """The control: the crafted sites below fail for what their page breaks, not for how they are made."""
    done = crafted_site(tmp_path, "[Home](index.md#a-heading), [PoolConfig][workbench.config.PoolConfig].")
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.parametrize("page, says", [
    ("[gone](gone.md)", "contains a link 'gone.md', but the target is not found"),
    ("[a heading](index.md#no-such-heading)", "no-such-heading"),
    ("[a session][workbench.session.NoSuchSession]", "workbench.session.NoSuchSession"),
    ("::: workbench.session.NoSuchSession", "workbench.session.NoSuchSession"),
], ids=["link", "anchor", "cross-reference", "api-entry"])
def test_the_strict_build_fails_on_a_crafted_broken_page(tmp_path, page, says):
    done = crafted_site(tmp_path, page)
    assert done.returncode != 0, done.stderr[-4000:]
    assert says in done.stderr, done.stderr[-4000:]
