"""Fixtures for real clusters on one machine: a Slurm box and "hosts" made of network namespaces.

Each fixture checks what it needs (root, namespaces, the Debian packages) and skips with the reason only
where that is missing; `.ci/run` installs the packages, so in CI these tests run. Every fixture stops
what it started, by pid, and deletes its namespaces, also when the test fails.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import subprocess

import psutil
import pytest

from tests.cluster import infra
from tests.conftest import alive, until


@pytest.fixture(scope="session")
def namespaces_ok():
    reason = infra.why_no_namespaces()
    if reason:
        pytest.skip(reason)


def need(*commands: str) -> None:
    gone = infra.missing(*commands)
    if gone:
        pytest.skip(f"not installed: {', '.join(gone)} (see .ci/run for the Debian packages)")


@pytest.fixture
def workdir():
    path = infra.scratch("wb-cluster-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def slurm_box(namespaces_ok, workdir):
    """A one-node Slurm in its own namespace; yields (box, namespace)."""
    need("slurmctld", "slurmd", "munged", "mungekey", "sbatch", "squeue", "scancel", "sinfo")
    ns = infra.Netns.create(f"wbslurm{secrets.token_hex(3)}")
    box = infra.SlurmBox(ns, workdir / "slurm")
    (workdir / "slurm").mkdir()
    try:
        box.start()
        yield box, ns
    finally:
        box.stop()
        ns.delete()


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.fixture
def slurm_two(namespaces_ok, workdir):
    """A two-node Slurm (:class:`infra.SlurmCluster`): head 10.77.6.1 (slurmctld, the login node), n1 and
    n2 (.11, .12; a slurmd each, 2 CPUs each); partitions ``debug`` (n1, n2) and ``one`` (n1), neither
    oversubscribed. Afterwards every job is cancelled, the daemons stopped by pid, the namespaces
    deleted, and none of them nor any child process of this test is left."""
    need("slurmctld", "slurmd", "munged", "mungekey", "sbatch", "salloc", "srun", "squeue", "scancel",
         "sinfo")
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    before = namespaces()
    cluster = infra.SlurmCluster(workdir / "slurm2", f"wb{secrets.token_hex(2)}", "10.77.6")
    try:
        yield cluster.start()
    finally:
        cluster.stop()
    assert namespaces() - before == set(), "namespaces of the two-node Slurm left"
    left = [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in children]
    assert alive(left) == [], infra.describe(left)


@pytest.fixture
def allocation(slurm_two, workdir):
    """A kernel inside a Slurm allocation on the two-node Slurm, as Open OnDemand and batchspawner give
    one: ``allocation(SCENARIO, SPEC, nodes=1|2, how="salloc"|"batch", timeout=S)`` runs
    ``tests/cluster/driver.py SCENARIO`` (a real IPython shell with the magics) inside an allocation of
    that many whole nodes (for ``minutes``, 30 unless given) and returns what it saw (see
    :func:`infra.run_in_allocation`).
    ``allocation.cluster`` is the :class:`infra.SlurmCluster`. After the test no job is left and nothing
    but the daemons runs on the cluster's hosts."""

    def inside(scenario: str, spec: dict | None = None, *, nodes: int, how: str = "salloc",
               timeout: float = 120, partition: str | None = None, minutes: int = 30) -> dict:
        return infra.run_in_allocation(slurm_two, scenario, spec or {}, nodes=nodes, how=how, timeout=timeout,
                                       workdir=workdir, partition=partition, minutes=minutes)

    inside.cluster = slurm_two
    yield inside
    gone = until(lambda: slurm_two.squeue() == [], 30)
    assert gone, f"jobs left after the test: {slurm_two.squeue()}"
    assert until(lambda: slurm_two.left() == [], 15), f"left on the cluster's hosts: {slurm_two.left()}"


@pytest.fixture
def lo_host(namespaces_ok):
    """A namespace with loopback only: a machine of its own for local-only launchers (mpiexec)."""
    ns = infra.Netns.create(f"wblo{secrets.token_hex(3)}")
    try:
        yield ns
    finally:
        ns.delete()


@contextlib.contextmanager
def ssh_hosts(workdir, engine_hosts: int, subnet: str):
    """head (``SUBNET.1``, runs the kernel and controller) and ``engine_hosts`` hosts n1, n2...
    (``SUBNET.11``, ``.12``...) on one bridge, each with its interface named wb0 and its own hostname,
    sshd on each but head. Stops every sshd and deletes every namespace, also when the test fails."""
    need("ssh", "sshd", "ssh-keygen", "scp")
    tag = f"wb{secrets.token_hex(2)}"
    hosts = {}
    sshds = []
    try:
        hosts = infra.make_hosts(tag, ["head", *(f"n{i}" for i in range(1, engine_hosts + 1))], subnet)
        for name, (ns, address) in hosts.items():
            if name != "head":
                sshds.append(infra.Sshd(ns, address, workdir, hostname=name).start())
        for sshd in sshds:
            sshd.wait(hosts["head"][0])
        yield hosts
    finally:
        for sshd in sshds:
            sshd.stop()
        for ns, _ in hosts.values():
            ns.delete()


# Each fixture its own subnet: the bridges are private to their namespaces anyway, but an address in a log
# then says which test it came from.
@pytest.fixture
def three_hosts(namespaces_ok, workdir):
    """head (10.77.0.1), n1 (10.77.0.11) and n2 (10.77.0.12); see :func:`ssh_hosts`."""
    with ssh_hosts(workdir, 2, "10.77.0") as hosts:
        yield hosts


@pytest.fixture
def four_hosts(namespaces_ok, workdir):
    """head (10.77.3.1) and n1-n3 (10.77.3.11-13); see :func:`ssh_hosts`."""
    with ssh_hosts(workdir, 3, "10.77.3") as hosts:
        yield hosts


@pytest.fixture
def five_hosts(namespaces_ok, workdir):
    """head (10.77.4.1) and n1-n4 (10.77.4.11-14); see :func:`ssh_hosts`."""
    with ssh_hosts(workdir, 4, "10.77.4") as hosts:
        yield hosts
