"""All-reduce algorithms, written out on torch.distributed point-to-point messages.

`dist.all_reduce` hides the algorithm. Here every algorithm the course compares is spelled
out with `dist.isend` / `dist.irecv`, so on a `clusterlab.Cluster` each message crosses the
emulated network on its own (its link's delay, rate and queue) and the time an algorithm
takes is the time its messages take. Read them top to bottom; they are short on purpose.

Every function sums `tensor` over all ranks of the default process group IN PLACE and
returns it, for any number of ranks p >= 1 and any tensor length (also shorter than p). The
result equals `dist.all_reduce(tensor)` up to floating-point rounding: the additions happen
in a different order.

Costs are given in the alpha-beta-gamma model (Hockney 1994, as used by Thakur, Rabenseifner
& Gropp, "Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), 2005,
cited as [TRG05]): a message of m bytes costs alpha + m*beta, reducing m bytes costs m*gamma,
n is the tensor's size in bytes and p the number of ranks. `clusterlab.models` has each
formula as a function.

Conventions used below:

* `ranks` is the list of global ranks taking part (the whole world, or the leaders of the
  nodes in the hierarchical algorithm); `me` is this rank's position in it.
* A message of zero elements is not sent at all (both sides know its size), which is what
  lets a 3-element tensor be all-reduced on 8 ranks.
* `_exchange` sends one buffer and receives another at the same time, as a rank of a ring
  or a butterfly does in each round.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

__all__ = [
    "ALGORITHMS",
    "hierarchical_allreduce",
    "hierarchical_rail_allreduce",
    "in_network_allreduce",
    "parameter_server",
    "rabenseifner_allreduce",
    "recursive_doubling_allreduce",
    "ring_allreduce",
    "tree_allreduce",
]


# --- small helpers ---------------------------------------------------------------------------


def _world() -> list[int]:
    return list(range(dist.get_world_size()))


def _bounds(n: int, parts: int) -> list[int]:
    """Offsets cutting n elements into `parts` nearly equal blocks: block i is [b[i], b[i+1])."""
    return [n * i // parts for i in range(parts + 1)]


def _send(buf: torch.Tensor, dst: int):
    """Start sending `buf` to rank dst (None when there is nothing to send)."""
    return dist.isend(buf, dst) if buf.numel() else None


def _recv(buf: torch.Tensor, src: int):
    """Start receiving into `buf` from rank src (None when there is nothing to receive)."""
    return dist.irecv(buf, src) if buf.numel() else None


def _wait(*works) -> None:
    for work in works:
        if work is not None:
            work.wait()


def _exchange(send_buf: torch.Tensor, dst: int, recv_buf: torch.Tensor, src: int) -> None:
    """Send send_buf to dst while receiving recv_buf from src; return when both are done."""
    sent = _send(send_buf, dst)
    got = _recv(recv_buf, src)
    _wait(got, sent)


def _sum_in_place(tensor: torch.Tensor, algorithm, *args) -> torch.Tensor:
    """Run `algorithm(x, *args)` on a flat contiguous view x of `tensor`; return `tensor`."""
    if dist.get_world_size() == 1 or tensor.numel() == 0:
        return tensor  # one rank, or nothing to sum: the tensor already is the sum
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    algorithm(work.view(-1), *args)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


# --- 1. parameter server -----------------------------------------------------------------------


def parameter_server(tensor: torch.Tensor, server: int = 0) -> torch.Tensor:
    """Parameter server: every worker pushes its tensor to one server, which sums and sends
    the sum back to every worker (push, reduce, pull).

    Cost with the server on one of the p ranks: the p-1 pushes converge on the server
    (incast) and its p-1 replies leave through its one NIC, so the server's link carries
    (p-1)n bytes each way: 2(alpha + (p-1)n*beta) + (p-1)n*gamma
    (`clusterlab.models.parameter_server(p - 1, n, ...)`, whose p counts the workers). The
    latency is only 2 alpha, whatever p; the bandwidth term grows linearly with p, where
    the ring's stays below 2n*beta. On an emulated network that, like `tc netem`, shapes only
    each node's EGRESS, the pushes travel on p-1 separate links and only the pull queues:
    2 alpha + p*n*beta.

    Source: Li et al., "Scaling Distributed Machine Learning with the Parameter Server",
    OSDI 2014 (architecture; one server here); costed in the model of [TRG05].
    """
    return _sum_in_place(tensor, _parameter_server, server)


def _parameter_server(x: torch.Tensor, server: int = 0) -> None:
    me, p = dist.get_rank(), dist.get_world_size()
    if not 0 <= server < p:
        raise ValueError(f"server must be a rank in 0..{p - 1}, got {server}")
    if me != server:
        _wait(_send(x, server))  # push...
        _wait(_recv(x, server))  # ...then pull the sum
        return
    workers = [r for r in range(p) if r != server]
    inbox = [torch.empty_like(x) for _ in workers]
    _wait(*[_recv(buf, w) for buf, w in zip(inbox, workers)])  # all pushes arrive
    for buf in inbox:
        x.add_(buf)
    _wait(*[_send(x, w) for w in workers])  # the pull: p-1 copies through one NIC


# --- 2. ring ------------------------------------------------------------------------------------


def ring_allreduce(tensor: torch.Tensor) -> torch.Tensor:
    """Ring all-reduce: a reduce-scatter then an all-gather around a ring, 2(p-1) steps.

    The tensor is cut into p chunks. In each of p-1 reduce-scatter steps every rank sends
    one chunk to its right neighbour and adds the chunk arriving from its left one; after
    them rank i holds the full sum of chunk i+1. In p-1 all-gather steps the summed chunks
    travel once more around the ring. Every step moves n/p bytes per rank, all links busy
    at once:  2(p-1) alpha + 2((p-1)/p) n beta + ((p-1)/p) n gamma.
    The bandwidth term is the lower bound for any all-reduce (bandwidth-optimal), but the
    latency term grows linearly with p.

    Source: Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
    workstations", JPDC 69(2), 2009; cost as in [TRG05] (ring reduce-scatter + all-gather).
    """
    return _sum_in_place(tensor, _ring, _world())


def _ring(x: torch.Tensor, ranks: list[int] | None = None) -> None:
    ranks = _world() if ranks is None else ranks
    if len(ranks) == 1:
        return
    _ring_reduce_scatter(x, ranks)
    _ring_allgather(x, ranks)


def _ring_chunks(x: torch.Tensor, ranks: list[int]):
    """(p, my position, right neighbour, left neighbour, chunk(i) -> view of block i mod p)."""
    p, me = len(ranks), ranks.index(dist.get_rank())
    b = _bounds(x.numel(), p)

    def chunk(i):
        i %= p
        return x[b[i] : b[i + 1]]

    return p, me, ranks[(me + 1) % p], ranks[(me - 1) % p], chunk


def _ring_reduce_scatter(x: torch.Tensor, ranks: list[int]) -> int:
    """p-1 ring steps over `ranks`; afterwards this rank holds the full sum of block
    (me + 1) mod p of x (the cut of `_bounds`). Returns that block's index."""
    p, me, right, left, chunk = _ring_chunks(x, ranks)
    incoming = torch.empty(-(-x.numel() // p), dtype=x.dtype)
    for step in range(p - 1):
        out, into = chunk(me - step), chunk(me - step - 1)
        got = incoming[: into.numel()]
        _exchange(out, right, got, left)
        into.add_(got)
    return (me + 1) % p


def _ring_allgather(x: torch.Tensor, ranks: list[int]) -> None:
    """p-1 ring steps over `ranks`, from the state `_ring_reduce_scatter` leaves: the
    received blocks are final, so they are copied in place."""
    p, me, right, left, chunk = _ring_chunks(x, ranks)
    for step in range(p - 1):
        _exchange(chunk(me + 1 - step), right, chunk(me - step), left)


# --- 3. recursive doubling ----------------------------------------------------------------------


def _fold_in(x: torch.Tensor, ranks: list[int]) -> tuple[list[int], int | None]:
    """For p not a power of two: ranks 1, 3, ..., 2r-1 (r = p - p') hand their tensor to
    their even neighbour and sit out. Returns the p' active ranks and this rank's index among
    them (None when this rank sits out)."""
    p, me = len(ranks), ranks.index(dist.get_rank())
    pof2 = 1 << (p.bit_length() - 1)
    extra = p - pof2
    active = ranks[0 : 2 * extra : 2] + ranks[2 * extra :]
    if me < 2 * extra:
        if me % 2:  # odd: give my data away, wait for the result in _fold_out
            _wait(_send(x, ranks[me - 1]))
            return active, None
        buf = torch.empty_like(x)
        _wait(_recv(buf, ranks[me + 1]))
        x.add_(buf)
    return active, active.index(ranks[me])


def _fold_out(x: torch.Tensor, ranks: list[int]) -> None:
    """The even partners send the final result back to the ranks that sat out."""
    p, me = len(ranks), ranks.index(dist.get_rank())
    extra = p - (1 << (p.bit_length() - 1))
    if me < 2 * extra:
        if me % 2:
            _wait(_recv(x, ranks[me - 1]))
        else:
            _wait(_send(x, ranks[me + 1]))


def recursive_doubling_allreduce(tensor: torch.Tensor) -> torch.Tensor:
    """Recursive doubling: in round k every rank swaps its WHOLE tensor with the rank 2^k
    away and adds what it receives; after lg p rounds everyone has the sum.

    Cost for p a power of two: lg p (alpha + n beta + n gamma). Few rounds, so it wins for
    small messages, but the whole tensor travels every round, so it loses for large ones.
    For other p, with p' the largest power of two below p, the p - p' extra ranks first fold
    their tensor into a partner and get the result back at the end:
    lg p' (alpha + n beta + n gamma) + 2(alpha + n beta) + n gamma.

    Source: [TRG05], section 4 (all-reduce), and MPICH's MPIR_Allreduce_intra_recursive_doubling.
    """
    return _sum_in_place(tensor, _recursive_doubling)


def _recursive_doubling(x: torch.Tensor) -> None:
    ranks = _world()
    active, v = _fold_in(x, ranks)
    if v is not None:
        buf = torch.empty_like(x)
        distance = 1
        while distance < len(active):
            _exchange(x, active[v ^ distance], buf, active[v ^ distance])
            x.add_(buf)
            distance <<= 1
    _fold_out(x, ranks)


# --- 4. Rabenseifner (recursive halving, then recursive doubling) ----------------------------


def rabenseifner_allreduce(tensor: torch.Tensor) -> torch.Tensor:
    """Rabenseifner's all-reduce: a reduce-scatter by recursive halving, then an all-gather
    by recursive doubling.

    The p' active ranks cut the tensor into p' blocks. Round 1 pairs ranks p'/2 apart: each
    keeps one half of its range, sends the other half to its partner and adds the partner's
    copy of the half it kept; the next round halves again, with ranks p'/4 apart, and so on
    until rank v owns the sum of block v. The all-gather replays the rounds backwards,
    doubling the owned range each time. Message sizes n/2, n/4, ..., n/p' sum to ((p'-1)/p')n
    in each direction: the ring's optimal bandwidth with only 2 lg p' latencies,
    2 lg p alpha + 2((p-1)/p) n beta + ((p-1)/p) n gamma for p a power of two; other p fold
    in and out as recursive doubling does (+ 2(alpha + n beta) + n gamma).

    Source: Rabenseifner, "Optimization of Collective Reduction Operations", ICCS 2004;
    [TRG05], section 4.5.
    """
    return _sum_in_place(tensor, _rabenseifner)


def _rabenseifner(x: torch.Tensor) -> None:
    ranks = _world()
    active, v = _fold_in(x, ranks)
    if v is not None:
        q = len(active)
        b = _bounds(x.numel(), q)
        lo, hi = 0, q  # the blocks this rank is still responsible for
        buf = torch.empty_like(x)
        steps = []
        distance = q >> 1
        while distance:  # reduce-scatter by recursive halving
            partner = active[v ^ distance]
            mid = (lo + hi) // 2
            if v & distance:  # I keep the upper half
                keep, give = (mid, hi), (lo, mid)
            else:
                keep, give = (lo, mid), (mid, hi)
            mine, theirs = x[b[keep[0]] : b[keep[1]]], x[b[give[0]] : b[give[1]]]
            got = buf[: mine.numel()]
            _exchange(theirs, partner, got, partner)
            mine.add_(got)
            steps.append((partner, keep, give))
            lo, hi = keep
            distance >>= 1
        for partner, keep, give in reversed(steps):  # all-gather by recursive doubling
            _exchange(x[b[keep[0]] : b[keep[1]]], partner, x[b[give[0]] : b[give[1]]], partner)
    _fold_out(x, ranks)


# --- 5. binomial tree ---------------------------------------------------------------------------


def _binomial_reduce(x: torch.Tensor, ranks: list[int]) -> None:
    """Sum x over `ranks` into ranks[0] along a binomial tree (ceil(lg p) rounds)."""
    p, me = len(ranks), ranks.index(dist.get_rank())
    buf = torch.empty_like(x)
    for k in reversed(range((p - 1).bit_length())):
        step = 1 << k
        if step <= me < 2 * step:  # my subtree is summed: hand it to my parent, done
            _wait(_send(x, ranks[me - step]))
            return
        if me < step and me + step < p:  # a child hands me its subtree's sum
            _wait(_recv(buf, ranks[me + step]))
            x.add_(buf)


def _binomial_broadcast(x: torch.Tensor, ranks: list[int]) -> None:
    """Send x from ranks[0] to every rank of `ranks` along a binomial tree."""
    p, me = len(ranks), ranks.index(dist.get_rank())
    sends = []
    for k in range((p - 1).bit_length()):
        step = 1 << k
        if me < step and me + step < p:  # I have the data: pass it on
            sends.append(_send(x, ranks[me + step]))
        elif step <= me < 2 * step:  # my turn to receive it
            _wait(_recv(x, ranks[me - step]))
    _wait(*sends)


def tree_allreduce(tensor: torch.Tensor) -> torch.Tensor:
    """Binomial-tree all-reduce: a binomial reduce to rank 0, then a binomial broadcast.

    In each round of the reduce half of the remaining ranks send their partial sum to a
    partner and drop out; the broadcast runs the same tree backwards. Both have ceil(lg p)
    rounds, each carrying the whole tensor:
    2 ceil(lg p)(alpha + n beta) + ceil(lg p) n gamma.
    Logarithmic latency like recursive doubling, but twice the rounds, and the links near
    the root carry the whole tensor in every round. (NCCL's "tree" pipelines small chunks
    through a double binary tree and does far better on bandwidth; this is the textbook one.)

    Source: [TRG05], sections 4.3 and 4.5 (binomial broadcast and reduce, short messages).
    """
    return _sum_in_place(tensor, _tree)


def _tree(x: torch.Tensor) -> None:
    ranks = _world()
    _binomial_reduce(x, ranks)
    _binomial_broadcast(x, ranks)


# --- 6. hierarchical ----------------------------------------------------------------------------


def _procs_per_node() -> int:
    """Processes per node of the running cluster (CLUSTERLAB_PROCS_PER_NODE, as torchrun's
    LOCAL_WORLD_SIZE), 1 when unset."""
    text = os.environ.get("CLUSTERLAB_PROCS_PER_NODE") or os.environ.get("LOCAL_WORLD_SIZE")
    return int(text) if text else 1


def hierarchical_allreduce(tensor: torch.Tensor, procs_per_node: int | None = None) -> torch.Tensor:
    """Hierarchical (two-level) all-reduce: reduce inside each node, ring among the node
    leaders, broadcast inside each node.

    Ranks r*P .. r*P + P-1 share node r (P = procs_per_node, contiguous as torchrun numbers
    them); the first is the node's leader. (1) binomial reduce to the leader over the fast
    intra-node links; (2) ring all-reduce among the N = p/P leaders over the network;
    (3) binomial broadcast from the leader. Only one rank per node touches the NIC, so the
    slow network sees N ranks, not p:
    ceil(lg P)(2 alpha_intra + 2 n beta_intra)
      + 2(N-1) alpha_inter + 2((N-1)/N) n beta_inter  (+ the gamma terms).

    Source: Jia et al., "Highly Scalable Deep Learning Training System with Mixed-Precision",
    arXiv:1807.11205, 2018 (hierarchical all-reduce); each stage costed as in [TRG05].
    """
    return _sum_in_place(tensor, _hierarchical, procs_per_node)


def _node_layout(procs_per_node: int | None) -> tuple[int, int, int]:
    """(processes per node, this rank, world size), the node size checked against the world."""
    ppn = procs_per_node or _procs_per_node()
    me, p = dist.get_rank(), dist.get_world_size()
    if ppn < 1 or p % ppn:
        raise ValueError(f"procs_per_node={ppn} does not divide the world size {p}")
    return ppn, me, p


def _hierarchical(x: torch.Tensor, procs_per_node: int | None = None) -> None:
    ppn, me, p = _node_layout(procs_per_node)
    node = me // ppn
    local = list(range(node * ppn, (node + 1) * ppn))  # my node's ranks; local[0] leads
    leaders = list(range(0, p, ppn))
    _binomial_reduce(x, local)
    if me == local[0]:
        _ring(x, leaders)
    _binomial_broadcast(x, local)


def hierarchical_rail_allreduce(tensor: torch.Tensor,
                                 procs_per_node: int | None = None) -> torch.Tensor:
    """Rail-style hierarchical all-reduce: reduce-scatter inside each node, all-reduce of
    each shard across nodes (per rail), all-gather inside each node.

    Ranks r*P .. r*P + P-1 share node r (P = procs_per_node); the rank of local index i on
    every node forms rail i. (1) a ring reduce-scatter inside the node cuts the tensor into
    P shards, and local rank i ends with the node's sum of one shard, the same shard on every
    node; (2) the N ranks of each rail ring-all-reduce that shard over the network, all P
    rails at once; (3) a ring all-gather inside the node puts the shards back together.
    Every rank touches the network, but each carries only 1/P of the tensor, and no stage
    funnels a node's traffic through one leader. Intra-node cost
    2(P-1) alpha_intra + 2((P-1)/P) n beta_intra (bandwidth-optimal, where the leader-based
    `hierarchical_allreduce` pays 2 ceil(lg P)(alpha_intra + n beta_intra)); inter-node
    2(N-1) alpha_inter + 2((N-1)/N)(n/P) beta_inter per rail. On a node with ONE NIC shared
    by its P rails (as in `clusterlab.topology`), the rails' messages queue in it, and the
    NIC carries 2((N-1)/N) n beta_inter, as the leader-based scheme's NIC does; with one NIC
    per rail (rail-optimised clusters: GPU i of every node on NIC i and switch i), each NIC
    carries 1/P of that.

    Models: the 2D-torus all-reduce of Mikami et al., "Massively Distributed SGD:
    ImageNet/ResNet-50 Training in a Flash", arXiv:1811.05233, 2018 (reduce-scatter,
    all-reduce along the other dimension, all-gather); Horovod's hierarchical all-reduce
    (HOROVOD_HIERARCHICAL_ALLREDUCE: NCCL reduce-scatter in the node, an all-reduce across
    nodes per local rank, NCCL all-gather); the per-rail traffic of NVIDIA's rail-optimised
    DGX SuperPOD networks. NCCL itself reaches the same traffic pattern differently: its
    rings and trees run through every GPU of a node over NVLink and leave each node through
    several NICs (one channel per NIC), not through one leader. Each stage costed as in
    [TRG05].
    """
    return _sum_in_place(tensor, _hierarchical_rail, procs_per_node)


def _hierarchical_rail(x: torch.Tensor, procs_per_node: int | None = None) -> None:
    ppn, me, p = _node_layout(procs_per_node)
    node, i = divmod(me, ppn)
    local = list(range(node * ppn, (node + 1) * ppn))
    rail = list(range(i, p, ppn))  # local rank i of every node
    if ppn == 1:
        _ring(x, rail)
        return
    b = _bounds(x.numel(), ppn)
    shard = _ring_reduce_scatter(x, local)  # the same shard index on every node
    _ring(x[b[shard] : b[shard + 1]], rail)
    _ring_allgather(x, local)


# name -> function(tensor) -> tensor; the names match clusterlab.models / schedule where they
# exist ("hierarchical", "hierarchical_rail" and "parameter_server" as in the course's tables).
ALGORITHMS = {
    "parameter_server": parameter_server,
    "ring": ring_allreduce,
    "recursive_doubling": recursive_doubling_allreduce,
    "rabenseifner": rabenseifner_allreduce,
    "tree": tree_allreduce,
    "hierarchical": hierarchical_allreduce,
    "hierarchical_rail": hierarchical_rail_allreduce,
}


# --- 8. in-network reduction: a switch that adds ------------------------------------------------


def in_network_allreduce(tensor: torch.Tensor, switch: int | None = None,
                         chunks: int = 16) -> torch.Tensor:
    """All-reduce through a reducing switch, as InfiniBand SHARP and NVSwitch NVLS do it.

    One rank, `switch` (default: the last), plays the switch and is NOT a worker: its
    tensor is not summed in (it is overwritten with the sum). Every worker sends its tensor
    to the switch once and receives the sum once, in `chunks` pieces so that the way up and
    the way down overlap (a switch reduces packets as they stream; here a chunk at a time).
    The switch adds chunk k as soon as every worker's chunk k has arrived and sends it back
    to every worker.

    On a network where each of the switch's ports to a worker is its own link at the NIC's
    rate (`experiments.allreduce_and_topology.switch_links`), each worker's NIC carries n up
    and its switch port n down: 2 alpha + (1 + 1/chunks) n beta whatever the number of
    workers, against the ring's 2(p-1) alpha + 2((p-1)/p) n beta, whose bandwidth term is
    the lower bound only when the reductions happen at the endpoints.

    What it leaves out of a real switch: the reduction is a Python process adding tensors
    (no ASIC), a chunk is stored whole before it is added (a switch adds per packet), its
    buffer is unbounded, and there is one switch (SHARP builds a tree of switches).
    """
    if dist.get_world_size() < 2 or tensor.numel() == 0:
        return tensor
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    _in_network(work.view(-1), switch, chunks)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


def _in_network(x: torch.Tensor, switch: int | None, chunks: int) -> None:
    me, p = dist.get_rank(), dist.get_world_size()
    switch = p - 1 if switch is None else switch
    if not 0 <= switch < p:
        raise ValueError(f"switch must be a rank in 0..{p - 1}, got {switch}")
    if not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"chunks must be an integer >= 1, got {chunks!r}")
    b = _bounds(x.numel(), min(chunks, x.numel()))
    pieces = range(len(b) - 1)
    if me != switch:
        mine = x.clone()  # sent while the sum arrives into x
        sends = [_send(mine[b[k] : b[k + 1]], switch) for k in pieces]
        _wait(*[_recv(x[b[k] : b[k + 1]], switch) for k in pieces], *sends)
        return
    workers = [r for r in range(p) if r != switch]
    inbox = [torch.empty_like(x) for _ in workers]
    arriving = [[_recv(buf[b[k] : b[k + 1]], w) for buf, w in zip(inbox, workers)]
                for k in pieces]  # every receive posted up front, as a switch's ports are
    sends = []
    for k in pieces:
        _wait(*arriving[k])
        piece = x[b[k] : b[k + 1]]
        piece.copy_(inbox[0][b[k] : b[k + 1]])
        for buf in inbox[1:]:
            piece.add_(buf[b[k] : b[k + 1]])
        sends += [_send(piece, w) for w in workers]  # one port per worker: they overlap
    _wait(*sends)
