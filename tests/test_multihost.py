"""An ordinary script under `torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d`:
two torchrun agents stand for two hosts (each in its own network namespace where root
allows; CLUSTERLAB_TEST_HOST_ID: no shared files between them), the second with a skewed
clock (CLUSTERLAB_TEST_CLOCK_SKEW_S). The job must give
Gloo's results, recover the skew, emulate the cross-host delay faithfully and leave nothing
behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from clusterlab.doctor import MEDIAN_DELAY_TOLERANCE

pytestmark = pytest.mark.timeout(150)

SCRIPT = '''
import json, os, sys
import torch
import torch.distributed as dist
import clusterlab  # registers the "netem" backend
from clusterlab import clock, clocksync, nettest
from clusterlab.doctor import one_way_delays

dist.init_process_group("netem")
rank = dist.get_rank()
x = torch.full((1000,), float(rank + 1))
dist.all_reduce(x)
delays = one_way_delays(40, 6e-3)
# And the network test, on the same two hosts (as `clusterlab nettest` runs it); clock
# re-estimates run meanwhile (CLUSTERLAB_CLOCK_RESYNC_S).
net = nettest.measure(nettest.Options(
    ping_iters=20, bw_bytes=1 << 18, bw_reps=2, sizes=(1 << 16,), coll_iters=2, warmup=1))
pg = dist.group.WORLD
corr = clock.correction()
out = {"sum": float(x[0]), "delays": delays, "hosts": pg.placement.host_count,
       "entry_table": pg._entries is not None, "files": pg._files,
       "error_ns": None if corr is None else corr.at(clock.raw_ns()) + clock.test_skew_ns(),
       "clock": clocksync.status(), "nettest": net}
dist.destroy_process_group()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
'''

DELAY_NS = 5e6
SKEW_S = 0.25


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _netns_available() -> bool:
    return (sys.platform.startswith("linux") and hasattr(os, "geteuid") and os.geteuid() == 0
            and shutil.which("ip") is not None)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class _TwoNamespaces:
    """Two network namespaces joined by a veth pair, 10.<x>.<y>.1 and .2; always removed."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.names = (f"clmh-{tag}-a", f"clmh-{tag}-b")
        self.ifaces = (f"clmh{tag}a", f"clmh{tag}b")
        x = os.getpid() % 250 + 1
        self.addrs = (f"10.231.{x}.1", f"10.231.{x}.2")

    def __enter__(self):
        try:
            for ns in self.names:
                _ip("netns", "add", ns)
            _ip("link", "add", self.ifaces[0], "type", "veth", "peer", "name", self.ifaces[1])
            for ns, dev, addr in zip(self.names, self.ifaces, self.addrs):
                _ip("link", "set", dev, "netns", ns)
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for ns in self.names:  # deleting a namespace deletes its end of the veth pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", self.ifaces[0]], capture_output=True, timeout=10)


def _run_agents(tmp_path, out, agents_spec) -> None:
    """Start one torchrun agent per (name, argv prefix, env) and wait for both (or kill)."""
    agents = {}
    try:
        for name, cmd, env in agents_spec:
            log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed with the agent
            agents[name] = (subprocess.Popen(cmd, env=env, stdout=log,
                                             stderr=subprocess.STDOUT,
                                             start_new_session=True), log)
        deadline = time.monotonic() + 120
        for name, (proc, _) in agents.items():
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            assert code == 0, f"agent {name} exited {code}:\n" + (
                tmp_path / f"{name}.log").read_text()[-3000:]
    finally:
        for proc, log in agents.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            log.close()


