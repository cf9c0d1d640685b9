"""Anatomy of a DDP step: unmodified DistributedDataParallel through the emulated network.

Every experiment here runs real `torch.nn.parallel.DistributedDataParallel` on the ranks of a
`clusterlab.Cluster` and records, on every rank and for every step, when each phase began and
ended (all ranks share CLOCK_MONOTONIC, so the timelines line up across ranks):

    forward | backward compute | wait for the exchange | optimizer
                \\-> bucket 0 all_reduce, bucket 1, ... (issue and completion of each)

The buckets' all_reduces are instrumented with a DDP communication hook that wraps DDP's own
default hook (`default_hooks.allreduce_hook`): the time at which DDP hands a bucket over is
the issue time, and a `fut.then` callback, which runs when the netem backend completes the
operation's future at its emulated time, is the completion time. DDP itself is untouched, so
it overlaps the all_reduces with the rest of the backward pass as it would on a GPU cluster.

The "accelerator": the model's layers are real `nn.Linear` layers (their gradients are real
and are what the network reduces), but most of the step's compute time is a sleep per layer,
forward and backward, standing for an accelerator that computes while the CPU is free. That
keeps the timeline clean on a 2-core laptop shared by 4-8 ranks, and makes compute time a
parameter. What the network does to it is measured, not assumed.

Modes of the exchange (`mode=`):

* "overlap": DDP as shipped; each bucket's all_reduce starts as soon as the bucket is ready.
* "deferred": the same buckets, but a hook holds every bucket until the last one is ready
  (the end of the backward pass) and only then issues them all: no overlap, same messages.
* "fused": backward under `no_sync()`, then one manual all_reduce of all gradients
  flattened together (no overlap, one message).

`accumulate=k` runs k-1 micro-steps under `no_sync()` before each synchronised one
(gradient accumulation: one exchange per k micro-batches).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import numpy as np

from .. import models
from ..cluster import Cluster
from ..netem import Netem
from ..wire import wire_beta
from .common import first_ranks, preload_ddp, release, use_or_open

MODES = ("overlap", "deferred", "fused")
preload = preload_ddp  # notebook 03 calls ddp.preload() before opening its own cluster


PHASES = ("forward", "backward", "wait", "optimizer")
PHASE_COLORS = {"forward": "#4C72B0", "backward": "#55A868", "wait": "#C44E52",
                "optimizer": "#8172B2", "local": "#CCB974", "comm": "#DD8452"}


# --- what runs on every rank ------------------------------------------------------------------


def _accelerator_fn():
    """A torch.autograd.Function that sleeps in forward and backward (the accelerator)."""
    import torch

    class Accelerator(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, forward_s, backward_s):
            ctx.backward_s = backward_s
            if forward_s > 0:
                time.sleep(forward_s)
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            if ctx.backward_s > 0:
                time.sleep(ctx.backward_s)
            return grad, None, None

    return Accelerator


def build_model(width: int = 256, depth: int = 8, forward_s: float = 0.0,
                backward_s: float = 0.0):
    """depth x (Linear(width, width), ReLU, accelerator sleep), then Linear(width, 10)."""
    import torch

    return torch.nn.Sequential(*layer_stack(width, depth, forward_s, backward_s),
                               torch.nn.Linear(width, 10))


def layer_stack(width: int, depth: int, forward_s: float = 0.0, backward_s: float = 0.0):
    """depth x (Linear(width, width), ReLU, accelerator sleep), as a list of modules."""
    import torch

    accelerator = _accelerator_fn()

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(width, width)

        def forward(self, x):
            return accelerator.apply(torch.relu(self.linear(x)), forward_s, backward_s)

    return [Layer() for _ in range(depth)]


def _ddp_worker(cfg: dict) -> dict:
    """One rank's run: DDP steps with per-phase and per-bucket timestamps (ns, monotonic)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    group, members = first_ranks(cfg["ranks"])
    if group is False:  # this rank sits the run out
        return None
    rank, world = dist.get_rank(), len(members)
    torch.manual_seed(cfg["seed"])
    model = build_model(cfg["width"], cfg["depth"], cfg["forward_s"], cfg["backward_s"])
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cfg["bucket_cap_mb"],
                                                    process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(cfg["batch"], cfg["width"], generator=gen)
    y = torch.randint(0, 10, (cfg["batch"],), generator=gen)
    mode = cfg["mode"]
    buckets: list[dict] = []  # this step's buckets, filled by the hooks

    def done_at(entry):
        def callback(fut):
            entry["done"] = time.monotonic_ns()
            return fut.value()
        return callback

    def timed_hook(pg, bucket):
        entry = {"index": bucket.index(), "bytes": _bucket_bytes(bucket),
                 "ready": time.monotonic_ns()}
        entry["issue"] = entry["ready"]
        buckets.append(entry)
        return default_hooks.allreduce_hook(pg, bucket).then(done_at(entry))

    held: list = []

    def deferred_hook(pg, bucket):
        entry = {"index": bucket.index(), "bytes": _bucket_bytes(bucket),
                 "ready": time.monotonic_ns()}
        buckets.append(entry)
        out = torch.futures.Future()
        held.append((bucket.buffer(), entry, out))
        if bucket.is_last():  # the end of the backward pass: now issue them all, in order
            for buffer, e, fut in held:
                e["issue"] = time.monotonic_ns()
                buffer.div_(world)
                work = dist.all_reduce(buffer, group=group, async_op=True)

                def finish(f, e=e, fut=fut, buffer=buffer):
                    e["done"] = time.monotonic_ns()
                    fut.set_result(buffer)

                work.get_future().then(finish)
            held.clear()
        return out

    if mode == "overlap":
        ddp.register_comm_hook(group, timed_hook)
    elif mode == "deferred":
        ddp.register_comm_hook(group, deferred_hook)
    elif mode != "fused":
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")

    grad_times: list[int] = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda _p: grad_times.append(time.monotonic_ns()))

    def micro_step(sync: bool) -> dict:
        rec: dict = {}
        buckets.clear()
        grad_times.clear()
        rec["t0"] = time.monotonic_ns()
        ctx = ddp.no_sync() if (not sync or mode == "fused") else contextlib.nullcontext()
        with ctx:
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            rec["forward_end"] = time.monotonic_ns()
            loss.backward()
        rec["backward_return"] = time.monotonic_ns()
        rec["backward_end"] = max(grad_times) if grad_times else rec["backward_return"]
        if sync and mode == "fused":
            grads = [p.grad for p in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            entry = {"index": 0, "bytes": flat.numel() * flat.element_size(),
                     "ready": time.monotonic_ns()}
            entry["issue"] = entry["ready"]
            dist.all_reduce(flat, group=group)
            entry["done"] = time.monotonic_ns()
            flat.div_(world)
            offset = 0
            for g in grads:
                g.copy_(flat[offset: offset + g.numel()].view_as(g))
                offset += g.numel()
            buckets.append(entry)
            rec["backward_return"] = time.monotonic_ns()
        rec["buckets"] = [dict(b) for b in buckets]
        rec["sync"] = sync
        return rec

    records = []
    k = cfg["accumulate"]
    for step in range(cfg["warmup"] + cfg["steps"]):
        micro = []
        for i in range(k):
            rec = micro_step(sync=(i == k - 1))
            if rec["sync"]:
                opt.step()
                opt.zero_grad(set_to_none=False)
            rec["optimizer_end"] = time.monotonic_ns()
            rec["step"] = step - cfg["warmup"]
            micro.append(rec)
        if step >= cfg["warmup"]:
            records.extend(micro)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    release(group)
    return {"rank": rank, "records": records,
            "param_bytes": params.numel() * params.element_size(),
            "checksum": float(params.double().sum()), "param_hash": _hash(params)}


def _bucket_bytes(bucket) -> int:
    buf = bucket.buffer()
    return int(buf.numel() * buf.element_size())


def _hash(t) -> str:
    import hashlib

    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


# --- what the parent does with it -------------------------------------------------------------


@dataclass
class DDPRun:
    """The timeline of a DDP run: per rank, per (micro-)step, phases and buckets (seconds)."""

    config: dict
    ranks: list[dict]  # per rank: {"rank", "records", "param_bytes", "checksum", "param_hash"}
    origin_ns: int = 0

    def __post_init__(self) -> None:
        if not self.origin_ns:
            self.origin_ns = min(r["records"][0]["t0"] for r in self.ranks)

    # times relative to the run's origin, in seconds
    def _s(self, ns: int) -> float:
        return (ns - self.origin_ns) / 1e9

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def param_bytes(self) -> int:
        return self.ranks[0]["param_bytes"]

    @property
    def replicas_identical(self) -> bool:
        return len({r["param_hash"] for r in self.ranks}) == 1

    def phases(self) -> dict[str, np.ndarray]:
        """Durations (s) per phase, shape (ranks, synced steps); they sum to `step`."""
        out: dict[str, list] = {k: [] for k in (*PHASES, "step", "local")}
        for r in self.ranks:
            rows: dict[str, list] = {k: [] for k in out}
            local = 0.0
            for rec in r["records"]:
                if not rec["sync"]:  # an accumulation micro-step: compute only
                    local += (rec["optimizer_end"] - rec["t0"]) / 1e9
                    continue
                rows["forward"].append((rec["forward_end"] - rec["t0"]) / 1e9)
                rows["backward"].append((rec["backward_end"] - rec["forward_end"]) / 1e9)
                rows["wait"].append((rec["backward_return"] - rec["backward_end"]) / 1e9)
                rows["optimizer"].append((rec["optimizer_end"] - rec["backward_return"]) / 1e9)
                rows["step"].append((rec["optimizer_end"] - rec["t0"]) / 1e9 + local)
                rows["local"].append(local)
                local = 0.0
            for k in out:
                out[k].append(rows[k])
        return {k: np.array(v) for k, v in out.items()}

    def buckets(self) -> list[dict]:
        """One row per (rank, step, bucket): bytes and ready/issue/done times (s)."""
        rows = []
        for r in self.ranks:
            for rec in r["records"]:
                for b in rec["buckets"]:
                    rows.append({"rank": r["rank"], "step": rec["step"], "index": b["index"],
                                 "bytes": b["bytes"], "ready": self._s(b["ready"]),
                                 "issue": self._s(b["issue"]), "done": self._s(b["done"]),
                                 "duration": (b["done"] - b["issue"]) / 1e9})
        return rows

    @property
    def bucket_sizes(self) -> list[int]:
        """Bytes of each bucket, in the order DDP reduces them (rank 0, first synced step)."""
        rec = next(r for r in self.ranks[0]["records"] if r["sync"])
        return [b["bytes"] for b in sorted(rec["buckets"], key=lambda b: b["index"])]

    def comm_busy(self) -> np.ndarray:
        """Per (rank, synced step): time the communication stream was busy (union of the
        buckets' [issue, done] intervals), in seconds."""
        out = []
        for r in self.ranks:
            row = []
            for rec in r["records"]:
                if rec["sync"]:
                    row.append(_union_length([(b["issue"], b["done"]) for b in rec["buckets"]])
                               / 1e9)
            out.append(row)
        return np.array(out)

    def summary(self) -> dict:
        """Typical values (seconds): the mean over ranks of each step, then the median over
        steps (a shared 2-core machine has the odd stalled step; the median is what a step
        usually looks like), and the two fractions the course uses."""
        ph = self.phases()

        def typical(a):
            return float(np.median(np.asarray(a).mean(axis=0)))

        step = typical(ph["step"])
        wait = typical(ph["wait"])
        busy = typical(self.comm_busy())
        return {
            "ranks": self.world_size, "mode": self.config["mode"],
            "bucket_cap_mb": self.config["bucket_cap_mb"], "nic": self.config["nic"],
            "buckets": len(self.bucket_sizes),
            "step_s": step, "forward_s": typical(ph["forward"]),
            "backward_s": typical(ph["backward"]), "wait_s": wait,
            "optimizer_s": typical(ph["optimizer"]), "local_s": typical(ph["local"]),
            "comm_busy_s": busy,
            "idle_fraction": wait / step,  # the accelerator waits for the exchange
            "hidden_fraction": max(0.0, 1.0 - wait / busy) if busy > 0 else 0.0,
            "samples_per_s_per_rank": self.config["batch"] * self.config["accumulate"] / step,
        }

    def issue_lag(self) -> float:
        """Typical time (s) by which the last rank to issue a step's last bucket trailed the
        others: per synced step, the mean over ranks of (latest issue of that bucket over
        all ranks - this rank's issue), then the median over steps. A collective's message
        chains need every rank's data, so a rank that issues early waits about this long on
        top of the network (the backend replays each collective from every rank's entry)."""
        issues: dict[int, list[list[int]]] = {}
        for r in self.ranks:
            for rec in r["records"]:
                if rec["sync"] and rec["buckets"]:
                    last = max(rec["buckets"], key=lambda b: b["issue"])
                    issues.setdefault(rec["step"], []).append(last["issue"])
        lags = [np.mean(max(v) - np.array(v)) / 1e9 for v in issues.values()
                if len(v) == self.world_size]
        return float(np.median(lags)) if lags else 0.0

    def hidden_fractions(self) -> np.ndarray:
        """Per synced step: the share of the communication that overlap hid, 1 - wait / busy,
        each taken as the mean over ranks (the per-step values behind `summary`'s
        hidden_fraction, which uses the median step)."""
        wait = self.phases()["wait"].mean(axis=0)
        busy = self.comm_busy().mean(axis=0)
        return np.where(busy > 0, np.clip(1.0 - wait / np.where(busy > 0, busy, 1.0), 0.0, 1.0),
                        0.0)

    def typical_steps(self, count: int = 2) -> tuple[int, ...]:
        """`count` consecutive steps whose total duration is closest to the median's: the
        ones to draw as an example."""
        per_step = self.phases()["step"].mean(axis=0)
        n = len(per_step)
        if n <= count:
            return tuple(range(n))
        sums = np.convolve(per_step, np.ones(count), mode="valid")
        first = int(np.argmin(np.abs(sums - count * np.median(per_step))))
        return tuple(range(first, first + count))

    def plot_timeline(self, ax=None, steps=(0, 1), title: str | None = None):
        """A Gantt chart: per rank, a compute lane (phases) and a communication lane: each
        bucket's all_reduce in flight (solid, one row) and, below it, how many buckets are
        queued behind the one in flight (a step line, its peak written; the stream is FIFO)."""
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        if ax is None:
            _, ax = plt.subplots(figsize=(10, 0.9 + 0.75 * self.world_size))
        yticks, ylabels = [], []
        for r in self.ranks:
            base = 2 * (self.world_size - 1 - r["rank"])
            for rec in r["records"]:
                if rec["step"] not in steps:
                    continue
                if not rec["sync"]:
                    seg = [("local", rec["t0"], rec["optimizer_end"])]
                else:
                    seg = [("forward", rec["t0"], rec["forward_end"]),
                           ("backward", rec["forward_end"], rec["backward_end"]),
                           ("wait", rec["backward_end"], rec["backward_return"]),
                           ("optimizer", rec["backward_return"], rec["optimizer_end"])]
                for name, a, b in seg:
                    ax.barh(base + 1, (b - a) / 1e6, left=self._s(a) * 1e3, height=0.8,
                            color=PHASE_COLORS[name], edgecolor="none")
                # The stream is FIFO: a bucket is on the wire only once the one before it is
                # done; before that it is queued. In flight (solid, one row: FIFO transfers
                # never overlap) and queued (a step line below: how many buckets wait, whose
                # intervals do overlap) are drawn apart, so queueing does not read as transfer.
                prev_done, queued = None, []
                for b in sorted(rec["buckets"], key=lambda b: b["issue"]):
                    start = b["issue"] if prev_done is None else max(b["issue"], prev_done)
                    if start > b["issue"]:
                        queued.append((b["issue"], start))
                    ax.barh(base + 0.55, (b["done"] - start) / 1e6, left=self._s(start) * 1e3,
                            height=0.3, color=PHASE_COLORS["comm"], edgecolor="black",
                            linewidth=0.4)
                    prev_done = b["done"] if prev_done is None else max(prev_done, b["done"])
                if queued:
                    edges = sorted({x for iv in queued for x in iv})
                    depth = [sum(a <= e < z for a, z in queued) for e in edges]
                    top = max(depth)
                    xs = [self._s(e) * 1e3 for e in edges]
                    # a step line (0 at the lane's foot, the peak at its top) with the peak
                    # depth written to its left, so the count can be read off the chart
                    ax.step(xs, [base + 0.05 + 0.3 * d / top for d in depth], where="post",
                            color=PHASE_COLORS["comm"], linewidth=1.3)
                    ax.text(xs[0] - 1, base + 0.2, f"max {top}", fontsize=7, va="center",
                            ha="right", color="black")
            yticks += [base + 1, base + 0.45]
            ylabels += [f"rank {r['rank']} compute", f"rank {r['rank']} all_reduce"]
        ax.set_yticks(yticks, ylabels)
        ax.set_xlabel("time since the first measured step began (ms)")
        names = PHASES + (("local",) if self.config.get("accumulate", 1) > 1 else ())
        handles = [Patch(color=PHASE_COLORS[k], label=k) for k in names]
        handles.append(Patch(color=PHASE_COLORS["comm"], label="bucket all_reduce in flight"))
        handles.append(Line2D([], [], color=PHASE_COLORS["comm"], linewidth=1.3,
                              label="buckets queued (line height; 'max k': its peak)"))
        ax.legend(handles=handles, ncols=len(handles), loc="upper center",
                  bbox_to_anchor=(0.5, -0.25),
                  frameon=False)
        ax.set_title(title or f"DDP, {self.world_size} ranks, nic '{self.config['nic']}', "
                     f"mode {self.config['mode']}")
        return ax


def _union_length(intervals) -> int:
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


# The emulated accelerator: backward about twice forward per layer (it computes the gradients
# of both the inputs and the weights), as notebook 00 measures on a real MLP.
DEFAULTS = dict(width=256, depth=8, batch=32, forward_s=0.002, backward_s=0.004,
                bucket_cap_mb=25.0, mode="overlap", steps=6, warmup=2, accumulate=1, seed=0,
                ranks=None)


def run_ddp(cluster: Cluster, **options) -> DDPRun:
    """Run DDP steps on an open cluster; options override DEFAULTS (see the module doc).

    width/depth: the MLP (depth x width^2 parameters); forward_s/backward_s: the accelerator's
    time per layer; bucket_cap_mb: DDP's bucket cap; mode: overlap | deferred | fused;
    steps (measured) after warmup steps (DDP rebuilds its buckets after the first);
    accumulate: micro-batches per exchange; ranks: run on the first `ranks` ranks only (a
    subgroup: one 8-rank cluster then also stands for 2- and 4-node clusters with the same
    NICs; the others sit the run out).
    """
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown option(s) {sorted(unknown)}; choose from {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **options}
    if cfg["mode"] not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {cfg['mode']!r}")
    if cfg["accumulate"] < 1 or cfg["steps"] < 1:
        raise ValueError("accumulate and steps must be >= 1")
    ranks = [r for r in cluster.run(_ddp_worker, cfg) if r is not None]
    cfg["nic"] = str(cluster.nic)
    cfg["nodes"] = cluster.topology.nodes
    cfg["procs_per_node"] = cluster.topology.procs_per_node
    return DDPRun(config=cfg, ranks=ranks)


def ddp_run(nodes: int = 4, nic: str | None = "delay 2ms", *, procs_per_node: int = 1,
            intra: str | None = None, algorithm: str = "ring", seed: int = 0,
            timeout: float = 60, **options) -> DDPRun:
    """Start a cluster, run DDP once (see run_ddp), stop the cluster."""
    preload_ddp()
    with Cluster(nodes=nodes, procs_per_node=procs_per_node, nic=nic, intra=intra, seed=seed,
                 timeout=timeout, algorithm=algorithm) as cl:
        return run_ddp(cl, **options)


# --- the experiments of notebook 03 -----------------------------------------------------------


def ring_latency_rounds(p: int) -> int:
    """Rounds of a ring all-reduce: each one crosses one NIC, so at least one delay each."""
    return models.ring_allreduce_steps(p)


def beta_of(nic: str | Netem) -> float:
    """Seconds per payload byte on the wire of this NIC (0 without a rate), headers included."""
    spec = Netem.parse(nic) if isinstance(nic, str) else nic
    return wire_beta(spec.rate_bps)


def predicted_comm(p: int, bucket_sizes, nic: str | Netem) -> float:
    """alpha-beta prediction of the communication stream's busy time in one step: the sum of
    ring all-reduces of every bucket (alpha = the configured delay, beta from the rate)."""
    spec = Netem.parse(nic) if isinstance(nic, str) else nic
    return sum(models.ring_allreduce(p, n, spec.delay_s, beta_of(spec)) for n in bucket_sizes)


# With one bucket, "overlap" and "deferred" are the same thing (the only bucket is ready at
# the end of backward), so the default grid leaves (25, "deferred") out.
BUCKET_CONFIGS = ((0.25, "overlap"), (0.25, "deferred"), (25.0, "overlap"), (25.0, "fused"))


def buckets_and_overlap(nodes: int = 4, nic: str = "delay 2ms", configs=BUCKET_CONFIGS, *,
                        cluster: Cluster | None = None, **options) -> dict:
    """Every (bucket_cap_mb, mode) of `configs` on one cluster (`cluster`, if given, else a
    new one of `nodes` with `nic`): {(cap, mode): summary row}, each with its DDPRun."""
    rows = {}
    with use_or_open(cluster, ddp=True, nodes=nodes, nic=nic, timeout=120) as cl:
        for cap, mode in configs:
            run = run_ddp(cl, bucket_cap_mb=cap, mode=mode, **options)
            rows[(cap, mode)] = {**run.summary(), "run": run}
    return rows


def latency_bandwidth_sweep(nodes: int = 4, delays_ms=(0.5, 2, 4), rates_mbit=(250, 500, 1000),
                            fixed_rate_mbit: float = 1000, fixed_delay_ms: float = 0.5,
                            **options) -> dict:
    """Sweep the delay at a fixed rate, then the rate at a fixed delay; measure the DDP step.

    Returns {"delay": rows, "rate": rows}; each row has the configuration, the measured step,
    wait and communication-busy times, and the alpha-beta prediction of the busy time with its
    latency and bandwidth parts.
    """
    options = {"bucket_cap_mb": 25.0, "mode": "overlap", **options}
    out: dict[str, list] = {"delay": [], "rate": []}
    plan = [("delay", d, fixed_rate_mbit) for d in delays_ms]
    plan += [("rate", fixed_delay_ms, r) for r in rates_mbit]
    measured: dict[tuple, DDPRun] = {}  # one cluster per distinct network, shared by sweeps
    preload_ddp()
    for _, delay_ms, rate_mbit in plan:
        if (delay_ms, rate_mbit) in measured:
            continue
        nic = f"delay {delay_ms:g}ms rate {rate_mbit:g}mbit"
        with Cluster(nodes=nodes, nic=nic, timeout=120) as cl:
            measured[(delay_ms, rate_mbit)] = run_ddp(cl, **options)
    for kind, delay_ms, rate_mbit in plan:
        run = measured[(delay_ms, rate_mbit)]
        nic = f"delay {delay_ms:g}ms rate {rate_mbit:g}mbit"
        sizes = run.bucket_sizes
        p = run.world_size
        latency = sum(models.ring_allreduce(p, n, delay_ms / 1e3, 0.0) for n in sizes)
        bandwidth = sum(models.ring_allreduce(p, n, 0.0, beta_of(nic)) for n in sizes)
        out[kind].append({**run.summary(), "delay_ms": delay_ms, "rate_mbit": rate_mbit,
                          "predicted_latency_s": latency, "predicted_bandwidth_s": bandwidth,
                          "predicted_comm_s": latency + bandwidth, "bucket_sizes": sizes,
                          "steps": run.config["steps"]})
    return out


def idle_vs_nodes(node_counts=(2, 4, 8), nic: str = "delay 2ms", *,
                  cluster: Cluster | None = None, native: bool = True,
                  **options) -> list[dict]:
    """The share of the step the accelerator waits for the exchange, measured on 2, 4, 8
    ranks, next to the simulator's prediction for the same step (the measured compute time,
    optimizer time and bucket sizes fed to `sim.simulate_training`). One cluster of
    max(node_counts) nodes (or `cluster`, left open) runs every count as a subgroup.

    With `native`, the same DDP runs again on plain Gloo (no emulated network) on the same
    counts: `native_wait_s` is this machine's own cost of the exchange, the floor below
    which the emulator cannot go (it completes an operation at max(native, network))."""
    rows = []
    runs = {}
    with use_or_open(cluster, min_ranks=max(node_counts), ddp=True, nodes=max(node_counts),
                     nic=nic, timeout=120) as cl:
        for n in node_counts:
            runs[n] = run_ddp(cl, ranks=n, **options)
    natives = {}
    if native:
        with Cluster(nodes=max(node_counts), nic=None, timeout=120) as plain:
            for n in node_counts:
                natives[n] = run_ddp(plain, ranks=n, **options).summary()["wait_s"]
    # imported after the runs: numba's compiled code need not be copied into every rank
    from ..sim import simulate_training

    for n, run in runs.items():
        s = run.summary()
        sizes = run.bucket_sizes
        sim = simulate_training(n, nic=nic, model_bytes=run.param_bytes,
                                bucket_bytes=max(sizes), first_bucket_bytes=sizes[0],
                                compute_s=s["forward_s"] + s["backward_s"],
                                optimizer_s=s["optimizer_s"], overlap=run.config["mode"] ==
                                "overlap", steps=10)
        rows.append({**s, "sim_step_s": sim.mean_step, "sim_wait_s": sim.exposed_comm,
                     "native_wait_s": natives.get(n, float("nan")),
                     "sim_idle_fraction": sim.exposed_comm / sim.mean_step, "run": run})
    return rows


def check_timeline(run: DDPRun, delay_s: float) -> dict:
    """Consistency checks of a measured timeline (all in seconds; the notebook and tests
    assert on them).

    phase_sum_error: largest |step - (forward + backward + wait + optimizer)|.
    latency_slack: smallest, over collectives, of (last completion - last issue) minus
      2(p-1) x delay: a ring all-reduce cannot complete before its 2(p-1) rounds, each of
      which crosses one NIC, have passed since the last rank issued it (>= 0 expected).
    fifo: every rank's buckets complete in the order they were issued.
    gap: largest time between one step's end and the next step's start on a rank (time
      the timeline does not account for).
    """
    ph = run.phases()
    total = ph["forward"] + ph["backward"] + ph["wait"] + ph["optimizer"] + ph["local"]
    phase_err = float(np.max(np.abs(ph["step"] - total)))
    by_coll: dict = {}
    fifo = True
    gaps = []
    for r in run.ranks:
        prev_end = None
        for rec in r["records"]:
            done = [b["done"] for b in sorted(rec["buckets"], key=lambda b: b["issue"])]
            fifo &= done == sorted(done)
            for b in rec["buckets"]:
                by_coll.setdefault((rec["step"], b["index"]), []).append(b)
            if prev_end is not None:
                gaps.append((rec["t0"] - prev_end) / 1e9)
            prev_end = rec["optimizer_end"]
    rounds = ring_latency_rounds(run.world_size)
    slack = min((max(b["done"] for b in bs) - max(b["issue"] for b in bs)) / 1e9
                - rounds * delay_s for bs in by_coll.values())
    return {"phase_sum_error": phase_err, "latency_slack": slack, "fifo": bool(fifo),
            "gap": max(gaps) if gaps else 0.0, "collectives": len(by_coll), "rounds": rounds}


def crossover_bytes(p: int, delay_s: float, rate_bps: float) -> float:
    """Bucket size at which a p-rank ring's latency and bandwidth terms are equal:
    2(p-1) alpha = 2 (p-1)/p n beta  =>  n = p alpha / beta = p n*, where n* = alpha / beta is
    notebook 01's crossover of a single message (each ring round sends a chunk of n / p)."""
    beta = 8 / rate_bps
    return p * delay_s / beta if beta else math.inf
