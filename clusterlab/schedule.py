"""Collective schedules: when does each rank finish a collective on an impaired network?

This is the timing half of the emulator, and the core of the simulator. Given the time each
rank entered a collective, it plays the collective's algorithm round by round over the link
model, vectorised over ranks, and returns the time each rank may leave it.

The real backend moves the bytes through Gloo and holds each rank until the time computed
here; the simulator (`clusterlab.sim`) calls the same functions for 1024 nodes. One
implementation of the timing, two consumers.

Model of a round: every sender sends when it is ready (it entered the collective and has
received everything the algorithm needs so far); a receiver is ready again when the message
is delivered. Messages are cut into segments that pass the sender's egress queue with
netem's semantics (delay and jitter per segment; with a rate, monotonic release and
serialisation; processes of one node share its NIC queue). A lost segment is recovered as
TCP would: fast retransmit when three later segments arrived, else an RTO of >= 200 ms.

Simplifications against the sequential link model (`clusterlab.link.LinkModel`), chosen so
that 1024 ranks stay fast: draws are uncorrelated, Markov (state/gemodel) loss uses its
stationary loss probability, reordering ignores `gap`, and the queue `limit` is not
enforced. The p2p path of the backend uses the exact sequential model.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .fabric import cross_path, port_kernel, recover_drops, resender, state_width
from .link import packet_time_ns, sample_delay_ns
from .netem import LossGemodel, LossRandom, LossState, Netem
from .topology import Topology
from .wire import (
    DUPTHRESH,
    HEADER_BYTES,
    MAX_RETRANSMISSIONS,
    RTO_MIN_NS,
    SEGMENT_BYTES,
    segment_count,
)

# The all-reduce algorithms this module can replay (the backend's `algorithm=` and the
# simulator's); `models.ALLREDUCE_CLOSED_FORMS` names those with a closed form.
ALLREDUCE_SCHEDULES = ("ring", "recursive_doubling", "rabenseifner", "tree", "hierarchical",
                       "hierarchical_rail")
# A group this small has its collectives' max-plus matrices cached on a deterministic fabric
# (p x p entries each, computed by one vectorised pass); larger groups replay round by round.
LINEAR_MAX_RANKS = 64
_NEVER = -(2**62)  # "no path": minus infinity of the max-plus algebra, safe to add delays to


@functools.lru_cache(maxsize=256)  # specs are frozen: called for every batch of messages
def loss_probability(spec: Netem) -> float:
    """Long-run probability that a segment is lost (loss model, plus corruption)."""
    loss = spec.loss
    p = 0.0
    if isinstance(loss, LossRandom):
        p = loss.percent / 100
    elif isinstance(loss, LossGemodel):
        good_to_bad, bad_to_good = loss.p / 100, loss.r / 100
        moves = good_to_bad + bad_to_good
        bad = good_to_bad / moves if moves > 0 else 0.0  # stationary share of the bad state
        p = (1 - bad) * loss.one_minus_k / 100 + bad * loss.one_minus_h / 100
    elif isinstance(loss, LossState):
        p = _four_state_loss(loss)
    corrupt = spec.corrupt / 100
    return 1 - (1 - p) * (1 - corrupt)


def _four_state_loss(loss: LossState) -> float:
    p13, p31, p32, p23, p14 = (x / 100 for x in (loss.p13, loss.p31, loss.p32, loss.p23, loss.p14))
    # Transition matrix of netem's loss_4state (states 1..4 -> indices 0..3); 3 and 4 lose.
    t = np.zeros((4, 4))
    t[0, 3], t[0, 2] = p14, p13
    t[0, 0] = 1 - p14 - p13
    t[1, 2] = p23
    t[1, 1] = 1 - p23
    t[2, 1], t[2, 0] = p32, p31
    t[2, 2] = 1 - p32 - p31
    t[3, 0] = 1
    a = np.vstack([t.T - np.eye(4), np.ones(4)])
    b = np.zeros(5)
    b[-1] = 1
    pi = np.linalg.lstsq(a, b, rcond=None)[0]
    return float(np.clip(pi[2] + pi[3], 0, 1))


def deterministic(spec: Netem) -> bool:
    """True when `QueueState.deliver` on `spec` is send time + a constant: no draws, no queue."""
    return (not spec.jitter_ns and not spec.rate_bps and not (spec.reorder and spec.gap)
            and loss_probability(spec) == 0)


def segments(nbytes: int, segment_bytes: int) -> np.ndarray:
    """Payload sizes of the segments a message of `nbytes` is cut into (at least one)."""
    k = segment_count(nbytes, segment_bytes=segment_bytes)
    sizes = np.full(k, segment_bytes, dtype=np.int64)
    sizes[-1] = nbytes - segment_bytes * (k - 1) if nbytes else 0
    return sizes


class QueueState:
    """Queue state of every egress queue of a topology, for batches of concurrent messages.

    Every rank that replays a collective holds an identical QueueState and feeds it identical
    inputs and seeds, so all ranks agree on every delivery time without talking about it.
    """

    def __init__(self, topology: Topology, *, segment_bytes: int = SEGMENT_BYTES) -> None:
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes must be >= 1, got {segment_bytes}")
        self.topology = topology
        self.segment_bytes = segment_bytes
        self.tails: dict[tuple, int] = {}
        p = topology.world_size
        self._node = np.arange(p) // topology.procs_per_node
        # The fabric's switch ports (none on a crossbar): their specs and queue state.
        self.port_specs = topology.port_specs()
        impaired = any(not s.is_noop for s in self.port_specs)  # else: as good as a crossbar
        self.ports = (np.zeros((len(self.port_specs), state_width(self.port_specs)), np.int64)
                      if impaired else None)
        self._port_delay = np.array([s.delay_ns for s in self.port_specs] + [0], np.int64)
        if impaired:
            port_kernel()  # compile (or load) it now, not inside the first collective
        # Deterministic links keep no state and draw nothing, so a collective's completion
        # times are a max-plus linear function of its start times: cached per collective.
        self.deterministic = all(
            deterministic(s) for s in (topology.nic, topology.intra, *topology.links.values(),
                                       *self.port_specs))
        self._linear: dict[tuple, np.ndarray] = {}

    def deliver(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        send_ns: np.ndarray,
        nbytes: int,
        rng: np.random.Generator,
    ) -> np.ndarray:
        """Delivery times of messages src[i] -> dst[i] sent at send_ns[i], `nbytes` each."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        send_ns = np.asarray(send_ns, dtype=np.int64)
        out = np.empty(len(src), dtype=np.int64)
        if len(src) == 0:
            return out
        topo = self.topology
        same_node = self._node[src] == self._node[dst]
        groups: list[tuple[Netem, np.ndarray, np.ndarray]] = []  # spec, message idx, queue ids
        idx = np.flatnonzero(same_node)
        if len(idx):
            groups.append((topo.intra, idx, src[idx]))  # one intra link per sending rank
        idx = np.flatnonzero(~same_node)
        if len(idx) and topo.links:
            pairs = list(zip(self._node[src[idx]].tolist(), self._node[dst[idx]].tolist()))
            override = np.array([pair in topo.links for pair in pairs])
            for pos in np.flatnonzero(override):
                pair = pairs[pos]
                one = idx[pos : pos + 1]
                queue = np.array([-1 - pair[0] * topo.nodes - pair[1]])  # its own queue
                groups.append((topo.links[pair], one, queue))
            idx = idx[~override]
        if len(idx):
            nic = self._node[src[idx]] if not topo.fabric.nic_per_process() else src[idx]
            groups.append((topo.nic, idx, topo.world_size + nic))
        if self.ports is not None:  # the NIC's output per segment, then the switch ports
            full = np.empty((len(src), len(segments(nbytes, self.segment_bytes))), np.int64)
            for spec, msgs, queues in groups:
                full[msgs] = self._deliver_group(spec, src[msgs], dst[msgs], send_ns[msgs],
                                                 queues, nbytes, rng, per_segment=True)
            return self._cross_fabric(src, dst, send_ns, full, nbytes, rng)
        for spec, msgs, queues in groups:
            out[msgs] = self._deliver_group(spec, src[msgs], dst[msgs], send_ns[msgs], queues,
                                            nbytes, rng)
        return out

    def _cross_fabric(self, src, dst, send_ns, arrive, nbytes, rng) -> np.ndarray:
        """Messages whose segments left their NICs at `arrive` through the fabric's ports, hop
        by hop, each port's messages in send order (FIFO, as the p2p path queues them)."""
        topo = self.topology
        paths = topo.paths(src, dst)
        payload = segments(nbytes, self.segment_bytes)
        arrive = cross_path(self.ports, self.port_specs, paths, arrive, payload, send_ns, rng)
        if not (arrive < 0).any():
            return arrive.max(axis=1)
        nics = [topo.spec(s, d) for s, d in zip(src.tolist(), dst.tolist())]
        back = np.array([topo.spec(d, s).delay_ns for s, d in zip(src.tolist(), dst.tolist())])
        forward = np.array([n.delay_ns for n in nics]) + self._port_delay[paths].sum(axis=1)
        back = back + self._port_delay[topo.paths(dst, src)].sum(axis=1)

        resend = resender(self.ports, self.port_specs, paths, nics, payload, rng)
        return recover_drops(arrive, send_ns, forward, back, resend)

    def _deliver_group(self, spec, src, dst, send_ns, queues, nbytes, rng,
                       per_segment=False) -> np.ndarray:
        if spec.is_noop:
            if per_segment:
                k = len(segments(nbytes, self.segment_bytes))
                return np.repeat(send_ns[:, None], k, axis=1)
            return send_ns.copy()
        payload = segments(nbytes, self.segment_bytes)
        m, k = len(send_ns), len(payload)
        delay = sample_delay_ns(spec, rng, (m, k)) if spec.delay_ns or spec.jitter_ns else None
        if delay is None:
            delay = np.zeros((m, k), dtype=np.int64)
        if spec.reorder and spec.gap:
            delay[rng.random((m, k)) < spec.reorder / 100] = 0  # netem sends these at once
        ready = send_ns[:, None] + delay
        if spec.rate_bps:
            wire = packet_time_ns(spec, payload + HEADER_BYTES).astype(np.int64)
            per_packet = np.broadcast_to(wire, (m, k)).copy()
            if spec.duplicate:
                dup = rng.random((m, k)) < spec.duplicate / 100
                per_packet += np.where(dup, per_packet, 0)  # the copy occupies the wire too
            arrive = self._serialise(ready, per_packet, queues, send_ns)
        else:
            arrive = ready
        p_loss = loss_probability(spec)
        if p_loss > 0:
            arrive = self._recover(spec, arrive, send_ns, src, dst, p_loss, rng)
        return arrive if per_segment else arrive.max(axis=1)

    def _serialise(self, ready, per_packet, queues, send_ns) -> np.ndarray:
        """netem with a rate: time_to_send_i = max(ready_i, time_to_send_{i-1}) + wire_i."""
        arrive = np.empty_like(ready)
        order = np.argsort(send_ns, kind="stable")
        uniq, first = np.unique(queues[order], return_index=True)
        if len(uniq) == len(queues):  # one message per queue: vectorise over queues
            tails = np.array([self.tails.get(("q", int(q)), -(2**62)) for q in queues])
            arrive[:] = _release(ready, per_packet, tails)
            for q, t in zip(queues.tolist(), arrive[:, -1].tolist()):
                self.tails[("q", q)] = t
            return arrive
        for q in uniq.tolist():  # several messages share a queue: concatenate in send order
            rows = order[queues[order] == q]
            tail = np.array([self.tails.get(("q", q), -(2**62))])
            flat = _release(ready[rows].reshape(1, -1), per_packet[rows].reshape(1, -1), tail)
            arrive[rows] = flat.reshape(len(rows), -1)
            self.tails[("q", q)] = int(flat[0, -1])
        return arrive

    def _recover(self, spec, arrive, send_ns, src, dst, p_loss, rng) -> np.ndarray:
        """Replace each lost segment's arrival by its TCP retransmission's arrival."""
        m, k = arrive.shape
        lost = rng.random((m, k)) < p_loss
        if not lost.any():
            return arrive
        arrive = arrive.copy()
        topo = self.topology
        back = np.array([topo.spec(int(d), int(s)).delay_ns for s, d in zip(src, dst)])
        rtt = spec.delay_ns + back
        rows, cols = np.nonzero(lost)
        # Fast retransmit needs DUPTHRESH later segments; otherwise wait for the RTO.
        fast = cols + DUPTHRESH < k
        rto = np.maximum(RTO_MIN_NS, 2 * rtt[rows])
        when = send_ns[rows] + rto  # RTO-triggered retransmission...
        later = arrive[rows[fast], cols[fast] + DUPTHRESH]
        when[fast] = later + back[rows[fast]]  # ...or the SACKs of later segments trigger it
        next_rto = np.where(fast, rto, 2 * rto)  # exponential backoff after each timeout
        for _ in range(MAX_RETRANSMISSIONS):
            delay = sample_delay_ns(spec, rng, len(rows)) if spec.delay_ns or spec.jitter_ns else 0
            again = rng.random(len(rows)) < p_loss
            arrive[rows[~again], cols[~again]] = (when + delay)[~again]
            if not again.any():
                return arrive
            rows, cols = rows[again], cols[again]
            when, next_rto = when[again] + next_rto[again], 2 * next_rto[again]
        raise RuntimeError(
            f"a segment and its {MAX_RETRANSMISSIONS} retransmissions were all lost on "
            f"'{spec}': Linux TCP gives up there (net.ipv4.tcp_retries2) and the connection "
            "times out"
        )


