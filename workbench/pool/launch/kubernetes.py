"""``--launcher kubernetes``: engines in pods, through the official Kubernetes client.

ipyparallel's launcher family, extended: :class:`KubernetesEngineSetLauncher` is an engine-set launcher that
ipyparallel's ``Cluster`` starts and records like its own (``Cluster(engines=KubernetesEngineSetLauncher)``);
:class:`Kubernetes` is the pool's launcher object, which the pool asks what differs.

Two ways to get engines:

- **Pods the launcher creates** (the default): one pod per engine, or per ``gpus_per_pod`` engines (each pod
  requests that many ``nvidia.com/gpu``, one engine per GPU), from ``image`` or a ``pod_template``, on nodes
  matching ``node_selector``. The controller's connection file is a Secret, mounted read-only into each pod;
  that Secret is every pod's owner, so deleting it removes the pool (the lease's one delete). Every object
  carries the pool's label. A pod's first process (:mod:`workbench.pool.processes.pod_main`) ends its
  engines at once on SIGTERM.
- **Pods that already run** (``pods``: a label selector, as Monarch's ``KubernetesJob`` attaches to
  pre-provisioned pods): the engines start inside them over ``exec``, the connection file on their stdin;
  when the kernel goes (or the pool stops) the exec stream closes and the engines end. Nothing is created.

Before anything starts, the launcher asks the API server whether this user may do all it needs
(:data:`~workbench.pool.launch.kube_api.NEEDS`) and names what is missing. A pod that cannot start (no node
fits it, its image cannot be had) fails the start within seconds in the API's words. While the pool runs, a
watch on its pods (:mod:`workbench.pool.launch.kube_watch`) tells the health watcher of pods deleted,
evicted, OOM-killed, failed or on a node gone NotReady, beside the heartbeats. A rank's host is its pod.

>>> launcher = Kubernetes(PoolConfig(launcher="kubernetes", image="wb:1", gpus_per_pod=4, n=8))
>>> launcher.default_engines(), launcher.per_pod, launcher.needs_routable_address()
(8, 4, True)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

from ipyparallel.cluster.launcher import EngineLauncher
from traitlets import Any, Dict, Integer, List, Unicode

from workbench.config import PoolConfig
from workbench.errors import PoolStartError
from workbench.pool.launch import kube_api, kube_specs, spawn
from workbench.pool.launch.base import Launcher, Pool, go_on, ranks_left
from workbench.pool.launch.kube_watch import PodWatch, blocked_how
from workbench.pool.launch.start_errors import start_error
from workbench.pool.processes.reap import MARKER

# the pool's Secret as created (its uid), by (namespace, pool id): every engine set of the pool names it
_parents: dict[tuple[str, str], dict] = {}
_apis: dict[tuple, kube_api.Api] = {}
_apis_lock = threading.Lock()


def api_for(namespace: str | None, kubeconfig: str | None, context: str | None) -> kube_api.Api:
    """One connection per cluster and namespace in this process."""
    key = (namespace, kubeconfig, context)
    with _apis_lock:
        if key not in _apis:
            _apis[key] = kube_api.connect(namespace, kubeconfig, context)
        return _apis[key]


class KubernetesEngineSetLauncher(EngineLauncher):
    """ipyparallel's engine-set launcher for Kubernetes: ``start(n)`` creates the pods of ``n`` engines (or
    starts them in pods that run already), ``stop()`` deletes them."""

    entrypoint_name = "workbench.pool.launch.kubernetes.KubernetesEngineSetLauncher"
    name = Unicode("ipengine")

    pool_id = Unicode("", help="the pool's id: its objects' label").tag(to_dict=True)
    namespace = Unicode("", help="the namespace (empty: the context's)").tag(to_dict=True)
    kubeconfig = Unicode("", help="the kubeconfig file (empty: KUBECONFIG, ~/.kube/config or in-cluster)"
                         ).tag(to_dict=True)
    context = Unicode("", help="the kubeconfig context (empty: its current one)").tag(to_dict=True)
    image = Unicode("", help="the engines' container image").tag(to_dict=True)
    python = Unicode("python3", help="the Python in the image that has this package").tag(to_dict=True)
    per_pod = Integer(1, help="engines per pod (one per GPU it requests)").tag(to_dict=True)
    gpus_per_pod = Integer(0, help="nvidia.com/gpu each pod of per_pod engines requests").tag(to_dict=True)
    node_selector = Dict(help="labels the pods' nodes must have").tag(to_dict=True)
    template = Dict(help="the pod template: {metadata, spec}").tag(to_dict=True)
    selector = Unicode("", help="start in pods that already run, chosen by this label selector"
                       ).tag(to_dict=True)
    pool_log = Unicode("", help="the pool's log").tag(to_dict=True)
    pods = List(Unicode(), help="the pods this set created or started engines in").tag(to_dict=True)
    attach_pods = Any(None, help="(pods that run already) choose the pods for n engines")

    def find_args(self):
        return ["kubernetes", self.namespace]

    @property
    def api(self) -> kube_api.Api:
        return api_for(self.namespace or None, self.kubeconfig or None, self.context or None)

    def _cancelled(self) -> bool:
        return self.cluster_id in spawn._cancelled

    def _connection(self) -> dict:
        """The controller's engine connection info: ipyparallel puts it in our environment (taken out
        here: it never reaches a pod's environment), else its file."""
        given = self.environment.pop("IPP_CONNECTION_INFO", None)
        if given:
            return json.loads(given)
        with open(self.connection_files["engine"]) as f:
            return json.load(f)

    def _env(self) -> dict[str, str]:
        """What the engines' environment gets: the pool's, without this machine's ipyparallel paths and
        without the tag that marks the pool's processes on this machine (a pod's are ended through the API,
        and on a test cluster on this very machine the tag would let a stop kill them by hand)."""
        return {k: v for k, v in self.get_env().items() if not k.startswith("IPP_") and k != MARKER}

    def start(self, n: int):
        connection = self._connection()
        if self.selector:
            self.pods = list(self._start_in_running_pods(n, connection))
        else:
            self.pods = list(self._create_pods(n, connection))
        self.notify_start({"pods": list(self.pods)})
        return self.pods

    def _create_pods(self, n: int, connection: dict):
        from kubernetes.client.rest import ApiException

        api = self.api
        parent = parent_secret(api, self.pool_id, connection)
        for engines in kube_specs.pods_for(n, self.per_pod):
            with spawn._spawning:
                if self._cancelled():
                    raise spawn.LaunchCancelled(f"the start of {self.cluster_id} was cancelled")
                pod = kube_specs.engine_pod(
                    pool_id=self.pool_id, image=self.image or None, engines=engines,
                    gpus=engines if self.gpus_per_pod else 0, python=self.python,
                    engine_args=self.engine_args, env=self._env(), node_selector=dict(self.node_selector),
                    template=dict(self.template), parent=parent)
                try:
                    made = api.core.create_namespaced_pod(api.namespace, pod,
                                                          _request_timeout=kube_api.REQUEST_TIMEOUT_S)
                except ApiException as exc:
                    raise KubernetesRefused(f"Kubernetes refused the pod: {kube_api.reason(exc)}",
                                            refusal_todo(exc, api.namespace)) from None
            self.pods.append(made.metadata.name)
            yield made.metadata.name

    def _start_in_running_pods(self, n: int, connection: dict):
        places = self.attach_pods(n) if self.attach_pods is not None else []
        for pod, engines in places:
            with spawn._spawning:
                if self._cancelled():
                    raise spawn.LaunchCancelled(f"the start of {self.cluster_id} was cancelled")
                exec_engines(self.api, pod, engines, self.python, self.engine_args, self._env(), connection,
                             self.pool_id, self.pool_log)
            yield pod

    def stop(self):
        for pod in list(self.pods):
            end_pod(self.api, pod, self.pool_id)
        self.notify_stop({"pods": list(self.pods)})

    def signal(self, sig):
        """Engines are signalled through their agents (:meth:`Launcher.signal`); a kill ends their pods."""
        import signal as signals

        if sig in (signals.SIGKILL, signals.SIGTERM, "KILL", "TERM"):
            self.stop()


