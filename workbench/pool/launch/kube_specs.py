"""What the Kubernetes launcher asks the API server for, as plain dicts: the pool's Secret and its pods.

Pure functions (no client, no cluster): the fast tier validates them against the API's own models
(``tests/unit/pool/test_kube_specs.py``) and the cluster tier creates them.

Every object carries the pool's labels (:func:`labels`); the Secret that holds the controller's connection
file is the pool's **parent**: each pod names it in ``ownerReferences``, so deleting the Secret makes the
cluster's garbage collector delete every pod of the pool (the lease does just that). The connection file
reaches the engines as that Secret, mounted read-only (never an environment variable or a ConfigMap).

>>> pod = engine_pod(pool_id="1a2b3c4d", image="wb:1", engines=2, gpus=2, python="python3",
...                  engine_args=["--IPEngine.enable_nanny=False"], env={"OMP_NUM_THREADS": "1"})
>>> pod["spec"]["containers"][0]["resources"]
{'limits': {'nvidia.com/gpu': '2'}}
>>> pod["spec"]["containers"][0]["command"][:4]
['python3', '-m', 'workbench.pool.processes.pod_main', '--engines']
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

# label keys: a DNS-subdomain prefix of the project's own
PREFIX = "distributed-workbench"
POOL_LABEL = f"{PREFIX}/pool"
ROLE_LABEL = f"{PREFIX}/role"
CONTAINER = "engine"  # the container that runs the engines
SECRET_KEY = "engine.json"  # the controller's connection file, a key of the pool's Secret
MOUNT = "/var/run/distributed-workbench"  # where the Secret is mounted in each pod
GPU = "nvidia.com/gpu"
# a pod deleted ends at once (its engines leave on SIGTERM: workbench.pool.processes.pod_main); a few
# seconds, not 0, so the kubelet still confirms the end before the object goes
GRACE_S = 3


def labels(pool_id: str, role: str) -> dict[str, str]:
    """The labels of every object of pool ``pool_id`` (``role``: ``connection`` or ``engine``).

    >>> labels("1a2b3c4d", "engine")[POOL_LABEL]
    '1a2b3c4d'
    """
    return {"app.kubernetes.io/name": "distributed-workbench", "app.kubernetes.io/managed-by": PREFIX,
            POOL_LABEL: pool_id, ROLE_LABEL: role}


def selector(pool_id: str) -> str:
    """The label selector of every object of the pool.

    >>> selector("1a2b3c4d")
    'distributed-workbench/pool=1a2b3c4d'
    """
    return f"{POOL_LABEL}={pool_id}"


def secret_name(pool_id: str) -> str:
    return f"wb-{pool_id}"


def connection_secret(pool_id: str, connection: dict) -> dict:
    """The pool's parent object: a Secret holding the controller's engine connection file (its key signs
    every message, so it is a secret).

    >>> s = connection_secret("1a2b3c4d", {"key": "k"})
    >>> s["metadata"]["name"], s["type"], json.loads(s["stringData"][SECRET_KEY])
    ('wb-1a2b3c4d', 'Opaque', {'key': 'k'})
    """
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": secret_name(pool_id), "labels": labels(pool_id, "connection")},
            "stringData": {SECRET_KEY: json.dumps(connection)}}


def owner(secret: dict) -> dict:
    """An ``ownerReferences`` entry naming the pool's Secret (as the API returned it, with its uid)."""
    meta = secret["metadata"]
    return {"apiVersion": "v1", "kind": "Secret", "name": meta["name"], "uid": meta["uid"]}


