"""Soak bench: minutes of real DDP steps on a jittery, lossy emulated network, 4 ranks.

What must not happen in a long run, measured:

* memory growth: the RSS of every rank and of the parent, sampled over time; the slope of a
  least-squares line through the last 80 % of the samples (the first 20 % hold warm-up:
  allocator pools, lazily built link tables), in MB/min and as a share of the RSS per minute.
  Bound: < 1 % of the RSS per minute. A leak of one small object per emulated message
  (~100 B x ~1 000 messages/s per rank) would be ~6 MB/min, ~2-3 %/min of a ~250 MB rank;
  allocator noise is a few MB up and down, which over an 8-minute fit is < 0.1 %/min.
* drift of the emulated delays: the median communication time of a step (DDP's bucket
  all_reduce, issue to completion, as the netem backend completes it at its emulated time)
  in the first minute vs the last. Bound 0.95..1.05. The row also reports the bootstrap
  standard error of each median (hundreds of steps per minute give ~0.5 %), so the bound is
  several standard errors wide yet far below what a drifting clock or a growing queue gives.
* stalls: max step / median step, the count of steps > 5x the median, and why each was
  slow. "network": some rank's all_reduce took >= 3/4 of TCP's minimum retransmission
  timeout (the link model charges >= 200 ms for a loss fast retransmit cannot repair, so
  with `loss` some slow steps are the network doing its job). "host": some rank spent at
  least half of the excess outside communication (descheduled on a loaded machine, GC);
  its peers meanwhile wait inside the all_reduce. Neither: the engine stalled -- which
  includes a late real Gloo transfer or a late wake-up of a completion thread (a future
  never completes before Gloo finished), so a loaded machine shows some. Bound: 0.
  (Measured on a shared 2-core machine under a load of 5-10, 5 minutes: 955 of 4375
  steps > 5x median, 928 network, 16 host, 11 neither, all with all_reduces of 100-135 ms,
  a time an offline replay of the same collective never produces.)

Drift and stalls leave out the first chunk (warm-up: DDP builds its buckets in step 1).
Per-chunk rows report the median and 10th-percentile all_reduce time and the 1-minute load
average, so that a drift can be told from the machine getting busier.

The run is cut into chunks of ~CHUNK_S seconds, one `Cluster.run` each, so that every chunk
has its own timeout (a hang is an error within 3 x CHUNK_S + 30 s, not a frozen bench) and
the parent samples its own RSS between chunks. All ranks must run the same number of DDP
steps (else a collective would wait forever), so the parent fixes the count per chunk from
the step time it measured in the chunk before.
"""

from __future__ import annotations

import os
import time

import numpy as np

from ..cluster import Cluster, ClusterError
from ..link import RTO_MIN_NS
from . import bench, check, result, tick

NIC = "delay 2ms 1ms loss 0.5%"
RANKS = 4
MINUTES, QUICK_MINUTES = 10.0, 1.0
CHUNK_S = 10.0  # seconds of steps per Cluster.run
RSS_EVERY_S = 2.0  # a rank samples its RSS this often inside a chunk
FIT_FROM = 0.2  # the RSS slope is fitted over samples after this share of the run
SLOPE_BOUND = 0.01  # of the RSS, per minute
DRIFT_BOUND = (0.95, 1.05)
STALL_FACTOR = 5.0
BOOTSTRAP = 200

