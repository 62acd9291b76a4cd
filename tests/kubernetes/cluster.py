"""A real two-node Kubernetes on this machine, for tests: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, and two "nodes", each a kubelet over a containerd of its own, with a pod network.

The binaries come from ``tests/kubernetes/cluster/build.sh`` (built from Debian's ``kubernetes`` source
package into a cache folder outside the repository, ``/var/cache/workbench-k8s``; see there). Pods are
ordinary processes in their own namespaces that run this machine's Python from a local image (an empty
merged-/usr skeleton: pods mount the host's ``/usr``, the interpreter's prefix and the repository at their
own paths), so the engines run this very tree.

Network: a bridge ``wbk8s0`` (``10.244.0.1/16``) that each pod joins through CNI's bridge plugin (node 1's
pods take ``10.244.1.x``, node 2's ``10.244.2.x``): pods have addresses and host names of their own, as in
any cluster, and reach the kernel at ``10.244.0.1`` (``--interface wbk8s0``). The kubelets serve on that
address too; the control plane listens on 127.0.0.1 only.

Everything runs under ``ROOT/run`` (deleted by :meth:`KubeCluster.down`), every daemon started here and
stopped by its pid; :meth:`down` also kills what containerd's shims left, unmounts what the kubelets and
containerd mounted, deletes the bridge and removes what they wrote outside ``ROOT`` that was not there
before. Needs root, and the Debian packages build.sh installs.

``python -m tests.kubernetes.cluster up|down [ROOT]`` runs it by hand.
"""

from __future__ import annotations

import base64
import io
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = Path(os.environ.get("WORKBENCH_K8S_ROOT", "/var/cache/workbench-k8s"))
BUILD = REPO / "tests" / "kubernetes" / "cluster" / "build.sh"
REQUIRED = "WORKBENCH_K8S_REQUIRED"  # set (CI): the tier fails where it would skip
BINS = ("kube-apiserver", "kubelet", "kube-controller-manager", "kube-scheduler")
BRIDGE, GATEWAY, SUBNET = "wbk8s0", "10.244.0.1", "10.244.0.0/16"
API_PORT = 6443
NODES = ("wb-node-1", "wb-node-2")
NAMESPACE = "wb-test"
TESTER = "wb-tester"  # the user the tests start pools as: only the Role of docs/kubernetes-role.yaml
IMAGE = "localhost/hostusr:1"
PAUSE = "localhost/pause:wb"
OUTSIDE = ("/var/log/pods", "/var/log/containers", "/var/lib/kubelet", "/run/containerd")
# a node that stops reporting is NotReady after this long (the default is 40 s)
NODE_GRACE_S = 16


def why_not(built: bool = True) -> str | None:
    """Why this machine cannot run the cluster (None: it can); ``built``: the binaries too."""
    if os.geteuid() != 0:
        return "the Kubernetes test cluster needs root (containerd, runc, mounts)"
    for tool in ("etcd", "containerd", "ctr", "runc", "openssl", "gcc", "ip"):
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
            return f"not installed: {tool} (tests/kubernetes/cluster/build.sh installs the Debian packages)"
    if not Path("/usr/lib/cni/bridge").exists():
        return "not installed: /usr/lib/cni/bridge (Debian's containernetworking-plugins)"
    missing = [b for b in BINS if not (ROOT / "bin" / b).exists()]
    if missing and built:
        return (
            f"not built: {', '.join(missing)} in {ROOT}/bin (tests/kubernetes/cluster/build.sh builds them)"
        )
    return None


def build(timeout: float = 3600) -> None:
    """Build the binaries into the cache when missing (seconds when they are there)."""
    subprocess.run(["bash", str(BUILD), str(ROOT)], check=True, timeout=timeout)


def _run(*argv, check=True, timeout=30, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in argv], check=check, timeout=timeout, capture_output=True, text=True, **kwargs
    )


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen


class KubeCluster:
    """The cluster under ``root`` (its binaries in ``root/bin``; its state in ``root/run``)."""

    def __init__(self, root: Path = ROOT):
        self.root = Path(root)
        self.run = self.root / "run"
        self.logs = self.run / "logs"
        self.pki = self.run / "pki"
        self.daemons: dict[str, Daemon] = {}
        self.admin_kubeconfig = self.run / "admin.kubeconfig"
        self.tester_kubeconfig = self.run / "tester.kubeconfig"
        self.t0 = time.monotonic()

    def log(self, text: str) -> None:
        print(f"[k8s +{time.monotonic() - self.t0:.1f}s] {text}", flush=True)

    # -- up -----------------------------------------------------------------------------------
    def up(self) -> None:
        """Start everything and wait for both nodes Ready and the test namespace with its Role."""
        self.t0 = time.monotonic()
        if self.run.exists():
            self.log(f"{self.run} exists (a cluster left running, or not cleaned up): taking it down first")
            self.down()
        self.run.mkdir(parents=True)
        self.logs.mkdir()
        (self.run / "outside.pre").write_text(json.dumps(self._outside()))
        try:
            self._pki()
            self._images()
            self._network()
            self._control_plane()
            for i, node in enumerate(NODES, start=1):
                self._node(i, node)
            for node in NODES:
                self._wait(120, f"node {node} Ready", lambda n=node: self._node_ready(n))
            self._wait(120, "the nodes' not-ready taints to go", self._untainted)
            self._namespace()
        except BaseException:
            self.log("start failed: taking down what started; logs were in " + str(self.logs))
            self._keep_logs()
            self.down()
            raise
        self.log(f"cluster up: nodes {', '.join(NODES)} Ready, namespace {NAMESPACE}")

    def _outside(self) -> dict:
        """What exists outside ROOT that the kubelets and containerd write to: down removes only the rest."""
        before = {p: os.path.exists(p) for p in OUTSIDE}
        entries = {
            d: sorted(os.listdir(d)) for d in ("/var/log/pods", "/var/log/containers") if os.path.isdir(d)
        }
        cgroups = sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/k8s.io"))
        return {
            "exists": before,
            "entries": entries,
            "cgroups": cgroups,
            "ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text().strip(),
        }

    def _pki(self) -> None:
        p = self.pki
        p.mkdir()
        ossl = ["openssl"]

        def sh(*argv):
            _run(*ossl, *argv, cwd=p)

        sh(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "30",
            "-subj",
            "/CN=wb-test-ca",
        )
        (p / "apiserver.ext").write_text(
            f"subjectAltName=IP:127.0.0.1,IP:{GATEWAY},DNS:localhost,"
            "DNS:kubernetes,DNS:kubernetes.default,IP:10.254.0.1\n"
        )
        (p / "kubelet.ext").write_text(f"subjectAltName=IP:{GATEWAY},IP:127.0.0.1,DNS:localhost\n")
        (p / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
        for name, subject, ext in (
            ("apiserver", "/CN=kube-apiserver", "apiserver.ext"),
            ("kubelet", "/CN=wb-kubelet", "kubelet.ext"),
            ("kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", "client.ext"),
        ):
            sh(
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                f"{name}.key",
                "-out",
                f"{name}.csr",
                "-subj",
                subject,
            )
            sh(
                "x509",
                "-req",
                "-in",
                f"{name}.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "30",
                "-extfile",
                ext,
                "-out",
                f"{name}.crt",
            )
        sh("genrsa", "-out", "sa.key", "2048")
        sh("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        tokens = {
            "admin": os.urandom(16).hex(),
            TESTER: os.urandom(16).hex(),
            **{node: os.urandom(16).hex() for node in NODES},
        }
        lines = [f"{tokens['admin']},admin,admin,system:masters", f"{tokens[TESTER]},{TESTER},{TESTER}"]
        lines += [f"{tokens[n]},system:node:{n},system:node:{n},system:nodes" for n in NODES]
        (p / "tokens.csv").write_text("\n".join(lines) + "\n")
        for f in p.iterdir():
            f.chmod(0o600)
        self._kubeconfig(self.admin_kubeconfig, "admin", tokens["admin"])
        self._kubeconfig(self.tester_kubeconfig, TESTER, tokens[TESTER])
        for node in NODES:
            self._kubeconfig(self.run / f"{node}.kubeconfig", f"system:node:{node}", tokens[node])
        self.admin_token = tokens["admin"]
        self.log("certificates, tokens and kubeconfigs made")

    def _kubeconfig(self, path: Path, user: str, token: str) -> None:
        ca = base64.b64encode((self.pki / "ca.crt").read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "wb",
                    "cluster": {"server": f"https://127.0.0.1:{API_PORT}", "certificate-authority-data": ca},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "wb", "context": {"cluster": "wb", "user": user, "namespace": NAMESPACE}}],
            "current-context": "wb",
        }
        path.write_text(json.dumps(config))
        path.chmod(0o600)

    def _images(self) -> None:
        """Two images as docker archives (no registry, no docker): a static pause, and the skeleton."""
        images = self.root / "images"
        images.mkdir(exist_ok=True)
        if (images / "pause.tar").exists() and (images / "hostusr.tar").exists():
            return
        (images / "pause.c").write_text(
            "#include <signal.h>\n#include <unistd.h>\n#include <sys/wait.h>\n"
            "static void die(int s) { (void)s; _exit(0); }\n"
            "static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) ; }\n"
            "int main(void) { signal(SIGINT, die); signal(SIGTERM, die); signal(SIGCHLD, reap); "
            "for (;;) pause(); }\n"
        )
        _run("gcc", "-static", "-O2", "-s", "-o", images / "pause", images / "pause.c", timeout=120)
        _image(
            images / "pause.tar",
            PAUSE,
            _layer([("pause", "file", 0o755, (images / "pause").read_bytes())]),
            {"Entrypoint": ["/pause"]},
        )
        entries = [
            (d, "dir", 0o755, None) for d in ("etc", "proc", "sys", "dev", "usr", "run", "var", "root")
        ]
        entries += [("tmp", "dir", 0o1777, None)]
        entries += [("etc/" + f, "file", 0o644, b"") for f in ("hosts", "hostname", "resolv.conf")]
        entries += [
            ("etc/passwd", "file", 0o644, b"root:x:0:0:root:/root:/bin/sh\n"),
            ("etc/group", "file", 0o644, b"root:x:0:\n"),
        ]
        for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # the host's merged-/usr links
            if os.path.islink("/" + d):
                entries.append((d, "link", 0o777, os.readlink("/" + d).lstrip("/")))
        _image(
            images / "hostusr.tar",
            IMAGE,
            _layer(entries),
            {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        )
        self.log("images made")

    def _network(self) -> None:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{GATEWAY}/16", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")

    def _start(self, name: str, argv: list, env: dict | None = None) -> None:
        log = open(self.logs / f"{name}.log", "wb")
        proc = subprocess.Popen(
            ["nice", "-n", os.environ.get("NICE", "10"), *map(str, argv)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "NO_PROXY": f"127.0.0.1,localhost,{GATEWAY}", **(env or {})},
        )
        log.close()
        (self.run / f"{name}.pid").write_text(str(proc.pid))
        self.daemons[name] = Daemon(name, proc)
        time.sleep(0.3)
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited at once: {self._tail(name)}")
        self.log(f"{name} started, pid {proc.pid}")

    def _tail(self, name: str, lines: int = 15) -> str:
        try:
            return "\n".join((self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _wait(self, seconds: float, what: str, ok) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if ok():
                    return
            except Exception:
                pass
            for d in self.daemons.values():
                if d.proc.poll() is not None:
                    raise RuntimeError(f"{d.name} exited while waiting for {what}: {self._tail(d.name)}")
            time.sleep(0.3)
        raise TimeoutError(f"timed out after {seconds:g} s waiting for {what}")

    def _control_plane(self) -> None:
        b, p = self.root / "bin", self.pki
        self._start(
            "etcd",
            [
                "etcd",
                "--name",
                "wb",
                "--data-dir",
                self.run / "etcd",
                "--listen-client-urls",
                "http://127.0.0.1:23790",
                "--advertise-client-urls",
                "http://127.0.0.1:23790",
                "--listen-peer-urls",
                "http://127.0.0.1:23800",
                "--initial-advertise-peer-urls",
                "http://127.0.0.1:23800",
                "--initial-cluster",
                "wb=http://127.0.0.1:23800",
            ],
        )
        self._start(
            "kube-apiserver",
            [
                b / "kube-apiserver",
                "--etcd-servers=http://127.0.0.1:23790",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={API_PORT}",
                "--insecure-port=0",
                f"--tls-cert-file={p}/apiserver.crt",
                f"--tls-private-key-file={p}/apiserver.key",
                f"--client-ca-file={p}/ca.crt",
                f"--token-auth-file={p}/tokens.csv",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                f"--service-account-key-file={p}/sa.pub",
                f"--service-account-signing-key-file={p}/sa.key",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.254.0.0/24",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                f"--kubelet-client-certificate={p}/kubelet-client.crt",
                f"--kubelet-client-key={p}/kubelet-client.key",
                f"--kubelet-certificate-authority={p}/ca.crt",
                "--kubelet-preferred-address-types=InternalIP",
            ],
        )
        self._wait(120, "kube-apiserver ready", lambda: self.api_get("/readyz") is not None)
        self.log("kube-apiserver ready")
        self._start(
            "kube-controller-manager",
            [
                b / "kube-controller-manager",
                f"--kubeconfig={self.admin_kubeconfig}",
                "--bind-address=127.0.0.1",
                "--secure-port=10257",
                "--port=0",
                "--leader-elect=false",
                "--profiling=false",
                f"--service-account-private-key-file={p}/sa.key",
                f"--root-ca-file={p}/ca.crt",
                "--use-service-account-credentials=false",
                "--controllers=*,-csrsigning",
                "--node-monitor-period=1s",
                f"--node-monitor-grace-period={NODE_GRACE_S}s",
            ],
        )
        self._start(
            "kube-scheduler",
            [
                b / "kube-scheduler",
                f"--kubeconfig={self.admin_kubeconfig}",
                "--bind-address=127.0.0.1",
                "--secure-port=10259",
                "--port=0",
                "--leader-elect=false",
                "--profiling=false",
            ],
        )

    def _node(self, i: int, node: str) -> None:
        (self.run / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        d = self.run / node
        (d / "cni").mkdir(parents=True)
        sock = d / "containerd.sock"
        (d / "cni" / "10-wb.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": f"wb-{node}",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": BRIDGE,
                            "isGateway": False,
                            "ipMasq": False,
                            "ipam": {
                                "type": "host-local",
                                "dataDir": str(d / "ipam"),
                                "ranges": [
                                    [
                                        {
                                            "subnet": SUBNET,
                                            "rangeStart": f"10.244.{i}.2",
                                            "rangeEnd": f"10.244.{i}.254",
                                            "gateway": GATEWAY,
                                        }
                                    ]
                                ],
                                "routes": [{"dst": "0.0.0.0/0"}],
                            },
                        },
                        {"type": "loopback"},
                    ],
                }
            )
        )
        (d / "containerd.toml").write_text(f"""version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
""")
        self._start(f"containerd-{node}", ["containerd", "--config", d / "containerd.toml"])
        self._wait(
            30,
            f"containerd of {node}",
            lambda: _run("ctr", "--address", sock, "version", check=False).returncode == 0,
        )
        for image in ("pause", "hostusr"):
            _run(
                "ctr",
                "--address",
                sock,
                "-n",
                "k8s.io",
                "images",
                "import",
                self.root / "images" / f"{image}.tar",
                timeout=120,
            )
        (d / "kubelet.yaml").write_text(
            json.dumps(
                {
                    "apiVersion": "kubelet.config.k8s.io/v1beta1",
                    "kind": "KubeletConfiguration",
                    "nodeStatusUpdateFrequency": "2s",
                    "nodeStatusReportFrequency": "2s",
                    "nodeLeaseDurationSeconds": 8,
                    "authentication": {
                        "anonymous": {"enabled": False},
                        "x509": {"clientCAFile": str(self.pki / "ca.crt")},
                        "webhook": {"enabled": False},
                    },
                    "authorization": {"mode": "AlwaysAllow"},
                }
            )
        )
        port = 10250 + 10 * (i - 1)
        self._kubelet_argv = getattr(self, "_kubelet_argv", {})
        self._kubelet_argv[node] = [
            self.root / "bin" / "kubelet",
            f"--config={d / 'kubelet.yaml'}",
            f"--kubeconfig={self.run / (node + '.kubeconfig')}",
            "--container-runtime=remote",
            f"--container-runtime-endpoint=unix://{sock}",
            f"--root-dir={d / 'kubelet'}",
            f"--cert-dir={d / 'kubelet-pki'}",
            f"--tls-cert-file={self.pki / 'kubelet.crt'}",
            f"--tls-private-key-file={self.pki / 'kubelet.key'}",
            f"--hostname-override={node}",
            f"--node-ip={GATEWAY}",
            f"--address={GATEWAY}",
            f"--port={port}",
            "--read-only-port=0",
            "--healthz-bind-address=127.0.0.1",
            f"--healthz-port={port - 2}",
            "--cgroup-driver=cgroupfs",
            "--fail-swap-on=false",
            "--cgroups-per-qos=false",
            "--enforce-node-allocatable=",
            f"--pod-infra-container-image={PAUSE}",
            "--eviction-hard=",
            "--image-gc-high-threshold=100",
            "--image-gc-low-threshold=99",
            # no cluster DNS here, and the host's resolver is not reachable from the pod network: a lookup
            # is refused at once instead of timing out (torch.distributed's join waited 20 s on one)
            f"--resolv-conf={self.run / 'resolv.conf'}",
            "--register-node=true",
            "--v=1",
        ]
        self._start(f"kubelet-{node}", self._kubelet_argv[node])

    def _node_ready(self, node: str) -> bool:
        got = self.api_get(f"/api/v1/nodes/{node}")
        conditions = (got or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _untainted(self) -> bool:
        nodes = (self.api_get("/api/v1/nodes") or {}).get("items") or []
        return len(nodes) == len(NODES) and not any(n["spec"].get("taints") for n in nodes)

    def _namespace(self) -> None:
        """The test namespace, its default service account, and the launcher's Role (the docs' file) bound
        to the tester."""
        self.api_send(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        )
        self._wait(
            60,
            f"serviceaccount {NAMESPACE}/default",
            lambda: self.api_get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default") is not None,
        )
        self.apply_role(role_rules())
        self.api_send(
            "POST",
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "distributed-workbench"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "distributed-workbench",
                },
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TESTER}],
            },
        )

    def apply_role(self, rules: list[dict]) -> None:
        """The tester's Role in the test namespace, with these rules (created, or replaced)."""
        path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles"
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "distributed-workbench"},
            "rules": rules,
        }
        if self.api_get(f"{path}/distributed-workbench") is None:
            self.api_send("POST", path, role)
        else:
            self.api_send("PUT", f"{path}/distributed-workbench", role)

    # -- the API, as admin (curl-free: the standard library) --------------------------------------
    def _request(self, method: str, path: str, body: dict | None = None):
        import ssl
        import urllib.error
        import urllib.request

        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        request = urllib.request.Request(
            f"https://127.0.0.1:{API_PORT}{path}",
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self._admin_token()}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as answer:
                raw = answer.read()
                return json.loads(raw) if raw.strip().startswith(b"{") else {"text": raw.decode()}
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise RuntimeError(f"{method} {path}: {exc.code} {exc.read().decode(errors='replace')}") from None

    def _admin_token(self) -> str:
        if not hasattr(self, "admin_token"):
            config = json.loads(self.admin_kubeconfig.read_text())
            self.admin_token = config["users"][0]["user"]["token"]
        return self.admin_token

    def api_get(self, path: str):
        try:
            return self._request("GET", path)
        except (OSError, RuntimeError):
            return None

    def api_send(self, method: str, path: str, body: dict | None = None):
        return self._request(method, path, body)

    def objects(self, namespace: str = NAMESPACE) -> list[str]:
        """Every pod and Secret of the namespace a pool named (``wb-``...): what a stop leaves."""
        left = []
        for kind in ("pods", "secrets"):
            items = (self.api_get(f"/api/v1/namespaces/{namespace}/{kind}") or {}).get("items") or []
            left += [
                f"{kind[:-1]}/{i['metadata']['name']}"
                for i in items
                if i["metadata"]["name"].startswith("wb-")
            ]
        return left

    # -- a node's kubelet stopped and started again -----------------------------------------------
    def stop_kubelet(self, node: str) -> None:
        d = self.daemons.pop(f"kubelet-{node}")
        d.proc.terminate()
        d.proc.wait(15)

    def start_kubelet(self, node: str) -> None:
        """Start a stopped node's kubelet again (same arguments as its first start)."""
        self._start(f"kubelet-{node}", self._kubelet_argv[node])

    # -- down ---------------------------------------------------------------------------------------
    def down(self) -> None:
        """Stop everything by pid, kill what containerd's shims left, unmount, delete the bridge, and remove
        what the daemons wrote outside ROOT that was not there before; then ROOT/run."""
        if not self.run.exists():
            return
        pids = {f.stem: int(f.read_text() or 0) for f in self.run.glob("*.pid")}
        for node in NODES:  # the kubelets first: they would restart what is killed below
            self._stop(f"kubelet-{node}", pids)
        for node in NODES:
            sock = self.run / node / "containerd.sock"
            if sock.exists() and _alive(pids.get(f"containerd-{node}", 0)):
                ctr = ["ctr", "--address", sock, "-n", "k8s.io"]
                ids = _run(*ctr, "tasks", "ls", "-q", check=False).stdout.split()
                for cid in ids:
                    _run(*ctr, "tasks", "kill", "-s", "SIGKILL", cid, check=False)
                for cid in ids:
                    for _ in range(40):
                        if _run(*ctr, "tasks", "delete", cid, check=False).returncode == 0:
                            break
                        time.sleep(0.25)
            self._stop(f"containerd-{node}", pids)
        for f in [
            *self.run.glob("*/containerd/state/io.containerd.runtime.v2.task/*/*/shim.pid"),
            *self.run.glob("*/containerd/state/io.containerd.runtime.v2.task/*/*/init.pid"),
        ]:
            try:
                os.kill(int(f.read_text()), signal.SIGKILL)
            except (ValueError, ProcessLookupError, OSError):
                pass
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            self._stop(name, pids)
        for _ in range(3):  # deepest first: the kubelets bind-mount their root onto itself
            mounts = self._mounts()
            if not mounts:
                break
            for m in mounts:
                if subprocess.run(["umount", m], capture_output=True).returncode:
                    subprocess.run(["umount", "-l", m], capture_output=True)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)
        self._remove_outside()
        left = self._mounts()
        if left:
            raise RuntimeError(f"still mounted under {self.run}: {left}")
        self._keep_logs("last-logs")  # the daemons' logs of the last run, for a failure to be read later
        shutil.rmtree(self.run)
        self.daemons.clear()

    def _stop(self, name: str, pids: dict) -> None:
        d = self.daemons.pop(name, None)
        pid = d.proc.pid if d else pids.get(name, 0)
        if not _alive(pid) or not _ours(pid, self.root):
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while _alive(pid) and time.monotonic() < deadline:
            if d:
                d.proc.poll()
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        if d:
            d.proc.wait(10)

    def _mounts(self) -> list[str]:
        prefix = str(self.run) + "/"
        found = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix):
                found.append(point)
        return sorted(found, reverse=True)

    def _remove_outside(self) -> None:
        try:
            pre = json.loads((self.run / "outside.pre").read_text())
        except (OSError, ValueError):
            return
        for d in ("/var/log/pods", "/var/log/containers"):
            if not os.path.isdir(d):
                continue
            if pre["exists"].get(d):
                for e in os.listdir(d):
                    if e not in pre["entries"].get(d, []):
                        path = os.path.join(d, e)
                        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(
                            path
                        ) else os.unlink(path)
            else:
                shutil.rmtree(d, ignore_errors=True)
        for d in ("/var/lib/kubelet", "/run/containerd"):
            if os.path.exists(d) and not pre["exists"].get(d):
                shutil.rmtree(d, ignore_errors=True)
        for cg in Path("/sys/fs/cgroup").glob("*/k8s.io"):
            if str(cg) in pre["cgroups"]:
                continue
            for sub in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                try:
                    sub.rmdir()
                except OSError:
                    pass
            try:
                cg.rmdir()
            except OSError:
                pass
        forward = Path("/proc/sys/net/ipv4/ip_forward")
        if forward.read_text().strip() != pre.get("ip_forward", "0"):
            forward.write_text(pre.get("ip_forward", "0"))

    def _keep_logs(self, name: str = "last-failed-logs") -> None:
        keep = self.root / name
        shutil.rmtree(keep, ignore_errors=True)
        if self.logs.exists():
            shutil.copytree(self.logs, keep)


