"""The simulator: data-parallel training steps on 1..1024+ nodes, in well under a second.

It uses the same link model and the same collective schedules as the real backend
(`clusterlab.schedule`, `clusterlab.link`): one implementation of the timing, two consumers.
What it adds is a model of the training step around the collectives:

    forward | backward (gradient buckets become ready one by one) | optimizer
                      \\-> all-reduce of bucket 1, 2, ... on one communication stream

Each rank computes for `compute_s` (1/3 forward, 2/3 backward), perturbed by its own compute
jitter and by stragglers; bucket b is ready when the backward pass has produced it (the
backward pass produces gradient bytes at a steady rate, as a dense layer's backward FLOPs
are proportional to its parameters, so DDP's small first bucket is ready early); with
`overlap` its all-reduce starts as soon as it is ready (and the previous bucket's is done),
without overlap only after the whole backward pass. The step ends when the last bucket is
reduced (plus `optimizer_s`). The next step starts then, independently on every rank; the
collectives are what synchronise them.

Large rings are replayed by a dedicated compiled recurrence (`_ring_rounds_fast`) whenever
the topology is one process per node without overrides, which is what the scaling explorer
sweeps, on a crossbar or a switched fabric whose ports draw nothing (`RingPorts`); so is the
leaders' ring of a hierarchical all-reduce over free intra-node links (16,384 ranks as 2,048
nodes x 8). Everything else goes through `schedule.play`. Both see the same fabric
(`fabric=`, see `clusterlab.fabric`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .fabric import Fabric
from .link import delay_values_ns, packet_time_ns, sample_delay_ns
from .netem import Netem
from .schedule import Collective, QueueState, loss_probability, play, segments
from .topology import Topology
from .wire import DUPTHRESH, HEADER_BYTES, RTO_MIN_NS, SEGMENT_BYTES

_HAVE_NUMBA = True
try:  # numba compiles the ring recurrence of 1024-node simulations; pure Python is too slow
    from numba import njit as _numba_njit

    def _njit(fn):
        return _numba_njit(cache=True, nogil=True)(fn)
except ImportError:  # pragma: no cover - numba is in requirements.txt
    _HAVE_NUMBA = False

    def _njit(fn):
        return fn

COMPUTE_DISTRIBUTIONS = ("none", "uniform", "normal", "pareto", "paretonormal", "exponential")


@dataclass
class SimResult:
    """Per-rank, per-step times of a simulated run (seconds), and what they add up to."""

    nodes: int
    procs_per_node: int
    step_end: np.ndarray  # (steps, ranks): when each rank finished each step
    compute: np.ndarray  # (steps, ranks): compute time of each rank in each step
    samples_per_step: int
    config: dict = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.step_end.shape[1]

    @property
    def step_times(self) -> np.ndarray:
        """Duration of each synchronous step: from the slowest rank's previous end to its end."""
        ends = self.step_end.max(axis=1)
        return np.diff(np.concatenate([[0.0], ends]))

    @property
    def mean_step(self) -> float:
        return float(self.step_times.mean())

    @property
    def throughput(self) -> float:
        """Samples per second over the whole run."""
        return self.samples_per_step * len(self.step_times) / float(self.step_end.max())

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.step_times, q))

    @property
    def exposed_comm(self) -> float:
        """Mean time per step beyond the mean compute time: communication the step waits for."""
        return max(0.0, self.mean_step - float(self.compute.mean()))

    def summary(self) -> dict:
        return {
            "nodes": self.nodes, "ranks": self.world_size, "mean_step_s": self.mean_step,
            "p50_s": self.percentile(50), "p99_s": self.percentile(99),
            "throughput": self.throughput, "compute_s": float(self.compute.mean()),
            "exposed_comm_s": self.exposed_comm,
        }


