"""Model bench: predicted (closed forms and simulator) against measured (real ranks).

Three families of rows, each with its own checks:

1. all_reduce on 2, 4 and 8 ranks, 1 KiB..16 MiB, delays 0.5..5 ms, jitter off and on:
   the alpha-beta closed form (ring, alpha = the configured delay, beta from the rate) and
   the simulator (the same schedule the backend replays, median over seeds) against the
   measured median. Both predictions are calibrated with this machine's floor, as the
   backend holds an operation until max(native Gloo, emulated network): prediction =
   max(model, measured plain-Gloo time of the same size and rank count).
2. A DDP training step of a small MLP, measured through unmodified DDP, against
   `sim.simulate_training` fed with the measured per-rank compute time.
3. Growth with N under jitter, against order statistics: a one-round all_to_all on a
   jittery network (each rank waits for the slowest of N-1 messages: delay + E[max]), and a
   synchronous step with jittery compute (each step waits for the slowest rank).
"""

from __future__ import annotations

import time

import numpy as np

from .. import clock, models
from ..cluster import Cluster
from ..netem import Netem
from ..schedule import Collective, Fabric, play
from ..sim import simulate_training
from ..topology import Topology
from . import bench, check, result

SIZES = [1 << 10, 64 << 10, 1 << 20, 16 << 20]


def _all_reduce_times(sizes, repeats):
    import torch
    import torch.distributed as dist

    out = {}
    for n in sizes:
        x = torch.ones(max(1, n // 4))
        dist.all_reduce(x)
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = clock.now()
            dist.all_reduce(x)
            times.append(clock.elapsed(t0))
        out[n] = times
    return out


def _measure(cluster_kwargs, sizes, repeats) -> dict[int, float]:
    with Cluster(timeout=300, **cluster_kwargs) as cl:
        per_rank = cl.run(_all_reduce_times, sizes, repeats)
    # A collective is over when its slowest rank is; the median over repeats.
    return {n: float(np.median(np.max([r[n] for r in per_rank], axis=0))) for n in sizes}


def _sim_all_reduce(p: int, nic: str, n: int, seeds: int = 15) -> float:
    fabric_topo = Topology.build(p, 1, nic)
    samples = []
    for s in range(seeds):
        done = play(Fabric(fabric_topo), Collective("allreduce", n), np.zeros(p, dtype=np.int64),
                    np.random.default_rng(s))
        samples.append(done.max() / 1e9)
    return float(np.median(samples))


def _model_all_reduce(p: int, nic: str, n: int) -> float:
    spec = Netem.parse(nic)
    beta = 8 / spec.rate_bps * (65536 + 66) / 65536 if spec.rate_bps else 0.0
    return models.ring_allreduce_jitter(p, n, spec.delay_ns / 1e9, beta, spec.jitter_ns / 1e9,
                                        spec.distribution)


def _ddp_steps(steps, hidden):
    """Alternate DDP steps without communication (no_sync) and ordinary ones."""
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, 10))
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()

    local, synced = [], []
    for _ in range(steps):
        dist.barrier()
        t0 = clock.now()
        with ddp.no_sync():  # the same step, minus the gradient all-reduce
            step()
        local.append(clock.elapsed(t0))
        dist.barrier()
        t0 = clock.now()
        step()
        synced.append(clock.elapsed(t0))
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"compute": local, "steps": synced, "param_bytes": nbytes}


def _alltoall_times(repeats, period_s):
    """all_to_all_single entered by every rank at the same instant of the shared clock, so
    that what is measured is the operation, not how unevenly the ranks arrived."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    x, y = torch.ones(world), torch.zeros(world)
    now = torch.tensor([time.monotonic_ns()])
    dist.all_reduce(now, op=dist.ReduceOp.MAX)
    base = int(now) + int(50e6)
    times = []
    for i in range(repeats):
        start = base + int(i * period_s * 1e9)
        clock.sleep_until(start, spin_ns=200_000)
        dist.all_to_all_single(y, x)
        times.append((time.monotonic_ns() - start) / 1e9)
    return times


def _jittery_steps(steps, compute_s, jitter_s, seed):
    import torch
    import torch.distributed as dist

    rng = np.random.default_rng([seed, dist.get_rank()])
    x = torch.ones(256)
    dist.barrier()
    t0 = clock.now()
    for _ in range(steps):
        time.sleep(compute_s + rng.uniform(-jitter_s, jitter_s))  # this rank's "compute"
        dist.all_reduce(x)
    return clock.elapsed(t0) / steps


def _rel(pred: float, meas: float) -> float:
    return abs(pred - meas) / abs(meas)


@bench("model")
def model_bench(quick: bool = False) -> dict:
    rows: list[dict] = []
    checks: list[dict] = []
    repeats = 3 if quick else 7
    ranks = (2, 4) if quick else (2, 4, 8)
    nics = ["delay 500us", "delay 2ms", "delay 5ms", "delay 2ms 1ms", "delay 1ms rate 1gbit"]
    if quick:
        nics = nics[1:2] + nics[3:4]

    # 1. all_reduce: closed form and simulator against measurement.
    for p in ranks:
        native = _measure({"nodes": p, "nic": None}, SIZES, repeats)
        for nic in nics:
            measured = _measure({"nodes": p, "nic": nic}, SIZES, repeats)
            for n in SIZES:
                model = max(_model_all_reduce(p, nic, n), native[n])
                sim = max(_sim_all_reduce(p, nic, n), native[n])
                rows.append({"kind": "all_reduce", "ranks": p, "nic": nic, "bytes": n,
                             "measured_s": measured[n], "native_s": native[n],
                             "model_s": model, "sim_s": sim})
    for kind in ("model", "sim"):
        errors = [_rel(r[f"{kind}_s"], r["measured_s"]) for r in rows if r["kind"] == "all_reduce"]
        worst_cfg = {}
        for r in rows:
            if r["kind"] == "all_reduce":
                key = (r["ranks"], r["nic"])
                worst_cfg.setdefault(key, []).append(_rel(r[f"{kind}_s"], r["measured_s"]))
        med = {f"{p} ranks, {nic}": round(float(np.median(v)), 4)
               for (p, nic), v in worst_cfg.items()}
        worst = max(med.values())
        checks.append(check(f"all_reduce: median relative error of the {kind} per configuration "
                            f"(worst of {len(med)})", "<= 0.15", worst, worst <= 0.15))
        checks.append(check(f"all_reduce: median relative error of the {kind}, all rows",
                            "report", round(float(np.median(errors)), 4), True))

    # 2. A DDP step of a small MLP: measured vs simulated from the measured compute time
    #    (DDP steps under no_sync) and this machine's native all-reduce time (the floor).
    for p in ranks:
        for nic in ("delay 2ms", "delay 2ms 1ms"):
            with Cluster(nodes=p, nic=nic, timeout=300) as cl:
                per_rank = cl.run(_ddp_steps, 6 if quick else 15, 512)
            nbytes = per_rank[0]["param_bytes"]
            floor = _measure({"nodes": p, "nic": None}, [nbytes], repeats)[nbytes]
            measured = float(np.median(np.max([r["steps"] for r in per_rank], axis=0)))
            compute = float(np.median(np.max([r["compute"] for r in per_rank], axis=0)))
            sim = simulate_training(p, 1, nic, model_bytes=nbytes, bucket_bytes=25 * 2**20,
                                    compute_s=compute, steps=30, seed=1,
                                    native_s=lambda n, f=floor: f)
            predicted = sim.percentile(50)
            rows.append({"kind": "ddp_step", "ranks": p, "nic": nic, "param_bytes": nbytes,
                         "compute_s": compute, "native_all_reduce_s": floor,
                         "measured_s": measured, "sim_s": predicted})
            err = _rel(predicted, measured)
            checks.append(check(f"DDP step, {p} ranks, {nic}: simulated vs measured",
                                "relative error <= 0.15", round(err, 4), err <= 0.15))

    # 3. Growth with N under jitter against order statistics. Each quantity is the extra time
    #    that jitter adds (jittery run minus the same run without jitter), so the machine's
    #    own costs cancel out.
    jitter_ms, delay_ms = 2.0, 5.0
    lo, hi = ranks[0], ranks[-1]
    extra = {}
    for p in ranks:
        means = []
        for nic in (f"delay {delay_ms:g}ms", f"delay {delay_ms:g}ms {jitter_ms:g}ms"):
            with Cluster(nodes=p, nic=nic, timeout=300) as cl:
                per_rank = cl.run(_alltoall_times, 30 if quick else 150, 0.03)
            means.append(float(np.mean(np.max(per_rank, axis=0))))
        extra[p] = means[1] - means[0]
    # One round: the operation ends with the last of all p(p-1) messages.
    pred = {p: jitter_ms * models.expected_max(p * (p - 1), "uniform") / 1e3 for p in ranks}
    growth_meas, growth_pred = extra[hi] - extra[lo], pred[hi] - pred[lo]
    rows.append({"kind": "alltoall_jitter", "jitter_ms": jitter_ms, "extra_s": extra,
                 "predicted_extra_s": pred})
    err = _rel(growth_pred, growth_meas)
    checks.append(check(f"all_to_all, jitter ±{jitter_ms:g} ms: growth of the extra time "
                        f"{lo}->{hi} ranks vs E[max]", "relative error <= 0.15", round(err, 4),
                        err <= 0.15))

    compute_s, jitter_s = 0.02, 0.01
    extra = {}
    for p in ranks:
        means = []
        with Cluster(nodes=p, nic="delay 200us", timeout=300) as cl:
            for j in (0.0, jitter_s):
                means.append(float(np.mean(cl.run(_jittery_steps, 40 if quick else 250,
                                                  compute_s, j, p))))
        extra[p] = means[1] - means[0]
    pred = {p: jitter_s * models.expected_max(p, "uniform") for p in ranks}
    growth_meas, growth_pred = extra[hi] - extra[lo], pred[hi] - pred[lo]
    rows.append({"kind": "compute_jitter", "compute_s": compute_s, "jitter_s": jitter_s,
                 "extra_s": extra, "predicted_extra_s": pred})
    err = _rel(growth_pred, growth_meas)
    checks.append(check(f"synchronous step, compute jitter ±{jitter_s * 1e3:g} ms: growth of the "
                        f"extra time {lo}->{hi} ranks vs E[max]", "relative error <= 0.15",
                        round(err, 4), err <= 0.15))
    return result("model", rows, checks)


@bench("sim")
def sim_speed(quick: bool = False) -> dict:
    """How long the simulator takes for a 1024-node, 20-step DDP run (goal <= 1 s)."""
    rows = []
    simulate_training(8, steps=2)  # compile the numba kernel first (cached on disk after)
    for nic in ("delay 20us rate 100gbit", "delay 20us 5us rate 100gbit",
                "delay 20us 5us distribution normal rate 100gbit loss 0.01%"):
        for _ in range(2 if quick else 3):
            t0 = time.perf_counter()
            res = simulate_training(1024, nic=nic, steps=20)
            rows.append({"nic": nic, "nodes": 1024, "steps": 20,
                         "seconds": time.perf_counter() - t0,
                         "mean_step_s": res.mean_step})
    worst = max(float(np.median([r["seconds"] for r in rows if r["nic"] == nic]))
                for nic in {r["nic"] for r in rows})
    return result("sim", rows, [check("1024 nodes x 20 DDP steps (100 MB model, 25 MiB buckets), "
                                      "slowest network (median)", "<= 1.0 s", round(worst, 3),
                                      worst <= 1.0)])
