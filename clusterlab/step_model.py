"""The closed-form training step: how long one data-parallel step takes on N nodes, in
microseconds of arithmetic (the throughput explorer's curve; see docs/models.md).

A step is forward (a third of the compute), backward (two thirds, yielding gradient bytes at
a steady rate) and one all-reduce per gradient bucket on one communication stream: with
overlap, bucket b's all-reduce starts when the backward pass has produced it (or when the
previous one ends), without overlap after the whole backward pass. This is the recurrence
of `clusterlab.sim.simulate_training` with every time replaced by its prediction:

* `allreduce_seconds`: one all-reduce of one bucket, from the α-β costs of
  `clusterlab.models` plus terms for jitter (a jittery ring's time per round, measured once
  by `sim.ring_round_seconds`; order statistics, `models.expected_max`, elsewhere) and for
  loss (`models.tail_at_scale`);
* `predict_step`: the step at one node count (`StepPrediction`: step, compute,
  communication, throughput, efficiency);
* `predicted_curve`: the step at N = 1, 2, 4, ..., 1024 (`NODE_COUNTS`).

Its input is a `TrainingSetup`, in the units of the explorer's sliders, which also gives the
simulator's arguments for the same setup (`sim_kwargs`). The closed form is an approximation
where the simulator is exact: where the two disagree (heavy jitter, loss), the gap is the
lesson.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

from . import models
from .netem import Netem, netem_string
from .schedule import loss_probability
from .sim import bucket_sizes, ring_round_seconds
from .wire import DUPTHRESH, RTO_MIN_NS, segment_count, wire_beta

NODE_COUNTS = tuple(2**i for i in range(11))  # 1 .. 1024, the curve's x values
MIB = 2**20
FIRST_BUCKET_BYTES = MIB  # DDP's small first bucket, as in simulate_training
# The all-reduce algorithms `allreduce_seconds` has a closed form for: those of
# `schedule.ALLREDUCE_SCHEDULES` but the rail-style hierarchical one.
STEP_MODEL_ALGORITHMS = ("ring", "recursive_doubling", "rabenseifner", "tree", "hierarchical")


@dataclass(frozen=True)
class TrainingSetup:
    """Everything one prediction depends on, in the units of the sliders."""

    nodes: int = 16
    procs_per_node: int = 1
    latency_us: float = 20
    jitter_us: float = 5
    distribution: str = "normal"
    bandwidth_gbit: float = 100
    loss_pct: float = 0
    model_mib: float = 100
    compute_ms: float = 100
    bucket_mib: float = 25
    overlap: bool = True
    algorithm: str = "ring"
    batch_per_rank: int = 32

    @property
    def nic(self) -> str:
        """The NIC's netem string, e.g. "delay 20us 5us distribution normal rate 100gbit"."""
        return netem_string(self.latency_us, self.jitter_us, self.distribution,
                            self.bandwidth_gbit, self.loss_pct)

    @functools.cached_property
    def spec(self) -> Netem:
        return Netem.parse(self.nic)

    @property
    def ranks(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def model_bytes(self) -> int:
        return int(self.model_mib * MIB)

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_mib * MIB)

    @property
    def compute_s(self) -> float:
        return self.compute_ms / 1e3

    @property
    def buckets(self) -> list[int]:
        """Gradient bucket sizes in reduction order (the simulator's own split)."""
        return bucket_sizes(self.model_bytes, self.bucket_bytes, FIRST_BUCKET_BYTES)

    def sim_kwargs(self, steps: int, seed: int = 0) -> dict[str, Any]:
        """The arguments of `simulate_training` for this setup."""
        return dict(nodes=self.nodes, procs_per_node=self.procs_per_node, nic=self.nic or None,
                    model_bytes=self.model_bytes, bucket_bytes=self.bucket_bytes,
                    first_bucket_bytes=FIRST_BUCKET_BYTES, compute_s=self.compute_s,
                    overlap=self.overlap, algorithm=self.algorithm, steps=steps,
                    batch_per_rank=self.batch_per_rank, seed=seed)


