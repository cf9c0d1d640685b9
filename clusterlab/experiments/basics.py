"""Notebook 00: the synchronous training loop, and where a step's time goes.

The loop is the one every multi-node interview question starts from:

    for batch in dataloader:
        loss = model(batch)
        loss.backward()           # local gradients
        all_reduce_gradients()    # synchronisation through the network
        optimizer.step()
        optimizer.zero_grad()

`synchronous_loop` runs exactly that on every rank of a real `clusterlab.Cluster` (a small
MLP, synthetic data, a manual all-reduce of every gradient tensor: `dist.all_reduce(p.grad);
p.grad /= world`) and stamps the boundaries of the four phases with `clusterlab.now()`.
`run_breakdown` starts the cluster and returns plain data: per phase, per rank, per step, in
seconds. `compare` runs the same loop on several networks; `format_breakdown` and
`plot_breakdown` show the result.

The phases are contiguous (each ends where the next begins), so they add up to the step
time exactly; the all_reduce phase includes waiting for the slowest rank to arrive, because
that is what a synchronous step costs.
"""

from __future__ import annotations

import contextlib
import os
import uuid

import numpy as np

from .. import models
from ..cluster import Cluster
from ..cores import usable_cores
from ..netem import Netem

PHASES = ("forward", "backward", "all_reduce", "optimizer")
DEFAULT_SIZES = (256, 512, 512, 10)  # input, two hidden layers, classes
IMPAIRED_NIC = "delay 2ms 500us rate 1gbit"


def make_model(sizes=DEFAULT_SIZES):
    """A small MLP: Linear-ReLU blocks, `sizes` = (inputs, hidden..., classes)."""
    import torch

    layers: list = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def gradient_tensors(sizes=DEFAULT_SIZES) -> list[int]:
    """Bytes of every gradient tensor of `make_model(sizes)` (float32), in parameter order."""
    out = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        out += [a * b * 4, b * 4]  # weight, bias
    return out


def backward_forward_flops(sizes=DEFAULT_SIZES) -> float:
    """FLOPs of the backward pass over those of the forward pass for `make_model(sizes)`.

    A linear layer a -> b on a batch costs one matrix product forward (2·batch·a·b FLOPs);
    backward it costs one for the weight gradient and one for the input gradient, except in
    the first layer, whose input (the data) needs no gradient. So the ratio is
    1 + (the products of every layer but the first) / (the products of all layers), a little
    under 2 (biases, ReLUs and the loss are left out: they are O(batch·b), not O(batch·a·b))."""
    products = [a * b for a, b in zip(sizes[:-1], sizes[1:])]
    return 1 + sum(products[1:]) / sum(products)


# Per rank process: the model, optimizer and data of each running experiment, so that a loop
# run in several chunks (see `compare`) continues where it stopped.
_STATE: dict = {}