def compute_times(
    rng: np.random.Generator,
    shape: tuple[int, int],
    compute_s: float,
    jitter: float = 0.0,
    distribution: str = "none",
    straggler: tuple[int, float] | None = None,
) -> np.ndarray:
    """Compute time per (step, rank): compute_s, plus jitter, plus a straggler's slowdown.

    jitter is relative: for the netem-shaped distributions the draw is compute_s x jitter x
    (a netem table value), clipped at zero; for "exponential" it is compute_s + Exp(mean
    compute_s x jitter), the classic straggler model whose synchronous step grows like H_N.
    straggler = (rank, factor): that rank computes factor times longer.
    """
    if distribution not in COMPUTE_DISTRIBUTIONS:
        raise ValueError(f"compute distribution {distribution!r} is unknown; choose from "
                         f"{', '.join(COMPUTE_DISTRIBUTIONS)}")
    if compute_s < 0 or jitter < 0:
        raise ValueError("compute_s and jitter must be >= 0")
    base = np.full(shape, float(compute_s))
    if jitter and distribution == "exponential":
        base += rng.exponential(compute_s * jitter, size=shape)
    elif jitter and distribution != "none":
        scale_ns = max(1, int(compute_s * jitter * 1e9))
        spec = Netem(delay_ns=scale_ns * 8, jitter_ns=scale_ns, distribution=distribution)
        draws = sample_delay_ns(spec, rng, shape) - spec.delay_ns  # centred jitter, in ns
        base = np.maximum(base + draws / 1e9, 0.0)
    if straggler is not None:
        rank, factor = straggler
        if not 0 <= rank < shape[1]:
            raise ValueError(f"straggler rank {rank} is outside 0..{shape[1] - 1}")
        base[:, rank] *= factor
    return base