def _release(ready: np.ndarray, per_packet: np.ndarray, tails: np.ndarray) -> np.ndarray:
    """Vectorised release recurrence, one queue per row: t_i = max(ready_i, t_{i-1}) + s_i."""
    cum = np.cumsum(per_packet, axis=1)
    before = cum - per_packet  # serialisation of the earlier segments of the row
    lead = np.maximum.accumulate(ready - before, axis=1)
    lead = np.maximum(lead, tails[:, None])
    return cum + lead


# --- Algorithms, as rounds of messages -------------------------------------------------------

Round = tuple[np.ndarray, np.ndarray, int]  # senders, receivers, bytes per message


def ring_rounds(p: int, nbytes: int, steps: int) -> Iterator[Round]:
    """`steps` rounds in which every rank sends a chunk of nbytes/p to its right neighbour."""
    ranks = np.arange(p)
    chunk = -(-nbytes // p)
    for _ in range(steps):
        yield ranks, (ranks + 1) % p, chunk


def recursive_doubling_rounds(p: int, nbytes: int, halving: bool = False) -> Iterator[Round]:
    """Recursive doubling (or Rabenseifner's halving-doubling when `halving`).

    Non-powers of two fold the extra ranks in first and send the result back at the end, as in
    Thakur, Rabenseifner & Gropp (2005).
    """
    pof2 = 1 << (p.bit_length() - 1)
    extra = p - pof2
    ranks = np.arange(p)
    if extra:  # ranks 2i+1 (i < extra) give their data to 2i and sit out
        yield ranks[1 : 2 * extra : 2], ranks[0 : 2 * extra : 2], nbytes
    # The pof2 ranks that take part: even ranks among the first 2*extra, then the rest.
    active = np.concatenate([ranks[0 : 2 * extra : 2], ranks[2 * extra :]])
    rounds = int(math.log2(pof2)) if pof2 > 1 else 0
    sizes = [nbytes] * rounds
    if halving:
        sizes = [-(-nbytes // (2 ** (i + 1))) for i in range(rounds)]
        sizes = sizes + sizes[::-1]  # reduce-scatter by halving, all-gather by doubling
        distances = [pof2 >> (i + 1) for i in range(rounds)]
        distances = distances + distances[::-1]
    else:
        distances = [1 << i for i in range(rounds)]
    for dist, size in zip(distances, sizes):
        partner = active[np.arange(pof2) ^ dist]
        yield active, partner, size
    if extra:
        yield ranks[0 : 2 * extra : 2], ranks[1 : 2 * extra : 2], nbytes


def binomial_rounds(p: int, root: int, nbytes: int, *, toward_root: bool) -> Iterator[Round]:
    """Binomial tree: broadcast from `root`, or reduce toward it when `toward_root`."""
    rel = np.arange(p)
    levels = max(1, (p - 1).bit_length()) if p > 1 else 0
    rounds = []
    for k in range(levels):
        step = 1 << k
        senders = rel[(rel < step) & (rel + step < p)]
        rounds.append((senders, senders + step))
    if toward_root:
        rounds = [(b, a) for a, b in reversed(rounds)]
    for a, b in rounds:
        yield (a + root) % p, (b + root) % p, nbytes


def dissemination_rounds(p: int, nbytes: int = 1) -> Iterator[Round]:
    """Barrier: in round k every rank signals rank + 2^k."""
    ranks = np.arange(p)
    k = 1
    while k < p:
        yield ranks, (ranks + k) % p, nbytes
        k <<= 1


@dataclass(frozen=True)
class Collective:
    """What a collective moves: its kind, bytes per rank's buffer, root where one exists."""

    # kind: allreduce, broadcast, reduce, allgather, reduce_scatter, gather, scatter,
    # alltoall or barrier. nbytes: for allreduce/broadcast/reduce the buffer; for
    # allgather/gather one rank's part; for reduce_scatter/scatter one rank's result; for
    # alltoall all that one rank sends.
    kind: str
    nbytes: int = 0
    root: int = 0
    algorithm: str = "ring"  # for allreduce


def play(
    fabric: QueueState,
    coll: Collective,
    start_ns: Sequence[int] | np.ndarray,
    rng: np.random.Generator,
    ranks: Sequence[int] | None = None,
) -> np.ndarray:
    """Each rank's completion time of `coll`, given when each rank entered it.

    `ranks` maps group ranks to the fabric's global ranks (a subgroup); default: identity.
    """
    start = np.asarray(start_ns, dtype=np.int64)
    p = len(start)
    glob = np.arange(p) if ranks is None else np.asarray(ranks, dtype=np.int64)
    ready = start.copy()
    if p == 1:
        return ready
    if fabric.deterministic and p <= LINEAR_MAX_RANKS:
        key = (coll, p, glob.tobytes())
        matrix = fabric._linear.get(key)
        if matrix is None:
            matrix = fabric._linear[key] = _linear_matrix(fabric, coll, p, glob)
        # done[i] = max_j(start[j] + matrix[i, j]): the longest path from j's entry to i's exit.
        return (matrix + start[None, :]).max(axis=1)
    for senders, receivers, size in rounds_of(coll, p, fabric.topology, glob):
        if len(senders) == 0:
            continue
        delivered = fabric.deliver(glob[senders], glob[receivers], ready[senders], size, rng)
        np.maximum.at(ready, receivers, delivered)
    return ready


def _linear_matrix(fabric: QueueState, coll: Collective, p: int, glob: np.ndarray) -> np.ndarray:
    """The max-plus matrix of `coll` on a deterministic fabric: entry [i, j] is how long after
    rank j's entry rank i can finish at the earliest (_NEVER where i does not wait for j).

    The same rounds as `play`, with each rank's ready time a row vector over the ranks' start
    times; a delivery adds the message's constant delay (its delivery time sent at 0).
    """
    ready = np.full((p, p), _NEVER, dtype=np.int64)
    np.fill_diagonal(ready, 0)
    for senders, receivers, size in rounds_of(coll, p, fabric.topology, glob):
        if len(senders) == 0:
            continue
        delay = fabric.deliver(glob[senders], glob[receivers], np.zeros(len(senders), np.int64),
                               size, None)
        np.maximum.at(ready, receivers, ready[senders] + delay[:, None])
    return ready


def rounds_of(coll: Collective, p: int, topology: Topology, glob: np.ndarray) -> Iterator[Round]:
    kind, n = coll.kind, coll.nbytes
    if kind == "allreduce":
        algo = coll.algorithm
        if algo == "ring":
            yield from ring_rounds(p, n, 2 * (p - 1))
        elif algo == "recursive_doubling":
            yield from recursive_doubling_rounds(p, n)
        elif algo == "rabenseifner":
            yield from recursive_doubling_rounds(p, n, halving=True)
        elif algo == "tree":
            yield from binomial_rounds(p, 0, n, toward_root=True)
            yield from binomial_rounds(p, 0, n, toward_root=False)
        elif algo == "hierarchical":
            yield from hierarchical_rounds(p, n, topology, glob)
        elif algo == "hierarchical_rail":
            yield from hierarchical_rail_rounds(p, n, topology, glob)
        else:
            choices = ", ".join(ALLREDUCE_SCHEDULES)
            raise ValueError(f"unknown all-reduce algorithm {algo!r}; choose from {choices}")
    elif kind == "broadcast":
        yield from binomial_rounds(p, coll.root, n, toward_root=False)
    elif kind == "reduce":
        yield from binomial_rounds(p, coll.root, n, toward_root=True)
    elif kind == "allgather" or kind == "reduce_scatter":
        yield from ring_rounds(p, n * p, p - 1)
    elif kind == "gather":
        others = np.array([r for r in range(p) if r != coll.root])
        yield others, np.full(p - 1, coll.root), n
    elif kind == "scatter":
        others = np.array([r for r in range(p) if r != coll.root])
        yield np.full(p - 1, coll.root), others, n
    elif kind == "alltoall":
        src, dst = np.nonzero(~np.eye(p, dtype=bool))
        yield src, dst, -(-n // p)
    elif kind == "barrier":
        yield from dissemination_rounds(p)
    else:
        raise ValueError(f"unknown collective kind {kind!r}")


def hierarchical_rounds(p: int, n: int, topology: Topology, glob: np.ndarray) -> Iterator[Round]:
    """Two-level all-reduce: reduce inside each node, ring among node leaders, broadcast back."""
    nodes = topology.node_of
    by_node: dict[int, list[int]] = {}
    for g, rank in enumerate(glob.tolist()):
        by_node.setdefault(nodes(rank), []).append(g)
    members = list(by_node.values())
    leaders = np.array([m[0] for m in members])
    depth = max(len(m) for m in members)
    intra = []
    for k in range(max(1, (depth - 1).bit_length()) if depth > 1 else 0):
        step = 1 << k
        s, r = [], []
        for m in members:
            for i in range(len(m)):
                if i < step and i + step < len(m):
                    s.append(m[i])
                    r.append(m[i + step])
        intra.append((np.array(s, dtype=np.int64), np.array(r, dtype=np.int64)))
    for a, b in reversed(intra):
        yield b, a, n
    q = len(leaders)
    if q > 1:
        chunk = -(-n // q)
        for _ in range(2 * (q - 1)):
            yield leaders, np.roll(leaders, -1), chunk
    for a, b in intra:
        yield a, b, n


def hierarchical_rail_rounds(p: int, n: int, topology: Topology,
                             glob: np.ndarray) -> Iterator[Round]:
    """Rail-style two-level all-reduce (`collectives.hierarchical_rail_allreduce`): a ring
    reduce-scatter inside each node, a ring all-reduce of each shard among the ranks of the
    same local index on every node (all rails at once, sharing each node's NIC), a ring
    all-gather inside each node.

    A group whose nodes hold different numbers of its ranks has no rails; it replays as the
    leader-based `hierarchical_rounds`.
    """
    nodes = topology.node_of
    by_node: dict[int, list[int]] = {}
    for g, rank in enumerate(glob.tolist()):
        by_node.setdefault(nodes(rank), []).append(g)
    if len({len(m) for m in by_node.values()}) != 1:
        yield from hierarchical_rounds(p, n, topology, glob)
        return
    grid = np.array([list(m) for m in by_node.values()], dtype=np.int64)  # node x local index
    n_nodes, ppn = grid.shape
    shard = -(-n // ppn)
    intra = (grid.ravel(), np.roll(grid, -1, axis=1).ravel(), shard)
    inter = (grid.ravel(), np.roll(grid, -1, axis=0).ravel(), -(-shard // n_nodes))
    rounds = ([intra] * (ppn - 1) if ppn > 1 else []) + (
        [inter] * (2 * (n_nodes - 1)) if n_nodes > 1 else []) + (
        [intra] * (ppn - 1) if ppn > 1 else [])
    yield from rounds
