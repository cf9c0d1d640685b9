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

import contextlib
import math
import time

import numpy as np

from .. import clock, models
from ..cluster import Cluster
from ..netem import Netem
from ..schedule import Collective, QueueState, play
from ..topology import Topology
from . import ddp
from .common import first_ranks, preload_ddp, release, use_or_open

# `clusterlab.sim` is imported by the functions that simulate: it loads numba (~300 modules,
# a quarter of a second), which importing this module need not cost and the ranks of a real
# run need not carry.

SIM_NODES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


# --- the synthetic step on every rank ---------------------------------------------------------


def _sync_steps(cfg: dict) -> dict:
    import torch
    import torch.distributed as dist

    group, _ = first_ranks(cfg["ranks"])
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
    release(group)
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
    def after_last_arrival(self) -> np.ndarray:
        """Per step: from the last rank's arrival at the all_reduce to the last rank's end:
        the exchange once everyone is there (network plus this machine's Gloo)."""
        return self.ends.max(axis=1) - self.arrivals.max(axis=1)

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


def simulate(nodes: int, nic: str, *, compute_s: float, nbytes: int, jitter: float = 0.0,
             steps: int = 40, seed: int = 0, **kwargs):
    """The synthetic step in the simulator: compute, then one all_reduce (no overlap)."""
    from ..sim import simulate_training

    return simulate_training(nodes, nic=nic, model_bytes=nbytes, bucket_bytes=max(nbytes, 1),
                             first_bucket_bytes=max(nbytes, 1), compute_s=compute_s,
                             compute_jitter=jitter,
                             compute_distribution="uniform" if jitter else "none",
                             overlap=False, steps=steps, seed=seed, **kwargs)


# --- 1. throughput collapse -------------------------------------------------------------------


# A jittery network with a floor: netem adds mu + sigma x (table value), and the Pareto table's
# smallest value is -2/3, so with mu = 2 ms + 2/3 sigma no message is faster than the calm
# network's 2 ms and the jitter is a right tail only (a real fabric has a propagation and
# serialisation floor; a jitter larger than the delay would clip many messages to 0 s).
COLLAPSE_NICS = ("delay 2ms", "delay 4ms 3ms distribution pareto")
PREDICTABILITY_NICS = ("delay 2ms", "delay 8ms 9ms distribution pareto")


def throughput_collapse(nics=COLLAPSE_NICS,
                        real_nodes=(1, 2, 4, 8), sim_nodes=SIM_NODES, *, compute_s: float = 0.05,
                        nbytes: int = 1 << 20, steps: int = 15, sim_steps: int = 20,
                        alternatives: bool = True, intra: str = "delay 50us",
                        procs_per_node: int = 8) -> dict:
    """Real throughput per rank and scaling efficiency at 1..8 nodes for each NIC, and the
    simulated curves to 1024 nodes. Efficiency = throughput per rank / that of one node.

    The flat ring is the worst all-reduce for a latency-bound exchange at scale (2(N-1)
    rounds), so with `alternatives` the simulator also draws, for each NIC, a binomial tree
    (reduce then broadcast: 2 log2 N rounds, same one-rank-per-node layout) and the
    hierarchical all-reduce on `procs_per_node` ranks per node with `intra` links (a
    different layout: N ranks on N / procs_per_node nodes), in out["sim_alt"][nic]."""
    out: dict = {"config": {"compute_s": compute_s, "nbytes": nbytes, "nics": list(nics),
                            "intra": intra, "procs_per_node": procs_per_node},
                 "real": {}, "sim": {}, "sim_alt": {}}
    single = None
    for nic in nics:
        rows = []
        # one cluster per network; n ranks of it stand for an n-node cluster (a subgroup);
        # real_nodes=() simulates only
        with (Cluster(nodes=max(real_nodes), nic=nic, timeout=120) if real_nodes
              else contextlib.nullcontext()) as cl:
            for n in real_nodes:
                if n == 1 and single is not None:  # one node has no network: measured once
                    rows.append(single)
                    continue
                run = run_steps(cl, ranks=n, compute_s=compute_s, nbytes=nbytes, steps=steps)
                row = {**run.summary(), "run": run}
                if n == 1:
                    single = row
                rows.append(row)
        base = rows[0]["throughput_per_rank"] if real_nodes and real_nodes[0] == 1 else None
        for row in rows:
            row["efficiency"] = row["throughput_per_rank"] / base if base else float("nan")
        out["real"][nic] = rows
        from ..sim import scaling_curve  # after the real runs: their ranks need not carry it

        curve = scaling_curve(list(sim_nodes), nic=nic, model_bytes=nbytes,
                              bucket_bytes=nbytes, first_bucket_bytes=nbytes,
                              compute_s=compute_s, overlap=False, steps=sim_steps)
        for row in curve:
            row["throughput_per_rank"] = row["throughput"] / row["ranks"]
        out["sim"][nic] = curve
        if alternatives:
            out["sim_alt"][nic] = _alternative_curves(nic, sim_nodes, compute_s, nbytes,
                                                      sim_steps, intra, procs_per_node)
    return out


