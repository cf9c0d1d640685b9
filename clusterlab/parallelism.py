"""What sharding and model parallelism put on the network: closed forms and a simulator.

Data parallel and its sharded variants move the model's parameters or gradients once or
more per step; tensor parallelism moves activations inside every layer; pipeline
parallelism moves activations between stages and pays a bubble; a mixture of experts moves
tokens to their experts and back (all-to-all). This module gives, for each, the bytes one
rank sends per step and the time the communication takes on an alpha-beta network (from
`clusterlab.models`), and replays pipelines and all-to-alls over the same link model as the
backend (`clusterlab.schedule`), so the notebook's measurements at 4-8 ranks and the
widgets' curves to 1024+ nodes come from one set of formulas.

Notation: params = parameters of the model (Psi), dtype_bytes = bytes per element, ranks = N
data-parallel ranks; alpha = seconds per message, beta = seconds per byte.

Sources: ZeRO: Rajbhandari et al., "ZeRO: Memory optimizations toward training trillion
parameter models", SC 2020 (sections 5 and 7: Psi per rank for DDP, ZeRO-1 and -2, 1.5 Psi
for ZeRO-3). Megatron-LM: Shoeybi et al. 2019 (two all-reduces per transformer layer in the
forward pass, two in the backward). GPipe: Huang et al., NeurIPS 2019 (bubble (p-1)/(m+p-1));
1F1B: Narayanan et al., "PipeDream", SOSP 2019 and Megatron-LM, SC 2021 (the same bubble,
activations of at most p micro-batches in flight). MoE: Lepikhin et al., "GShard", 2020
(capacity factor; dispatch and combine all-to-alls).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import models
from .models import _count, _nonnegative
from .netem import Netem
from .schedule import Collective, QueueState, play
from .topology import Topology

DP_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
PIPELINE_SCHEDULES = ("gpipe", "1f1b")
PARALLELISMS = ("dp", "fsdp", "tp", "pp")


def _strategy(strategy: str) -> str:
    if strategy not in DP_STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(DP_STRATEGIES)}, got {strategy!r}")
    return strategy


# --- data parallel and ZeRO / FSDP --------------------------------------------------------------


def sharded_traffic(strategy: str, *, params: int, ranks: int, dtype_bytes: int = 4,
                    reshard_after_forward: bool = True) -> dict[str, float]:
    """Bytes one rank sends per step, by collective, with ring algorithms:
    {"allreduce": .., "allgather": .., "reduce_scatter": .., "total": ..}.

    ddp: one all-reduce of the gradients, 2(N-1)/N Psi b (a ring all-reduce is a
    reduce-scatter plus an all-gather). zero1, zero2: a reduce-scatter of the gradients (each
    rank keeps the shard its optimizer state covers) and an all-gather of the updated
    parameters: the same 2(N-1)/N Psi b as DDP; they differ in memory, not traffic. zero3 and
    fsdp: parameters live sharded, so each unit is all-gathered before its forward and again
    before its backward, and the gradients are reduce-scattered: 3(N-1)/N Psi b, 1.5x DDP.
    fsdp with reshard_after_forward=False keeps the gathered parameters from the forward to
    the backward: 2(N-1)/N Psi b, like DDP, at the memory of unsharded parameters.
    """
    _strategy(strategy)
    n = _count(ranks, "ranks")
    volume = _count(params, "params", 0) * _count(dtype_bytes, "dtype_bytes")
    share = (n - 1) / n * volume  # one ring reduce-scatter or all-gather of the whole model
    out = {"allreduce": 0.0, "allgather": 0.0, "reduce_scatter": 0.0}
    if strategy == "ddp":
        out["allreduce"] = 2 * share
    elif strategy in ("zero1", "zero2"):
        out["reduce_scatter"], out["allgather"] = share, share
    else:
        gathers = 2 if strategy == "zero3" or reshard_after_forward else 1
        out["reduce_scatter"], out["allgather"] = share, gathers * share
    out["total"] = sum(out.values())
    return out


def sharded_memory(strategy: str, *, params: int, ranks: int, param_bytes: int = 2,
                   grad_bytes: int = 2, optimizer_bytes: int = 12) -> float:
    """Bytes of model state per rank (ZeRO paper, section 5): mixed-precision Adam keeps
    2 + 2 + 12 = 16 bytes per parameter (fp16 parameters and gradients; fp32 master copy,
    momentum and variance). ZeRO-1 shards the optimizer state, ZeRO-2 the gradients too,
    ZeRO-3 and FSDP everything: 16 Psi / N."""
    _strategy(strategy)
    n = _count(ranks, "ranks")
    psi = _count(params, "params", 0)
    p, g, k = (_count(x, name, 0) for x, name in ((param_bytes, "param_bytes"),
                                                   (grad_bytes, "grad_bytes"),
                                                   (optimizer_bytes, "optimizer_bytes")))
    if strategy == "ddp":
        return float(psi * (p + g + k))
    if strategy == "zero1":
        return psi * (p + g) + psi * k / n
    if strategy == "zero2":
        return psi * p + psi * (g + k) / n
    return psi * (p + g + k) / n


def sharded_comm_seconds(strategy: str, *, params: int, ranks: int, alpha: float, beta: float,
                         dtype_bytes: int = 4, units: int = 1,
                         reshard_after_forward: bool = True) -> float:
    """Communication time of one step with nothing overlapped: the sum of its ring
    collectives' alpha-beta costs (`clusterlab.models`). DDP sends one all-reduce (one
    bucket); the sharded strategies one collective per unit (FSDP's `fully_shard` modules,
    a ZeRO bucket) for each all-gather and reduce-scatter of `sharded_traffic`."""
    _strategy(strategy)
    n = _count(ranks, "ranks")
    u = _count(units, "units")
    size = _count(params, "params", 0) * _count(dtype_bytes, "dtype_bytes")
    if strategy == "ddp":
        return models.ring_allreduce(n, size, alpha, beta)
    each = size / u
    gathers = 1 if strategy in ("zero1", "zero2") else (
        2 if strategy == "zero3" or reshard_after_forward else 1)
    return u * (gathers * models.ring_allgather(n, each, alpha, beta)
                + models.ring_reduce_scatter(n, each, alpha, beta))


def fsdp_forward_seconds(*, layers: int, gather_s: float, compute_s: float,
                         prefetch: bool) -> float:
    """Forward time of `layers` FSDP units, each all-gathering its parameters (gather_s)
    and then computing (compute_s), the all-gathers one at a time on the network.

    Without overlap each unit waits for its own all-gather: L(g + c). With the next unit's
    all-gather issued as a unit starts computing (one unit ahead), the first all-gather is
    exposed, each of the L-1 later units starts after max(g, c), and the last computes:
    g + c + (L-1) max(g, c), a saving of (L-1) min(g, c). (FSDP2 on a GPU overlaps like
    this by default, issuing all-gathers on their own stream; a CPU process blocks.)"""
    n = _count(layers, "layers")
    g, c = _nonnegative(gather_s, "gather_s"), _nonnegative(compute_s, "compute_s")
    if not prefetch:
        return n * (g + c)
    return g + c + (n - 1) * max(g, c)


# --- tensor parallel --------------------------------------------------------------------------


def tp_allreduces(layers: int, *, blocks_per_layer: int = 2) -> dict[str, int]:
    """All-reduces of Megatron-style tensor parallelism per step: each block (a column-split
    then row-split pair of matrices: the MLP, the attention) ends its forward with one
    all-reduce of its output (g) and starts its backward with one of the input gradient (f).
    A transformer layer has two blocks: 2 all-reduces forward and 2 backward."""
    k = _count(layers, "layers") * _count(blocks_per_layer, "blocks_per_layer")
    return {"forward": k, "backward": k, "total": 2 * k}


def tp_traffic(*, layers: int, ranks: int, activation_bytes: int,
               blocks_per_layer: int = 2) -> float:
    """Bytes one rank sends per step: every all-reduce moves the whole activation
    (batch x sequence x hidden x b), ring: 2(t-1)/t of it."""
    t = _count(ranks, "ranks")
    count = tp_allreduces(layers, blocks_per_layer=blocks_per_layer)["total"]
    return count * 2 * (t - 1) / t * _count(activation_bytes, "activation_bytes", 0)


def tp_comm_seconds(*, layers: int, ranks: int, activation_bytes: int, alpha: float,
                    beta: float, blocks_per_layer: int = 2) -> float:
    """Time of a step's TP all-reduces: each is on the critical path (the next matrix needs
    its result), so they add up: count x ring all-reduce(t, activation)."""
    count = tp_allreduces(layers, blocks_per_layer=blocks_per_layer)["total"]
    return count * models.ring_allreduce(_count(ranks, "ranks"), activation_bytes, alpha, beta)


# --- pipeline parallel ------------------------------------------------------------------------


def bubble_fraction(stages: int, microbatches: int) -> float:
    """Share of a pipeline step a stage idles: (p-1)/(m+p-1), for GPipe and 1F1B alike
    (1F1B changes the memory, at most p micro-batches' activations, not the bubble)."""
    p, m = _count(stages, "stages"), _count(microbatches, "microbatches")
    return (p - 1) / (m + p - 1)


def pipeline_step_seconds(*, stages: int, microbatches: int, forward_s: float,
                          backward_s: float, message_s: float = 0.0,
                          serialise_s: float = 0.0) -> float:
    """GPipe step on a network whose stage-to-stage message takes `message_s` from send to
    arrival: (m+p-1)(t_f+t_b) + 2(p-1) c. The first micro-batch's forward crosses p-1
    links, and so does the last one's backward; the rest overlaps with compute.

    Valid only while the link keeps up with the stages: a message's time on the wire
    (`serialise_s`, its bytes / rate, part of `message_s`) must not exceed the shorter of
    t_f and t_b, else the link, not the compute, paces the pipeline and messages queue
    behind each other. Outside that domain this raises ValueError: replay the schedule with
    `simulate_pipeline` instead (as `step_seconds("pp", ...)` does)."""
    p, m = _count(stages, "stages"), _count(microbatches, "microbatches")
    tf, tb, c, w = (_nonnegative(x, name) for x, name in ((forward_s, "forward_s"),
                                                           (backward_s, "backward_s"),
                                                           (message_s, "message_s"),
                                                           (serialise_s, "serialise_s")))
    if p > 1 and m > 1 and w > min(tf, tb):
        raise ValueError(f"serialise_s={w:g} s exceeds the per-micro-batch compute "
                         f"(forward_s={tf:g}, backward_s={tb:g}): the link paces this pipeline "
                         "and the closed form does not hold; use simulate_pipeline")
    return (m + p - 1) * (tf + tb) + 2 * (p - 1) * c


def pipeline_order(schedule: str, stages: int, microbatches: int, stage: int) -> list[tuple]:
    """The operations stage `stage` runs, in order: ("F", j) forward of micro-batch j,
    ("B", j) its backward. GPipe: all forwards, then all backwards (in reverse). 1F1B:
    p-1-stage warm-up forwards, then one forward and one backward in turn, then the
    remaining backwards."""
    if schedule not in PIPELINE_SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(PIPELINE_SCHEDULES)}, "
                         f"got {schedule!r}")
    p, m = _count(stages, "stages"), _count(microbatches, "microbatches")
    if not 0 <= stage < p:
        raise ValueError(f"stage must be in 0..{p - 1}, got {stage!r}")
    if schedule == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in reversed(range(m))]
    warm = min(p - 1 - stage, m)
    order = [("F", j) for j in range(warm)]
    for j in range(m - warm):
        order += [("F", warm + j), ("B", j)]
    order += [("B", j) for j in range(m - warm, m)]
    return order


