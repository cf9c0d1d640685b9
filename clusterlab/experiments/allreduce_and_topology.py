"""Experiments of notebook 02: all-reduce algorithms and topology, measured against models.

Every measurement starts a real `clusterlab.Cluster` (one OS process per rank, Gloo, the
"netem" backend) and times one of the algorithms of `clusterlab.collectives`, whose every
message crosses the emulated network on its own. Each measurement comes with two
predictions:

* model: the closed form of `clusterlab.models` (alpha-beta), with alpha = the configured
  delay and beta = the wire time of one payload byte, headers included;
* replay: `clusterlab.schedule.play`, the simulator's round-by-round replay of the same
  algorithm over the same link model (the engine the backend uses for `dist.all_reduce`).

Times are in seconds, sizes in bytes. Results are plain lists of dicts, one per
(configuration, algorithm, size), which `format_table` prints and the notebook plots.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

import numpy as np

from .. import models
from ..netem import Netem, as_netem
from ..schedule import Collective, QueueState, play
from ..timing import durations
from ..topology import Topology
from ..wire import SEGMENT_BYTES, wire_beta

KiB, MiB = 1024, 1024 * 1024

# The default network: 5 ms one-way latency and a 200 Mbit/s NIC per node. Chosen so that
# 4 KiB is latency-bound (n*beta = 0.17 ms << alpha), 4 MiB bandwidth-bound (n*beta = 168 ms),
# one round of latency stands well above this machine's scheduling noise (a few ms when two
# cores run eight ranks), and every experiment of the notebook fits its time budget.
NIC = "delay 5ms rate 200mbit"
SIZES = (4 * KiB, 256 * KiB, 4 * MiB)
# A node's internal link in the topology experiments: 50x the NIC's rate, 1/50 its latency.
INTRA = "delay 100us rate 10gbit"

P2P_ALGORITHMS = ("parameter_server", "ring", "recursive_doubling", "rabenseifner", "tree",
                  "hierarchical", "hierarchical_rail")
FLAT_ALGORITHMS = P2P_ALGORITHMS[:5]  # the ones that ignore nodes (notebook 02's first table)
LIBRARY_ALGORITHMS = ("ring", "recursive_doubling", "rabenseifner", "tree", "hierarchical",
                      "hierarchical_rail")
LABELS = {
    "in_network": "switch reduces (in-network)",
    "parameter_server": "parameter server",
    "ring": "ring",
    "recursive_doubling": "recursive doubling",
    "rabenseifner": "Rabenseifner",
    "tree": "binomial tree",
    "hierarchical": "hierarchical (leader)",
    "hierarchical_rail": "hierarchical (rails)",
}


# --- predictions -------------------------------------------------------------------------------


def alpha_beta(spec: str | Netem | None) -> tuple[float, float]:
    """(alpha, beta) of a netem spec: alpha = delay (s), beta = s per payload byte.

    beta = 8 / rate x (65536 + 66) / 65536: every 64 KiB segment carries 66 bytes of
    Ethernet/IP/TCP headers on the wire. No rate means beta = 0 (an infinitely fast link).
    """
    net = as_netem(spec) or Netem()
    alpha = net.delay_ns / 1e9
    beta = wire_beta(net.rate_bps)
    return alpha, beta


def parameter_server_egress(p: int, n: float, alpha: float, beta: float) -> float:
    """The parameter server on a network shaped at each node's egress (as `tc netem` is).

    The p-1 workers push on their own NICs at the same time (alpha + n beta); the server's
    p-1 replies queue in its one NIC (alpha + (p-1) n beta): 2 alpha + p n beta. The
    textbook cost `models.parameter_server(p - 1, n, alpha, beta)` = 2(alpha + (p-1) n beta)
    also charges the pushes to the server's link: its receive side, which netem does not
    shape (on a real cluster the switch port in front of the server does).
    """
    if p == 1:
        return 0.0
    return 2 * alpha + p * n * beta


def predict(
    algorithm: str,
    nbytes: int,
    nodes: int,
    procs_per_node: int = 1,
    nic: str | None = NIC,
    intra: str | None = None,
) -> float:
    """The closed-form time (s) of `algorithm` on nodes x procs_per_node ranks.

    On one node every message takes the intra-node link. On several nodes of one process the
    flat algorithms are costed with the NIC for every round. On several nodes of several
    processes the ring and recursive doubling are costed on their layout, with both links
    (`flat_on_layout`); the other flat algorithms with the NIC for every round, as if each
    round waited for its slowest link (an upper bound; the replay knows better).
    Hierarchical is costed with both links.
    """
    p = nodes * procs_per_node
    a, b = alpha_beta(nic if nodes > 1 else intra)
    if algorithm == "parameter_server":
        return parameter_server_egress(p, nbytes, a, b)
    if algorithm in ("ring", "recursive_doubling") and nodes > 1 and procs_per_node > 1:
        ai, bi = alpha_beta(intra)
        return flat_on_layout(algorithm, nodes, procs_per_node, nbytes, ai, bi, a, b)
    if algorithm in ("hierarchical", "hierarchical_rail"):
        ai, bi = alpha_beta(intra)
        cost = models.hierarchical_allreduce if algorithm == "hierarchical" else hierarchical_rail
        return cost(nodes, procs_per_node, nbytes, ai, bi, a, b)
    return models.allreduce_time(algorithm, p, nbytes, a, b)


def flat_on_layout(algorithm: str, nodes: int, procs_per_node: int, n: float,
                   alpha_intra: float, beta_intra: float, alpha: float, beta: float) -> float:
    """Closed form (s) of the ring or recursive doubling over all p = N P ranks of N = `nodes`
    nodes of P = `procs_per_node` processes, ranks numbered node by node, each node with one
    NIC (alpha, beta) and a link inside it (alpha_intra, beta_intra).

    Ring: of the p hops around the ring N cross a NIC (each node's last process sends to the
    next node) and the others stay inside a node. Its time is the larger of two bounds:

      chain  2(p-1) [ (alpha + (n/p) beta) / P + (1 - 1/P)(alpha_intra + (n/p) beta_intra) ]
             rank r's step s waits for rank r-1's step s-1, so a chain of 2(p-1) steps
             crosses a NIC on one hop in P;
      NIC    2((p-1)/p) n beta + alpha
             each node's NIC sends one chunk of n/p per step, 2(p-1) of them back to back
             when the next chunk is ready in time, plus one latency for the last.

    With P = 1 the chain is the 4 x 1 formula, 2(p-1)(alpha + (n/p) beta), and the larger.

    Recursive doubling (p, N and P powers of two): its lg P rounds at distances below P stay
    inside the node, alpha_intra + n beta_intra each; its lg N rounds at distances P and above
    cross the NIC with all P processes of the node sending n through it, alpha + P n beta.
    """
    N, P = nodes, procs_per_node
    p = N * P
    if algorithm == "ring":
        chain = 2 * (p - 1) * ((alpha + n / p * beta) / P
                               + (1 - 1 / P) * (alpha_intra + n / p * beta_intra))
        nic = 2 * (p - 1) / p * n * beta + alpha
        return max(chain, nic)
    if algorithm == "recursive_doubling":
        lg_p, lg_n = P.bit_length() - 1, N.bit_length() - 1
        if 2**lg_p != P or 2**lg_n != N:
            raise ValueError("recursive doubling on a layout needs nodes and procs_per_node "
                             "powers of two")
        return lg_p * (alpha_intra + n * beta_intra) + lg_n * (alpha + P * n * beta)
    raise ValueError(f"no layout closed form for {algorithm!r}")


def hierarchical_rail(nodes: int, procs_per_node: int, n: float, alpha_intra: float,
                      beta_intra: float, alpha_inter: float, beta_inter: float, *,
                      nics_per_node: int = 1) -> float:
    """Closed form (s) of the rail-style hierarchical all-reduce
    (`collectives.hierarchical_rail_allreduce`), N = nodes, P = procs_per_node:

        2(P-1)(alpha_intra + (n/P) beta_intra)                 reduce-scatter + all-gather
      + 2(N-1)(alpha_inter + (P/nics) (n/(P N)) beta_inter)    P rails, ring of N each

    Each of the 2(N-1) inter-node rounds sends a shard's 1/N, n/(P N) bytes, on every rail;
    the P rails share a node's `nics_per_node` NICs, whose delay overlaps (netem's delay does
    not occupy the link) while their bytes queue. One NIC per node (clusterlab's topology):
    the NIC carries n/N per round, as the leader-based scheme's leader does. One NIC per
    rail (nics_per_node = P): n/(P N). Bandwidth terms of TRG05's ring stages; gamma left out.
    """
    P, N = procs_per_node, nodes
    if P < 1 or N < 1 or nics_per_node < 1:
        raise ValueError("nodes, procs_per_node and nics_per_node must be >= 1")
    queued = -(-P // nics_per_node)  # rails sharing one NIC
    intra = 2 * (P - 1) * (alpha_intra + n / P * beta_intra)
    inter = 2 * (N - 1) * (alpha_inter + queued * n / (P * N) * beta_inter)
    return intra + inter


def replay(
    algorithm: str,
    nbytes: int,
    nodes: int,
    procs_per_node: int = 1,
    nic: str | None = NIC,
    intra: str | None = None,
    seed: int = 0,
) -> float:
    """The simulator's time (s): `clusterlab.schedule.play` replays the algorithm's rounds
    over the link model, all ranks entering at 0; the last rank's finish.

    The parameter server has no schedule in the backend; it is replayed here with the same
    `QueueState`, as its two rounds: p-1 pushes to rank 0, then rank 0's p-1 replies.
    """
    topology = Topology.build(nodes, procs_per_node, nic, intra)
    fabric = QueueState(topology, segment_bytes=SEGMENT_BYTES)
    rng = np.random.default_rng(seed)
    p = topology.world_size
    start = np.zeros(p, dtype=np.int64)
    if algorithm != "parameter_server":
        return float(play(fabric, Collective("allreduce", nbytes, algorithm=algorithm), start,
                          rng).max()) / 1e9
    if p == 1:
        return 0.0
    workers = np.arange(1, p)
    server = np.zeros(p - 1, dtype=np.int64)
    pushed = fabric.deliver(workers, server, start[workers], nbytes, rng).max()
    pulled = fabric.deliver(server, workers, np.full(p - 1, pushed), nbytes, rng)
    return float(pulled.max()) / 1e9


# --- measurements ------------------------------------------------------------------------------


def _timed_runs(plan, library: bool):
    """On every rank: run each (algorithm, nbytes, repeats) of `plan` and note when this rank
    entered and left every repetition (seconds, the shared clock). A first, untimed run of a
    small message per item opens the connections the algorithm uses."""
    import torch
    import torch.distributed as dist

    from .. import clock
    from ..collectives import ALGORITHMS

    out = []
    for algorithm, nbytes, repeats in plan:
        run = (lambda t: dist.all_reduce(t)) if library else ALGORITHMS[algorithm]
        run(torch.ones(1024))
        spans = []
        for _ in range(repeats):
            x = torch.ones(max(1, nbytes // 4))
            dist.barrier()
            t0 = clock.now()
            run(x)
            t1 = clock.now()
            spans.append((t0, t1))
            if float(x[0]) != dist.get_world_size():
                raise AssertionError(f"{algorithm}: wrong sum {float(x[0])}")
        out.append(spans)
    return out


def _durations(per_rank_spans) -> list[list[float]]:
    """Per plan item, per repetition: from the first rank entering to the last rank leaving.

    Every message chain of an algorithm starts when some rank enters, so this duration is
    never shorter than the algorithm's critical path on the configured network; ranks that
    leave the barrier late (scheduling noise) can only lengthen it.
    """
    return [durations([rank[k] for rank in per_rank_spans], since="first").tolist()
            for k in range(len(per_rank_spans[0]))]


def _entry_spreads(per_rank_spans, k: int) -> list[float]:
    """Per repetition of plan item k: the last rank's entry minus the first rank's (s).

    The ranks leave the barrier before each repetition at different times (on the "netem"
    backend the barrier is itself replayed over the emulated links), and a duration starts
    at the first entry, so up to this much of it can be waiting for the last rank to start:
    a cost of the measurement that no closed form, which starts every rank together, counts.
    """
    return [max(rank[k][j][0] for rank in per_rank_spans)
            - min(rank[k][j][0] for rank in per_rank_spans)
            for j in range(len(per_rank_spans[0][k]))]


def _repeats_for(nbytes: int, repeats: int | None, big_repeats: int) -> int:
    if repeats is not None:
        return repeats
    # Small messages are cheap and, relative to their time, noisy: take more of them.
    return 7 if nbytes <= 256 * KiB else big_repeats


def cluster(
    nodes: int = 4,
    procs_per_node: int = 1,
    nic: str | None = NIC,
    intra: str | None = None,
    seed: int = 0,
    timeout: float = 60,
):
    """A `clusterlab.Cluster` to pass to several `measure` calls (it starts on first use and
    stays up, which saves a process start per call; `close()` it when done)."""
    from ..cluster import Cluster

    return Cluster(nodes=nodes, procs_per_node=procs_per_node, nic=nic, intra=intra, seed=seed,
                   timeout=timeout)


def measure(
    algorithms: Sequence[str] = P2P_ALGORITHMS,
    sizes: Iterable[int] = SIZES,
    nodes: int = 4,
    procs_per_node: int = 1,
    nic: str | None = NIC,
    intra: str | None = None,
    repeats: int | None = None,
    library: bool = False,
    seed: int = 0,
    timeout: float = 60,
    big_repeats: int = 5,
    on=None,
) -> list[dict]:
    """Time all-reduce algorithms on a real emulated cluster; predict each with the closed
    form and the replay.

    library=False times the point-to-point implementations of `clusterlab.collectives`;
    library=True times the backend's own `dist.all_reduce`, one cluster per algorithm
    (`Cluster(algorithm=...)`), as the "library" baseline (no parameter server there).
    on: a running (or startable) Cluster to use instead of starting one; its topology
    replaces nodes, procs_per_node, nic, intra and seed.

    Repetitions: `repeats` for every size if given, else 7 up to 256 KiB and `big_repeats`
    (5) above: enough for a best and a median; tables print the count. Each row: config,
    algorithm, nbytes, p, times (every repetition, s), best (the
    fastest repetition), median, measured (= best), model, replay, algbw and busbw (bytes/s,
    from `measured`), entry_spreads (per repetition, how far apart the ranks entered the
    call, s: `_entry_spreads`) and best_spread (that of the best repetition).

    Why the best repetition: the emulated network never delivers a message early, so
    everything this machine adds (other processes, two cores shared by all ranks) can only
    make a repetition slower. The fastest one is the closest to what the network costs.
    """
    from ..cluster import Cluster

    if on is not None:
        if library:
            raise ValueError("library=True starts its own cluster per algorithm; drop `on`")
        topo = on.topology
        nodes, procs_per_node, nic, intra = topo.nodes, topo.procs_per_node, topo.nic, topo.intra
        seed = on.seed
    sizes = list(sizes)
    plan = [(a, n, _repeats_for(n, repeats, big_repeats)) for a in algorithms for n in sizes]
    # The library's algorithm is a property of the cluster: one cluster per algorithm.
    groups = [[item for item in plan if item[0] == a] for a in algorithms] if library else [plan]
    rows = []
    for group in groups:
        if on is not None:
            spans = on.run(_timed_runs, group, library)
        else:
            algorithm = group[0][0] if library else "ring"
            with Cluster(nodes=nodes, procs_per_node=procs_per_node, nic=nic, intra=intra,
                         seed=seed, timeout=timeout, algorithm=algorithm) as cl:
                spans = cl.run(_timed_runs, group, library)
        for k, ((name, nbytes, _), times) in enumerate(zip(group, _durations(spans))):
            rows.append(_row(name, nbytes, nodes, procs_per_node, nic, intra, times, library,
                             seed, entry_spreads=_entry_spreads(spans, k)))
    return rows


def _row(algorithm, nbytes, nodes, procs_per_node, nic, intra, times, library, seed, *,
         entry_spreads=None) -> dict:
    p = nodes * procs_per_node
    best = min(times)
    nbytes_sent = max(1, nbytes // 4) * 4
    spreads = {} if entry_spreads is None else {
        "entry_spreads": list(entry_spreads),
        "best_spread": entry_spreads[min(range(len(times)), key=times.__getitem__)]}
    return {**spreads,
        "config": f"{nodes}x{procs_per_node}",
        "nodes": nodes,
        "procs_per_node": procs_per_node,
        "p": p,
        "algorithm": algorithm,
        "library": library,
        "nbytes": nbytes_sent,
        "times": list(times),
        "best": best,
        "median": statistics.median(times),
        "measured": best,
        "model": predict(algorithm, nbytes_sent, nodes, procs_per_node, nic, intra),
        "replay": replay(algorithm, nbytes_sent, nodes, procs_per_node, nic, intra, seed),
        "algbw": models.alg_bandwidth(nbytes_sent, best),
        "busbw": models.bus_bandwidth("all_reduce", p, nbytes_sent, best) if p > 1 else 0.0,
    }


def _paired_runs(algorithm: str, sizes, repeats: int):
    """On every rank: per size, `repeats` pairs of (course's point-to-point `algorithm`,
    `dist.all_reduce`), the order alternating from pair to pair so that a slow spell of the
    machine hits both sides alike. Spans (entry, exit) on the shared clock."""
    import torch
    import torch.distributed as dist

    from .. import clock
    from ..collectives import ALGORITHMS

    sides = {"p2p": ALGORITHMS[algorithm], "library": lambda t: dist.all_reduce(t)}
    out = []
    for nbytes in sizes:
        for run in sides.values():  # open the connections both sides use
            run(torch.ones(1024))
        spans = {"p2p": [], "library": []}
        for k in range(repeats):
            for side in (("p2p", "library") if k % 2 == 0 else ("library", "p2p")):
                x = torch.ones(max(1, nbytes // 4))
                dist.barrier()
                t0 = clock.now()
                sides[side](x)
                spans[side].append((t0, clock.now()))
                if float(x[0]) != dist.get_world_size():
                    raise AssertionError(f"{side} {algorithm}: wrong sum {float(x[0])}")
        out.append(spans)
    return out


def p2p_vs_library(on, algorithm: str = "ring", *, sizes: Iterable[int] = (4 * KiB, 4 * MiB),
                   repeats: int = 9) -> list[dict]:
    """The same all-reduce two ways on one running cluster: the course's point-to-point
    `algorithm` (every message held by the link model) and `dist.all_reduce`, which
    completes at the later of Gloo's own finish and the replay of `algorithm`
    (`schedule.play`). `on` must replay that algorithm (`Cluster(algorithm=...)`).

    Per size: the times of both sides (s), the ratio p2p / library of every pair (run back
    to back), the ratio of the two best times, and `step_share`: the closed-form cost of one
    of the algorithm's rounds relative to its whole time (for the ring: (alpha + (n/p)
    beta) / model), the size of the smallest disagreement a wrong schedule could produce;
    model and replay as in `measure`.
    """
    configured = on.algorithm
    if configured != algorithm:
        raise ValueError(f"the cluster replays {configured!r}, not {algorithm!r}")
    topo = on.topology
    sizes = list(sizes)
    per_rank = on.run(_paired_runs, algorithm, sizes, repeats)
    rows = []
    for k, nbytes in enumerate(sizes):
        times = {side: durations([rank[k][side] for rank in per_rank], since="first").tolist()
                 for side in ("p2p", "library")}
        ratios = [a / b for a, b in zip(times["p2p"], times["library"])]
        nbytes_sent = max(1, nbytes // 4) * 4
        model = predict(algorithm, nbytes_sent, topo.nodes, topo.procs_per_node, topo.nic,
                        topo.intra)
        a, b = alpha_beta(topo.nic)
        p = topo.world_size
        step = a + -(-nbytes_sent // p) * b if algorithm == "ring" else float("nan")
        rows.append({
            "algorithm": algorithm, "nbytes": nbytes_sent, "p": p, "repeats": repeats,
            "p2p": times["p2p"], "library": times["library"], "ratios": ratios,
            "median_ratio": statistics.median(ratios), "min_ratio": min(ratios),
            "max_ratio": max(ratios), "best_ratio": min(times["p2p"]) / min(times["library"]),
            "model": model, "step_share": step / model,
            "replay": replay(algorithm, nbytes_sent, topo.nodes, topo.procs_per_node, topo.nic,
                             topo.intra, on.seed),
        })
    return rows


# --- in-network reduction: a switch that adds --------------------------------------------------

# The switch's pieces: 256 KiB each, at most 16 (4 MiB -> 16 pieces; 4 KiB -> 1).
CHUNK_BYTES, MAX_CHUNKS = 256 * KiB, 16


def in_network_chunks(nbytes: int, *, chunk_bytes: int = CHUNK_BYTES,
                      max_chunks: int = MAX_CHUNKS) -> int:
    """How many pieces `collectives.in_network_allreduce` cuts nbytes into here."""
    if chunk_bytes < 1 or max_chunks < 1:
        raise ValueError("chunk_bytes and max_chunks must be >= 1")
    return max(1, min(max_chunks, nbytes // chunk_bytes))


def switch_links(workers: int, nic: str | None = NIC) -> dict[tuple[int, int], str | None]:
    """Per-link overrides that make node `workers` a switch with one port per worker.

    Node w < workers is a worker; its NIC sends to the switch (n up). Each direction
    switch -> worker w gets its own queue with the NIC's spec: the switch's port towards w,
    so the switch sends the sum to all workers at once, each at the NIC's rate (n down).
    The switch's receive side is not shaped, as no node's is: each worker's bytes arrive at
    its own NIC's rate, which is what a switch port at line rate sees.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return {(workers, w): nic for w in range(workers)}


