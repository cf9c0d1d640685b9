"""The netem backend under sharded and model-parallel training: FSDP2 and DeviceMesh,
sub-groups, all_gather_into_tensor / reduce_scatter_tensor / uneven all_to_all_single,
coalesced ops and batched p2p, each equal to plain Gloo's result on the same inputs; and the
per-rank byte counters (`backend.traffic`) against the closed forms."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed.fsdp  # noqa: F401 - imported before the ranks fork: they inherit it
import torch.distributed.tensor  # noqa: F401

from clusterlab import Cluster
from clusterlab import parallelism as par
from clusterlab.backend import traffic

pytestmark = pytest.mark.timeout(240)
WORLD = 4
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.int32)


def sharded_ops(sizes):
    """Every op the sharded strategies use, on deterministic inputs of several dtypes/sizes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.distributed_c10d import _coalescing_manager

    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for dt in DTYPES:
        for n in sizes:
            x = (torch.arange(n * world) % 97 + 7 * rank).to(dt)
            gathered = torch.empty(n * world * world, dtype=dt)
            dist.all_gather_into_tensor(gathered, x)
            out[f"ag {dt} {n}"] = gathered
            shard = torch.empty(n, dtype=dt)
            dist.reduce_scatter_tensor(shard, x)
            out[f"rs {dt} {n}"] = shard
            if dt.is_floating_point:  # AVG: the netem backend's SUM then divide
                avg = torch.empty(n, dtype=dt)
                dist.reduce_scatter_tensor(avg, x, op=dist.ReduceOp.AVG)
                out[f"rs avg {dt} {n}"] = avg
            # Uneven splits: rank r sends (r + j) % 3 + n rows of 2 to rank j.
            send = [(rank + j) % 3 + n for j in range(world)]
            recv = [(j + rank) % 3 + n for j in range(world)]
            rows = (torch.arange(sum(send) * 2).reshape(-1, 2) + 1000 * rank).to(dt)
            got = torch.empty(sum(recv), 2, dtype=dt)
            dist.all_to_all_single(got, rows, recv, send)
            out[f"a2a {dt} {n}"] = got
    parts = [torch.empty(3 * world) for _ in range(2)]
    with _coalescing_manager(async_ops=True) as cm:
        for i, t in enumerate(parts):
            dist.all_gather_into_tensor(t, torch.full((3,), float(rank + i)), async_op=True)
    cm.wait()
    out["ag coalesced"] = torch.cat(parts)
    shards = [torch.empty(2) for _ in range(2)]
    with _coalescing_manager(async_ops=True) as cm:
        for i, t in enumerate(shards):
            dist.reduce_scatter_tensor(t, torch.arange(2.0 * world) * (rank + 1 + i),
                                       async_op=True)
    cm.wait()
    out["rs coalesced"] = torch.cat(shards)
    reduced = [torch.ones(3) * rank, torch.arange(5.0) + rank]
    with _coalescing_manager(async_ops=True) as cm:
        for t in reduced:
            dist.all_reduce(t, async_op=True)
    cm.wait()
    out["ar coalesced"] = torch.cat(reduced)
    sub = dist.new_group([1, 2, 3])
    if rank in (1, 2, 3):
        t = torch.arange(6.0) * rank
        g = torch.empty(18)
        dist.all_gather_into_tensor(g, t, group=sub)
        out["subgroup ag"] = g
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=mesh.get_group("tp"))
    out["mesh tp"] = t.clone()
    dist.all_reduce(t, group=mesh.get_group("dp"))
    out["mesh dp"] = t.clone()
    buf = torch.empty(4)
    ops = [dist.P2POp(dist.isend, torch.full((4,), float(rank)), (rank + 1) % world),
           dist.P2POp(dist.irecv, buf, (rank - 1) % world)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    out["batch p2p"] = buf
    return out


def fsdp2_training(steps=3):
    """Three SGD steps of FSDP2 (`fully_shard` per layer) over a CPU DeviceMesh."""
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(dist.get_rank()))
    losses, sent = [], []
    for _ in range(steps):
        traffic(reset=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        sent.append(traffic())
    full = [p.full_tensor() for p in model.parameters()]  # DTensor: functional collectives
    return {"losses": losses, "params": full, "traffic": sent[-1]}


@pytest.fixture(scope="module")
def clusters():
    with Cluster(nodes=WORLD, nic="delay 300us 100us", timeout=120) as netem, \
            Cluster(nodes=WORLD, nic=None, timeout=120) as gloo:
        assert netem.backend == "netem" and gloo.backend == "gloo"
        yield netem, gloo


def equal(a, b):
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)


def test_sharded_ops_equal_plain_gloo(clusters):
    netem, gloo = clusters
    ours, theirs = netem.run(sharded_ops, [1, 7, 300]), gloo.run(sharded_ops, [1, 7, 300])
    for rank in range(WORLD):
        assert ours[rank].keys() == theirs[rank].keys()
        for key, value in theirs[rank].items():
            if key.startswith("rs avg"):  # Gloo has no AVG: compare with its SUM / N
                plain = theirs[rank][key.replace("rs avg", "rs")].double() / WORLD
                assert torch.allclose(ours[rank][key].double(), plain, rtol=1e-2), key
            else:
                assert equal(ours[rank][key], value), (rank, key)


