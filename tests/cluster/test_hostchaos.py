"""Host-level chaos (issue 38): faults that keep coming on the network-namespace hosts, over the ssh launcher.

6 ranks on 3 hosts (2 each), an elastic DDP run with ``replace=True``, and a seeded schedule of host faults
while replacements start and join (``scenario_ssh_chaos`` in tests/cluster/driver.py, the schedule by
:func:`tests.faults.chaos.run_chaos`): a host's link cut on the switch side for some seconds and restored,
every engine of a host killed (ranks and engines still starting), one rank killed. What holds, with the
checks the local chaos test uses (:func:`tests.faults.chaos.finished_as_asked`): every step done, every
sample taken once, the parameters of the fault-free run, the asked size restored and never exceeded, one
fault record per lost engine; and, once the links are back, nothing of the pool left on any host but its
ranks (the cut-off engines fenced), nothing at all after the stop.

Not yet: both seeds tried fail (strict xfails naming each finding, below). The first finding is reproduced
alone, in about 40 s, by the last test, which passes since the health watch judges a renumbered rank by its
own engine's beacons (renumber38). Seed 1 still fails after that fix (2 of 2 runs; its schedule varies with
timing): once the same way (rank 0 killed, the survivor "exited": before the fix's second part, the knock
at the group's endpoints for the survivor, a group old), once with the survivor, renumbered rank 0 after a
join on a cut host, silent 60 s while its port answered ("hung"): seed 2's standstill, it seems.
"""

from __future__ import annotations

import os

import pytest

from tests.cluster import infra
from tests.cluster.test_hostlost import check_nothing_left, check_params, cut_spec, ddp_setup
from tests.cluster.test_nodelost import sshd_pids, this_tree_python

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ENGINE_HOSTS = ("n1", "n2", "n3")
# Seed 1 failed the same way in 3 of 3 runs on the 2-core build machine (hostchaos38): with the run on its
# last two trained ranks, both on remote hosts, one is killed; the other, renumbered rank 0 by the regroup,
# is declared "exited (its host answered, its process was gone)" a few seconds later and the run fails with
# ``RankError: rank 0 (n3, cpu) died: its engine process P exited`` (P still in the rank map; the ssh kill at
# the stop found it alive). A knock's REFUSED verdict: the suspected cause is that the health watch judges a
# renumbered rank by what the rank number's previous holder said (``beacons.latest[rank]``: its silence
# clock and its gloo endpoints, workbench/session/health.py ``_knock_silent``), so the dead rank's closed
# port refuses for the survivor while the survivor forms its new group. Local pools never knock, so the
# local chaos test cannot meet it.
FINDING = ("issue 38 host chaos: after a regroup renumbers a remote survivor, a knock at the old holder's "
           "gloo port (refused: it was killed) declares the survivor exited; the run fails on its last rank")
# Seed 2 (WORKBENCH_HOSTCHAOS_SEEDS=2, 1 of 1 runs): after n1's link was cut for 2.1 s while ranks joined,
# the run stood still from step 1435 (on 1 rank) for about 5 minutes while 3 ranks were to join: a new engine
# "died before it joined (TimeoutError)", the scale back to 6 was refused after 120 s ("the run did not reach
# 6 ranks within 120 s (it has 4)"), then ranks 1-2 raised RegroupAbandoned (group 13 did not form: Gloo
# connectFullMesh ... Connect timeout) and the run failed 394 s in. Earlier in that run a joiner was also
# killed after "did not answer the regroup for 5 s" (issue 38's F2, on ssh).
STILL = ("issue 38 host chaos: a join after a link cut stands still for minutes and ends in "
         "RegroupAbandoned (Gloo connectFullMesh connect timeout)")
XFAIL = {1: FINDING, 2: STILL}
# the seeded runs take 150-450 s each and both seeds tried fail on the findings above: `make test` runs the
# first finding's 30 s reproducer (the last test) and no seed unless WORKBENCH_HOSTCHAOS_SEEDS names some
SEEDS = [pytest.param(seed, marks=pytest.mark.xfail(strict=True, reason=XFAIL[seed]) if seed in XFAIL else ())
         for seed in (int(x) for x in os.environ.get("WORKBENCH_HOSTCHAOS_SEEDS", "").split(",") if x)] or [
    pytest.param(None, marks=pytest.mark.skip(reason="no seed asked for (WORKBENCH_HOSTCHAOS_SEEDS=1,2)"))]