@dataclass(frozen=True)
class PipelineRun:
    """A replayed pipeline step: when every stage ran every operation (seconds)."""

    schedule: str
    stages: int
    microbatches: int
    start: dict  # (stage, "F"|"B", j) -> start time
    end: dict  # (stage, "F"|"B", j) -> end time
    step_s: float

    @property
    def bubble(self) -> float:
        """Idle share of the step, averaged over stages."""
        busy = sum(self.end[k] - self.start[k] for k in self.end) / self.stages
        return 1 - busy / self.step_s if self.step_s > 0 else 0.0


def simulate_pipeline(schedule: str, *, stages: int, microbatches: int, forward_s: float,
                      backward_s: float, nic: str | Netem | None = None,
                      activation_bytes: int = 0, seed: int = 0) -> PipelineRun:
    """Replay one pipeline step: stage s is node s, each operation takes its compute time,
    and every activation (forward) or its gradient (backward) crosses the link between
    neighbouring stages through the same link model as the backend's collectives
    (`schedule.QueueState`: netem delay, jitter, rate and loss). Sends do not block compute."""
    p, m = _count(stages, "stages"), _count(microbatches, "microbatches")
    tf, tb = _nonnegative(forward_s, "forward_s"), _nonnegative(backward_s, "backward_s")
    queues = QueueState(Topology.build(p, 1, nic, None))
    rng = np.random.default_rng(seed)
    orders = [pipeline_order(schedule, p, m, s) for s in range(p)]
    arrived: dict = {}  # (stage, kind, j) -> when its input is at that stage (ns)
    start, end = {}, {}
    free = [0] * p
    pos = [0] * p
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            kind, j = orders[s][pos[s]]
            needs = []
            if kind == "F" and s > 0:
                needs.append(arrived.get((s, "F", j)))
            if kind == "B":
                needs.append(end.get((s, "F", j)))
                if s < p - 1:
                    needs.append(arrived.get((s, "B", j)))
            if any(x is None for x in needs):
                continue
            t0 = max([free[s], *needs])
            t1 = t0 + int((tf if kind == "F" else tb) * 1e9)
            start[(s, kind, j)], end[(s, kind, j)] = t0, t1
            free[s] = t1
            to = s + 1 if kind == "F" else s - 1
            if 0 <= to < p:
                (done,) = queues.deliver(np.array([s]), np.array([to]), np.array([t1]),
                                         activation_bytes, rng)
                arrived[(to, kind, j)] = int(done)
            pos[s] += 1
            left -= 1
            moved = True
        if not moved:  # pragma: no cover - the orders above cannot deadlock
            raise RuntimeError("pipeline schedule deadlocked")
    step = max(end.values()) / 1e9
    return PipelineRun(schedule, p, m, {k: v / 1e9 for k, v in start.items()},
                       {k: v / 1e9 for k, v in end.items()}, step)