def test_two_hosts_under_torchrun(tmp_path, no_leftovers):
    """In two network namespaces joined by a veth pair where root allows (else on
    loopback): two torchrun agents, host B's clock skewed."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    port = _free_port()
    base = {**os.environ, "CLUSTERLAB_NIC": "delay 5ms rate 1gbit",
            "CLUSTERLAB_PROCS_PER_NODE": "2", "CLUSTERLAB_CLOCK_RESYNC_S": "1",
            "OMP_NUM_THREADS": "1"}
    extra = {"A": {}, "B": {"CLUSTERLAB_TEST_CLOCK_SKEW_S": str(SKEW_S)}}
    before = set(os.listdir(tempfile.gettempdir()))
    with contextlib.ExitStack() as stack:
        if _netns_available():
            nets = stack.enter_context(_TwoNamespaces())
            endpoint = nets.addrs[0]
            wrap = {h: ["ip", "netns", "exec", ns] for h, ns in zip("AB", nets.names)}
            ifname = dict(zip("AB", nets.ifaces))
            local = dict(zip("AB", nets.addrs))
        else:
            endpoint = "127.0.0.1"
            wrap = {"A": [], "B": []}
            ifname = {"A": "lo", "B": "lo"}
            local = {"A": endpoint, "B": endpoint}
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                    "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                    f"{endpoint}:{port}", "--rdzv-id", f"mh{port}", "--monitor-interval", "0.2",
                    "--log-dir", str(tmp_path / "agent-logs")]
        # Host A runs the rendezvous store: say so (c10d's own guess, by the hostname's
        # addresses, cannot see a namespace's).
        spec = [(h, [*wrap[h], *torchrun, "--local-addr", local[h], "--rdzv-conf",
                     f"is_host={int(h == 'A')}", str(script), str(out)],
                 {**base, "CLUSTERLAB_TEST_HOST_ID": f"host{h}", "GLOO_SOCKET_IFNAME": ifname[h],
                  **extra[h]}) for h in "AB"]
        _run_agents(tmp_path, out, spec)
    if _netns_available():
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "clmh-" not in names, names
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    assert [r["sum"] for r in ranks] == [10.0] * 4  # Gloo's own result, 1 + 2 + 3 + 4
    assert all(r["hosts"] == 2 and not r["entry_table"] for r in ranks)
    assert ranks[0]["files"] != ranks[2]["files"]  # per host: named by its own first pid
    # Which agent hosts rank 0 is the rendezvous' choice: the other host's ranks estimate.
    clients = [r for r in range(4) if ranks[r]["error_ns"] is not None]
    assert clients in ([0, 1], [2, 3]), clients
    for r in clients:
        st = ranks[r]["clock"]
        # Within the bound the estimate claims (the skew has no drift, so a fitted rate only
        # adds error as the correction ages; 2 us: reading the clocks apart), and small
        # beside the 5 ms the test emulates across the hosts.
        bound = st["uncertainty_ns"] + abs(st["rate_ppm"]) * 1e-6 * st["age_ns"] + 2_000
        assert abs(ranks[r]["error_ns"]) <= bound, (r, ranks[r]["error_ns"], bound, st)
        assert abs(ranks[r]["error_ns"]) <= 0.05 * DELAY_NS, (r, ranks[r]["error_ns"], st)
        assert st["estimates"] >= 2 and st["last_error"] is None, st
    # Ranks 0 -> 1 and 2 -> 3 share a node (no delay); 1 -> 2 and 3 -> 0 cross hosts: their
    # receivers' delays pooled. Waiting for a core only adds time (4 ranks and 2 agents on 2
    # cores: a quiet CI run measured a median 5.5 % long, half its samples 1-9 ms late, the
    # rest within 0.5 %), so the delay itself is judged by the lower quartile, and no
    # message may arrive early.
    d = np.concatenate([ranks[r]["delays"] for r in (0, 2)])
    q25 = float(np.percentile(d, 25))
    assert abs(q25 / DELAY_NS - 1) <= MEDIAN_DELAY_TOLERANCE, (q25, np.sort(d))
    assert d.min() >= (1 - MEDIAN_DELAY_TOLERANCE) * DELAY_NS, np.sort(d)
    net = ranks[0]["nettest"]
    assert sorted(set(net["hosts"])) == ["hostA", "hostB"] and net["procs_per_node"] == 2
    inter = [ln for ln in net["links"] if not ln["intra_node"]]
    assert len(inter) == 8
    # Across the hosts, on the common clock: the configured 5 ms each way. Judged over the
    # 8 directions (20 samples each): their median within the tolerance, none more than 10 %
    # early, and at most one more than 10 % late. Waiting for a core only adds time, and 4
    # ranks on 2 cores can make one direction's 20 samples late (a fresh clone measured one
    # at +14.6 % beside seven within 1 %); a link delayed wrongly shows in every direction.
    p50 = np.array([ln["one_way"]["p50_us"] * 1e3 for ln in inter])
    assert abs(np.median(p50) / DELAY_NS - 1) <= MEDIAN_DELAY_TOLERANCE, p50
    assert np.all(p50 / DELAY_NS - 1 >= -0.1), p50
    assert np.sum(p50 / DELAY_NS - 1 > 0.1) <= 1, p50
    left = {n for n in set(os.listdir(tempfile.gettempdir())) - before
            if any(n.startswith(f) for f in (ranks[0]["files"], ranks[2]["files"]))}
    assert not left, left
