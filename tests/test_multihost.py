"""An ordinary script under `torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d`:
two torchrun agents stand for two hosts (CLUSTERLAB_TEST_HOST_ID: no shared files between
them), the second with a skewed clock (CLUSTERLAB_TEST_CLOCK_SKEW_S). The job must give
Gloo's results, recover the skew, emulate the cross-host delay faithfully and leave nothing
behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from clusterlab.doctor import median_delay_error, median_delay_met

pytestmark = pytest.mark.timeout(150)

SCRIPT = '''
import json, os, sys, time
import torch
import torch.distributed as dist
import clusterlab  # registers the "netem" backend
from clusterlab import clock, clocksync
from clusterlab.doctor import one_way_delays

dist.init_process_group("netem")
rank = dist.get_rank()
x = torch.full((1000,), float(rank + 1))
dist.all_reduce(x)
delays = one_way_delays(40, 6e-3)
time.sleep(0.5)  # re-estimates run meanwhile (CLUSTERLAB_CLOCK_RESYNC_S)
pg = dist.group.WORLD
corr = clock.correction()
status = clocksync.status()
out = {"sum": float(x[0]), "delays": delays, "hosts": pg.placement.host_count,
       "entry_table": pg._entries is not None, "files": pg._files,
       "error_ns": None if corr is None else corr.at(clock.raw_ns()) + clock.test_skew_ns(),
       "clock": status}
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


def test_two_hosts_under_torchrun(tmp_path, no_leftovers):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    port = _free_port()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                f"127.0.0.1:{port}", "--rdzv-id", f"mh{port}", "--monitor-interval", "0.2",
                str(script), str(out)]
    base = {**os.environ, "CLUSTERLAB_NIC": "delay 5ms rate 1gbit",
            "CLUSTERLAB_PROCS_PER_NODE": "2", "GLOO_SOCKET_IFNAME": "lo",
            "CLUSTERLAB_CLOCK_RESYNC_S": "0.3", "OMP_NUM_THREADS": "1"}
    hosts = {"A": {}, "B": {"CLUSTERLAB_TEST_CLOCK_SKEW_S": str(SKEW_S)}}
    before = set(os.listdir(tempfile.gettempdir()))
    agents = {}
    try:
        for name, extra in hosts.items():
            log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed with the agent
            env = {**base, "CLUSTERLAB_TEST_HOST_ID": f"host{name}", **extra}
            agents[name] = (subprocess.Popen(torchrun, env=env, stdout=log,
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
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    assert [r["sum"] for r in ranks] == [10.0] * 4  # Gloo's own result, 1 + 2 + 3 + 4
    assert all(r["hosts"] == 2 and not r["entry_table"] for r in ranks)
    assert ranks[0]["files"] != ranks[2]["files"]  # per host: named by its own first pid
    # Which agent hosts rank 0 is the rendezvous' choice: the other host's ranks estimate.
    clients = [r for r in range(4) if ranks[r]["error_ns"] is not None]
    assert clients in ([0, 1], [2, 3]), clients
    for r in clients:
        st = ranks[r]["clock"]
        assert abs(ranks[r]["error_ns"]) <= 50_000, (r, ranks[r]["error_ns"], st)
        assert abs(abs(st["offset_ns"]) - SKEW_S * 1e9) <= 50_000, st
        assert st["estimates"] >= 2 and st["last_error"] is None, st
    # Ranks 0 -> 1 and 2 -> 3 share a node (no delay); 1 -> 2 and 3 -> 0 cross hosts.
    for r in (0, 2):
        d = np.asarray(ranks[r]["delays"])
        assert median_delay_met(d, DELAY_NS), (r, median_delay_error(d, DELAY_NS))
    left = {n for n in set(os.listdir(tempfile.gettempdir())) - before
            if any(n.startswith(f) for f in (ranks[0]["files"], ranks[2]["files"]))}
    assert not left, left