# --- mixture of experts: all-to-all -----------------------------------------------------------


def moe_traffic(*, tokens_per_rank: int, hidden: int, ranks: int, dtype_bytes: int = 4,
                hot_share: float | None = None,
                capacity_factor: float | None = None) -> dict[str, float]:
    """Bytes of one MoE layer's dispatch all-to-all (the combine is the same, reversed): one
    expert per rank, top-1 routing, T tokens per rank of `hidden` x b bytes each.

    Balanced routing sends (N-1)/N T tokens per rank and keeps 1/N. A hot expert
    that gets `hot_share` h of every rank's tokens, the rest spread evenly: its rank sends
    (1-h)T and receives h(N-1)T; another rank sends hT + (1-h)T(N-2)/(N-1) and receives
    (1-h)T. With a `capacity_factor` cf (GShard), every expert takes at most cf T/N tokens
    from each rank into fixed-size buffers: every rank sends (N-1) cf T/N tokens whatever the
    routing, and a hot expert drops the excess ("dropped": share of all tokens).
    Returns {"sent_hot", "sent_other", "received_hot", "received_other", "dropped"} (bytes,
    and a fraction for "dropped")."""
    n = _count(ranks, "ranks")
    token = _count(hidden, "hidden") * _count(dtype_bytes, "dtype_bytes")
    t = float(_count(tokens_per_rank, "tokens_per_rank", 0))
    h = 1 / n if hot_share is None else _nonnegative(hot_share, "hot_share")
    if not 1 / n - 1e-12 <= h <= 1:
        raise ValueError(f"hot_share must be in [1/ranks, 1] = [{1 / n:g}, 1], got {hot_share!r}")
    if capacity_factor is not None:
        cf = _nonnegative(capacity_factor, "capacity_factor")
        padded = (n - 1) * cf * t / n * token
        dropped = max(0.0, h * t - cf * t / n) / t if t else 0.0
        return {"sent_hot": padded, "sent_other": padded, "received_hot": padded,
                "received_other": padded, "dropped": dropped}
    if n == 1:
        return dict.fromkeys(("sent_hot", "sent_other", "received_hot", "received_other",
                              "dropped"), 0.0)
    return {"sent_hot": (1 - h) * t * token,
            "sent_other": (h * t + (1 - h) * t * (n - 2) / (n - 1)) * token,
            "received_hot": h * (n - 1) * t * token,
            "received_other": (1 - h) * t * token,
            "dropped": 0.0}


