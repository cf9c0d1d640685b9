"""The throughput explorer's "run for real": its setup shrunk to this machine, trained on real
ranks through the emulated network, next to the simulator's prediction of the same run.

`RealPlan.for_setup` fits the setup to this machine (at most `REAL_MAX_PROCS` processes, a
model of at most `REAL_MODEL_CAP_BYTES`, about `REAL_MAX_SECONDS` of steps);
`measure_real_run` measures plain Gloo's all_reduce time on the same ranks (the floor below
which the emulator cannot complete one), simulates the run with that floor, then times the
steps on a netem cluster; `MeasuredRun` holds what it measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ..sim import SimResult, simulate_training
from ..step_model import MIB, TrainingSetup, predict_step
from ..timing import all_reduce_spans, durations
from ._common import BackgroundRun

REAL_MAX_PROCS = 8  # what a 2-core machine holds (Cluster allows up to 64)
REAL_MODEL_CAP_BYTES = 4 * MIB  # the real run's synthetic model is capped to a few MB
REAL_MAX_SECONDS = 30.0  # the real run's steps are cut to fit roughly this long

_GRADIENTS: dict[tuple[int, ...], list] = {}  # per rank process: the step's gradient buckets


def _rank_step(bucket_bytes: list[int], compute_s: float, overlap: bool) -> tuple[int, int]:
    """One data-parallel step on this rank, DDP-style; returns its (start, end) in ns.

    Compute is emulated by sleeping: forward a third of it, backward two thirds cut in one
    slice per bucket, proportional to its size (as `simulate_training` assumes). Each
    bucket's all_reduce starts when its slice ends (overlap) or after the whole backward
    pass; the real Gloo moves real bytes, the netem backend adds the network's time.
    """
    import torch
    import torch.distributed as dist

    key = tuple(bucket_bytes)
    if key not in _GRADIENTS:
        _GRADIENTS[key] = [torch.zeros(max(1, n // 4)) for n in bucket_bytes]  # float32
    grads = _GRADIENTS[key]
    dist.barrier()
    start = time.monotonic_ns()
    time.sleep(compute_s / 3)
    total = max(1, sum(bucket_bytes))
    works = []
    for g, nbytes in zip(grads, bucket_bytes) if grads else [(None, total)]:
        time.sleep(compute_s * 2 / 3 * nbytes / total)
        if overlap and g is not None:
            works.append(dist.all_reduce(g, async_op=True))
    if not overlap:
        works = [dist.all_reduce(g, async_op=True) for g in grads]  # one after the other
    for w in works:
        w.wait()
    return start, time.monotonic_ns()


@dataclass(frozen=True)
class RealPlan:
    """What "run for real" runs: the explorer's setup shrunk to this machine."""

    setup: TrainingSetup  # nodes, procs_per_node and model size as really run
    steps: int
    timeout_s: float

    @classmethod
    def for_setup(cls, setup: TrainingSetup, max_procs: int = REAL_MAX_PROCS,
                  steps: int = 10) -> RealPlan:
        """min(N x P, max_procs) processes; at least two nodes whenever N >= 2, so that
        the network is crossed; the model capped to REAL_MODEL_CAP_BYTES."""
        ppn = setup.procs_per_node
        ppn = min(ppn, max(1, max_procs // 2)) if setup.nodes > 1 else min(ppn, max_procs)
        nodes = max(1, min(setup.nodes, max_procs // ppn))
        model_mib = min(setup.model_mib, REAL_MODEL_CAP_BYTES / MIB)
        real = replace(setup, nodes=nodes, procs_per_node=ppn, model_mib=model_mib,
                       bucket_mib=min(setup.bucket_mib, model_mib))
        step = predict_step(real).step_s
        steps = int(max(2, min(steps, REAL_MAX_SECONDS // max(step, 1e-3))))
        return cls(setup=real, steps=steps, timeout_s=30 + 10 * step)


@dataclass
class MeasuredRun:
    """Step times measured on real ranks, and the simulator's prediction for the same run."""

    plan: RealPlan
    step_times: np.ndarray  # seconds, slowest rank of each step
    predicted: SimResult | None = None
    native_s: dict[int, float] | None = None  # plain Gloo all_reduce per bucket size, seconds

    @property
    def samples_per_step(self) -> int:
        return self.plan.setup.batch_per_rank * self.plan.setup.ranks

    def throughput(self, q: float = 50) -> float:
        """Samples/s at the q-th percentile of step time (q=90 is the slow end)."""
        return self.samples_per_step / float(np.percentile(self.step_times, q))


def measure_real_run(run: BackgroundRun, plan: RealPlan, *, seed: int,
                     say: Callable[[str], None] = lambda _text: None,
                     on_step: Callable[[int, float], None] = lambda _done, _seconds: None,
                     ) -> MeasuredRun:
    """Run `plan` on real ranks inside `run` (so that its cancel() reaches the clusters).

    `say(text)` tells what it is doing; `on_step(done, seconds)` follows every measured step.
    """
    s = plan.setup
    args = (s.buckets, s.compute_s, s.overlap)
    # The emulator never completes an all_reduce before plain Gloo could: measure that floor
    # on the same ranks, so the simulated point is this machine's.
    say("measuring this machine's own all_reduce time (plain Gloo)…")
    with run.cluster(nodes=s.nodes, procs_per_node=s.procs_per_node, nic=None,
                     timeout=plan.timeout_s) as cl:
        spans = cl.run(all_reduce_spans, sorted(set(s.buckets)), 3)
    floor = {n: float(np.median(durations([r[n] for r in spans]))) for n in spans[0]}
    predicted = simulate_training(**s.sim_kwargs(max(plan.steps, 10), seed),
                                  native_s=lambda n: floor.get(n, 0.0))
    run.check()
    with run.cluster(nodes=s.nodes, procs_per_node=s.procs_per_node, nic=s.nic or None,
                     algorithm=s.algorithm, seed=seed, timeout=plan.timeout_s) as cl:
        cl.run(_rank_step, *args)  # warm-up: Gloo connects, buffers are allocated
        times = []
        for i in range(plan.steps):
            run.check()
            # One repeat per rank; from the last rank's start (they leave the barrier
            # unevenly) to the end.
            spans = cl.run(_rank_step, *args)
            times.append(float(durations([[span] for span in spans])[0]) / 1e9)
            on_step(i + 1, times[-1])
    return MeasuredRun(plan=plan, step_times=np.array(times), predicted=predicted,
                       native_s=floor)