def test_fsdp2_trains_through_netem_exactly_as_on_gloo_and_sends_the_closed_form(clusters):
    netem, gloo = clusters
    ours, theirs = netem.run(fsdp2_training), gloo.run(fsdp2_training)
    for a, b in zip(ours, theirs):
        assert a["losses"] == b["losses"]
        assert equal(a["params"], b["params"])
    assert ours[0]["losses"][-1] < ours[0]["losses"][0]  # it trains
    params = 16 * 32 + 32 + 32 * 8 + 8
    predicted = par.sharded_traffic("fsdp", params=params, ranks=WORLD)
    for rank in ours:
        t = rank["traffic"]
        assert t["allgather"]["sent"] == predicted["allgather"]
        assert t["reduce_scatter"]["sent"] == predicted["reduce_scatter"]
        assert t["total"]["sent"] == predicted["total"]


def counted_ops():
    rank, world = dist.get_rank(), dist.get_world_size()
    traffic(reset=True)
    before = traffic()
    dist.all_reduce(torch.zeros(1000))  # 4000 B
    gathered = torch.empty(world * 250)
    dist.all_gather_into_tensor(gathered, torch.zeros(250))  # 1000 B per rank
    shard = torch.empty(250)
    dist.reduce_scatter_tensor(shard, torch.zeros(world * 250))
    send = [rank + 1] * world  # rows of 3 float32
    recv = [j + 1 for j in range(world)]
    got = torch.empty(sum(recv), 3)
    dist.all_to_all_single(got, torch.zeros(sum(send), 3), recv, send)
    if rank == 0:
        dist.send(torch.zeros(10), 1)
    elif rank == 1:
        dist.recv(torch.zeros(10), 0)
    return before, traffic(reset=True), traffic()


def test_byte_counters_match_the_ring_closed_forms(clusters):
    netem, _ = clusters
    res = netem.run(counted_ops)
    p = WORLD
    for rank, (before, counted, after) in enumerate(res):
        assert before["total"] == {"sent": 0, "received": 0, "ops": 0}
        assert after["total"]["ops"] == 0  # reset=True zeroed them
        assert counted["allreduce"]["sent"] == counted["allreduce"]["received"] == \
            2 * (p - 1) / p * 4000
        assert counted["allgather"]["sent"] == (p - 1) * 1000
        assert counted["reduce_scatter"]["sent"] == (p - 1) * 1000
        assert counted["alltoall"]["sent"] == (p - 1) * (rank + 1) * 12
        assert counted["alltoall"]["received"] == (sum(range(1, p + 1)) - (rank + 1)) * 12
        assert counted.get("p2p", {}).get("sent", 0) == (40 if rank == 0 else 0)
        assert counted.get("p2p", {}).get("received", 0) == (40 if rank == 1 else 0)
        assert counted["total"]["sent"] == sum(v["sent"] for k, v in counted.items()
                                               if k != "total")


def chained_collective():
    """PowerSGD's pattern: a callback on one all-reduce's future waits on another."""
    x = torch.ones(4) * (dist.get_rank() + 1)

    def second(fut):
        y = fut.value()[0].clone()
        dist.all_reduce(y, async_op=True).get_future().wait()
        return y

    out = dist.all_reduce(x, async_op=True).get_future().then(second).wait()
    after = torch.ones(1)
    dist.all_reduce(after)
    return out.tolist(), after.item()


def hot_alltoall():
    """Rank 0 sends 32x what the others do; every rank's all-to-all waits for it."""
    from clusterlab import clock

    rank, world = dist.get_rank(), dist.get_world_size()
    rows = 4096 if rank == 0 else 128  # float32 rows of 64 B
    send = [rows // world] * world
    table = [torch.zeros(world, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(table, torch.tensor(send))
    recv = [int(table[j][rank]) for j in range(world)]
    x, got = torch.zeros(rows, 16), torch.empty(sum(recv), 16)
    dist.barrier()
    t0 = clock.now()
    dist.all_to_all_single(got, x, recv, send)
    return clock.now() - t0


def test_chained_collectives_do_not_deadlock_and_uneven_alltoall_waits_for_the_busiest():
    with Cluster(nodes=2, nic="delay 1ms rate 100mbit", timeout=30) as cl:
        assert cl.run(chained_collective) == [([6.0] * 4, 2.0)] * 2
    with Cluster(nodes=WORLD, nic="rate 100mbit", timeout=60) as cl:
        times = cl.run(hot_alltoall)
    # The rank that gets rank 0's last message waits for all of rank 0's off-rank bytes to
    # cross its NIC (without agreeing on the busiest sender, it would replay its own few).
    busiest = 4096 * 64 * (WORLD - 1) / WORLD * 8 / 100e6
    assert max(times) >= 0.95 * busiest