_STATE: dict = {}  # on each rank: the DDP model and optimizer, kept between chunks


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _steps(steps: int, start_ns: int) -> dict:
    """On every rank: `steps` DDP steps; per step its time and its all_reduce's time (ns)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from ..experiments.ddp import build_model

    if not _STATE:
        torch.manual_seed(0)
        model = build_model(width=128, depth=4)  # ~67 k parameters: one 260 KB bucket
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        comm: list = []

        def timed(pg, bucket):
            issued = time.monotonic_ns()

            def done(fut):
                comm.append(time.monotonic_ns() - issued)
                return fut.value()

            return default_hooks.allreduce_hook(pg, bucket).then(done)

        ddp.register_comm_hook(None, timed)
        gen = torch.Generator().manual_seed(100 + dist.get_rank())
        _STATE.update(ddp=ddp, comm=comm, opt=torch.optim.SGD(ddp.parameters(), lr=0.01),
                      x=torch.randn(32, 128, generator=gen),
                      y=torch.randint(0, 10, (32,), generator=gen))
    ddp, comm, opt, x, y = (_STATE[k] for k in ("ddp", "comm", "opt", "x", "y"))
    step_ns = np.empty(steps, dtype=np.int64)
    comm_ns = np.zeros(steps, dtype=np.int64)
    at_ns = np.empty(steps, dtype=np.int64)
    rss = [(time.monotonic_ns() - start_ns, _rss_mb())]
    for i in range(steps):
        comm.clear()
        t0 = time.monotonic_ns()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        t1 = time.monotonic_ns()
        step_ns[i], at_ns[i], comm_ns[i] = t1 - t0, t0 - start_ns, sum(comm)
        if (t1 - start_ns) / 1e9 - rss[-1][0] / 1e9 >= RSS_EVERY_S:
            rss.append((t1 - start_ns, _rss_mb()))
    rss.append((time.monotonic_ns() - start_ns, _rss_mb()))
    return {"rank": dist.get_rank(), "step_ns": step_ns, "comm_ns": comm_ns, "at_ns": at_ns,
            "rss": rss}


def _slope(samples: list[tuple[float, float]], fit_from: float = FIT_FROM) -> dict:
    """Least-squares MB/min through the samples after `fit_from` of the run."""
    t = np.array([s[0] for s in samples], dtype=float) / 60e9  # minutes
    mb = np.array([s[1] for s in samples], dtype=float)
    keep = t >= t[0] + fit_from * (t[-1] - t[0])
    if keep.sum() < 3:
        return {"slope_mb_per_min": float("nan"), "share_per_min": float("nan"),
                "samples": int(keep.sum())}
    slope = float(np.polyfit(t[keep], mb[keep], 1)[0])
    return {"slope_mb_per_min": round(slope, 3),
            "share_per_min": round(slope / float(np.median(mb[keep])), 5),
            "rss_first_mb": round(float(mb[0]), 1), "rss_last_mb": round(float(mb[-1]), 1),
            "samples": int(keep.sum())}


def _median_se(values: np.ndarray, rng: np.random.Generator) -> float:
    """Bootstrap standard error of the median, relative to the median."""
    if len(values) < 2:
        return float("nan")
    meds = np.median(rng.choice(values, size=(BOOTSTRAP, len(values))), axis=1)
    return float(np.std(meds) / np.median(values))


@bench("soak")
def soak(quick: bool = False, minutes: float | None = None) -> dict:
    minutes = float(minutes if minutes is not None else (QUICK_MINUTES if quick else MINUTES))
    if not 0 < minutes <= 24 * 60:
        raise ValueError(f"minutes must be in (0, 1440], got {minutes!r}")
    from ..experiments.common import preload_ddp

    preload_ddp()
    total_s = minutes * 60
    per_rank: list[dict] = [{"step_ns": [], "comm_ns": [], "at_ns": [], "rss": []}
                            for _ in range(RANKS)]
    parent_rss: list[tuple[int, float]] = []
    chunk_rows: list[dict] = []  # what each chunk saw, and the machine's load meanwhile
    error = None
    wall0 = time.perf_counter()
    with Cluster(nodes=RANKS, nic=NIC, seed=0, timeout=3 * CHUNK_S + 30) as cl:
        start_ns = time.monotonic_ns()
        parent_rss.append((0, _rss_mb()))
        steps = 20  # the first chunk measures the step time
        try:
            while (left := total_s - (time.monotonic_ns() - start_ns) / 1e9) > 0:
                t0 = time.perf_counter()
                outs = cl.run(_steps, steps, start_ns)
                took = time.perf_counter() - t0
                parent_rss.append((time.monotonic_ns() - start_ns, _rss_mb()))
                for out in outs:
                    mine = per_rank[out["rank"]]
                    for key in ("step_ns", "comm_ns", "at_ns"):
                        mine[key].append(out[key])
                    mine["rss"] += out["rss"]
                r0 = outs[0]
                tick()
                chunk_rows.append({
                    "kind": "chunk", "end_s": round(parent_rss[-1][0] / 1e9, 1), "steps": steps,
                    "median_step_ms": round(float(np.median(r0["step_ns"])) / 1e6, 3),
                    "median_comm_ms": round(float(np.median(r0["comm_ns"])) / 1e6, 3),
                    "p10_comm_ms": round(float(np.percentile(r0["comm_ns"], 10)) / 1e6, 3),
                    "load_1min": round(os.getloadavg()[0], 2)})
                # the mean, not the median, step: retransmission timeouts make the tail long
                steps = max(1, int(min(CHUNK_S, left) * steps / max(took, 1e-3)))
        except ClusterError as exc:  # reported as a row and a failed check, never a hang
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
    wall = time.perf_counter() - wall0
    return _report(per_rank, parent_rss, error, minutes=minutes, chunks=chunk_rows, wall_s=wall)


def _report(per_rank, parent_rss, error, *, minutes, chunks, wall_s) -> dict:
    rng = np.random.default_rng(0)
    rows: list[dict] = list(chunks)
    memory = {}
    for rank, mine in enumerate(per_rank):
        memory[f"rank {rank}"] = _slope(mine["rss"])
        rows.append({"kind": "rss", "process": f"rank {rank}",
                     "samples_s_mb": [[round(t / 1e9, 1), round(mb, 1)] for t, mb in mine["rss"]],
                     **memory[f"rank {rank}"]})
    memory["parent"] = _slope(parent_rss)
    rows.append({"kind": "rss", "process": "parent",
                 "samples_s_mb": [[round(t / 1e9, 1), round(mb, 1)] for t, mb in parent_rss],
                 **memory["parent"]})
    # The first chunk is warm-up (DDP builds its buckets in the first step): left out of
    # the drift and stall figures. Step i is the same DDP step on every rank.
    def steady(rank: dict, key: str) -> np.ndarray:
        parts = rank[key][1:] if len(rank[key]) > 1 else rank[key]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    n = min(len(steady(r, "step_ns")) for r in per_rank)
    step = np.array([steady(r, "step_ns")[:n] for r in per_rank])  # ranks x steps
    comm = np.array([steady(r, "comm_ns")[:n] for r in per_rank])
    at = steady(per_rank[0], "at_ns")[:n]
    # drift: rank 0's per-step all_reduce time, first minute vs last (or first/last 20 %
    # of a run shorter than 5 minutes, so that the windows never overlap)
    span0, span1 = (float(at[0]), float(at[-1])) if n else (0.0, 0.0)
    window = min(60e9, 0.2 * (span1 - span0))
    first, last = comm[0][at < span0 + window], comm[0][at >= span1 - window]
    drift = {"window_s": round(window / 1e9, 1), "first_n": int(len(first)),
             "last_n": int(len(last))}
    if len(first) and len(last):
        drift.update(first_median_ms=round(float(np.median(first)) / 1e6, 3),
                     last_median_ms=round(float(np.median(last)) / 1e6, 3),
                     ratio=round(float(np.median(last) / np.median(first)), 4),
                     first_se=round(_median_se(first, rng), 4),
                     last_se=round(_median_se(last, rng), 4),
                     p10_ratio=round(float(np.percentile(last, 10) / np.percentile(first, 10)),
                                     4))
    rows.append({"kind": "drift", **drift})
    stalls = {"steps": int(n)}
    if n:
        med = float(np.median(step[0]))
        slow = step[0] > STALL_FACTOR * med
        # Why a step was slow. "host": some rank spent at least half of the step's excess
        # outside communication (descheduled, GC) -- its peers then wait in the all_reduce.
        # "network": some rank's all_reduce took >= 3/4 of TCP's minimum RTO (an emulated
        # retransmission timeout). Neither: the engine stalled.
        local = step - comm
        host = slow & (local.max(axis=0) - np.median(local, axis=1).max() >= 0.5 * (step[0] - med))
        network = slow & ~host & (comm.max(axis=0) >= 0.75 * RTO_MIN_NS)
        unexplained = slow & ~host & ~network
        stalls.update(median_step_ms=round(med / 1e6, 3),
                      max_step_ms=round(float(step[0].max()) / 1e6, 3),
                      max_over_median=round(float(step[0].max()) / med, 2),
                      over_5x=int(slow.sum()), network_over_5x=int(network.sum()),
                      host_over_5x=int(host.sum()), unexplained_over_5x=int(unexplained.sum()),
                      # at s, rank 0's step ms, the largest all_reduce and local part (ms)
                      unexplained=[[round(float(at[i]) / 1e9, 1),
                                    round(float(step[0, i]) / 1e6, 1),
                                    round(float(comm[:, i].max()) / 1e6, 1),
                                    round(float(local[:, i].max()) / 1e6, 1)]
                                   for i in np.flatnonzero(unexplained)[:20]],
                      median_comm_ms=round(float(np.median(comm[0])) / 1e6, 3))
    rows.append({"kind": "stalls", **stalls})
    rows.append({"kind": "run", "nic": NIC, "ranks": RANKS, "minutes": minutes,
                 "chunks": len(chunks), "wall_s": round(wall_s, 1), "error": error,
                 "load_1min_at_end": round(os.getloadavg()[0], 2)})

    checks = [check(f"soak: {minutes:g} min of DDP steps on '{NIC}', {RANKS} ranks, "
                    "without an error", "no error", error or f"{stalls['steps']} steps",
                    error is None and stalls["steps"] > 0)]
    for name, m in memory.items():
        share = m["share_per_min"]
        checks.append(check(f"soak: RSS slope of {name} (last {100 - 100 * FIT_FROM:.0f} %)",
                            f"< {100 * SLOPE_BOUND:g} % of RSS per min",
                            f"{m['slope_mb_per_min']} MB/min = {100 * share:.3f} %/min"
                            if share == share else "too few samples",
                            share == share and share < SLOPE_BOUND))
    ratio = drift.get("ratio", float("nan"))
    checks.append(check("soak: emulated all_reduce time, last vs first window (median)",
                        f"{DRIFT_BOUND[0]}..{DRIFT_BOUND[1]}",
                        f"{ratio} ({drift['first_n']} vs {drift['last_n']} steps, bootstrap SE "
                        f"{drift.get('first_se')} / {drift.get('last_se')})",
                        DRIFT_BOUND[0] <= ratio <= DRIFT_BOUND[1]))
    if n:
        checks.append(check("soak: max step / median step", "report",
                            stalls["max_over_median"], True))
        checks.append(check(f"soak: steps > {STALL_FACTOR:g}x median not explained by an "
                            "emulated TCP timeout", "0",
                            f"{stalls['unexplained_over_5x']} (of {stalls['over_5x']} slow: "
                            f"{stalls['network_over_5x']} network, {stalls['host_over_5x']} "
                            f"host; {stalls['steps']} steps)",
                            stalls["unexplained_over_5x"] == 0))
    return result("soak", rows, checks)
