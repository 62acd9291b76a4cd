"""Pods lost while a pool runs (issue 41): a pod deleted mid-run of an elastic Trainer is a fault named from
the API's watch (before the heartbeats go silent), the run goes on, and with ``replace=True`` a new pod joins
it; a node whose kubelet stops goes NotReady and its rank is cut off, ``%dist restart`` brings it back in a
new pod on the other node; an engine OOM-killed by its pod's memory limit is named so; ``%dist scale`` adds
and removes pods; idle release and stop leave an empty namespace. Real cluster, real engines, gloo."""

from __future__ import annotations

import random
import time

import pytest
import torch

from tests.conftest import until
from tests.faults.test_elastic import (
    check_every_sample_once,
    final_params,
    reference,
    setup_code,
    step_reached,
)
from tests.kubernetes import cluster as kc
from tests.kubernetes.conftest import config, pod_template
from workbench import Session
from workbench.errors import WorkbenchError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::workbench.pool.machine.netif.UnauthenticatedNetworkWarning"),
]


def pods_of(kube, pool_id: str) -> dict[str, dict]:
    items = kube.api_get(f"/api/v1/namespaces/{kc.NAMESPACE}/pods")["items"]
    return {
        p["metadata"]["name"]: p
        for p in items
        if p["metadata"]["labels"].get("distributed-workbench/pool") == pool_id
    }


@pytest.mark.timeout(420)
def test_a_pod_deleted_mid_run_is_named_from_the_api_and_a_new_pod_joins(namespace_left_clean, tmp_path):
    kube = namespace_left_clean
    with Session(config(tmp_path, kube, n=3)) as s:
        code = setup_code().replace("hang_timeout=3,", "hang_timeout=3, replace=True,")
        s.run(code)
        victim = random.Random().randrange(3)
        pod = s.ranks[victim].host
        steps = 300
        handle = s.submit(f"result = trainer.run(steps={steps})")
        assert step_reached(s, random.Random().randrange(2, 10)), "the run did not get going"
        t_delete = time.time()
        kube.api_send("DELETE", f"/api/v1/namespaces/{kc.NAMESPACE}/pods/{pod}")
        result = handle.wait(300)
        assert sorted(r.outcome for r in result.ranks) == ["lost"] + ["ok"] * 3, [
            (r.rank.rank, r.outcome, r.stderr[-300:]) for r in result.ranks
        ]
        fault = next(f for f in s.faults if f.kind == "died")
        # named from the API's watch: the heartbeats would say "exited" or "sent no heartbeat"
        said = f"host {pod} lost: rank {victim}, ended: its pod was deleted after step"
        assert said in fault.first_failure, fault.first_failure
        print(
            f"kubernetes: pod deleted -> fault named {fault.time - t_delete:.2f} s -> next elastic step "
            f"{fault.time - t_delete + fault.recover_s:.2f} s"
        )
        assert fault.recover_s is not None
        # the replacement: a new pod, which joined the run at a step boundary
        assert s.world_size == 3 and pod not in {r.host for r in s.ranks}
        assert set(pods_of(kube, s.pool_id)) >= {r.host for r in s.ranks}
        events = s.pull("trainer.elastic.events", rank=2)
        assert events[-1]["joined"] == [2] and events[-1]["world_size"] == 3, events
        assert s.pull("trainer.step") == [steps] * 3
        check_every_sample_once(s.pull("log.steps"), steps)
        for got in final_params(s):
            torch.testing.assert_close(got, reference(steps))
    assert kube.objects() == []


@pytest.mark.timeout(420)
def test_a_node_whose_kubelet_stops_is_notready_and_restart_starts_a_new_pod(namespace_left_clean, tmp_path):
    kube = namespace_left_clean
    s = Session(config(tmp_path, kube, n=2)).start()
    stopped = None
    try:
        nodes = {name: p["spec"]["nodeName"] for name, p in pods_of(kube, s.pool_id).items()}
        assert sorted(nodes.values()) == sorted(kc.NODES)
        lost = s.ranks[1]
        stopped = nodes[lost.host]
        t0 = time.time()
        kube.stop_kubelet(stopped)
        # the engine still runs (a stopped kubelet leaves containers alone): only the API can tell
        assert until(lambda: 1 in s.dead_ranks(), kc.NODE_GRACE_S + 60), "the NotReady node was not seen"
        how = s.dead_ranks()[1]
        print(f"kubernetes: kubelet stopped -> rank named lost {time.time() - t0:.1f} s: {how}")
        assert how == f"cut off: its node {stopped} is NotReady (its kubelet stopped reporting)"
        assert s.restart() == [1]
        assert s.world_size == 2
        moved = pods_of(kube, s.pool_id)[s.ranks[1].host]
        assert s.ranks[1].host != lost.host and moved["spec"]["nodeName"] != stopped
        s.run("import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)")
        assert [t.item() for t in s.pull("t")] == [2.0, 2.0]
    finally:
        if stopped is not None:
            kube.start_kubelet(stopped)  # its pods can end only once their kubelet is back
            assert until(lambda: kube._node_ready(stopped), 90)
        s.stop()
    assert until(lambda: kube.objects() == [], 60), kube.objects()


@pytest.mark.timeout(300)
def test_an_engine_over_its_pods_memory_limit_is_named_oom_killed(namespace_left_clean, tmp_path):
    kube = namespace_left_clean
    cfg = config(tmp_path, kube, n=2)
    pod_template(tmp_path / "pod.json", memory="900Mi")
    with Session(cfg) as s:
        host = s.ranks[1].host
        with pytest.raises(WorkbenchError):
            s.run("import numpy\nif rank == 1:\n    hog = numpy.ones(2 * 1024**3 // 8)\n")
        assert until(lambda: 1 in s.dead_ranks(), 30)
        assert until(lambda: "OOM-killed" in s.pool.lost_hosts().get(host, ""), 30), s.pool.lost_hosts()
        print(f"kubernetes: OOM: rank 1 {s.dead_ranks()[1]}; the API: {s.pool.lost_hosts()[host]}")
    assert kube.objects() == []


@pytest.mark.timeout(300)
def test_scale_adds_and_removes_pods_and_idle_release_empties_the_namespace(namespace_left_clean, tmp_path):
    kube = namespace_left_clean
    s = Session(config(tmp_path, kube, n=2, idle_release=20)).start()
    try:
        assert len(s.scale(3)) == 3
        live = {n for n, p in pods_of(kube, s.pool_id).items() if p["status"]["phase"] == "Running"}
        assert {r.host for r in s.ranks} <= live and len(live) == 3
        s.run("import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)")
        assert [t.item() for t in s.pull("t")] == [3.0] * 3
        gone = s.ranks[2].host
        assert len(s.scale(2)) == 2
        assert until(
            lambda: (
                pods_of(kube, s.pool_id).get(gone, {}).get("status", {}).get("phase") in (None, "Succeeded")
            ),
            30,
        )
        # no cell for idle_release seconds: the pool stops itself and its objects go
        assert until(lambda: not s.running, 90), "idle release did not stop the pool"
        assert until(lambda: kube.objects() == [], 30), kube.objects()
    finally:
        s.stop()