def _alternative_curves(nic, sim_nodes, compute_s, nbytes, steps, intra, ppn) -> dict:
    """Efficiency of the same step with a tree and a hierarchical all-reduce (simulated)."""
    from ..sim import simulate_training

    common = dict(nic=nic, model_bytes=nbytes, bucket_bytes=nbytes, first_bucket_bytes=nbytes,
                  compute_s=compute_s, overlap=False, steps=steps)
    single = simulate_training(1, **common).mean_step  # one node: no exchange
    curves: dict = {"tree": [], f"hierarchical ({ppn} ranks per node)": []}
    for n in sim_nodes:
        tree = simulate_training(n, algorithm="tree", **common)
        curves["tree"].append({"nodes": n, "mean_step_s": tree.mean_step,
                               "efficiency": single / tree.mean_step})
        if n >= ppn and n % ppn == 0:
            hier = simulate_training(n // ppn, ppn, intra=intra, algorithm="hierarchical",
                                     **common)
            curves[f"hierarchical ({ppn} ranks per node)"].append(
                {"nodes": n, "mean_step_s": hier.mean_step, "efficiency": single / hier.mean_step})
    return curves


# --- 2. order statistics of compute jitter ----------------------------------------------------


def jitter_growth(node_counts=(2, 4, 8), *, nic: str = "delay 200us", compute_s: float = 0.02,
                  jitter: float = 1.0, steps: int = 30, nbytes: int = 4096,
                  period_s: float | None = None, cluster: Cluster | None = None) -> list[dict]:
    """Extra step time due to compute jitter against J x E[max of N uniforms] (J = compute_s x
    jitter). The test is end to end: the mean step with jitter minus the same run without
    (`extra_s`); also the median steps against the median of the max. `arrival_extra_s` (when
    the last rank reached the all-reduce, beyond the jitter-free compute time) is taken before
    any communication: it is the drawn maximum plus how late the sleeps wake, a check of the
    draws (`drawn_max_s`), not of the synchronous step.

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
    with use_or_open(cluster, min_ranks=max(node_counts), nodes=max(node_counts), nic=nic,
                     timeout=120) as cl:
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
        # A scheduled step is (last arrival - start) + (last end - last arrival), so the end to
        # end extra = arrival_extra - calm_lateness + (jittery_after - calm_after) exactly.
        rows.append({"nodes": n, "calm_s": calm.mean_step, "jittery_s": rough.mean_step,
                     "calm_after_s": float(calm.after_last_arrival.mean()),
                     "jittery_after_s": float(rough.after_last_arrival.mean()),
                     "extra_s": rough.mean_step - calm.mean_step, "drawn_max_s": drawn_max,
                     "arrival_extra_s": arrival_extra, "calm_lateness_s": calm_lateness,
                     "predicted_s": j_s * models.expected_max(n, "uniform"),
                     # medians: robust to the load spikes of a shared machine
                     "median_extra_s": rough.percentile(50) - calm.percentile(50),
                     "predicted_median_s": j_s * models.max_quantile(n, 0.5, "uniform"),
                     "calm": calm, "jittery": rough})
    return rows


def native_allreduce(node_counts=(2, 4, 8), *, nbytes: int = 4096, compute_s: float = 0.02,
                     steps: int = 20) -> dict:
    """This machine's own cost of the synthetic step's all_reduce on plain Gloo (no emulated
    network), on a common schedule as in `jitter_growth`: {N: mean seconds from the last
    rank's arrival to the last rank's end}. The emulator completes an operation at
    max(native, network), so where this is near the emulated network's time, what is
    measured is mostly the host, not the network."""
    period = compute_s + 0.04
    out = {}
    with Cluster(nodes=max(node_counts), nic=None, timeout=120) as cl:
        for n in node_counts:
            run = run_steps(cl, ranks=n, compute_s=compute_s, steps=steps, nbytes=nbytes,
                            period_s=period, warmup=1)
            out[n] = float(run.after_last_arrival.mean())
    return out


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
    with use_or_open(cluster, min_ranks=max(node_counts), nodes=max(node_counts), nic=nic,
                     timeout=120) as cl:
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


def delay_stats(nic: str) -> dict:
    """One message's delay through `nic` by the link model's own tables (exact, no sampling):
    mean, median, the share of draws clipped to 0, the 99th percentile and the largest value
    (seconds; netem's tables are clipped, so a tail percentile can be that maximum).

    netem adds mu + sigma x (table value); a negative sum cannot be waited for, so the link
    model, like netem, clips it to 0. With a jitter larger than the delay that clipping is
    common, and the mean is not mu."""
    from ..link import delay_values_ns

    spec = Netem.parse(nic)
    if not spec.jitter_ns:
        values = np.array([max(spec.delay_ns, 0)], dtype=np.float64)
    elif spec.distribution == "uniform":  # uniform on [mu - sigma, mu + sigma), clipped
        values = np.maximum(np.linspace(spec.delay_ns - spec.jitter_ns,
                                        spec.delay_ns + spec.jitter_ns, 100_001), 0)
    else:
        values = delay_values_ns(spec).astype(float)
    return {"nic": nic, "configured_s": spec.delay_ns / 1e9, "mean_s": float(values.mean()) / 1e9,
            "min_s": float(values.min()) / 1e9,
            "p50_s": float(np.median(values)) / 1e9,
            "p99_s": float(np.percentile(values, 99)) / 1e9,
            "max_s": float(values.max()) / 1e9,
            "zero_share": float((values == 0).mean())}


def _quantiles(samples, qs=(0.5, 0.9, 0.99)) -> dict:
    """{"p50": (estimate, low, high), ...}: distribution-free 95 % intervals (models.quantile_ci);
    high is inf where the samples are too few for that tail."""
    return {f"p{round(q * 100)}": models.quantile_ci(samples, q) for q in qs}


def predictability(nodes: int = 4, nics=PREDICTABILITY_NICS,
                   *, compute_s: float = 0.02, steps: int = 60, nbytes: int = 1 << 16,
                   sim_nodes=SIM_NODES[:9], sim_steps: int = 400) -> dict:
    """Step-time distributions with and without network jitter on `nodes` real ranks, and
    the simulator's p50/p99 for the same configurations (each with its sample count and a
    95 % confidence interval: `_quantiles`). Real steps are few (each costs real time), so
    their p99 is not estimable (about their maximum); the simulator is cheap, and its
    `sim_steps` (>= 368 for a finite two-sided 95 % p99 interval) make the p99 a measurement."""
    out: dict = {"real": {}, "sim": {}, "delays": {}}
    for nic in nics:
        out["delays"][nic] = delay_stats(nic)
        with Cluster(nodes=nodes, nic=nic, timeout=120) as cl:
            run = run_steps(cl, compute_s=compute_s, steps=steps, nbytes=nbytes)
        st = run.step_times
        out["real"][nic] = {**run.summary(), "step_times": st, "steps": len(st),
                            "max_s": float(st.max()), "ci": _quantiles(st),
                            "cv": float(st.std() / st.mean())}
        rows = []
        for n in sim_nodes:
            res = simulate(n, nic, compute_s=compute_s, nbytes=nbytes, steps=sim_steps)
            rows.append({**res.summary(), "steps": len(res.step_times),
                         "ci": _quantiles(res.step_times)})
        out["sim"][nic] = rows
    return out


# --- 5. mitigations ---------------------------------------------------------------------------


def emulated_allreduce(nodes: int, procs_per_node: int, nic, intra, algorithm: str,
                       nbytes: int, seed: int = 0) -> float:
    """The network's own time for one all-reduce entered by every rank at once (seconds): the
    schedule the backend replays, without this machine's costs."""
    topo = Topology.build(nodes, procs_per_node, nic, intra)
    done = play(QueueState(topo), Collective("allreduce", nbytes, algorithm=algorithm),
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
        per_step = run.comm.max(axis=1)   # the slowest rank's all-reduce, per step
        out[algorithm] = {**run.summary(), "comm_s": float(per_step.mean()),
                          "comm_per_step_s": per_step.tolist(), "steps": len(per_step),
                          "emulated_s": emulated_allreduce(nodes, procs_per_node, nic, intra,
                                                           algorithm, nbytes)}
    return out


def simulated_plans(real: dict) -> dict:
    """The simulator's settings for each measured DDP configuration of `mitigations`: the
    overlap mode and the buckets DDP actually reduced (`bucket_sizes`, measured), so that the
    simulated step has exactly the measured run's buckets ("bigger buckets" is the measured
    big-bucket run's, which "fewer syncs" and the hierarchical curves reuse)."""
    return {
        "baseline": dict(buckets=list(real["baseline"]["bucket_sizes"]), overlap=False),
        "overlap": dict(buckets=list(real["overlap"]["bucket_sizes"]), overlap=True),
        "bigger buckets": dict(buckets=list(real["bigger buckets"]["bucket_sizes"]),
                               overlap=True),
    }


def stacked_gains(real: dict, share: float = 0.9) -> list[dict]:
    """Each measured lever against the configuration before it in the stack, with how well
    `mitigations`' few steps resolve it: `beats` is the share of (step of this, step of the
    previous) pairs in which this configuration's per-step throughput was higher (the
    Mann-Whitney U / (n m)); `resolved` when it is at least `share` (0.9 for 10 against 10
    steps: a one-sided p of about 0.001 if the steps were independent draws; a machine whose
    load drifts between the configurations, run one after the other, can still fool it)."""
    names = list(real)
    out = []
    for prev, name in zip(names, names[1:]):
        a = np.asarray(real[prev]["step_samples_per_s_per_rank"], dtype=float)
        b = np.asarray(real[name]["step_samples_per_s_per_rank"], dtype=float)
        beats = float(((b[:, None] > a[None, :]) + 0.5 * (b[:, None] == a[None, :])).mean())
        out.append({"lever": name, "previous": prev,
                    "gain": real[name]["samples_per_s_per_rank"]
                    / real[prev]["samples_per_s_per_rank"] - 1,
                    "beats": beats, "resolved": beats >= share, "worse": beats <= 1 - share,
                    "steps": (len(b), len(a))})
    return out


def mitigations(*, nodes: int = 4, nic: str = "delay 2ms", ddp_options: dict | None = None,
                hier_nodes: int = 2, hier_ppn: int = 2, hier_nic: str = "delay 20ms",
                hier_intra: str | None = "delay 50us", accumulate: int = 4,
                steps: int = 10, sim_nodes=SIM_NODES, sim_steps: int = 5) -> dict:
    """Each mitigation measured on the real cluster, then simulated to 1024 nodes.

    Real (DDP through the emulated network, `experiments.ddp`): baseline = small buckets,
    no overlap (every bucket issued after backward); overlap; bigger buckets (+ overlap);
    fewer syncs (gradient accumulation over `accumulate` micro-batches, no_sync between).
    Real (synthetic step): flat ring vs hierarchical all-reduce on hier_nodes x hier_ppn
    ranks with fast intra-node links.
    Simulated: the same DDP step (the measured compute time and the measured bucket sizes:
    each configuration's `bucket_sizes` as DDP reduced them) to 1024 nodes for each
    mitigation; hierarchical with 8 ranks per node. out["config"]["sim_buckets"] holds the
    buckets each simulated configuration used (`simulated_plans`).
    """
    opts = {"bucket_cap_mb": 0.25, **(ddp_options or {})}
    plan = {
        "baseline": dict(mode="deferred"),
        "overlap": dict(mode="overlap"),
        "bigger buckets": dict(mode="overlap", bucket_cap_mb=25.0),
        "fewer syncs": dict(mode="overlap", bucket_cap_mb=25.0, accumulate=accumulate),
    }
    real: dict = {}
    preload_ddp()
    with Cluster(nodes=nodes, nic=nic, timeout=120) as cl:
        for name, extra in plan.items():
            run = ddp.run_ddp(cl, **{"steps": steps, **opts, **extra})
            per_step = run.phases()["step"].mean(axis=0)  # mean over ranks, per synced step
            real[name] = {**run.summary(), "steps": run.config["steps"],
                          "bucket_sizes": run.bucket_sizes,
                          "param_bytes": run.param_bytes,
                          "step_samples_per_s_per_rank": run.config["batch"]
                          * run.config["accumulate"] / per_step}
    hier = flat_vs_hierarchical(hier_nodes, hier_ppn, hier_nic, hier_intra)
    from ..sim import scaling_curve, simulate_training  # after the real runs, as above

    # The simulator, fed with what was measured: compute per step, model and bucket sizes.
    base = real["baseline"]
    compute_s = base["forward_s"] + base["backward_s"]
    model_bytes = base["param_bytes"]
    common = dict(nic=nic, model_bytes=model_bytes, compute_s=compute_s, steps=sim_steps)
    sims = simulated_plans(real)
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
    # hierarchical: 8 ranks per node with a fast intra link, nodes = ranks / 8; and the flat
    # ring on that same layout, what the hierarchical curve is to be compared with, so that
    # its gain is the algorithm's, not the layout's
    for name, algorithm in (("hierarchical", "hierarchical"), ("ring, 8 per node", "ring")):
        sim[name] = []
        for n in sim_nodes:
            if n < 8:
                continue
            res = simulate_training(n // 8, 8, intra=hier_intra, algorithm=algorithm,
                                    **{**common, **sims["bigger buckets"]})
            sim[name].append({"nodes": n, "mean_step_s": res.mean_step,
                              "efficiency": compute_s / res.mean_step})
    for name in sims:
        for row in sim[name]:
            row["nodes"] = row.get("ranks", row["nodes"])
    return {"real": real, "hierarchical": hier, "sim": sim,
            "config": {"nodes": nodes, "nic": nic, "compute_s": compute_s,
                       "model_bytes": model_bytes, "accumulate": k, "hier_nic": hier_nic,
                       "sim_buckets": {name: list(kw["buckets"]) for name, kw in sims.items()},
                       "hier_intra": hier_intra, "hier_nodes": hier_nodes,
                       "hier_ppn": hier_ppn}}


# --- 6. time to train -------------------------------------------------------------------------
#
# Throughput is samples per second; what a team waits for is the time to reach a target
# loss: (steps to the target) x (time per step). Synchronous data parallelism on N nodes with
# a per-rank batch b, gradients averaged, is exactly SGD on one process at the global batch
# N x b (up to the order of floating-point sums), so the steps are measured by real
# single-process training at each global batch, cheaply, and the step time is the one
# measured (real ranks) or simulated (to 1024 nodes) under the network's jitter.

TASK = dict(features=8, classes=4, teacher_scale=1.5, pool=1 << 18, eval_samples=4096,
            margin=0.01, seed=123)


def make_classification(n: int, *, features: int = 8, classes: int = 4,
                        teacher_scale: float = 1.5, seed: int = 0, teacher_seed: int = 123):
    """A synthetic classification task: x ~ N(0, I), labels drawn from a fixed random linear
    teacher's softmax (label noise, so even the teacher has a loss > 0: the floor).
    Returns (x, y, teacher weights) as torch tensors."""
    import torch

    w = torch.randn(features, classes, generator=torch.Generator().manual_seed(teacher_seed))
    w = w * teacher_scale
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=gen)
    cdf = torch.softmax(x @ w, dim=1).cumsum(dim=1)
    y = (cdf < torch.rand(n, 1, generator=gen)).sum(dim=1).clamp_max(classes - 1)
    return x, y, w


