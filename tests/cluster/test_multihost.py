"""Several hosts on one machine: network namespaces joined by a bridge, the kernel and controller on
"head", engines started over ssh (a real sshd on each host) on "n1" and "n2". A process group across
them, DDP training across "hosts" with a checkpoint, elastic scale 2 -> 3 resuming from it, the preflight
table, and a check that nothing listens on an address it was not told to use."""

from __future__ import annotations

import pytest

from tests.cluster import infra
from tests.cluster.test_nodelost import this_tree_python

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_pool_across_hosts_over_ssh(three_hosts, workdir):
    head, head_addr = three_hosts["head"]
    (n1, a1), (n2, a2) = three_hosts["n1"], three_hosts["n2"]
    spec = {"hosts": f"{a1},{a2}", "interface": "wb0", "ssh_args": infra.Sshd.client_args(workdir),
            "ckpt": str(workdir / "ckpt"), "python": this_tree_python(workdir)}
    result = infra.run_driver(head, "ssh", spec, timeout=260, hostname="head", workdir=workdir)
    probe = result["check_probe"]
    print(f"ssh: pool of 2 on n1+n2 ready {result['start_s']:.1f} s after start; all_reduce across "
          "namespaces: "
          f"latency {probe['latency_s'] * 1e6:.0f} us, bus bandwidth {probe['busbw_gbps']:.2f} GB/s "
          f"({probe['bytes'] >> 20} MiB); scale 2 -> 3 in {result['scale_s']:.1f} s")
    print(result["check"])

    # the kernel listens on the address of the interface it was told (wb0), and says it is not authenticated
    assert result["address"] == head_addr
    assert any(w.startswith("UnauthenticatedNetworkWarning") and "neither authenticated" in w
               for w in result["warnings"]), result["warnings"]

    # if the kernel died, its lease would end the remote engines over ssh
    assert sorted(r["id"].split(":")[0] for r in result["state_remote"]) == [a1, a2]
    assert all("ssh" in r["cancel"] and r["cancel"][-2] == "kill" for r in result["state_remote"])

    # one rank per host, contiguous, each talking over its own host's interface; the store on rank 0's host
    assert [(r["rank"], r["host"], r["node_rank"], r["local_rank"]) for r in result["ranks"]] == [
        (0, "n1", 0, 0), (1, "n2", 1, 0)]
    assert [(w["host"], w["sum"], w["ifname"], w["master"]) for w in result["where"]] == [
        ("n1", 3.0, "wb0", a1), ("n2", 3.0, "wb0", a1)]

    # DDP across hosts: the ranks agree on the parameters and the loss falls
    assert result["ddp_same"] == [True, True]
    first = result["ddp_first"][0]
    assert first[-1] < first[0] * 0.5

    # nothing listens on an address it was not told to use: never a wildcard, and on the network only the
    # host's own address on wb0 (the store and gloo of the ranks, the controller, beacons and metrics on
    # head). Loopback sockets are ipyparallel's engine internals (nanny, heartbeat monitor): unreachable
    # from other hosts.
    own = {"n1": a1, "n2": a2}
    for host, sockets in result["listen_engines"].items():
        reachable = {ip for ip, _, _ in sockets if not ip.startswith("127.")}
        assert reachable == {own[host]}, (host, sockets)
        assert len([s for s in sockets if s[0] == own[host] and s[1] != 22]) >= 1, (host, sockets)
    head_reachable = {ip for ip, _, _ in result["listen_head"] if not ip.startswith("127.")}
    assert head_reachable == {head_addr}, result["listen_head"]

    # the preflight table: 2 nodes, device ok, all_reduce right, bandwidth measured between the nodes
    assert result["check_ok"], result["check"]
    assert "between nodes (ranks 0, 1, one per node)" in result["check"]
    assert probe["busbw_gbps"] > 0 and probe["nodes"] == 2

    # scale 2 -> 3: the ranks that stay keep their rank, host and device (their Python state lives there); the
    # new engine comes after them, as rank 2 on n1; training resumes at step 20
    assert [(r["rank"], r["host"], r["local_rank"]) for r in result["ranks_after_scale"]] == [
        (0, "n1", 0), (1, "n2", 0), (2, "n1", 1)]
    assert result["resumed_step"] == [20, 20, 20]
    assert result["ddp_same_after"] == [True, True, True]
    assert result["ddp_second"][0][0] < first[0] * 0.5, "resumed from the checkpoint, not from scratch"
    # split 1 + 2 across the hosts: each sub-mesh's all_reduce sums its own ranks (rank+1 of the sub-mesh), at
    # the store of its first rank's host; joined, one group of all again
    assert [(w["rank"], w["host"], w["sum"], w["master"]) for w in result["where_split"]] == [
        (0, "n1", 1.0, a1), (0, "n2", 3.0, a2), (1, "n1", 3.0, a2)]
    assert [(w["rank"], w["sum"], w["master"]) for w in result["where_joined"]] == [
        (0, 6.0, a1), (1, 6.0, a1), (2, 6.0, a1)]
    assert not result["running_after_stop"]

    # stop left nothing on the hosts but their sshd
    sshd_pids = {p for ns in (n1, n2) for p in ns.pids() if "sshd" in " ".join(infra.describe([p]))}
    assert n1.wait_empty(keep=sshd_pids) == [] and n2.wait_empty(keep=sshd_pids) == []
    assert head.wait_empty() == []
