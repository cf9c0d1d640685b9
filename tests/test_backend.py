"""The "netem" backend: every operation gives exactly what plain Gloo gives, and takes at
least as long as the configured network says it must."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

import clusterlab
from clusterlab import Cluster
from clusterlab.backend import NetemConfig

pytestmark = pytest.mark.timeout(180)


def every_op():
    """Run each torch.distributed operation once with deterministic inputs."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    base = torch.arange(6, dtype=torch.float64) + rank * 10 + 1
    for name, op in [("sum", dist.ReduceOp.SUM), ("min", dist.ReduceOp.MIN),
                     ("max", dist.ReduceOp.MAX), ("product", dist.ReduceOp.PRODUCT)]:
        x = base.clone()
        dist.all_reduce(x, op=op)
        out[f"all_reduce_{name}"] = x
    x = torch.full((3,), float(rank))
    dist.broadcast(x, src=1)
    out["broadcast"] = x
    parts = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(parts, torch.tensor([rank, rank * 2.0]))
    out["all_gather"] = torch.stack(parts)
    flat = torch.zeros(2 * world)
    dist.all_gather_into_tensor(flat, torch.tensor([rank, -rank * 1.0]))
    out["all_gather_into_tensor"] = flat
    y = torch.zeros(2)
    dist.reduce_scatter(y, [torch.full((2,), float(rank + i)) for i in range(world)])
    out["reduce_scatter"] = y
    z = torch.zeros(2)
    dist.reduce_scatter_tensor(z, torch.arange(2.0 * world) * (rank + 1))
    out["reduce_scatter_tensor"] = z
    r = base.clone()
    dist.reduce(r, dst=0)
    out["reduce_on_root"] = r if rank == 0 else torch.zeros(0)
    g = [torch.zeros(1) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.tensor([rank * 3.0]), g, dst=0)
    out["gather"] = torch.cat(g) if rank == 0 else torch.zeros(0)
    s = torch.zeros(1)
    dist.scatter(s, [torch.tensor([i * 7.0]) for i in range(world)] if rank == 0 else None, src=0)
    out["scatter"] = s
    a2a = torch.zeros(world)
    dist.all_to_all_single(a2a, torch.arange(world, dtype=torch.float32) + 100 * rank)
    out["all_to_all_single"] = a2a
    outs = [torch.zeros(1) for _ in range(world)]
    dist.all_to_all(outs, [torch.tensor([rank * 10.0 + i]) for i in range(world)])
    out["all_to_all"] = torch.cat(outs)
    dist.barrier()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    buf = torch.zeros(4)
    w = dist.isend(torch.full((4,), float(rank)), nxt)
    dist.recv(buf, prv)
    w.wait()
    out["ring_send_recv"] = buf
    # Small frames are packed by raw copies: dtypes numpy lacks, views with an offset.
    src = (torch.arange(12, dtype=torch.float32) + rank).reshape(3, 4).t().contiguous()
    src = src.to(torch.bfloat16)
    w = dist.isend(src, nxt)
    bf = torch.zeros(4, 3, dtype=torch.bfloat16)
    dist.recv(bf, prv)
    w.wait()
    out["send_bfloat16"] = bf
    wide = torch.full((10,), -1, dtype=torch.int16)
    w = dist.isend(torch.arange(5, dtype=torch.int16) * (rank + 1), nxt)
    dist.recv(wide[3:8], prv)  # into a view at an offset
    w.wait()
    out["recv_into_view"] = wide
    g = torch.full((3,), float(rank), requires_grad=True)
    w = dist.isend(g.detach(), nxt)
    dist.recv(buf[:3], prv)
    w.wait()
    out["send_detached_grad"] = buf.clone()
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    out["all_gather_object"] = objs
    lst = [rank, "hello"] if rank == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    out["broadcast_object_list"] = lst
    return out


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def test_settings_come_from_the_mapping_given_or_from_the_environment(monkeypatch):
    monkeypatch.setenv("CLUSTERLAB_ALGORITHM", "tree")
    monkeypatch.setenv("CLUSTERLAB_NIC", "delay 3ms")
    mine = NetemConfig.from_env(4, {"CLUSTERLAB_ALGORITHM": "rabenseifner",
                                    "CLUSTERLAB_NIC": "delay 1ms", "CLUSTERLAB_TRACE": "1"})
    assert (mine.algorithm, mine.topology.nic.delay_ns, mine.trace) == ("rabenseifner", 10**6,
                                                                         True)
    # Without a mapping (torchrun, a script): the environment, as a user set it.
    theirs = NetemConfig.from_env(4)
    assert (theirs.algorithm, theirs.topology.nic.delay_ns, theirs.trace) == ("tree",
                                                                              3 * 10**6, False)
    with pytest.raises(ValueError, match="butterfly"):
        NetemConfig.from_env(4, {"CLUSTERLAB_ALGORITHM": "butterfly"})
    for name, bad in [("CLUSTERLAB_SEED", "-1"), ("CLUSTERLAB_DILATION", "nan"),
                      ("CLUSTERLAB_DILATION", "1e999"), ("CLUSTERLAB_TRACE", "yes")]:
        with pytest.raises(ValueError, match=name):
            NetemConfig.from_env(4, {name: bad})


