"""Compressing DDP's gradient exchange: bytes for accuracy, and where it stops paying.

Every experiment here trains a small real model (an MLP on a classification task this module
makes, `make_task`) with unmodified `DistributedDataParallel` on the ranks of a
`clusterlab.Cluster`, through the "netem" backend, with a DDP communication hook:

* "none"        - DDP's default: all-reduce the fp32 bucket (torch's `allreduce_hook`);
* "fp16"        - torch's `fp16_compress_hook`: cast to fp16, all-reduce, cast back;
* "bf16"        - the same in bfloat16: `bf16_hook` here is torch's `bf16_compress_hook`
                  (cast, divide, all-reduce, cast back), because DDP's `register_comm_hook`
                  refuses torch's hook by its name unless CUDA and NCCL >= 2.10 (or XPU) are
                  there (`DistributedDataParallel._check_comm_hook`); Gloo reduces bf16 fine;
* "powersgd:R"  - torch's `powerSGD_hook`, rank-R approximation of every gradient matrix
                  (P = M Q, all-reduce P, orthogonalise, Q = M^T P, all-reduce Q), with error
                  feedback; vectors (biases) are all-reduced uncompressed;
* "topk:F"      - `TopK`, written here: keep the fraction F of largest-magnitude entries of
                  (gradient + residual), all-gather (values, indices) from every rank, sum;
                  what was not sent stays in the residual (error feedback), kept per
                  parameter: DDP reorders its bucket after the first step. "topk-noef:F"
                  drops the residual, to show why it matters.

What is counted: every collective a hook issues is recorded with its payload bytes (the
tensor handed to Gloo). The bytes each rank puts on the wire follow from the algorithm the
network replays (ring): `models.busbw_factor` x the collective's size, the nccl-tests
convention. The counts are measured from the hooks' real calls; `predicted_bytes` derives
them from the model's shapes alone, and the two must agree.

A relay: torch's PowerSGD hook waits on a collective's future from inside another future's
callback. The netem backend runs callbacks on its completion thread, which must then also
complete the awaited collective: that deadlocks (reported to the backend's owner). Every
collective a hook issues here is therefore handed back through a future that a short-lived
thread completes (`_Meter`). That thread is started once per collective, so its cost, like
the backend's own per-collective bookkeeping, is paid three times by PowerSGD (three
all-reduces) and once by every other method: it is part of PowerSGD's measured extra time.

Step times (`step_time_sweep`, `sweep_stats`): one constant per method, its compute, is
fitted from the sweep; everything else in a predicted step is the ring closed form of the
collectives the hook issued. A run on a shared machine is noisy, so `SweepStats` says "cannot
tell" instead of "faster" or "slower" when a difference is inside the run's noise band.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from .. import models
from ..backend import match_intra_op_threads
from ..cluster import Cluster
from ..netem import Netem
from ..wire import wire_beta
from .common import preload_ddp, use_or_open

BASE_METHODS = ("none", "fp16", "bf16", "powersgd", "topk", "topk-noef")
DEFAULT_METHODS = ("none", "fp16", "bf16", "powersgd:1", "powersgd:4", "topk:0.01")
TASK = dict(features=32, hidden=256, classes=10, train=4096, test=2048)
# Trained models are compared after this many steps; PowerSGD starts compressing after
# POWERSGD_START plain steps (torch requires >= 2; they also rebuild DDP's buckets).
POWERSGD_START = 2


def parse_method(method: str) -> tuple[str, float | None]:
    """("powersgd", 4.0) from "powersgd:4"; ValueError naming a method it does not know."""
    if not isinstance(method, str):
        raise TypeError(f"method must be a string such as 'powersgd:2', got {method!r}")
    name, _, arg = method.partition(":")
    if name not in BASE_METHODS:
        raise ValueError(f"unknown method {method!r}; choose from none, fp16, bf16, "
                         "powersgd:RANK, topk:FRACTION, topk-noef:FRACTION")
    if name in ("none", "fp16", "bf16"):
        if arg:
            raise ValueError(f"method {name!r} takes no argument, got {method!r}")
        return name, None
    try:
        value = float(arg)
    except ValueError:
        raise ValueError(f"method {method!r} needs a number after ':'") from None
    if name == "powersgd" and not (value >= 1 and value == int(value)):
        raise ValueError(f"PowerSGD's rank must be an integer >= 1, got {method!r}")
    if name.startswith("topk") and not 0 < value <= 1:
        raise ValueError(f"top-k's fraction must be in (0, 1], got {method!r}")
    return name, value


# --- the task: data this module makes ---------------------------------------------------------


def make_task(seed: int = 0, *, features: int = TASK["features"], classes: int = TASK["classes"],
              train: int = TASK["train"], test: int = TASK["test"]):
    """A learnable classification task: Gaussian inputs labelled by a fixed random teacher
    (a 2-layer tanh network, argmax over `classes`). Returns torch tensors
    (x_train, y_train, x_test, y_test); the same seed gives the same task."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    w1 = torch.randn(features, 64, generator=gen) / math.sqrt(features)
    w2 = torch.randn(64, classes, generator=gen) / 8.0
    x = torch.randn(train + test, features, generator=gen)
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return x[:train], y[:train], x[train:], y[train:]


def build_model(features: int = TASK["features"], hidden: int = TASK["hidden"],
                classes: int = TASK["classes"]):
    """The student: Linear(features, hidden), ReLU, Linear(hidden, hidden), ReLU,
    Linear(hidden, classes)."""
    import torch

    return torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, classes))


def parameter_shapes(**task) -> list[tuple[int, ...]]:
    """The student's parameter shapes (what `predicted_bytes` reasons from)."""
    cfg = {**TASK, **task}
    f, h, c = cfg["features"], cfg["hidden"], cfg["classes"]
    return [(h, f), (h,), (h, h), (h,), (c, h), (c,)]


# --- the hooks ---------------------------------------------------------------------------------


class _Meter:
    """Issues the hooks' collectives, records (kind, payload bytes), and relays each future
    through a thread of its own (see the module doc)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def _relay(self, work, value):
        import torch

        out = torch.futures.Future()

        def wait():
            # The hook's callbacks chained on `out` (PowerSGD's orthogonalisation and matmuls)
            # run in this thread: with the rank's intra-op thread count, as on every other
            # rank, or they round differently and the replicas drift apart.
            match_intra_op_threads()
            try:
                work.wait()
                out.set_result(value)
            except Exception as exc:  # noqa: BLE001 - handed to whoever waits on `out`
                out.set_exception(exc)

        threading.Thread(target=wait, daemon=True).start()
        return _RelayWork(out)

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        import torch.distributed as dist

        self.calls.append(("allreduce", tensor.numel() * tensor.element_size()))
        work = dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM, group=group, async_op=True)
        if not async_op:
            work.wait()
            return None
        return self._relay(work, [tensor])

    def all_gather(self, outputs, tensor, group=None):
        import torch.distributed as dist

        self.calls.append(("allgather", tensor.numel() * tensor.element_size()))
        work = dist.all_gather(outputs, tensor, group=group, async_op=True)
        return self._relay(work, outputs).get_future()


class _RelayWork:
    def __init__(self, future) -> None:
        self._future = future

    def get_future(self):
        return self._future

    def wait(self):
        self._future.wait()
        return True


class _DistProxy:
    """torch.distributed as torch's hooks see it, with all_reduce going through a _Meter."""

    def __init__(self, meter: _Meter) -> None:
        self.meter = meter

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        return self.meter.all_reduce(tensor, op=op, group=group, async_op=async_op)

    def __getattr__(self, name):
        import torch.distributed as dist

        return getattr(dist, name)


def _torch_hooks_through(meter: _Meter | None) -> None:
    """Point torch's hook modules at `meter` (in this rank's process only); None puts
    torch.distributed back, so later runs on the same ranks see torch's hooks unchanged."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    default_hooks.dist = powerSGD_hook.dist = dist if meter is None else _DistProxy(meter)


def bf16_hook(meter: _Meter, bucket):
    """torch's bf16_compress_hook, on any backend: mean of the bucket in bfloat16 (the DDP
    hook's state is the _Meter its collectives go through). DDP refuses torch's own hook by
    name without CUDA and NCCL >= 2.10; this one is the same arithmetic under another name."""
    import torch

    world = _world()
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(world)
    fut = meter.all_reduce(compressed, async_op=True).get_future()

    def decompress(fut):
        buffer.copy_(fut.value()[0])
        return buffer

    return fut.then(decompress)


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size()


@dataclass
class TopK:
    """Top-k sparsification with error feedback (Stich et al. 2018; Lin et al. 2018, "Deep
    Gradient Compression"): each rank sends the k largest-magnitude entries of its gradient
    plus what it has not sent before, and keeps the rest for the next step.

    The message is k values and k indices (int32 bits carried in fp32 slots), all-gathered:
    every rank picks different indices, so the sparse vectors cannot be all-reduced as they
    are. Each rank's bytes on the wire therefore grow with p ((p-1) x 8k), unlike an
    all-reduce's.

    The residual is kept per parameter, not per bucket: DDP builds its first buckets in
    parameter order and rebuilds them after the first step in the order the gradients became
    ready in backward, which permutes a bucket's layout (a residual kept by bucket index
    would then be added to other parameters' entries; torch's PowerSGD hook avoids the same
    problem by starting only after that rebuild, `start_powerSGD_iter` >= 2).
    """

    fraction: float
    meter: _Meter
    error_feedback: bool = True
    residuals: dict = field(default_factory=dict)  # parameter -> its entries not sent yet

    @staticmethod
    def slices(bucket) -> list:
        """(parameter, slice of the bucket's buffer) for each parameter of `bucket`: DDP's
        buffer holds their gradients flattened one after another, in `bucket.parameters()`
        order."""
        out, start = [], 0
        for p in bucket.parameters():
            out.append((p, slice(start, start + p.numel())))
            start += p.numel()
        if start != bucket.buffer().numel():
            raise RuntimeError(f"the bucket's parameters hold {start} entries, its buffer "
                               f"{bucket.buffer().numel()}")
        return out

    def residual(self, bucket, parts=None):
        """What this rank has not sent yet of `bucket`'s entries, in the layout of its
        buffer now (zeros for a parameter not seen yet); `parts`: `slices(bucket)`, if known."""
        import torch

        flat = torch.zeros_like(bucket.buffer())
        for p, s in parts if parts is not None else self.slices(bucket):
            if p in self.residuals:
                flat[s] = self.residuals[p]
        return flat

    def __call__(self, bucket):
        import torch

        buffer = bucket.buffer()
        n = buffer.numel()
        k = max(1, min(n, int(self.fraction * n)))
        acc = buffer.clone()
        parts = self.slices(bucket) if self.error_feedback else None
        if self.error_feedback:
            acc += self.residual(bucket, parts)
        idx = acc.abs().topk(k, sorted=False).indices
        payload = torch.cat([acc[idx], idx.to(torch.int32).view(torch.float32)])
        if self.error_feedback:
            acc[idx] = 0.0
            for p, s in parts:  # not sent: next step's head start
                self.residuals[p] = acc[s]
        world = _world()
        gathered = [torch.empty_like(payload) for _ in range(world)]
        fut = self.meter.all_gather(gathered, payload)

        def decode(fut):
            dense = torch.zeros_like(buffer)
            for part in gathered:
                dense.index_add_(0, part[k:].view(torch.int32).long(), part[:k])
            buffer.copy_(dense.div_(world))
            return buffer

        return fut.then(decode)


def topk_hook(state: TopK, bucket):
    """The DDP hook of `TopK` (DDP wants a function of (state, bucket))."""
    return state(bucket)


def register(ddp, method: str, meter: _Meter) -> None:
    """Register `method`'s hook on a DDP model; its collectives go through `meter`."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    name, arg = parse_method(method)
    _torch_hooks_through(meter)
    if name == "none":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif name == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "bf16":
        ddp.register_comm_hook(meter, bf16_hook)
    elif name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(arg),
            start_powerSGD_iter=POWERSGD_START, min_compression_rate=1,
            use_error_feedback=True, warm_start=True, random_seed=0)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        ddp.register_comm_hook(TopK(arg, meter, error_feedback=name == "topk"), topk_hook)


# --- what runs on every rank ------------------------------------------------------------------