@dataclass(frozen=True)
class StepPrediction:
    """The closed form's training step at one node count (seconds, samples/s)."""

    nodes: int
    ranks: int
    step_s: float
    compute_s: float
    comm_s: float  # all buckets' all-reduces back to back, overlapped or not
    samples_per_step: int

    @property
    def exposed_s(self) -> float:
        """Communication the step waits for: what overlap could not hide."""
        return self.step_s - self.compute_s

    @property
    def throughput(self) -> float:
        return self.samples_per_step / self.step_s

    @property
    def efficiency(self) -> float:
        """Throughput over `ranks` times one lone rank's (which only computes)."""
        return self.compute_s / self.step_s


@functools.lru_cache(maxsize=4096)
def _jitter_max(k: int, distribution: str) -> float:
    """E[max of k netem jitter draws] in units of the jitter (cached: tables cost ~50 us)."""
    return models.expected_max(k, distribution, 1.0)


@functools.lru_cache(maxsize=1024)
def _ring_round(spec: Netem, message: int, procs_per_node: int) -> float:
    """Growth per round of a long jittery ring (`sim.ring_round_seconds`; a few ms, cached)."""
    return ring_round_seconds(spec, message, procs_per_node=procs_per_node)


def _rounds(algorithm: str, nodes: int) -> int:
    """Rounds of the log-depth algorithms among `nodes` (see models' docstrings)."""
    lg = nodes.bit_length() - 1
    fold = 0 if nodes & (nodes - 1) == 0 else 2  # non-powers of two fold ranks in and out
    return {"recursive_doubling": lg + fold, "rabenseifner": 2 * lg + fold,
            "tree": 2 * (nodes - 1).bit_length()}[algorithm]


