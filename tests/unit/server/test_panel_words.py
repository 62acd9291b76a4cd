"""The server says its sentences in the panel's words (they were rewritten in the browser, with a table of
flags kept by hand there): the cases the browser's tests held, and a failure sent as its parts."""

from __future__ import annotations

import pytest

from workbench.config import pool_options
from workbench.pool.launch.start_errors import start_error
from workbench.server.panel_words import in_panel_words, problem

pytestmark = pytest.mark.timeout(30)

CASES = [
    # the Python class name in front goes; the field is called as the dialog calls it (issue 24 item 9)
    ("PoolStartError: only 1 of 2 engines registered within 0.2 s.",
     "only 1 of 2 engines registered within 0.2 s."),
    ("ValueError: n must be at least 1 (got 0): the pool needs one engine per rank.",
     "Engines must be at least 1 (got 0): the pool needs one engine per rank."),
    ("nodes must be at least 1 (got 0).", "Nodes must be at least 1 (got 0)."),
    ("the pool needs n engines", "the pool needs n engines"),
    ("engines exited. Their output:\nipyparallel.error.TimeoutError: no",
     "engines exited. Their output:\nno"),
    ("rank 1 raised a ValueError: bad", "rank 1 raised a ValueError: bad"),
    # the dialog's fields instead of command-line flags
    ("--launcher slurm starts engines on other machines, and cluster nodes cannot reach this kernel on "
     "loopback (127.0.0.1). Name the interface they reach it on, e.g. --interface eth0 (interfaces here: "
     "eth0 10.0.0.5, lo 127.0.0.1); --interface lo only works when the nodes are this machine.",
     "Launcher “slurm” starts engines on other machines, and cluster nodes cannot reach this kernel on "
     "loopback (127.0.0.1). Name the interface they reach it on, e.g. Interface “eth0” (interfaces here: "
     "eth0 10.0.0.5, lo 127.0.0.1); Interface “lo” only works when the nodes are this machine."),
    ("--launcher ssh needs the hosts to start engines on: --hosts node1,node2.",
     "Launcher “ssh” needs the hosts to start engines on: Hosts “node1,node2”."),
    ("only 0 of 2 engines registered within 0.2 s. Try a longer --timeout, or fewer engines.",
     "only 0 of 2 engines registered within 0.2 s. Try a longer Start timeout, or fewer engines."),
    ("-n 3 does not match 2 nodes x 4 GPUs = 8 engines: give one of them.",
     "Engines “3” does not match 2 nodes x 4 GPUs = 8 engines: give one of them."),
    ("gpus-per-node must be at least 1 (got 0).", "GPUs per node must be at least 1 (got 0)."),
    ("--- engine 0 ---\nboom", "--- engine 0 ---\nboom"),
    # what only code or the magics can set is left out
    ("-n 9 is more than this machine holds: 2 cores x 4 = 8 ranks. Start at most 8, or add --oversubscribe "
     "(PoolConfig(oversubscribe=True)) to start 9 anyway; nothing was started.",
     "Engines “9” is more than this machine holds: 2 cores x 4 = 8 ranks. Start at most 8, or tick "
     "Oversubscribe to start 9 anyway; nothing was started."),
    ("the controller exited. Check --interface or --address: it must name an address of this machine.",
     "the controller exited. Check Interface: it must name an address of this machine."),
    ("Run where `sbatch` is, or start a local pool: %dist start -n 2. Every process was stopped.",
     "Run where `sbatch` is, or start a local pool. Every process was stopped."),
]


@pytest.mark.parametrize(("said", "shown"), CASES)
def test_the_panel_reads_the_sentence_in_its_own_words(said, shown):
    assert in_panel_words(said) == shown


def test_every_field_of_the_dialog_is_named_by_its_label():
    """The table is the options' own: each dialog field's flag becomes its label, none kept by hand."""
    for option in pool_options():
        said = in_panel_words(f"{option.flag} x is wrong.")
        if option.dialog is None:
            assert said == f"{option.flag} x is wrong.", option.name  # the dialog has no such field
        elif option.kind == "switch":
            assert said == f"{option.label} x is wrong.", option.name
        else:
            assert said == f"{option.label} “x” is wrong.", option.name


def test_a_failed_start_is_sent_as_its_parts(tmp_path):
    log = tmp_path / "pool.log"
    log.write_text("2026-11-30 20:54:50.299 [IPController] Hub listening\n"
                   "sbatch: error: --partition nosuch\n")
    error = start_error("slurm could not start the engines: `sbatch x` exited with 1",
                        "Check the Slurm options. Or start a local pool: %dist start -n 2.", log=log)
    assert problem(error) == {
        "what": "slurm could not start the engines: `sbatch x` exited with 1:",
        # the launcher's own words, as it said them (its flags are its own, not the dialog's)
        "tail": ["sbatch: error: --partition nosuch"],
        "log": str(log),
        "todo": "Check the Slurm options. Or start a local pool. Every process started for the pool has "
                "been stopped.",
    }
    # the sentence the magic prints holds the same parts
    assert str(error).splitlines() == [
        "slurm could not start the engines: `sbatch x` exited with 1:",
        "  | sbatch: error: --partition nosuch",
        f"Log: {log}",
        "Check the Slurm options. Or start a local pool: %dist start -n 2. Every process started for the "
        "pool has been stopped."]


def test_any_other_failure_is_its_sentence():
    assert problem(RuntimeError("could not start the pool: boom")) == {
        "what": "could not start the pool: boom", "tail": [], "log": None, "todo": ""}