def _train_worker(cfg: dict) -> dict:
    """One rank's run; torch's hook modules are put back afterwards (the ranks live on)."""
    try:
        return _train(cfg)
    finally:
        _torch_hooks_through(None)


def _train(cfg: dict) -> dict:
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg["seed"])
    x, y, x_test, y_test = make_task(cfg["seed"])
    x, y = x[rank::world], y[rank::world]  # this rank's shard
    model = build_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    meter = _Meter()
    register(ddp, cfg["method"], meter)
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    gen = torch.Generator().manual_seed(100 + rank)
    steps, losses, calls = [], [], []
    for _ in range(cfg["steps"]):
        batch = torch.randint(0, len(x), (cfg["batch"],), generator=gen)
        meter.calls.clear()
        t0 = time.monotonic_ns()
        loss = torch.nn.functional.cross_entropy(ddp(x[batch]), y[batch])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        steps.append((time.monotonic_ns() - t0) / 1e9)
        losses.append(loss.item())
        calls.append(list(meter.calls))
    with torch.no_grad():
        logits = model(x_test)  # one forward pass for every test statistic
        test_loss = float(torch.nn.functional.cross_entropy(logits, y_test))
        sample_loss = torch.nn.functional.cross_entropy(logits, y_test, reduction="none")
        correct = logits.argmax(1) == y_test  # per test sample, for paired comparisons
        accuracy = float(correct.float().mean())
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"rank": rank, "step_s": steps, "loss": losses, "calls": calls,
            "test_loss": test_loss, "accuracy": accuracy, "correct": correct.tolist(),
            "sample_loss": sample_loss.tolist(),
            "param_bytes": params.numel() * params.element_size(),
            "checksum": float(params.double().sum())}


# --- what the parent does with it -------------------------------------------------------------


def sent_bytes(kind: str, payload: int, p: int) -> float:
    """Bytes one rank puts on the wire for a ring collective whose input is `payload` bytes:
    busbw_factor x the collective's size (all-reduce: its input; all-gather: the gathered
    result, p x the input)."""
    size = payload * p if kind == "allgather" else payload
    return models.busbw_factor({"allreduce": "all_reduce", "allgather": "all_gather"}[kind],
                               p) * size


def comm_seconds(calls, p: int, alpha: float, beta: float) -> float:
    """The closed-form time of a step's collectives, run one after another (ring)."""
    total = 0.0
    for kind, payload in calls:
        if kind == "allreduce":
            total += models.ring_allreduce(p, payload, alpha, beta)
        else:
            total += models.ring_allgather(p, payload * p, alpha, beta)
    return total


def predicted_calls(method: str, p: int, **task) -> list[tuple[str, int]]:
    """The collectives a compressed step issues, from the model's shapes alone (one DDP
    bucket: this model is far below its 25 MB cap)."""
    name, arg = parse_method(method)
    shapes = parameter_shapes(**task)
    n = sum(math.prod(s) for s in shapes)
    if name == "none":
        return [("allreduce", 4 * n)]
    if name in ("fp16", "bf16"):
        return [("allreduce", 2 * n)]
    if name == "powersgd":
        r = int(arg)
        vectors = sum(math.prod(s) for s in shapes if len(s) == 1)
        matrices = [s for s in shapes if len(s) > 1]
        # torch compresses a matrix only if that saves bytes (min_compression_rate=1 here)
        small = [s for s in matrices if (s[0] + s[1]) * min(r, *s) >= s[0] * s[1]]
        big = [s for s in matrices if s not in small]
        uncompressed = vectors + sum(math.prod(s) for s in small)
        return [("allreduce", 4 * uncompressed),
                ("allreduce", 4 * sum(s[0] * min(r, *s) for s in big)),
                ("allreduce", 4 * sum(s[1] * min(r, *s) for s in big))]
    k = max(1, min(n, int(arg * n)))
    return [("allgather", 8 * k)]


