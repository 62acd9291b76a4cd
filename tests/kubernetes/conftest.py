"""The Kubernetes tier: a real two-node cluster on this machine (:mod:`tests.kubernetes.cluster`), once per
test session, taken down after it leaving nothing (its processes, mounts, bridge, files outside its folder).

``.ci/run`` builds the cluster's binaries (``tests/kubernetes/cluster/build.sh``) in the background; the
fixture builds them where they are missing (or waits for that build). Where the machine cannot run the
cluster (not root, a Debian package missing) the tier is skipped with the reason, except under
``WORKBENCH_K8S_REQUIRED=1`` (``.ci/run`` sets it): there that, and a failed build, fail the tier.

Pools start as the user ``wb-tester``, whom the test namespace grants exactly the Role of
``docs/kubernetes-role.yaml``. After each test the namespace holds no object of a pool and no process of its
pods runs (checked, then cleaned so the next test starts clean).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import until
from tests.kubernetes import cluster as kc

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="session")
def kube():
    reason = kc.why_not(built=False)
    if reason and os.environ.get(kc.REQUIRED):  # CI: a tier that cannot run fails, it never skips
        pytest.fail(f"{reason} ({kc.REQUIRED} is set: .ci/run runs this tier)", pytrace=False)
    if reason:
        pytest.skip(reason)
    try:  # seconds when the binaries are cached; waits for .ci/run's background build, if running
        kc.build()
    except subprocess.CalledProcessError as e:
        pytest.fail(f"the test cluster's build failed (build.sh exited {e.returncode}; its output is in "
                    f"this test's captured stdout, and under .ci/run in build/k8s-build.log)", pytrace=False)
    c = kc.KubeCluster()
    c.up()
    try:
        yield c
    finally:
        c.down()
    assert not c.run.exists(), f"{c.run} left behind"
    left = [
        p.pid for p in psutil.process_iter(["cmdline"]) if str(c.run) in " ".join(p.info["cmdline"] or [])
    ]
    assert left == [], f"processes of the cluster left running: {left}"
    mounts = [ln.split()[4] for ln in open("/proc/self/mountinfo") if ln.split()[4].startswith(str(c.run))]
    assert mounts == [], f"left mounted: {mounts}"
    assert kc.BRIDGE not in {i for i in psutil.net_if_addrs()}, "the bridge was left behind"


def pod_processes() -> list[psutil.Process]:
    """The pods' engine processes on this machine (their command line names the pod's supervisor)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "workbench.pool.processes.pod_main" in cmd or "workbench.pool.processes.engine_main" in cmd:
            found.append(p)
    return found


@pytest.fixture
def namespace_left_clean(kube):
    """Fails a test that leaves an object of a pool in the namespace, or a process of its pods running."""
    before = {p.pid for p in pod_processes()}
    yield kube
    left = kube.objects()
    procs = [p for p in pod_processes() if p.pid not in before]
    for name in left:  # clean, so the next test starts with an empty namespace
        kind, _, obj = name.partition("/")
        kube.api_send("DELETE", f"/api/v1/namespaces/{kc.NAMESPACE}/{kind}s/{obj}?gracePeriodSeconds=0")
    until(lambda: not kube.objects(), 30)
    assert left == [], f"left in namespace {kc.NAMESPACE}: {left}"
    assert until(lambda: not [p for p in pod_processes() if p.pid not in before], 30), (
        f"pod processes still running: {[p.pid for p in procs]}"
    )


def pod_template(path: Path, *, memory: str | None = None, extra: dict | None = None) -> Path:
    """A pod template that runs this tree: the local image, the host's /usr, this interpreter's prefix and
    the repository mounted read-only at their own paths; a small CPU request spreads pods over the nodes."""
    mounts, volumes = [], []
    for i, where in enumerate(sorted({"/usr", sys.base_prefix, sys.prefix, str(kc.REPO)})):
        volumes.append({"name": f"host{i}", "hostPath": {"path": where, "type": "Directory"}})
        mounts.append({"name": f"host{i}", "mountPath": where, "readOnly": True})
    resources = {"requests": {"cpu": "100m"}}
    if memory:
        resources["limits"] = {"memory": memory}
    template = {
        "kind": "Pod",
        "metadata": {"labels": {"team": "tests"}},
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "image": kc.IMAGE,
                    "imagePullPolicy": "Never",
                    "volumeMounts": mounts,
                    "resources": resources,
                }
            ],
            "volumes": volumes,
            **(extra or {}),
        },
    }
    path.write_text(json.dumps(template))
    return path


def config(tmp_path: Path, kube, n: int = 2, **changes):
    """A Kubernetes pool's config for the test cluster, as the tester."""
    from workbench.config import PoolConfig

    options = {
        "python": sys.executable,
        "kubeconfig": str(kube.tester_kubeconfig),
        **changes.pop("launcher_options", {}),
    }
    base = dict(
        launcher="kubernetes",
        n=n,
        interface=kc.BRIDGE,
        namespace=kc.NAMESPACE,
        timeout=180,
        pod_template=str(pod_template(tmp_path / "pod.json")),
        launcher_options=options,
    )
    return PoolConfig(**{**base, **changes})


def timed(what: str):
    t0 = time.perf_counter()
    return lambda: print(f"{what}: {time.perf_counter() - t0:.1f} s", flush=True)


KERNEL = """
import time
from workbench import Session
from workbench.config import PoolConfig
s = Session(PoolConfig.from_dict({cfg!r})).start()
print("READY", s.pool_id, flush=True)
time.sleep(600)
"""


@contextlib.contextmanager
def kernel_with_pool(cfg, cwd: Path):
    """A process standing for a notebook's kernel, holding a pool started with ``cfg``: yields
    ``(process, pool id)`` once the pool is up; the process is killed after the block if still alive."""
    code = KERNEL.format(cfg=json.loads(json.dumps(cfg.to_dict())))
    kernel = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(cwd),
        env={**os.environ, "PYTHONPATH": str(kc.REPO)},
    )
    try:
        line = kernel.stdout.readline()
        assert line.startswith("READY"), line
        yield kernel, line.split()[1]
    finally:
        if kernel.poll() is None:
            kernel.kill()
        kernel.wait(10)
        kernel.stdout.close()
