"""environment.yml mirrors pyproject.toml (conda cannot be exercised here, so this keeps them honest)."""

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[3]


def test_environment_yml_pip_section_equals_pyproject_dependencies():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = lines.index("  - pip:") + 1
    pip = [ln.strip()[2:] for ln in lines[start:] if ln.strip().startswith("- ")]
    assert [p for p in pip if p != "-e ."] == deps


def test_torch_is_never_pinned_to_a_cuda_pull_by_itself():
    # the Makefile installs the pinned build first; the package only asks for a compatible range
    makefile = (ROOT / "Makefile").read_text()
    assert "TORCH_SPEC ?= torch==2.13.0" in makefile
    assert makefile.index('"$(TORCH_SPEC)"') < makefile.index('-e ".[test,docs,kubernetes]"')
