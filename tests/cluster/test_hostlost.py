"""More hosts lost (issue 26, with issue 25's many-rank pool): network-namespace hosts over ssh, a host's
cable cut on the switch side (``ip link set portN down`` on the head's bridge) or every engine of a host
killed, during an elastic run.

- An elastic FSDP run loses a host: the ranks left rebuild the model on the smaller world from the last
  checkpoint and finish.
- A second host is cut while the regroup after the first is planned and waited for: one re-planned regroup,
  the run goes on on the first host's ranks, the faults name the lost hosts and never a survivor.
- 8 ranks on 4 hosts lose one host: the figure cut -> detected -> next step beside test_nodelost's 4 ranks
  on 2 hosts.
- 32 ranks on 4 hosts (8 engines each, issue 25): a cell across all, then every engine of one host killed
  mid-run: the fault names that host, the run goes on on 24 ranks.

In each, the parameters equal a single-process reference that took the same global batches: with the
"global" batch policy the optimization does not depend on the world size schedule, so that reference is
the one of a run that lost those ranks at that step. At the end nothing of the pool is left on any host
(process-tree diff of every namespace but its sshd).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.cluster import infra
from tests.cluster.test_nodelost import CUT_TO_STEP_S, sshd_pids, this_tree_python
from tests.faults.test_elastic import G, check_every_sample_once, reference, setup_code

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def cut_spec(hosts: dict, workdir, *, engine_hosts: list[str], n: int, cut: str, setup: str, steps: int,
             at_step: int, **more) -> dict:
    """The ``ssh_cut`` driver's spec: ``n`` ranks over ``engine_hosts``, the link of host ``cut`` down once
    every rank is past ``at_step`` of ``steps``."""
    ns, _ = hosts[cut]
    spec = {"hosts": ",".join(hosts[h][1] for h in engine_hosts), "n": n, "python": this_tree_python(workdir),
            "interface": "wb0", "ssh_args": infra.Sshd.client_args(workdir), "setup": setup, "steps": steps,
            "at_step": at_step, "port": f"port{list(hosts).index(cut)}", "wait": 150, "netns": ns.name,
            "keep": sshd_pids(ns), "fence_wait": 30, "restart": False}
    spec.update(more)
    return spec


def ddp_setup(g: int = G) -> str:
    return setup_code(g=g).replace("hang_timeout=3", "hang_timeout=30")


def check_params(result: dict, steps: int, g: int = G) -> None:
    want = reference(steps, g)
    for params in result["params"]:
        got = {k: torch.tensor(v, dtype=torch.float64) for k, v in params.items()}
        torch.testing.assert_close(got, want)


def check_nothing_left(hosts: dict) -> None:
    for name, (ns, _) in hosts.items():
        assert ns.wait_empty(keep=set(sshd_pids(ns))) == [], name


def went_on_and_fenced(result: dict, steps: int, hosts: dict, world: int) -> None:
    """The ranks left finished with the reference's parameters and a working group of ``world`` ranks;
    the cut-off engines stopped once the link came back, and nothing of the pool is left on any host."""
    check_params(result, steps)
    assert result["all_reduce"] == [float(world)] * world
    assert result["left_on_cut_host"] == [], (result["fence_heard"], result["fence_ssh"])
    check_nothing_left(hosts)


def outcomes_by_host(result: dict) -> list[tuple[str, str]]:
    return sorted((host, outcome) for _, host, outcome in result["outcomes"])


def figure(result: dict, fault: dict, what: str) -> float:
    cut_to_step = fault["time"] - result["t_cut"] + fault["recover_s"]
    print(f"{what} -> detected {fault['detect_s']:.2f} s -> next step {cut_to_step:.2f} s")
    return cut_to_step


def test_a_host_cut_during_an_elastic_fsdp_run_resumes_from_the_checkpoint_on_the_ranks_left(
        three_hosts, workdir):
    steps, at_step = 30, 8
    setup = setup_code("fsdp", f"[wb.Checkpoint({str(workdir / 'ckpt')!r}, every=5)]")
    spec = cut_spec(three_hosts, workdir, engine_hosts=["n1", "n2"], n=4, cut="n2", steps=steps,
                    at_step=at_step, setup=setup.replace("hang_timeout=3", "hang_timeout=30"))
    result = infra.run_driver(three_hosts["head"][0], "ssh_cut", spec, timeout=800, hostname="head",
                              workdir=workdir)
    assert "cell_error" not in result, result["cell_error"]
    assert outcomes_by_host(result) == [("n1", "ok")] * 2 + [("n2", "lost")] * 2, result["outcomes"]
    assert len(result["faults"]) == 1, result["faults"]
    fault = result["faults"][0]
    assert fault["first_failure"].startswith("host n2 lost: ranks 2-3"), fault["first_failure"]
    assert fault["first_failure"].endswith("continuing on 2 ranks (its shards from the last checkpoint)"), \
        fault["first_failure"]
    assert fault["recover_s"] is not None, fault
    figure(result, fault, "FSDP, 4 ranks on 2 hosts, link cut")

    assert "after_error" not in result, result["after_error"]
    assert [r[1] for r in result["ranks_after"]] == ["n1", "n1"]
    assert result["steps"] == [steps, steps]
    events = result["events"]
    assert all(e[-1]["source"] == "checkpoint" and e[-1]["world_size"] == 2 and e[-1]["lost"] == [2, 3]
               for e in events), events
    # the steps since the checkpoint were taken again: the last record of each step is what counts
    last = [list({rec[0]: rec for rec in log}.values()) for log in result["step_log"]]
    check_every_sample_once(last, steps)
    went_on_and_fenced(result, steps, three_hosts, world=2)


def test_a_second_host_lost_while_the_regroup_waits_is_one_replanned_regroup(four_hosts, workdir):
    steps, at_step = 40, 8
    n3, _ = four_hosts["n3"]
    second = {"port": "port3", "netns": n3.name, "keep": sshd_pids(n3)}
    spec = cut_spec(four_hosts, workdir, engine_hosts=["n1", "n2", "n3"], n=6, cut="n2", steps=steps,
                    at_step=at_step, setup=ddp_setup(), second=second)
    result = infra.run_driver(four_hosts["head"][0], "ssh_cut", spec, timeout=800, hostname="head",
                              workdir=workdir)
    assert result["t_second_cut"] is not None, "the kernel planned no regroup after the first cut"
    assert "cell_error" not in result, result["cell_error"]
    assert [r[1] for r in result["ranks"]] == ["n1", "n1", "n2", "n2", "n3", "n3"]
    assert outcomes_by_host(result) == [("n1", "ok")] * 2 + [("n2", "lost")] * 2 + [("n3", "lost")] * 2, \
        result["outcomes"]

    # the messages name the lost hosts, each once, and never the survivor
    texts = [f["first_failure"] for f in result["faults"]]
    print("\n".join(texts))
    assert len(texts) == 2, texts
    # ranks as the user knew them (the last group formed), not as the plan that never formed numbers them
    assert texts[0].startswith("host n2 lost: ranks 2-3"), texts
    assert texts[1].startswith("host n3 lost: ranks 4-5"), texts
    assert all("n1" not in t and t.endswith("continuing on 2 ranks") for t in texts), texts
    assert all(f["recover_s"] is not None for f in result["faults"]), result["faults"]
    figure(result, result["faults"][-1], "6 ranks on 3 hosts, a second link cut mid-regroup")

    # one regroup completed on the ranks left (the first plan was replaced before it formed)
    assert "after_error" not in result, result["after_error"]
    assert [r[1] for r in result["ranks_after"]] == ["n1", "n1"]
    assert result["steps"] == [steps, steps]
    events = result["events"]
    assert all(len(e) == 1 and e[0]["world_size"] == 2 for e in events), events
    assert all(e[0]["lost"] == [2, 3, 4, 5] for e in events), events
    check_every_sample_once(result["step_log"], steps)
    went_on_and_fenced(result, steps, four_hosts, world=2)


def test_eight_ranks_on_four_hosts_lose_one_host_and_go_on(five_hosts, workdir):
    steps, at_step = 40, 8
    spec = cut_spec(five_hosts, workdir, engine_hosts=["n1", "n2", "n3", "n4"], n=8, cut="n2", steps=steps,
                    at_step=at_step, setup=ddp_setup())
    result = infra.run_driver(five_hosts["head"][0], "ssh_cut", spec, timeout=800, hostname="head",
                              workdir=workdir)
    assert "cell_error" not in result, result["cell_error"]
    assert [r[1] for r in result["ranks"]] == [h for h in ("n1", "n2", "n3", "n4") for _ in range(2)]
    assert outcomes_by_host(result) == [("n1", "ok")] * 2 + [("n2", "lost")] * 2 + [("n3", "ok")] * 2 + [
        ("n4", "ok")] * 2, result["outcomes"]
    assert len(result["faults"]) == 1, result["faults"]
    fault = result["faults"][0]
    assert fault["first_failure"].startswith("host n2 lost: ranks 2-3"), fault["first_failure"]
    assert fault["first_failure"].endswith("continuing on 6 ranks"), fault["first_failure"]
    assert fault["detect_s"] is not None and fault["recover_s"] is not None, fault
    assert figure(result, fault, "8 ranks on 4 hosts, link cut") < CUT_TO_STEP_S

    assert "after_error" not in result, result["after_error"]
    assert [r[1] for r in result["ranks_after"]] == ["n1", "n1", "n3", "n3", "n4", "n4"]
    assert result["steps"] == [steps] * 6
    assert all(e[-1]["world_size"] == 6 and e[-1]["lost"] == [2, 3] for e in result["events"])
    check_every_sample_once(result["step_log"], steps)
    went_on_and_fenced(result, steps, five_hosts, world=6)


# Measured on the 2-core build machine (load 8-62): the 32 engines over ssh, each importing torch (no zygote
# on a remote host), took 219-495 s to start, and while the group formed many ranks' beacons were silent
# for more than 3 s, so the health watch declared them lost before the first cell. Since then a silent
# rank whose gloo port answers is up (workbench.pool.watch.knock), which removes that cause. On a 2-core
# machine about 3x faster (WORKBENCH_TEST_32_SSH=1) it passed: ready in 79-82 s, the host's 8 engines found
# exited 3.02-3.05 s after the kill, the next step 3.5-3.6 s after it, 161 s in all. On the slower machines
# the suite also runs on, the start alone is 4-8 minutes of both cores: run by hand, or where there are 8
# cores.
@pytest.mark.skipif((os.cpu_count() or 1) < 8 and not os.environ.get("WORKBENCH_TEST_32_SSH"),
                    reason="32 engines over ssh need >= 8 cores: on 2 their start (each imports torch) takes "
                    "4-8 minutes (measured; see the comment); WORKBENCH_TEST_32_SSH=1 runs it anyway")
@pytest.mark.timeout(1500)
def test_32_ranks_on_four_hosts_every_engine_of_one_host_killed_the_run_goes_on(five_hosts, workdir):
    steps, at_step = 20, 4
    g = 96  # the global batch: 3 samples a rank on 32 ranks, 4 on the 24 left
    engine_hosts = ["n1", "n2", "n3", "n4"]
    n3, _ = five_hosts["n3"]
    spec = cut_spec(five_hosts, workdir, engine_hosts=engine_hosts, n=32, cut="n3", steps=steps,
                    at_step=at_step, setup=ddp_setup(g), plain_cell=True, kill_host="n3", wait=400,
                    timeout=600)  # the pool's start and rendezvous: 32 engines over ssh on 2 cores
    del spec["port"]  # killed, not cut
    result = infra.run_driver(five_hosts["head"][0], "ssh_cut", spec, timeout=1400, hostname="head",
                              workdir=workdir)
    print(f"32 ranks on 4 hosts over ssh ready in {result['start_s']:.0f} s")
    assert [r[1] for r in result["ranks"]] == [h for h in engine_hosts for _ in range(8)]
    assert result["sums"] == [sum(range(1, 33))], result["sums"]  # the plain cell, across the 4 hosts
    assert "cell_error" not in result, result["cell_error"]
    assert outcomes_by_host(result) == sorted(
        (h, "lost" if h == "n3" else "ok") for h in engine_hosts for _ in range(8)), result["outcomes"]
    assert len(result["faults"]) == 1, result["faults"]
    fault = result["faults"][0]
    print(fault["first_failure"])
    assert fault["first_failure"].startswith("host n3 lost: ranks 16-23"), fault["first_failure"]
    assert fault["first_failure"].endswith("continuing on 24 ranks"), fault["first_failure"]
    assert fault["recover_s"] is not None, fault
    figure(result, fault, "32 ranks on 4 hosts, 8 engines killed")

    assert "after_error" not in result, result["after_error"]
    assert [r[1] for r in result["ranks_after"]] == [h for h in engine_hosts if h != "n3" for _ in range(8)]
    assert result["steps"] == [steps] * 24
    check_every_sample_once(result["step_log"], steps, g)
    check_params(result, steps, g)
    assert result["all_reduce"] == [24.0] * 24
    assert n3.wait_empty(keep=set(sshd_pids(n3))) == []
    check_nothing_left(five_hosts)