@dataclass
class CompressionRun:
    """One method's training run on a cluster: per rank, per step, the step time, the loss
    and the collectives its hook issued."""

    method: str
    nic: str
    config: dict
    ranks: list[dict]

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def compressed_calls(self) -> list[tuple[str, int]]:
        """The collectives of the last step (PowerSGD compresses only after its start)."""
        return self.ranks[0]["calls"][-1]

    @property
    def payload_bytes(self) -> int:
        return sum(b for _, b in self.compressed_calls())

    @property
    def sent_bytes(self) -> float:
        """Bytes one rank sends per compressed step (ring)."""
        return sum(sent_bytes(k, b, self.world_size) for k, b in self.compressed_calls())

    def step_seconds(self, skip: int = POWERSGD_START + 1) -> np.ndarray:
        """Per step after `skip` warm-up steps: the slowest rank's step time."""
        return np.array([r["step_s"][skip:] for r in self.ranks]).max(axis=0)

    @property
    def replicas_identical(self) -> bool:
        return len({r["checksum"] for r in self.ranks}) == 1

    def summary(self) -> dict:
        steps = self.step_seconds()
        loss = np.array([r["loss"] for r in self.ranks]).mean(axis=0)
        tail = max(1, len(loss) // 10)
        return {"method": self.method, "nic": self.nic, "ranks": self.world_size,
                "payload_bytes": self.payload_bytes, "sent_bytes": self.sent_bytes,
                "collectives": len(self.compressed_calls()),
                "step_s": float(np.median(steps)), "step_fastest_s": float(steps.min()),
                "steps_measured": len(steps),
                "final_loss": float(loss[-tail:].mean()),
                "test_loss": self.ranks[0]["test_loss"], "accuracy": self.ranks[0]["accuracy"],
                "correct": np.array(self.ranks[0]["correct"], dtype=bool),
                "sample_loss": np.array(self.ranks[0]["sample_loss"]),
                "replicas_identical": self.replicas_identical}


# Plain SGD: with momentum, top-k's residual needs momentum correction (Lin et al. 2018)
DEFAULTS = dict(method="none", steps=8, batch=64, lr=0.2, momentum=0.0, seed=0)


def run_method(cluster: Cluster, **options) -> CompressionRun:
    """Train with one method on an open cluster; options override DEFAULTS."""
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown option(s) {sorted(unknown)}; choose from {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **options}
    parse_method(cfg["method"])
    if not isinstance(cfg["steps"], int) or cfg["steps"] < POWERSGD_START + 2:
        raise ValueError(f"steps must be an integer >= {POWERSGD_START + 2}, "
                         f"got {cfg['steps']!r}")
    ranks = cluster.run(_train_worker, cfg)
    return CompressionRun(method=cfg["method"], nic=str(cluster.nic), config=cfg, ranks=ranks)


def _alpha_beta(nic: str) -> tuple[float, float]:
    spec = Netem.parse(nic)
    return spec.delay_s, wire_beta(spec.rate_bps)


def bytes_table(methods=DEFAULT_METHODS, *, nodes: int = 4, nic: str = "delay 1ms",
                cluster: Cluster | None = None) -> list[dict]:
    """Per method: payload and wire bytes per rank per step, measured from the hooks' calls,
    next to `predicted_calls` from the model's shapes."""
    rows = []
    with use_or_open(cluster, ddp=True, nodes=nodes, nic=nic, timeout=120) as cl:
        for method in methods:
            run = run_method(cl, method=method, steps=POWERSGD_START + 2)
            predicted = predicted_calls(method, run.world_size)
            rows.append({**run.summary(), "predicted_calls": predicted,
                         "measured_calls": run.compressed_calls(),
                         "predicted_sent_bytes": sum(sent_bytes(k, b, run.world_size)
                                                     for k, b in predicted)})
    return rows


def step_time_sweep(methods=DEFAULT_METHODS, *, nodes: int = 4, delay_ms: float = 2.0,
                    rates_mbit=(25, 100, 400, 1600), steps: int = 8,
                    statistic: str = "fastest") -> list[dict]:
    """Step time of every method at every rate (one cluster per rate), next to the
    closed-form prediction: the method's compute plus the ring costs of the collectives it
    issued ("predicted_comm_s", alpha the delay, beta from the rate).

    The compute is the one fitted constant per method ("compute_s"): the median over the
    rates of its step minus its exchange's closed form. A median over all rates, not the
    step at one calibration rate: every prediction would otherwise inherit that one step's
    noise, and a calibration step that happened to run fast makes the model look optimistic
    at every other rate at once.

    "step_s" is the `statistic` of the slowest rank's steps after the warm-up: "fastest"
    (default) or "median". On a network without jitter every step costs the same, and
    load on a shared machine only ever adds time, so the fastest step is the estimate
    that other programs on the machine disturb least; the median is kept as
    "step_median_s" either way."""
    if statistic not in ("fastest", "median"):
        raise ValueError(f"statistic must be 'fastest' or 'median', got {statistic!r}")
    preload_ddp()
    rows = []
    for rate in rates_mbit:
        nic = f"delay {delay_ms:g}ms rate {rate:g}mbit"
        with Cluster(nodes=nodes, nic=nic, timeout=120) as cl:
            for method in methods:
                run = run_method(cl, method=method, steps=steps)
                alpha, beta = _alpha_beta(nic)
                summary = run.summary()
                summary["step_median_s"] = summary["step_s"]
                if statistic == "fastest":
                    summary["step_s"] = summary["step_fastest_s"]
                rows.append({**summary, "rate_mbit": rate, "delay_ms": delay_ms,
                             "predicted_comm_s": comm_seconds(run.compressed_calls(),
                                                              run.world_size, alpha, beta)})
    fit_compute(rows)
    return rows


def fit_compute(rows: list[dict]) -> list[dict]:
    """Set "compute_s" (the median over a method's rows of step_s - predicted_comm_s) and
    "predicted_step_s" (compute_s + predicted_comm_s) on every row; returns the rows."""
    for method in {r["method"] for r in rows}:
        mine = [r for r in rows if r["method"] == method]
        compute = max(0.0, float(np.median([r["step_s"] - r["predicted_comm_s"]
                                            for r in mine])))
        for r in mine:
            r["compute_s"] = compute
            r["predicted_step_s"] = compute + r["predicted_comm_s"]
    return rows


def robust_band(values) -> float:
    """3 robust standard deviations (1.4826 x the median absolute deviation) of `values`:
    one disturbed value cannot set it, as it would a plain standard deviation."""
    return 3 * float(stats.median_abs_deviation(np.asarray(list(values), dtype=float),
                                                scale="normal"))


@dataclass
class SweepStats:
    """What a `step_time_sweep` shows against a baseline method, with the run's noise.

    A method's residual at a rate is its step minus its exchange's closed form: its compute
    plus whatever this machine added. The network's rate cannot change the compute, so the
    residual's spread across the rates is noise (or misfit). A difference between two
    methods counts only beyond `band(m)`: the larger of the two methods' robust spreads."""

    rows: list[dict]
    baseline: str = "none"

    def __post_init__(self) -> None:
        self.table = {(r["method"], r["rate_mbit"]): r for r in self.rows}
        self.rates = sorted({r["rate_mbit"] for r in self.rows})
        self.methods = list(dict.fromkeys(r["method"] for r in self.rows))
        if self.baseline not in self.methods:
            raise ValueError(f"the sweep has no {self.baseline!r} rows")
        self.slow, self.fast = self.rates[0], self.rates[-1]
        self.residual = {m: {q: self.step(m, q) - self.table[m, q]["predicted_comm_s"]
                             for q in self.rates} for m in self.methods}

    def step(self, method: str, rate) -> float:
        return self.table[method, rate]["step_s"]

    def band(self, method: str) -> float:
        """The noise band (s) of a difference between `method` and the baseline."""
        return max(robust_band(self.residual[method].values()),
                   robust_band(self.residual[self.baseline].values()))

    def gain(self, method: str, rate) -> float:
        """The baseline's step minus the method's (s): > 0 when the method is faster."""
        return self.step(self.baseline, rate) - self.step(method, rate)

    def verdict(self, method: str, rate) -> str:
        """"faster", "slower" than the baseline, or "cannot tell" (inside the band)."""
        g = self.gain(method, rate)
        return "cannot tell" if abs(g) <= self.band(method) else "faster" if g > 0 else "slower"

    def speedup(self, method: str, rate) -> float:
        return self.step(self.baseline, rate) / self.step(method, rate)

    def extra_s(self, method: str) -> float:
        """The method's time beyond its exchange, more than the baseline's: the median over
        the rates of the difference of residuals (>= 0)."""
        return max(0.0, float(np.median([self.residual[method][q]
                                         - self.residual[self.baseline][q]
                                         for q in self.rates])))

    def prediction_errors(self) -> np.ndarray:
        """|predicted / measured - 1| of every row (the fit has one constant per method)."""
        return np.array([abs(r["predicted_step_s"] / r["step_s"] - 1) for r in self.rows])

    def crossing(self, method: str) -> tuple[float | None, float | None, bool]:
        """(last rate where the method paid, first rate where it lost, mixed): the measured
        crossing when every rate it paid at lies below every rate it lost at; mixed when the
        gain went up and down across the rates, which the network alone cannot do."""
        paid = [q for q in self.rates if self.verdict(method, q) == "faster"]
        lost = [q for q in self.rates if self.verdict(method, q) == "slower"]
        if not paid or not lost:
            return None, None, False
        if max(paid) < min(lost):
            return max(paid), min(lost), False
        return None, None, True

    def breakeven_mbit(self, method: str, p: int, delay_s: float) -> tuple[float, float, float]:
        """The predicted break-even rate (Mbit/s) with the measured extra time, and with the
        extra time plus and minus the band: (low, middle, high)."""
        extra, band = self.extra_s(method), self.band(method)
        return tuple(breakeven_rate_bps(method, p, delay_s, max(0.0, t)) / 1e6
                     for t in (extra + band, extra, extra - band))


def sweep_stats(rows: list[dict], baseline: str = "none") -> SweepStats:
    """`SweepStats` of a `step_time_sweep`."""
    return SweepStats(rows, baseline)


def latency_terms(calls, p: int, latency: str = "ring") -> int:
    """The delays a step's collectives wait, one after another: "ring" 2(p-1) per all-reduce
    and p-1 per all-gather (the closed forms used throughout); "log" an idealised tree's
    2 ceil(lg p) per all-reduce and ceil(lg p) per all-gather."""
    if latency not in ("ring", "log"):
        raise ValueError(f"latency must be 'ring' or 'log', got {latency!r}")
    depth = math.ceil(math.log2(p)) if p > 1 else 0
    per = ({"allreduce": 2 * (p - 1), "allgather": p - 1} if latency == "ring"
           else {"allreduce": 2 * depth, "allgather": depth})
    return sum(per[kind] for kind, _ in calls)


def breakeven_rate_bps(method: str, p: int, delay_s: float, overhead_s: float = 0.0, *,
                       latency: str = "ring", **task) -> float:
    """The link rate above which `method` no longer beats plain all-reduce (bit/s).

    Each step's exchange is linear in alpha and beta: L alpha + B beta, with B from the ring
    closed forms of the collectives (`predicted_calls`) and L from `latency_terms` (the
    ring's by default). Compression pays while
    (B_none - B) beta > (L - L_none) alpha + overhead_s, i.e. up to beta* and the rate
    8 / beta* (headers ignored). inf if it always pays, 0 if it never does.
    """
    def coefficients(m):
        calls = predicted_calls(m, p, **task)
        return latency_terms(calls, p, latency), comm_seconds(calls, p, 0.0, 1.0)

    lat_none, bw_none = coefficients("none")
    lat, bw = coefficients(method)
    saved_per_beta = bw_none - bw
    cost = (lat - lat_none) * delay_s + overhead_s
    if saved_per_beta <= 0:
        return 0.0
    if cost <= 0:
        return math.inf
    return 8 * saved_per_beta / cost


def accuracy_table(methods=DEFAULT_METHODS + ("topk-noef:0.01",), *, nodes: int = 4,
                   nic: str = "delay 200us", steps: int = 150,
                   cluster: Cluster | None = None) -> list[dict]:
    """Train every method for `steps` steps from the same start: final training loss, test
    loss and accuracy on the held-out set, with each test sample's loss ("sample_loss") and
    whether it was classified right ("correct"), for paired comparisons."""
    rows = []
    with use_or_open(cluster, ddp=True, nodes=nodes, nic=nic, timeout=300) as cl:
        for method in methods:
            run = run_method(cl, method=method, steps=steps)
            rows.append({**run.summary(), "loss_curve": np.array(
                [r["loss"] for r in run.ranks]).mean(axis=0)})
    return rows