def _train_to_target(x, y, xe, ye, target: float, batch: int, lr: float, max_steps: int,
                     seed: int) -> int | None:
    """Plain SGD (softmax regression) at `batch` on fresh samples from the pool; the steps
    until the held-out loss is below `target`, or None if not within max_steps."""
    import torch
    import torch.nn.functional as F

    features, classes = x.shape[1], int(y.max()) + 1
    w = torch.zeros(features, classes, requires_grad=True)
    b = torch.zeros(classes, requires_grad=True)
    n = len(x)
    start = int(np.random.default_rng(seed).integers(n))
    diverged = 4 * math.log(classes)  # 4x the loss of the zero model we start from
    for step in range(max_steps):
        lo = (start + step * batch) % n
        if lo + batch <= n:  # a view, no copy
            xb, yb = x[lo:lo + batch], y[lo:lo + batch]
        else:
            idx = torch.arange(lo, lo + batch) % n
            xb, yb = x[idx], y[idx]
        loss = F.cross_entropy(xb @ w + b, yb)
        gw, gb = torch.autograd.grad(loss, (w, b))
        with torch.no_grad():
            w -= lr * gw
            b -= lr * gb
            held_out = float(F.cross_entropy(xe @ w + b, ye))
            if held_out < target:
                return step + 1
            if not held_out < diverged:  # blown up (or nan): this rate will not get there
                return None
    return None


# Learning rates tried: a factor of 2 apart. The search per batch walks this grid from the
# square-root-scaling guess, so the largest usable rate is found, not imposed.
LR_GRID = tuple(2.0 ** k for k in range(-3, 8))


def _search_lr(train, grid, start: int, max_steps: int) -> dict | None:
    """Walk `grid` from `start`: up while the mean steps improve, then down (also while
    nothing has reached the target yet); then try the grid value above the best, so that
    its outcome is known. train(lr, cap) -> per-seed steps (None: not within cap)."""
    tried: dict[int, float | None] = {}
    best: dict | None = None

    def attempt(i: int) -> bool:
        nonlocal best
        cap = max_steps if best is None else int(best["steps"]) + 1
        runs = train(grid[i], cap)
        mean = None if any(r is None for r in runs) else float(np.mean(runs))
        tried[i] = mean
        if mean is not None and (best is None or mean < best["steps"]):
            best = {"steps": mean, "lr": grid[i], "index": i, "per_seed": runs}
            return True
        return False

    attempt(start)
    i = start + 1
    while i < len(grid) and attempt(i):  # up while it improves
        i += 1
    i = start - 1
    while i >= 0 and (attempt(i) or best is None):  # then down while it improves
        i -= 1
    if best is None:
        return None
    above = best.pop("index") + 1
    if above < len(grid) and above not in tried:
        attempt(above)
    best["lr_above"] = tried.get(above) if above < len(grid) else float("nan")
    return best


def steps_to_target(global_batches, *, seeds=(0, 1), lr_grid=LR_GRID, max_steps: int = 1500,
                    task: dict | None = None) -> dict:
    """Measured steps to the target loss at each global batch (real SGD, one process).

    Target: the held-out loss within `margin` nats of the teacher's own loss on the same
    held-out set. Learning rate: for each batch B a search over `lr_grid` (fewest mean steps
    over `seeds`), starting at the grid value nearest sqrt(B / 32) (square-root scaling as a
    first guess; no higher than the previous, smaller batch's best) and walking up, then
    down, while it improves. The search walks past its
    best value: `lr_above` is the next grid value's outcome (its mean steps, or None when it
    did not reach the target within the best's steps: too large to help, often diverged), so
    a plateau of the best rate is the loss's own stability limit, not a cap of ours. A
    candidate is stopped once it cannot beat the best so far (keeps the search cheap). Every
    seed reads the same pool of fresh samples from its own offset.
    Returns {"target", "floor", "rows": [{"batch", "steps", "lr", "lr_above", "per_seed",
    "reused"}]}.
    """
    import torch
    import torch.nn.functional as F

    grid = sorted(lr_grid)
    if not grid or grid[0] <= 0:
        raise ValueError("lr_grid must hold positive learning rates")
    cfg = {**TASK, **(task or {})}
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead
    opts = dict(features=cfg["features"], classes=cfg["classes"],
                teacher_scale=cfg["teacher_scale"], teacher_seed=cfg["seed"])
    xe, ye, w = make_classification(cfg["eval_samples"], seed=10_000, **opts)
    floor = float(F.cross_entropy(xe @ w, ye))
    target = floor + cfg["margin"]
    pool = make_classification(cfg["pool"], seed=0, **opts)[:2]  # seeds start at other offsets
    rows = []
    for batch in global_batches:
        start = int(np.argmin([abs(math.log(lr / math.sqrt(batch / 32))) for lr in grid]))
        if rows and batch > rows[-1]["batch"]:  # no higher than what worked at a smaller
            start = min(start, grid.index(rows[-1]["lr"]))  # batch: a failing start is slow

        def train(lr, cap, batch=batch):
            return [_train_to_target(*pool, xe, ye, target, batch, lr, cap, s) for s in seeds]

        best = _search_lr(train, grid, start, max_steps)
        if best is None:
            raise RuntimeError(f"batch {batch}: no learning rate of {grid} reached the target "
                               f"loss {target:.3f} within {max_steps} steps")
        best["batch"] = int(batch)
        best["reused"] = max(best["per_seed"]) * batch > cfg["pool"]  # a sample seen twice?
        rows.append(best)
    return {"target": target, "floor": floor, "rows": rows, "seeds": list(seeds),
            "task": cfg}


def time_to_train(step_times: dict, *, per_rank_batch: int = 32, **options) -> dict:
    """Time to the target loss = steps to target (measured, `steps_to_target`, at the global
    batch N x per_rank_batch) x the step time at N nodes.

    step_times: {label: {nodes: seconds per step}} (measured or simulated); options go to
    `steps_to_target`. Gradient accumulation over k micro-batches is the same table read at
    the batch k x N x per_rank_batch, with (k - 1) more micro-batches of compute per step."""
    nodes = sorted({n for times in step_times.values() for n in times})
    measured = steps_to_target([n * per_rank_batch for n in nodes], **options)
    steps = {r["batch"]: r["steps"] for r in measured["rows"]}
    curves = {label: [{"nodes": n, "batch": n * per_rank_batch, "step_s": t,
                       "steps": steps[n * per_rank_batch],
                       "time_s": steps[n * per_rank_batch] * t}
                      for n, t in sorted(times.items())]
              for label, times in step_times.items()}
    return {"curves": curves, "steps": measured, "per_rank_batch": per_rank_batch}
