"""The launcher: results by rank, named errors, and no process left behind, ever."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist

from clusterlab import Cluster, ClusterTimeout, RankDied, RankError

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leftovers")]






def whoami(tag):
    return (dist.get_rank(), dist.get_world_size(), tag, dist.get_backend())


def test_results_come_back_in_rank_order():
    with Cluster(nodes=3, procs_per_node=2, nic="delay 1ms") as cl:
        out = cl.run(whoami, "x")
        assert out == [(r, 6, "x", "netem") for r in range(6)]
        assert cl.run(whoami, tag="y")[5] == (5, 6, "y", "netem")


def test_plain_gloo_when_nothing_is_impaired():
    with Cluster(nodes=2, nic=None) as cl:
        assert [b for *_, b in cl.run(whoami, 0)] == ["gloo", "gloo"]


def test_functions_defined_anywhere_work():
    scale = 3

    def local(x):  # a closure, as a notebook cell would define it
        t = torch.tensor([float(x * scale)])
        dist.all_reduce(t)
        return float(t)

    with Cluster(nodes=2, nic="delay 1ms") as cl:
        assert cl.run(local, 2) == [12.0, 12.0]
        assert cl.run(lambda: dist.get_rank() * 10) == [0, 10]


def fail_on(rank):
    if dist.get_rank() == rank:
        raise ValueError("bad shard 42")
    t = torch.ones(1)
    dist.all_reduce(t)  # the others block here; the launcher must not wait for them
    return float(t)


def test_exception_names_the_rank_and_keeps_its_traceback():
    with Cluster(nodes=3, nic="delay 1ms", timeout=60) as cl:
        t0 = time.monotonic()
        with pytest.raises(RankError) as info:
            cl.run(fail_on, 2)
        assert time.monotonic() - t0 < 10
        err = info.value
        assert err.rank == 2 and err.kind == "ValueError"
        assert "bad shard 42" in str(err) and "fail_on" in err.remote_traceback
        # The cluster comes back for the next run.
        assert cl.run(whoami, 1)[2][0] == 2


def die_on(rank):
    if dist.get_rank() == rank:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)


def test_a_killed_rank_is_named():
    with Cluster(nodes=3, nic="delay 1ms", timeout=60) as cl:
        t0 = time.monotonic()
        with pytest.raises(RankDied, match=r"rank 1 died \(signal SIGKILL\)"):
            cl.run(die_on, 1)
        assert time.monotonic() - t0 < 10


def hang_on(rank):
    if dist.get_rank() == rank:
        time.sleep(600)
    t = torch.ones(1)
    dist.all_reduce(t)


def test_a_hang_times_out_naming_ranks_and_operations():
    with Cluster(nodes=3, nic="delay 1ms", timeout=4) as cl:
        t0 = time.monotonic()
        with pytest.raises(ClusterTimeout) as info:
            cl.run(hang_on, 1)
        assert time.monotonic() - t0 < 15
    msg = str(info.value)
    assert "ranks still busy: [0, 1, 2]" in msg
    assert "rank 0: in allreduce" in msg  # what the waiting ranks were stuck in
    assert "in hang_on" in msg and "time.sleep(600)" in msg  # and where the hanging one was


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler for the test: a shell starts background jobs with SIGINT
    ignored and Python then keeps it ignored (`./test.sh &` made the interrupt test time
    out), while a Jupyter kernel always has a handler that raises KeyboardInterrupt."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_interrupt_stops_every_rank_quickly(python_sigint):
    with Cluster(nodes=4, nic="delay 1ms", timeout=60) as cl:
        pids = [p.pid for p in cl._procs]
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            cl.run(time.sleep, 60)
        stopped = time.monotonic() - t0
        assert stopped < 1.0 + 2.0
        assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status()
                       != psutil.STATUS_ZOMBIE for pid in pids)


def test_ranks_die_with_their_parent(tmp_path):
    # A "kernel" that starts a cluster and is then killed outright (as a kernel restart does).
    script = tmp_path / "kernel.py"
    script.write_text(textwrap.dedent("""
        import sys, clusterlab
        cl = clusterlab.Cluster(nodes=3, nic="delay 1ms")
        cl.start()
        print(cl._tmp, " ".join(str(p.pid) for p in cl._procs), flush=True)
        import time; time.sleep(60)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        scratch, *pids = proc.stdout.readline().split()
        pids = [int(x) for x in pids]
        assert len(pids) == 3 and os.path.isdir(scratch)
    finally:
        proc.kill()
        proc.wait(10)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (_alive(pids) or os.path.exists(scratch)):
        time.sleep(0.05)
    assert not _alive(pids)
    # No finalizer ran in the killed parent: its janitor removed the scratch directory.
    assert not os.path.exists(scratch)


@pytest.mark.parametrize("kwargs,match", [
    ({"nodes": 0}, "nodes must be an integer >= 1"),
    ({"procs_per_node": 0}, "procs_per_node must be an integer >= 1"),
    ({"nodes": 2.5}, "nodes must be an integer"),
    ({"nic": "delay -1ms"}, "-1ms"),
    ({"nic": "delay 1ms 1ms distribution zipf"}, "zipf"),
    ({"nic": "rate 0"}, "rate"),
    ({"nic": "delya 1ms"}, "delya"),
    ({"intra": "loss 120%"}, "120%"),
    ({"timeout": 0}, "timeout"),
    ({"dilation": -1}, "dilation"),
    ({"seed": -3}, "seed"),
    ({"nodes": 40, "procs_per_node": 2}, "80 processes"),
    ({"algorithm": "butterfly"}, "butterfly"),
    ({"links": {(0, 7): "delay 1ms"}}, "node 7"),
    ({"environ": {"TORCH_DISTRIBUTED_DEBUG": 1}}, "environ"),
])
def test_bad_arguments_are_named_and_start_nothing(kwargs, match):
    before = dict(os.environ)
    with pytest.raises(ValueError, match=match):
        Cluster(**{"nodes": 2, **kwargs})
    assert dict(os.environ) == before


def test_options_after_nodes_are_keyword_only():
    with pytest.raises(TypeError, match="positional"):
        Cluster(2, 1)  # procs_per_node? nic? a reader cannot tell: it must be named


def backend_settings():
    config = dist.group.WORLD.config
    return config.algorithm, config.seed, config.dilation, config.topology.procs_per_node


def test_settings_reach_the_ranks_and_leave_this_process_environment_alone(monkeypatch):
    # A stale setting in this process's environment neither breaks nor configures a Cluster.
    monkeypatch.setenv("CLUSTERLAB_ALGORITHM", "butterfly")
    before = dict(os.environ)
    with Cluster(nodes=2, procs_per_node=2, nic="delay 1ms", algorithm="tree", seed=7,
                 dilation=2) as cl:
        assert dict(os.environ) == before
        out = cl.run(backend_settings)
        assert dict(os.environ) == before
    assert dict(os.environ) == before
    assert out == [("tree", 7, 2.0, 2)] * 4


def test_unpicklable_results_are_reported():
    with Cluster(nodes=2, nic=None) as cl, pytest.raises(RankError, match="pickle|lock"):
        cl.run(threading.Lock)


TORCHRUN_SCRIPT = """
import time, torch, torch.distributed as dist
import clusterlab  # registers the "netem" backend
dist.init_process_group("netem")
t = torch.zeros(1)
dist.barrier()
t0 = time.monotonic()
for _ in range(5):
    if dist.get_rank() == 0:
        dist.send(t, 1); dist.recv(t, 1)
    else:
        dist.recv(t, 0); dist.send(t, 0)
rtt = (time.monotonic() - t0) / 5
if dist.get_rank() == 0:
    print(f"RTT {rtt:.6f} {dist.get_backend()}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.timeout(180)
def test_an_ordinary_script_under_torchrun(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    env = {**os.environ, "CLUSTERLAB_NIC": "delay 5ms", "OMP_NUM_THREADS": "1"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(port),
         "--log-dir", str(tmp_path / "agent-logs"), str(script)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=150)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun's workers too, whatever happened
    assert proc.returncode == 0, stderr[-2000:]
    line = next(x for x in stdout.splitlines() if x.startswith("RTT"))
    rtt, backend = float(line.split()[1]), line.split()[2]
    assert backend == "netem"
    assert rtt >= 2 * 5e-3  # each rank is its own node unless CLUSTERLAB_PROCS_PER_NODE says


def _alive(pids):
    return [p for p in pids if psutil.pid_exists(p)
            and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.timeout(180)
def test_in_a_real_jupyter_kernel_interrupt_and_restart_leave_nothing(tmp_path):
    """A function defined in a notebook cell runs; an interrupt stops the ranks within 2 s; a
    kernel restart leaves no rank behind."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    pid_file = tmp_path / "pids"
    try:
        def run(code):
            reply = kc.execute_interactive(code, timeout=60, output_hook=lambda msg: None)
            assert reply["content"]["status"] == "ok", reply["content"]

        run(textwrap.dedent(f"""
            import time, torch, torch.distributed as dist, clusterlab
            def cell_fn(x):
                t = torch.tensor([float(x)])
                dist.all_reduce(t)
                return float(t)
            cl = clusterlab.Cluster(nodes=3, nic="delay 1ms")
            cl.start()
            assert cl.run(cell_fn, 2) == [6.0, 6.0, 6.0]
            open({str(pid_file)!r}, "w").write(" ".join(str(p.pid) for p in cl._procs))
        """))
        pids = [int(x) for x in pid_file.read_text().split()]
        # stop_on_error=False: the interrupt's error must not make the kernel abort the
        # requests that follow it (ipykernel aborts the queue after an error; a busy machine
        # once let the next run() land in that window: status "aborted").
        kc.execute("cl.run(time.sleep, 60)", stop_on_error=False)
        time.sleep(2.0)
        km.interrupt_kernel()
        t0 = time.monotonic()
        reply = kc.get_shell_msg(timeout=10)
        while reply["msg_type"] != "execute_reply":
            reply = kc.get_shell_msg(timeout=10)
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        while _alive(pids) and time.monotonic() - t0 < 2.0:
            time.sleep(0.05)
        assert not _alive(pids), "ranks still running 2 s after the interrupt"

        # The next run() starts fresh ranks; then a restart must take them down too.
        run(f"assert cl.run(cell_fn, 1) == [3.0] * 3\n"
            f"open({str(pid_file)!r}, 'w').write(cl._tmp + ' ' + "
            f"' '.join(str(p.pid) for p in cl._procs))")
        scratch, *pids = pid_file.read_text().split()
        pids = [int(x) for x in pids]
        km.restart_kernel(now=True)
        deadline = time.monotonic() + 5
        while (_alive(pids) or os.path.exists(scratch)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pids), "ranks outlived the kernel"
        assert not os.path.exists(scratch), "the restarted kernel's scratch dir is still there"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_cluster_start_sweeps_scratch_dirs_of_dead_parents():
    import tempfile

    from clusterlab.cluster import _sweep_orphaned_dirs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tempfile.mkdtemp(prefix=f"clusterlab-{dead.pid}-")
    alive = tempfile.mkdtemp(prefix=f"clusterlab-{os.getpid()}-")
    try:
        _sweep_orphaned_dirs()
        assert not os.path.exists(orphan) and os.path.isdir(alive)
    finally:
        shutil.rmtree(alive, ignore_errors=True)
        shutil.rmtree(orphan, ignore_errors=True)


def _scratch_entries():
    import tempfile

    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("clusterlab-")}


def _owns_a_cluster_and_is_killed(conn):
    cl = Cluster(nodes=2, nic="delay 1ms", timeout=20)
    cl.start()
    conn.send(cl._tmp)
    cl.run(time.sleep, 60)


def test_no_scratch_entries_survive_ok_failing_and_killed_parents():
    """Clusters that succeed, fail (an exception, a SIGKILLed rank) or whose parent is
    SIGKILLed leave no clusterlab-* entry behind once the next cluster has started."""
    import multiprocessing as mp

    before = _scratch_entries()
    with Cluster(nodes=2, nic="delay 1ms", timeout=20) as cl:
        assert cl.run(whoami, 0)[1][0] == 1
        with pytest.raises(RankError):
            cl.run(fail_on, 1)
        with pytest.raises(RankDied):
            cl.run(die_on, 0)
    ctx = mp.get_context("fork")
    ours, theirs = ctx.Pipe()
    parent = ctx.Process(target=_owns_a_cluster_and_is_killed, args=(theirs,))
    parent.start()
    try:
        assert ours.poll(30)
        scratch = ours.recv()
        assert os.path.isdir(scratch)
    finally:
        parent.kill()
        parent.join(10)
    deadline = time.monotonic() + 5
    while os.path.exists(scratch) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(scratch)  # the janitor, at once
    with Cluster(nodes=2, nic=None) as cl:  # and the next start sweeps whatever is left
        cl.run(whoami, 0)
    # Only ours count: other processes on this machine may run clusters meanwhile.
    ours_left = [n for n in _scratch_entries() - before
                 if n.startswith((f"clusterlab-{os.getpid()}-", f"clusterlab-{parent.pid}-"))]
    assert not ours_left


def _watch_the_peer_wait():
    import time

    from clusterlab.cluster import peer_status

    t = torch.zeros(1)
    if dist.get_rank() == 0:
        dist.recv(t, src=1)  # waits until rank 1 has seen it waiting
        return None
    deadline = time.monotonic() + 10
    while "recv from 1" not in peer_status(0) and time.monotonic() < deadline:
        time.sleep(0.002)
    seen = peer_status(0)
    dist.send(t, dst=0)
    return seen


def test_a_rank_sees_what_its_peer_waits_in():
    with Cluster(nodes=2, nic="delay 1ms", timeout=20) as cl:
        assert cl.run(_watch_the_peer_wait)[1].startswith("recv from 1")
    with pytest.raises(RuntimeError, match="only inside a rank"):
        from clusterlab.cluster import peer_status

        peer_status(0)