def in_network_time(n: float, alpha: float, beta: float, chunks: int = 1) -> float:
    """Closed form (s) of the all-reduce through a reducing switch, in `chunks` pieces.

    Piece k reaches the switch at alpha + (k+1)(n/chunks) beta (all workers send at once,
    each on its own NIC); the switch adds it and sends it down every port at once, so the last
    piece is back at 2 alpha + n beta + (n/chunks) beta, whatever the number of workers.
    Gamma (the adding) is left out, as in the other closed forms.
    """
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    return 2 * alpha + (1 + 1 / chunks) * n * beta


def _timed_in_network(sizes, repeats: int, chunk_bytes: int, max_chunks: int):
    """On every rank (the last is the switch): per size, `repeats` timed all-reduces through
    the switch; (entry, exit) spans on the shared clock. Workers check the sum."""
    import torch
    import torch.distributed as dist

    from .. import clock
    from ..collectives import in_network_allreduce

    me, world = dist.get_rank(), dist.get_world_size()
    out = []
    for nbytes in sizes:
        k = in_network_chunks(nbytes, chunk_bytes=chunk_bytes, max_chunks=max_chunks)
        in_network_allreduce(torch.ones(1024), chunks=1)  # open the connections
        spans = []
        for _ in range(repeats):
            x = torch.ones(max(1, nbytes // 4))
            dist.barrier()
            t0 = clock.now()
            in_network_allreduce(x, chunks=k)
            spans.append((t0, clock.now()))
            if me != world - 1 and float(x[-1]) != world - 1:
                raise AssertionError(f"in-network all-reduce: wrong sum {float(x[-1])}")
        out.append(spans)
    return out


def measure_in_network(workers: int = 4, sizes: Iterable[int] = (4 * MiB,), *,
                       nic: str | None = NIC, repeats: int = 5, seed: int = 0,
                       timeout: float = 60, chunk_bytes: int = CHUNK_BYTES,
                       max_chunks: int = MAX_CHUNKS) -> list[dict]:
    """Time `collectives.in_network_allreduce` on `workers` nodes plus one switch node whose
    every port to a worker is its own link at the NIC's spec (`switch_links`).

    Rows as `measure`'s (config "<workers>+switch", algorithm "in_network", p = workers),
    timed over the workers only (first worker in, last worker out); model =
    `in_network_time` with the pieces used; no replay (nan): the backend has no schedule for
    a switch. busbw is computed with the all-reduce factor 2(p-1)/p like every other row,
    which assumes the reductions happen at the endpoints; here they do not.
    """
    from ..cluster import Cluster

    _check_switch_args(workers, repeats)
    sizes = list(sizes)
    with Cluster(nodes=workers + 1, nic=nic, links=switch_links(workers, nic), seed=seed,
                 timeout=timeout) as cl:
        spans = cl.run(_timed_in_network, sizes, repeats, chunk_bytes, max_chunks)
    a, b = alpha_beta(nic)
    rows = []
    for k, nbytes in enumerate(sizes):
        times = durations([rank[k] for rank in spans[:workers]], since="first").tolist()
        rows.append(_switch_row(nbytes, workers, times, a, b, chunk_bytes, max_chunks))
    return rows


def _check_switch_args(workers: int, repeats: int) -> None:
    if workers < 2:
        raise ValueError(f"workers must be >= 2, got {workers}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")


def _switch_row(nbytes: int, workers: int, times: list, a: float, b: float,
                chunk_bytes: int, max_chunks: int) -> dict:
    """One row, as `measure`'s, for an all-reduce through the reducing switch."""
    nbytes_sent = max(1, nbytes // 4) * 4
    best = min(times)
    chunks = in_network_chunks(nbytes, chunk_bytes=chunk_bytes, max_chunks=max_chunks)
    return {
        "config": f"{workers}+switch", "nodes": workers + 1, "procs_per_node": 1,
        "p": workers, "algorithm": "in_network", "library": False, "nbytes": nbytes_sent,
        "chunks": chunks, "times": times, "best": best,
        "median": statistics.median(times), "measured": best,
        "model": in_network_time(nbytes_sent, a, b, chunks), "replay": float("nan"),
        "algbw": models.alg_bandwidth(nbytes_sent, best),
        "busbw": models.bus_bandwidth("all_reduce", workers, nbytes_sent, best),
    }


def _timed_ring_vs_switch(sizes, repeats: int, workers: int, chunk_bytes: int, max_chunks: int):
    """On every rank of a `workers` + switch cluster: per size, `repeats` pairs of (the ring
    among the workers, the all-reduce through the switch), the order alternating from pair to
    pair so that a slow spell of this machine falls on both. Per size, (ring spans, switch
    spans) of (entry, exit) on the shared clock; the switch rank idles during the ring."""
    import torch
    import torch.distributed as dist

    from .. import clock
    from ..collectives import _ring, in_network_allreduce

    me, world = dist.get_rank(), dist.get_world_size()
    ring_ranks = list(range(workers))

    def ring(x):
        if me in ring_ranks:
            _ring(x, ring_ranks)

    out = []
    for nbytes in sizes:
        k = in_network_chunks(nbytes, chunk_bytes=chunk_bytes, max_chunks=max_chunks)
        switch = lambda x, k=k: in_network_allreduce(x, chunks=k)  # noqa: E731
        ring(torch.ones(1024))  # open the connections
        switch(torch.ones(1024))
        spans = {"ring": [], "switch": []}
        for rep in range(repeats):
            order = ("ring", "switch") if rep % 2 == 0 else ("switch", "ring")
            for name in order:
                x = torch.ones(max(1, nbytes // 4))
                dist.barrier()
                t0 = clock.now()
                (ring if name == "ring" else switch)(x)
                spans[name].append((t0, clock.now()))
                if me != world - 1 and float(x[-1]) != workers:
                    raise AssertionError(f"{name}: wrong sum {float(x[-1])}")
        out.append((spans["ring"], spans["switch"]))
    return out


def ring_vs_switch(workers: int = 4, sizes: Iterable[int] = (4 * MiB,), *,
                   nic: str | None = NIC, repeats: int = 7, seed: int = 0, timeout: float = 60,
                   chunk_bytes: int = CHUNK_BYTES, max_chunks: int = MAX_CHUNKS) -> list[dict]:
    """The ring and the all-reduce through a reducing switch, measured like with like: on the
    same cluster (`workers` nodes plus the switch node of `measure_in_network`), the same
    number of repetitions, in interleaved order (ring, switch, then switch, ring, ...).

    The ring runs `collectives`' ring among the workers only, over their NICs (the switch's
    links are not on its path): its closed form and replay are those of a `workers` x 1 ring.
    Rows as `measure`'s; the ring's config is "<workers>x1", the switch's "<workers>+switch".
    """
    from ..cluster import Cluster

    _check_switch_args(workers, repeats)
    sizes = list(sizes)
    with Cluster(nodes=workers + 1, nic=nic, links=switch_links(workers, nic), seed=seed,
                 timeout=timeout) as cl:
        spans = cl.run(_timed_ring_vs_switch, sizes, repeats, workers, chunk_bytes, max_chunks)
    a, b = alpha_beta(nic)
    rows = []
    for k, nbytes in enumerate(sizes):
        ring_times, switch_times = (
            durations([rank[k][j] for rank in spans[:workers]], since="first").tolist()
            for j in (0, 1))
        rows.append(_row("ring", nbytes, workers, 1, nic, None, ring_times, False, seed))
        rows.append(_switch_row(nbytes, workers, switch_times, a, b, chunk_bytes, max_chunks))
    return rows


# --- presentation ------------------------------------------------------------------------------


def human_bytes(n: float) -> str:
    """4096 -> '4 KiB', 4194304 -> '4 MiB'."""
    for unit, size in (("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n:.0f} B"


def select(rows: Sequence[dict], **where) -> list[dict]:
    """The rows whose fields equal every keyword given, e.g. select(rows, algorithm="ring")."""
    return [r for r in rows if all(r[k] == v for k, v in where.items())]


def one(rows: Sequence[dict], **where) -> dict:
    """The single row matching `where` (ValueError if none or several)."""
    found = select(rows, **where)
    if len(found) != 1:
        raise ValueError(f"{len(found)} rows match {where}")
    return found[0]


def leaders(rows: Sequence[dict]) -> list[dict]:
    """The fastest row (by best time, "measured") and every row tied with it, fastest first.

    A row ties with the fastest when its best is at most the fastest's median plus the
    fastest's best-to-median spread: a winner is named only by a margin larger than this run's
    own noise (twice the spread between its best and its median)."""
    ranked = sorted(rows, key=lambda r: r["measured"])
    top = ranked[0]
    margin = top["median"] - top["measured"]
    return [top] + [r for r in ranked[1:] if r["measured"] <= top["median"] + margin]


def consistency(rows: Sequence[dict]) -> str:
    """One line for a notebook: the rows' best times against their closed forms.

    Every message is held for the configured link's alpha + n beta, so agreement is a
    consistency check of the emulator against its own model, not a measurement of a fabric;
    what the runs measure is what running real processes adds to each call (ranks that enter
    it apart: `_entry_spreads`; this machine's overhead)."""
    ratio = [r["measured"] / r["model"] for r in rows]
    extra = [(r["measured"] - r["model"]) * 1e3 for r in rows]
    return (f"Consistency check (the emulator against its own closed form): best/model "
            f"{min(ratio):.2f} to {max(ratio):.2f}; the runs added {min(extra):.1f} to "
            f"{max(extra):.1f} ms per call")


def format_table(rows: Sequence[dict], predictions_only: bool = False, *,
                 bandwidths: bool = False, replay: bool = True) -> str:
    """A fixed-width text table of the rows (times in ms).

    Measured rows show the best and the median repetition and `runs`, how many repetitions
    there were (a best or a median of 3 says less than one of 7; not `n`, which the course
    keeps for bytes). bandwidths=True adds algbw
    and busbw (MB/s, from the best repetition); they are defined in notebook 02b, so the
    first tables leave them out.

    A row of `measure(library=True)` is named "dist.all_reduce, replaying <algorithm>"; when
    the table mixes both kinds, the others are marked "isend/irecv" (the course's
    point-to-point implementation in `clusterlab.collectives`). A row without a replay (the
    switch of `measure_in_network`) prints "-" there.

    predictions_only=True leaves out everything measured: that table is the same on every
    machine and every run. replay=False leaves out the replay column (for the point-to-point
    algorithms of notebook 02 it only repeats the closed form).
    """
    mixed = len({bool(r.get("library")) for r in rows}) > 1
    head = ["config", "algorithm", "size", "model ms"] + (["replay ms"] if replay else [])
    if not predictions_only:
        head += ["runs", "best ms", "median ms", "best/model"]
        if bandwidths:
            head += ["algbw MB/s", "busbw MB/s"]
    lines = []
    for r in rows:
        name = LABELS.get(r["algorithm"], r["algorithm"])
        if r.get("library"):  # Gloo's all-reduce, held until the replay of this algorithm
            name = f"dist.all_reduce, replaying {name}"
        elif mixed:
            name += ", isend/irecv"
        replayed = r["replay"]
        cells = [r["config"], name, human_bytes(r["nbytes"]), f"{r['model'] * 1e3:.2f}"]
        if replay:
            cells.append("-" if replayed != replayed else f"{replayed * 1e3:.2f}")  # nan: none
        if not predictions_only:
            ratio = r["measured"] / r["model"] if r["model"] else float("nan")
            cells += [str(len(r["times"])), f"{r['measured'] * 1e3:.2f}",
                      f"{r['median'] * 1e3:.2f}", f"{ratio:.2f}"]
            if bandwidths:
                cells += [f"{r['algbw'] / 1e6:.2f}", f"{r['busbw'] / 1e6:.2f}"]
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) if lines else len(h)
              for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(  # noqa: E731
        c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(c) for c in lines])


def predictions(
    algorithms: Sequence[str],
    sizes: Iterable[int] = SIZES,
    nodes: int = 4,
    procs_per_node: int = 1,
    nic: str | None = NIC,
    intra: str | None = None,
) -> list[dict]:
    """Rows with the model and the replay only (nothing run): what to predict first."""
    rows = []
    for a in algorithms:
        for n in sizes:
            rows.append({
                "config": f"{nodes}x{procs_per_node}", "algorithm": a, "library": False,
                "nbytes": n, "p": nodes * procs_per_node,
                "model": predict(a, n, nodes, procs_per_node, nic, intra),
                "replay": replay(a, n, nodes, procs_per_node, nic, intra),
            })
    return rows


def plot_measured_vs_predicted(rows: Sequence[dict], ax=None, title: str | None = None, *,
                               log: bool = True):
    """Grouped bars per (algorithm, size): measured (best repetition, with a line up to the
    slowest), closed form, replay. Log-scaled time axis by default (sizes span three
    decades); log=False for rows of similar size, where a log axis hides a 1.3x difference."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(max(5.0, 1.0 * len(rows) + 2), 3.4))
    x = np.arange(len(rows))
    w = 0.27
    meas = np.array([r["measured"] for r in rows]) * 1e3
    hi = np.array([max(r["times"]) for r in rows]) * 1e3 - meas
    ax.bar(x - w, meas, w, yerr=[np.zeros_like(hi), hi], capsize=3,
           label="measured (best; line: slowest)", color="C0")
    ax.bar(x, [r["model"] * 1e3 for r in rows], w, label="closed form", color="C1")
    ax.bar(x + w, [r["replay"] * 1e3 for r in rows], w, label="replay (schedule.play)",
           color="C2")
    many = {key: len({r[key] for r in rows}) > 1 for key in ("algorithm", "nbytes", "config")}
    ax.set_xticks(x)
    ax.set_xticklabels(["\n".join(
        ([_wrapped(r["algorithm"])] if many["algorithm"] else [])
        + ([human_bytes(r["nbytes"])] if many["nbytes"] or not many["algorithm"] else [])
        + ([r["config"]] if many["config"] else [])) for r in rows], fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel("all-reduce time (ms)" + (", log scale" if log else ""))
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def _wrapped(algorithm: str) -> str:
    """An algorithm's label on two lines when it has two words (narrow tick labels)."""
    return LABELS.get(algorithm, algorithm).replace(" ", "\n", 1)


def plot_regimes(rows: Sequence[dict], ax=None, title: str | None = None):
    """Per message size, every algorithm's best time (its row's "measured") relative to the
    fastest best time at that size."""
    import matplotlib.pyplot as plt

    sizes = sorted({r["nbytes"] for r in rows})
    names = list(dict.fromkeys(r["algorithm"] for r in rows))
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.4))
    w = 0.8 / len(names)
    for i, name in enumerate(names):
        rel = []
        for n in sizes:
            best = min(r["measured"] for r in rows if r["nbytes"] == n)
            rel.append(one(rows, algorithm=name, nbytes=n)["measured"] / best)
        ax.bar(np.arange(len(sizes)) + (i - (len(names) - 1) / 2) * w, rel, w,
               label=LABELS.get(name, name))
    ax.axhline(1, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(sizes)))
    ax.set_xticklabels([human_bytes(n) for n in sizes])
    ax.set_ylabel("best time / fastest best (ratio)")
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def plot_bandwidths(rows: Sequence[dict], link_bytes_per_s: float, ax=None,
                    title: str | None = None):
    """algbw and busbw (MB/s) per row, against the link's payload rate 1/beta."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(max(5.0, 1.0 * len(rows) + 2), 3.4))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["algbw"] / 1e6 for r in rows], 0.4, label="algbw = n / t")
    ax.bar(x + 0.2, [r["busbw"] / 1e6 for r in rows], 0.4, label="busbw = algbw x 2(p-1)/p")
    ax.axhline(link_bytes_per_s / 1e6, color="k", ls="--", lw=1, label="link: 1/beta")
    ax.set_xticks(x)
    ax.set_xticklabels([f"{_wrapped(r['algorithm'])}\np = {r['p']}" for r in rows], fontsize=8)
    ax.set_ylabel("MB/s")
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax
