"""Jitter at scale: why throughput collapses as nodes and jitter grow.

Real runs go as far as this machine allows (1, 2, 4, 8 ranks, each its own node); the
simulator (`clusterlab.sim`, the same link model and schedules as the backend) carries the
same configuration to 1024 nodes, and the notebook draws both on the same axes.

The synthetic training step used here is the one of the interview question:

    for step in range(steps):
        sleep(compute)           # the accelerator computes (optionally with jitter)
        all_reduce(gradients)    # a modest model's gradients cross the emulated network

Compute is a sleep, so 8 ranks on 2 cores compute "in parallel" like 8 accelerators would;
the all_reduce is real torch.distributed over Gloo, held by the netem backend until the
emulated network has delivered it. A step's duration is measured as the simulator measures
it: from the moment the slowest rank finished the previous step to the moment the slowest
rank finished this one. (With `period_s`, every rank starts step k at the same instant of the
shared clock instead, and the step is measured from there: what order statistics assume.)

One cluster of 8 ranks serves 1, 2, 4 and 8 nodes: a run on its first n ranks (a subgroup,
`ranks=n`) sees the same NICs as an n-node cluster, and a cluster start is the expensive part
of an experiment on this machine. At most one 8-rank cluster is open at a time (~1 GB with the
kernel).

Compute jitter is relative and uniform, as `sim.compute_times(..., "uniform")` draws it:
compute x (1 + jitter x U(-1, 1)). Rare slow events (`slow_p`, `slow_s`): with probability
slow_p a rank's step takes slow_s longer (a page fault, a GC pause, a noisy neighbour).
"""

from __future__ import annotations

import time

import numpy as np

from .. import clock, models
from ..cluster import Cluster
from ..schedule import Collective, Fabric, play
from ..sim import scaling_curve, simulate_training
from ..topology import Topology
from . import ddp

SIM_NODES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


# --- the synthetic step on every rank ---------------------------------------------------------


def _sync_steps(cfg: dict) -> dict:
    import torch
    import torch.distributed as dist

    group, _ = ddp._subgroup(cfg["ranks"])
    if group is False:  # not a member of this run's subgroup
        return None
    rank = dist.get_rank()
    rng = np.random.default_rng([cfg["seed"], rank])
    x = torch.ones(max(1, cfg["nbytes"] // 4))
    total = cfg["warmup"] + cfg["steps"]
    # Draw everything first: the same seed gives the same compute times with or without
    # the network's jitter, so differences between runs are the network's doing.
    compute = cfg["compute_s"] * (1 + cfg["jitter"] * rng.uniform(-1, 1, total))
    slow = rng.random(total) < cfg["slow_p"]
    compute = compute + np.where(slow, cfg["slow_s"], 0.0)
    dist.all_reduce(x, group=group)
    period = int(cfg["period_s"] * 1e9)
    if period:  # every rank starts step k at base + k x period on the shared clock
        now = torch.tensor([time.monotonic_ns()], dtype=torch.int64)
        dist.all_reduce(now, op=dist.ReduceOp.MAX, group=group)
        base = int(now) + 50_000_000
    else:
        dist.barrier(group=group)
    ends = np.zeros(total, dtype=np.int64)
    comm = np.zeros(total, dtype=np.int64)
    starts = np.zeros(total, dtype=np.int64)
    for k in range(total):
        if period:
            t0 = base + k * period
            clock.sleep_until(t0)
        else:
            t0 = time.monotonic_ns()
        starts[k] = t0
        clock.sleep_until(t0 + int(compute[k] * 1e9))
        t1 = time.monotonic_ns()
        if (k + 1) % cfg["sync_every"] == 0:
            dist.all_reduce(x, group=group)
        ends[k] = time.monotonic_ns()
        comm[k] = ends[k] - t1
    ddp._release(group)
    w = cfg["warmup"]
    return {"ends": ends[w:], "compute": compute[w:], "slow": slow[w:], "comm": comm[w:],
            "starts": starts[w:]}


class StepRun:
    """Per-step, per-rank times of a synthetic run (seconds), measured on real ranks."""

    def __init__(self, config: dict, ranks: list[dict]) -> None:
        self.config = config
        self.ends = np.stack([r["ends"] for r in ranks], axis=1) / 1e9  # (steps, ranks)
        self.compute = np.stack([r["compute"] for r in ranks], axis=1)
        self.slow = np.stack([r["slow"] for r in ranks], axis=1)
        self.comm = np.stack([r["comm"] for r in ranks], axis=1) / 1e9
        self.starts = np.stack([r["starts"] for r in ranks], axis=1) / 1e9
        self.scheduled = bool(config.get("period_s"))

    @property
    def nodes(self) -> int:
        return self.ends.shape[1]

    @property
    def step_times(self) -> np.ndarray:
        """Duration of each synchronous step, as `SimResult.step_times` defines it: from the
        slowest rank's previous end to its end (scheduled runs: from the common start)."""
        last = self.ends.max(axis=1)
        if self.scheduled:
            return last - self.starts[:, 0]
        return np.diff(last)

    @property
    def mean_step(self) -> float:
        return float(self.step_times.mean())

    @property
    def arrivals(self) -> np.ndarray:
        """When each rank reached the step's all_reduce (its compute done), (steps, ranks)."""
        return self.ends - self.comm

    @property
    def wait_for_slowest(self) -> np.ndarray:
        """Per step: from the previous step's end (slowest rank) to the last rank's arrival
        at this step's all_reduce: the compute part of the step, which the whole cluster
        waits for (a real clock measurement, without the network's own time)."""
        if self.scheduled:
            return self.arrivals.max(axis=1) - self.starts[:, 0]
        return self.arrivals.max(axis=1)[1:] - self.ends.max(axis=1)[:-1]

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.step_times, q))

    @property
    def throughput_per_rank(self) -> float:
        """Samples per second per rank (batch per rank / mean step)."""
        return self.config["batch"] / self.mean_step

    def summary(self) -> dict:
        st = self.step_times
        return {"nodes": self.nodes, "nic": self.config["nic"], "mean_step_s": float(st.mean()),
                "p50_s": self.percentile(50), "p99_s": self.percentile(99),
                "std_s": float(st.std()), "compute_s": float(self.compute.mean()),
                "throughput_per_rank": self.throughput_per_rank}


STEP_DEFAULTS = dict(compute_s=0.03, jitter=0.0, slow_p=0.0, slow_s=0.0, nbytes=1 << 20,
                     steps=30, warmup=3, sync_every=1, batch=32, seed=0, ranks=None,
                     period_s=0.0)


def run_steps(cluster: Cluster, **options) -> StepRun:
    """Run the synthetic step on an open cluster (options override STEP_DEFAULTS); with
    `ranks=n`, on its first n ranks only (each its own node: the same network as an n-node
    cluster with these NICs). With `period_s`, step k starts on every rank at the same instant
    of the shared clock (base + k x period_s) instead of when the rank finished step k-1: the
    step is then measured from that common start (an ideal synchronous start, free of this
    machine's own stagger in waking the ranks)."""
    unknown = set(options) - set(STEP_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown option(s) {sorted(unknown)}; choose from "
                        f"{sorted(STEP_DEFAULTS)}")
    cfg = {**STEP_DEFAULTS, **options}
    if cfg["steps"] < 2:
        raise ValueError("steps must be >= 2 (a step time is a difference of two ends)")
    ranks = [r for r in cluster.run(_sync_steps, cfg) if r is not None]
    cfg["nic"] = str(cluster.nic)
    return StepRun(cfg, ranks)


def _cluster(nodes: int, nic, cluster: Cluster | None = None):
    """`cluster` if given (left open), else a new cluster of `nodes` with `nic`."""
    return ddp._open(cluster, nodes, nic)


def simulate(nodes: int, nic: str, *, compute_s: float, nbytes: int, jitter: float = 0.0,
             steps: int = 40, seed: int = 0, **kwargs):
    """The synthetic step in the simulator: compute, then one all_reduce (no overlap)."""
    return simulate_training(nodes, nic=nic, model_bytes=nbytes, bucket_bytes=max(nbytes, 1),
                             first_bucket_bytes=max(nbytes, 1), compute_s=compute_s,
                             compute_jitter=jitter,
                             compute_distribution="uniform" if jitter else "none",
                             overlap=False, steps=steps, seed=seed, **kwargs)


# --- 1. throughput collapse -------------------------------------------------------------------


def throughput_collapse(nics=("delay 2ms", "delay 2ms 4ms distribution pareto"),
                        real_nodes=(1, 2, 4, 8), sim_nodes=SIM_NODES, *, compute_s: float = 0.05,
                        nbytes: int = 1 << 20, steps: int = 15, sim_steps: int = 20) -> dict:
    """Real throughput per rank and scaling efficiency at 1..8 nodes for each NIC, and the
    simulated curves to 1024 nodes. Efficiency = throughput per rank / that of one node."""
    out: dict = {"config": {"compute_s": compute_s, "nbytes": nbytes, "nics": list(nics)},
                 "real": {}, "sim": {}}
    single = None
    for nic in nics:
        rows = []
        # one cluster per network; n ranks of it stand for an n-node cluster (a subgroup)
        with _cluster(max(real_nodes), nic) as cl:
            for n in real_nodes:
                if n == 1 and single is not None:  # one node has no network: measured once
                    rows.append(single)
                    continue
                run = run_steps(cl, ranks=n, compute_s=compute_s, nbytes=nbytes, steps=steps)
                row = {**run.summary(), "run": run}
                if n == 1:
                    single = row
                rows.append(row)
        base = rows[0]["throughput_per_rank"] if real_nodes[0] == 1 else None
        for row in rows:
            row["efficiency"] = row["throughput_per_rank"] / base if base else float("nan")
        out["real"][nic] = rows
        curve = scaling_curve(list(sim_nodes), nic=nic, model_bytes=nbytes,
                              bucket_bytes=nbytes, first_bucket_bytes=nbytes,
                              compute_s=compute_s, overlap=False, steps=sim_steps)
        for row in curve:
            row["throughput_per_rank"] = row["throughput"] / row["ranks"]
        out["sim"][nic] = curve
    return out


# --- 2. order statistics of compute jitter ----------------------------------------------------


def jitter_growth(node_counts=(2, 4, 8), *, nic: str = "delay 200us", compute_s: float = 0.02,
                  jitter: float = 1.0, steps: int = 30, nbytes: int = 4096,
                  period_s: float | None = None, cluster: Cluster | None = None) -> list[dict]:
    """Extra step time due to compute jitter against J x E[max of N uniforms] (J = compute_s x
    jitter), measured twice: at the synchronisation point (when the last rank reached the
    all-reduce, beyond the jitter-free compute time), and end to end (the mean step with
    jitter minus the same run without); also the median steps against the median of the max.

    Steps start on a common schedule (`period_s`, default compute x (1 + jitter) + 40 ms), so
    that every rank starts computing at the same instant, as E[max] assumes. (In a free-running
    loop this machine's own stagger in waking 8 processes on 2 cores is already a jitter, and
    the max of sums is less than the sum of the maxes: added jitter then costs less.) One
    cluster of max(node_counts) nodes (or `cluster`, left open) runs every N as a subgroup.
    """
    rows = []
    j_s = compute_s * jitter
    period = compute_s * (1 + jitter) + 0.04 if period_s is None else period_s
    runs = {}
    with _cluster(max(node_counts), nic, cluster) as cl:
        for n in node_counts:
            runs[n] = tuple(run_steps(cl, ranks=n, compute_s=compute_s, jitter=j, steps=steps,
                                      nbytes=nbytes, period_s=period, warmup=1)
                            for j in (0.0, jitter))
    for n, (calm, rough) in runs.items():
        # the slowest rank's compute in each step, from the draws: what E[max] is about
        drawn_max = float(rough.compute.max(axis=1).mean() - compute_s)
        # When the last rank reached the all-reduce, after the common start, beyond the
        # jitter-free compute time: what the synchronous step waits for because of jitter.
        arrival_extra = float(rough.wait_for_slowest.mean() - compute_s)
        # The same in the run without jitter: this machine's own lateness in waking N ranks
        # at the same instant (2 cores: the last one waits for a core).
        calm_lateness = float(calm.wait_for_slowest.mean() - compute_s)
        rows.append({"nodes": n, "calm_s": calm.mean_step, "jittery_s": rough.mean_step,
                     "extra_s": rough.mean_step - calm.mean_step, "drawn_max_s": drawn_max,
                     "arrival_extra_s": arrival_extra, "calm_lateness_s": calm_lateness,
                     "predicted_s": j_s * models.expected_max(n, "uniform"),
                     # medians: robust to the load spikes of a shared machine
                     "median_extra_s": rough.percentile(50) - calm.percentile(50),
                     "predicted_median_s": j_s * models.max_quantile(n, 0.5, "uniform"),
                     "calm": calm, "jittery": rough})
    return rows