def simulate_training(
    nodes: int,
    procs_per_node: int = 1,
    nic: str | Netem | None = "delay 20us rate 100gbit",
    intra: str | Netem | None = None,
    *,
    model_bytes: float = 100e6,
    bucket_bytes: float = 25 * 2**20,
    first_bucket_bytes: float = 2**20,
    compute_s: float = 0.1,
    compute_jitter: float = 0.0,
    compute_distribution: str = "none",
    straggler: tuple[int, float] | None = None,
    optimizer_s: float = 0.0,
    overlap: bool = True,
    algorithm: str = "ring",
    steps: int = 20,
    batch_per_rank: int = 32,
    seed: int = 0,
    message_overhead_s: float = 0.0,
    native_s=None,
    fabric: str | Fabric | None = None,
    buckets=None,
) -> SimResult:
    """Simulate `steps` synchronous data-parallel steps; see the module docstring.

    `buckets`: the gradient buckets' bytes in the order they are reduced (e.g. a measured DDP
    run's `bucket_sizes`); given, they replace the buckets `bucket_sizes(model_bytes,
    bucket_bytes, first_bucket_bytes)` would compute.

    Calibration for predicting the local emulator: `message_overhead_s` is a per-message
    software cost paid by the sender, and `native_s(nbytes)` the time this machine's plain
    Gloo needs for an all-reduce of that size (the backend never completes a collective
    before Gloo itself has: completion = max(emulated, last entry + native)).
    `fabric`: the switches behind the NICs (`clusterlab.fabric`; None: the crossbar).
    """
    topo = Topology.build(nodes, procs_per_node, nic, intra, fabric=fabric)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if model_bytes < 0 or bucket_bytes <= 0:
        raise ValueError("model_bytes must be >= 0 and bucket_bytes > 0")
    p = topo.world_size
    rng = np.random.default_rng(seed)
    if buckets is None:
        buckets = bucket_sizes(int(model_bytes), int(bucket_bytes), int(first_bucket_bytes))
    else:
        buckets = [int(b) for b in buckets]
        if any(b <= 0 for b in buckets):
            raise ValueError(f"bucket sizes must be > 0 bytes, got {buckets}")
    comp = compute_times(rng, (steps, p), compute_s, compute_jitter, compute_distribution,
                         straggler)
    # The compiled ring: a ring of one process per node, or the leaders' ring of a
    # hierarchical all-reduce whose intra-node steps are free (an unimpaired `intra`: a node's
    # ranks reach its leader at once), which is a ring of the nodes' latest entries. The
    # latter draws from another generator than `schedule.play`: it is taken where the two
    # agree exactly (nothing drawn), on a switched fabric, or where play would be slow.
    nodes_ring = Topology.build(nodes, 1, topo.nic, fabric=topo.fabric)
    spec = topo.nic
    draws_nothing = (not spec.jitter_ns and loss_probability(spec) == 0
                     and not spec.duplicate and not spec.reorder)
    leaders_ring = (algorithm == "hierarchical" and topo.intra.is_noop and nodes > 1
                    and (draws_nothing or p > 1024 or not topo.fabric.is_crossbar()))
    fast = (p > 1 and _HAVE_NUMBA and not topo.links and not topo.fabric.nic_per_process()
            and (topo.fabric.is_crossbar() or RingPorts.applies(topo))
            and ((algorithm == "ring" and procs_per_node == 1) or leaders_ring))
    overhead_ns = int(message_overhead_s * 1e9)
    comp_ns = (comp * 1e9).astype(np.int64)
    produced = np.cumsum(buckets) / max(1, sum(buckets))  # share of gradients ready per bucket
    draws = rng.bit_generator.state

    def steps_of(fast: bool) -> np.ndarray:
        rng.bit_generator.state = draws
        queues = QueueState(topo)
        ports = RingPorts(nodes_ring) if fast and not topo.fabric.is_crossbar() else None
        ends = np.zeros((steps, p))
        now = np.zeros(p, dtype=np.int64)  # ns; each rank's clock position
        for k in range(steps):
            forward = comp_ns[k] // 3
            backward = comp_ns[k] - forward
            stream = now.copy()  # the communication stream is free from the step's start
            for b, size in enumerate(buckets):
                ready = now + forward + (backward * produced[b]).astype(np.int64)
                issue = ready if overlap else now + comp_ns[k]
                start = np.maximum(issue, stream)
                if fast:
                    first = start.reshape(nodes, procs_per_node).max(axis=1)
                    stream = np.repeat(_ring_rounds_fast(topo.nic, first, size, rng,
                                                         overhead_ns, ports=ports),
                                       procs_per_node)
                else:
                    coll = Collective("allreduce", size, algorithm=algorithm)
                    stream = play(queues, coll, start, rng) + overhead_ns * _rounds(coll, p)
                if native_s is not None and p > 1:
                    stream = np.maximum(stream, start.max() + int(native_s(size) * 1e9))
            done = np.maximum(stream, now + comp_ns[k]) + int(optimizer_s * 1e9)
            ends[k] = done / 1e9
            now = done
        if ports is not None and ports.overflow[0]:  # a port dropped: replay exactly
            return steps_of(False)
        return ends

    ends = steps_of(fast)
    return SimResult(nodes=nodes, procs_per_node=procs_per_node, step_end=ends, compute=comp,
                     samples_per_step=batch_per_rank * p,
                     config={"nic": str(topo.nic), "intra": str(topo.intra),
                             "fabric": str(topo.fabric),
                             "model_bytes": model_bytes, "bucket_bytes": bucket_bytes,
                             "buckets": list(buckets),
                             "compute_s": compute_s, "overlap": overlap, "algorithm": algorithm})


