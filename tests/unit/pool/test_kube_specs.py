"""The fast tier of the Kubernetes launcher (issue 41): the objects it sends, built and read by the API's own
models (the official client's), without a cluster. A pod, a GPU pod from a template and the Secret survive
the models unchanged (a field the API does not have, or of the wrong type, would not); a template keeps its
own settings and gains the engines' command, the Secret's mount and the GPU limit; the connection file is
never in an environment variable; the API's JSON of lost and blocked pods reads as the pool says it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("kubernetes")

from kubernetes.client import ApiClient, V1Pod, V1Secret  # noqa: E402

from workbench.config import PoolConfig  # noqa: E402
from workbench.pool.launch import kube_specs  # noqa: E402
from workbench.pool.launch.kube_watch import blocked_how, lost_how  # noqa: E402
from workbench.pool.launch.kubernetes import Kubernetes  # noqa: E402

pytestmark = pytest.mark.timeout(60)
PARENT = {"metadata": {"name": "wb-1a2b3c4d", "uid": "0b0e6c2a-5d3e-4a47-9f43-0f1f4f8a8a01"}}
GPU_TEMPLATE = {
    "kind": "Pod",
    "metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}},
    "spec": {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "training",
        "serviceAccountName": "trainer",
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"team": "a"}}}]}},
        "containers": [
            {
                "name": "engine",
                "image": "registry.example.org/wb:1",
                "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
                "resources": {"limits": {"memory": "64Gi"}},
                "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
            }
        ],
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
    },
}


def through_models(obj: dict, model) -> dict:
    return ApiClient().sanitize_for_serialization(model.from_dict(obj))


def pod(**changes) -> dict:
    args = dict(
        pool_id="1a2b3c4d",
        image="wb:1",
        engines=1,
        gpus=0,
        python="python3",
        engine_args=["--IPEngine.enable_nanny=False"],
        env={"OMP_NUM_THREADS": "1"},
        parent=PARENT,
    )
    return kube_specs.engine_pod(**{**args, **changes})


def test_a_cpu_pod_and_the_secret_are_what_the_api_reads():
    for sent in (
        pod(),
        pod(engines=4, gpus=4, node_selector={"gpu": "h100"}),
        pod(image=None, template=kube_specs.template_of(GPU_TEMPLATE), gpus=8, engines=8),
    ):
        assert through_models(sent, V1Pod) == sent
        kube_specs.check(sent)
    secret = kube_specs.connection_secret("1a2b3c4d", {"key": "s3cr3t", "location": "10.0.0.1"})
    assert through_models(secret, V1Secret) == secret


def test_a_template_keeps_its_settings_and_gains_the_engines():
    sent = pod(
        image=None,
        template=kube_specs.template_of(GPU_TEMPLATE),
        gpus=8,
        engines=8,
        node_selector={"pool": "gpu"},
    )
    spec, box = sent["spec"], sent["spec"]["containers"][0]
    assert box["image"] == "registry.example.org/wb:1" and spec["priorityClassName"] == "training"
    assert spec["affinity"] == GPU_TEMPLATE["spec"]["affinity"] and spec["serviceAccountName"] == "trainer"
    assert spec["tolerations"] == GPU_TEMPLATE["spec"]["tolerations"]
    assert box["resources"]["limits"] == {"memory": "64Gi", "nvidia.com/gpu": "8"}
    assert box["command"][:5] == ["python3", "-m", "workbench.pool.processes.pod_main", "--engines", "8"]
    assert [v["name"] for v in spec["volumes"]] == ["shm", "workbench-connection"]
    assert spec["volumes"][1]["secret"] == {"secretName": "wb-1a2b3c4d", "defaultMode": 0o400}
    assert {"name": "NCCL_DEBUG", "value": "WARN"} in box["env"]
    assert spec["nodeSelector"] == {"pool": "gpu"} and spec["restartPolicy"] == "Never"
    assert sent["metadata"]["labels"]["team"] == "a" and sent["metadata"]["annotations"] == {"note": "x"}
    assert sent["metadata"]["labels"][kube_specs.POOL_LABEL] == "1a2b3c4d"
    assert sent["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Secret", **PARENT["metadata"]}
    ]
    # the connection file is a mounted Secret: no environment variable holds it, nor the ipyparallel paths
    assert not [e for e in box["env"] if e["name"].startswith("IPP_") or "s3cr3t" in json.dumps(e)]


def test_a_misspelt_or_mistyped_template_is_refused_naming_the_field():
    bad = json.loads(json.dumps(GPU_TEMPLATE))
    bad["spec"]["tolerashuns"] = bad["spec"].pop("tolerations")
    with pytest.raises(ValueError, match=r"fields a Pod does not have: spec\.tolerashuns"):
        kube_specs.check(pod(image=None, template=kube_specs.template_of(bad)))
    bad = json.loads(json.dumps(GPU_TEMPLATE))
    bad["spec"]["priorityClassName"] = 7
    with pytest.raises(ValueError, match="not a valid Pod: priorityClassName"):
        kube_specs.check(pod(image=None, template=kube_specs.template_of(bad)))


def test_the_launcher_refuses_what_cannot_work_before_asking_a_cluster(tmp_path):
    with pytest.raises(ValueError, match="needs the engines' container image"):
        Kubernetes(PoolConfig(launcher="kubernetes")).check_capacity(2)
    with pytest.raises(ValueError, match="does not fill pods of 4 engines"):
        Kubernetes(PoolConfig(launcher="kubernetes", image="wb:1", gpus_per_pod=4)).check_capacity(6)
    (tmp_path / "t.yaml").write_text("kind: Pod\nspec:\n  containers:\n  - name: engine\n    image: 5\n")
    with pytest.raises(ValueError, match="not a valid Pod"):
        Kubernetes(PoolConfig(launcher="kubernetes", pod_template=str(tmp_path / "t.yaml"))).check_capacity(1)
    with pytest.raises(ValueError, match="pods starts the engines in pods that already run"):
        PoolConfig(launcher="kubernetes", pods="role=a", image="wb:1")
    with pytest.raises(ValueError, match="only apply to --launcher kubernetes"):
        PoolConfig(launcher="slurm", namespace="team")


RUNNING = {"state": {"running": {"startedAt": "2026-12-04T21:00:00Z"}}, "ready": True}
# a container that stopped being ready by itself is the kubelet's word, not a node gone
STOPPED = {"state": {"terminated": {"reason": "Completed", "exitCode": 0}}, "ready": False}
FAILED = {"state": {"terminated": {"reason": "Error", "exitCode": 3}}}
CREATING = {"state": {"waiting": {"reason": "ContainerCreating"}}}


def pod_json(phase: str, container: dict, ready: str | None = None) -> dict:
    """A pod as the API's JSON has it: ``phase``, one container's status, its Ready condition if any."""
    status = {"phase": phase, "containerStatuses": [container]}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": ready}]
    return {"metadata": {"name": "wb-1a-x"}, "spec": {"nodeName": "n2"}, "status": status}


@pytest.mark.parametrize(("pod", "lost"), [
    (pod_json("Running", RUNNING, "True"), None),
    (pod_json("Failed", FAILED), "ended: its pod failed (Error, exit code 3)"),
    (pod_json("Running", STOPPED, "False"), None),
    (pod_json("Running", RUNNING, "False"),
     "cut off: its node n2 is NotReady (its kubelet stopped reporting)"),
], ids=["running", "failed", "container-stopped", "node-notready"])
def test_the_apis_json_of_a_pod_reads_as_the_pool_says_it(pod, lost):
    assert lost_how(pod) == lost


@pytest.mark.parametrize("pod", [pod_json("Running", RUNNING), pod_json("Pending", CREATING)],
                         ids=["running", "on-its-way"])
def test_a_pod_that_runs_or_is_on_its_way_is_not_blocked(pod):
    assert blocked_how(pod) is None
