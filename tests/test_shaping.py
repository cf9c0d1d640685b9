"""Kernel shaping: namespaces, veths and qdiscs are made, shape for real, and always go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from clusterlab import Cluster, shaping
from clusterlab.cli import main as cli_main
from clusterlab.netem import Netem
from clusterlab.wire import wire_beta

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_leftovers")]


def _can_shape() -> bool:
    try:
        shaping.check_available()
    except RuntimeError:
        return False
    return True


needs_root = pytest.mark.skipif(not _can_shape(), reason="skipped: needs root/netns")


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def _ours(tag: str) -> set[str]:
    return {ns for ns in _namespaces() if ns.startswith(f"{tag}-")}


# --- refused before anything exists ---------------------------------------------------------

def test_bad_mode_and_no_root_are_clear_errors(monkeypatch):
    with pytest.raises(ValueError, match="shaping must be one of userspace, kernel, got 'tc'"):
        Cluster(nodes=2, nic="rate 1gbit", shaping="tc")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(RuntimeError, match="shaping='kernel' needs root"):
        Cluster(nodes=2, nic="rate 1gbit", shaping="kernel")


def test_link_overrides_become_htb_classes():
    lines = shaping.tc_commands(Netem.parse("rate 200mbit"), {1: Netem.parse("rate 50mbit"),
                                                            2: Netem()}, netem=False, src=0)
    assert lines[0].endswith("root handle 1: htb default 1")
    assert any("classid 1:1 htb rate 200000000bit" in line for line in lines)  # the NIC
    assert any("classid 1:3 htb rate 50000000bit" in line for line in lines)  # 0->1
    assert lines[-2:] == [  # chosen by destination; 0->2 unimpaired: sent directly
        "filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst 10.77.0.2/32 "
        "flowid 1:3",
        "filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst 10.77.0.3/32 "
        "flowid 1:0"]
    assert shaping.tc_commands(Netem.parse("rate 1gbit"), netem=False) == [
        "qdisc add dev eth0 root " + " ".join(shaping.qdisc_args(Netem.parse("rate 1gbit"),
                                                                 netem=False))]


def test_spec_becomes_tc_arguments():
    rate = Netem.parse("rate 200mbit 20")
    tbf = shaping.qdisc_args(rate, netem=False, mtu=1500)
    assert tbf[:3] == ["tbf", "rate", "200000000bit"]
    assert tbf[tbf.index("overhead") + 1] == "20"
    assert int(tbf[tbf.index("burst") + 1]) >= 1514  # a full packet always fits the bucket
    spec = Netem.parse("delay 2ms 500us rate 1gbit")
    assert shaping.qdisc_args(spec, netem=True) == ["netem", *str(spec).split()]
    assert shaping.qdisc_args(Netem(), netem=False) is None
    for text, named in (("delay 2ms rate 1gbit", "delay needs"), ("loss 1%", "loss needs"),
                        ("delay 1ms 1ms", "delay and jitter need"), ("rate 1gbit 0 53", "cell")):
        with pytest.raises(ValueError, match=f"{named}.*sch_netem, which this kernel lacks"):
            shaping.qdisc_args(Netem.parse(text), netem=False)


@needs_root
def test_what_the_kernel_cannot_apply_is_refused_and_leaves_nothing():
    before = _namespaces()
    if not shaping.kernel_has_netem():
        with pytest.raises(ValueError, match="delay needs sch_netem, which this kernel lacks"):
            Cluster(nodes=2, nic="delay 2ms rate 1gbit", shaping="kernel")
    with pytest.raises(ValueError, match="intra=.* not supported with shaping='kernel'"):
        Cluster(nodes=2, procs_per_node=2, nic="rate 1gbit", intra="rate 1mbit",
                shaping="kernel")
    with pytest.raises(ValueError, match=r"links\[0->1\]='loss 1%': loss needs sch_netem"):
        Cluster(nodes=2, nic="rate 1gbit", links={(0, 1): "loss 1%"}, shaping="kernel")
    assert _namespaces() == before


@needs_root
def test_an_interrupt_while_building_leaves_nothing(monkeypatch):
    real = shaping._ip

    def interrupted(*args, **kwargs):
        if args[0] == "tc":  # the last step: namespaces, veths, bridge exist by now
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(shaping, "_ip", interrupted)
    with pytest.raises(KeyboardInterrupt):
        shaping.up(2, "rate 1gbit")
    assert not {ns for ns in _namespaces() if ns.startswith(f"cl{os.getpid()}-")}
    assert not [r for r in shaping.networks() if r["owner"] == os.getpid()]


# --- a shaped cluster ------------------------------------------------------------------------

def where_am_i():
    """This rank's network namespace, backend, store address, and the addresses its
    namespace listens on (IPv4 LISTEN sockets, from /proc/net/tcp; IPv6 is off)."""
    listening = set()
    with open("/proc/self/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, _, state = line.split()[1:4]
            if state == "0A":
                listening.add(".".join(str(b) for b in reversed(bytes.fromhex(local[:8]))))
    return (os.stat("/proc/self/ns/net").st_ino, dist.get_backend(), os.environ["MASTER_ADDR"],
            sorted(listening))


def goodput(nbytes: int, repeats: int, src: int = 0, dst: int = 1) -> list[float]:
    """`src` sends `nbytes` to `dst`, which answers with 4 bytes: seconds per transfer (on
    `src`), then an all-reduce of ones (on every rank)."""
    data, ack, out = torch.zeros(nbytes // 4), torch.zeros(1), []
    for _ in range(repeats):
        dist.barrier()
        if dist.get_rank() == src:
            t0 = time.perf_counter()
            dist.send(data, dst)
            dist.recv(ack, dst)
            out.append(time.perf_counter() - t0)
        elif dist.get_rank() == dst:
            dist.recv(data, src)
            dist.send(ack, src)
    total = torch.ones(3)
    dist.all_reduce(total)
    return out + total.tolist()


@needs_root
def test_kernel_cluster_shapes_with_tbf_and_removes_everything():
    rate = 100e6
    cl = Cluster(nodes=2, nic="rate 100mbit", shaping="kernel", timeout=60)
    with cl:
        net = cl._network
        assert _ours(net.tag) == set(net.namespaces)  # 2 nodes and the switch
        assert "rate 100Mbit" in net.qdisc(0) and "tbf" in net.qdisc(1)
        bridge = subprocess.run(["ip", "-n", net.switch, "-br", "link", "show", "type", "bridge"],
                                capture_output=True, text=True, timeout=10).stdout
        assert bridge.startswith("br0")
        places = cl.run(where_am_i)
        mine = os.stat("/proc/self/ns/net").st_ino
        assert len({p[0] for p in places} | {mine}) == 3  # each rank in its own node's netns
        assert {p[1:3] for p in places} == {("gloo", net.master_addr)}  # nothing emulated on top
        assert [p[3] for p in places] == [[net.address(0)], [net.address(1)]]  # store, Gloo
        nbytes = 2_500_000  # 0.2 s at 100 Mbit/s
        out = cl.run(goodput, nbytes, 3)
        assert out[1][-3:] == [2.0, 2.0, 2.0]
        seconds = sorted(out[0][:3])[1]
        expected = 1 / wire_beta(rate, segment_bytes=net.segment_bytes)  # payload bytes/s
        measured = nbytes / seconds
        assert abs(measured / expected - 1) < 0.10, (measured, expected)
    assert not _ours(net.tag)
    assert net.tag not in {r["tag"] for r in shaping.networks()}


@needs_root
def test_an_overridden_direction_gets_its_own_rate():
    nic, link = 200e6, 50e6
    with Cluster(nodes=2, nic="rate 200mbit", links={(0, 1): "rate 50mbit"}, shaping="kernel",
                 timeout=60) as cl:
        payload = 1 / wire_beta(1, segment_bytes=cl._network.segment_bytes)  # payload share
        for src, dst, rate in ((0, 1, link), (1, 0, nic)):
            nbytes = int(rate / 8 * 0.4)  # 0.4 s: the bucket's head start is ~5 % of it
            seconds = sorted(cl.run(goodput, nbytes, 3, src, dst)[src][:3])[1]
            assert abs(nbytes / seconds / (rate * payload) - 1) < 0.10, (src, dst, seconds)


PARENT = textwrap.dedent("""
    import sys, time
    from clusterlab import Cluster
    cl = Cluster(nodes=2, nic="rate 1gbit", shaping="kernel", timeout=60)
    cl.start()
    print(cl._network.tag, *[p.pid for p in cl._procs], flush=True)
    time.sleep(120)
""")


@needs_root
def test_kill_9_of_the_parent_leaves_nothing():
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        tag, *ranks = proc.stdout.readline().split()
        assert len(_ours(tag)) == 3
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 15
        while (_ours(tag) or any(_alive(int(p)) for p in ranks)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _ours(tag), "the janitor did not remove the namespaces"
        assert not any(_alive(int(p)) for p in ranks)
        assert tag not in {r["tag"] for r in shaping.networks()}
    finally:
        proc.kill()
        proc.wait(10)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


LEAVER = textwrap.dedent("""
    import os
    from clusterlab import shaping
    print(shaping.up(2, "rate 1gbit").tag, shaping.up(1, persistent=True).tag, flush=True)
    os._exit(0)  # no cleanup, no janitor: as if killed
""")


@needs_root
def test_the_sweep_removes_what_dead_owners_left_but_not_persistent_networks():
    out = subprocess.run([sys.executable, "-c", LEAVER], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    left, kept = out.stdout.split()
    try:
        assert len(_ours(left)) == 3 and len(_ours(kept)) == 2
        assert left in shaping.sweep()
        assert not _ours(left) and left not in {r["tag"] for r in shaping.networks()}
        assert len(_ours(kept)) == 2  # `clusterlab shape up` networks stay until `down`
    finally:
        shaping.find(kept).remove()
    assert not _ours(kept)


@needs_root
def test_shape_command_up_run_down(capsys):
    assert cli_main(["shape", "up", "--nodes", "2", "--nic", "rate 50mbit"]) == 0
    text = capsys.readouterr().out
    tag = text.split()[1].rstrip(":")
    try:
        assert "rate 50Mbit" in text and "--rdzv-endpoint 10.77.0.1:29500" in text
        run = subprocess.run([sys.executable, "-m", "clusterlab", "shape", "run", tag, "--node",
                              "1", "--", "sh", "-c", "ip -4 -br addr show eth0; exit 3"],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert run.returncode == 3 and "10.77.0.2/24" in run.stdout
    finally:
        assert cli_main(["shape", "down", tag]) == 0
    assert not _ours(tag)