def read_template(path: str | None) -> dict:
    """The pod template a file holds: a Pod, a PodTemplateSpec or a PodTemplate, in YAML or JSON, as
    ``{"metadata": ..., "spec": ...}`` (empty for none). A ValueError in one sentence otherwise.

    >>> import tempfile, os
    >>> f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    >>> _ = f.write("kind: Pod\\nspec:\\n  containers: [{name: engine, image: x}]\\n"); f.close()
    >>> read_template(f.name)["spec"]["containers"][0]["image"]
    'x'
    >>> os.unlink(f.name)
    """
    if not path:
        return {}
    try:
        text = Path(path).expanduser().read_text()
    except OSError as exc:
        raise ValueError(f"pod_template {path!r} cannot be read: {exc.strerror or exc}.") from None
    try:
        import yaml

        data = yaml.safe_load(text)
    except Exception as exc:  # yaml's own errors name the line
        raise ValueError(f"pod_template {path!r} is not YAML or JSON: {exc}") from None
    return template_of(data, path)


def template_of(data: Any, where: str = "pod_template") -> dict:
    """``{"metadata", "spec"}`` of a Pod, PodTemplateSpec or PodTemplate given as a dict.

    >>> template_of({"kind": "PodTemplate", "template": {"spec": {"containers": []}}})
    {'metadata': {}, 'spec': {'containers': []}}
    >>> template_of({"spec": 3})
    Traceback (most recent call last):
    ...
    ValueError: pod_template holds no pod spec: give a Pod, a PodTemplateSpec or a PodTemplate (with \
spec.containers).
    """
    if isinstance(data, dict) and data.get("kind") == "PodTemplate":
        data = data.get("template")
    if not isinstance(data, dict) or not isinstance(data.get("spec"), dict):
        raise ValueError(f"{where} holds no pod spec: give a Pod, a PodTemplateSpec or a PodTemplate (with "
                         "spec.containers).")
    meta = data.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("labels", "annotations") if k in meta},
            "spec": copy.deepcopy(data["spec"])}


def engine_command(python: str, engines: int, engine_args: list[str]) -> list[str]:
    """The engine container's command: the pod's supervisor starting ``engines`` engines, each reading the
    connection file from the mounted Secret.

    >>> engine_command("python3", 1, ["--x"])[3:]
    ['--engines', '1', '--', '--file=/var/run/distributed-workbench/engine.json', '--x']
    """
    return [python, "-m", "workbench.pool.processes.pod_main", "--engines", str(engines), "--",
            f"--file={MOUNT}/{SECRET_KEY}", *engine_args]