# --- 3. tail at scale -------------------------------------------------------------------------


def tail_at_scale(node_counts=(2, 4, 8), *, nic: str = "delay 200us", compute_s: float = 0.015,
                  slow_p: float = 0.1, slow_s: float = 0.05, steps: int = 50,
                  nbytes: int = 4096, cluster: Cluster | None = None) -> list[dict]:
    """Rare slow events: each rank is slow (+slow_s) with probability slow_p in a step.
    Measured share of slow synchronous steps against 1 - (1 - slow_p)^N.

    A step counts as slow when it took more than slow_s / 2 longer than the fast steps (the
    5th percentile of the run); `agree` is the share of steps where that measured verdict
    matches the draws (some rank drew a slow event in that step). One cluster of
    max(node_counts) nodes (or `cluster`, left open) runs every N as a subgroup.
    """
    rows = []
    runs = {}
    with _cluster(max(node_counts), nic, cluster) as cl:
        for n in node_counts:
            runs[n] = run_steps(cl, ranks=n, compute_s=compute_s, slow_p=slow_p,
                                slow_s=slow_s, steps=steps + 1, nbytes=nbytes)
    for n, run in runs.items():
        st = run.step_times  # step k+1 of the run (the first end is the reference)
        hit = run.slow[1:].any(axis=1)  # some rank drew a slow event in that step
        slow_measured = st > np.percentile(st, 5) + slow_s / 2
        rows.append({"nodes": n, "steps": len(st), "slow_share": float(slow_measured.mean()),
                     "drawn_share": float(hit.mean()),
                     "agree": float((slow_measured == hit).mean()),
                     "predicted": models.tail_at_scale(slow_p, n), "p50_s": run.percentile(50),
                     "p99_s": run.percentile(99), "mean_s": run.mean_step, "run": run})
    return rows


# --- 4. iteration-time predictability --------------------------------------------------------


def predictability(nodes: int = 4, nics=("delay 2ms", "delay 2ms 10ms distribution pareto"),
                   *, compute_s: float = 0.02, steps: int = 40, nbytes: int = 1 << 16,
                   sim_nodes=SIM_NODES, sim_steps: int = 60) -> dict:
    """Step-time distributions with and without network jitter on `nodes` real ranks, and
    the simulator's p50/p99 for the same configurations up to 1024 nodes."""
    out: dict = {"real": {}, "sim": {}}
    for nic in nics:
        with _cluster(nodes, nic) as cl:
            run = run_steps(cl, compute_s=compute_s, steps=steps, nbytes=nbytes)
        st = run.step_times
        out["real"][nic] = {**run.summary(), "step_times": st,
                            "cv": float(st.std() / st.mean())}
        out["sim"][nic] = [simulate(n, nic, compute_s=compute_s, nbytes=nbytes,
                                    steps=sim_steps).summary() for n in sim_nodes]
    return out


# --- 5. mitigations ---------------------------------------------------------------------------


def emulated_allreduce(nodes: int, procs_per_node: int, nic, intra, algorithm: str,
                       nbytes: int, seed: int = 0) -> float:
    """The network's own time for one all-reduce entered by every rank at once (seconds): the
    schedule the backend replays, without this machine's costs."""
    topo = Topology.build(nodes, procs_per_node, nic, intra)
    done = play(Fabric(topo), Collective("allreduce", nbytes, algorithm=algorithm),
                np.zeros(topo.world_size, dtype=np.int64), np.random.default_rng(seed))
    return float(done.max()) / 1e9


def flat_vs_hierarchical(nodes: int = 2, procs_per_node: int = 2, nic: str = "delay 20ms",
                         intra: str | None = "delay 50us", *, compute_s: float = 0.02,
                         nbytes: int = 1 << 20, steps: int = 12) -> dict:
    """The synthetic step on nodes x procs_per_node ranks, flat ring against hierarchical
    all-reduce (one cluster each): {algorithm: summary + measured and emulated all-reduce}."""
    out = {}
    for algorithm in ("ring", "hierarchical"):
        with Cluster(nodes=nodes, procs_per_node=procs_per_node, nic=nic, intra=intra,
                     algorithm=algorithm, timeout=120) as cl:
            run = run_steps(cl, compute_s=compute_s, nbytes=nbytes, steps=steps)
        out[algorithm] = {**run.summary(), "comm_s": float(run.comm.max(axis=1).mean()),
                          "emulated_s": emulated_allreduce(nodes, procs_per_node, nic, intra,
                                                           algorithm, nbytes)}
    return out


