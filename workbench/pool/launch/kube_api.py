"""The Kubernetes API as the launcher uses it: the client, the Role it needs, the API's refusals in one
sentence, and deleting a pool's objects (also as a command, for the lease).

The official ``kubernetes`` client (the ``[kubernetes]`` extra) is imported only here and only when a
Kubernetes pool is used. Credentials: in a pod, its service account (in-cluster); elsewhere the kubeconfig
(``KUBECONFIG`` or ``~/.kube/config``), its current context unless ``launcher_options`` name one.

The launcher's Role (``docs/kubernetes-role.yaml``, checked before anything is created, so a missing verb is
named instead of failing half-way):

>>> for resource, verbs in NEEDS["create"].items(): print(resource, " ".join(verbs))
pods create get list watch delete
pods/log get
secrets create delete
>>> for resource, verbs in NEEDS["attach"].items(): print(resource, " ".join(verbs))
pods get list watch
pods/exec create get

Run as ``python -m workbench.pool.launch.kube_api delete --namespace NS --pool ID [--kubeconfig F]
[--context C]`` (the lease does, when the kernel that owned a pool died).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

from workbench.pool.launch import kube_specs

# what the launcher does with each resource, by mode: pods it creates ("create") or pods that already run
NEEDS: dict[str, dict[str, tuple[str, ...]]] = {
    "create": {"pods": ("create", "get", "list", "watch", "delete"), "pods/log": ("get",),
               "secrets": ("create", "delete")},
    # exec over a websocket (the client's stream) is a GET of pods/exec, over SPDY (kubectl) a POST
    "attach": {"pods": ("get", "list", "watch"), "pods/exec": ("create", "get")},
}
IN_CLUSTER_NS = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
REQUEST_TIMEOUT_S = 10  # one API request; a watch has its own
GONE_WAIT_S = 30.0  # how long a stop waits for the pool's pods to be gone from the API


def client_module():
    """The ``kubernetes`` package, or a ValueError saying how to install it."""
    try:
        import kubernetes
    except ImportError:
        raise ValueError("--launcher kubernetes needs the official Kubernetes client: pip install "
                         "'distributed-workbench[kubernetes]' (or kubernetes==37.0.2).") from None
    return kubernetes


@dataclass
class Api:
    """A connection to one cluster: the core API, and what it was made from (for the lease's command)."""

    core: object
    authz: object
    namespace: str
    kubeconfig: str | None
    context: str | None
    in_cluster: bool

    def delete_command(self, pool_id: str) -> list[str]:
        """The command the lease runs to delete every object of the pool.

        >>> " ".join(Api(None, None, "team", "/k", None, False).delete_command("1a2b3c4d")[1:])
        '-m workbench.pool.launch.kube_api delete --namespace team --pool 1a2b3c4d --kubeconfig /k'
        """
        argv = [sys.executable, "-m", "workbench.pool.launch.kube_api", "delete",
                "--namespace", self.namespace, "--pool", pool_id]
        if self.kubeconfig:
            argv += ["--kubeconfig", self.kubeconfig]
        if self.context:
            argv += ["--context", self.context]
        return argv


def connect(namespace: str | None = None, kubeconfig: str | None = None, context: str | None = None) -> Api:
    """An :class:`Api` for ``namespace`` (default: the context's, in a pod its own, else ``default``)."""
    k8s = client_module()
    from kubernetes import client, config

    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not kubeconfig and not context \
        and os.path.exists(IN_CLUSTER_NS)
    try:
        if in_cluster:
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
            api_client = client.ApiClient(cfg)
            default_ns = open(IN_CLUSTER_NS).read().strip()
        else:
            # every file KUBECONFIG lists, which the client merges (the lease's command gets the list)
            kubeconfig = kubeconfig or os.environ.get("KUBECONFIG") or None
            api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
            contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
            chosen = next((c for c in contexts if c["name"] == context), current) if context else current
            default_ns = (chosen or {}).get("context", {}).get("namespace") or "default"
    except (k8s.config.ConfigException, OSError) as exc:
        raise ValueError(f"--launcher kubernetes found no cluster to talk to: {exc}. Set KUBECONFIG (or "
                         "~/.kube/config), or run the kernel in a pod with a service account.") from None
    return Api(client.CoreV1Api(api_client), client.AuthorizationV1Api(api_client), namespace or default_ns,
               kubeconfig, context, in_cluster)


def reason(exc: BaseException) -> str:
    """The API's own words for a refused request (its ``message``), else the exception's.

    >>> class E(Exception): pass
    >>> e = E(); e.status, e.body = 403, json.dumps({"message": "pods is forbidden: exceeded quota: q"})
    >>> reason(e)
    'pods is forbidden: exceeded quota: q'
    """
    body = getattr(exc, "body", None)
    if body:
        try:
            message = json.loads(body).get("message")
            if message:
                return str(message)
        except (ValueError, AttributeError):
            pass
    status = getattr(exc, "status", None)
    said = getattr(exc, "reason", None) or str(exc)
    if isinstance(said, str) and '"message":' in said:  # a refused websocket: the Status is in the reason
        try:
            return str(json.loads(said[said.index("{\"kind\""):].split(" -+-+- ")[0])["message"])
        except (ValueError, KeyError):
            pass
    return f"{status} {said}".strip() if status else str(said)


def missing_permissions(api: Api, mode: str) -> list[str]:
    """What the launcher needs in ``mode`` (:data:`NEEDS`) that this user may not do in the namespace, as
    ``"delete pods"``, asked of the API server itself (SelfSubjectAccessReview)."""
    from kubernetes import client

    missing = []
    for resource, verbs in NEEDS[mode].items():
        name, _, sub = resource.partition("/")
        for verb in verbs:
            review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    namespace=api.namespace, verb=verb, resource=name, subresource=sub or None)))
            answer = api.authz.create_self_subject_access_review(review, _request_timeout=REQUEST_TIMEOUT_S)
            if not answer.status.allowed:
                missing.append(f"{verb} {resource}")
    return missing