class KubernetesRefused(RuntimeError):
    """The API server refused to create an object: its reason, and what to change (the launcher's
    :meth:`Kubernetes.explain` makes the start's one error of it)."""

    def __init__(self, what: str, todo: str):
        super().__init__(what)
        self.todo_text = todo


def refusal_todo(exc, namespace: str) -> str:
    """What to change after the API refused a pod (``exc``), by what it said.

    >>> class E(Exception): pass
    >>> e = E(); e.status, e.body = 403, '{"message": "pods \\\\"x\\\\" is forbidden: exceeded quota: q"}'
    >>> print(refusal_todo(e, "team"))  # doctest: +NORMALIZE_WHITESPACE
    Start fewer engines or smaller pods, or ask for a larger quota in namespace team
    (`kubectl describe quota -n team`).
    """
    said = kube_api.reason(exc)
    if "exceeded quota" in said:
        return (f"Start fewer engines or smaller pods, or ask for a larger quota in namespace {namespace} "
                f"(`kubectl describe quota -n {namespace}`).")
    if getattr(exc, "status", None) == 403:
        return ("Bind the Role of docs/kubernetes.md (docs/kubernetes-role.yaml) to this user in namespace "
                f"{namespace}.")
    if getattr(exc, "status", None) == 422:
        return "Check the pod template: the API names the field it refused."
    return "Check the namespace, the image and the pod template."


