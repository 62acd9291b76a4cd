"""Grouping of the ranks' stacks (pure functions over the answers the agents send)."""

from __future__ import annotations

import pytest

from workbench.session.stack_report import Stacks, group_stacks

pytestmark = pytest.mark.timeout(10)


def _frame(name, where, native=False):
    return {"name": name, "where": where, "text": "", **({"native": True} if native else {})}


def _answer(main, *others):
    threads = [{"name": "MainThread", "main": True, "frames": main}]
    threads += [{"name": name, "main": False, "frames": frames} for name, frames in others]
    return {"threads": threads}


ENGINE = [_frame("dispatch_shell", "ipykernel/kernelbase.py:400"),
          _frame("run_forever", "asyncio/base_events.py:607")]
COLLECTIVE = [_frame("all_reduce", "torch/distributed/distributed_c10d.py:3252"),
              _frame("wrapper", "c10d_logger.py:83"), _frame("<module>", "cell line 12"), *ENGINE]
LOADER = [_frame("__next__", "torch/utils/data/dataloader.py:725"), _frame("<module>", "cell line 12"),
          *ENGINE]


def test_sixty_four_ranks_in_a_collective_and_one_in_a_dataloader_come_out_odd_one_first():
    answers = {r: _answer(LOADER if r == 7 else COLLECTIVE) for r in range(64)}
    groups = group_stacks(answers)
    assert [(g.ranks[:2], len(g.ranks)) for g in groups] == [([7], 1), ([0, 1], 63)]
    assert groups[0].headline == "__next__ at torch/utils/data/dataloader.py:725 <- cell line 12"
    text = Stacks(answers, [], 0.2).format()
    assert "rank 7: __next__" in text and "ranks 0-6,8-63: all_reduce at" in text
    assert text.index("rank 7:") < text.index("ranks 0-6,8-63:")
    # below the cell's own frame lie IPython and the event loop: the same everywhere, not shown
    assert "kernelbase" not in text


def test_threads_the_same_everywhere_and_our_own_never_split_a_group():
    heartbeat = ("Thread-3 (run)", [_frame("run", "zmq/devices/basedevice.py:248")])
    a = _answer(COLLECTIVE, heartbeat, ("workbench-metrics-0", [_frame("wait", "threading.py:1")]))
    b = _answer(COLLECTIVE, ("Thread-5 (run)", heartbeat[1]),
                ("workbench-metrics-1", [_frame("x", "y.py:2")]))
    found = Stacks({0: a, 1: b}, [], 0.1)
    assert [g.ranks for g in found.groups] == [[0, 1]]
    assert [t["name"] for t in found.groups[0].threads] == ["MainThread"]
    assert found.format().endswith("threads the same on every rank (not shown): Thread-3 (run)")


def test_a_thread_only_some_ranks_have_splits_them_and_is_shown():
    worker = ("pin_memory", [_frame("_pin_memory_loop", "torch/utils/data/_utils/pin_memory.py:55")])
    groups = group_stacks({0: _answer(COLLECTIVE, worker), 1: _answer(COLLECTIVE)})
    assert [g.ranks for g in groups] == [[0], [1]]
    assert [t["name"] for t in groups[0].threads] == ["MainThread", "pin_memory"]


def test_idle_engines_are_one_group_wherever_their_loop_waits():
    a = _answer([_frame("select", "selectors.py:468"), *ENGINE])
    b = _answer([_frame("_run_once", "asyncio/base_events.py:1884"), *ENGINE])
    found = Stacks({0: a, 1: b}, [], 0.1)
    assert [(g.ranks, g.headline) for g in found.groups] == [([0, 1], "idle (no cell running)")]
    assert "thread MainThread: waiting for a cell" in found.format()


def test_native_frames_name_the_call_the_rank_waits_in_and_missing_ranks_are_named():
    native = [_frame("pthread_cond_wait", "libc.so.6", True),
              _frame("c10d::Work::wait", "libtorch_cpu.so", True),
              _frame("pybind11::cpp_function::dispatcher", "libtorch_python.so", True), *COLLECTIVE]
    answers = {0: {**_answer(native), "native": "ok"},
               2: {**_answer(COLLECTIVE), "native": "py-spy took over 20 s"}}
    found = Stacks(answers, [1], 0.5)
    assert found.groups[0].headline.endswith("<- cell line 12 (native: c10d::Work::wait)")
    text = found.format()
    assert "rank 1: no answer (dead, or its agent is not running)" in text
    assert "native frames: not shown (py-spy took over 20 s); Python stacks below" in text
    assert "    c10d::Work::wait (libtorch_cpu.so)" in text


def test_an_engine_handling_a_control_message_is_idle_and_an_apply_shows_its_function():
    probe = _answer([_frame("recv_multipart", "zmq/sugar/socket.py:818"),
                     _frame("_handle_recv", "zmq/eventloop/zmqstream.py:649"), *ENGINE])
    waiting = _answer([_frame("select", "selectors.py:468"), *ENGINE])
    applying = _answer([_frame("failed_frames", "workbench/remote.py:140"),
                        _frame("do_apply", "ipyparallel/engine/kernel.py:170"),
                        _frame("apply_request", "ipyparallel/engine/kernel.py:120"), *ENGINE])
    groups = group_stacks({0: waiting, 1: probe, 2: applying})
    assert [(g.ranks, g.headline) for g in groups] == [
        ([2], "failed_frames at workbench/remote.py:140"), ([0, 1], "idle (no cell running)")]
    assert [f["name"] for f in groups[0].threads[0]["frames"]] == ["failed_frames", "do_apply"]
