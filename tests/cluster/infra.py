"""Real clusters on one machine, for tests: network namespaces as hosts, a Slurm box, sshd on each host.

Everything runs in private network namespaces made here, so no daemon of a test is reachable from
outside them and two test runs (or other people's Slurm) never share a port. Every daemon is started
by us (``subprocess.Popen``, pid kept) and stopped by that pid; a namespace is only deleted after every
process inside it (all ours: nothing else runs in a namespace we just made) has been stopped.

Needs root, ``ip`` (iproute2), ``nsenter``/``unshare`` (util-linux), and for the parts that use them
Debian's ``slurmctld slurmd slurm-client munge``, ``openssh-server`` and ``openmpi-bin``.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]


def missing(*commands: str) -> list[str]:
    """The commands of ``commands`` that are not installed (``PATH`` plus ``/usr/sbin``)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [c for c in commands if shutil.which(c, path=path) is None]


def why_no_namespaces() -> str | None:
    """``None`` when this process can make network namespaces; else the reason (for ``pytest.skip``)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    gone = missing("ip", "nsenter", "unshare")
    if gone:
        return f"not installed: {', '.join(gone)} (iproute2, util-linux)"
    name = f"wbprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _run(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("check", True)
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    kwargs.setdefault("timeout", 30)
    return subprocess.run(list(argv), **kwargs)


def stop_processes(pids: list[int], grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL what is left after ``grace`` seconds (pids we started)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if _alive(p)]
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reap our own children
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def describe(pids: list[int]) -> list[str]:
    """``"pid: command line"`` for each pid still running (for assertion messages)."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            out.append(f"{pid}: {cmdline[:200]}")
        except OSError:
            pass
    return out