def engine_pod(*, pool_id: str, image: str | None, engines: int, gpus: int, python: str,
               engine_args: list[str], env: dict[str, str], node_selector: dict[str, str] | None = None,
               template: dict | None = None, parent: dict | None = None) -> dict:
    """A pod running ``engines`` engines (``gpus``: the ``nvidia.com/gpu`` it requests, one per engine; 0 for
    CPU engines), started from ``template`` (:func:`read_template`): its labels, annotations and spec are
    kept; the container named ``engine`` (else the first) gets the command, the environment, the Secret's
    mount and the GPU limit; ``image`` overrides the template's. ``parent``: the Secret as created (its
    ``ownerReferences`` entry). The name is made by the API server (``generateName``).

    >>> p = engine_pod(pool_id="1a2b3c4d", image=None, engines=1, gpus=0, python="py", engine_args=[],
    ...                env={}, template={"spec": {"containers": [{"name": "main", "image": "t:1"}]}})
    >>> p["spec"]["containers"][0]["image"], p["spec"]["restartPolicy"], p["metadata"]["generateName"]
    ('t:1', 'Never', 'wb-1a2b3c4d-')
    >>> engine_pod(pool_id="1a2b3c4d", image=None, engines=1, gpus=0, python="py", engine_args=[], env={})
    Traceback (most recent call last):
    ...
    ValueError: --launcher kubernetes needs the engines' container image: --image (or a pod_template whose \
container has one).
    """
    template = copy.deepcopy(template or {})
    meta = template.get("metadata") or {}
    spec = template.get("spec") or {}
    containers = spec.setdefault("containers", [])
    box = next((c for c in containers if c.get("name") == CONTAINER), containers[0] if containers else None)
    if box is None:
        box = {"name": CONTAINER}
        containers.append(box)
    if image:
        box["image"] = image
    if not box.get("image"):
        raise ValueError("--launcher kubernetes needs the engines' container image: --image (or a "
                         "pod_template whose container has one).")
    box["command"] = engine_command(python, engines, engine_args)
    box.pop("args", None)
    own_env = [{"name": k, "value": v} for k, v in env.items()]
    own_env += [{"name": "WORKBENCH_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "WORKBENCH_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "HOME", "value": "/tmp"}, {"name": "IPYTHONDIR", "value": "/tmp/.ipython"}]
    names = {e["name"] for e in own_env}
    box["env"] = [e for e in box.get("env") or [] if e.get("name") not in names] + own_env
    box["volumeMounts"] = [*(box.get("volumeMounts") or []),
                           {"name": "workbench-connection", "mountPath": MOUNT, "readOnly": True}]
    if gpus:
        resources = box.setdefault("resources", {})
        resources.setdefault("limits", {})[GPU] = str(gpus)  # a quantity: the API's JSON has it a string
        if GPU in (resources.get("requests") or {}):
            resources["requests"][GPU] = str(gpus)
    spec["volumes"] = [*(spec.get("volumes") or []),
                       {"name": "workbench-connection",
                        "secret": {"secretName": secret_name(pool_id), "defaultMode": 0o400}}]
    spec["restartPolicy"] = "Never"  # a lost engine is the pool's to replace, never the kubelet's
    spec.setdefault("terminationGracePeriodSeconds", GRACE_S)
    spec.setdefault("automountServiceAccountToken", False)  # the engines never talk to the API
    spec.setdefault("enableServiceLinks", False)
    if node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **node_selector}
    metadata = {"generateName": f"wb-{pool_id}-",
                "labels": {**(meta.get("labels") or {}), **labels(pool_id, "engine")},
                **({"annotations": dict(meta["annotations"])} if meta.get("annotations") else {})}
    if parent is not None:
        metadata["ownerReferences"] = [owner(parent)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def pods_for(n: int, per_pod: int) -> list[int]:
    """How many engines each pod of ``n`` engines runs, ``per_pod`` at most (one per GPU).

    >>> pods_for(8, 4), pods_for(5, 4), pods_for(3, 1)
    ([4, 4], [4, 1], [1, 1, 1])
    """
    full, rest = divmod(n, per_pod)
    return [per_pod] * full + ([rest] if rest else [])


def unknown_fields(sent: Any, kept: Any, path: str = "") -> list[str]:
    """The paths in ``sent`` that ``kept`` (the same object after the API's models read it) lost: fields the
    API does not have, e.g. a misspelt key of a pod template.

    >>> unknown_fields({"spec": {"restartPolcy": "Never", "containers": [{"name": "a"}]}},
    ...                {"spec": {"containers": [{"name": "a"}]}})
    ['spec.restartPolcy']
    """
    if isinstance(sent, dict) and isinstance(kept, dict):
        lost = []
        for key, value in sent.items():
            where = f"{path}.{key}" if path else key
            if key not in kept:
                lost.append(where)
            else:
                lost += unknown_fields(value, kept[key], where)
        return lost
    if isinstance(sent, list) and isinstance(kept, list):
        pairs = enumerate(zip(sent, kept, strict=False))
        return [w for i, (a, b) in pairs for w in unknown_fields(a, b, f"{path}[{i}]")]
    return []


def check(pod: dict) -> None:
    """``pod`` as the API's own models read it (the official client's): a ValueError naming a field of the
    wrong type or one the API does not have, before anything is sent."""
    from workbench.pool.launch.kube_api import client_module

    client = client_module().client  # a ValueError saying how to install it
    try:
        kept = client.ApiClient().sanitize_for_serialization(client.V1Pod.from_dict(pod))
    except Exception as exc:  # pydantic's ValidationError names the field and what it takes
        first = str(exc).strip().splitlines()
        raise ValueError(f"the engine pod is not a valid Pod: {' '.join(first[1:3]) or first[0]} (check the "
                         "pod template).") from None
    lost = unknown_fields(pod, kept)
    if lost:
        raise ValueError(f"the engine pod has fields a Pod does not have: {', '.join(lost)} (check the pod "
                         "template).")
