"""Closed-form cost models: predict how long a step should take, then measure it on the emulator.

Every function here is a formula you can check by hand. The course uses them in a loop:
write down the prediction, run the collective on an emulated cluster, and compare. When the
two disagree, the difference is the lesson (a straggler, an incast, a latency-bound size).

Units, everywhere in this module:

* time in seconds, sizes in bytes;
* ``alpha``: latency, in seconds per message;
* ``beta``: inverse bandwidth, in seconds per byte (``beta = 1 / bandwidth`` in bytes/s);
* ``gamma``: reduction cost, in seconds per byte reduced (e.g. one float add per 4 bytes);
* ``p``: the number of ranks taking part.

The module has four parts, in the order a learner meets them:

1. alpha-beta-gamma costs of collectives (Hockney's latency/bandwidth model extended with a
   compute term, as used by Thakur, Rabenseifner & Gropp, "Optimization of Collective
   Communication Operations in MPICH", IJHPCA 19(1), 2005);
2. the bandwidth numbers nccl-tests prints (algbw and busbw);
3. order statistics of jitter: why the slowest of p ranks sets the pace, computed with netem's
   own distribution tables so that predictions match the emulator exactly;
4. fitting alpha and beta to measured (size, time) pairs.

Every collective costs 0 for p == 1: a single rank has nobody to talk to.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from clusterlab.tables import DIST_SCALE, table

__all__ = [
    "AlphaBetaFit",
    "ALLREDUCE_CLOSED_FORMS",
    "DISTRIBUTIONS",
    "alg_bandwidth",
    "allreduce_time",
    "binomial_broadcast",
    "binomial_reduce",
    "bus_bandwidth",
    "busbw_factor",
    "checkpoint_waste",
    "delayed_gd_spectral_radius",
    "delayed_gd_stable_step",
    "expected_max",
    "expected_max_ideal",
    "fit_alpha_beta",
    "harmonic",
    "hierarchical_allreduce",
    "jitter_quantile",
    "jitter_std",
    "max_quantile",
    "max_std",
    "parameter_server",
    "rabenseifner_allreduce",
    "recursive_doubling_allgather",
    "recursive_doubling_allreduce",
    "recursive_halving_reduce_scatter",
    "ring_allgather",
    "ring_allreduce",
    "ring_allreduce_jitter",
    "ring_allreduce_steps",
    "ring_reduce_scatter",
    "straggler_step",
    "tail_at_scale",
    "tree_allreduce",
    "young_daly_interval",
]

# The all-reduce algorithms `allreduce_time` has a closed form for
# (`schedule.ALLREDUCE_SCHEDULES` names those the backend and the simulator can replay).
ALLREDUCE_CLOSED_FORMS = ("ring", "recursive_doubling", "rabenseifner", "tree",
                          "parameter_server")
DISTRIBUTIONS = ("uniform", "normal", "pareto", "paretonormal")  # netem's jitter distributions
IDEAL_DISTRIBUTIONS = ("normal", "exponential")


# ---------------------------------------------------------------------------------------------
# Input checks. Every public function validates its arguments and names the bad one, so that a
# learner who passes bandwidth where beta was expected gets told which argument is wrong.
# ---------------------------------------------------------------------------------------------


def _count(value: object, name: str, minimum: int = 1) -> int:
    """`value` as an int >= `minimum` (a rank count, a number of draws...), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def _nonnegative(value: object, name: str) -> float:
    """`value` as a finite float >= 0 (a size, alpha, beta, gamma...), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    x = float(value)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return x


def _probability(value: object, name: str) -> float:
    """`value` as a float in [0, 1], else ValueError."""
    x = _nonnegative(value, name)
    if x > 1:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return x


def _check_costs(
    p: object, n: object, alpha: object, beta: object, gamma: object = 0.0
) -> tuple[int, float, float, float, float]:
    """Validate the arguments shared by every collective model."""
    return (
        _count(p, "p"),
        _nonnegative(n, "n"),
        _nonnegative(alpha, "alpha"),
        _nonnegative(beta, "beta"),
        _nonnegative(gamma, "gamma"),
    )


def _floor_log2(p: int) -> int:
    """floor(lg p) for p >= 1, exactly (no floating point)."""
    return p.bit_length() - 1


def _ceil_log2(p: int) -> int:
    """ceil(lg p) for p >= 1, exactly: the number of rounds of a binomial tree."""
    return (p - 1).bit_length()


def _is_power_of_two(p: int) -> bool:
    return p & (p - 1) == 0


# ---------------------------------------------------------------------------------------------
# 1. alpha-beta-gamma costs of collectives.
#
# Sending one message of m bytes costs alpha + m * beta (Hockney, "The communication challenge
# for MPP", Parallel Computing 20(3), 1994); reducing m bytes costs m * gamma. A collective is a
# sequence of rounds; in each round every rank sends at most one message, so the cost of a round
# is that of its largest message. Unless stated otherwise the formulas below are those of
# Thakur, Rabenseifner & Gropp (IJHPCA 2005), cited as [TRG05].
# ---------------------------------------------------------------------------------------------


def ring_allreduce_steps(p: int) -> int:
    """Number of communication rounds of a ring all-reduce: 2(p - 1).

    p - 1 rounds of reduce-scatter followed by p - 1 rounds of all-gather, each moving one
    1/p-th chunk of the vector to the ring neighbour (Patarasuk & Yuan, "Bandwidth optimal
    all-reduce algorithms for clusters of workstations", JPDC 69(2), 2009).
    """
    return 2 * (_count(p, "p") - 1)


def ring_allreduce(p: int, n: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Ring all-reduce of n bytes: 2(p-1)α + 2((p-1)/p)nβ + ((p-1)/p)nγ.

    Why: the vector is cut into p chunks of n/p bytes. A ring reduce-scatter (p - 1 rounds,
    each sending and reducing one chunk) is followed by a ring all-gather (p - 1 rounds, each
    forwarding one reduced chunk). That is 2(p - 1) messages of n/p bytes and (p - 1) chunk
    reductions. The bandwidth term 2((p-1)/p)nβ is the lower bound for any all-reduce, so the
    ring is bandwidth-optimal, but its latency term grows linearly in p.

    Source: the sum of the ring reduce-scatter and ring all-gather costs of [TRG05];
    bandwidth optimality shown by Patarasuk & Yuan (JPDC 2009).
    """
    p, n, alpha, beta, gamma = _check_costs(p, n, alpha, beta, gamma)
    if p == 1:
        return 0.0
    frac = (p - 1) / p
    return 2 * (p - 1) * alpha + 2 * frac * n * beta + frac * n * gamma


def recursive_doubling_allreduce(
    p: int, n: float, alpha: float, beta: float, gamma: float = 0.0
) -> float:
    """Recursive-doubling all-reduce of n bytes: lg p (α + nβ + nγ) for p a power of two.

    Why: in round k every rank exchanges its whole vector with the rank 2^k away and reduces
    what it receives, so after lg p rounds everyone holds the full sum. Few rounds (good for
    small n) but the whole vector travels every round (bad for large n).

    For p not a power of two, let p' be the largest power of two <= p. The r = p - p' extra
    ranks first send their vector to a partner, which reduces it (fold-in: α + nβ + nγ); the
    p' remaining ranks run recursive doubling; the partners finally send the result back
    (fold-out: α + nβ). Total: lg p' (α + nβ + nγ) + 2(α + nβ) + nγ.

    Source: [TRG05], section 4 (all-reduce), and MPICH's implementation of it.
    """
    p, n, alpha, beta, gamma = _check_costs(p, n, alpha, beta, gamma)
    if p == 1:
        return 0.0
    rounds = _floor_log2(p)
    cost = rounds * (alpha + n * beta + n * gamma)
    if not _is_power_of_two(p):
        cost += 2 * (alpha + n * beta) + n * gamma  # fold-in and fold-out of the extra ranks
    return cost


def rabenseifner_allreduce(
    p: int, n: float, alpha: float, beta: float, gamma: float = 0.0
) -> float:
    """Rabenseifner's all-reduce of n bytes: 2 lg p α + 2((p-1)/p)nβ + ((p-1)/p)nγ.

    Why: a reduce-scatter by recursive halving (lg p rounds, message sizes n/2, n/4, ...,
    n/p, summing to ((p-1)/p)n) followed by an all-gather by recursive doubling (the same
    rounds in reverse). It has the ring's optimal bandwidth term with only 2 lg p latencies.

    For p not a power of two, p' = largest power of two <= p: the extra ranks fold in at the
    start (α + nβ + nγ) and receive the result at the end (α + nβ), as for recursive doubling,
    and the algorithm runs on p' ranks: 2 lg p' α + 2((p'-1)/p')nβ + ((p'-1)/p')nγ plus those
    two steps. (MPICH and Open MPI refine the fold-in by exchanging halves; the simple fold is
    the one costed in [TRG05].)

    Source: [TRG05], section 4.5 (Rabenseifner's algorithm).
    """
    p, n, alpha, beta, gamma = _check_costs(p, n, alpha, beta, gamma)
    if p == 1:
        return 0.0
    q = 1 << _floor_log2(p)  # p', the ranks that run the power-of-two algorithm
    frac = (q - 1) / q
    cost = 2 * _floor_log2(q) * alpha + 2 * frac * n * beta + frac * n * gamma
    if q != p:
        cost += 2 * (alpha + n * beta) + n * gamma  # fold-in and fold-out of the extra ranks
    return cost


def binomial_broadcast(p: int, n: float, alpha: float, beta: float) -> float:
    """Binomial-tree broadcast of n bytes from one root: ceil(lg p)(α + nβ).

    Why: in every round each rank that already has the data sends all of it to one rank that
    does not, so the number of informed ranks doubles: ceil(lg p) rounds of one full message.

    Source: [TRG05], section 4.3 (broadcast, short messages).
    """
    p, n, alpha, beta, _ = _check_costs(p, n, alpha, beta)
    return _ceil_log2(p) * (alpha + n * beta)


def binomial_reduce(p: int, n: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Binomial-tree reduce of n bytes to one root: ceil(lg p)(α + nβ + nγ).

    Why: the broadcast tree run backwards; in every round half of the remaining ranks send
    their partial sum and the receivers add it to theirs.

    Source: [TRG05], section 4.5 (reduce, short messages).
    """
    p, n, alpha, beta, gamma = _check_costs(p, n, alpha, beta, gamma)
    return _ceil_log2(p) * (alpha + n * beta + n * gamma)


def tree_allreduce(p: int, n: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """All-reduce as a binomial reduce followed by a binomial broadcast.

    Cost 2 ceil(lg p)(α + nβ) + ceil(lg p)nγ: the naive composition, with logarithmic latency
    but the whole vector sent 2 ceil(lg p) times. (NCCL's tree algorithm pipelines chunks
    through a double binary tree and does much better on bandwidth; this is the textbook one.)

    Source: composition of binomial_reduce and binomial_broadcast, [TRG05].
    """
    return binomial_reduce(p, n, alpha, beta, gamma) + binomial_broadcast(p, n, alpha, beta)


def ring_allgather(p: int, n: float, alpha: float, beta: float) -> float:
    """Ring all-gather; n is the size of the GATHERED result: (p-1)α + ((p-1)/p)nβ.

    Why: each rank starts with n/p bytes; in each of p - 1 rounds it forwards the block it
    received last to its neighbour.

    Source: [TRG05], section 4.1 (all-gather, ring algorithm).
    """
    p, n, alpha, beta, _ = _check_costs(p, n, alpha, beta)
    return (p - 1) * alpha + (p - 1) / p * n * beta


def recursive_doubling_allgather(p: int, n: float, alpha: float, beta: float) -> float:
    """Recursive-doubling all-gather; n = size of the gathered result: lg p α + ((p-1)/p)nβ.

    Why: in round k ranks 2^k apart exchange everything they have gathered so far, so the
    message sizes are n/p, 2n/p, 4n/p, ... and sum to ((p-1)/p)n in lg p rounds.

    For p not a power of two we charge ceil(lg p) rounds with the same bandwidth term: the
    cost of Bruck's algorithm, which MPICH uses in that case ([TRG05], section 4.1).

    Source: [TRG05], section 4.1 (all-gather, recursive doubling).
    """
    p, n, alpha, beta, _ = _check_costs(p, n, alpha, beta)
    return _ceil_log2(p) * alpha + (p - 1) / p * n * beta


def ring_reduce_scatter(p: int, n: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Ring reduce-scatter; n is the TOTAL input size per rank: (p-1)α + ((p-1)/p)n(β + γ).

    Why: p - 1 rounds; in each, a rank sends one n/p-byte partial sum to its neighbour, which
    adds its own contribution to it. After p - 1 rounds each rank owns one fully reduced block.

    Source: [TRG05], section 4.4 (reduce-scatter; their pairwise-exchange algorithm has the
    same cost).
    """
    p, n, alpha, beta, gamma = _check_costs(p, n, alpha, beta, gamma)
    return (p - 1) * alpha + (p - 1) / p * n * (beta + gamma)


def recursive_halving_reduce_scatter(
    p: int, n: float, alpha: float, beta: float, gamma: float = 0.0
) -> float:
    """Recursive-halving reduce-scatter; n = total input size: lg p α + ((p-1)/p)n(β + γ).

    Why: in round k ranks p/2^(k+1) apart exchange half of the data they are still responsible
    for (n/2, n/4, ..., n/p bytes) and reduce what they receive.

    For p not a power of two this is our model, following the same fold principle as the
    all-reduce: the extra ranks fold their full vector into a partner (α + nβ + nγ), the
    p' = 2^floor(lg p) ranks run recursive halving, and each extra rank then receives its n/p
    result block (α + (n/p)β).

    Source: [TRG05], section 4.4 (reduce-scatter, recursive halving).
    """
    p, n, alpha, beta, gamma = _check_costs(p, n, alpha, beta, gamma)
    if p == 1:
        return 0.0
    q = 1 << _floor_log2(p)
    cost = _floor_log2(q) * alpha + (q - 1) / q * n * (beta + gamma)
    if q != p:
        cost += (alpha + n * beta + n * gamma) + (alpha + n / p * beta)
    return cost


def parameter_server(
    p: int, n: float, alpha: float, beta: float, gamma: float = 0.0, servers: int = 1
) -> float:
    """Parameter-server aggregation: p workers push n-byte gradients, then pull the sum.

    The model is split over `servers` servers, each owning n/servers bytes. Every worker
    pushes its slice to every server, the server sums the p slices, and every worker pulls
    the summed slice back. A server's NIC receives p·(n/servers) bytes and then sends as many,
    one after the other, so

        t = 2(α + p·(n/servers)·β) + p·(n/servers)·γ.

    This is the incast bottleneck: p senders converge on one receive link, so the time grows
    linearly with p however fast the workers are, while a ring all-reduce stays near 2nβ.
    Adding servers divides the load, until there are more servers than workers: then each
    worker's own NIC (n bytes out, n bytes in) is the bottleneck, and we charge
    max(p, servers)·(n/servers) bytes per direction (equal to the formula above whenever
    servers <= p).

    With p == 1 we return 0 like every other collective (one worker has nothing to aggregate).

    Source: architecture of Li et al., "Scaling Distributed Machine Learning with the Parameter
    Server", OSDI 2014; the cost is the alpha-beta-gamma model of [TRG05] applied to the
    busiest NIC.
    """
    p, n, alpha, beta, gamma = _check_costs(p, n, alpha, beta, gamma)
    servers = _count(servers, "servers")
    if p == 1:
        return 0.0
    shard = n / servers
    busiest_nic_bytes = max(p, servers) * shard
    return 2 * (alpha + busiest_nic_bytes * beta) + p * shard * gamma


def hierarchical_allreduce(
    nodes: int,
    procs_per_node: int,
    n: float,
    alpha_intra: float,
    beta_intra: float,
    alpha_inter: float,
    beta_inter: float,
    gamma: float = 0.0,
) -> float:
    """Two-level all-reduce: reduce inside each node, ring across nodes, broadcast inside.

    1. binomial reduce of n bytes to a leader among the procs_per_node ranks of each node,
       over the fast intra-node links (alpha_intra, beta_intra);
    2. ring all-reduce of n bytes among the `nodes` leaders over the network
       (alpha_inter, beta_inter);
    3. binomial broadcast of the result from each leader to its node.

    Why: only one rank per node touches the slow network, so the inter-node term depends on
    the number of nodes, not on the number of ranks.

    Source: the hierarchical all-reduce of Jia et al., "Highly Scalable Deep Learning Training
    System with Mixed-Precision", arXiv:1807.11205, 2018; each stage costed as in [TRG05].
    """
    nodes = _count(nodes, "nodes")
    procs_per_node = _count(procs_per_node, "procs_per_node")
    _nonnegative(alpha_inter, "alpha_inter")
    _nonnegative(beta_inter, "beta_inter")
    _nonnegative(alpha_intra, "alpha_intra")
    _nonnegative(beta_intra, "beta_intra")
    return (
        binomial_reduce(procs_per_node, n, alpha_intra, beta_intra, gamma)
        + ring_allreduce(nodes, n, alpha_inter, beta_inter, gamma)
        + binomial_broadcast(procs_per_node, n, alpha_intra, beta_intra)
    )


def allreduce_time(
    algorithm: str, p: int, n: float, alpha: float, beta: float, gamma: float = 0.0
) -> float:
    """Predicted all-reduce time of n bytes on p ranks with the named algorithm.

    `algorithm` is one of ALLREDUCE_CLOSED_FORMS: "ring", "recursive_doubling",
    "rabenseifner", "tree" or "parameter_server" (with a single server).
    """
    models = {
        "ring": ring_allreduce,
        "recursive_doubling": recursive_doubling_allreduce,
        "rabenseifner": rabenseifner_allreduce,
        "tree": tree_allreduce,
        "parameter_server": parameter_server,
    }
    if algorithm not in models:
        raise ValueError(
            f"unknown algorithm {algorithm!r}; expected one of {ALLREDUCE_CLOSED_FORMS}")
    return models[algorithm](p, n, alpha, beta, gamma)


# ---------------------------------------------------------------------------------------------
# 2. The bandwidths printed by nccl-tests (NVIDIA/nccl-tests, doc/PERFORMANCE.md).
# ---------------------------------------------------------------------------------------------

# busbw / algbw for each collective, as a function of the number of ranks p.
_BUSBW_FACTORS = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
    "all_to_all": lambda p: (p - 1) / p,
}


def alg_bandwidth(n: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: algbw = n / seconds.

    nccl-tests: "Algorithm bandwidth is using the most commonly used formula for bandwidth:
    size (S) / time (t)." It tells you how long any large operation takes, but for a
    collective it falls as ranks are added even on perfect hardware.

    Source: NVIDIA nccl-tests, doc/PERFORMANCE.md.
    """
    n = _nonnegative(n, "n")
    seconds = _nonnegative(seconds, "seconds")
    if seconds == 0:
        raise ValueError("seconds must be > 0")
    return n / seconds


def busbw_factor(collective: str, p: int) -> float:
    """The factor busbw / algbw that nccl-tests applies for `collective` on p ranks.

    all_reduce 2(p-1)/p; all_gather, reduce_scatter and all_to_all (p-1)/p; broadcast and
    reduce 1. Each is the fraction of the data every rank's link must carry in the best
    algorithm, e.g. 2(p-1)/p for all-reduce: the ring's bandwidth term divided by nβ.

    Source: NVIDIA nccl-tests, doc/PERFORMANCE.md ("Summary").
    """
    p = _count(p, "p")
    if collective not in _BUSBW_FACTORS:
        raise ValueError(
            f"unknown collective {collective!r}; expected one of {tuple(_BUSBW_FACTORS)}"
        )
    return _BUSBW_FACTORS[collective](p)


def bus_bandwidth(collective: str, p: int, n: float, seconds: float) -> float:
    """Bus bandwidth in bytes/s: busbw = algbw × busbw_factor(collective, p).

    nccl-tests: "To provide a number which reflects how optimally the hardware is used, NCCL
    tests introduce the notion of 'Bus Bandwidth'. [...] Using this bus bandwidth, we can
    compare it with the hardware peak bandwidth, independently of the number of ranks used."
    So busbw is the number to hold against the link speed, and it is comparable across rank
    counts. n is the size nccl-tests reports (for all_gather and reduce_scatter, the total).

    Source: NVIDIA nccl-tests, doc/PERFORMANCE.md.
    """
    return alg_bandwidth(n, seconds) * busbw_factor(collective, p)


# ---------------------------------------------------------------------------------------------
# 3. Order statistics of jitter: a synchronous step waits for its slowest rank.
#
# netem draws a delay as mu + jitter * X. For "uniform", X is uniform on [-1, 1) (the kernel
# takes rnd % (2 sigma) in nanoseconds, which we treat as continuous). For the table
# distributions, X = table[u] / DIST_SCALE with u uniform over the 4096 entries: X is DISCRETE,
# uniform over the 4096 table values (so the normal is cut at about -4 and +3.5 sigma). Using
# the tables themselves makes our predictions exact for the emulator, not just for the ideal
# continuous law. The standard reference for the formulas is David & Nagaraja, "Order
# Statistics", 3rd ed., Wiley 2003 (cited as [DN03]): the max of n iid draws has CDF F^n.
# ---------------------------------------------------------------------------------------------


def _check_distribution(distribution: str) -> None:
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r}; expected one of {DISTRIBUTIONS}")


def _table_values(distribution: str) -> np.ndarray:
    """The sorted table values of `distribution` in units of sigma (float64)."""
    return np.sort(table(distribution).astype(np.float64)) / DIST_SCALE


def jitter_quantile(q: float, distribution: str = "uniform", jitter: float = 1.0) -> float:
    """The q-quantile of one netem jitter draw, in the units of `jitter`.

    uniform: -J + 2Jq on [-J, J). Tables: the smallest table value v with F(v) >= q, where
    F(v_k) = (k + 1)/4096 for the sorted values v_0 <= ... <= v_4095 (the generalised
    inverse of a discrete CDF, [DN03] section 2.4). q = 0 gives the smallest value.
    """
    q = _probability(q, "q")
    _check_distribution(distribution)
    jitter = _nonnegative(jitter, "jitter")
    if distribution == "uniform":
        return jitter * (2 * q - 1)
    values = _table_values(distribution)
    k = math.ceil(q * len(values)) - 1
    return jitter * float(values[min(max(k, 0), len(values) - 1)])


def _max_law(n: int, distribution: str) -> tuple[np.ndarray, np.ndarray]:
    """The law of the max of n iid draws from a netem table: its values (sorted table values,
    in units of sigma) and their probabilities P(max = v_k) = F_k^n - F_{k-1}^n, where
    F_k = (k + 1)/4096 ([DN03] section 2.4); exact, ties in the table included."""
    values = _table_values(distribution)
    cdf = np.arange(len(values) + 1, dtype=np.float64) / len(values)  # F_{-1}, F_0, ..., F_4095
    return values, np.diff(np.power(cdf, n))


def expected_max(n: int, distribution: str = "uniform", jitter: float = 1.0) -> float:
    """Exact E[max of n iid netem jitter draws], in the units of `jitter`.

    uniform on [-J, J): J(n - 1)/(n + 1), because the max of n uniforms on [0, 1] has mean
    n/(n + 1).

    Tables: E[max] = sum_k v_k P(max = v_k), with the law of `_max_law`. This is exact for
    the emulator, ties in the table included ([DN03] section 2.4).
    """
    n = _count(n, "n")
    _check_distribution(distribution)
    jitter = _nonnegative(jitter, "jitter")
    if distribution == "uniform":
        return jitter * (n - 1) / (n + 1)
    values, weights = _max_law(n, distribution)
    return jitter * float(np.dot(values, weights))


def max_quantile(n: int, q: float, distribution: str = "uniform", jitter: float = 1.0) -> float:
    """The q-quantile of the max of n iid netem jitter draws: jitter_quantile(q ** (1/n)).

    Why: P(max <= x) = F(x)^n ([DN03]), so max <= x with probability q exactly when
    F(x) >= q^(1/n). With 64 ranks, the median step waits for the 98.9th percentile of one
    rank's delay.
    """
    n = _count(n, "n")
    q = _probability(q, "q")
    return jitter_quantile(q ** (1.0 / n), distribution, jitter)


def _log_normal_cdf(x: np.ndarray) -> np.ndarray:
    """log Phi(x) of the standard normal, accurate in both tails (erfc avoids cancellation)."""
    erfc = np.vectorize(math.erfc, otypes=[float])
    out = np.empty_like(x)
    neg = x < 0
    out[neg] = np.log(0.5 * erfc(-x[neg] / math.sqrt(2.0)))  # Phi(x) = erfc(-x/sqrt 2) / 2
    out[~neg] = np.log1p(-0.5 * erfc(x[~neg] / math.sqrt(2.0)))  # Phi(x) = 1 - erfc(x/sqrt 2)/2
    return out


def expected_max_ideal(n: int, distribution: str = "normal") -> float:
    """E[max of n iid draws] of an ideal continuous law: "normal" (standard) or "exponential".

    normal: the integral of x · n φ(x) Φ(x)^(n-1) (the density of the max, [DN03] section
    2.1), by the trapezoidal rule on a fine grid (numpy only; scipy is optional in this
    package). Checks: n = 2 gives 1/sqrt(pi) = 0.5642, n = 3 gives 3/(2 sqrt(pi)).

    exponential (mean 1): the harmonic number H_n. By the memorylessness of the exponential,
    the gaps between successive order statistics are independent exponentials of means
    1/n, 1/(n-1), ..., 1 (Rényi's representation, [DN03] section 2.5).
    """
    n = _count(n, "n")
    if distribution not in IDEAL_DISTRIBUTIONS:
        raise ValueError(
            f"unknown distribution {distribution!r}; expected one of {IDEAL_DISTRIBUTIONS}"
        )
    if distribution == "exponential":
        return harmonic(n)
    # The max concentrates near sqrt(2 ln n); 10 sigma either side makes the tails negligible.
    hi = 10.0 + math.sqrt(2.0 * math.log(n))
    x = np.linspace(-10.0, hi, 40_001)
    log_density = (
        math.log(n) - 0.5 * x * x - 0.5 * math.log(2 * math.pi) + (n - 1) * _log_normal_cdf(x)
    )
    return float(np.trapezoid(x * np.exp(log_density), x))


def jitter_std(distribution: str = "uniform", jitter: float = 1.0) -> float:
    """Standard deviation of one netem jitter draw (uniform: J / sqrt(3); tables: exact)."""
    _check_distribution(distribution)
    jitter = _nonnegative(jitter, "jitter")
    if distribution == "uniform":
        return jitter / math.sqrt(3.0)
    return jitter * float(_table_values(distribution).std())


def max_std(n: int, distribution: str = "uniform", jitter: float = 1.0) -> float:
    """Exact standard deviation of the max of n iid netem jitter draws, in units of `jitter`.

    uniform on [-J, J): 2J sqrt(n / ((n + 1)^2 (n + 2))) (the max of n uniforms on [0, 1] is
    Beta(n, 1)). Tables: from the law of `_max_law`, as in `expected_max`.
    """
    n = _count(n, "n")
    _check_distribution(distribution)
    jitter = _nonnegative(jitter, "jitter")
    if distribution == "uniform":
        return 2 * jitter * math.sqrt(n / ((n + 1) ** 2 * (n + 2)))
    values, weights = _max_law(n, distribution)
    mean = float(np.dot(values, weights))
    return jitter * math.sqrt(max(0.0, float(np.dot((values - mean) ** 2, weights))))


def ring_allreduce_jitter(
    p: int, n: float, alpha: float, beta: float, jitter: float, distribution: str = "uniform",
    segment_bytes: float | None = None,
) -> float:
    """Ring all-reduce when every message's latency also jitters: an approximation.

    The ring is a chain of 2(p-1) rounds, each round's message forwarded only once it has
    fully arrived. A message of n/p bytes travels as s = ceil(n / (p * segment_bytes))
    segments (TCP segments, or netem packets), each delayed independently, so it arrives
    with the LAST of s draws: mean shift m_s = E[max_s] and spread sigma_s = std(max_s),
    both exact on netem's tables (`expected_max`, `max_std`). Each rank's finish is the
    longest of many paths through the rounds, each a sum of 2(p-1) such delays; treating
    the p ranks' critical paths as independent normals, the slowest finishes E[max of p
    standard normals] standard deviations late:
        T = ring_allreduce(p, n, alpha, beta) + 2(p-1) m_s + sigma_s sqrt(2(p-1)) E[max_p N(0,1)]
    (the classic Gaussian approximation of a longest path, as in PERT, Malcolm et al.,
    Operations Research 7(5), 1959). segment_bytes=None treats each message as one draw.
    The simulator replays the exact schedule and is the better predictor; this formula
    shows where the growth comes from: sqrt(p) from the chain, log-ish from the max.
    """
    base = ring_allreduce(p, n, alpha, beta)
    if p == 1 or jitter == 0:
        return base
    s = 1 if segment_bytes is None else max(1, math.ceil(n / p / segment_bytes))
    rounds = 2 * (p - 1)
    shift = expected_max(s, distribution, jitter)
    spread = max_std(s, distribution, jitter)
    return base + rounds * shift + spread * math.sqrt(rounds) * expected_max_ideal(p, "normal")


def harmonic(n: int) -> float:
    """The harmonic number H_n = 1 + 1/2 + ... + 1/n (H_0 = 0).

    Exact summation up to n = 1000, then the Euler-Maclaurin expansion
    ln n + γ + 1/(2n) - 1/(12n²) + 1/(120n⁴), whose error is below 1/(252 n⁶)
    (Knuth, The Art of Computer Programming, vol. 1, section 1.2.7).
    """
    n = _count(n, "n", minimum=0)
    if n <= 1000:
        return math.fsum(1.0 / k for k in range(1, n + 1))
    euler_gamma = 0.57721566490153286061
    return math.log(n) + euler_gamma + 1 / (2 * n) - 1 / (12 * n**2) + 1 / (120 * n**4)


def straggler_step(c: float, m: float, n: int) -> float:
    """Expected synchronous step time when n ranks each take c + Exp(mean m): c + m·H_n.

    Why: a synchronous step ends when the slowest rank ends, and the max of n independent
    exponentials of mean m has mean m·H_n ≈ m(ln n + 0.577) ([DN03] section 2.5). Doubling
    the cluster adds about m·ln 2 to every step, even though no rank got slower.
    """
    c = _nonnegative(c, "c")
    m = _nonnegative(m, "m")
    n = _count(n, "n")
    return c + m * harmonic(n)


def tail_at_scale(p: float, n: int) -> float:
    """Probability that at least one of n independent requests is slow: 1 - (1 - p)^n.

    `p` here is the probability that ONE request (or rank) is slow. With p = 1% and n = 100,
    63% of fan-out operations hit at least one slow response: rare per-server tails become
    the common case at scale.

    Source: Dean & Barroso, "The Tail at Scale", Communications of the ACM 56(2), 2013.
    """
    p = _probability(p, "p")
    n = _count(n, "n", minimum=0)
    if p == 1.0:
        return 1.0 if n > 0 else 0.0
    return -math.expm1(n * math.log1p(-p))  # 1 - (1-p)^n without cancellation for small p


def delayed_gd_stable_step(tau: int) -> float:
    """Largest a = ηλ for which gradient descent with τ-step-stale gradients is stable.

    On a quadratic with curvature λ, x_{t+1} = x_t - η λ x_{t-τ}. With a = ηλ the
    characteristic polynomial is z^(τ+1) - z^τ + a, and all its roots lie inside the unit
    circle exactly when 0 < a < 2 sin(π / (4τ + 2)). For τ = 0 this is the familiar a < 2;
    for large τ it is about π/(2τ+1): staleness forces the learning rate down like 1/τ.

    Source: Levin & May, "A note on difference-delay equations", Theoretical Population
    Biology 9(2), 1976 (stability of x_{t+1} = x_t - a x_{t-τ}); see also Kuruklis, J. Math.
    Anal. Appl. 188, 1994. delayed_gd_spectral_radius checks it numerically.
    """
    tau = _count(tau, "tau", minimum=0)
    return 2.0 * math.sin(math.pi / (4 * tau + 2))


def delayed_gd_spectral_radius(a: float, tau: int) -> float:
    """Largest |z| over the roots of z^(τ+1) - z^τ + a = 0 (stable iff < 1).

    The iteration x_{t+1} = x_t - a x_{t-τ} converges to 0 from any start exactly when this
    spectral radius is below 1; numpy.roots finds the roots as eigenvalues of the companion
    matrix.
    """
    a = _nonnegative(a, "a")
    tau = _count(tau, "tau", minimum=0)
    coefficients = np.zeros(tau + 2)  # z^(tau+1), z^tau, ..., z^0
    coefficients[0] += 1.0
    coefficients[1] -= 1.0
    coefficients[-1] += a  # for tau = 0 this is the z^0 term of z - 1 + a
    return float(np.max(np.abs(np.roots(coefficients))))


def young_daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """The checkpoint interval (seconds of work between checkpoints) that wastes least:
    √(2CM) for checkpoint cost C and mean time between failures M.

    Why: per interval τ the job pays C once, and a failure (rate 1/M) throws away on
    average half an interval: waste ≈ C/τ + τ/(2M), smallest at τ = √(2CM)
    (`checkpoint_waste` is that model). Valid while C ≪ τ ≪ M; Daly's higher-order
    optimum, √(2CM)[1 + ⅓√(C/2M) + (C/2M)/9] - C, about √(2CM) - ⅔C to the next order,
    differs by less than C.

    Source: Young, "A first order approximation to the optimum checkpoint interval",
    CACM 17(9), 1974; Daly, "A higher order estimate of the optimum checkpoint interval for
    restart dumps", FGCS 22(3), 2006.
    """
    c = _nonnegative(checkpoint_s, "checkpoint_s")
    m = _nonnegative(mtbf_s, "mtbf_s")
    if m == 0:
        raise ValueError("mtbf_s must be > 0")
    return math.sqrt(2.0 * c * m)


def checkpoint_waste(interval_s: float, checkpoint_s: float, mtbf_s: float,
                     restart_s: float = 0.0) -> float:
    """Expected fraction of wall time not spent on useful work, to first order:
    C/τ + (R + τ/2)/M, capped at 1.

    Why: every τ seconds of work the job pays a checkpoint of C seconds; failures arrive at
    rate 1/M (exponential, memoryless), and each costs a restart R plus, on average, half an
    interval of redone work. Its minimum over τ is exactly `young_daly_interval`; the terms
    neglected (C and R against M, failures during checkpoints and restarts) are second order.

    Source: Young (CACM 1974); Daly (FGCS 2006), section 2.
    """
    tau = _nonnegative(interval_s, "interval_s")
    c = _nonnegative(checkpoint_s, "checkpoint_s")
    m = _nonnegative(mtbf_s, "mtbf_s")
    r = _nonnegative(restart_s, "restart_s")
    if tau == 0 or m == 0:
        raise ValueError("interval_s and mtbf_s must be > 0")
    return min(1.0, c / tau + (r + tau / 2.0) / m)


# ---------------------------------------------------------------------------------------------
# 4. Fitting alpha and beta to measurements.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlphaBetaFit:
    """Result of fitting t = alpha + n·beta: latency (s), inverse bandwidth (s/byte), R²."""

    alpha: float
    beta: float
    r2: float

    @property
    def bandwidth(self) -> float:
        """1/beta in bytes/s (infinite if beta is 0)."""
        return math.inf if self.beta == 0 else 1.0 / self.beta


def fit_alpha_beta(sizes: ArrayLike, times: ArrayLike) -> AlphaBetaFit:
    """Least-squares fit of t = α + nβ to measured (size in bytes, time in seconds) pairs.

    The intercept is the per-message latency α and the slope the inverse bandwidth β
    (Hockney 1994). R² = 1 - SS_res / SS_tot says how much of the variation in time the
    straight line explains. The fit is not constrained: noisy data can give a slightly
    negative α, which itself tells you to measure smaller sizes.
    """
    x = np.asarray(sizes, dtype=np.float64).ravel()
    y = np.asarray(times, dtype=np.float64).ravel()
    if len(x) != len(y):
        raise ValueError(f"sizes and times must have the same length, got {len(x)} and {len(y)}")
    if len(x) < 2:
        raise ValueError(f"sizes needs at least 2 points to fit a line, got {len(x)}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("sizes and times must be finite")
    if np.ptp(x) == 0:
        raise ValueError("sizes must contain at least two different sizes")
    # Closed-form simple linear regression: beta = cov(n, t) / var(n), alpha = mean(t) -
    # beta * mean(n). Centring first keeps it accurate when sizes reach 1e9 bytes.
    x_mean, y_mean = x.mean(), y.mean()
    beta = float(np.dot(x - x_mean, y - y_mean) / np.dot(x - x_mean, x - x_mean))
    alpha = float(y_mean - beta * x_mean)
    residual = y - (alpha + beta * x)
    ss_res = float(np.dot(residual, residual))
    ss_tot = float(np.dot(y - y_mean, y - y_mean))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return AlphaBetaFit(alpha=alpha, beta=beta, r2=r2)


# --- Confidence intervals of sample quantiles ----------------------------------------------


def quantile_ci(
    samples: ArrayLike, q: float, confidence: float = 0.95
) -> tuple[float, float, float]:
    """(estimate, low, high): the sample q-quantile and a distribution-free confidence interval.

    Why distribution-free: step times are not normal (a floor and a right tail), so no
    parametric interval applies. The k-th smallest of n iid samples is below the true
    q-quantile with probability P(Binomial(n, q) >= k); the interval [x_(l), x_(u)] with
    P(l <= B < u) >= confidence, B ~ Binomial(n, q), covers it ([DN03] section 7.1). When n is
    too small for the requested tail (e.g. p99 of 40 samples: the interval would need a
    sample beyond the maximum), high is +inf (low is -inf for the opposite tail): that
    quantile is not estimable from these samples, and the estimate is about the maximum.
    """
    x = np.sort(np.asarray(samples, dtype=np.float64).ravel())
    n = len(x)
    if n == 0:
        raise ValueError("quantile_ci needs at least one sample")
    q = _probability(q, "q")
    confidence = _probability(confidence, "confidence")
    estimate = float(np.percentile(x, 100 * q))
    # the CDF of Binomial(n, q) at 0..n, computed in log space (n can be large)
    k = np.arange(n + 1)
    with np.errstate(divide="ignore"):
        log_pmf = (np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                             for i in k])
                   + k * (math.log(q) if q > 0 else -np.inf)
                   + (n - k) * (math.log1p(-q) if q < 1 else -np.inf))
    pmf = np.exp(log_pmf - np.max(log_pmf))
    pmf /= pmf.sum()
    cdf = np.cumsum(pmf)
    tail = (1 - confidence) / 2
    # x_(l) > xi_q iff fewer than l samples fall below xi_q: P = P(B <= l - 1) = cdf[l - 1];
    # x_(u) < xi_q iff at least u do: P = P(B >= u) = 1 - cdf[u - 1]  (l, u are 1-based)
    lows = np.nonzero(cdf[:n] <= tail)[0]
    highs = np.nonzero(1 - cdf[:n] <= tail)[0]
    low = float(x[lows[-1]]) if len(lows) else -math.inf
    high = float(x[highs[0]]) if len(highs) else math.inf
    return estimate, low, high