def parent_secret(api: kube_api.Api, pool_id: str, connection: dict) -> dict:
    """The pool's Secret (its parent object) as the API knows it: created the first time, remembered for the
    pool's next engine sets (another process starting engines for it finds its uid on the pool's pods)."""
    from kubernetes.client.rest import ApiException

    key = (api.namespace, pool_id)
    if key in _parents:
        return _parents[key]
    body = kube_specs.connection_secret(pool_id, connection)
    try:
        made = api.core.create_namespaced_secret(api.namespace, body,
                                                 _request_timeout=kube_api.REQUEST_TIMEOUT_S)
        parent = {"metadata": {"name": made.metadata.name, "uid": made.metadata.uid}}
    except ApiException as exc:
        if exc.status != 409:
            raise KubernetesRefused(f"Kubernetes refused the pool's Secret: {kube_api.reason(exc)}",
                                    refusal_todo(exc, api.namespace)) from None
        owners = [ref for pod in kube_api.pool_pods(api, pool_id)
                  for ref in pod.metadata.owner_references or [] if ref.kind == "Secret"]
        if not owners:  # no pod left to tell its uid: make it again
            api.core.delete_namespaced_secret(kube_specs.secret_name(pool_id), api.namespace)
            return parent_secret(api, pool_id, connection)
        parent = {"metadata": {"name": owners[0].name, "uid": owners[0].uid}}
    _parents[key] = parent
    return parent


def end_pod(api: kube_api.Api, name: str, pool_id: str) -> None:
    """Delete one pod of the pool (gone already: nothing to do)."""
    from kubernetes.client.rest import ApiException

    try:
        api.core.delete_namespaced_pod(name, api.namespace, grace_period_seconds=kube_specs.GRACE_S,
                                       _request_timeout=kube_api.REQUEST_TIMEOUT_S)
    except ApiException as exc:
        if exc.status != 404:
            raise


# -- engines in pods that already run ---------------------------------------------------------------
_streams: dict[str, list] = {}  # pool id -> its exec streams (closing one ends its engines)


def exec_engines(api, pod: str, engines: int, python: str, engine_args: list[str], env: dict[str, str],
                 connection: dict, pool_id: str, log: str) -> None:
    """Start ``engines`` engines in the running pod ``pod`` over ``exec``; the connection file goes on
    stdin, which stays open while the pool runs (its close ends them)."""
    from kubernetes.stream import stream

    command = ["env", *[f"{k}={v}" for k, v in env.items()], f"WORKBENCH_POD={pod}", "HOME=/tmp",
               "IPYTHONDIR=/tmp/.ipython", python, "-m", "workbench.pool.processes.pod_main", "--engines",
               str(engines), "--stdin-connection", "--", *engine_args]
    ws = stream(api.core.connect_get_namespaced_pod_exec, pod, api.namespace, command=command, stdin=True,
                stdout=True, stderr=True, tty=False, _preload_content=False)
    ws.write_stdin(json.dumps(connection) + "\n")
    _streams.setdefault(pool_id, []).append(ws)

    def pump():  # the engines' output into the pool's log, until the stream closes
        try:
            while ws.is_open():
                ws.update(timeout=1)
                out = ws.read_all()
                if out and log:
                    with open(log, "a") as f:
                        f.write(out)
        except Exception:
            pass

    threading.Thread(target=pump, name=f"workbench-exec-{pod}", daemon=True).start()


