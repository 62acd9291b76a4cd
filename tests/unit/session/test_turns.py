"""Turns within one notebook (workbench/session/turns.py): turns on disjoint sub-meshes are held at once, one
that meets a held turn waits (saying once behind what) until that turn ends, the whole pool meets everything.
Real threads; every wait is bounded and awaited on events, never slept for."""

from __future__ import annotations

import threading

import pytest

from workbench.session.meshes import WHOLE
from workbench.session.turns import Turns

pytestmark = pytest.mark.timeout(30)


class Told(list):
    """What a waiting turn said, and an event set once it said something."""

    def __init__(self):
        super().__init__()
        self.said = threading.Event()

    def __call__(self, turns) -> None:
        self.append(turns)
        self.said.set()


def in_thread(turns: Turns, keys, taken: threading.Event, told: Told, release: threading.Event):
    """Take a turn on ``keys`` in a thread and hold it until ``release``; ``told`` hears it wait."""
    def body():
        with turns.held(keys, "a cell", waiting=told):
            taken.set()
            release.wait(20)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def test_disjoint_sub_meshes_hold_turns_at_once():
    turns = Turns()
    with turns.held({"a"}, "a cell"):
        taken, release, told = threading.Event(), threading.Event(), Told()
        thread = in_thread(turns, {"b"}, taken, told, release)
        assert taken.wait(10), "a turn on sub-mesh b waited for one on sub-mesh a"
        assert told == []
        assert sorted(sorted(t.keys) for t in turns.now()) == [["a"], ["b"]]
        release.set()
        thread.join(10)
    assert turns.now() == [] and not turns.locked()


def test_a_turn_on_a_busy_sub_mesh_waits_for_it_and_says_behind_what():
    turns = Turns()
    first = turns.hold({"a"}, "a cell")
    taken, release, told = threading.Event(), threading.Event(), Told()
    thread = in_thread(turns, {"a", "b"}, taken, told, release)
    assert told.said.wait(10)
    assert not taken.is_set()  # still waiting: the turn on a is held
    [[behind]] = told
    assert behind.keys == frozenset({"a"}) and behind.what == "a cell"
    turns.give(first)
    assert taken.wait(10)
    release.set()
    thread.join(10)
    assert len(told) == 1  # said once


def test_the_whole_pool_meets_every_turn_and_the_lock_face_takes_it():
    turns = Turns()
    with turns.held({"b"}, "a cell"):
        assert turns.locked()
        assert not turns.acquire(blocking=False)  # the health watcher's look: a cell runs
        assert turns.try_hold({WHOLE}, "a restart") is None
    assert turns.acquire(blocking=False)
    assert turns.try_hold({"a"}, "a cell") is None  # the whole pool is held
    turns.release()
    assert not turns.locked()
    with turns:  # `with rooms.busy:` as with the lock it replaced
        assert turns.locked()
    assert not turns.locked()


def test_keys_read_when_the_turn_is_taken():
    """A cell's keys come from the sub-meshes as they are when its turn is taken (a split in progress holds
    the whole pool and changes them)."""
    turns = Turns()
    meshes: dict = {}
    split = turns.hold({WHOLE}, "a split")
    taken, release, told = threading.Event(), threading.Event(), Told()
    thread = in_thread(turns, lambda: set(meshes) or {WHOLE}, taken, told, release)
    meshes.update(a=[0, 1])
    turns.give(split)
    assert taken.wait(10)
    assert [t.keys for t in turns.now()] == [frozenset({"a"})]
    release.set()
    thread.join(10)
