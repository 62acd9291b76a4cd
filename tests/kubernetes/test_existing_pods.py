"""Engines in pods that already run (issue 41, as Monarch's ``KubernetesJob`` attaches to
pre-provisioned pods): ``PoolConfig(launcher="kubernetes", pods="LABELS")`` starts one engine in each pod
the selector chooses, over ``exec``, the connection file on its stdin. The pool creates no object; its stop
(or its kernel's end, which closes the exec streams) ends the engines and leaves the pods as they were."""

from __future__ import annotations

import json
import secrets
import signal
import sys
import time

import pytest

from tests.conftest import until
from tests.kubernetes import cluster as kc
from tests.kubernetes.conftest import config, kernel_with_pool, pod_processes
from workbench import Session

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::workbench.pool.machine.netif.UnauthenticatedNetworkWarning"),
]

SLEEPER = "import signal, sys, time; signal.signal(15, lambda *a: sys.exit(0)); time.sleep(3600)"


def trainer_pods(kube, tmp_path, label: str, n: int) -> list[str]:
    """``n`` pods a platform team would have made: this tree's Python, sleeping, labelled ``role=label``."""
    template = json.loads((tmp_path / "pod.json").read_text())
    names = []
    for i in range(n):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{label}-{i}", "labels": {"role": label}},
            "spec": {**template["spec"], "restartPolicy": "Never", "terminationGracePeriodSeconds": 1},
        }
        pod["spec"]["containers"] = [
            {**template["spec"]["containers"][0], "name": "main", "command": [sys.executable, "-c", SLEEPER]}
        ]
        kube.api_send("POST", f"/api/v1/namespaces/{kc.NAMESPACE}/pods", pod)
        names.append(pod["metadata"]["name"])

    def running() -> bool:
        got = [kube.api_get(f"/api/v1/namespaces/{kc.NAMESPACE}/pods/{n}") for n in names]
        return all(p and p["status"].get("phase") == "Running" for p in got)

    assert until(running, 90), "the platform's pods did not start"
    return names


def delete_pods(kube, names: list[str]) -> None:
    for name in names:
        kube.api_send("DELETE", f"/api/v1/namespaces/{kc.NAMESPACE}/pods/{name}?gracePeriodSeconds=0")
    until(lambda: all(kube.api_get(f"/api/v1/namespaces/{kc.NAMESPACE}/pods/{n}") is None for n in names), 60)


@pytest.mark.timeout(300)
def test_engines_start_in_pods_chosen_by_label_and_stop_leaves_them_running(namespace_left_clean, tmp_path):
    kube = namespace_left_clean
    label = f"trainer-{secrets.token_hex(3)}"
    cfg = config(tmp_path, kube, n=2)  # writes the template the platform's pods are made from
    names = trainer_pods(kube, tmp_path, label, 2)
    try:
        cfg = config(tmp_path, kube, n=2, pod_template=None, pods=f"role={label}")
        t0 = time.perf_counter()
        with Session(cfg) as s:
            print(f"kubernetes: engines in 2 running pods, group formed, in {time.perf_counter() - t0:.1f} s")
            assert sorted(r.host for r in s.ranks) == sorted(names)
            assert kube.objects() == []  # the pool made no object: no Secret, no pod
            s.run("import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)")
            assert [t.item() for t in s.pull("t")] == [2.0, 2.0]
            assert len(pod_processes()) >= 2
        # the engines ended with the pool; the pods run on as they were
        assert until(lambda: not pod_processes(), 30), [p.pid for p in pod_processes()]
        for name in names:
            pod = kube.api_get(f"/api/v1/namespaces/{kc.NAMESPACE}/pods/{name}")
            assert pod["status"]["phase"] == "Running"
    finally:
        delete_pods(kube, names)


@pytest.mark.timeout(300)
def test_a_killed_kernel_ends_its_engines_in_the_pods(namespace_left_clean, tmp_path):
    kube = namespace_left_clean
    label = f"trainer-{secrets.token_hex(3)}"
    config(tmp_path, kube, n=1)
    names = trainer_pods(kube, tmp_path, label, 1)
    try:
        cfg = config(tmp_path, kube, n=1, pod_template=None, pods=f"role={label}")
        with kernel_with_pool(cfg, tmp_path) as (kernel, _):
            assert pod_processes()
            kernel.send_signal(signal.SIGKILL)
            kernel.wait(10)
            t0 = time.perf_counter()
            # its exec stream closed with it: the engine in the pod saw its stdin end
            assert until(lambda: not pod_processes(), 30), [p.pid for p in pod_processes()]
            print(
                f"kubernetes: kernel SIGKILLed -> engines in running pods ended in "
                f"{time.perf_counter() - t0:.1f} s"
            )
    finally:
        delete_pods(kube, names)