def allreduce_seconds(algorithm: str, nodes: int, procs_per_node: int, nbytes: int,
                      spec: Netem) -> float:
    """Predicted time of one all-reduce of `nbytes` (closed form, see the module docstring).

    α-β part (models): ring over all ranks, where only one hop in procs_per_node crosses a
    NIC (the others stay inside the node, unimpaired): the latency term shrinks by that
    factor, the bandwidth term does not; hierarchical as in `models.hierarchical_allreduce`
    with free intra-node steps; the log-depth algorithms among nodes with β times
    procs_per_node, because all processes of a node then share its NIC. β is the wire's
    (`wire.wire_beta`: every segment carries its headers).
    Jitter, on a ring (over all ranks, or the node ring of hierarchical): its completion
    is a longest path through 2(p-1) rounds x p ranks, linear in the rounds with a time
    constant g per round (`sim.ring_round_seconds`, measured once per NIC, message size and
    processes per node; docs/models.md, "A ring under jitter"): 2(p-1) g replaces the α and
    β terms. The log-depth algorithms: every round waits for the last segment of its
    message, delay + E[max of k draws].
    Loss: a round in which one of the m messages loses a tail segment waits for TCP's
    retransmission timeout; `tail_at_scale(loss, m x segments)` is how often that happens.
    Charging it to every round as if rounds were barriers is an upper bound (rounds overlap
    in reality): against the simulator it is exact within a few percent without loss, and
    up to ~1.6x too slow at 64 nodes with 0.01% loss.
    """
    if algorithm not in STEP_MODEL_ALGORITHMS:
        raise ValueError(f"no closed form for the all-reduce algorithm {algorithm!r}; "
                         f"choose from {', '.join(STEP_MODEL_ALGORITHMS)}")
    p = nodes * procs_per_node
    if p == 1 or nbytes <= 0:
        return 0.0
    alpha = spec.delay_s
    beta = wire_beta(spec.rate_bps)
    ring = 0  # ranks in a ring, whose jitter is a longest path
    if algorithm == "ring":
        # Only one hop in procs_per_node leaves a node: latency is paid on that fraction of
        # the 2(p-1) rounds, but every round each NIC still serialises one chunk.
        base = max(models.ring_allreduce(p, nbytes, 0.0, beta),
                   models.ring_allreduce(p, nbytes, alpha, beta) / procs_per_node)
        rounds = -(-2 * (p - 1) // procs_per_node)
        message, fan, ring = -(-nbytes // p), nodes, p
    elif algorithm == "hierarchical":
        base = models.hierarchical_allreduce(nodes, procs_per_node, nbytes, alpha_intra=0.0,
                                             beta_intra=0.0, alpha_inter=alpha, beta_inter=beta)
        rounds, message, fan, ring = 2 * (nodes - 1), -(-nbytes // nodes), nodes, nodes
    else:
        if nodes == 1:
            return 0.0  # every round stays inside the node
        base = models.allreduce_time(algorithm, nodes, nbytes, alpha, beta * procs_per_node)
        rounds, message, fan = _rounds(algorithm, nodes), nbytes, p
        if algorithm == "rabenseifner":
            message = -(-nbytes // 2)  # the first (largest) halving message
    if rounds == 0:
        return base
    k = segment_count(message)  # segments per message
    extra = 0.0
    if spec.jitter_ns and ring > 1:
        # A ring under jitter: a longest path through its rounds, whose growth per round g
        # (wire time included) replaces the latency and bandwidth terms.
        ppn = 1 if algorithm == "hierarchical" else procs_per_node
        base = 2 * (ring - 1) * _ring_round(spec, message, ppn)
    elif spec.jitter_ns:
        extra += rounds * spec.jitter_s * _jitter_max(k, spec.distribution)
    q = loss_probability(spec)
    if q > 0:
        rto = max(RTO_MIN_NS / 1e9, 4 * alpha)  # Linux's 200 ms floor, or twice the round trip
        # Fast retransmit needs DUPTHRESH later segments: the last ones wait for the RTO.
        tail, body = min(k, DUPTHRESH), max(k - DUPTHRESH, 0)
        extra += rounds * (models.tail_at_scale(q, fan * tail) * (rto + alpha)
                           + models.tail_at_scale(q, fan * body) * 3 * alpha)
    return base + extra


def predict_step(setup: TrainingSetup, nodes: int | None = None) -> StepPrediction:
    """The closed-form step at `nodes` (default: setup.nodes).

    Forward is a third of the compute, backward two thirds; bucket b is ready when the
    backward pass has produced it; with overlap its all-reduce starts then (or when the
    previous one ends), without overlap after the whole backward pass: the recurrence of
    `simulate_training` with every time replaced by its prediction.
    """
    nodes = setup.nodes if nodes is None else nodes
    spec, compute = setup.spec, setup.compute_s
    forward = compute / 3
    buckets = setup.buckets
    stream = 0.0
    comm = 0.0
    produced = 0
    for size in buckets:
        t = allreduce_seconds(setup.algorithm, nodes, setup.procs_per_node, size, spec)
        produced += size  # the backward pass yields gradient bytes at a steady rate
        ready = forward + (compute - forward) * produced / sum(buckets) if setup.overlap \
            else compute
        stream = max(ready, stream) + t
        comm += t
    ranks = nodes * setup.procs_per_node
    return StepPrediction(nodes=nodes, ranks=ranks, step_s=max(stream, compute),
                          compute_s=compute, comm_s=comm,
                          samples_per_step=setup.batch_per_rank * ranks)


@functools.lru_cache(maxsize=64)
def _curve(setup: TrainingSetup) -> tuple[StepPrediction, ...]:
    return tuple(predict_step(setup, n) for n in NODE_COUNTS)


def predicted_curve(setup: TrainingSetup) -> tuple[StepPrediction, ...]:
    """predict_step at N = 1, 2, 4, ..., 1024 (cached: dragging N alone costs nothing)."""
    return _curve(replace(setup, nodes=1))
