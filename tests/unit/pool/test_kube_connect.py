"""Which cluster the Kubernetes launcher talks to, read by the official client from real kubeconfig files (no
cluster is asked: connecting only reads the files)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("kubernetes")

from workbench.pool.launch import kube_api  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def kubeconfig(path, name: str, namespace: str, server: str) -> str:
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: {name}, cluster: {{server: "{server}"}}}}]
users: [{{name: {name}, user: {{token: t-{name}}}}}]
contexts: [{{name: {name}, context: {{cluster: {name}, user: {name}, namespace: {namespace}}}}}]
current-context: {name}
""")
    return str(path)


def test_every_file_a_kubeconfig_list_names_is_read(tmp_path, monkeypatch):
    """``KUBECONFIG=a:b`` names two files, which the client merges: a context of the second file is found (it
    was not: only the first file was read), and the lease's delete command carries both."""
    first = kubeconfig(tmp_path / "a.yaml", "lab", "lab-ns", "https://10.0.0.1:6443")
    second = kubeconfig(tmp_path / "b.yaml", "team", "team-a", "https://10.0.0.2:6443")
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([first, second]))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    api = kube_api.connect(context="team")
    assert api.namespace == "team-a" and not api.in_cluster
    assert api.core.api_client.configuration.host == "https://10.0.0.2:6443"
    command = api.delete_command("1a2b3c4d")
    assert command[command.index("--kubeconfig") + 1] == os.pathsep.join([first, second])
