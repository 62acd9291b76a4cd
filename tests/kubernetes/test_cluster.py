"""The Kubernetes tier's cluster itself (issue 41): built into its cache when missing and started on this
machine (the first test of the tier, so the build and the start are under this test's long timeout, not a
pool test's), with two Ready nodes, the pod network and the test namespace with the launcher's Role. That it
goes leaving nothing (daemons, containers' shims, mounts, the bridge, files outside its folder) is checked
when the session's fixture takes it down."""

from __future__ import annotations

import psutil
import pytest

from tests.kubernetes import cluster as kc

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(3600)  # a cold build: ~12 min on 2 busy cores; .ci/run starts it before the suite
def test_the_cluster_is_built_and_up(kube):
    for node in kc.NODES:
        assert kube._node_ready(node)
    assert kc.BRIDGE in psutil.net_if_addrs()
    role = kube.api_get(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{kc.NAMESPACE}/roles/distributed-workbench"
    )
    assert role["rules"] == kc.role_rules()  # exactly the docs' Role
    assert kube.objects() == []
    # every daemon listens on loopback or the pod network's own address, never on all interfaces
    pids = {d.proc.pid for d in kube.daemons.values()}
    for conn in psutil.net_connections("inet"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            assert conn.laddr.ip in ("127.0.0.1", kc.GATEWAY), (conn.pid, conn.laddr)
