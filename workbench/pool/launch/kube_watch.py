"""The pool's pods as the API server tells them: one watch per pool, and what each state means to the pool.

A thread lists the pool's pods (by its label) and then watches them; every pod's latest state is kept as
the API's JSON. Two readings of it, pure functions of one pod (tested without a cluster):

- :func:`lost_how`: a pod whose engines are gone or cut off for good, in words (deleted, evicted,
  OOM-killed, failed, its node NotReady). The health watcher asks the pool every look (``lost_hosts``), so
  a rank is found lost from the API or from its heartbeats, whichever comes first. A pod is its engines'
  host (their ``socket.gethostname()`` is the pod's name).
- :func:`blocked_how`: a pod that will not start (no node fits it, its image cannot be had, its container
  cannot be made), in the API's words: a start fails on it within seconds instead of timing out.

>>> pod = {"metadata": {"name": "wb-1a-x"}, "spec": {"nodeName": "n1"},
...        "status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on memory."}}
>>> lost_how(pod)
'ended: its pod was evicted by node n1: The node was low on memory.'
"""

from __future__ import annotations

import logging
import threading
import time

from workbench.pool.launch import kube_specs

log = logging.getLogger("workbench.pool")
WATCH_S = 10  # one watch request's server-side timeout: a closed watch thread ends within this
# waiting reasons of a container that will not start by waiting longer
CANNOT_START = ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                "CreateContainerConfigError", "CreateContainerError", "RunContainerError")


def _statuses(pod: dict) -> list[dict]:
    return (pod.get("status") or {}).get("containerStatuses") or []


def _condition(pod: dict, kind: str) -> dict:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def lost_how(pod: dict) -> str | None:
    """How a pod's engines were lost, in words that follow "rank 3 ", or None while it runs (or has not
    started). The pod is the ranks' host: it is named beside these words.

    >>> running = {"state": {"running": {}}, "ready": True}
    >>> base = {"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}}
    >>> lost_how({**base, "metadata": {"name": "p", "deletionTimestamp": "2026-12-04T21:00:00Z"}})
    'ended: its pod was deleted'
    >>> lost_how({**base, "status": {"phase": "Failed", "containerStatuses": [
    ...     {"state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}})
    'ended: its pod was OOM-killed (it went over its memory limit)'
    >>> lost_how({**base, "status": {"phase": "Running", "containerStatuses": [running],
    ...                              "conditions": [{"type": "Ready", "status": "False"}]}})
    'cut off: its node n1 is NotReady (its kubelet stopped reporting)'
    >>> lost_how({**base, "status": {"phase": "Running", "containerStatuses": [running],
    ...                              "conditions": [{"type": "Ready", "status": "True"}]}}) is None
    True
    """
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    if meta.get("deletionTimestamp"):
        return "ended: its pod was deleted"
    phase = status.get("phase")
    if phase == "Failed":
        if status.get("reason") == "Evicted":
            said = (status.get("message") or "").strip()
            return f"ended: its pod was evicted by node {node}" + (f": {said}" if said else "")
        ended = [s["state"]["terminated"] for s in _statuses(pod) if (s.get("state") or {}).get("terminated")]
        if any(t.get("reason") == "OOMKilled" for t in ended):
            return "ended: its pod was OOM-killed (it went over its memory limit)"
        said = ended[0] if ended else {}
        why = said.get("reason") or status.get("reason") or "Error"
        return f"ended: its pod failed ({why}, exit code {said.get('exitCode', '?')})"
    if phase == "Succeeded":
        return "ended: its pod's engines exited"
    if phase == "Running" and _condition(pod, "Ready").get("status") == "False":
        statuses = _statuses(pod)
        # the node lifecycle controller marks the pods of a node that stopped reporting not ready, and
        # leaves the containers as the kubelet last reported them: running and ready
        if statuses and all(s.get("ready") and "running" in (s.get("state") or {}) for s in statuses):
            return f"cut off: its node {node} is NotReady (its kubelet stopped reporting)"
    return None


def blocked_how(pod: dict) -> tuple[str, str] | None:
    """``(what, what to change)`` for a pod that will not start, in the API's words; None otherwise.

    >>> blocked_how({"metadata": {"name": "p"}, "status": {"phase": "Pending", "conditions": [
    ...     {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
    ...      "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}]}})[0]
    'pod p cannot be scheduled: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu.'
    >>> blocked_how({"metadata": {"name": "p"}, "status": {"phase": "Pending", "containerStatuses": [
    ...     {"state": {"waiting": {"reason": "ErrImageNeverPull", "message": "no x"}}}]}})[0]
    'pod p cannot start its container: ErrImageNeverPull: no x'
    """
    name = (pod.get("metadata") or {}).get("name")
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending"):
        return None
    scheduled = _condition(pod, "PodScheduled")
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return (f"pod {name} cannot be scheduled: {scheduled.get('message', '').strip()}",
                "Ask for less (fewer engines, GPUs per pod or memory in the pod template), or a "
                "node_selector that matches nodes with room.")
    for s in _statuses(pod):
        waiting = (s.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in CANNOT_START:
            todo = ("Check the image name (--image or the pod template) and that the nodes can pull it."
                    if "Image" in waiting["reason"] else "Check the pod template.")
            message = (waiting.get("message") or "").strip()
            return f"pod {name} cannot start its container: {waiting['reason']}" + (f": {message}"
                                                                                     if message else ""), todo
    return None


class PodWatch:
    """The pool's pods, kept up to date by a thread watching the API (``api``: :class:`kube_api.Api`)."""

    def __init__(self, api, pool_id: str):
        self.api, self.pool_id = api, pool_id
        self.pods: dict[str, dict] = {}  # name -> the pod as the API last said
        self.lost: dict[str, str] = {}  # name -> how its engines were lost (kept once said)
        self.seen: dict[str, float] = {}  # name -> when (monotonic) it was first seen lost
        self.error: str | None = None  # the watch's own trouble (RBAC, the API gone), once said
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._changed = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._run, name=f"workbench-kube-watch-{pool_id}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def snapshot(self) -> tuple[dict[str, dict], dict[str, str]]:
        with self._lock:
            return dict(self.pods), dict(self.lost)

    def wait_change(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait(timeout)

    def _take(self, kind: str, pod: dict) -> None:
        name = (pod.get("metadata") or {}).get("name")
        with self._changed:
            if kind == "DELETED":
                self.pods.pop(name, None)
                how = lost_how(pod) or "ended: its pod was deleted"
            else:
                self.pods[name] = pod
                how = lost_how(pod)
            if how and name not in self.lost:
                self.lost[name] = how
                self.seen[name] = time.monotonic()
                log.info("workbench: pool %s: %s", self.pool_id, how)
            self._changed.notify_all()

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        from workbench.pool.launch.kube_api import REQUEST_TIMEOUT_S, reason

        serialize = self.api.core.api_client.sanitize_for_serialization
        version = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = self.api.core.list_namespaced_pod(
                        self.api.namespace, label_selector=kube_specs.selector(self.pool_id),
                        _request_timeout=REQUEST_TIMEOUT_S)
                    names = set()
                    for pod in listed.items:
                        names.add(pod.metadata.name)
                        self._take("LISTED", serialize(pod))
                    for gone in set(self.pods) - names:  # deleted while no watch ran
                        self._take("DELETED", self.pods[gone])
                    version = listed.metadata.resource_version
                w = watch.Watch()
                for event in w.stream(self.api.core.list_namespaced_pod, self.api.namespace,
                                      label_selector=kube_specs.selector(self.pool_id),
                                      resource_version=version, timeout_seconds=WATCH_S,
                                      _request_timeout=WATCH_S + REQUEST_TIMEOUT_S):
                    if self._stop.is_set():
                        w.stop()
                        break
                    pod = serialize(event["object"])
                    version = (pod.get("metadata") or {}).get("resourceVersion") or version
                    self._take(event["type"], pod)
            except ApiException as exc:
                if exc.status == 410:  # the version is too old: list again
                    version = None
                    continue
                self._trouble(reason(exc))
            except Exception as exc:  # the API unreachable for a moment: try again
                self._trouble(f"{type(exc).__name__}: {exc}")

    def _trouble(self, text: str) -> None:
        if self.error is None:
            log.warning("workbench: pool %s: watching its pods: %s", self.pool_id, text)
        self.error = text
        self._stop.wait(1.0)