def alltoall_seconds(*, ranks: int, delay_s: float, jitter_s: float = 0.0,
                     distribution: str = "uniform", bytes_per_rank: float = 0.0,
                     rate_bps: float = 0.0, last_rank: bool = False) -> float:
    """Expected time of one all-to-all of small messages on a network of `delay_s` +/-
    `jitter_s` per message: a rank is done when the last of its N-1 incoming messages has
    arrived, delay + E[max of N-1 jitter draws] (`models.expected_max`, the order
    statistics); the whole collective, when the last of N(N-1) has (`last_rank=True`). A
    rate adds each rank's serialisation of what it sends (its NIC is its bottleneck)."""
    n = _count(ranks, "ranks")
    if n == 1:
        return 0.0
    draws = n * (n - 1) if last_rank else n - 1
    wire = _nonnegative(bytes_per_rank, "bytes_per_rank") * 8 / rate_bps if rate_bps else 0.0
    return (_nonnegative(delay_s, "delay_s")
            + models.expected_max(draws, distribution, _nonnegative(jitter_s, "jitter_s"))
            + wire)


def simulate_alltoall(*, ranks: int, nic: str | Netem, nbytes: int = 64, repeats: int = 20,
                      seed: int = 0) -> np.ndarray:
    """Per-repeat, per-rank completion times (s) of an all-to-all started by every rank at
    once, replayed by the backend's schedule (`schedule.play`): shape (repeats, ranks)."""
    n = _count(ranks, "ranks")
    queues = QueueState(Topology.build(n, 1, nic, None))
    rng = np.random.default_rng(seed)
    coll = Collective("alltoall", int(nbytes) * n)
    out = np.empty((_count(repeats, "repeats"), n))
    for k in range(len(out)):
        queues.tails.clear()
        out[k] = play(queues, coll, np.zeros(n, dtype=np.int64), rng) / 1e9
    return out