def simulate_collective(
    kind: str,
    nbytes: int,
    *,
    nodes: int,
    procs_per_node: int = 1,
    nic: str | Netem | None = None,
    intra: str | Netem | None = None,
    fabric: str | Fabric | None = None,
    algorithm: str = "ring",
    root: int = 0,
    start_s=None,
    seed: int = 0,
) -> np.ndarray:
    """When each rank finishes one collective (seconds), every rank entering at `start_s`
    (default 0): the replay the backend runs (`schedule.play`), on any fabric. kind and
    nbytes as in `schedule.Collective` (e.g. "gather": every rank sends nbytes to `root`,
    which is an incast at the root's port)."""
    topo = Topology.build(nodes, procs_per_node, nic, intra, fabric=fabric)
    p = topo.world_size
    start = (np.zeros(p, dtype=np.int64) if start_s is None
             else (np.asarray(start_s, dtype=float) * 1e9).astype(np.int64))
    if start.shape != (p,):
        raise ValueError(f"start_s must hold one time per rank ({p}), got shape {start.shape}")
    coll = Collective(kind, int(nbytes), root=root, algorithm=algorithm)
    return play(QueueState(topo), coll, start, np.random.default_rng(seed)) / 1e9


def bucket_sizes(model_bytes: int, bucket_bytes: int, first_bucket_bytes: int) -> list[int]:
    """Gradient buckets in the order DDP reduces them: a small first bucket (DDP's default
    is 1 MiB, so that communication starts early), then buckets of `bucket_bytes`."""
    if model_bytes == 0:
        return []
    first = min(model_bytes, first_bucket_bytes or bucket_bytes)
    full, rest = divmod(model_bytes - first, bucket_bytes)
    return [first] + [bucket_bytes] * full + ([rest] if rest else [])


def _rounds(coll: Collective, p: int) -> int:
    return 2 * (p - 1) if coll.algorithm == "ring" else max(1, (p - 1).bit_length()) * 2


class RingPorts:
    """The fabric's ports as `_ring_kernel` sees them: a ring of one process per node puts
    one flow on each port per round (the hop j -> j+1 of a leaf's last node uses one uplink,
    ECMP-hashed), so each port is a queue tail, kept across the simulation's collectives.
    For fabrics whose ports draw nothing (no jitter, loss or reordering; rate, delay and
    limit are fine); a tail drop sets `overflow`, and the caller replays exactly instead."""

    def __init__(self, topology: Topology) -> None:
        p = topology.world_size
        self.specs = topology.port_specs()
        self.hops = topology.paths(np.arange(p), (np.arange(p) + 1) % p)
        self.delay = np.array([s.delay_ns for s in self.specs], dtype=np.int64)
        self.tail = np.full(len(self.specs), -(2**62), dtype=np.int64)
        self.limit = np.array([s.limit if s.rate_bps else 0 for s in self.specs], np.int64)
        self.overflow = np.zeros(1, dtype=np.int64)

    @staticmethod
    def applies(topology: Topology) -> bool:
        """Ports that draw nothing, behind NICs that release in order (a rate, or no
        jitter): each port then sees its flow's packets in order, and a tail is exact."""
        nic = topology.nic
        return (bool(nic.rate_bps) or not nic.jitter_ns) and all(
            not s.jitter_ns and not s.reorder and not s.duplicate and loss_probability(s) == 0
            for s in topology.port_specs())

    def for_segments(self, payload: np.ndarray) -> tuple:
        ptime = np.zeros((len(self.specs), len(payload)), dtype=np.int64)
        for spec in set(self.specs):
            if spec.rate_bps:
                rows = [i for i, s in enumerate(self.specs) if s == spec]
                ptime[rows] = packet_time_ns(spec, payload + HEADER_BYTES)
        return self.hops, ptime, self.delay, self.tail, self.limit, self.overflow