def mitigations(*, nodes: int = 4, nic: str = "delay 2ms", ddp_options: dict | None = None,
                hier_nodes: int = 2, hier_ppn: int = 2, hier_nic: str = "delay 20ms",
                hier_intra: str | None = "delay 50us", accumulate: int = 4,
                sim_nodes=SIM_NODES, sim_steps: int = 5) -> dict:
    """Each mitigation measured on the real cluster, then simulated to 1024 nodes.

    Real (DDP through the emulated network, `experiments.ddp`): baseline = small buckets,
    no overlap (every bucket issued after backward); overlap; bigger buckets (+ overlap);
    fewer syncs (gradient accumulation over `accumulate` micro-batches, no_sync between).
    Real (synthetic step): flat ring vs hierarchical all-reduce on hier_nodes x hier_ppn
    ranks with fast intra-node links.
    Simulated: the same DDP step (the measured compute time and bucket sizes) to 1024 nodes
    for each mitigation; hierarchical with 8 ranks per node.
    """
    opts = {"bucket_cap_mb": 0.25, **(ddp_options or {})}
    small = opts["bucket_cap_mb"]
    plan = {
        "baseline": dict(mode="deferred"),
        "overlap": dict(mode="overlap"),
        "bigger buckets": dict(mode="overlap", bucket_cap_mb=25.0),
        "fewer syncs": dict(mode="overlap", bucket_cap_mb=25.0, accumulate=accumulate),
    }
    real: dict = {}
    ddp.preload()
    with Cluster(nodes=nodes, nic=nic, timeout=120) as cl:
        for name, extra in plan.items():
            run = ddp.run_ddp(cl, **{"steps": 4, **opts, **extra})
            real[name] = {**run.summary(), "bucket_sizes": run.bucket_sizes,
                          "param_bytes": run.param_bytes}
    hier = flat_vs_hierarchical(hier_nodes, hier_ppn, hier_nic, hier_intra)

    # The simulator, fed with what was measured: compute per step, model and bucket sizes.
    base = real["baseline"]
    compute_s = base["forward_s"] + base["backward_s"]
    model_bytes = base["param_bytes"]
    common = dict(nic=nic, model_bytes=model_bytes, compute_s=compute_s, steps=sim_steps,
                  first_bucket_bytes=int(small * 2**20))
    sims = {
        "baseline": dict(bucket_bytes=small * 2**20, overlap=False),
        "overlap": dict(bucket_bytes=small * 2**20, overlap=True),
        "bigger buckets": dict(bucket_bytes=25 * 2**20, first_bucket_bytes=25 * 2**20,
                               overlap=True),
    }
    sim: dict = {}
    for name, extra in sims.items():
        sim[name] = scaling_curve(list(sim_nodes), **{**common, **extra})
    # fewer syncs: k-1 local micro-steps, then one synchronised step
    # (an approximation: the local micro-steps' own jitter is not replayed)
    k = accumulate
    sim["fewer syncs"] = []
    for row in sim["bigger buckets"]:
        step_k = (k - 1) * compute_s + row["mean_step_s"]
        sim["fewer syncs"].append({"nodes": row["nodes"], "mean_step_s": step_k,
                                   "efficiency": k * compute_s / step_k})
    # hierarchical: 8 ranks per node with a fast intra link, nodes = ranks / 8
    sim["hierarchical"] = []
    for n in sim_nodes:
        if n < 8:
            continue
        res = simulate_training(n // 8, 8, intra=hier_intra, algorithm="hierarchical",
                                **{**common, **sims["bigger buckets"]})
        sim["hierarchical"].append({"nodes": n, "mean_step_s": res.mean_step,
                                    "efficiency": compute_s / res.mean_step})
    for name in sims:
        for row in sim[name]:
            row["nodes"] = row.get("ranks", row["nodes"])
    return {"real": real, "hierarchical": hier, "sim": sim,
            "config": {"nodes": nodes, "nic": nic, "compute_s": compute_s,
                       "model_bytes": model_bytes, "accumulate": k, "hier_nic": hier_nic,
                       "hier_intra": hier_intra, "hier_nodes": hier_nodes,
                       "hier_ppn": hier_ppn}}