def close_streams(pool_id: str) -> None:
    for ws in _streams.pop(pool_id, []):
        try:
            ws.close()
        except Exception:
            pass


class Kubernetes(Launcher):
    """Engines in Kubernetes pods."""

    name = "kubernetes"
    engine_set = KubernetesEngineSetLauncher
    poll_s = 0.1
    refusal_advice = "Check the namespace, the image and the pod template."
    failed_todo = "Check the namespace, the image and the pod template; the log has the pods' output."

    def __init__(self, config: PoolConfig):
        super().__init__(config)
        self._watch: PodWatch | None = None
        self._pool_id: str | None = None
        self._closed = False
        self._logged: set[str] = set()  # pods whose output went into the pool's log

    # -- sizes and places ------------------------------------------------------------------
    @property
    def per_pod(self) -> int:
        """Engines per pod: one per GPU a pod requests, else one."""
        return self.config.gpus_per_pod or 1

    def _default_count(self, local_gpus: int) -> int:
        return self.config.gpus_per_pod or 2

    def needs_routable_address(self) -> bool:
        return True  # pods have addresses of their own: loopback never reaches them

    def where(self) -> str:
        return f"the pods in namespace {self.config.namespace}" if self.config.namespace else "the pods"

    @property
    def api(self) -> kube_api.Api:
        options = self.config.launcher_options
        return api_for(self.config.namespace, options.get("kubeconfig"), options.get("context"))

    def check_capacity(self, n: int) -> None:
        """Before anything starts: the pod template readable, the image named, the engines filling whole
        pods (no cluster asked: the panel's start request checks this too)."""
        if n % self.per_pod:
            raise ValueError(f"-n {n} does not fill pods of {self.per_pod} engines (one per GPU of "
                             f"--gpus-per-pod {self.per_pod}): give a multiple of {self.per_pod}.")
        if self.config.pods is None:
            template = kube_specs.read_template(self.config.pod_template)
            # a ValueError names what is missing
            gpus = 1 if self.config.gpus_per_pod else 0
            kube_specs.check(kube_specs.engine_pod(pool_id="check", image=self.config.image, engines=1,
                                                   gpus=gpus, python="python3", engine_args=[], env={},
                                                   template=template,
                                                   node_selector=dict(self.config.node_selector)))

    def preflight(self, n: int) -> None:
        """This user may do every verb the launcher needs in the namespace (asked of the API server:
        :func:`kube_api.check_permissions`), and in pods that run already there is room for ``n`` more."""
        api = self.api
        kube_api.check_permissions(api, "attach" if self.config.pods is not None else "create")
        if self.config.pods is not None:
            free = self._free_pods()
            if sum(k for _, k in free) < n:
                room = sum(k for _, k in free)
                raise ValueError(f"--pods {self.config.pods} chose {len(free)} running pod(s) with room "
                                 f"for {room} engine(s) in namespace {api.namespace}, not {n}: start fewer "
                                 "engines, or check the label selector (`kubectl get pods -l "
                                 f"{self.config.pods} -n {api.namespace}`).")

    # -- the engines ----------------------------------------------------------------------------
    def traits(self, n: int, *, work_dir: str, env: dict[str, str], log: str) -> dict:
        """The engine set's traits: where the pods go and what they run (see
        :class:`KubernetesEngineSetLauncher`); ``launcher_options`` may add ``python`` (the image's Python,
        default ``python3``), ``kubeconfig`` and ``context``."""
        self._pool_id = env.get("WORKBENCH_POOL") or self._pool_id
        options = self.config.launcher_options
        return {"pool_id": self._pool_id or "", "namespace": self.api.namespace,
                "kubeconfig": options.get("kubeconfig") or self.api.kubeconfig or "",
                "context": options.get("context") or "", "image": self.config.image or "",
                "per_pod": self.per_pod, "gpus_per_pod": self.config.gpus_per_pod or 0,
                "node_selector": dict(self.config.node_selector),
                "template": kube_specs.read_template(self.config.pod_template),
                "selector": self.config.pods or "", "pool_log": log,
                **({"attach_pods": self._choose_pods} if self.config.pods is not None else {})}

    def _free_pods(self) -> list[tuple[str, int]]:
        """Running pods the ``pods`` selector chooses that hold no engine of this pool yet, each with how many
        engines it takes (its GPUs, else one)."""
        api = self.api
        taken = _taken.get(self._pool_id or "", set())
        found = api.core.list_namespaced_pod(api.namespace, label_selector=self.config.pods,
                                             _request_timeout=kube_api.REQUEST_TIMEOUT_S).items
        free = []
        for pod in found:
            if pod.status.phase != "Running" or pod.metadata.deletion_timestamp or pod.metadata.name in taken:
                continue
            gpus = 0
            for c in pod.spec.containers:
                limits = (c.resources.limits or {}) if c.resources else {}
                gpus += int(limits.get(kube_specs.GPU, 0) or 0)
            free.append((pod.metadata.name, gpus or 1))
        return free

    def _choose_pods(self, n: int) -> list[tuple[str, int]]:
        chosen, left = [], n
        for name, k in self._free_pods():
            if left <= 0:
                break
            take = min(k, left)
            chosen.append((name, take))
            left -= take
        if left > 0:
            raise ValueError(f"--pods {self.config.pods}: no running pod left with room for {left} more "
                             "engine(s).")
        _taken.setdefault(self._pool_id or "", set()).update(name for name, _ in chosen)
        return chosen

    # -- what the API says --------------------------------------------------------------------------
    def watch(self, pool_id: str) -> PodWatch:
        if self._watch is None:
            self._watch = PodWatch(self.api, pool_id)
        return self._watch

    def lost_hosts(self, pool: Pool) -> dict[str, str]:
        """The pool's pods whose engines the API says are gone, with how: ``{pod: how}``."""
        if self._closed:
            return {}
        _, lost = self.watch(pool.pool_id).snapshot()
        return lost

    def places(self, pool: Pool) -> dict[str, str]:
        """Each pod of the pool with its node, as the API says (``{pod: node}``)."""
        if self._closed:
            return {}
        pods, _ = self.watch(pool.pool_id).snapshot()
        return {name: pod["spec"]["nodeName"] for name, pod in pods.items()
                if (pod.get("spec") or {}).get("nodeName")}

    def start_failed(self, pool: Pool) -> PoolStartError | None:
        """A pod of the latest start (the pool's first, or a replacement's) that will not start, or that ended
        while its engines were starting, in the API's words."""
        sets = pool.engine_sets()
        starting = set(getattr(sets[-1], "pods", ())) if sets else set()
        pods, lost = self.watch(pool.pool_id).snapshot()
        pods = {name: pod for name, pod in pods.items() if name in starting}
        lost = {name: how for name, how in lost.items() if name in starting}
        for pod in pods.values():
            blocked = blocked_how(pod)
            if blocked:
                what, todo = blocked
                return start_error(what.rstrip("."), todo, log=pool.log_file, output="")
        for name, how in lost.items():
            said = self._pod_output(name, pool.log_file)
            said_how = how.split(": ", 1)[-1]
            said_how = said_how.replace("its pod", f"pod {name}", 1) if "its pod" in said_how \
                else f"pod {name}: {said_how}"
            return start_error(f"{said_how} while the engines were starting",
                               "Its output is above; the log has the pods' output.", log=pool.log_file,
                               output=said)
        return None

    def _pod_output(self, name: str, log: Path | None) -> str:
        """The end of a pod's output, also appended to the pool's log (once per pod)."""
        try:
            said = self.api.core.read_namespaced_pod_log(name, self.api.namespace, tail_lines=40,
                                                          _request_timeout=kube_api.REQUEST_TIMEOUT_S)
        except Exception as exc:
            return f"(its output could not be read: {kube_api.reason(exc)})"
        if log and name not in self._logged:
            self._logged.add(name)
            with open(log, "a") as f:
                f.write(f"--- pod {name} ---\n{said}")
        return said

    def why_slow(self, pool: Pool) -> str:
        """The pool's pods by phase, e.g. ``; pods: 1 Pending (ContainerCreating), 1 Running``."""
        pods, _ = self.watch(pool.pool_id).snapshot()
        counts: dict[str, int] = {}
        for pod in pods.values():
            status = pod.get("status") or {}
            what = status.get("phase") or "Pending"
            waiting = [((s.get("state") or {}).get("waiting") or {}).get("reason")
                       for s in status.get("containerStatuses") or []]
            waiting = [w for w in waiting if w]
            if waiting:
                what += f" ({waiting[0]})"
            counts[what] = counts.get(what, 0) + 1
        said = ", ".join(f"{k} {v}" for v, k in counts.items())
        return f"; pods: {said}" if said else "; no pod of the pool exists"

    # -- replacements, fencing --------------------------------------------------------------------
    def where_to_start(self, pool: Pool | None, lost: list, ranks: list,
                       progress: Callable[[str], None]) -> dict[str, int]:
        """New pods for the lost ranks, wherever the scheduler puts them (``{"new pods": n}``): each rank
        moves to a host of its own, its new pod."""
        if self.config.pods is not None and not self._free_pods():
            raise ValueError(f"no running pod chosen by --pods {self.config.pods} has room for the lost "
                             f"ranks' engines: {go_on(ranks_left(lost, ranks))}")
        return {"new pods": len(lost)}

    def fence(self, pool: Pool, pids: list[int]) -> None:
        """Delete the pods the API saw lost that are still there (a pod on a NotReady node: its engines may
        run on; its agent also stops them when heard again)."""
        if self.config.pods is not None:
            return  # pods that ran before the pool are not the pool's to delete
        pods, lost = self.watch(pool.pool_id).snapshot()
        for name in lost:
            pod = pods.get(name)
            if pod is not None and not (pod.get("metadata") or {}).get("deletionTimestamp"):
                threading.Thread(target=end_pod, args=(self.api, name, pool.pool_id), daemon=True).start()

    def lease_jobs(self, pool_id: str) -> list[dict]:
        """What the lease runs when the kernel dies: one delete of the pool's objects (pods created here).
        The pool records it before any of them exists."""
        self._pool_id = pool_id
        if self.config.pods is not None:
            return []
        api = self.api
        return [{"id": f"kubernetes:{api.namespace}/{kube_specs.secret_name(self._pool_id)}",
                 "cancel": api.delete_command(self._pool_id)}]

    def close(self) -> None:
        """The pool stopped: every object it created is deleted, and this waits until its pods are gone."""
        self._closed = True
        if self._watch is not None:
            self._watch.close()
        if self._pool_id is None:
            return
        if self.config.pods is not None:
            close_streams(self._pool_id)
            _taken.pop(self._pool_id, None)
            return
        try:
            left = kube_api.delete_pool(self.api, self._pool_id)
        except Exception as exc:  # the API unreachable: the lease's command is in the state file
            left = [f"({kube_api.reason(exc)})"]
        _parents.pop((self.api.namespace, self._pool_id), None)
        if left:
            print(f"workbench: pods of pool {self._pool_id} still going in namespace {self.api.namespace}: "
                  f"{', '.join(left)}", flush=True)

    def explain(self, exc: BaseException, log: Path | None) -> PoolStartError | None:
        if isinstance(exc, KubernetesRefused):
            return start_error(str(exc).rstrip("."), exc.todo_text, log=log, output="")
        if type(exc).__name__ == "ApiException":  # the client's; refused requests and websockets alike
            return start_error(f"Kubernetes refused: {kube_api.reason(exc)}",
                               refusal_todo(exc, self.api.namespace), log=log, output="")
        return None


_taken: dict[str, set[str]] = {}  # pool id -> the running pods it started engines in (``pods``)