def chaos_spec(hosts: dict, workdir, seed: int, **more) -> dict:
    folder = workdir / f"steps-{seed}"
    folder.mkdir()
    names = {h: {"port": f"port{list(hosts).index(h)}", "netns": hosts[h][0].name,
                 "keep": sshd_pids(hosts[h][0])} for h in ENGINE_HOSTS}
    spec = {"hosts": ",".join(hosts[h][1] for h in ENGINE_HOSTS), "n": 2 * len(ENGINE_HOSTS),
            "python": this_tree_python(workdir), "interface": "wb0",
            "ssh_args": infra.Sshd.client_args(workdir), "names": names, "folder": str(folder), "seed": seed,
            "faults": 8, "steps": 3000, "until": 0.5, "gap": [4.0, 8.0], "cut_s": [2.0, 8.0], "pause": 0.02,
            "hang_timeout": 30, "deadline_s": 400, "fence_wait": 30}
    spec.update(more)
    return spec


@pytest.mark.parametrize("seed", SEEDS)
def test_host_faults_that_keep_coming_every_step_every_sample_once(four_hosts, workdir, seed):
    spec = chaos_spec(four_hosts, workdir, seed)
    result = infra.run_driver(four_hosts["head"][0], "ssh_chaos", spec, timeout=700, hostname="head",
                              workdir=workdir)
    said = "\n".join(f"  {t:7.2f} s {kind:10s} {did}" for t, kind, did in result["schedule"])
    print(f"seed {seed}: started in {result['start_s']:.0f} s, the run {result['seconds']:.0f} s, "
          f"{result['done']} faults, largest {result['largest']}\n{said}\n" + "\n".join(result["faults"]))
    log = open(result["log"]).read().splitlines()[-80:]
    assert "check_error" not in result, f"seed {seed}: {result['check_error']}\n{said}\n" + "\n".join(log)
    assert result["done"] >= 6, \
        f"seed {seed}: only {result['done']} faults before the run neared its end\n{said}"
    done = {kind for _, kind, did in result["schedule"] if not did.startswith("none")}
    assert {"cut", "kill_host"} <= done, f"seed {seed}: no host was cut or killed\n{said}"
    assert result["strays"] == {}, f"left on the hosts after the links came back: {result['strays']}"
    check_nothing_left(four_hosts)


def test_a_survivor_renumbered_by_a_regroup_is_not_taken_for_the_rank_it_replaces(three_hosts, workdir):
    """The host chaos finding, alone: 2 ranks, one on n1 and one on n2; rank 0's engine killed, and rank 1
    held (SIGSTOP) for 7 s meanwhile, as a loaded host holds a process. Rank 0 is found exited (its port
    refused), the regroup renumbers rank 1 as rank 0; still silent, the survivor must be knocked at its own
    port (which answers: it is up), not at the dead one's. The run then goes on on 1 rank."""
    steps = 40
    spec = cut_spec(three_hosts, workdir, engine_hosts=["n1", "n2"], n=2, cut="n1", steps=steps, at_step=8,
                    setup=ddp_setup(), kill_host="n1", stall={"host": "n2", "seconds": 7.0})
    del spec["port"]  # killed, not cut
    result = infra.run_driver(three_hosts["head"][0], "ssh_cut", spec, timeout=500, hostname="head",
                              workdir=workdir)
    texts = [f["first_failure"] for f in result["faults"]]
    print("\n".join(texts))
    assert "cell_error" not in result, f"{result['cell_error']}\n{texts}"
    assert [r[1] for r in result["ranks_after"]] == ["n2"], result["ranks_after"]
    # the killed engine was its host's only one: found exited (its port refused), the survivor never
    assert len(texts) == 1 and texts[0].startswith("host n1 lost: rank 0, exited (its host answered"), texts
    assert result["steps"] == [steps]
    check_params(result, steps)
    check_nothing_left(three_hosts)