class Netns:
    """A network namespace made for one test: a "host" with its own interfaces, ports and (optionally,
    per process) its own hostname.

    >>> ns = Netns.create("wbdoc")          # doctest: +SKIP
    >>> ns.run(["ip", "-4", "addr"])       # doctest: +SKIP
    >>> ns.delete()                         # doctest: +SKIP
    """

    def __init__(self, name: str):
        self.name = name
        self.path = f"/run/netns/{name}"

    @classmethod
    def create(cls, name: str) -> Netns:
        _run("ip", "netns", "add", name)
        ns = cls(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")
        return ns

    def argv(self, cmd: list[str], hostname: str | None = None) -> list[str]:
        """``cmd`` run inside the namespace (``nsenter --net``: the rest of the system stays as it is,
        cgroups included), in a UTS namespace of its own named ``hostname`` if given."""
        prefix = ["nsenter", f"--net={self.path}"]
        if hostname:
            prefix += ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', hostname]
        return prefix + list(cmd)

    def run(self, cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
        return _run(*self.argv(cmd), **kwargs)

    def popen(self, cmd: list[str], *, hostname: str | None = None, log: Path | None = None,
              **kwargs) -> subprocess.Popen:
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 (closed by the child's exit)
        return subprocess.Popen(self.argv(cmd, hostname), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, **kwargs)

    def pids(self) -> list[int]:
        """Every process whose network namespace is this one."""
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def wait_empty(self, timeout: float = 10.0, keep: set[int] = frozenset()) -> list[str]:
        """Wait until no process but ``keep`` runs in the namespace; return what is still there."""
        deadline = time.monotonic() + timeout
        while True:
            left = [p for p in self.pids() if p not in keep]
            if not left or time.monotonic() > deadline:
                return describe(left)
            time.sleep(0.2)

    def delete(self) -> None:
        """Stop every process left inside (all of them ours), then remove the namespace."""
        for _ in range(3):
            pids = self.pids()
            if not pids:
                break
            stop_processes(pids)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


def make_hosts(tag: str, names: list[str], subnet: str = "10.77.0") -> dict[str, tuple[Netns, str]]:
    """Namespaces as hosts on one LAN: the first holds a bridge ``wb0`` (``SUBNET.1``), each other one a
    veth end also named ``wb0`` (``SUBNET.11``, ``.12``...), as a cluster has ``eth0`` on every node.
    Returns ``{name: (namespace, address)}``; interfaces are made inside the namespaces, never in ours.
    """
    hosts: dict[str, tuple[Netns, str]] = {}
    head_name = f"{tag}-{names[0]}"
    head = Netns.create(head_name)
    hosts[names[0]] = (head, f"{subnet}.1")
    _run("ip", "-n", head_name, "link", "add", "wb0", "type", "bridge")
    _run("ip", "-n", head_name, "addr", "add", f"{subnet}.1/24", "dev", "wb0")
    _run("ip", "-n", head_name, "link", "set", "wb0", "up")
    for i, name in enumerate(names[1:], start=1):
        ns = Netns.create(f"{tag}-{name}")
        address = f"{subnet}.{10 + i}"
        hosts[name] = (ns, address)
        _run("ip", "-n", head_name, "link", "add", f"port{i}", "type", "veth", "peer", "name", "wb0",
             "netns", ns.name)
        _run("ip", "-n", head_name, "link", "set", f"port{i}", "master", "wb0")
        _run("ip", "-n", head_name, "link", "set", f"port{i}", "up")
        _run("ip", "-n", ns.name, "addr", "add", f"{address}/24", "dev", "wb0")
        _run("ip", "-n", ns.name, "link", "set", "wb0", "up")
    return hosts


def start_munged(folder: Path) -> subprocess.Popen:
    """munged with a key and socket of its own in ``folder`` (``folder/sock``), as the munge user."""
    folder.mkdir(parents=True, exist_ok=True)
    _run("mungekey", "--create", "--keyfile", str(folder / "munge.key"))
    shutil.chown(folder, "munge", "munge")
    shutil.chown(folder / "munge.key", "munge", "munge")
    folder.chmod(0o711)  # munged needs x for all on the socket's folder
    (folder / "munge.key").chmod(0o400)
    return subprocess.Popen(
        ["munged", "-F", f"--socket={folder / 'sock'}", f"--key-file={folder / 'munge.key'}",
         f"--pid-file={folder / 'pid'}", f"--log-file={folder / 'log'}", f"--seed-file={folder / 'seed'}"],
        user="munge", group="munge", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)


def slurm_conf(cluster: str, ctld_host: str, d: Path, *, spool: str, pid: str, log: str,
               nodes: list[str], partitions: list[str]) -> str:
    """A private ``slurm.conf``: munge on ``d/munge/sock``, state and logs under ``d``, SlurmUser root,
    ``proctrack/linuxproc``, ``task/none``, no accounting; ``spool``, ``pid``, ``log``: slurmd's (``%n``:
    the node's name, for several slurmds on one machine)."""
    return f"""\
ClusterName={cluster}
SlurmctldHost={ctld_host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge/sock
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={d}/spool/ctld
SlurmdSpoolDir={spool}
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={pid}
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={log}
SchedulerType=sched/backfill
""" + "".join(f"{line}\n" for line in [*nodes, *partitions])


class SlurmBox:
    """A one-node Slurm (Debian's slurmctld, slurmd, munge) in a namespace of its own.

    Private everything: munge key and socket, ``slurm.conf`` (``SLURM_CONF``), spool, logs and pid
    files live in ``workdir``. SlurmUser is root, ``proctrack/linuxproc``, ``task/none``, no accounting.

    >>> box = SlurmBox(ns, tmp_path).start()     # doctest: +SKIP
    >>> box.env["SLURM_CONF"]                    # doctest: +SKIP
    """

    def __init__(self, ns: Netns, workdir: Path):
        self.ns, self.dir = ns, Path(workdir)
        self.conf = self.dir / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, timeout: float = 30.0) -> SlurmBox:
        d = self.dir
        d.chmod(0o755)
        for sub in ("spool/ctld", "spool/d", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        self.procs["munged"] = start_munged(d / "munge")
        host = os.uname().nodename.split(".")[0]
        # slurmctld resolves its wildcard listen address with AI_ADDRCONFIG, which needs some
        # non-loopback address in the namespace: a veth pair that leads nowhere gives one.
        _run("ip", "-n", self.ns.name, "link", "add", "wbdummy0", "type", "veth", "peer", "name", "wbdummy1")
        _run("ip", "-n", self.ns.name, "addr", "add", "10.78.0.1/24", "dev", "wbdummy0")
        _run("ip", "-n", self.ns.name, "link", "set", "wbdummy0", "up")
        self.conf.write_text(slurm_conf(
            "wbbox", f"{host}(127.0.0.1)", d, spool=f"{d}/spool/d", pid=f"{d}/slurmd.pid",
            log=f"{d}/log/slurmd.log",
            nodes=[f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN"],
            partitions=[f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP "
                        "OverSubscribe=FORCE:8"]))
        env = {**os.environ, **self.env}
        for daemon in ("slurmctld", "slurmd"):
            self.procs[daemon] = self.ns.popen([daemon, "-D", "-f", str(self.conf)],
                                               log=d / "log" / f"{daemon}.out", env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.ns.run(["sinfo", "-h", "-o", "%T"], check=False, env=env).stdout.strip()
            if state.startswith("idle"):
                return self
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                break
            time.sleep(0.2)
        raise RuntimeError(f"Slurm did not come up: {self.log_tail()}")

    def squeue(self) -> list[str]:
        """Job ids still known to slurmctld (any state)."""
        out = self.ns.run(["squeue", "-h", "-o", "%i %T"], check=False, env={**os.environ, **self.env}).stdout
        return [line for line in out.splitlines() if line.strip()]

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"):
            path = self.dir / "log" / name
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel every job (all ours: the cluster is private), then stop slurmd, slurmctld, munged."""
        ctld = self.procs.get("slurmctld")
        jobs = [j.split()[0] for j in self.squeue()] if ctld is not None and ctld.poll() is None else []
        if jobs:
            self.ns.run(["scancel", "--full", "--quiet", *jobs], check=False, env={**os.environ, **self.env})
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                stop_processes([proc.pid])
                proc.wait(5)


class SlurmCluster:
    """A Slurm of several nodes on one machine: network-namespace hosts on one bridge (see
    :func:`make_hosts`), slurmctld on ``head``, one slurmd on each node, each daemon in a UTS namespace of
    its own so that its hostname is its node's name (slurmd finds its ``NodeName`` by hostname; Debian's
    slurmd is not built for several slurmds per host). munged runs in this namespace (a unix socket
    needs no network). Each node declares ``cpus`` CPUs (all share the machine's cores).

    Two partitions, neither oversubscribed (as GPU partitions are: a job asking for CPUs another job holds
    waits ``PENDING (Resources)``): ``debug`` (every node, the default) and ``one`` (the first node only).
    Clients run in a namespace on the bridge (head or a node) with :attr:`env` (``SLURM_CONF``).

    >>> cluster = SlurmCluster(tmp_path, "wbs2", "10.77.6").start()     # doctest: +SKIP
    >>> cluster.run(["srun", "-N2", "hostname"]).stdout                  # doctest: +SKIP
    'n1\\nn2\\n'
    >>> cluster.stop()                                                    # doctest: +SKIP
    """

    def __init__(self, workdir: Path, tag: str, subnet: str, nodes: tuple[str, ...] = ("n1", "n2"),
                 cpus: int = 2):
        self.dir, self.tag, self.subnet, self.nodes, self.cpus = Path(workdir), tag, subnet, nodes, cpus
        self.conf = self.dir / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        self.hosts: dict[str, tuple[Netns, str]] = {}
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def head(self) -> Netns:
        return self.hosts["head"][0]

    def address(self, node: str) -> str:
        return self.hosts[node][1]

    def start(self, timeout: float = 40.0) -> SlurmCluster:
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
        for sub in ("spool/ctld", "log", *(f"spool/{n}" for n in self.nodes)):
            (d / sub).mkdir(parents=True, exist_ok=True)
        self.hosts = make_hosts(self.tag, ["head", *self.nodes], self.subnet)
        self.procs["munged"] = start_munged(d / "munge")
        nodes = [f"NodeName={n} NodeHostname={n} NodeAddr={self.address(n)} CPUs={self.cpus} RealMemory=1000 "
                 "State=UNKNOWN" for n in self.nodes]
        every = ",".join(self.nodes)
        whole = "MaxTime=INFINITE State=UP OverSubscribe=NO"
        partitions = [f"PartitionName=debug Nodes={every} Default=YES {whole}",
                      f"PartitionName=one Nodes={self.nodes[0]} {whole}"]
        self.conf.write_text(slurm_conf("wbtwo", f"head({self.subnet}.1)", d, spool=f"{d}/spool/%n",
                                        pid=f"{d}/slurmd-%n.pid", log=f"{d}/log/slurmd-%n.log", nodes=nodes,
                                        partitions=partitions))
        env = {**os.environ, **self.env}
        self.procs["slurmctld"] = self.head.popen(["slurmctld", "-D", "-f", str(self.conf)], hostname="head",
                                                  log=d / "log" / "slurmctld.out", env=env)
        for n in self.nodes:
            self.procs[f"slurmd-{n}"] = self.hosts[n][0].popen(["slurmd", "-D", "-f", str(self.conf)],
                                                               hostname=n, log=d / "log" / f"slurmd-{n}.out",
                                                               env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout.splitlines()
            if {line.split()[0] for line in lines if line.endswith(" idle")} == set(self.nodes):
                return self
            if any(p.poll() is not None for p in self.procs.values()):
                break
            time.sleep(0.2)
        raise RuntimeError(f"the {len(self.nodes)}-node Slurm did not come up: {self.log_tail()}")

    def run(self, cmd: list[str], ns: Netns | None = None, **kwargs) -> subprocess.CompletedProcess:
        """A Slurm client command in ``ns`` (head by default), with :attr:`env`."""
        kwargs.setdefault("env", {**os.environ, **self.env})
        return (ns or self.head).run(cmd, **kwargs)

    def squeue(self) -> list[str]:
        """``JOBID STATE REASON`` of every job slurmctld still knows (any state)."""
        out = self.run(["squeue", "-h", "-o", "%i %T %r"], check=False).stdout
        return [line for line in out.splitlines() if line.strip()]

    def left(self, keep: set[int] = frozenset()) -> list[str]:
        """What still runs in the cluster's namespaces besides its daemons (and slurmctld's helper
        ``slurmscriptd``) and ``keep``: a job's processes, or a test's."""
        keep = {p.pid for p in self.procs.values()} | set(keep)
        for pid in list(keep):
            try:
                keep |= {c.pid for c in psutil.Process(pid).children(recursive=True)
                         if c.name() in ("slurmscriptd", "slurmctld", "slurmd")}
            except psutil.Error:
                pass
        return [line for ns, _ in self.hosts.values()
                for line in describe([p for p in ns.pids() if p not in keep])]

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for path in sorted((self.dir / "log").glob("*")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel every job (all ours: the cluster is private), stop the daemons by pid, delete the
        namespaces (stopping anything a job left in them)."""
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            jobs = [j.split()[0] for j in self.squeue()]
            if jobs:
                self.run(["scancel", "--full", "--quiet", *jobs], check=False)
        for name in [*(f"slurmd-{n}" for n in self.nodes), "slurmctld", "munged"]:
            proc = self.procs.pop(name, None)
            if proc is not None:
                stop_processes([proc.pid])
                proc.wait(5)
        for ns, _ in self.hosts.values():
            ns.delete()
        self.hosts = {}


class Sshd:
    """OpenSSH's sshd in a namespace, listening on that host's address only, keys in ``workdir``.

    >>> sshd = Sshd(ns, "10.77.0.11", tmp_path, hostname="n1").start()   # doctest: +SKIP
    >>> sshd.client_args                                                  # doctest: +SKIP
    """

    def __init__(self, ns: Netns, address: str, workdir: Path, hostname: str):
        self.ns, self.address, self.dir, self.hostname = ns, address, Path(workdir), hostname
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def client_key(workdir: Path) -> Path:
        key = Path(workdir) / "id_ed25519"
        if not key.exists():
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
            (Path(workdir) / "authorized_keys").write_text(Path(f"{key}.pub").read_text())
        return key

    @staticmethod
    def client_args(workdir: Path) -> list[str]:
        return ["-i", str(Sshd.client_key(workdir)), "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]

    def start(self, timeout: float = 20.0) -> Sshd:
        self.client_key(self.dir)
        host_key = self.dir / f"host_{self.hostname}"
        if not host_key.exists():
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        config = self.dir / f"sshd_{self.hostname}.conf"
        config.write_text(f"""\
ListenAddress {self.address}
Port 22
HostKey {host_key}
PidFile {self.dir}/sshd_{self.hostname}.pid
AuthorizedKeysFile {self.dir}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
""")
        self.proc = self.ns.popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], hostname=self.hostname,
                                  log=self.dir / f"sshd_{self.hostname}.log")
        return self

    def wait(self, from_ns: Netns, timeout: float = 20.0) -> None:
        """Until ``ssh root@address true`` works from ``from_ns``."""
        deadline = time.monotonic() + timeout
        while True:
            done = from_ns.run(["ssh", *self.client_args(self.dir), f"root@{self.address}", "true"],
                               check=False)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline or self.proc.poll() is not None:
                log = (self.dir / f"sshd_{self.hostname}.log").read_text(errors="replace")
                raise RuntimeError(f"sshd on {self.address} not reachable: {done.stderr}\n{log[-2000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None:
            stop_processes([self.proc.pid])
            self.proc.wait(5)
            self.proc = None


def run_driver(ns: Netns, scenario: str, spec: dict, *, timeout: float, env: dict | None = None,
               hostname: str | None = None, workdir: Path) -> dict:
    """Run ``tests/cluster/driver.py SCENARIO`` inside ``ns`` (the kernel of a "head node") and return the
    JSON it wrote. On timeout its whole process group is killed and the output tail is raised."""
    out = Path(workdir) / f"{scenario}-result.json"
    log = Path(workdir) / f"{scenario}-driver.log"
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
                "WORKBENCH_STATE_DIR": str(Path(workdir) / "state"), **(env or {})}
    driver = REPO / "tests" / "cluster" / "driver.py"
    cmd = [sys.executable, str(driver), scenario, json.dumps(spec), str(out)]
    with open(log, "wb") as f:
        proc = subprocess.Popen(ns.argv(cmd, hostname), stdout=f, stderr=subprocess.STDOUT, env=full_env,
                                cwd=workdir, start_new_session=True, stdin=subprocess.DEVNULL)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
            raise AssertionError(f"driver {scenario} ran past {timeout} s:\n{_tail(log)}") from None
    if not out.exists():
        raise AssertionError(f"driver {scenario} exited {proc.returncode} without a result:\n{_tail(log)}")
    result = json.loads(out.read_text())
    if result.get("error"):
        raise AssertionError(f"driver {scenario} failed:\n{result['error']}\n--- log\n{_tail(log)}")
    result["log"] = str(log)
    return result


ALLOCATION_SHAPES = ("salloc", "batch")


def run_in_allocation(cluster: SlurmCluster, scenario: str, spec: dict, *, nodes: int, timeout: float,
                      workdir: Path, how: str = "salloc", partition: str | None = None,
                      env: dict | None = None, minutes: int = 30) -> dict:
    """Run ``tests/cluster/driver.py SCENARIO`` as a kernel inside a Slurm allocation of ``nodes`` whole
    nodes (``--exclusive``: every CPU of them is the job's) for ``minutes`` (30), and return the JSON it
    wrote.

    ``how``: ``"salloc"``, the notebook's shell started by ``salloc`` on the login node (head), with
    ``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``... set; ``"batch"``, the shape of Open OnDemand's and
    batchspawner's sessions: the kernel is the job's batch script on its first node (hostname n1, that
    node's network, ``SLURM_STEP_ID=batch``...). ``partition``: ``debug`` (every node) for 2 nodes, ``one``
    (n1 only) for 1 node, unless given. On timeout the allocation is ended (the ``salloc`` killed, the job
    cancelled) and the output tail is raised.
    """
    assert how in ALLOCATION_SHAPES, how
    partition = partition or ("debug" if nodes > 1 else "one")
    out = Path(workdir) / f"{scenario}-{how}-{nodes}-result.json"
    log = Path(workdir) / f"{scenario}-{how}-{nodes}-driver.log"
    full_env = {**os.environ, **cluster.env, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
                "WORKBENCH_STATE_DIR": str(Path(workdir) / "state"), **(env or {})}
    driver = REPO / "tests" / "cluster" / "driver.py"
    cmd = [sys.executable, str(driver), scenario, json.dumps(spec), str(out)]
    asked = [f"--nodes={nodes}", "--exclusive", f"--partition={partition}", f"--job-name=wb-{scenario}",
             f"--time={minutes}"]
    if how == "salloc":
        argv = ["salloc", *asked, "--", *cmd]
    else:  # the kernel as the batch script; sbatch --wait returns when the job has ended
        argv = ["sbatch", "--wait", *asked, f"--output={log}", f"--chdir={workdir}",
                f"--wrap={shlex.join(cmd)}"]
    submit = Path(workdir) / f"{scenario}-{how}-{nodes}-submit.log"
    with open(log if how == "salloc" else submit, "wb") as f:  # the batch script writes its own log
        proc = subprocess.Popen(cluster.head.argv(argv), stdout=f, stderr=subprocess.STDOUT, env=full_env,
                                cwd=workdir, start_new_session=True, stdin=subprocess.DEVNULL)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            for job in cluster.squeue():
                cluster.run(["scancel", "--full", job.split()[0]], check=False)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
            raise AssertionError(f"driver {scenario} inside the allocation ran past {timeout} s:\n"
                                 f"{_tail(log)}") from None
    if not out.exists():
        raise AssertionError(f"driver {scenario} ({how}) exited {proc.returncode} without a result:\n"
                             f"{_tail(submit, 2000)}\n{_tail(log)}\n{cluster.log_tail()}")
    result = json.loads(out.read_text())
    if result.get("error"):
        raise AssertionError(f"driver {scenario} failed:\n{result['error']}\n--- log\n{_tail(log)}")
    result["log"] = str(log)
    return result


def _tail(path: Path, chars: int = 6000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no output)"


def scratch(prefix: str) -> Path:
    """A scratch folder readable by all (the munge user, ssh logins)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path