# --- which parallelism where ------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """A dense model, as the step-time comparison needs it."""

    params: int  # parameters
    layers: int
    activation_bytes: int  # one micro-batch's activation at a layer boundary
    compute_s: float  # forward + backward of the whole batch on one rank (no parallelism)
    dtype_bytes: int = 4
    microbatches: int = 8  # for pipeline parallelism
    heads: int = 16  # attention heads: tensor parallelism splits them, at most one per rank


def _nic(alpha: float, beta: float) -> str | None:
    """The netem spec of an alpha-beta link (delay alpha, rate 8/beta bit/s), for the replay."""
    parts = []
    if alpha > 0:
        parts.append(f"delay {alpha * 1e9:.0f}ns")
    if beta > 0:
        parts.append(f"rate {8 / beta:.0f}bit")
    return " ".join(parts) or None


def step_seconds(parallelism: str, shape: ModelShape, *, ranks: int, alpha: float,
                 beta: float) -> float:
    """Step time of `shape` on `ranks` ranks with one kind of parallelism:

    dp: the batch split N ways, plus one gradient all-reduce, not overlapped with the
    backward (an upper bound: DDP overlaps it bucket by bucket); fsdp: the same compute plus
    the sharded collectives, one per layer, not overlapped (prefetching hides part of it);
    tp: each rank computes 1/N of every layer, plus Megatron's 4 all-reduces per layer (2
    blocks x f and g, `tp_allreduces`) of the whole batch's activations, which sit on the
    critical path anyway; at most one attention head per rank (more ranks than
    `shape.heads` is a ValueError); pp: N stages of layers/N, the batch in `microbatches`,
    GPipe replayed over the link model (`simulate_pipeline`, so a link slower than the
    stages' compute queues messages as it would), at most one stage per layer."""
    if parallelism not in PARALLELISMS:
        raise ValueError(f"parallelism must be one of {', '.join(PARALLELISMS)}, "
                         f"got {parallelism!r}")
    n = _count(ranks, "ranks")
    alpha, beta = _nonnegative(alpha, "alpha"), _nonnegative(beta, "beta")
    c = _nonnegative(shape.compute_s, "compute_s") / n
    if parallelism == "dp":
        return c + sharded_comm_seconds("ddp", params=shape.params, ranks=n, alpha=alpha,
                                        beta=beta, dtype_bytes=shape.dtype_bytes)
    if parallelism == "fsdp":
        return c + sharded_comm_seconds("fsdp", params=shape.params, ranks=n, alpha=alpha,
                                        beta=beta, dtype_bytes=shape.dtype_bytes,
                                        units=shape.layers)
    batch = shape.activation_bytes * shape.microbatches
    if parallelism == "tp":
        if n > shape.heads:
            raise ValueError(f"ranks={n} tensor-parallel ranks need at least as many attention "
                             f"heads, the model has heads={shape.heads}")
        return c + tp_comm_seconds(layers=shape.layers, ranks=n, activation_bytes=batch,
                                   alpha=alpha, beta=beta)
    if n > shape.layers:
        raise ValueError(f"ranks={n} pipeline stages need at least as many layers, the model "
                         f"has layers={shape.layers}")
    m = shape.microbatches
    per_mb = shape.compute_s / (n * m)  # one stage, one micro-batch, forward + backward
    return simulate_pipeline("gpipe", stages=n, microbatches=m, forward_s=per_mb / 3,
                             backward_s=2 * per_mb / 3, nic=_nic(alpha, beta),
                             activation_bytes=shape.activation_bytes).step_s