def check_permissions(api: Api, mode: str) -> None:
    """A ValueError naming every verb the user lacks in the namespace, before anything is created."""
    missing = missing_permissions(api, mode)
    if missing:
        raise ValueError(
            f"Kubernetes does not let this user {', '.join(missing)} in namespace {api.namespace}, which "
            "--launcher kubernetes needs: bind the Role of docs/kubernetes.md (docs/kubernetes-role.yaml) to "
            "the user or service account in that namespace.")


def pool_pods(api: Api, pool_id: str) -> list:
    return api.core.list_namespaced_pod(api.namespace, label_selector=kube_specs.selector(pool_id),
                                        _request_timeout=REQUEST_TIMEOUT_S).items


def runs(pod) -> bool:
    """Whether any container of ``pod`` (a client model) may still run a process: not yet known to have
    ended, nor to have never started."""
    if (pod.status.phase or "Pending") in ("Succeeded", "Failed"):
        return False
    statuses = pod.status.container_statuses or []
    return any(s.state is not None and s.state.running is not None for s in statuses)


def delete_pool(api: Api, pool_id: str, wait_s: float = GONE_WAIT_S) -> list[str]:
    """Delete every object of the pool and wait up to ``wait_s`` for its pods to be gone; the pods still
    there (none, normally).

    A pod whose engines run is deleted with its grace period: the kubelet SIGTERMs its first process, which
    ends the engines at once, and confirms. A pod with no process left (its engines exited, or its container
    never started) is deleted at once (grace 0): nothing of it runs, and a kubelet that raced the deletion
    with the container's own end (1.20 then waits for its next full sync, a minute) is not waited for. The
    Secret goes last: it is the pods' owner, so the garbage collector deletes any pod this missed."""
    from kubernetes.client.rest import ApiException

    def delete(name: str, grace: int) -> None:
        try:
            api.core.delete_namespaced_pod(name, api.namespace, grace_period_seconds=grace,
                                           _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as exc:
            if exc.status != 404:
                raise

    graceful: set[str] = set()
    forced: set[str] = set()
    deadline = time.monotonic() + wait_s
    pods = pool_pods(api, pool_id)
    while pods and time.monotonic() < deadline:
        for pod in pods:
            name = pod.metadata.name
            if not runs(pod) and name not in forced:
                delete(name, 0)
                forced.add(name)
            elif name not in graceful and name not in forced:
                delete(name, kube_specs.GRACE_S)
                graceful.add(name)
        time.sleep(0.2)
        pods = pool_pods(api, pool_id)
    try:
        api.core.delete_namespaced_secret(kube_specs.secret_name(pool_id), api.namespace,
                                          propagation_policy="Background", _request_timeout=REQUEST_TIMEOUT_S)
    except ApiException as exc:
        if exc.status != 404:
            raise
    return [p.metadata.name for p in pods]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.pool.launch.kube_api")
    sub = parser.add_subparsers(dest="command", required=True)
    delete = sub.add_parser("delete", help="delete every object of a pool")
    delete.add_argument("--namespace", required=True)
    delete.add_argument("--pool", required=True)
    delete.add_argument("--kubeconfig")
    delete.add_argument("--context")
    args = parser.parse_args(argv)
    api = connect(args.namespace, args.kubeconfig, args.context)
    left = delete_pool(api, args.pool)
    print(f"workbench: pool {args.pool}'s objects deleted from namespace {args.namespace}"
          + (f"; still going: {', '.join(left)}" if left else ""), flush=True)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
