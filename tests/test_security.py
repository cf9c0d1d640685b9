"""Nothing a cluster opens is reachable from another machine or readable by another user.

Every listening TCP socket of every process of a running cluster (the rendezvous store in
rank 0, Gloo's listeners, the launcher and its janitor) is on loopback, as `ss -ltnp` would
list them; the files the engine creates (scratch dir, stack dumps, shared NIC queue tails)
are 0700/0600 and gone after close().
"""

from __future__ import annotations

import os
import stat

import psutil
import pytest
import torch
import torch.distributed as dist

from clusterlab import Cluster

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leftovers")]

LOOPBACK = ("127.0.0.1", "::1")


def listening(pids) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket of these processes."""
    out = []
    for pid in pids:
        for c in psutil.Process(pid).net_connections(kind="inet"):
            if c.status == psutil.CONN_LISTEN:
                out.append((pid, c.laddr.ip, c.laddr.port))
    return out


def traffic_and_files():
    """Runs on every rank: traffic through the shared NIC queue, then what is in the
    scratch dir (the backend's CLUSTERLAB_SHM_DIR) with its modes, and my listeners."""
    peer = dist.get_rank() ^ 2  # a process of the other node (2 nodes x 2 processes)
    t = torch.ones(256)
    if dist.get_rank() < 2:
        dist.send(t, peer)
    else:
        dist.recv(t, peer)
    dist.all_reduce(t)
    scratch = os.environ.get("CLUSTERLAB_SHM_DIR") or dist.group.WORLD.config.shm_dir
    files = {n: stat.S_IMODE(os.stat(os.path.join(scratch, n)).st_mode)
             for n in os.listdir(scratch)}
    return scratch, files, listening([os.getpid()])


def test_every_listener_is_on_loopback_and_every_file_private():
    with Cluster(nodes=2, procs_per_node=2, nic="delay 1ms rate 1gbit", timeout=60) as cl:
        pids = [p.pid for p in cl._procs] + [cl._janitor[0], os.getpid()]
        out = cl.run(traffic_and_files)  # during a run: what each rank itself sees
        socks = listening(pids)          # and from outside, between runs
        scratch = cl._tmp
        assert stat.S_IMODE(os.stat(scratch).st_mode) == 0o700
    ranks = {p for p, *_ in socks}
    # Rank 0 has the store and Gloo's listener, every rank Gloo's; nothing else listens.
    assert len([s for s in socks if s[0] == pids[0]]) >= 2 and len(ranks) >= 4
    assert all(ip in LOOPBACK for _, ip, _ in socks), socks
    for _, files, own in out:
        assert all(ip in LOOPBACK for _, ip, _ in own), own
        assert any(n.startswith("stack-") for n in files)
        assert any("-nic" in n for n in files), files  # the shared NIC queue tail
        assert all(mode == 0o600 for mode in files.values()), files
    assert {o[0] for o in out} == {scratch}
    assert not os.path.exists(scratch)  # removed by close()


def test_plain_gloo_listens_on_loopback_too():
    with Cluster(nodes=2, nic=None, timeout=60) as cl:
        socks = listening([p.pid for p in cl._procs])
        assert cl.run(lambda: dist.get_backend()) == ["gloo", "gloo"]
    assert socks and all(ip in LOOPBACK for _, ip, _ in socks), socks