def synchronous_loop(steps: int, sizes=DEFAULT_SIZES, batch: int = 128, lr: float = 0.05,
                     seed: int = 0, key: str | None = None) -> dict:
    """Rank body: the seed's synchronous data-parallel loop, timed phase by phase.

    Returns {"times": [[forward, backward, all_reduce, optimizer, step] per step] (seconds),
    "loss": [loss per step], "checksum": sum of all parameters after the last step}.
    With a `key`, the model, optimizer and data survive between calls on the same cluster,
    so several calls continue one training run.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from ..clock import now

    rank, world = dist.get_rank(), dist.get_world_size()
    if key is None or key not in _STATE:
        torch.manual_seed(seed)  # the same initial weights on every rank
        model = make_model(sizes)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        data = torch.Generator().manual_seed(seed + 1 + rank)  # every rank its own shard
        state = {"model": model, "optimizer": optimizer, "data": data}
        if key is not None:
            _STATE[key] = state
    else:
        state = _STATE[key]
    model, optimizer, data = state["model"], state["optimizer"], state["data"]
    xs = torch.randn(steps, batch, sizes[0], generator=data)
    ys = torch.randint(0, sizes[-1], (steps, batch), generator=data)
    times, losses = [], []
    dist.barrier()
    for step in range(steps):
        t0 = now()
        loss = F.cross_entropy(model(xs[step]), ys[step])        # forward
        t1 = now()
        loss.backward()                                          # local gradients
        t2 = now()
        for p in model.parameters():                             # all_reduce_gradients()
            dist.all_reduce(p.grad)
            p.grad /= world
        t3 = now()
        optimizer.step()                                         # the same step everywhere
        optimizer.zero_grad()
        t4 = now()
        times.append([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0])
        losses.append(loss.item())
    with torch.no_grad():
        checksum = float(sum(p.double().sum() for p in model.parameters()))
    return {"times": times, "loss": losses, "checksum": checksum}


def compare(nics=(None, IMPAIRED_NIC), nodes: int = 2, steps: int = 12, warmup: int = 2,
            chunk: int = 3, sizes=DEFAULT_SIZES, batch: int = 128, seed: int = 0,
            timeout: float = 60, *, dilation: float = 1.0, solo: bool = False) -> list[dict]:
    """Run `synchronous_loop` on `nodes` ranks (one per node) behind each network in `nics`.

    All the clusters are started together and take turns, `chunk` steps at a time, so that
    every network sees the same background load of this (shared, noisy) machine: an A/B
    comparison interleaved in time, not one run after the other.

    Returns one dict per network, plain data (times in seconds; arrays of shape
    [rank, step] after dropping the first `warmup` steps):
      nic, nodes, steps; phases {phase: array}; step (array); mean and median {phase: over
      ranks and steps}; step_mean, step_median; share {phase: fraction of the mean step};
      loss [rank][step]; checksums (one per rank: equal when the replicas stayed in sync);
      grad_bytes (bytes of each gradient tensor); rounds (point-to-point rounds of all the
      ring all-reduces of one step: tensors x 2(p-1)); predicted_all_reduce (alpha-beta
      prediction of the all_reduce phase from the configured delay and rate, seconds);
      dilation; load_average (this machine's 1-minute load average before and after the run,
      from os.getloadavg) and cores.

    dilation: every cluster runs k times slower than the network it stands for
    (`Cluster(dilation=k)`), and every time is reported divided by k (`clusterlab.now()`), so
    network times are the configured network's while the CPU's compute stands for a CPU k
    times faster. Use it when the doctor's faithful floor is above the configured delay.

    solo: also run the same loop on ONE rank (nic=None: no exchange at all; the all_reduce of
    a world of one moves no bytes but still costs Gloo's per-call overhead, its small
    all_reduce phase), interleaved with the others; its result comes last
    (nodes = 1). It is the baseline of scaling efficiency: each rank of the others computes
    the same per-rank batch, so `efficiency(solo, run)` = solo step / run step is the share of
    the single-process speed that each rank keeps (weak scaling).
    """
    if steps <= warmup:
        raise ValueError(f"steps ({steps}) must be more than warmup ({warmup})")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    nics = list(nics)
    shapes = [(nic, nodes) for nic in nics] + ([(None, 1)] if solo else [])
    run_id = uuid.uuid4().hex[:8]
    load_before = os.getloadavg()[0]
    per_nic: list[list[list[dict]]] = [[] for _ in shapes]  # run -> chunk -> rank -> result
    # Every rank computes with the threads a rank of the `nodes`-rank runs gets: the one-rank
    # baseline must not get all the cores (on a shared machine that oversubscribes them, and
    # it would compare different compute, not the cost of synchronising).
    threads = max(1, usable_cores() // nodes)
    with contextlib.ExitStack() as stack:
        clusters = [stack.enter_context(Cluster(nodes=n, nic=nic, seed=seed, threads=threads,
                                                timeout=timeout * dilation, dilation=dilation))
                    for nic, n in shapes]
        done = 0
        while done < steps:
            n = min(chunk, steps - done)
            for i, cl in enumerate(clusters):
                per_nic[i].append(cl.run(synchronous_loop, n, tuple(sizes), batch, 0.05, seed,
                                         f"{run_id}-{i}"))
            done += n
    load = (load_before, os.getloadavg()[0])
    out = [_summarise(nic, n, chunks, warmup, sizes)
           for (nic, n), chunks in zip(shapes, per_nic)]
    for r in out:
        r.update(dilation=float(dilation), load_average=load, cores=usable_cores())
    return out


def _summarise(nic, nodes: int, chunks: list[list[dict]], warmup: int, sizes) -> dict:
    world = len(chunks[0])
    times = np.array([[row for c in chunks for row in c[rank]["times"]] for rank in range(world)],
                     dtype=float)[:, warmup:, :]  # rank, step, column
    phases = {name: times[:, :, i] for i, name in enumerate(PHASES)}
    step = times[:, :, len(PHASES)]
    mean = {name: float(v.mean()) for name, v in phases.items()}
    step_mean = float(step.mean())
    grad_bytes = gradient_tensors(sizes)
    spec = Netem.parse(nic) if isinstance(nic, str) else (nic or Netem())
    beta = 1 / spec.rate_Bps if spec.rate_bps else 0.0
    predicted = sum(models.ring_allreduce(nodes, n, spec.delay_s, beta) for n in grad_bytes)
    return {
        "nic": None if nic is None else str(nic),
        "nodes": nodes,
        "steps": times.shape[1],
        "phases": phases,
        "step": step,
        "mean": mean,
        "median": {name: float(np.median(v)) for name, v in phases.items()},
        "step_mean": step_mean,
        "step_median": float(np.median(step)),
        "share": {name: v / step_mean for name, v in mean.items()},
        "loss": [[x for c in chunks for x in c[rank]["loss"]] for rank in range(world)],
        "checksums": [chunks[-1][rank]["checksum"] for rank in range(world)],
        "grad_bytes": grad_bytes,
        "rounds": len(grad_bytes) * 2 * (nodes - 1),
        "predicted_all_reduce": predicted,
    }


def network_bounds(result: dict) -> tuple[float, float]:
    """(lowest, highest) all_reduce phase the configured network alone allows, in seconds:
    the alpha-beta prediction with every round's delay drawn at the smallest / largest value
    the jitter distribution can give (uniform: delay -/+ jitter). Rank processes also wait for
    each other and for a core, so the phase can exceed the highest; it cannot be shorter than
    the lowest (a message is never early)."""
    from .links import configured_delays

    spec = Netem.parse(result["nic"])
    draws = configured_delays(spec) / 1e3 - spec.delay_s  # seconds around the delay
    predicted, rounds = result["predicted_all_reduce"], result["rounds"]
    return predicted + rounds * float(draws.min()), predicted + rounds * float(draws.max())


def slow_steps(plain: dict, impaired: dict) -> dict:
    """Which of the impaired run's slow steps the network can explain, and which it cannot.

    Per step, the slowest rank's step time and all_reduce phase. Returns (seconds):
    plain_median, plain_max, impaired_median, impaired_max (step times), all_reduce_median and
    all_reduce_max (the impaired all_reduce phase of the slowest rank), worst (index of the slowest
    impaired step) with worst_all_reduce and worst_compute (forward + backward + optimizer of
    that step's slowest rank), floor and ceiling (`network_bounds`), beyond (how many impaired
    steps had an all_reduce phase above the ceiling: time the network's delays cannot have
    added; it is this machine's scheduling) with max_excess (the largest such excess), and
    steps.
    """
    step_p = plain["step"].max(axis=0)
    step_i = impaired["step"].max(axis=0)
    ar = impaired["phases"]["all_reduce"].max(axis=0)
    floor, ceiling = network_bounds(impaired)
    worst = int(step_i.argmax())
    rank = int(impaired["step"][:, worst].argmax())
    compute = sum(float(impaired["phases"][name][rank, worst])
                  for name in ("forward", "backward", "optimizer"))
    excess = ar - ceiling
    return {"plain_median": float(np.median(step_p)), "plain_max": float(step_p.max()),
            "impaired_median": float(np.median(step_i)), "impaired_max": float(step_i.max()),
            "all_reduce_median": float(np.median(ar)), "all_reduce_max": float(ar.max()),
            "worst": worst, "worst_all_reduce": float(ar[worst]), "worst_compute": compute,
            "floor": floor, "ceiling": ceiling, "beyond": int((excess > 0).sum()),
            "max_excess": float(max(excess.max(), 0.0)), "steps": len(step_i)}


def replay_all_reduces(nic: str, nodes: int, sizes, draws: int = 200, seed: int = 0) -> np.ndarray:
    """The network's own time for ring all-reduces of `sizes` bytes, one after another, on
    `nodes` nodes behind `nic`: the replay the backend holds each all-reduce for
    (`sim.simulate_collective`, the same schedule and link model), without this machine.
    Each rank enters the next all-reduce when it leaves the previous one. Returns one total
    per draw (seconds), each with fresh draws of the link model's jitter: the spread the
    network alone gives, to set a measurement against."""
    from ..sim import simulate_collective

    out = np.empty(draws)
    for d in range(draws):
        start = np.zeros(nodes)
        for i, n in enumerate(sizes):
            start = simulate_collective("allreduce", int(n), nodes=nodes, nic=nic,
                                        start_s=start, seed=seed + d * len(sizes) + i)
        out[d] = start.max()
    return out


def undilated_efficiency(solo: dict, result: dict) -> float:
    """`efficiency(solo, result)` with this machine's compute put back at full scale.

    A dilated run (`compare(..., dilation=k)`) reports every time divided by k, so its compute
    and overheads stand for a CPU k times faster. This multiplies them back by k: the one-rank
    step, and the forward, backward and optimizer phases of `result`, while its all_reduce phase
    (held by the emulated network) is kept as measured. An estimate of what the same loop
    would show on this machine undilated, if it could hold the delay: medians per rank and
    step."""
    k = result["dilation"]
    compute = sum(result["phases"][name] for name in ("forward", "backward", "optimizer"))
    step = k * compute + result["phases"]["all_reduce"]
    return k * solo["step_median"] / float(np.median(step))


def run_breakdown(nic: str | None = None, **kwargs) -> dict:
    """The breakdown of one network: `compare([nic], **kwargs)[0]`."""
    return compare([nic], **kwargs)[0]


def slowdown(baseline: dict, impaired: dict) -> float:
    """How many times longer the median step is on the impaired network than on the baseline.

    The median, not the mean: a shared machine adds rare long pauses to any run, and one of
    them should not decide the answer."""
    return impaired["step_median"] / baseline["step_median"]


def efficiency(solo: dict, result: dict) -> float:
    """Scaling efficiency of `result` against the one-rank run of the same loop
    (`compare(..., solo=True)`): median step on one rank / median step of `result`. Every rank
    computes the same per-rank batch, so 1 means no cost of synchronising at all."""
    if solo["nodes"] != 1:
        raise ValueError(f"the baseline must be a one-rank run, got {solo['nodes']} ranks")
    return solo["step_median"] / result["step_median"]


def label(result: dict) -> str:
    """A run's name in figures, as the notebook's text names it."""
    if result["nodes"] == 1:
        return "one rank alone"
    return "plain Gloo" if result["nic"] is None else f"impaired: {result['nic']}"


def format_breakdown(results: dict | list[dict]) -> str:
    """A text table: mean milliseconds and share of the step, per phase, per run."""
    if isinstance(results, dict):
        results = [results]
    lines = []
    for r in results:
        ranks = f"{r['nodes']} rank{'s' if r['nodes'] != 1 else ''}"
        lines.append(f"{label(r)}  ({ranks}, {r['steps']} steps)")
        lines.append(f"  {'phase':<11}{'mean ms':>9}{'share':>8}")
        for name in PHASES:
            lines.append(f"  {name:<11}{r['mean'][name] * 1e3:>9.2f}{r['share'][name]:>8.0%}")
        lines.append(f"  {'step':<11}{r['step_mean'] * 1e3:>9.2f}{1:>8.0%}")
    return "\n".join(lines)


PHASE_COLORS = {"forward": "#4C72B0", "backward": "#55A868", "all_reduce": "#C44E52",
                "optimizer": "#8172B2"}


def plot_breakdown(results: list[dict], ax=None):
    """Stacked bars of the mean phase times (ms), one bar per run and rank."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.6))
    positions, labels, x = [], [], 0.0
    for r in results:
        for rank in range(r["phases"]["forward"].shape[0]):
            bottom = 0.0
            for name in PHASES:
                value = float(r["phases"][name][rank].mean()) * 1e3
                ax.bar(x, value, bottom=bottom, color=PHASE_COLORS[name],
                       label=name if not positions else None)
                bottom += value
            positions.append(x)
            kind = ("one rank\nalone" if r["nodes"] == 1 else
                    "plain" if r["nic"] is None else "impaired")
            labels.append(kind + ("" if r["nodes"] == 1 else f"\nrank {rank}"))
            x += 1
        x += 0.5
    ax.set_xticks(positions, labels)
    ax.set_ylabel("mean time per step (ms)")
    ax.set_title("Where a synchronous step's time goes")
    top = max(float(sum(r["phases"][name].mean(axis=1).max() for name in PHASES))
              for r in results) * 1e3
    ax.set_ylim(0, top * 1.3)
    ax.legend(loc="upper center", ncol=len(PHASES), fontsize=7, frameon=False)
    return ax
