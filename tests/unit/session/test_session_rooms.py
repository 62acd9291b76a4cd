"""The session's rooms where they are pure: the door's catalogue and its refusals, a cell's call line, the
side channel's one list of commands (over a real relay, to a real agent), the running cell's ranks.

The rooms that need engines (the composition root, the door's sends, recovery) are tested on a real pool
in ``tests/pool/test_session_rooms_pool.py``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import until
from workbench import remote, wire
from workbench.engine import agent
from workbench.pool.rankmap import RankInfo
from workbench.pool.watch.beacons import BeaconReceiver
from workbench.remote.door import Commands, Door, call_text
from workbench.session.cell_elastic import Children

pytestmark = pytest.mark.timeout(60)


def test_every_endpoint_is_declared_once_with_its_pattern_and_real_arguments():
    """A reader finds every remote function in the catalogue, and how it is called; none passes on
    ``*args``/``**kwargs`` it does not name (four did: open_store, join, abort, join_alone)."""
    public = {name for name, fn in vars(remote).items() if inspect.isfunction(fn) and fn.__module__ ==
              remote.__name__ and not name.startswith("_")} - {"endpoint", "pattern_of"}
    assert public == set(remote.CATALOGUE)
    for name, entry in remote.CATALOGUE.items():
        assert entry.fn is getattr(remote, name) and entry.pattern in remote.Pattern
        kinds = {p.kind for p in inspect.signature(entry.fn).parameters.values()}
        assert not kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}, name
    assert remote.pattern_of(time.time) is None  # what preflight once sent from outside the catalogue


class Untouchable:
    """A pool whose client must not be reached: the door refuses before it sends."""

    channel = None

    @property
    def client(self):
        raise AssertionError("the door sent something it should have refused")


def test_the_door_calls_an_endpoint_only_the_way_it_is_declared():
    door = Door(Untouchable())
    rank = RankInfo(0, 0, 0, "h", 1, "cpu", 0)
    with pytest.raises(TypeError, match="'time' is not an endpoint of workbench.remote"):
        door.call_one(time.time, rank)
    with pytest.raises(TypeError, match="'describe' is declared on each rank, not on one rank"):
        door.call_one(remote.describe, rank)
    with pytest.raises(TypeError, match="'run_script' is declared inside a watched cell, not on each rank"):
        door.call(remote.run_script, [rank], "a.py", [])
    with pytest.raises(TypeError, match="'clock' is declared on one rank, not inside a watched cell"):
        door.cell(remote.clock, [rank])
    with pytest.raises(TypeError, match="'join' is declared on each rank, not on one rank"):
        door.call_one_within(1.0, remote.join, rank)


def test_a_cell_call_is_one_line_of_literals():
    """What ``%dist run`` runs on the ranks reads as the call it is; anything that is no literal is refused
    (it would not come back the same from the line)."""
    assert call_text("train.py", ["--steps", "5"], "/w") == "'train.py', ['--steps', '5'], '/w'"
    assert call_text({"members": [["h", 1]], "text": "x"}) == "{'members': [['h', 1]], 'text': 'x'}"
    assert call_text(size_mb=4.0, iters=10) == "size_mb=4.0, iters=10"
    for value in (object(), float("nan"), Path("/w")):
        with pytest.raises(TypeError, match="a cell's call takes literals"):
            call_text(value)


def _commands_in(path: Path) -> set[str]:
    """The members of wire.Command a module names (``Command.STOP``, ``wire.Command.STOP``)."""
    tree = ast.parse(path.read_text())
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and "Command" in (getattr(node.value, "id", None), getattr(node.value, "attr", None))}


def test_the_agent_carries_out_every_command_of_the_one_list():
    """The commands are one enumeration: the agent has a branch for each member, and matches no bare
    string of its own."""
    members = set(wire.Command.__members__)
    assert _commands_in(Path(agent.__file__)) == members
    handle = ast.parse(textwrap.dedent(inspect.getsource(agent.Agent.handle)))
    compared = [node for node in ast.walk(handle) if isinstance(node, ast.Compare)
                and any(isinstance(c, ast.Constant) and isinstance(c.value, str) for c in node.comparators)]
    assert compared == [], [ast.unparse(c) for c in compared]


def test_a_command_the_door_sends_is_carried_out_by_the_agent_and_an_unknown_one_is_dropped(channel):
    """The door's sender and the agent, over a real relay (forwarding once a session subscribed, as a
    pool's does): ``stop`` reaches the agent's thread (sent again until its subscription reached the
    relay); a command that is not one of the list is dropped and counted."""
    session = BeaconReceiver(channel)
    commands = Commands(channel)
    a = agent.Agent(channel, rank=0, generation=4)
    try:
        assert until(lambda: commands.send(wire.Command.STOP, [0], 4) or agent.stop_requested(), every=0.05)
        assert a.done[-1] == "stop"
        bad = a.bad
        unknown = wire.Signer(channel["key"]).pack(
            wire.COMMAND, b'{"do": "reboot", "ranks": [0], "generation": 4, "id": "x"}')
        assert a.handle(unknown) is None and a.bad == bad + 1
        with pytest.raises(ValueError):
            commands.send("reboot", [0], 4)  # the sender takes only the list's commands
    finally:
        a.close()
        commands.close()
        session.close()
        agent.clear_stop()


def test_a_pool_without_a_side_channel_sends_no_command():
    quiet = Commands(None)
    quiet.send(wire.Command.ABORT, [0], 1)  # nowhere to send: nothing, and no error
    quiet.close()


def test_a_regroup_renumbers_the_running_cell_in_place():
    """The elastic watch and the cell share one list of the cell's ranks: a renumbering seen by both."""
    a, b, c = (RankInfo(i, i, 0, "h", 10 + i, "cpu", 20 + i) for i in range(3))
    running = Children([(a, "ra"), (b, "rb"), (c, "rc")])
    seen_by_cell = running
    running.renumber([a, SimpleNamespace(**{**vars(c), "rank": 1})])  # b lost: c is rank 1 now
    assert [(r.rank, r.engine_id, reply) for r, reply in seen_by_cell] == [(0, 20, "ra"), (1, 21, "rb"),
                                                                              (1, 22, "rc")]
    running.append((b, "joined"))
    assert len(seen_by_cell) == 4
