"""Throughput-collapse explorer: how many samples per second do N nodes train, and why not N x?

Three predictions of one data-parallel training step, from cheapest to most real:

1. the closed-form curve over N = 1, 2, 4, ..., 1024 nodes (`predict_step`): the α-β costs of
   `clusterlab.models` for each gradient bucket's all-reduce, plus order-statistics terms for
   jitter (`models.expected_max`) and for loss (`models.tail_at_scale`), fed through the same
   compute/communication overlap recurrence as the simulator. Microseconds per point.
2. the simulator at the chosen N only (`sim.simulate_training`, a few steps): every message of
   every round replayed with netem's semantics. Its step-time histogram (p50, p99) and its
   point on the curve show what the closed form leaves out.
3. "run for real": the largest cluster of this machine (at most 8 processes) trains a
   synthetic model with the same network, DDP-style, and its measured points (p10-p90 error
   bars) land on the same axes.

The closed form is an approximation where the simulator is exact: where the two disagree
(heavy jitter, loss), the gap is part of the lesson.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import multiprocessing as mp
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import ipywidgets as widgets
import numpy as np
from matplotlib.ticker import FixedLocator, LogLocator, MaxNLocator, NullFormatter, NullLocator

from .. import models
from ..netem import Netem
from ..schedule import ALLREDUCE_ALGORITHMS, HEADER_BYTES, loss_probability
from ..sim import SimResult, _bucket_sizes, simulate_training
from ..timing import all_reduce_spans, durations
from ._common import (
    BackgroundRun,
    Explorer,
    cancel_run,
    netem_string,
    reporting,
    sync_legend,
)

NODE_COUNTS = tuple(2**i for i in range(11))  # 1 .. 1024, the curve's x values
MIB = 2**20
SEGMENT_BYTES = 65536  # TCP segments of the emulator (schedule.Fabric's default)
FIRST_BUCKET_BYTES = MIB  # DDP's small first bucket, as in simulate_training

# Slider stops: roughly logarithmic, with 0 where "none" makes sense.
LATENCY_US = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
JITTER_US = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
BANDWIDTH_GBIT = (0, 0.1, 1, 10, 25, 40, 100, 200, 400)  # 0 = no rate limit
LOSS_PCT = (0, 0.001, 0.01, 0.1, 0.5, 1, 2)
MODEL_MIB = (1, 10, 25, 50, 100, 250, 500, 1000, 4000)
COMPUTE_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
BUCKET_MIB = (1, 5, 10, 25, 50, 100)
PROCS_PER_NODE = (1, 2, 4, 8)

# How long the simulator may take inside one update, and beyond it (in the background), and
# for a static figure (nbval, a terminal), where nothing can be drawn later.
SYNC_SIM_BUDGET_S = 0.05
MIN_SIM_STEPS, MAX_SIM_STEPS = 5, 20
ASYNC_SIM_TARGET_S, MAX_ASYNC_SIM_S = 3.0, 30.0
STATIC_SIM_TARGET_S, STATIC_SIM_MAX_S = 1.0, 10.0

REAL_MAX_PROCS = 8  # what a 2-core machine holds (Cluster allows up to 64)
REAL_MODEL_CAP_BYTES = 4 * MIB  # the real run's synthetic model is capped to a few MB
REAL_MAX_SECONDS = 30.0  # the real run's steps are cut to fit roughly this long


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
        return _bucket_sizes(self.model_bytes, self.bucket_bytes, FIRST_BUCKET_BYTES)

    def sim_kwargs(self, steps: int, seed: int = 0) -> dict[str, Any]:
        """The arguments of `simulate_training` for this setup."""
        return dict(nodes=self.nodes, procs_per_node=self.procs_per_node, nic=self.nic or None,
                    model_bytes=self.model_bytes, bucket_bytes=self.bucket_bytes,
                    first_bucket_bytes=FIRST_BUCKET_BYTES, compute_s=self.compute_s,
                    overlap=self.overlap, algorithm=self.algorithm, steps=steps,
                    batch_per_rank=self.batch_per_rank, seed=seed)


# --- 1. The closed form ----------------------------------------------------------------------


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


@functools.lru_cache(maxsize=4096)
def _jitter_max_std(k: int, distribution: str) -> float:
    """Standard deviation of the max of k netem jitter draws in units of the jitter (cached)."""
    return models.max_std(k, distribution, 1.0)


@functools.lru_cache(maxsize=256)
def _normal_max(p: int) -> float:
    return models.expected_max_ideal(p, "normal")


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
    procs_per_node, because all processes of a node then share its NIC.
    Jitter: every round waits for the last segment of its message, delay + E[max of k
    draws]; a ring adds the Gaussian longest-path term of `models.ring_allreduce_jitter` (with
    the spread of that max).
    Loss: a round in which one of the m messages loses a tail segment waits for TCP's
    retransmission timeout; `tail_at_scale(loss, m x segments)` is how often that happens.
    Charging it to every round as if rounds were barriers is an upper bound (rounds overlap
    in reality): against the simulator it is exact within a few percent without loss, and
    up to ~1.6x too slow at 64 nodes with 0.01% loss.
    """
    p = nodes * procs_per_node
    if p == 1 or nbytes <= 0:
        return 0.0
    alpha = spec.delay_s
    beta = 8 / spec.rate_bps * (SEGMENT_BYTES + HEADER_BYTES) / SEGMENT_BYTES \
        if spec.rate_bps else 0.0
    ring = 0  # ranks in a ring, for its longest-path jitter term
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
    k = max(1, -(-message // SEGMENT_BYTES))  # segments per message
    extra = 0.0
    if spec.jitter_ns:
        jitter = spec.jitter_s
        extra += rounds * jitter * _jitter_max(k, spec.distribution)
        if ring > 1:
            extra += (jitter * _jitter_max_std(k, spec.distribution) * math.sqrt(rounds)
                      * _normal_max(ring))
    q = loss_probability(spec)
    if q > 0:
        rto = max(0.2, 4 * alpha)  # Linux's 200 ms floor, or twice the round trip
        tail, body = min(k, 3), max(k - 3, 0)  # fast retransmit needs 3 later segments
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


# --- 2. The simulator, within a time budget --------------------------------------------------

# Seconds per unit of simulator work, measured on a loaded 2-core machine; the explorer
# rescales them by what it measures (see SimBudget).
_COST_FAST_DRAW = 5e-9  # one delay draw in the compiled ring kernel
_COST_ROUND = 50e-6  # one round through schedule.play (numpy call overheads)
_COST_MESSAGE = 0.2e-6
_COST_RATE_MESSAGE = 1e-6  # a message through a rate-limited NIC queue (tail bookkeeping)
_COST_DRAW = 40e-9  # one segment's delay, loss and serialisation in schedule.play
_COST_BUCKET = 20e-6


def _segments(nbytes: int) -> int:
    return max(1, -(-int(nbytes) // SEGMENT_BYTES))


def sim_seconds_per_step(setup: TrainingSetup) -> float:
    """Rough wall time of one simulated step: counts of rounds, messages and delay draws."""
    nodes, ppn = setup.nodes, setup.procs_per_node
    p = nodes * ppn
    buckets = setup.buckets
    if p == 1:
        return _COST_BUCKET * (1 + len(buckets))
    spec = setup.spec
    rate = bool(spec.rate_bps)
    total = 0.0
    lg = max(1, (p - 1).bit_length())
    for n in buckets:
        total += _COST_BUCKET
        if setup.algorithm == "ring" and ppn == 1:  # the compiled fast path
            total += 2 * (p - 1) * p * _segments(n / p) * _COST_FAST_DRAW
            continue
        if setup.algorithm == "ring":
            shapes = [(2 * (p - 1), p, nodes, _segments(n / p))]
        elif setup.algorithm == "hierarchical":
            lg_ppn = (ppn - 1).bit_length()
            shapes = [(2 * lg_ppn, p, 0, 0), (2 * (nodes - 1), nodes, nodes, _segments(n / nodes))]
        elif setup.algorithm == "tree":
            shapes = [(2 * lg, p // 2, p // 2, _segments(n))]
        elif setup.algorithm == "rabenseifner":
            shapes = [(2 * lg, p, p, max(1, _segments(n) // lg))]
        else:
            shapes = [(lg, p, p, _segments(n))]
        for rounds, messages, inter, segs in shapes:
            per_round = (_COST_ROUND + messages * _COST_MESSAGE
                         + inter * (_COST_RATE_MESSAGE if rate else 0) + inter * segs * _COST_DRAW)
            total += rounds * per_round
    return total


@dataclass
class SimBudget:
    """Decides how many steps to simulate, and whether inside the update or in the background.

    `scale` corrects the cost estimate by what the last runs really took (this machine, its
    load), so the budget holds on a fast laptop and on a busy 2-core VM alike.
    """

    sync_s: float = SYNC_SIM_BUDGET_S
    scale: float = 1.0

    def plan(self, setup: TrainingSetup, static: bool = False) -> tuple[str, int, float]:
        """("sync" | "async" | "skip", steps, estimated seconds of the whole run).

        static: for a figure without widgets, where nothing can arrive later: simulate
        inside the call unless that would take longer than STATIC_SIM_MAX_S.
        """
        per_step = max(sim_seconds_per_step(setup) * self.scale, 1e-6)
        if static:
            steps = int(min(MAX_SIM_STEPS, max(3, STATIC_SIM_TARGET_S // per_step)))
            if steps * per_step > STATIC_SIM_MAX_S:
                return "skip", 0, 3 * per_step
            return "sync", steps, steps * per_step
        steps = int(self.sync_s / per_step)
        if steps >= MIN_SIM_STEPS:
            steps = min(steps, MAX_SIM_STEPS)
            return "sync", steps, steps * per_step
        if 3 * per_step > MAX_ASYNC_SIM_S:
            return "skip", 0, 3 * per_step
        steps = int(min(10, max(3, ASYNC_SIM_TARGET_S // per_step)))
        return "async", steps, steps * per_step

    def learn(self, setup: TrainingSetup, steps: int, seconds: float) -> None:
        estimate = sim_seconds_per_step(setup) * steps
        if estimate > 0.01:  # tiny runs are all overhead; they would teach noise
            ratio = seconds / estimate
            self.scale = float(np.clip(math.sqrt(self.scale * ratio), 0.1, 10.0))


@functools.cache
def _warm_up() -> None:
    """Load the simulator's compiled ring kernel in this process, once, before forking:
    a child that had to load it from numba's cache would spend ~1 s on it, every time."""
    simulate_training(2, nic="delay 1us 1us", model_bytes=1024, steps=1)


def _simulate_in_child(conn: Any, kwargs: dict[str, Any]) -> None:
    """Entry point of a forked simulation process: run, send the result back, exit."""
    if sys.platform.startswith("linux"):  # die with the kernel, like the cluster's ranks
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    try:
        conn.send(run_simulation(kwargs))
    finally:
        conn.close()


def run_simulation(kwargs: dict[str, Any]) -> tuple[str, Any]:
    """("ok", simulate_training(**kwargs)) or ("error", what went wrong), never raising:
    at 5% loss a segment can be lost 30 times in a row, which TCP would not survive either."""
    try:
        return "ok", simulate_training(**kwargs)
    except Exception as exc:  # noqa: BLE001 - reported to the widget
        return "error", f"{type(exc).__name__}: {exc}"


class BackgroundSimulator:
    """Runs the simulations too slow for an update, one at a time; a new one replaces it.

    On Linux each runs in a forked child process, which is killed as soon as the learner
    asks for another setup: a stale simulation costs nothing more, and seconds of numpy
    work in a thread would hold the GIL and make the widget lag. Elsewhere (no cheap fork)
    it runs on a thread and a stale result is simply dropped.
    """

    def __init__(self, use_process: bool | None = None) -> None:
        self.use_process = sys.platform.startswith("linux") if use_process is None \
            else use_process
        self._lock = threading.Lock()
        self._generation = 0
        self._proc: Any = None
        self._watchers: list[threading.Thread] = []

    def submit(self, kwargs: dict[str, Any],
               done: Callable[[SimResult | None, str | None, float], None]) -> None:
        """Start simulate_training(**kwargs); later done(result, error, seconds), unless a
        newer submit() or cancel() came first."""
        with self._lock:
            self._generation += 1
            generation = self._generation
            self._kill()
            if self.use_process:
                _warm_up()
                ctx = mp.get_context("fork")
                receiver, sender = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_simulate_in_child, args=(sender, kwargs),
                                   name="clusterlab-sim", daemon=True)
                proc.start()
                sender.close()
                self._proc = proc
                work = functools.partial(self._watch, proc, receiver)
            else:
                work = functools.partial(run_simulation, kwargs)
            watcher = threading.Thread(target=self._finish, args=(work, generation, done),
                                       name="clusterlab-sim-watch", daemon=True)
            self._watchers = [w for w in self._watchers if w.is_alive()] + [watcher]
            watcher.start()

    def _watch(self, proc: Any, receiver: Any) -> tuple[str, Any] | None:
        try:
            reply = receiver.recv()
        except (EOFError, OSError):  # killed: a newer request replaced it
            reply = None
        finally:
            receiver.close()
            proc.join()
        with self._lock:
            if self._proc is proc:
                self._proc = None
        return reply

    def _finish(self, work: Callable[[], Any], generation: int,
                done: Callable[[SimResult | None, str | None, float], None]) -> None:
        t0 = time.perf_counter()
        reply = work()
        if generation != self._generation:  # superseded (and killed, if it was a process)
            return
        kind, payload = reply or ("error", "the simulation process died without a result")
        seconds = time.perf_counter() - t0
        done(payload if kind == "ok" else None, payload if kind == "error" else None, seconds)

    def _kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()  # its watcher sees the pipe close, then reaps it

    @property
    def busy(self) -> bool:
        return any(w.is_alive() for w in self._watchers)

    def cancel(self) -> None:
        """Forget the running simulation (and kill its process)."""
        with self._lock:
            self._generation += 1
            self._kill()

    def wait(self, timeout: float = 60.0) -> bool:
        """Block until no simulation is running and its result has been handled."""
        deadline = time.monotonic() + timeout
        for watcher in list(self._watchers):
            watcher.join(max(0.0, deadline - time.monotonic()))
        return not any(w.is_alive() for w in self._watchers)


# --- 3. The real cluster ---------------------------------------------------------------------

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


# --- The explorer ----------------------------------------------------------------------------


def _options(values: tuple, value: float, fmt: Callable[[Any], str] = str) -> list[tuple]:
    """SelectionSlider options (label, value), with `value` added if it is not a stop."""
    stops = sorted(set(values) | {value})
    return [(fmt(v), v) for v in stops]


class ThroughputExplorer(Explorer):
    """Throughput and scaling efficiency against node count, for a network you configure.

    Controls change the setup; `update()` recomputes (debounced when driven by the sliders);
    `on_run_clicked` / `on_cancel` start and stop the real cluster. In a terminal or under
    nbval, `show()` returns the static figure for the current settings.
    """

    figsize = (10.5, 7.0)

    def __init__(self, *, seed: int = 0, debounce_s: float = 0.15, real_steps: int = 10,
                 max_real_procs: int = REAL_MAX_PROCS, **defaults: Any) -> None:
        setup = TrainingSetup(**defaults)
        super().__init__(debounce_s)
        self.seed = seed
        self.real_steps = real_steps
        self.max_real_procs = max_real_procs
        self.budget = SimBudget()
        self.curve: tuple[StepPrediction, ...] = ()
        self.prediction: StepPrediction | None = None
        self.sim: SimResult | None = None
        self.sim_kwargs: dict[str, Any] | None = None
        self.sim_state = "none"  # "done", "pending", "skipped", "failed"
        self.sim_note = ""
        self.measured: MeasuredRun | None = None
        self.runner = BackgroundRun()
        self._sim_cache: OrderedDict[tuple, SimResult] = OrderedDict()
        self.simulator = BackgroundSimulator()
        self._wanted: tuple | None = None
        self._build_controls(setup)
        self._build_axes()

    # --- controls ---------------------------------------------------------------------------

    def _build_controls(self, s: TrainingSetup) -> None:
        style = {"description_width": "120px"}
        layout = widgets.Layout(width="360px")

        def slider(description: str, values: tuple, value: Any,
                   fmt: Callable[[Any], str] = lambda v: f"{v:g}") -> widgets.SelectionSlider:
            return widgets.SelectionSlider(options=_options(values, value, fmt), value=value,
                                           description=description, style=style, layout=layout,
                                           continuous_update=True)

        c: dict[str, widgets.ValueWidget] = {
            "nodes": slider("nodes", NODE_COUNTS, s.nodes, str),
            "procs_per_node": slider("procs per node", PROCS_PER_NODE, s.procs_per_node, str),
            "latency_us": slider("latency (µs)", LATENCY_US, s.latency_us),
            "jitter_us": slider("jitter (µs)", JITTER_US, s.jitter_us),
            "distribution": widgets.Dropdown(options=list(models.DISTRIBUTIONS),
                                             value=s.distribution, description="distribution",
                                             style=style, layout=layout),
            "bandwidth_gbit": slider("bandwidth (Gbit/s)", BANDWIDTH_GBIT, s.bandwidth_gbit,
                                     lambda v: "unlimited" if v == 0 else f"{v:g}"),
            "loss_pct": slider("loss (%)", LOSS_PCT, s.loss_pct),
            "model_mib": slider("model (MiB)", MODEL_MIB, s.model_mib),
            "compute_ms": slider("compute/step (ms)", COMPUTE_MS, s.compute_ms),
            "bucket_mib": slider("bucket (MiB)", BUCKET_MIB, s.bucket_mib),
            "overlap": widgets.Checkbox(value=s.overlap, description="overlap comm. with backward",
                                        style=style, layout=layout),
            "algorithm": widgets.Dropdown(options=list(ALLREDUCE_ALGORITHMS), value=s.algorithm,
                                          description="all-reduce", style=style, layout=layout),
        }
        self.controls = c
        self.batch_per_rank = s.batch_per_rank
        for w in c.values():
            w.observe(self._on_change, names="value")
        self.nic_label = widgets.HTML()
        self.summary = widgets.HTML()
        self.run_button = widgets.Button(description="run for real", icon="play",
                                         tooltip="train on real ranks of this machine")
        self.cancel_button = widgets.Button(description="cancel", icon="stop", disabled=True)
        self.run_button.on_click(self.on_run_clicked)
        self.cancel_button.on_click(self.on_cancel)
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="steps")
        self.status = widgets.HTML()
        names = list(c)
        left = widgets.VBox([c[n] for n in names[:6]])
        right = widgets.VBox([c[n] for n in names[6:]])
        self.widget = widgets.VBox([
            widgets.HBox([left, right]), self.nic_label, self.out, self.summary,
            widgets.HBox([self.run_button, self.cancel_button, self.progress, self.status]),
            self.error_box,
        ])

    def _on_change(self, _change: dict) -> None:
        self.debouncer.trigger()

    @property
    def setup(self) -> TrainingSetup:
        """The setup the controls describe right now."""
        values = {name: w.value for name, w in self.controls.items()}
        return TrainingSetup(batch_per_rank=self.batch_per_rank, **values)

    @property
    def measured_now(self) -> MeasuredRun | None:
        """The last real run, if it ran the network and model shown now (any node count)."""
        m = self.measured
        if m is None or replace(self.real_plan().setup, nodes=1) != replace(m.plan.setup,
                                                                             nodes=1):
            return None
        return m

    def set(self, **values: Any) -> None:
        """Set several controls at once (one debounced update follows)."""
        for name, value in values.items():
            w = self.controls[name]
            stops = [v for _, v in w.options] if isinstance(w, widgets.SelectionSlider) \
                else None
            if stops is not None and value not in stops:
                raise ValueError(f"{name}={value!r} is not one of the slider's stops {stops}")
            w.value = value

    # --- computing --------------------------------------------------------------------------

    def _compute(self) -> None:
        """Closed-form curve, and the simulator at N (now, in the background, or not at all)."""
        setup = self.setup
        self.curve = predicted_curve(setup)
        self.prediction = predict_step(setup)
        mode, steps, estimate = self.budget.plan(setup, static=self._static)
        key = (setup, self.seed)
        if (key == self._wanted and self.sim_state == "pending" and self.simulator.busy
                and not self._static):
            return  # the same setup again: its simulation is already running
        self._wanted = key
        self.simulator.cancel()  # whatever runs in the background is stale now
        if key in self._sim_cache:  # seen before: whatever number of steps it had
            self._sim_cache.move_to_end(key)
            res = self._sim_cache[key]
            self._set_sim(res, setup.sim_kwargs(len(res.step_times), self.seed))
            return
        kwargs = setup.sim_kwargs(steps, self.seed)
        if mode == "skip":
            self.sim, self.sim_kwargs, self.sim_state = None, None, "skipped"
            self.sim_note = (f"simulating {setup.ranks} ranks would take ~{estimate:.0f} s; "
                             "showing the closed form only")
        elif mode == "sync":
            t0 = time.perf_counter()
            kind, payload = run_simulation(kwargs)
            self._sim_finished(key, kwargs, payload if kind == "ok" else None,
                               payload if kind == "error" else None, time.perf_counter() - t0)
        else:
            self.sim, self.sim_kwargs, self.sim_state = None, kwargs, "pending"
            self.sim_note = f"simulating {setup.ranks} ranks, {steps} steps (~{estimate:.1f} s)…"
            self.simulator.submit(kwargs, functools.partial(self._sim_finished, key, kwargs,
                                                            redraw=True))

    def _sim_finished(self, key: tuple, kwargs: dict[str, Any], res: SimResult | None,
                      error: str | None, seconds: float, redraw: bool = False) -> None:
        """A simulation ended: cache it, and show it if its setup is still the wanted one."""
        with self._lock:
            if res is not None:
                self.budget.learn(key[0], kwargs["steps"], seconds)
                self._sim_cache[key] = res
                while len(self._sim_cache) > 64:
                    self._sim_cache.popitem(last=False)
            if key != self._wanted:
                return
            if res is not None:
                self._set_sim(res, kwargs)
            else:  # e.g. a segment lost 30 times in a row: TCP would reset the connection
                self.sim, self.sim_kwargs, self.sim_state = None, kwargs, "failed"
                self.sim_note = f"simulator: {error}"
            if redraw:
                self._render()

    def _set_sim(self, res: SimResult, kwargs: dict[str, Any]) -> None:
        self.sim, self.sim_kwargs, self.sim_state, self.sim_note = res, kwargs, "done", ""

    def wait_for_simulation(self, timeout: float = 60.0) -> bool:
        """Block until a background simulation is done and drawn (for tests)."""
        return self.simulator.wait(timeout)

    # --- drawing ----------------------------------------------------------------------------

    def _make_axes(self, fig) -> dict[str, Any]:
        """The figure's axes and every artist, created once; `_draw` only moves them."""
        fig.subplots_adjust(left=0.075, right=0.985, top=0.87, bottom=0.075, hspace=0.36,
                            wspace=0.22)
        grid = fig.add_gridspec(2, 2)
        thr = fig.add_subplot(grid[0, 0])
        eff = fig.add_subplot(grid[1, 0], sharex=thr)  # one set of N tick labels for both
        hist, bar = fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, 1])
        xs = np.array(NODE_COUNTS, dtype=float)
        ones = np.ones_like(xs)
        sc: dict[str, Any] = {"throughput": thr, "efficiency": eff, "hist": hist,
                              "breakdown": bar, "title": fig.suptitle("", fontsize=11, y=0.99)}
        sc["ideal"], = thr.plot(xs, ones, ":", color="0.55", label="linear scaling")
        sc["model_thr"], = thr.plot(xs, ones, "o-", color="C0", ms=4,
                                    label="closed form (α-β + jitter + loss)")
        sc["sim_thr"], = thr.plot([], [], "D", color="k", ms=7, label="simulated at N")
        sc["model_eff"], = eff.plot(xs, ones, "o-", color="C0", ms=4, label="closed form")
        sc["sim_eff"], = eff.plot([], [], "D", color="k", ms=7, label="simulated at N")
        sc["n_thr"] = thr.axvline(1, color="0.75", lw=1, zorder=0)
        sc["n_eff"] = eff.axvline(1, color="0.75", lw=1, zorder=0)
        thr.set(xscale="log", yscale="log", ylabel="samples / s", title="throughput")
        eff.set(ylim=(0, 105), xlabel="nodes", ylabel="% of linear",
                title="scaling efficiency")
        thr.tick_params(labelbottom=False)
        thr.set_xlim(0.7, 1500)
        thr.xaxis.set_major_locator(FixedLocator([1, 4, 16, 64, 256, 1024]))
        thr.xaxis.set_major_formatter("{x:g}")
        thr.xaxis.set_minor_locator(NullLocator())
        thr.xaxis.set_minor_formatter(NullFormatter())
        thr.yaxis.set_major_locator(LogLocator(numticks=5))
        thr.yaxis.set_minor_locator(NullLocator())
        thr.yaxis.set_minor_formatter(NullFormatter())
        eff.yaxis.set_major_locator(FixedLocator([0, 25, 50, 75, 100]))

        sc["stairs"] = hist.stairs([0], [0, 1], fill=True, color="0.6")
        sc["p50"] = hist.axvline(0, color="C3", ls="-", label="p50")  # named in the title
        sc["p99"] = hist.axvline(0, color="C3", ls="--", label="p99")
        sc["note"] = hist.text(0.5, 0.5, "", ha="center", va="center", wrap=True,
                               transform=hist.transAxes, fontsize=9)
        hist.set(xlabel="step time (ms)", ylabel="steps")
        hist.yaxis.set_major_locator(MaxNLocator(3, integer=True))
        hist.xaxis.set_major_locator(MaxNLocator(4))

        rows = np.arange(3)[::-1]  # closed form, simulated, real run: top to bottom
        sc["comp_bars"] = bar.barh(rows, [0, 0, 0], color="C0", label="compute")
        sc["comm_bars"] = bar.barh(rows, [0, 0, 0], color="C3", label="exposed communication")
        sc["bar_text"] = [bar.text(0, y, "", va="center", fontsize=8) for y in rows]
        bar.set_yticks(rows, ["closed form", "simulated", "real run"])
        bar.set(xlabel="ms per step", ylim=(-0.6, 3.3))
        bar.xaxis.set_major_locator(MaxNLocator(4))
        sync_legend(bar, [sc["comp_bars"], sc["comm_bars"]], fontsize=8, loc="upper right")
        sc["measured"] = None  # (MeasuredRun, its artists), made when a run has finished
        return sc

    def _draw(self, fig, sc: dict[str, Any]) -> None:
        setup, pred, curve = self.setup, self.prediction, self.curve
        thr, hist, bar = sc["throughput"], sc["hist"], sc["breakdown"]
        n = setup.nodes
        sim = self.sim
        sc["title"].set_text(f"nic: {setup.nic or '(no impairment)'}   ·   {setup.algorithm}, "
                             f"{n} nodes × {setup.procs_per_node} procs")

        # Throughput and efficiency against N.
        model = np.array([c.throughput for c in curve])
        sc["ideal"].set_ydata(curve[0].throughput * np.array(NODE_COUNTS, dtype=float))
        sc["model_thr"].set_ydata(model)
        sc["model_eff"].set_ydata([100 * c.efficiency for c in curve])
        sc["n_thr"].set_xdata([n, n])
        sc["n_eff"].set_xdata([n, n])
        sim_points = ([n], [sim.throughput]) if sim is not None else ([], [])
        sc["sim_thr"].set_data(*sim_points)
        sc["sim_eff"].set_data(*(([n], [100 * setup.compute_s / sim.mean_step])
                                 if sim is not None else ([], [])))
        values = [*model, *sim_points[1], *self._draw_measured(sc),
                  curve[0].throughput * NODE_COUNTS[-1]]
        thr.set_ylim(min(values) / 2, max(values) * 2)
        handles = [sc["ideal"], sc["model_thr"]] + ([sc["sim_thr"]] if sim is not None else [])
        if sc["measured"] is not None:
            handles += sc["measured"][1]
        sync_legend(thr, handles, fontsize=8, loc="upper left")  # efficiency: same markers

        # Step-time histogram of the simulation at N.
        steps = len(sim.step_times) if sim is not None else 0
        title = f"simulated step times at N={n} ({steps} steps)"
        for artist in (sc["stairs"], sc["p50"], sc["p99"], hist.xaxis, hist.yaxis):
            artist.set_visible(sim is not None)
        if sim is not None:
            ms = sim.step_times * 1e3
            counts, edges = np.histogram(ms, bins=min(15, len(ms)))
            sc["stairs"].set_data(counts, edges)
            for q in (50, 99):
                v = sim.percentile(q) * 1e3
                sc[f"p{q}"].set_xdata([v, v])
            title += (f"\np50 (solid) {sim.percentile(50) * 1e3:.4g} ms, "
                      f"p99 (dashed) {sim.percentile(99) * 1e3:.4g} ms")
            pad = max(edges[-1] - edges[0], 1e-3 * edges[-1]) * 0.1
            hist.set_xlim(edges[0] - pad, edges[-1] + pad)
            hist.set_ylim(0, counts.max() * 1.2)
            sc["note"].set_text("")
        else:
            sc["note"].set_text(self.sim_note or "no simulation")
        hist.set_title(title, fontsize=10)

        # Where a step's time goes: compute and exposed communication.
        rows = [(pred.compute_s, pred.exposed_s)]
        rows.append((float(sim.compute.mean()), sim.exposed_comm) if sim is not None else None)
        m = self.measured_now
        rows.append((m.plan.setup.compute_s,
                     max(0.0, float(np.median(m.step_times)) - m.plan.setup.compute_s))
                    if m is not None else None)
        widths = []
        for comp_bar, comm_bar, text, row in zip(sc["comp_bars"], sc["comm_bars"],
                                                 sc["bar_text"], rows):
            comp, comm = (0.0, 0.0) if row is None else (row[0] * 1e3, row[1] * 1e3)
            comp_bar.set_width(comp)
            comm_bar.set_x(comp)
            comm_bar.set_width(comm)
            text.set_x(comp + comm)
            text.set_text("" if row is None else f" {comp:.3g} + {comm:.3g} ms")
            widths.append(comp + comm)
        bar.set_xlim(0, max(widths) * 1.9 or 1.0)
        real = f"real {m.plan.setup.nodes}×{m.plan.setup.procs_per_node}" if m else "real run"
        bar.set_yticks(np.arange(3)[::-1], ["closed form", "simulated", real])
        bar.set_title(f"where a step's time goes at N={n}")

    def _draw_measured(self, sc: dict[str, Any]) -> list[float]:
        """Measured points (p10-p90 error bars) and the simulator's prediction of the same run,
        drawn once per finished run; returns the throughputs they span (for the y limits)."""
        m = self.measured_now
        if sc["measured"] is not None and sc["measured"][0] is not m:  # stale: take it away
            for artist in sc["measured"][1] + sc["measured"][2]:
                artist.remove()
            sc["measured"] = None
        if m is None:
            return []
        span = [m.throughput(90), m.throughput(10)]
        if sc["measured"] is not None:
            return span
        s = m.plan.setup
        x = s.nodes
        lo, mid, hi = m.throughput(90), m.throughput(50), m.throughput(10)
        made: tuple[list, list] = ([], [])
        per_rank_alone = s.batch_per_rank / s.compute_s  # samples/s of one rank, no network
        for i, (ax, scale) in enumerate(((sc["throughput"], 1.0),
                                         (sc["efficiency"], 100 / (s.ranks * per_rank_alone)))):
            bars = ax.errorbar([x], [mid * scale],
                               yerr=[[(mid - lo) * scale], [(hi - mid) * scale]], fmt="s",
                               color="C3", ms=6, capsize=4,
                               label=f"measured, {x}×{s.procs_per_node} real ranks (p10-p90)")
            made[i].append(bars)
            if m.predicted is not None:
                (dot,) = ax.plot([x], [m.predicted.throughput * scale], "o", mfc="none",
                                 mec="C3", ms=10, label="simulated, same run (with the Gloo floor)")
                made[i].append(dot)
        sc["measured"] = (m, *made)
        return span + ([m.predicted.throughput] if m.predicted is not None else [])

    def _summary_html(self) -> str:
        setup, pred = self.setup, self.prediction
        parts = [f"<b>N = {setup.nodes}</b> × {setup.procs_per_node} = {setup.ranks} ranks. "
                 f"Closed form: <b>{pred.throughput:,.0f} samples/s</b>, "
                 f"step {pred.step_s * 1e3:.3g} ms, efficiency {100 * pred.efficiency:.1f}%."]
        if self.sim is not None:
            parts.append(f"Simulated ({len(self.sim.step_times)} steps): "
                         f"<b>{self.sim.throughput:,.0f} samples/s</b>, "
                         f"p50 {self.sim.percentile(50) * 1e3:.3g} ms, "
                         f"p99 {self.sim.percentile(99) * 1e3:.3g} ms.")
        elif self.sim_note:
            parts.append(self.sim_note)
        m = self.measured_now
        if m is not None:
            parts.append(f"Measured on {m.plan.setup.nodes}×{m.plan.setup.procs_per_node} real "
                         f"ranks ({len(m.step_times)} steps, model "
                         f"{m.plan.setup.model_mib:g} MiB): {m.throughput(50):,.0f} samples/s "
                         f"(p10-p90 of step time: {m.throughput(90):,.0f}-"
                         f"{m.throughput(10):,.0f}).")
        return " ".join(parts)

    def _render(self) -> None:
        super()._render()
        self.nic_label.value = (f"netem: <code>{self.setup.nic or '(none)'}</code> "
                                "(each node's NIC egress)")
        self.summary.value = self._summary_html()

    # --- the real cluster -------------------------------------------------------------------

    def real_plan(self) -> RealPlan:
        return RealPlan.for_setup(self.setup, self.max_real_procs, self.real_steps)

    def on_run_clicked(self, _button: Any = None) -> None:
        """Start the real run on a worker thread (no-op if one is running)."""
        if self.runner.running:
            return
        plan = self.real_plan()
        self.progress.max, self.progress.value = plan.steps, 0
        self.run_button.disabled, self.cancel_button.disabled = True, False
        s = plan.setup
        self.status.value = (f"starting {s.nodes} nodes × {s.procs_per_node} processes "
                             f"(model {s.model_mib:g} MiB)…")
        self.runner.start(lambda run: self._real_job(run, plan), name="clusterlab-real-run")

    def _real_job(self, run: BackgroundRun, plan: RealPlan) -> None:
        s = plan.setup
        args = (s.buckets, s.compute_s, s.overlap)
        with reporting(run, self.status, self.run_button, self.cancel_button):
            # The emulator never completes an all_reduce before plain Gloo could: measure
            # that floor on the same ranks, so the simulated point is this machine's.
            self.status.value = "measuring this machine's own all_reduce time (plain Gloo)…"
            with run.cluster(nodes=s.nodes, procs_per_node=s.procs_per_node, nic=None,
                             timeout=plan.timeout_s) as cl:
                spans = cl.run(all_reduce_spans, sorted(set(s.buckets)), 3)
            floor = {n: float(np.median(durations([r[n] for r in spans]))) for n in spans[0]}
            predicted = simulate_training(**s.sim_kwargs(max(plan.steps, 10), self.seed),
                                          native_s=lambda n: floor.get(n, 0.0))
            run.check()
            with run.cluster(nodes=s.nodes, procs_per_node=s.procs_per_node, nic=s.nic or None,
                             algorithm=s.algorithm, seed=self.seed,
                             timeout=plan.timeout_s) as cl:
                cl.run(_rank_step, *args)  # warm-up: Gloo connects, buffers are allocated
                times = []
                for i in range(plan.steps):
                    run.check()
                    # One repeat per rank; from the last rank's start (they leave the
                    # barrier unevenly) to the end.
                    spans = cl.run(_rank_step, *args)
                    times.append(float(durations([[span] for span in spans])[0]) / 1e9)
                    self.progress.value = i + 1
                    self.status.value = f"step {i + 1}/{plan.steps}: {times[-1] * 1e3:.3g} ms"
            self.measured = MeasuredRun(plan=plan, step_times=np.array(times),
                                        predicted=predicted, native_s=floor)
            self.status.value = (f"measured {len(times)} steps on {s.ranks} real ranks: "
                                 f"median {np.median(times) * 1e3:.3g} ms/step")
            self.update()

    def on_cancel(self, _button: Any = None) -> None:
        """Stop the real run: its cluster is closed (ranks killed), then the worker joined."""
        cancel_run(self.runner, self.status, self.run_button, self.cancel_button,
                   "cancelling… (ranks are being stopped)")

    def close(self) -> None:
        """Stop everything in the background (real run, simulation) and close the widgets."""
        self.runner.cancel()
        self.simulator.cancel()
        self.simulator.wait(10)
        super().close()


def throughput_explorer(**defaults: Any) -> ThroughputExplorer:
    """A ThroughputExplorer with these starting values, e.g. throughput_explorer(nodes=256)."""
    return ThroughputExplorer(**defaults)
