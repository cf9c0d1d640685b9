"""Experiments of notebook 13: switches. Incast, oversubscribed uplinks, ECMP and rails.

Every measurement starts a real `clusterlab.Cluster` whose ranks sit behind a switched fabric
(`clusterlab.fabric`: `LeafSpine` or `RailOptimized`): real processes send real bytes
through Gloo, and the "netem" backend holds each message until the link model says it has
crossed the sender's NIC and every switch port on its way, queueing behind the other ranks'
messages there. Each measurement comes with its closed form (`clusterlab.fabric_models`).

All sends of one measured round start at one agreed instant (`_common_start`), as the
fidelity bench's delay rows do, so a queue at a port is built by messages that really
arrive together. Times are in seconds, sizes in bytes; results are plain lists of dicts.
Within one round (an incast, an ECMP round) the emulated network never delivers early, so
this machine's scheduling noise can only lengthen a repetition and the fastest one (`best`)
is the least disturbed. A collective of several dependent rounds is different: when two
messages reach a port at the same instant, which goes first depends on which process this
machine ran first, and that order changes when the collective ends. There a run is compared
with the range of every service order (`replay_range`), not with its fastest repetition.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

import numpy as np

from .. import fabric_models as fm
from ..fabric import LeafSpine, RailOptimized, as_fabric
from ..netem import Netem, as_netem
from ..schedule import Collective, QueueState, play, segments
from ..topology import Topology
from .common import BUSY_FACTOR, beyond_closed_form

KiB, MiB = 1024, 1024 * 1024

# Every node's NIC: 1 ms of latency and 100 Mbit/s, so a 1 MiB message takes ~84 ms on the
# wire: queues of several messages stand far above this machine's scheduling noise (a few
# ms when two cores run eight ranks), and the notebook's experiments fit their budget.
NIC = "delay 1ms rate 100mbit"
INTRA = "delay 100us rate 10gbit"  # inside a node, as in notebook 02
START_MARGIN_S = 0.15  # the agreed start lies this far after the agreement (ranks wake late)
LABELS = {"ring": "ring", "tree": "binomial tree",
          "tree_neighbours_first": "binomial tree, neighbours first",
          "recursive_doubling": "recursive doubling",
          "rabenseifner": "Rabenseifner", "parameter_server": "parameter server",
          "hierarchical_rail": "hierarchical (rails)"}


def rate_bps(spec: str | Netem | None) -> float:
    """The rate (bit/s) of a netem spec; ValueError when it has none."""
    net = as_netem(spec) or Netem()
    if not net.rate_bps:
        raise ValueError(f"the network {str(net)!r} has no rate: a switch cannot queue")
    return float(net.rate_bps)


def _stats(times: Sequence[float]) -> dict:
    return {"times": [float(t) for t in times], "best": float(min(times)),
            "median": float(statistics.median(times))}


def _cluster(**options):
    from ..cluster import Cluster

    return Cluster(**options)


# --- rank bodies -------------------------------------------------------------------------------


def _common_start(margin_s: float) -> int:
    """An instant (CLOCK_MONOTONIC ns) every rank agrees on, margin_s after the slowest rank
    reached this call: a tiny all-reduce of the ranks' clocks (MAX)."""
    import time

    import torch
    import torch.distributed as dist

    mine = torch.tensor([time.monotonic_ns()], dtype=torch.int64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return int(mine[0]) + int(margin_s * 1e9)


def _rounds_body(rounds, nbytes: int, repeats: int, margin_s: float, stamps: bool = False):
    """On every rank: each round is a list of (src, dst) messages of `nbytes`, all sent at
    one agreed instant; a receiver notes when each of its messages is in. Returns, per round
    and repetition, (start ns, {(src, dst): arrival ns}) as this rank saw it. A receiver waits
    on its messages in sender order, so an arrival is when that wait returned: never before
    the message's delivery, but also not before the previous wait's return. With `stamps`,
    a third item: {(src, dst): delivery ns}, the emulated delivery time the sender stamped
    in the message's header (the backend's `hold_ns`), whatever order they are waited on."""
    import time

    import torch
    import torch.distributed as dist

    from .. import clock

    me = dist.get_rank()
    payload = torch.ones(max(1, nbytes // 4))
    pairs = sorted({pair for r in rounds for pair in r})
    for src, dst in pairs:  # open every connection (and route) outside the measurement
        if me == src:
            dist.send(torch.zeros(1), dst)
        elif me == dst:
            dist.recv(torch.zeros(1), src)
    out = []
    for messages in rounds:
        for _ in range(repeats):
            start = _common_start(margin_s)
            incoming = [(s, d) for s, d in messages if d == me]
            bufs = [torch.empty_like(payload) for _ in incoming]
            works = [dist.irecv(b, s) for b, (s, _) in zip(bufs, incoming)]
            clock.sleep_until(start)
            sends = [dist.isend(payload, d) for s, d in messages if s == me]
            got, delivered = {}, {}
            for pair, work in zip(incoming, works):
                work.wait()
                got[pair] = time.monotonic_ns()
                if stamps:  # an unimpaired link sends no header: its wait is its delivery
                    delivered[pair] = getattr(work, "hold_ns", 0) or got[pair]
            for work in sends:
                work.wait()
            out.append((start, got, delivered) if stamps else (start, got))
    return out


def _round_times(per_rank, rounds, repeats: int, dilation: float = 1.0) -> list[dict]:
    """Per round: the times (s) from the agreed start to its last arrival, per repetition,
    and each message's arrival (s after the start) in every repetition; with delivery stamps
    (`_rounds_body(stamps=True)`), also `delivered`: each message's emulated delivery time (s
    after the start) in every repetition."""
    rows = []
    for r, messages in enumerate(rounds):
        times, arrivals = [], {pair: [] for pair in messages}
        delivered = {pair: [] for pair in messages}
        stamped = all(len(rank_out[r * repeats]) > 2 for rank_out in per_rank)
        for k in range(repeats):
            got, stamp = {}, {}
            start = per_rank[0][r * repeats + k][0]
            for rank_out in per_rank:
                got.update(rank_out[r * repeats + k][1])
                if stamped:
                    stamp.update(rank_out[r * repeats + k][2])
            for pair in messages:
                arrivals[pair].append((got[pair] - start) / 1e9 / dilation)
                if stamped:
                    delivered[pair].append((stamp[pair] - start) / 1e9 / dilation)
            times.append(max(arrivals[pair][-1] for pair in messages))
        row = {"messages": list(messages), "arrivals": arrivals, **_stats(times)}
        if stamped:
            row["delivered"] = delivered
        rows.append(row)
    return rows


def _collective_body(plan, margin_s: float):
    """On every rank: each (algorithm, nbytes, repeats, options) of `plan` from one agreed
    start per repetition; returns (start ns, this rank's end ns) per repetition."""
    import time

    import torch

    from .. import clock
    from ..collectives import ALGORITHMS

    out = []
    for algorithm, nbytes, repeats, options in plan:
        run = {"rail_naive": rail_allreduce,
               "tree_neighbours_first": tree_neighbours_first}.get(algorithm)
        run = run or ALGORITHMS[algorithm]
        run(torch.ones(1024), **options)  # opens the connections it uses
        spans = []
        for _ in range(repeats):
            x = torch.ones(max(1, nbytes // 4))
            start = _common_start(margin_s)
            clock.sleep_until(start)
            run(x, **options)
            spans.append((start, time.monotonic_ns()))
            import torch.distributed as dist

            if float(x[0]) != dist.get_world_size():
                raise AssertionError(f"{algorithm}: wrong sum {float(x[0])}")
        out.append(spans)
    return out


def _collective_times(per_rank, plan, dilation: float = 1.0) -> list[list[float]]:
    """Per plan item, per repetition: from the agreed start to the last rank's end (s of
    the emulated cluster: wall time / dilation)."""
    return [[(max(rank[i][k][1] for rank in per_rank) - per_rank[0][i][k][0]) / 1e9 / dilation
             for k in range(plan[i][2])] for i in range(len(plan))]


def rail_allreduce(tensor, *, procs_per_node: int, rotate: bool = True):
    """The rail-style hierarchical all-reduce (`collectives.hierarchical_rail_allreduce`),
    laid out naively when `rotate`: on node n the node's ranks are taken in an order rotated
    by n, so the ranks that all-reduce one shard across nodes have different local indices,
    i.e. sit on different rails (as when a node's NIC i is not cabled to rail switch i).
    The same bytes, the same rounds: only the layout differs."""
    import torch.distributed as dist

    from ..collectives import _bounds, _ring, _ring_allgather, _ring_reduce_scatter

    me, p = dist.get_rank(), dist.get_world_size()
    ppn = procs_per_node
    if ppn < 1 or p % ppn:
        raise ValueError(f"procs_per_node={ppn} does not divide the world size {p}")
    x = tensor.view(-1)
    node = me // ppn
    shift = node if rotate else 0
    order = [node * ppn + (j + shift) % ppn for j in range(ppn)]  # this node, in ring order
    shard = _ring_reduce_scatter(x, order)  # this rank now holds the node's sum of a shard
    position = order.index(me)
    rail = [n * ppn + (position + (n if rotate else 0)) % ppn for n in range(p // ppn)]
    b = _bounds(x.numel(), ppn)
    _ring(x[b[shard] : b[shard + 1]], rail)
    _ring_allgather(x, order)
    return tensor


def neighbours_first_order(p: int) -> list[int]:
    """The bit-reversal of 0..p-1 (p a power of two). The course's binomial tree
    (`collectives._binomial_reduce`) pairs rank i with i + p/2 first, the largest stride
    first; run over the ranks in this order, the same code pairs neighbours first (1 -> 0,
    3 -> 2, ..., then 2 -> 0, ..., then p/2 -> 0), the order of MPICH's binomial reduce
    (`mask = 0x1; ... mask <<= 1` in src/mpi/coll/reduce/reduce_intra_binomial.c); the
    broadcast mirrors it."""
    bits = (p - 1).bit_length()
    if p < 1 or 1 << bits != p:
        raise ValueError(f"p must be a power of two, got {p}")
    return [int(f"{i:0{bits}b}"[::-1], 2) if bits else 0 for i in range(p)]


def tree_neighbours_first(tensor):
    """The course's binomial-tree all-reduce with its rounds pairing neighbours first (the
    ranks taken in `neighbours_first_order`): same rounds, same bytes, other partners."""
    import torch.distributed as dist

    from ..collectives import _binomial_broadcast, _binomial_reduce, _sum_in_place

    order = neighbours_first_order(dist.get_world_size())

    def body(x):
        _binomial_reduce(x, order)
        _binomial_broadcast(x, order)

    return _sum_in_place(tensor, body)


def naive_rail_order(nodes: int, procs_per_node: int) -> list[int]:
    """The rank order of `rail_allreduce(rotate=True)` as `schedule.play` and
    `fabric_models.bottleneck_time` take it (node by node, each rotated by its index)."""
    return [n * procs_per_node + (j + n) % procs_per_node for n in range(nodes)
            for j in range(procs_per_node)]


# --- 1. incast --------------------------------------------------------------------------------


def incast_fabric(nodes: int, *, limit: int | None = None, nic: str = NIC) -> LeafSpine:
    """One leaf holding every node; ports at the NIC's rate, with a buffer of `limit` packets
    (None: netem's default of 1000)."""
    port = f"rate {as_netem(nic).rate_bps}bit" + (f" limit {limit}" if limit else "")
    return LeafSpine(nodes_per_leaf=nodes, port=port)


def incast(counts: Sequence[int] = (1, 2, 4, 7), *, nbytes: int = MiB, nic: str = NIC,
           limit: int | None = None, repeats: int = 2, seed: int = 0,
           timeout: float = 120) -> list[dict]:
    """N senders (ranks 1..N) each send `nbytes` to rank 0 at one instant, on one leaf whose
    ports have a buffer of `limit` packets, for every N in `counts`.

    Row per N: times (agreed start to the last arrival, every repetition), best, median,
    delivered (each message's emulated delivery time, s after the start, every repetition;
    `arrivals` are when rank 0's in-order waits returned, an upper bound on them),
    queue (best - the best of a lone sender: the last message's wait behind the others; 0
    for N = 1 or when N = 1 is not measured), goodput (N nbytes / best) and `model`, the
    `fabric_models.incast` prediction.
    """
    counts = [int(n) for n in counts]
    if not counts or min(counts) < 1:
        raise ValueError(f"counts must be sender counts >= 1, got {counts}")
    nodes = max(counts) + 1
    rounds = [[(i, 0) for i in range(1, n + 1)] for n in counts]
    with _cluster(nodes=nodes, nic=nic, fabric=incast_fabric(nodes, limit=limit, nic=nic),
                 seed=seed, timeout=timeout) as cl:
        per_rank = cl.run(_rounds_body, rounds, nbytes, repeats, START_MARGIN_S, True)
    spec = as_netem(nic)
    rows = []
    for n, row in zip(counts, _round_times(per_rank, rounds, repeats)):
        model = fm.incast(n, nbytes, rate_bps=spec.rate_bps, delay_s=spec.delay_ns / 1e9,
                          buffer_packets=limit or spec.limit)
        rows.append({"senders": n, "nbytes": nbytes, "limit": limit, "model": model,
                     "goodput": n * nbytes / row["best"], **row})
    lone = next((r["best"] for r in rows if r["senders"] == 1), None)
    for r in rows:
        r["queue"] = r["best"] - lone if lone is not None else 0.0
    return rows


def ps_vs_ring(*, nodes: int = 8, nbytes: int = MiB, nic: str = NIC, repeats: int = 2,
               dilation: float = 1.0, seed: int = 0, timeout: float = 120) -> list[dict]:
    """A parameter server (rank 0 sums the pushes of the others and sends the sum back) and
    a ring all-reduce of `nbytes` on `nodes` nodes of one leaf: the server's port takes an
    incast of nodes - 1 messages, the ring's ports one message a round each.

    Row per algorithm: times, best, median, model (`fabric_models.bottleneck_time` on this
    fabric) and crossbar (the same with NIC shaping only, the package's "crossbar" fabric:
    no switch port, so only the NICs queue; a real crossbar switch would still have the
    server's output port, where the pushes meet). `dilation` as in `oversubscribed`: the
    ring's 2(p-1) steps each pay this machine's cost of a message exchange, which it divides."""
    fabric = incast_fabric(nodes, nic=nic)
    plan = [(a, nbytes, repeats, {}) for a in ("parameter_server", "ring")]
    with _cluster(nodes=nodes, nic=nic, fabric=fabric, seed=seed, timeout=timeout,
                  dilation=dilation) as cl:
        times = _collective_times(cl.run(_collective_body, plan, START_MARGIN_S), plan,
                                  dilation)
    topo = Topology.build(nodes, 1, nic, fabric=fabric)
    flat = Topology.build(nodes, 1, nic)
    return [{"algorithm": a, "nbytes": nbytes, "nodes": nodes,
             "model": fm.bottleneck_time(topo, a, nbytes)[0],
             "crossbar": fm.bottleneck_time(flat, a, nbytes)[0], **_stats(t)}
            for (a, *_), t in zip(plan, times)]


# --- 2. oversubscription -----------------------------------------------------------------------


def leaf_spine(oversubscription: float, *, nodes_per_leaf: int = 4, spines: int = 1,
               ecmp_seed: int = 0) -> LeafSpine:
    """Leaves of `nodes_per_leaf` nodes; ports at the NIC's rate (port=None)."""
    return LeafSpine(nodes_per_leaf=nodes_per_leaf, spines=spines,
                     oversubscription=oversubscription, ecmp_seed=ecmp_seed)


def oversubscribed(oversubscriptions: Sequence[float] = (1, 4),
                   algorithms: Sequence[str] = ("ring", "tree"), *, nodes: int = 8,
                   nodes_per_leaf: int = 4, nbytes: int = MiB, nic: str = NIC,
                   repeats: int = 2, dilation: float = 1.0, seed: int = 0,
                   timeout: float = 120) -> list[dict]:
    """All-reduce algorithms (the course's, from isend/irecv; "tree_neighbours_first" is the
    binomial tree pairing neighbours first) on a leaf-spine of `nodes` nodes,
    `nodes_per_leaf` per leaf and one spine, at each oversubscription ratio.
    `dilation` runs the cluster that many times slower than the network it stands for
    (times are reported in the emulated network's time): each of the ring's 2(p-1) steps
    also pays this machine's cost of a message exchange, which dilation divides.

    Row per (oversubscription, algorithm): times, best, median, model (the bottleneck share
    form on that fabric), crossbar (the same without switches), and the busiest round's
    flows on one uplink (`crowd`)."""
    rows = []
    plan = [(a, nbytes, repeats, {}) for a in algorithms]
    for o in oversubscriptions:
        fabric = leaf_spine(o, nodes_per_leaf=nodes_per_leaf)
        with _cluster(nodes=nodes, nic=nic, fabric=fabric, seed=seed, timeout=timeout,
                     dilation=dilation) as cl:
            times = _collective_times(cl.run(_collective_body, plan, START_MARGIN_S), plan,
                                      dilation)
        topo = Topology.build(nodes, 1, nic, fabric=fabric)
        for (a, *_), t in zip(plan, times):
            name = "tree" if a == "tree_neighbours_first" else a
            order = neighbours_first_order(nodes) if a == "tree_neighbours_first" else None
            model, costs = fm.bottleneck_time(topo, name, nbytes, ranks=order)
            rows.append({"oversubscription": float(o), "algorithm": a, "nbytes": nbytes,
                         "nodes": nodes, "model": model,
                         "crossbar": fm.bottleneck_time(Topology.build(nodes, 1, nic), name,
                                                        nbytes, ranks=order)[0],
                         "crowd": max(c.flows_on_bottleneck for c in costs
                                      if c.bottleneck in ("uplink", "downlink"))
                         if any(c.bottleneck in ("uplink", "downlink") for c in costs) else 0,
                         **_stats(t)})
    return rows


# --- 3. ECMP -----------------------------------------------------------------------------------


def ecmp_loads(fabric: LeafSpine, pairs: Sequence[tuple[int, int]]) -> np.ndarray:
    """Flows each spine carries for these (src rank, dst rank) flows (every flow hashed)."""
    src, dst = (np.array(x, dtype=np.int64) for x in zip(*pairs))
    return np.bincount(fabric.spine_of(src, dst).astype(np.int64), minlength=fabric.spines)


def ecmp_hashing(flows: Sequence[int] = (1, 2, 4, 8, 16, 32), *, spines: int = 8,
                 seeds: int = 2000, nodes_per_leaf: int = 32) -> list[dict]:
    """The fabric's own ECMP hash over many seeds: F flows from distinct nodes of leaf 0 to
    distinct nodes of leaf 1, hashed to `spines` spines. Row per F: the share of seeds with a
    collision (two flows on one uplink) and the mean load of the busiest uplink, with the
    balls-in-bins values (`fabric_models.collision_probability`, `expected_max_load`)."""
    rows = []
    for f in flows:
        if not 1 <= f <= nodes_per_leaf:
            raise ValueError(f"flows must be in 1..{nodes_per_leaf}, got {f}")
        pairs = [(i, nodes_per_leaf + i) for i in range(f)]
        peaks = np.array([ecmp_loads(LeafSpine(nodes_per_leaf=nodes_per_leaf, spines=spines,
                                               ecmp_seed=s), pairs).max()
                          for s in range(seeds)])
        law = fm.max_load_distribution(f, spines)
        rows.append({"flows": f, "spines": spines, "seeds": seeds,
                     "collisions": float(np.mean(peaks >= 2)),
                     "collision_model": fm.collision_probability(f, spines),
                     "max_load": float(peaks.mean()),
                     "max_load_model": fm.expected_max_load(f, spines),
                     "max_load_law": law.tolist(),
                     "max_load_counts": np.bincount(peaks, minlength=f + 1).tolist()})
    return rows


def ecmp_rounds(*, nodes_per_leaf: int = 4, spines: int = 4, pairings: int = 8,
                nbytes: int = 512 * KiB, nic: str = NIC, repeats: int = 1, seed: int = 0,
                timeout: float = 120) -> list[dict]:
    """Every node of leaf 0 sends to a node of leaf 1 at once, `pairings` different pairings
    (permutations), through `spines` spines whose uplinks each run at the NIC's rate
    (oversubscription 1: the fabric could carry every flow at full speed). ECMP hashes each
    pairing's flows to spines its own way; the round waits for the busiest uplink. The
    pairings are spread evenly over all permutations sorted by their busiest uplink, then
    run in a shuffled order (seeded by `seed`), so that a warm-up or a drift of this
    machine's load does not fall on one class of pairings.

    Row per pairing: its messages, the loads per spine, the busiest uplink's flows (`peak`),
    times, best, median and model (`fabric_models.round_cost`)."""
    fabric = LeafSpine(nodes_per_leaf=nodes_per_leaf, spines=spines)
    # Every pairing's busiest uplink is known from the hash before anything runs: measure
    # pairings spread evenly over them, from the luckiest to the unluckiest, in random order.
    perms = list(itertools.permutations(range(nodes_per_leaf)))
    peaks = [int(ecmp_loads(fabric, [(i, nodes_per_leaf + perm[i])
                                     for i in range(nodes_per_leaf)]).max()) for perm in perms]
    order = np.argsort(peaks, kind="stable")
    picks = np.unique(np.linspace(0, len(perms) - 1, min(pairings, len(perms))).round())
    chosen = [perms[order[int(i)]] for i in picks]
    chosen = [chosen[i] for i in np.random.default_rng(seed).permutation(len(chosen))]
    rounds = [[(i, nodes_per_leaf + perm[i]) for i in range(nodes_per_leaf)] for perm in chosen]
    nodes = 2 * nodes_per_leaf
    with _cluster(nodes=nodes, nic=nic, fabric=fabric, seed=seed, timeout=timeout) as cl:
        per_rank = cl.run(_rounds_body, rounds, nbytes, repeats, START_MARGIN_S)
    topo = Topology.build(nodes, 1, nic, fabric=fabric)
    rows = []
    for messages, row in zip(rounds, _round_times(per_rank, rounds, repeats)):
        loads = ecmp_loads(fabric, messages)
        src, dst = zip(*messages)
        rows.append({**row, "loads": loads.tolist(), "peak": int(loads.max()),
                     "model": fm.round_cost(topo, src, dst, nbytes).time_s})
    return rows


# --- 4. rails ----------------------------------------------------------------------------------


def rails(*, oversubscription: float = 4, nodes: int = 2, procs_per_node: int = 2,
          nbytes: int = 4 * MiB, nic: str = NIC, intra: str = INTRA, repeats: int = 2,
          dilation: float = 1.0, seed: int = 0, timeout: float = 120) -> list[dict]:
    """The rail-style hierarchical all-reduce on a rail-optimised fabric (NIC i of every
    node on rail switch i; one spine, oversubscribed), laid out two ways: aligned (the ranks
    that all-reduce a shard across nodes share a rail) and naive (`rail_allreduce` with
    rotate=True: they sit on different rails, so every inter-node message crosses the spine).

    Row per layout: times, best, median, model (bottleneck share, with the layout's rank
    order) and the inter-node rounds' bottleneck (where, and how many flows share it).
    `dilation` as in `oversubscribed` (the intra-node steps are short)."""
    fabric = RailOptimized(rails=procs_per_node, oversubscription=oversubscription)
    options = {"procs_per_node": procs_per_node}
    plan = [("rail_naive", nbytes, repeats, {**options, "rotate": False}),
            ("rail_naive", nbytes, repeats, {**options, "rotate": True})]
    with _cluster(nodes=nodes, procs_per_node=procs_per_node, nic=nic, intra=intra,
                 fabric=fabric, seed=seed, timeout=timeout, dilation=dilation) as cl:
        times = _collective_times(cl.run(_collective_body, plan, START_MARGIN_S), plan,
                                  dilation)
    topo = Topology.build(nodes, procs_per_node, nic, intra, fabric=fabric)
    rows = []
    for layout, order, t in (("aligned", None, times[0]),
                             ("naive", naive_rail_order(nodes, procs_per_node), times[1])):
        model, costs = fm.bottleneck_time(topo, "hierarchical_rail", nbytes, ranks=order)
        inter = [c for c in costs if c.bottleneck != "intra"]
        rows.append({"layout": layout, "nbytes": nbytes, "oversubscription": oversubscription,
                     "model": model, "bottleneck": inter[0].bottleneck if inter else "intra",
                     "crowd": inter[0].flows_on_bottleneck if inter else 0, **_stats(t)})
    return rows


def replay(topo: Topology, algorithm: str, nbytes: int,
           ranks: Sequence[int] | None = None, *, start_ns: Sequence[int] | None = None) -> float:
    """An all-reduce's time (s) in the emulator's own queue model (`schedule.play`: each port
    books a message's packets in send order), from the ranks' start times `start_ns`
    (default: all at 0, where simultaneous messages are served in rank order) and none of
    this machine's costs; `fm.bottleneck_time` instead shares a port equally. `ranks` as
    there: the layout of the ranks on the fabric."""
    p = topo.world_size
    coll = Collective("allreduce", int(nbytes), algorithm=algorithm)
    start = np.zeros(p, dtype=np.int64) if start_ns is None else np.asarray(start_ns, np.int64)
    done = play(QueueState(topo), coll, start, np.random.default_rng(0), ranks=ranks)
    return float(done.max() - start.min()) / 1e9


def replay_range(topo: Topology, algorithm: str, nbytes: int,
                 ranks: Sequence[int] | None = None, *, orders: int = 20,
                 spread_ns: int = 1000, seed: int = 0) -> tuple[float, float]:
    """The fastest and slowest `replay` (s) over `orders` service orders: all ranks at 0,
    then ranks starting up to `spread_ns` apart (random, seeded). A microsecond is far below
    a message's time, so the offsets change the time only through the order in which a
    port serves messages that reach it together: the race a measured run draws from."""
    rng = np.random.default_rng(seed)
    p = topo.world_size
    times = [replay(topo, algorithm, nbytes, ranks,
                    start_ns=rng.integers(0, spread_ns + 1, p) if k else None)
             for k in range(max(1, orders))]
    return min(times), max(times)


def incast_drops(senders: int, nbytes: int, *, limit: int, nic: str = NIC) -> list[list[int]]:
    """Which segments (numbered from 1) of each sender's message the emulator's receiver
    port drops when `senders` senders send `nbytes` each to one receiver at one instant
    through a port holding `limit` packets: the emulator's own port model
    (`fabric.cross_path`, as the backend runs it), before TCP recovers anything. One list
    per sender, in the order the port serves them."""
    from ..fabric import cross_path

    topo = Topology.build(senders + 1, 1, nic, fabric=incast_fabric(senders + 1, limit=limit,
                                                                    nic=nic))
    state = QueueState(topo)
    src = np.arange(1, senders + 1)
    dst = np.zeros(senders, dtype=np.int64)
    send = np.zeros(senders, dtype=np.int64)
    payload = segments(nbytes, state.segment_bytes)
    off_nic = state._deliver_group(topo.nic, src, dst, send, topo.world_size + src, nbytes,
                                   None, per_segment=True)
    out = cross_path(state.ports, state.port_specs, topo.paths(src, dst), off_nic, payload,
                     send, None)
    return [(np.flatnonzero(row < 0) + 1).tolist() for row in out]


def incast_replay(senders: int, nbytes: int, *, limit: int, stagger_s: float = 0.0,
                  nic: str = NIC) -> dict:
    """The drop incast replayed through the emulator's own point-to-point path, in one
    process, no cluster: sender s (from 1) sends `nbytes` to one receiver at (s - 1) x
    `stagger_s`, through its NIC (`LinkModel`) and the receiver's port with a buffer of
    `limit` packets (`SharedPorts.deliver`: the ports, then TCP's recovery), the messages in
    send order as the backend places them. Returns `lost` (per sender, the segments the
    port dropped before any resend, numbered from 1), `done` (per sender, when its message
    is delivered, s after the first send) and `time_s` (the last delivery)."""
    import os
    import tempfile

    from ..fabric import SharedPorts, cross_path
    from ..link import LinkModel
    from ..wire import SEGMENT_BYTES

    spec = as_netem(nic)
    topo = Topology.build(senders + 1, 1, nic, fabric=incast_fabric(senders + 1, limit=limit,
                                                                    nic=nic))
    specs = topo.port_specs()
    payload = segments(nbytes, SEGMENT_BYTES)
    lost, done = [], []
    with tempfile.TemporaryDirectory() as tmp:
        ports = SharedPorts(os.path.join(tmp, "ports"), specs)
        try:
            for s in range(1, senders + 1):
                now = round((s - 1) * stagger_s * 1e9)
                sent = LinkModel(spec, segment_bytes=SEGMENT_BYTES).transmit(now, nbytes)
                path, back = (p[p >= 0] for p in (topo.paths([s], [0])[0],
                                                   topo.paths([0], [s])[0]))
                at_nic = np.asarray(sent.segment_ns, dtype=np.int64).reshape(1, -1)
                # the port's first pass on a copy of its state: what it drops before TCP resends
                first = cross_path(ports.state.copy(), specs, path.reshape(1, -1), at_nic,
                                   payload, np.zeros(1), None)
                lost.append((np.flatnonzero(first[0] < 0) + 1).tolist())
                done.append(ports.deliver(path, now, sent.segment_ns, payload, nic=spec,
                                          back_ns=spec.delay_ns + ports.back_ns(back),
                                          flow=s) / 1e9)
        finally:
            ports.close()
    return {"lost": lost, "done": done, "time_s": max(done)}


# --- plots -------------------------------------------------------------------------------------


def slowed(rows: Sequence[dict], *, factor: float = BUSY_FACTOR) -> str | None:
    """The evidence for `conclude(busy=...)` that this machine set the time: a phrase naming
    the rows whose best run took more than `factor` times its closed form (the emulated
    network never delivers late by that much on its own), or None."""
    return beyond_closed_form(((r["best"], getattr(r["model"], "time_s", r["model"]))
                               for r in rows), factor=factor)


def plot_incast(rows: Sequence[dict], axes=None, title: str | None = None):
    """Left: goodput per sender count, measured vs closed form, with the port's rate; right:
    the last message's queueing, inferred as best(N) - best(1) (the emulator serves whole
    messages, so that difference is the last one's wait), vs the closed form's peak wait."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.4), layout="constrained")
    n = [r["senders"] for r in rows]
    port = rows[0]["model"].goodput / rows[0]["model"].link_share * 8 / 1e6
    axes[0].plot(n, [r["goodput"] * 8 / 1e6 for r in rows], "o-", label="measured")
    axes[0].plot(n, [r["model"].goodput * 8 / 1e6 for r in rows], "k--", label="closed form")
    axes[0].axhline(port, color="0.6", lw=1, ls=":", label="port's payload rate")
    axes[0].set(xlabel="senders N", ylabel="goodput (Mbit/s)", ylim=(0, 1.15 * port),
                title="goodput into one port")
    axes[1].plot(n, [r["queue"] * 1e3 for r in rows], "o-", label="inferred: best(N) - best(1)")
    axes[1].plot(n, [r["model"].max_queue_s * 1e3 for r in rows], "k--",
                 label="closed form: (N-1) k w")
    axes[1].set(xlabel="senders N", ylabel="queueing delay (ms)", title="the port's queue")
    for ax in axes:
        ax.legend(fontsize=8, loc="lower right")
        ax.set_xticks(n)
    if title:
        axes[0].figure.suptitle(title)
    return axes


def plot_bars(rows: Sequence[dict], key, ax=None, title: str | None = None,
              replays: Sequence[tuple[float, float]] | None = None):
    """Per row, grouped by `key(row)` (an algorithm, a layout): the measured runs (bar: their
    median, whisker: fastest to slowest), when given the replay over service orders
    (`replay_range`: a hollow bar to the fastest order, black from there to the slowest),
    and the closed form."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.4))
    x = np.arange(len(rows))
    w = 0.27 if replays is not None else 0.4
    left, right = (x - w, x + w) if replays is not None else (x - w / 2, x + w / 2)
    med = np.array([r["median"] for r in rows]) * 1e3
    lo = med - np.array([min(r["times"]) for r in rows]) * 1e3
    hi = np.array([max(r["times"]) for r in rows]) * 1e3 - med
    ax.bar(left, med, w, yerr=[lo, hi], capsize=3, label="measured (median, range)")
    if replays is not None:
        fast = np.array([a for a, _ in replays]) * 1e3
        slow = np.array([b for _, b in replays]) * 1e3
        ax.bar(x, fast, w, color="white", edgecolor="k", label="replay, fastest order")
        ax.bar(x, slow - fast, w, bottom=fast, color="k", label="... to the slowest order")
    ax.bar(right, [r["model"] * 1e3 for r in rows], w, label="closed form", color="0.7")
    ax.set_xticks(x, [key(r) for r in rows], fontsize=8)
    ax.set(ylabel="time (ms)", title=title)
    ax.legend(fontsize=8, loc="upper left")
    return ax


def plot_fabrics(axes=None):
    """The two fabrics of notebook 13, drawn: a leaf-spine (2 leaves of 4 nodes, 2 spines)
    and a rail-optimised fabric (2 nodes of 2 GPUs, NIC i on rail switch i, one spine)."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 3.2), layout="constrained",
                               gridspec_kw={"width_ratios": [1.6, 1]})

    def box(ax, x, y, text, color):
        ax.text(x, y, text, ha="center", va="center", fontsize=8,
                bbox={"boxstyle": "round", "fc": color, "ec": "0.3"})

    ax = axes[0]
    spines, leaves = [(2.5, 2), (5.5, 2)], [(1.5, 1), (6.5, 1)]
    for sx, sy in spines:
        for lx, ly in leaves:
            ax.plot([sx, lx], [sy, ly], color="C3", lw=1.5)
    for leaf, (lx, ly) in enumerate(leaves):
        for i in range(4):
            nx = lx - 1.5 + i
            ax.plot([lx, nx], [ly, 0], color="0.4", lw=1)
            box(ax, nx, 0, f"node {4 * leaf + i}", "white")
        box(ax, lx, ly, f"leaf {leaf}", "lightblue")
    for k, (sx, sy) in enumerate(spines):
        box(ax, sx, sy, f"spine {k}", "moccasin")
    ax.text(4, -0.55, "red: uplinks, one per flow picked by ECMP; at o = 4 a leaf's "
            "uplinks carry 1/4 of what its nodes can send", ha="center", fontsize=7,
            color="C3")
    ax.set_title("leaf-spine: 2 leaves x 4 nodes, 2 spines", fontsize=9)
    ax = axes[1]
    box(ax, 1.5, 2, "spine", "moccasin")
    for rail in range(2):
        rx = 0.5 + 2 * rail
        ax.plot([1.5, rx], [2, 1], color="C3", lw=1.5)
        for node in range(2):
            nx = 0.2 + 2.6 * node + 0.6 * rail
            ax.plot([rx, nx], [1, 0], color=("C2", "C4")[rail], lw=1)
        box(ax, rx, 1, f"rail switch {rail}", ("C2", "C4")[rail])
    for node in range(2):
        for rail in range(2):
            box(ax, 0.2 + 2.6 * node + 0.6 * rail, 0, f"n{node}\nNIC{rail}", "white")
    ax.text(1.5, -0.55, "red: links to the spine, used only across rails", ha="center",
            fontsize=7, color="C3")
    ax.set_title("rail-optimised: NIC i of every node on rail switch i", fontsize=9)
    for ax in axes:
        ax.set_axis_off()
        ax.margins(0.08, 0.15)
    return axes


def plot_ecmp(hashing: Sequence[dict], rounds: Sequence[dict], axes=None):
    """Left: P(collision) against flows, over seeds, with the birthday problem; middle: the
    busiest uplink's mean load with balls-in-bins and perfect spreading; right: each measured
    round's time against its busiest uplink's flows, with the closed form."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(12, 3.4), layout="constrained")
    f = [r["flows"] for r in hashing]
    spines = hashing[0]["spines"]
    axes[0].plot(f, [r["collisions"] for r in hashing], "o", label="fabric's hash")
    axes[0].plot(f, [r["collision_model"] for r in hashing], "k--", lw=1,
                 label="birthday problem")
    axes[0].set(ylabel="P(two flows share an uplink)", ylim=(-0.03, 1.05),
                title=f"collisions, {hashing[0]['seeds']} seeds")
    axes[1].plot(f, [r["max_load"] for r in hashing], "s", color="C1", label="fabric's hash")
    axes[1].plot(f, [r["max_load_model"] for r in hashing], ":", color="C1",
                 label="balls in bins")
    axes[1].plot(f, [max(1, -(-x // spines)) for x in f], color="0.6", lw=1,
                 label="perfect spreading")
    axes[1].set(ylabel="flows on the busiest uplink", title="the busiest uplink")
    for ax in axes[:2]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(f, [str(x) for x in f])
        ax.set_xlabel(f"flows hashed to {spines} uplinks")
        ax.legend(fontsize=8)
    peaks = [r["peak"] for r in rounds]
    axes[2].plot(peaks, [r["best"] * 1e3 for r in rounds], "o", label="measured round")
    order = np.argsort(peaks)
    axes[2].plot(np.array(peaks)[order], np.array([r["model"] for r in rounds])[order] * 1e3,
                 "k--", label="closed form")
    axes[2].set(xlabel="flows on the busiest uplink", ylabel="round time (ms)",
                title="one round, several pairings")
    axes[2].set_xticks(sorted(set(peaks)))
    axes[2].legend(fontsize=8)
    return axes


def fabric_of(spec: str) -> str:
    """The canonical string form of a fabric (for printing)."""
    return str(as_fabric(spec))
