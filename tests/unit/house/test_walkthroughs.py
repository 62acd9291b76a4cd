"""Copying the walkthroughs into a folder: new files copied, unchanged ones updated, changed ones kept.

Real files in a temporary folder; the source is the checkout's notebooks/ (the wheel ships the same).
"""

from __future__ import annotations

import hashlib
import json

import pytest

from workbench.walkthroughs import MANIFEST, copy_walkthroughs, notebooks_dir, walkthroughs

pytestmark = pytest.mark.timeout(30)


def test_a_fresh_folder_gets_every_walkthrough(tmp_path):
    report = copy_walkthroughs(tmp_path / "nb")
    names = [p.name for p in walkthroughs()]
    assert report.copied == names and names[0] == "01_quickstart.ipynb" and "README.md" in names
    for name in names:
        assert (tmp_path / "nb" / name).read_bytes() == (notebooks_dir() / name).read_bytes()
    assert report.lines()[-1] == f"open them: jupyter lab {tmp_path / 'nb'}"


def test_a_changed_file_is_kept_and_named_an_unchanged_one_updated(tmp_path):
    copy_walkthroughs(tmp_path)
    mine, stale = tmp_path / "01_quickstart.ipynb", tmp_path / "02_data_parallel.ipynb"
    mine.write_text("my edits")
    # as if an older release had copied it: the manifest says it is as we left it
    stale.write_text("an older version of the walkthrough")
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    manifest[stale.name] = hashlib.sha256(stale.read_bytes()).hexdigest()
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))

    report = copy_walkthroughs(tmp_path)
    assert report.kept == ["01_quickstart.ipynb"] and mine.read_text() == "my edits"
    assert report.updated == ["02_data_parallel.ipynb"]
    assert stale.read_bytes() == (notebooks_dir() / stale.name).read_bytes()
    assert "kept (changed since they were copied, not overwritten): 01_quickstart.ipynb" in report.lines()
    assert copy_walkthroughs(tmp_path).kept == ["01_quickstart.ipynb"]  # and again: never overwritten


def test_a_file_there_before_any_copy_is_kept(tmp_path):
    (tmp_path / "03_fsdp.ipynb").write_text("someone else's notebook")
    report = copy_walkthroughs(tmp_path)
    assert report.kept == ["03_fsdp.ipynb"]
    assert (tmp_path / "03_fsdp.ipynb").read_text() == "someone else's notebook"


def test_bad_folders_are_refused_in_words(tmp_path):
    with pytest.raises(ValueError, match="is where the walkthroughs come from"):
        copy_walkthroughs(notebooks_dir())
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        copy_walkthroughs(tmp_path / "f")
