"""What keeps the pages true beside the strict build: the README is the front page (the two commands, a link
to every page), every repository path a page names exists, every claim of the security page names the tests
that attack it, the API reference documents every public name, and ``make bench`` has its tables' place."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import workbench

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
pytestmark = pytest.mark.timeout(60)

# a path into the repository, as a page names it (in backticks, a link or prose): tests/docs/test_pages.py
REPO_PATH = re.compile(r"(?<![\w./-])((?:tests|bench|notebooks|workbench|docs|extension|kernels)"
                       r"/[\w./-]*[\w/])")
TEST_FILE = re.compile(r"tests/[\w/]+\.py")
# what a command makes, named where the pages say which command: `make bench` and `bash bench/gpu.sh`
MADE_BY_COMMANDS = {"bench/.venv-anchors", "bench/results/gpu.json"}


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_ext" not in p.parts)


def missing_paths(text: str) -> list[str]:
    """The repository paths ``text`` names that are not there (a glob or a placeholder is no path)."""
    named = set(REPO_PATH.findall(text)) - MADE_BY_COMMANDS
    return sorted(p for p in named if not (ROOT / p).exists())


def test_every_repository_path_a_page_names_exists():
    gone = {page.relative_to(ROOT).as_posix(): missing_paths(page.read_text()) for page in [README, *pages()]}
    assert {page: paths for page, paths in gone.items() if paths} == {}


def test_a_path_that_is_not_there_is_found():
    text = "see `tests/docs/test_pages.py` and `tests/unit/test_no_such_thing.py`, [x](docs/nowhere.md)"
    assert missing_paths(text) == ["docs/nowhere.md", "tests/unit/test_no_such_thing.py"]


def claims_without_tests(page: str) -> list[str]:
    """The top-level bullets of ``page`` that name no test file, or one that is not there."""
    bullets = re.split(r"\n- ", page.split("\n- ", 1)[1]) if "\n- " in page else []
    wrong = []
    for bullet in bullets:
        tests = TEST_FILE.findall(bullet)
        if not tests or any(not (ROOT / t).is_file() for t in tests):
            wrong.append(bullet.split("\n")[0])
    return wrong


def test_every_security_claim_names_the_tests_that_attack_it():
    assert claims_without_tests((DOCS / "security.md").read_text()) == []


def test_a_claim_without_its_test_is_found():
    page = "# x\n\n- **Holds.** Attacked by `tests/docs/test_pages.py`.\n- **Also holds.** Trust us.\n"
    assert claims_without_tests(page) == ["**Also holds.** Trust us."]
    assert claims_without_tests(page.replace("Trust us", "`tests/unit/test_gone.py`")) == [
        "**Also holds.** `tests/unit/test_gone.py`."]


def documented() -> set[int]:
    """The objects the API reference renders (``::: path``, and a module's ``members: [...]``), by id."""
    found = set()
    for page in (DOCS / "reference").glob("*.md"):
        for entry in re.finditer(r"^::: ([\w.]+)\n((?:    .*\n)*)", page.read_text(), re.M):
            path, options = entry[1], entry[2]
            members = re.search(r"members: \[([^\]]*)\]", options)
            module, _, name = path.rpartition(".")
            try:
                obj = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError, ValueError):
                obj = importlib.import_module(path)
            found.add(id(obj))
            for member in (m.strip() for m in members[1].split(",")) if members else ():
                found.add(id(getattr(obj, member)))
    return found


def test_the_api_reference_documents_every_public_name():
    rendered = documented()
    defined = {name: getattr(importlib.import_module(workbench._LAZY.get(name, "workbench")), name)
               for name in workbench.__all__}
    assert sorted(name for name, obj in defined.items() if id(obj) not in rendered) == []


def test_the_readme_is_the_front_page():
    text = README.read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[:2] == ["Two commands", "A 60-second tour"], headings
    two = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    makefile = (ROOT / "Makefile").read_text()
    for command in ("demo", "test"):
        assert f"make {command} " in two and re.search(rf"^{command}:", makefile, re.M), command
    linked = set(re.findall(r"\]\((docs/[\w/.-]+\.md)\)", text))
    assert sorted(p.relative_to(ROOT).as_posix() for p in DOCS.glob("*.md")
                  if p.relative_to(ROOT).as_posix() not in linked) == []


def test_make_bench_writes_into_the_performance_page():
    from bench import summary

    assert summary.PAGE == DOCS / "performance.md"
    text = summary.PAGE.read_text()
    for begin, end in (summary.SCALE_MARKERS, (summary.BEGIN, summary.END)):
        assert 0 <= text.find(begin) < text.find(end), begin
    assert summary.BEGIN not in README.read_text()  # one copy of the table, the one make bench keeps