def role_rules(path: Path = REPO / "docs" / "kubernetes-role.yaml") -> list[dict]:
    """The rules of the Role the docs give (the very file)."""
    import yaml

    return yaml.safe_load(path.read_text())["rules"]


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    except OSError:
        return False


def _ours(pid: int, root: Path) -> bool:
    """A process we started: its command line names ROOT (a pid reused by another process does not)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return str(root) in cmdline


def _layer(entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name, kind, mode, arg in entries:
            ti = tarfile.TarInfo(name)
            ti.mode, ti.mtime = mode, 0
            if kind == "dir":
                ti.type = tarfile.DIRTYPE
                t.addfile(ti)
            elif kind == "link":
                ti.type, ti.linkname = tarfile.SYMTYPE, arg
                t.addfile(ti)
            else:
                ti.size = len(arg)
                t.addfile(ti, io.BytesIO(arg))
    return buf.getvalue()


def _image(path: Path, tag: str, layer: bytes, config: dict) -> None:
    """A docker archive (what `docker save` writes), which `ctr images import` reads."""
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    diff = "sha256:" + sha256(layer).hexdigest()
    cfg = json.dumps(
        {
            "architecture": arch,
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [diff]},
        }
    ).encode()
    cfg_name = sha256(cfg).hexdigest() + ".json"
    manifest = json.dumps([{"Config": cfg_name, "RepoTags": [tag], "Layers": ["layer.tar"]}]).encode()
    with tarfile.open(path, "w") as t:
        for name, data in (("layer.tar", layer), (cfg_name, cfg), ("manifest.json", manifest)):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime, ti.mode = len(data), 0, 0o644
            t.addfile(ti, io.BytesIO(data))


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "up"
    cluster = KubeCluster(Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT)
    if what == "build":
        build()
    elif what == "up":
        cluster.up()
    else:
        cluster.down()