def _ring_rounds_fast(
    spec: Netem, start: np.ndarray, nbytes: int, rng: np.random.Generator, overhead_ns: int = 0,
    message_passing: bool = False, procs_per_node: int = 1, ports: RingPorts | None = None,
) -> np.ndarray:
    """Ring all-reduce completion times, one process per node, every NIC with `spec`.

    The recurrence of `schedule.play` for this case, compiled with numba: rank j is ready for
    round s+1 when it is ready itself and the chunk from rank j-1 has arrived; a chunk leaves
    when its sender is ready, waits behind the sender's NIC tail if there is a rate, and is
    delayed per segment by netem's jitter (a message arrives with its last segment). A 1024-
    node ring has 2046 rounds of 1024 messages: ~2 million delays per all-reduce.

    procs_per_node > 1 (for `ring_round_seconds` only): rank j's hop to j+1 crosses the NIC
    only when j is the last process of its node; the others are free (an unimpaired intra-
    node link, and the node's one NIC-crossing sender has its queue to itself).

    message_passing=True times a ring written from isend/irecv on Gloo instead
    (`p2p_ring_allreduce`): a round's send completes only once the receiver has posted its
    receive, and a connection delivers in order.
    """
    p = len(start)
    payload = segments(-(-nbytes // p), SEGMENT_BYTES)
    wire = (packet_time_ns(spec, payload + HEADER_BYTES).astype(np.int64) if spec.rate_bps
            else None)
    table = (delay_values_ns(spec) if spec.jitter_ns and spec.distribution != "uniform"
             else None)
    p_loss = loss_probability(spec)
    rto = max(RTO_MIN_NS, 2 * spec.delay_ns)
    fast_retx = 3 * spec.delay_ns  # the SACK's way back, then the resend's way there
    loss = np.array([p_loss, rto, fast_retx], dtype=np.float64) if p_loss > 0 else None
    if ports is not None:
        ports = ports.for_segments(payload)
    return _ring_kernel(np.asarray(start, dtype=np.int64).copy(), len(payload), wire, table,
                        spec.delay_ns, min(spec.jitter_ns, 2**31 - 1), overhead_ns, loss,
                        int(rng.integers(0, 2**31)),
                        np.empty(p, dtype=np.int64) if message_passing else None,
                        procs_per_node if procs_per_node > 1 else None, ports)


# The ring `ring_round_seconds` runs to measure the growth per round: long enough that the
# per-round time has settled (it changes by < 3 % from 32 to 1024 ranks for uniform, normal
# and pareto jitter), and within a budget of about RING_DRAW_BUDGET delay draws.
RING_CALIBRATION_RANKS = 128
RING_DRAW_BUDGET = 1 << 19
RING_MIN_RANKS = 32
RING_MIN_NODES = 8  # with several processes per node: at least this many NIC hops


def ring_round_seconds(spec: Netem, message_bytes: int, *, procs_per_node: int = 1,
                       seed: int = 0) -> float:
    """The growth per round of a long ring all-reduce whose messages are `message_bytes`,
    every NIC with `spec` (loss left out): the time constant g of its last-passage
    percolation, T(rounds) ~ g x rounds (see docs/models.md, "A ring under jitter").

    g has no closed form for netem's delay laws (it has for exponential or geometric
    weights only), so it is measured once here, deterministically: the simulator's own
    ring recurrence on RING_CALIBRATION_RANKS ranks (fewer for many-segment messages, at
    least RING_MIN_RANKS), the completion of the slowest rank over 2(p-1) rounds, averaged
    over seeds until about RING_DRAW_BUDGET delays were drawn. A few milliseconds. With
    procs_per_node > 1 the ring has that many processes per node (as many ranks, at least
    RING_MIN_NODES nodes), and only one hop in procs_per_node crosses a NIC.
    """
    if message_bytes < 0:
        raise ValueError(f"message_bytes must be >= 0, got {message_bytes}")
    k = len(segments(message_bytes, SEGMENT_BYTES))
    if procs_per_node < 1:
        raise ValueError(f"procs_per_node must be >= 1, got {procs_per_node}")
    ranks = min(RING_CALIBRATION_RANKS, max(RING_MIN_RANKS, np.sqrt(RING_DRAW_BUDGET / (2 * k))))
    nodes = max(RING_MIN_NODES, int(ranks) // procs_per_node)
    ranks = nodes * procs_per_node
    rounds = 2 * (ranks - 1)
    seeds = max(1, RING_DRAW_BUDGET // (ranks * rounds * k))  # hops inside nodes cost too
    quiet = replace(spec, loss=None, corrupt=0.0)  # loss has its own term in the step model
    rng = np.random.default_rng(seed)
    done = [_ring_rounds_fast(quiet, np.zeros(ranks, dtype=np.int64), message_bytes * ranks,
                              rng, procs_per_node=procs_per_node).max() for _ in range(seeds)]
    return float(np.mean(done)) / rounds / 1e9


@_njit
def _splitmix64(state):
    """One step of splitmix64 (Steele et al. 2014): (new state, a well-mixed 64-bit number)."""
    state = state + np.uint64(0x9E3779B97F4A7C15)
    z = state
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return state, z ^ (z >> np.uint64(31))


@_njit
def _ring_kernel(ready, k, wire, table, mu, sigma, overhead, loss, seed, entered, every,
                 ports):
    # One compiled variant per combination of the optional arguments (None or not: numba
    # prunes the `is None` branches at compile time): a rate (`wire`), a delay table (`table`;
    # without one, uniform jitter or none), loss (`loss` = [p, rto, fast retransmit]), the
    # message-passing ring (`entered`), several processes per node (`every`), the fabric's
    # ports (`ports`). The common cases run no test for what they do not have.
    # A generator inlined in the loop: numba's np.random costs ~10 ns a draw, and a 1024-node
    # ring needs millions of draws per all-reduce.
    state = np.uint64(seed)
    p = ready.shape[0]
    tail = np.full(p, -(2**62), dtype=np.int64)
    p_loss = 0.0
    log_keep = -np.inf
    until_loss = np.int64(0)  # segments left before the next loss (drawn at the first one)
    if loss is not None:
        p_loss = loss[0]
        log_keep = np.log(1.0 - p_loss) if 0.0 < p_loss < 1.0 else -np.inf
        state, x = _splitmix64(state)
        u = ((x >> np.uint64(11)) + 1) * (1.0 / 9007199254740993.0)
        until_loss = np.int64(np.log(u) / log_keep)
    if ports is not None:  # unpacked once: each unpacking counts references to 6 arrays
        hops, ptime, pdelay, ptail, plimit, overflow = ports
    span = np.uint64(2 * sigma)
    low = mu - sigma
    clip = low < 0  # a negative delay means "send now"; impossible unless sigma > mu
    delivered = np.full(p, -(2**62), dtype=np.int64)  # last arrival on j's connection
    for _ in range(2 * (p - 1)):
        if entered is not None:
            entered[:] = ready  # when each rank entered the round (and posted its receive)
        local = 0
        carry = np.int64(-(2**62))  # the arrival from j - 1 in this round
        for j in range(p):
            send = ready[j] + overhead
            # j has sent this round's chunk: it may now take in the one from j - 1 (one pass
            # over the ring, instead of a second loop moving arrivals into `ready`)
            if carry > ready[j]:
                ready[j] = carry
            if every is not None:
                local += 1
                if local < every:  # a hop inside a node: unimpaired, instantaneous
                    carry = send
                    continue
                local = 0
            t = tail[j]
            last = send
            for seg in range(k):
                if sigma == 0:
                    d = mu
                else:
                    state, x = _splitmix64(state)
                    if table is None:  # uniform on [mu - sigma, mu + sigma)
                        d = low + np.int64(((x >> np.uint64(32)) * span) >> np.uint64(32))
                        if clip and d < 0:
                            d = 0
                    else:  # one of the table's 4096 equally likely delays
                        d = table[np.int64(x >> np.uint64(52))]
                if wire is not None:
                    t = max(send + d, t) + wire[seg]
                    here = t
                else:
                    here = send + d
                recovered = False
                if loss is not None:
                    until_loss -= 1
                    if until_loss < 0:
                        # Geometric skip: draw how many segments pass before the next loss,
                        # instead of one random number per segment.
                        state, x = _splitmix64(state)
                        u = ((x >> np.uint64(11)) + 1) * (1.0 / 9007199254740993.0)
                        until_loss = np.int64(np.log(u) / log_keep)
                        # TCP recovery, as schedule._recover (a second loss is ignored here):
                        # SACKs of 3 later segments come back one reverse delay later and the
                        # resend crosses again; without them, the RTO fires.
                        if seg + DUPTHRESH < k:
                            here += np.int64(loss[2])
                        else:
                            here = send + np.int64(loss[1]) + mu
                        recovered = True
                if ports is not None:
                    # The fabric's ports on the way to j + 1, each carrying this ring's one
                    # flow per round: a queue tail each (`fabric._port_kernel` reduces to it)
                    for h in range(hops.shape[1]):
                        q = hops[j, h]
                        if q < 0:
                            break
                        length = ptime[q, seg]
                        if recovered:  # a retransmission, out of the flow's order: it finds
                            here += length + pdelay[q]  # the port idle, and queues no one
                            continue
                        if length > 0:
                            if plimit[q] > 0 and ptail[q] - here >= plimit[q] * length:
                                overflow[0] = 1  # a drop: the caller replays it exactly
                            if ptail[q] > here:
                                here = ptail[q]
                            here += length
                            ptail[q] = here
                        here += pdelay[q]
                if here > last:
                    last = here
            if wire is not None:
                tail[j] = t
            if entered is not None:
                if last < delivered[j]:
                    last = delivered[j]  # TCP delivers in order
                delivered[j] = last
            carry = last
        if carry > ready[0]:  # rank p - 1's chunk reaches rank 0
            ready[0] = carry
        if entered is not None:
            # Gloo completes a send only when the receiver has posted the matching receive,
            # and the ring's next round waits for that send: rank j goes on no earlier than
            # its right neighbour entered this round.
            for j in range(p):
                nxt = j + 1 if j + 1 < p else 0
                if entered[nxt] > ready[j]:
                    ready[j] = entered[nxt]
    return ready


def p2p_ring_allreduce(
    nic: str | Netem, ranks: int, nbytes: int, *, seeds: int = 200,
    start: np.ndarray | None = None, overhead_s: float = 0.0, seed: int = 0,
) -> np.ndarray:
    """Completion times (s, the slowest rank) of the course's ring all-reduce written from
    isend/irecv (`collectives.ring_allreduce`), one process per node, over `seeds` draws.

    Not the replay of `dist.all_reduce` (`schedule.play`), which times the pure schedule:
    each message here also waits for Gloo's rendezvous (a send completes only once the
    receiver has posted its receive, and the next round waits for it) and for the earlier
    messages of its connection (TCP delivers in order). `start` (seeds x ranks, s) gives each
    draw's entry times; `overhead_s` is a per-message software cost of the sender.
    """
    spec = nic if isinstance(nic, Netem) else Netem.parse(nic)
    if ranks < 1 or seeds < 1:
        raise ValueError(f"ranks and seeds must be >= 1, got {ranks} and {seeds}")
    starts = (np.zeros((seeds, ranks)) if start is None
              else np.asarray(start, dtype=float).reshape(seeds, ranks))
    rng = np.random.default_rng(seed)
    overhead = int(overhead_s * 1e9)
    return np.array([_ring_rounds_fast(spec, (row * 1e9).astype(np.int64), nbytes, rng,
                                       overhead, message_passing=True).max() / 1e9
                     for row in starts])


def scaling_curve(node_counts, **kwargs) -> list[dict]:
    """simulate_training at several node counts; each entry adds throughput and efficiency.

    Scaling efficiency at N nodes = throughput(N) / (N x throughput(1)).
    """
    base = None
    out = []
    for n in node_counts:
        res = simulate_training(int(n), **kwargs)
        row = res.summary()
        if base is None:
            base = simulate_training(1, **kwargs).throughput / (kwargs.get("procs_per_node", 1))
        row["efficiency"] = row["throughput"] / (base * res.world_size)
        out.append(row)
    return out