@pytest.fixture(scope="module")
def baseline():
    with Cluster(nodes=3, nic=None, timeout=60) as cl:
        return cl.run(every_op)


@pytest.mark.parametrize("nic,ppn", [("delay 1ms 200us", 1), ("delay 500us rate 1gbit", 1),
                                     ("delay 1ms", 3)])
def test_every_op_matches_plain_gloo(baseline, nic, ppn):
    nodes = 3 // ppn
    with Cluster(nodes=nodes, procs_per_node=ppn, nic=nic, intra="delay 100us", timeout=60) as cl:
        got = cl.run(every_op)
    for rank, (mine, ref) in enumerate(zip(got, baseline)):
        assert mine.keys() == ref.keys()
        for key in ref:
            assert _same(mine[key], ref[key]), f"rank {rank}: {key}: {mine[key]} != {ref[key]}"


def average():
    x = torch.tensor([1.0, 2.0, 3.0]) * (dist.get_rank() + 1)
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    i = torch.tensor([dist.get_rank() * 3 + 1])
    dist.all_reduce(i, op=dist.ReduceOp.AVG)
    return x, i


def test_avg_is_supported_and_correct():
    with Cluster(nodes=4, nic="delay 200us", timeout=60) as cl:
        got = cl.run(average)
    for x, i in got:
        assert torch.allclose(x, torch.tensor([2.5, 5.0, 7.5]))
        assert int(i) == (1 + 4 + 7 + 10) // 4