def step_table(shape: ModelShape, *, ranks: Sequence[int], alpha: float, beta: float,
               node_beta: float | None = None, node_ranks: int | None = None) -> dict:
    """{parallelism: [step time at each rank count]} for the "which parallelism where"
    figure and widget; NaN where a pipeline would have more stages than layers, or tensor
    parallelism more ranks than attention heads.

    With `node_beta` (s per byte of a link inside a node, e.g. NVLink's) and `node_ranks`
    (GPUs per node) the table also holds "tp_node": tensor parallelism on that intra-node
    bandwidth (same latency `alpha`), NaN beyond `node_ranks` ranks, where it would leave
    the node."""
    def one(kind, n):
        if (kind == "pp" and n > shape.layers) or (kind == "tp" and n > shape.heads):
            return math.nan
        return step_seconds(kind, shape, ranks=n, alpha=alpha, beta=beta)

    table = {kind: [one(kind, int(n)) for n in ranks] for kind in PARALLELISMS}
    if node_beta is not None:
        limit = min(shape.heads, _count(node_ranks, "node_ranks"))
        table["tp_node"] = [step_seconds("tp", shape, ranks=int(n), alpha=alpha,
                                         beta=_nonnegative(node_beta, "node_beta"))
                            if int(n) <= limit else math.nan for n in ranks]
    return table
