"""Closed forms of a switched fabric: incast, oversubscribed uplinks, ECMP collisions, rails.

`clusterlab.models` costs collectives with NIC shaping only (the package's "crossbar"
fabric): every rank has its NIC and nothing else is in the way, not even a receiver's switch
port. Behind the NICs of a real cluster are switches, and four things
there change the cost of a collective. Each has a formula here, next to the measurement that
tests it (`clusterlab bench fabric`, notebook 13):

1. incast: N senders into one receiver port. The port drains at its rate while N arrive at
   once, so a queue builds; its delay grows like N, and when it outgrows the port's buffer the
   drops cost TCP's recovery as this package models it (a retransmission timeout of at least
   200 ms when fewer than DUPTHRESH later segments of the message get through; Linux's RACK,
   for which one later segment is enough, and its tail loss probe are not modelled);
2. oversubscription: a leaf switch whose uplinks carry less than its nodes can send. A round
   of a collective in which c flows share one uplink runs at that uplink's share, not at the
   NIC's rate;
3. ECMP: every flow is hashed to one of the spine uplinks. Hashing is balls into bins: some
   uplinks get two flows while others idle, and the round waits for the busiest;
4. rails: with one NIC per GPU, a hierarchical all-reduce sends 1/P of each node's bytes per
   NIC; on a rail-optimised fabric NIC i of every node sits on rail switch i, so those rings
   never cross a spine.

Units as in `clusterlab.models`: seconds, bytes, alpha in s per message, beta in s per
payload byte (`wire.wire_beta`: headers included). Rates are in bit/s, buffers in packets
(netem's `limit`: a packet is one TCP segment of up to `wire.SEGMENT_BYTES` of payload).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .models import _count, _nonnegative
from .wire import DUPTHRESH, HEADER_BYTES, RTO_MIN_NS, SEGMENT_BYTES, segment_count, wire_beta

__all__ = [
    "Incast",
    "RoundCost",
    "alltoall_cost",
    "bottleneck_time",
    "collision_probability",
    "ecmp_round_time",
    "expected_max_load",
    "flow_collision_probability",
    "incast",
    "max_load_distribution",
    "oversubscription_factor",
    "round_cost",
    "uplink_rate_bps",
]

RTO_MIN_S = RTO_MIN_NS / 1e9


def _positive(value: object, name: str) -> float:
    x = _nonnegative(value, name)
    if x == 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return x


# ---------------------------------------------------------------------------------------------
# 1. Incast: N senders, one receiver port.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Incast:
    """What `incast` predicts for N senders of `nbytes` each into one port (s, bytes/s)."""

    senders: int
    nbytes: int
    time_s: float  # from the common start until the receiver has every byte
    goodput: float  # payload bytes per second the receiver got: senders * nbytes / time_s
    link_share: float  # goodput / the port's payload rate (1: the port never idled)
    mean_queue_s: float  # a kept packet's mean wait in the port's queue
    max_queue_s: float  # the longest wait: the queue at its peak
    message_s: tuple[float, ...]  # when each sender's message is delivered, in service order
    drops: int  # packets the port's buffer turned away
    timeouts: int  # senders that waited for a retransmission timeout (>= 200 ms)


def incast(senders: int, nbytes: int, *, rate_bps: float, port_rate_bps: float | None = None,
           delay_s: float = 0.0, buffer_packets: int | None = None,
           segment_bytes: int = SEGMENT_BYTES) -> Incast:
    """N senders each send `nbytes` at the same instant to one receiver's port.

    Each sender's NIC runs at `rate_bps` and the receiver's port at `port_rate_bps` (default:
    the same); `delay_s` is the path's one-way delay (the NIC's and the ports' together); the
    port's buffer holds `buffer_packets` packets (netem's `limit`; None: unlimited).

    No drops. A sender's NIC puts one segment on the wire per segment time w, so N segments
    reach the port per w while it forwards one: a queue builds. The port is busy from the
    first arrival on, so with equal rates the incast ends at

        T = delay + w + N k w  ~  delay + N n beta      (k = ceil(n / segment) segments)

    (w: one segment's store and forward). The goodput N n / T tends to the port's rate: the
    port is the bottleneck however many senders there are, and each gets 1/N of it. The
    queue is served in turn, sender after sender (a FIFO port; the emulator's point-to-point
    path queues whole messages in the order they were sent): the s-th served sender's packets
    each wait s k w, on average (N - 1) k w / 2, at most (N - 1) k w, the last message's
    extra time over a lone sender. Queueing delay grows linearly in N: a parameter server's
    push is an incast.

    Drops (drop-tail). A packet that finds `buffer_packets` packets in the port (the one
    being forwarded included) is dropped. The s-th sender finds about s k packets ahead of
    each of its own, so the senders served late lose their first segments (a late one may
    get through once the queue has drained a little) or their whole message. TCP recovers a
    lost segment by fast retransmit when 3 later segments of the message got through, else
    by a retransmission timeout max(200 ms, 2 RTT) after the send (Linux's TCP_RTO_MIN); such
    a message waits for it, and its resent packets queue at the port:

        T >= RTO + delay + the resent packets' time through the port

    an order of magnitude above the no-drop time when N n beta is milliseconds: the goodput
    collapse of TCP incast (Phanishayee et al., "Measurement and Analysis of TCP Throughput
    Collapse in Cluster-based Storage Systems", FAST 2008; Vasudevan et al., SIGCOMM 2009,
    whose fix is a sub-millisecond RTO). A resent packet is assumed to find room (by then the
    burst has drained). The queue is computed packet by packet (a few lines of recurrence,
    exact for this arrival pattern).
    """
    senders = _count(senders, "senders")
    nbytes = int(_nonnegative(nbytes, "nbytes"))
    rate_bps = _positive(rate_bps, "rate_bps")
    port_rate_bps = rate_bps if port_rate_bps is None else _positive(port_rate_bps,
                                                                     "port_rate_bps")
    delay_s = _nonnegative(delay_s, "delay_s")
    segment_bytes = _count(segment_bytes, "segment_bytes")
    if buffer_packets is not None:
        buffer_packets = _count(buffer_packets, "buffer_packets")
    sizes = _segment_sizes(nbytes, segment_bytes) + HEADER_BYTES
    arrive = np.cumsum(sizes * 8 / rate_bps)  # when each segment is off the sender's NIC
    serve = sizes * 8 / port_rate_bps
    tail, waits, finished = 0.0, [], []  # finished: finish times of the packets kept
    done = np.full((senders, len(sizes)), -1.0)  # when each packet leaves the port
    drops = 0
    for s in range(senders):
        for j, a in enumerate(arrive):
            if buffer_packets is not None and len(finished) >= buffer_packets and (
                    finished[-buffer_packets] > a):
                drops += 1
                continue
            start = max(a, tail)
            tail = start + serve[j]
            waits.append(start - a)
            finished.append(tail)
            done[s, j] = tail
    # TCP resends what was dropped: on the SACKs of 3 later segments (their way back, the
    # resend's way there), else after the RTO; the resend queues at the port again.
    rto = max(RTO_MIN_S, 4 * delay_s)  # max(TCP_RTO_MIN, 2 x the round trip)
    resends, timeouts = [], 0
    for s, j in zip(*np.nonzero(done < 0)):
        later = np.sort(done[s, j + 1 :][done[s, j + 1 :] >= 0])
        by_timeout = len(later) < DUPTHRESH
        when = rto if by_timeout else later[DUPTHRESH - 1] + 2 * delay_s
        resends.append((when + arrive[0], s, j, by_timeout))
    for when, s, j, _ in sorted(resends):
        tail = max(when, tail) + serve[j]
        done[s, j] = tail
    timeouts = len({s for _, s, _, by_timeout in resends if by_timeout})
    delivered = [float(row.max()) + delay_s for row in done]
    time_s = max(delivered)
    goodput = senders * nbytes / time_s if time_s > 0 else math.inf
    payload_rate = 1 / wire_beta(port_rate_bps, segment_bytes=segment_bytes)
    return Incast(senders=senders, nbytes=nbytes, time_s=time_s, goodput=goodput,
                  link_share=goodput / payload_rate, mean_queue_s=float(np.mean(waits)),
                  max_queue_s=float(np.max(waits)), message_s=tuple(delivered), drops=drops,
                  timeouts=timeouts)


def _segment_sizes(nbytes: int, segment_bytes: int) -> np.ndarray:
    """Payload bytes of each segment of a message (as `schedule.segments`)."""
    k = segment_count(nbytes, segment_bytes=segment_bytes)
    sizes = np.full(k, segment_bytes, dtype=np.float64)
    sizes[-1] = nbytes - segment_bytes * (k - 1) if nbytes else 0
    return sizes


# ---------------------------------------------------------------------------------------------
# 2. Oversubscription: a leaf's uplinks carry less than its nodes can send.
# ---------------------------------------------------------------------------------------------


def uplink_rate_bps(*, port_rate_bps: float, nodes_per_leaf: int, spines: int,
                    oversubscription: float) -> float:
    """The rate of one leaf-to-spine uplink: nodes_per_leaf x port rate / (o x spines).

    The oversubscription ratio o of a leaf is what its nodes can send (nodes_per_leaf ports
    at the port rate) over what its uplinks carry (one uplink to each of `spines` spines):
    o = 1 is a non-blocking fabric, o = 4 a common "4:1" one.
    """
    port_rate_bps = _positive(port_rate_bps, "port_rate_bps")
    nodes_per_leaf = _count(nodes_per_leaf, "nodes_per_leaf")
    spines = _count(spines, "spines")
    oversubscription = _positive(oversubscription, "oversubscription")
    return port_rate_bps * nodes_per_leaf / (oversubscription * spines)


def oversubscription_factor(flows_on_uplink: int, *, nodes_per_leaf: int, spines: int,
                            oversubscription: float) -> float:
    """How many times longer a flow's bytes take than at its NIC's rate, when it shares a
    spine uplink with flows_on_uplink - 1 others: max(1, c o S / L).

    The uplink's rate (`uplink_rate_bps`) is split fairly among its c flows; a flow whose
    share exceeds its NIC's rate is held back by the NIC instead. 0 flows: 1.
    """
    c = _count(flows_on_uplink, "flows_on_uplink", minimum=0)
    share = uplink_rate_bps(port_rate_bps=1.0, nodes_per_leaf=nodes_per_leaf, spines=spines,
                            oversubscription=oversubscription)
    return max(1.0, c / share) if c else 1.0


# ---------------------------------------------------------------------------------------------
# 3. ECMP: flows hashed to uplinks are balls thrown into bins.
# ---------------------------------------------------------------------------------------------


def _flows_uplinks(flows: object, uplinks: object) -> tuple[int, int]:
    return _count(flows, "flows", minimum=0), _count(uplinks, "uplinks")


def collision_probability(flows: int, uplinks: int) -> float:
    """P(at least two of `flows` flows hash to the same one of `uplinks` uplinks).

    The birthday problem: all distinct with probability prod_{i<F} (1 - i/S), so
    1 - S! / ((S - F)! S^F); 1 as soon as F > S.
    """
    flows, uplinks = _flows_uplinks(flows, uplinks)
    if flows > uplinks:
        return 1.0
    distinct = math.prod((uplinks - i) / uplinks for i in range(flows))
    return 1.0 - distinct


def flow_collision_probability(flows: int, uplinks: int) -> float:
    """P(a given flow shares its uplink with at least one other): 1 - (1 - 1/S)^(F - 1)."""
    flows, uplinks = _flows_uplinks(flows, uplinks)
    if flows <= 1:
        return 0.0
    return -math.expm1((flows - 1) * math.log1p(-1.0 / uplinks)) if uplinks > 1 else 1.0


def max_load_distribution(flows: int, uplinks: int) -> np.ndarray:
    """P(the busiest uplink carries exactly m flows), m = 0..flows, for `flows` flows hashed
    uniformly and independently to `uplinks` uplinks.

    Exact, by Poissonisation: the loads are independent Poisson(F / S) counts X_i
    conditioned on their sum being F, so
    P(max <= m) = P(X <= m)^S P(Y_1 + ... + Y_S = F) / P(X_1 + ... + X_S = F), the Y_i being
    X conditioned on X <= m (Kolchin, Sevast'yanov & Chistyakov, "Random Allocations",
    1978). The sum's law is a convolution power, so this stays cheap for thousands of flows.
    """
    flows, uplinks = _flows_uplinks(flows, uplinks)
    if flows == 0:
        return np.array([1.0])
    lam = flows / uplinks
    i = np.arange(flows + 1)
    log_pois = i * math.log(lam) - lam - np.array([math.lgamma(k + 1) for k in i])
    log_total = flows * math.log(flows) - flows - math.lgamma(flows + 1)  # Poisson(F) at F
    cdf = np.zeros(flows + 1)
    for m in range(-(-flows // uplinks), flows + 1):  # the busiest carries >= ceil(F / S)
        pmf = np.exp(log_pois[: m + 1])
        q = float(pmf.sum())
        power = _convolution_power(pmf / q, uplinks, flows)
        log_p = uplinks * math.log(q) + math.log(max(power[flows], 1e-300)) - log_total
        cdf[m] = min(1.0, math.exp(log_p)) if power[flows] > 0 else 0.0
        if cdf[m] >= 1 - 1e-13:
            cdf[m:] = 1.0
            break
    return np.clip(np.diff(np.concatenate([[0.0], cdf])), 0.0, 1.0)


def _convolution_power(pmf: np.ndarray, power: int, length: int) -> np.ndarray:
    """The law of the sum of `power` iid draws from `pmf`, truncated to 0..length."""
    out = np.zeros(length + 1)
    out[0] = 1.0
    base = pmf[: length + 1]
    while power:
        if power & 1:
            out = np.convolve(out, base)[: length + 1]
        power >>= 1
        if power:
            base = np.convolve(base, base)[: length + 1]
    return out


def expected_max_load(flows: int, uplinks: int) -> float:
    """E[flows on the busiest uplink]: ceil(F / S) if hashing were perfect, more in practice
    (about ln S / ln ln S for F = S, Raab & Steger, "Balls into Bins - A Simple and Tight
    Analysis", RANDOM 1998)."""
    law = max_load_distribution(flows, uplinks)
    return float(np.dot(np.arange(len(law)), law))


def ecmp_round_time(flows: int, uplinks: int, nbytes: float, *, alpha: float, beta: float,
                    uplink_factor: float = 1.0) -> float:
    """Expected time of a round in which `flows` flows of `nbytes` start together and each
    is hashed to one of `uplinks` uplinks: alpha + E[max(1, load x uplink_factor)] n beta.

    beta is the NIC's (per payload byte); an uplink carrying `load` flows gives each
    1 / (load x uplink_factor) of the NIC's rate (uplink_factor = the NIC's rate over the
    uplink's: 1 when they are equal). The round ends with its slowest flow, on the busiest
    uplink.
    """
    alpha = _nonnegative(alpha, "alpha")
    beta = _nonnegative(beta, "beta")
    nbytes = _nonnegative(nbytes, "nbytes")
    uplink_factor = _positive(uplink_factor, "uplink_factor")
    law = max_load_distribution(flows, uplinks)
    factor = np.maximum(1.0, np.arange(len(law)) * uplink_factor)
    return alpha + float(np.dot(law, factor)) * nbytes * beta


# ---------------------------------------------------------------------------------------------
# 4. A collective on a fabric, round by round, at each message's bottleneck share.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundCost:
    """One round of `bottleneck_time`: its time and what set it."""

    time_s: float  # the slowest message of the round
    nbytes: int  # bytes per message
    messages: int
    share_bps: float  # the slowest message's rate: its bottleneck queue's rate / its flows
    flows_on_bottleneck: int  # how many of the round's messages share that queue
    bottleneck: str  # "nic", "intra", "link", "port", "uplink" or "downlink"


# What the hops of a path are, by its length (`fabric.paths`): the receiver's port alone
# (same leaf, or same rail), or up to a spine, down to the receiver's leaf and its port.
_HOP_NAMES = {1: ("port",), 3: ("uplink", "downlink", "port")}


def bottleneck_time(topology, algorithm: str, nbytes: int, *, ranks=None,
                    segment_bytes: int = SEGMENT_BYTES) -> tuple[float, list[RoundCost]]:
    """Time (s) of an all-reduce of `nbytes` with `algorithm` on `topology` (a
    `clusterlab.topology.Topology`, its fabric included), and the cost of each round.
    `ranks` lists the topology's ranks in the collective's order (default: 0..p-1), as
    `schedule.play` takes them: a layout of the ranks on the fabric.

    The rounds are the replay's own (`schedule.rounds_of`; "parameter_server" is its push
    to rank 0 and the pull back). In a round, every message crosses its sender's egress
    queue (the NIC, or the intra-node link) and then the fabric's ports (`topology.paths`:
    the receiver's port, or an uplink, a downlink and the receiver's port). A queue carrying
    c of the round's messages gives each 1/c of its rate (equal messages starting together
    leave a FIFO queue together), so a message moves at its bottleneck share
    min over its queues of rate / c, and takes

        delays along the path + wire bytes / share + one segment's time per further hop

    (store and forward: a switch forwards a packet once it has it whole). A rank sends a
    round's message once it has received what the rounds before brought it, so the time is
    the longest chain of messages through the rounds (max-plus, as the replay advances);
    on a crossbar with one process per node, where all messages of a round cost the same,
    that is the sum of the rounds, the closed forms of `clusterlab.models` term for term.
    The fair share over whole rounds is the approximation.
    """
    from .schedule import Collective, rounds_of

    nbytes = int(_nonnegative(nbytes, "nbytes"))
    p = topology.world_size
    glob = np.arange(p) if ranks is None else np.asarray(ranks, dtype=np.int64)
    if sorted(glob.tolist()) != list(range(p)):
        raise ValueError(f"ranks must be a permutation of 0..{p - 1}, got {ranks!r}")
    if algorithm == "parameter_server":
        workers = np.arange(1, p)
        server = np.zeros(p - 1, dtype=np.int64)
        rounds = [(workers, server, nbytes), (server, workers, nbytes)] if p > 1 else []
    else:
        rounds = list(rounds_of(Collective("allreduce", nbytes, algorithm=algorithm), p,
                                topology, glob))
    ready = np.zeros(p)
    costs = []
    for senders, receivers, size in rounds:
        if not len(senders):
            continue
        senders, receivers = np.asarray(senders), np.asarray(receivers)
        times, cost = _message_times(topology, glob[senders], glob[receivers], int(size),
                                     segment_bytes)
        np.maximum.at(ready, receivers, ready[senders] + times)
        costs.append(cost)
    return float(ready.max()), costs


def round_cost(topology, src, dst, nbytes: int, *,
               segment_bytes: int = SEGMENT_BYTES) -> RoundCost:
    """One round: messages src[i] -> dst[i] (ranks of `topology`) of `nbytes` each, all
    sent together; its time is its slowest message's at its bottleneck share (see
    `bottleneck_time`)."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if src.shape != dst.shape or src.ndim != 1 or not len(src):
        raise ValueError(f"src and dst must be equal-length, non-empty rank lists, got "
                         f"{src.tolist()} and {dst.tolist()}")
    return _message_times(topology, src, dst, int(nbytes), segment_bytes)[1]


def alltoall_cost(topology, nbytes: int, *, segment_bytes: int = SEGMENT_BYTES) -> RoundCost:
    """An all-to-all in which every rank sends `nbytes` / p to each of the p - 1 others, all
    at once (one round, as `schedule.rounds_of` replays it), at each message's bottleneck
    share (`round_cost`): a perfectly interleaved exchange. On a leaf-spine with one spine,
    L nodes per leaf and p nodes, a leaf's uplink carries L (p - L) of the messages and each
    NIC p - 1, so oversubscription o slows it by max(1, o (p - L) / (p - 1)), towards o as
    the leaves multiply."""
    p = topology.world_size
    src, dst = np.nonzero(~np.eye(p, dtype=bool))
    return round_cost(topology, src, dst, -(-int(nbytes) // p), segment_bytes=segment_bytes)


def _message_times(topology, src, dst, nbytes, segment_bytes) -> tuple[np.ndarray, RoundCost]:
    """Each message's time at its bottleneck share, and the round's cost (its slowest)."""
    ports = topology.port_specs()
    hops: list[list[tuple[tuple, object, str]]] = []  # per message: (queue key, spec, kind)
    paths = topology.paths(src, dst)
    for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist())):
        kind, *where = topology.queue_of(s, d)
        path = [((kind, *where), topology.spec(s, d), kind)]
        hops_of = [int(q) for q in paths[i] if q >= 0]
        names = _HOP_NAMES.get(len(hops_of), ("port",) * len(hops_of))
        path += [(("fabric", q), ports[q], name) for q, name in zip(hops_of, names)]
        hops.append(path)
    flows: dict[tuple, int] = {}
    for path in hops:
        for key, _, _ in path:
            flows[key] = flows.get(key, 0) + 1
    wire = nbytes + HEADER_BYTES * segment_count(nbytes, segment_bytes=segment_bytes)
    segment = min(nbytes, segment_bytes) + HEADER_BYTES
    times = np.empty(len(hops))
    worst = None
    for i, path in enumerate(hops):
        delay = sum(spec.delay_ns for _, spec, _ in path) / 1e9
        shares = [(spec.rate_bps / flows[key], flows[key], kind, spec.rate_bps)
                  for key, spec, kind in path if spec.rate_bps]
        if shares:
            share, crowd, where, rate = min(shares)
            # every other hop holds the message back by one segment at its own rate
            forward = sum(segment * 8 / r for *_, r in shares) - segment * 8 / rate
            t = delay + wire * 8 / share + forward
        else:
            share, crowd, where, t = math.inf, 1, path[0][2], delay
        times[i] = t
        if worst is None or t > worst.time_s:
            worst = RoundCost(time_s=t, nbytes=nbytes, messages=len(src), share_bps=share,
                              flows_on_bottleneck=crowd, bottleneck=where)
    return times, worst