def train_ddp(steps):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(steps):
        x = torch.randn(16, 8, generator=gen)
        loss = ((ddp(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_ddp_through_netem_equals_plain_gloo():
    with Cluster(nodes=2, nic=None, timeout=60) as cl:
        ref = cl.run(train_ddp, 5)
    with Cluster(nodes=2, nic="delay 1ms 500us", timeout=60) as cl:
        got = cl.run(train_ddp, 5)
    for a, b in zip(got[0], ref[0]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(got[0], got[1]):  # replicas stay identical
        assert torch.equal(a, b)


def timed_all_reduce(nbytes, repeats):
    x = torch.ones(nbytes // 4)
    dist.barrier()
    times = []
    for _ in range(repeats):
        t0 = time.monotonic()
        dist.all_reduce(x)
        times.append(time.monotonic() - t0)
    return times


def test_ring_all_reduce_takes_at_least_its_latency_rounds():
    # Ring all-reduce on 4 nodes: 2(p-1) = 6 rounds, each crossing one 5 ms link.
    with Cluster(nodes=4, nic="delay 5ms", timeout=60) as cl:
        times = np.max(cl.run(timed_all_reduce, 4096, 5), axis=0)
    assert np.median(times) >= 6 * 5e-3
    assert np.median(times) < 6 * 5e-3 * 10  # and not absurdly more (a sanity bound)


def ping_pong(n):
    rank = dist.get_rank()
    t = torch.zeros(1)
    rtts = []
    for _ in range(n):
        t0 = clusterlab.now()
        if rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        else:
            dist.recv(t, 0)
            dist.send(t, 0)
        rtts.append(clusterlab.elapsed(t0))
    return rtts


def test_ping_pong_round_trip_crosses_the_nic_twice():
    with Cluster(nodes=2, nic="delay 4ms", timeout=60) as cl:
        rtts = cl.run(ping_pong, 10)[0]
    assert min(rtts) >= 2 * 4e-3


def test_dilation_reports_emulated_time():
    # The same 4 ms network, run 3x slower: wall time triples, emulated time does not.
    with Cluster(nodes=2, nic="delay 4ms", dilation=3.0, timeout=60) as cl:
        rtts = cl.run(ping_pong, 10)[0]
    assert min(rtts) >= 2 * 4e-3
    assert np.median(rtts) < 3 * 2 * 4e-3  # it is not reported in wall-clock time


def groups():
    rank = dist.get_rank()
    sub = dist.new_group([1, 2])
    x = torch.tensor([float(rank)])
    if rank in (1, 2):
        dist.all_reduce(x, group=sub)
    return float(x)


def test_subgroups():
    with Cluster(nodes=3, nic="delay 1ms", timeout=60) as cl:
        assert cl.run(groups) == [0.0, 3.0, 3.0]


def test_shared_nic_halves_each_process_goodput():
    from clusterlab.bench.fidelity import _goodput

    size = 1 << 20
    with Cluster(nodes=2, procs_per_node=2, nic="rate 200mbit", timeout=60) as cl:
        both = cl.run(_goodput, [0, 1], [2, 3], 3, size)
    with Cluster(nodes=2, procs_per_node=2, nic="rate 200mbit", timeout=60) as cl:
        alone = cl.run(_goodput, [0], [2], 3, size)
    span_both = max(both[2][-1], both[3][-1]) - min(both[2][0], both[3][0])
    span_alone = alone[2][-1] - alone[2][0]
    # Two senders push twice the bytes through one NIC: the span doubles (one message fewer
    # in the span for one sender: 5 vs 2 message-times after the first delivery).
    assert span_both / span_alone == pytest.approx(5 / 2, rel=0.15)


def shared_files_and_pid():
    import os

    x = torch.zeros(256)
    rank = dist.get_rank()
    if rank in (0, 1):
        dist.send(x, rank + 2)  # through node 0's shared, rate-limited NIC
    elif rank in (2, 3):
        dist.recv(x, rank - 2)
    dist.barrier()
    names = sorted(os.listdir(os.environ["CLUSTERLAB_SHM_DIR"]))
    dist.barrier()
    return os.getpid(), names


def test_shared_files_carry_rank_0s_pid_so_a_killed_job_is_swept():
    # A torchrun job killed outright runs no shutdown(): its NIC-queue and entry-table files
    # must be named clusterlab-<pid>-*, the pattern the next Cluster's start removes.
    with Cluster(nodes=2, procs_per_node=2, nic="delay 1ms rate 200mbit", timeout=60) as cl:
        out = cl.run(shared_files_and_pid)
    pid0, names = out[0][0], out[0][1]
    nic_files = [n for n in names if "-nic" in n]
    assert nic_files, names
    assert all(n.startswith(f"clusterlab-{pid0}-") for n in nic_files), (pid0, names)


def entry_exchange_both_ways(tmp_root):
    import os

    from clusterlab import backend

    rank = dist.get_rank()
    world = dist.group.WORLD
    # A group whose ranks see different temp dirs cannot share an entry table (as across
    # hosts): it must fall back to exchanging entry times through Gloo, and time the same.
    mine = os.path.join(tmp_root, f"r{rank}")
    os.makedirs(mine, exist_ok=True)
    backend.configure({**backend._settings, "CLUSTERLAB_SHM_DIR": mine})
    apart = dist.new_group([0, 1])
    out = {"shared": world._entries is not None, "apart shared": apart._entries is not None,
           "left": os.listdir(mine)}
    for name, group in (("world", world), ("apart", apart)):
        x = torch.tensor([rank + 1.0])
        t0 = time.monotonic()
        dist.all_reduce(x, group=group)
        out[name] = (float(x), time.monotonic() - t0)
    return out


def test_entry_times_through_a_shared_table_or_through_gloo(tmp_path):
    # Ring on 2 nodes: 2 rounds of one 3 ms link, whichever way the entry times travel.
    with Cluster(nodes=2, nic="delay 3ms", timeout=60) as cl:
        got = cl.run(entry_exchange_both_ways, str(tmp_path))
    for rank in range(2):
        assert got[rank]["shared"] and not got[rank]["apart shared"]
        assert got[rank]["left"] == []  # the table file is unlinked once every rank mapped it
        for name in ("world", "apart"):
            total, took = got[rank][name]
            assert total == 3.0
            assert took >= 2 * 3e-3


def _gather_from_any_source():
    big, small = torch.zeros(64 * 1024), torch.zeros(2)  # a header, then data; one frame
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        seen = []
        for buf, tag in ((big, 1), (small, 2)):
            for _ in range(world - 1):
                work = dist.irecv(buf, src=None, tag=tag)
                work.wait()
                seen.append((tag, work._source_rank(), float(buf[0]), float(buf[-1])))
        return sorted(seen)
    dist.send(torch.full((64 * 1024,), float(rank)), dst=0, tag=1)
    dist.send(torch.full((2,), float(rank)), dst=0, tag=2)
    if rank == 1:
        try:
            dist.recv(small, src=None)  # rank 1 has peers below and above it
        except NotImplementedError as exc:
            return str(exc)
    return None


def test_each_direction_of_a_pair_has_its_own_connection_and_any_source_still_works():
    from clusterlab.backend import _direction_tag

    assert _direction_tag(3, 0, 1) % 2 != _direction_tag(3, 1, 0) % 2
    with pytest.raises(ValueError, match="tag"):
        _direction_tag(-1, 0, 1)
    with Cluster(nodes=3, nic="delay 1ms 500us", timeout=30) as cl:
        out = cl.run(_gather_from_any_source)
    assert out[0] == [(t, r, r, r) for t in (1, 2) for r in (1.0, 2.0)]
    assert "must name the source" in out[1]


def matmul_probe():
    """A callback for a future: (the thread it ran on, whether a matmul computed there is
    bit-identical to the same matmul computed here, in the caller's thread)."""
    import threading

    import torch

    gen = torch.Generator().manual_seed(0)
    p, q = torch.randn(1, 10, 2, generator=gen), torch.randn(1, 256, 2, generator=gen)
    here = torch.bmm(p, q.transpose(1, 2))

    def product(fut):
        return threading.current_thread().name, torch.equal(torch.bmm(p, q.transpose(1, 2)),
                                                            here)

    return product


def _matmul_in_callbacks():
    """matmul_probe in callbacks chained on the backend's futures (collective and point to
    point)."""
    product = matmul_probe()
    # Chained at once, on a 20 ms network: the futures are not done yet, so the callbacks run
    # on the threads that complete them. The point-to-point pair goes first, so that rank 1's
    # receive is posted before the message can arrive (after a collective it may have arrived).
    if dist.get_rank() == 0:
        work = dist.isend(torch.ones(1), dst=1)
    else:
        work = dist.irecv(torch.zeros(1), src=0)
    p2p = work.get_future().then(product).wait()
    return [dist.all_reduce(torch.ones(1), async_op=True).get_future().then(product).wait(), p2p]


def test_callbacks_on_the_backends_threads_compute_as_the_caller_does():
    # torch.set_num_threads reaches MKL only in the thread that calls it: a thread of the
    # backend's own ran its first matmuls on every core and rounded differently (85 of these
    # 2560 entries on 2 cores), so torch's PowerSGD hook left DDP's replicas ulps apart
    # whenever its callbacks ran on the completion thread on one rank and not on the other.
    with Cluster(nodes=2, nic="delay 20ms", threads=1, timeout=60) as cl:
        out = cl.run(_matmul_in_callbacks)
    for r, rank in enumerate(out):
        (coll_thread, coll_same), (p2p_thread, p2p_same) = rank
        assert coll_thread == "netem-completion"
        if r == 1:  # the receive cannot be done before 20 ms; rank 0's send may be at once
            assert p2p_thread != "MainThread"
        assert coll_same and p2p_same, rank
