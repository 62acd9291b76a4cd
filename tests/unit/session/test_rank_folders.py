"""Where a rank works, and what it says when a script is not there, for ranks on a host that may lack the
notebook's folder (an ssh pool's hosts without a shared file system). The netns ssh hosts of
tests/cluster are not used here: the rank's side runs in this process on real folders (a folder that is
missing stands for one that host lacks); tests/torchrun checks the same through a real local pool."""

from __future__ import annotations

import os
import socket

import pytest

from workbench import remote
from workbench.engine import torchrun
from workbench.session import hints

pytestmark = pytest.mark.timeout(60)
HOST = socket.gethostname()


def test_a_rank_follows_the_notebooks_folder_only_where_its_host_has_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    assert remote.follow_folder(str(project)) == {"host": HOST, "folder": str(project)}
    assert os.getcwd() == str(project)
    assert remote.follow_folder(str(tmp_path / "not-on-this-host")) == {"host": HOST, "folder": str(project)}
    assert os.getcwd() == str(project)


def test_a_missing_script_names_the_ranks_folder_host_and_the_notebooks_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(torchrun._pool, "rank", 3)
    with pytest.raises(FileNotFoundError) as raised:
        torchrun.run_script("train.py", [], cwd=str(tmp_path / "notebooks"))
    assert str(raised.value) == (
        f"train.py: no such file in rank 3's folder {tmp_path} on {HOST} (the notebook's folder "
        f"{tmp_path / 'notebooks'} is not on {HOST}: copy the script there, or give its path on that host).")
    assert hints.file_not_found("FileNotFoundError", str(raised.value)) is False  # no second line under it


def test_a_script_in_the_ranks_own_folder_runs_there(tmp_path, monkeypatch):
    script = "import os, sys\nopen('ran.txt', 'w').write(os.getcwd() + ' ' + sys.argv[1])\n"
    (tmp_path / "train.py").write_text(script)
    monkeypatch.chdir(tmp_path)
    torchrun.run_script("train.py", ["7"], cwd=str(tmp_path / "not-on-this-host"))
    assert (tmp_path / "ran.txt").read_text() == f"{tmp_path} 7"


def test_the_line_under_a_percent_run_miss_names_each_hosts_folder():
    places = {0: ("node1", "/home/u"), 1: ("node1", "/home/u"), 2: ("node2", "/w/nb")}
    assert hints.where_ranks_look(places, "/w/nb") == (
        "the ranks look for files in their own folder: ranks 0-1 on node1 in /home/u; rank 2 on node2 in "
        "/w/nb; the notebook's folder /w/nb is not on node1: copy the file there, or give its path on that "
        "host.")
