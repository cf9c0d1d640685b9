"""Stragglers and stale gradients: the experiments of notebook 05.

Everything with "cluster" in its story runs on real processes (`clusterlab.Cluster`, Gloo
through the emulated network); compute is a `time.sleep` of a seeded random duration, so the
ranks' compute times are reproducible while the step times are measured, not computed.

Public API (each function documents its return value):

* `compute_draws`: the seeded per-rank compute times c + Exp(m) that every experiment uses;
* `synchronous_step_times`: a synchronous all-reduce loop; the slowest rank sets the pace,
  and with exponential compute the mean step is c + m·H_N (`models.straggler_step`);
* `simulated_step_times`: the same order statistic for N far beyond this machine;
* `backup_workers`, `backup_step_prediction`: synchronous SGD that uses the first N - b
  gradients to arrive; the wait is the (N - b)-th order statistic, c + m·(H_N - H_b);
* `async_parameter_server`: an asynchronous parameter server (rank 0) and workers; measures
  the staleness τ of every applied gradient, the "step back", and two fixes (step size
  divided by τ + 1, and bounded staleness, SSP);
* `in_flight_staleness`: the end term of the identity sum(τ) = (W - 1)·U - it, which makes
  the mean τ of plain asynchronous SGD W - 1 whatever the workers' speeds;
* `shared_versions`: which applied gradients were computed on the same parameter version
  (workers released together by SSP): k such gradients act like one step of k·a;
* `delayed_gd`, `growth_rate`, `stability_boundary`: deterministic delayed gradient descent
  x_{t+1} = x_t - a·x_{t-τ} on a 1-D quadratic; bisection on the iteration's growth is a
  numerical check of the closed form 2·sin(π/(4τ + 2)) (`models.delayed_gd_stable_step`).

Sources: Dean et al., "Large Scale Distributed Deep Networks" (NeurIPS 2012, asynchronous
SGD / Downpour); Chen et al., "Revisiting Distributed Synchronous SGD" (arXiv:1604.00981,
2016, backup workers); Ho et al., "More Effective Distributed ML via a Stale Synchronous
Parallel Parameter Server" (NeurIPS 2013, SSP); Zhang et al., "Staleness-aware Async-SGD"
(IJCAI 2016, step size divided by the staleness); Levin & May (1976) for the delayed
iteration's stability.
"""

from __future__ import annotations

import functools
import math
import threading
import time

import numpy as np
import torch
import torch.distributed as dist

from .. import models
from ..cluster import Cluster
from .common import use_or_open

__all__ = [
    "FIXES",
    "async_parameter_server",
    "backup_step_prediction",
    "backup_workers",
    "compute_draws",
    "delayed_gd",
    "growth_rate",
    "in_flight_staleness",
    "quadratic",
    "shared_versions",
    "simulated_step_times",
    "stability_boundary",
    "synchronous_step_times",
]

DEFAULT_NIC = "delay 100us"
FIXES = (None, "scale", "ssp", "ssp+scale")  # async_parameter_server's staleness fixes


# ---------------------------------------------------------------------------------------------
# Seeded compute times.
# ---------------------------------------------------------------------------------------------


def compute_draws(
    ranks: int,
    steps: int,
    compute_s: float,
    exp_mean_s: float = 0.0,
    seed: int = 0,
    slow_rank: int | None = None,
    slowdown: float = 1.0,
) -> np.ndarray:
    """Compute time of each (step, rank): c + Exp(mean m), seeded per rank.

    Rank r draws from numpy's default_rng([seed, r]), so its sequence does not depend on the
    number of ranks: growing the cluster only adds columns. The `slow_rank` computes
    `slowdown` times longer (its whole compute time is multiplied).
    """
    ranks, steps = int(ranks), int(steps)
    if ranks < 1 or steps < 1:
        raise ValueError("ranks and steps must be >= 1")
    if compute_s < 0 or exp_mean_s < 0 or slowdown <= 0:
        raise ValueError("compute_s and exp_mean_s must be >= 0 and slowdown > 0")
    out = np.full((steps, ranks), float(compute_s))
    for r in range(ranks):
        if exp_mean_s > 0:
            out[:, r] += np.random.default_rng([seed, r]).exponential(exp_mean_s, steps)
    if slow_rank is not None:
        if not 0 <= slow_rank < ranks:
            raise ValueError(f"slow_rank {slow_rank} is outside 0..{ranks - 1}")
        out[:, slow_rank] *= slowdown
    return out


# ---------------------------------------------------------------------------------------------
# 1. Synchronous steps: the slowest rank sets the pace.
# ---------------------------------------------------------------------------------------------


def _sync_rank(draws: np.ndarray, numel: int, calib_steps: int) -> dict:
    rank = dist.get_rank()
    grad = torch.zeros(numel)
    for _ in range(3):  # warm-up: connections, allocator
        dist.all_reduce(grad)
    comm = []
    for _ in range(calib_steps):  # the collective alone: what a step costs with no compute
        t0 = time.monotonic()
        dist.all_reduce(grad)
        comm.append(time.monotonic() - t0)
    dist.barrier()
    steps = draws.shape[0]
    start = np.empty(steps)
    arrive = np.empty(steps)
    leave = np.empty(steps)
    for k in range(steps):
        start[k] = time.monotonic()
        time.sleep(draws[k, rank])  # "compute" the gradient
        grad.fill_(float(k))
        arrive[k] = time.monotonic()
        dist.all_reduce(grad)  # the barrier: nobody leaves before the slowest arrives
        leave[k] = time.monotonic()
    return {"start": start, "arrive": arrive, "leave": leave, "comm": np.array(comm)}


def synchronous_step_times(
    nodes: int,
    compute_s: float,
    slow_rank: int | None = None,
    slowdown: float = 1.0,
    exp_mean_s: float = 0.0,
    steps: int = 30,
    seed: int = 0,
    *,
    nic: str | None = DEFAULT_NIC,
    grad_numel: int = 256,
    calib_steps: int = 10,
    cluster: Cluster | None = None,
    timeout: float = 60,
) -> dict:
    """A real synchronous loop: every rank sleeps its compute time, then all-reduces.

    Each of `nodes` ranks draws its compute time per step from `compute_draws` (c + Exp(m),
    the `slow_rank` `slowdown` times longer), sleeps it, and all-reduces a `grad_numel`-float
    gradient through the emulated network `nic`. Before the loop, `calib_steps` all-reduces
    with no compute measure what the collective alone costs.

    Returns a dict:
      step_s: (steps,) wall time of each step, rank 0's view (one all-reduce exit to the next);
      slowest_compute_s: (steps,) the longest of the ranks' own compute times of the step
        (each rank times its own seeded sleep): a consistency check of the draws plus the
        sleep's overshoot, not a measurement of the barrier (step_s measures that);
      comm_s: mean time of the all-reduce alone (calibration); draws: the (steps, nodes)
        compute times drawn; mean_step_s, mean_slowest_s; sample_max_s: mean over steps of
        the largest drawn compute (the order statistic of this very sample);
      model_s: the closed form: c + m·H_N (`models.straggler_step`) without a slow rank,
        slowdown·(c + m) + ... approximated by max(slowdown·(c + m), c + m·H_N) with one.
    """
    draws = compute_draws(nodes, steps, compute_s, exp_mean_s, seed, slow_rank, slowdown)
    with use_or_open(cluster, ranks=nodes, nodes=nodes, nic=nic, seed=seed,
                     timeout=timeout) as cl:
        out = cl.run(_sync_rank, draws, grad_numel, calib_steps)
    starts = np.stack([o["start"] for o in out], axis=1)
    arrives = np.stack([o["arrive"] for o in out], axis=1)
    leave0 = out[0]["leave"]
    step = np.diff(np.concatenate([[out[0]["start"][0]], leave0]))
    slowest = (arrives - starts).max(axis=1)
    model = models.straggler_step(compute_s, exp_mean_s, nodes)
    if slow_rank is not None and slowdown != 1.0:
        model = max(slowdown * (compute_s + exp_mean_s), model)
    return {
        "nodes": nodes, "compute_s": compute_s, "exp_mean_s": exp_mean_s,
        "slow_rank": slow_rank, "slowdown": slowdown,
        "step_s": step, "slowest_compute_s": slowest, "draws": draws,
        "comm_s": float(np.mean([o["comm"].mean() for o in out])) if calib_steps else 0.0,
        "mean_step_s": float(step.mean()), "mean_slowest_s": float(slowest.mean()),
        "sample_max_s": float(draws.max(axis=1).mean()), "model_s": float(model),
    }


def simulated_step_times(
    node_counts, compute_s: float, exp_mean_s: float, steps: int = 2000, seed: int = 0
) -> dict:
    """Mean synchronous step (compute only) for N ranks far beyond this machine, by sampling.

    Draws (steps, N) compute times c + Exp(m) with `clusterlab.sim.compute_times` and
    averages the per-step maximum. Returns {"nodes", "mean_step_s", "model_s"} as arrays,
    model_s = c + m·H_N.
    """
    from clusterlab.sim import compute_times

    nodes = np.asarray(list(node_counts), dtype=int)
    means = []
    for i, n in enumerate(nodes):
        rng = np.random.default_rng([seed, i])
        if compute_s > 0:
            comp = compute_times(rng, (steps, int(n)), compute_s, exp_mean_s / compute_s,
                                 "exponential")
        else:
            comp = rng.exponential(exp_mean_s, (steps, int(n)))
        means.append(comp.max(axis=1).mean())
    model = [models.straggler_step(compute_s, exp_mean_s, int(n)) for n in nodes]
    return {"nodes": nodes, "mean_step_s": np.array(means), "model_s": np.array(model)}


# ---------------------------------------------------------------------------------------------
# 2. Backup workers: proceed with the first N - b gradients.
# ---------------------------------------------------------------------------------------------


def backup_step_prediction(nodes: int, backups: int, compute_s: float, exp_mean_s: float) -> float:
    """E[time until N - b of N workers are done] = c + m·(H_N - H_b).

    By Rényi's representation the gaps between consecutive arrivals of N exponentials of
    mean m are independent with means m/N, m/(N-1), ..., so the (N-b)-th arrival has mean
    m·(1/N + ... + 1/(b+1)) = m·(H_N - H_b). b = 0 gives models.straggler_step.
    """
    if not 0 <= backups < nodes:
        raise ValueError(f"backups must be in 0..{nodes - 1}, got {backups}")
    return compute_s + exp_mean_s * (models.harmonic(nodes) - models.harmonic(backups))


def quadratic(dim: int = 16, lam_min: float = 0.05, lam_max: float = 1.0):
    """Curvatures λ (log-spaced, largest first) of f(x) = ½ Σ λ_i x_i², the start x0 = 1.

    Returns (lam, x0). The minimum is x = 0, f = 0; the largest a = η·λ_max decides stability.
    """
    lam = np.geomspace(lam_max, lam_min, dim)
    return lam, np.ones(dim)


_STEP, _WORKER, _FLAG = 0, 1, 2  # header fields of a worker's reply
_HEAD = 3


def _backup_rank(draws: np.ndarray, used: int, lr: float, dim: int) -> dict:
    """Rank 0: the aggregator; ranks 1..N: workers whose compute is a sleep cut short when
    the next parameters arrive (the aggregator moved on: this gradient is no longer needed)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    workers = world - 1
    steps = draws.shape[0]
    lam, x = quadratic(dim)
    x = torch.from_numpy(x.copy())
    msg = torch.zeros(1 + dim, dtype=torch.float64)  # [step, params...]; step = -1 stops
    reply = torch.zeros(_HEAD + dim, dtype=torch.float64)  # [step, worker, flag, grad...]
    if rank == 0:
        step_s, loss = np.empty(steps), np.empty(steps)
        owed = 0  # replies still to come (every worker answers every parameter message)
        for k in range(steps):
            msg[0] = k
            msg[1:] = x
            t0 = time.monotonic()
            for w in range(1, world):
                dist.send(msg, w)
            owed += workers
            got, total = 0, torch.zeros(dim, dtype=torch.float64)
            while got < used:
                dist.recv(reply)
                owed -= 1
                if int(reply[_STEP]) == k and reply[_FLAG] > 0:
                    total += reply[_HEAD:]
                    got += 1
            step_s[k] = time.monotonic() - t0
            x -= lr * total / used
            loss[k] = 0.5 * float((torch.from_numpy(lam) * x * x).sum())
        for _ in range(owed):  # the late and the cancelled answers of the last steps
            dist.recv(reply)
        msg[0] = -1
        for w in range(1, world):
            dist.send(msg, w)
        return {"step_s": step_s, "loss": loss}
    done = cancelled = 0
    nxt = torch.zeros_like(msg)
    dist.recv(msg, 0)
    while int(msg[0]) >= 0:
        k = int(msg[0])
        work = dist.irecv(nxt, 0)  # the next parameters: also the signal that we are late
        arrived = threading.Event()
        waiter = threading.Thread(target=lambda w=work, ev=arrived: (w.wait(), ev.set()),
                                  daemon=True)
        waiter.start()
        finished = not arrived.wait(draws[k, rank - 1])  # compute, unless overtaken
        reply[_STEP], reply[_WORKER] = k, rank
        reply[_FLAG] = 1.0 if finished else 0.0
        if finished:
            reply[_HEAD:] = torch.from_numpy(lam) * msg[1:]  # ∇f at the parameters we got
            done += 1
        else:
            cancelled += 1
        dist.send(reply, 0)
        waiter.join()
        msg.copy_(nxt)
    return {"done": done, "cancelled": cancelled}


def backup_workers(
    nodes: int,
    backups,
    compute_s: float = 0.02,
    exp_mean_s: float = 0.02,
    steps: int = 30,
    seed: int = 0,
    *,
    lr: float = 0.5,
    dim: int = 16,
    nic: str | None = DEFAULT_NIC,
    cluster: Cluster | None = None,
    timeout: float = 60,
) -> list[dict]:
    """Synchronous SGD with b backup workers, on N = `nodes` workers plus one aggregator.

    Rank 0 sends the parameters to every worker, then waits only for the first N - b
    gradients of this step (point-to-point through the emulated network, any source). A
    worker "computes" for its seeded time c + Exp(m) (`compute_draws`, N columns); if the
    next step's parameters arrive first, the aggregator has moved on: the worker stops and
    answers "cancelled" (its gradient would have been thrown away). The aggregator averages
    the N - b gradients it used and steps a quadratic (`quadratic`).

    `backups`: an int or a sequence of ints (all run on one cluster of nodes + 1 ranks).
    Returns one dict per b: backups, used (= N - b), step_s (measured at the aggregator),
    mean_step_s, predicted_s = c + m·(H_N - H_b) (`backup_step_prediction`), sample_s (the
    mean (N-b)-th smallest draw of this very sample), cancelled (gradients cut short),
    loss (per step).
    """
    single = isinstance(backups, int)
    backups = [backups] if single else [int(b) for b in backups]
    draws = compute_draws(nodes, steps, compute_s, exp_mean_s, seed)
    results = []
    with use_or_open(cluster, ranks=nodes + 1, nodes=nodes + 1, nic=nic, seed=seed,
                     timeout=timeout) as cl:
        for b in backups:
            if not 0 <= b < nodes:
                raise ValueError(f"backups must be in 0..{nodes - 1}, got {b}")
            out = cl.run(_backup_rank, draws, nodes - b, lr, dim)
            step = out[0]["step_s"]
            results.append({
                "nodes": nodes, "backups": b, "used": nodes - b, "step_s": step,
                "mean_step_s": float(step.mean()),
                "predicted_s": backup_step_prediction(nodes, b, compute_s, exp_mean_s),
                "sample_s": float(np.sort(draws, axis=1)[:, nodes - b - 1].mean()),
                "cancelled": int(sum(o["cancelled"] for o in out[1:])),
                "loss": out[0]["loss"],
            })
    return results[0] if single else results


# ---------------------------------------------------------------------------------------------
# 3. An asynchronous parameter server: staleness and the step back.
# ---------------------------------------------------------------------------------------------


def _ps_rank(draws, active, updates, lr, fix, bound, dim, noise, seed) -> dict:
    rank = dist.get_rank()
    if rank > active:
        return {}
    lam_np, x0 = quadratic(dim)
    lam = torch.from_numpy(lam_np)
    params = torch.zeros(1 + dim, dtype=torch.float64)  # [version, x...]; version -1 stops
    reply = torch.zeros(_HEAD + dim, dtype=torch.float64)  # [version used, worker, 1, grad]
    if rank == 0:
        x = torch.from_numpy(x0.copy())
        version = 0
        clock = {w: 0 for w in range(1, active + 1)}  # gradients pushed by each worker
        deferred: list[int] = []
        params[0], params[1:] = 0, x
        for w in clock:
            dist.send(params, w)
        rec = {k: np.empty(updates) for k in ("tau", "worker", "loss_before", "loss_after",
                                              "backward", "t")}
        t0 = time.monotonic()
        for i in range(updates):
            src = dist.recv(reply)
            tau = version - int(reply[0])
            g = reply[_HEAD:]
            before = 0.5 * float((lam * x * x).sum())
            true_grad = lam * x
            step = lr / (tau + 1) if fix in ("scale", "ssp+scale") else lr
            x -= step * g
            after = 0.5 * float((lam * x * x).sum())
            version = i + 1  # one version per applied gradient
            clock[src] += 1
            rec["tau"][i], rec["worker"][i] = tau, src
            rec["loss_before"][i], rec["loss_after"][i] = before, after
            rec["backward"][i] = float(torch.dot(g, true_grad)) < 0  # points uphill now
            rec["t"][i] = time.monotonic() - t0
            params[0], params[1:] = version, x
            slowest = min(clock.values())
            if fix in ("ssp", "ssp+scale") and clock[src] > slowest + bound:
                deferred.append(src)  # too far ahead of the slowest worker: wait
            elif i < updates - 1:
                dist.send(params, src)
            else:
                deferred.append(src)
            if i < updates - 1:
                for w in [w for w in deferred if clock[w] <= slowest + bound]:
                    deferred.remove(w)
                    dist.send(params, w)
        elapsed = time.monotonic() - t0
        params[0] = -1  # stop: the deferred now, the others when their gradient comes in
        for w in deferred:
            dist.send(params, w)
        for _ in range(active - len(deferred)):
            dist.send(params, dist.recv(reply))
        return {**rec, "elapsed_s": elapsed, "final_x": x.numpy().copy()}
    rng = np.random.default_rng([seed, 1000 + rank])
    pushed = 0
    dist.recv(params, 0)
    while params[0] >= 0:
        time.sleep(draws[pushed % draws.shape[0], rank - 1])
        reply[0], reply[1], reply[2] = params[0], rank, 1
        grad = lam * params[1:]
        if noise:
            grad = grad + noise * torch.from_numpy(rng.standard_normal(dim))
        reply[_HEAD:] = grad
        dist.send(reply, 0)
        pushed += 1
        dist.recv(params, 0)
    return {"pushed": pushed}


def async_parameter_server(
    workers: int = 4,
    updates: int = 200,
    lr: float = 0.7,
    fix: str | None = None,
    bound: int = 2,
    compute_s: float = 0.004,
    exp_mean_s: float = 0.002,
    slow_worker: int | None = None,
    slowdown: float = 1.0,
    seed: int = 0,
    *,
    dim: int = 16,
    noise: float = 0.0,
    nic: str | None = DEFAULT_NIC,
    cluster: Cluster | None = None,
    timeout: float = 60,
) -> dict:
    """A real asynchronous parameter server: rank 0 serves, ranks 1..`workers` compute.

    The problem is the quadratic f(x) = ½ Σ λ_i x_i² (`quadratic`, λ_max = 1, so a = lr).
    A worker pulls (receives) the parameters with their version, "computes" for its seeded
    time (`compute_draws`; worker index `slow_worker` is `slowdown` times slower), and pushes
    ∇f at the parameters it pulled (plus `noise`·N(0, 1) if asked). The server applies every
    gradient the moment it arrives, bumps the version, and replies with fresh parameters.
    The staleness of an applied gradient is τ = server version - version it was computed on.

    fix: None (plain async), "scale" (step lr / (τ + 1), staleness-aware), or "ssp"
    (bounded staleness: a worker that has pushed more than `bound` gradients beyond the
    slowest worker gets no parameters until the slowest catches up), or "ssp+scale" (both).
    `cluster` may be an open Cluster with at least workers + 1 ranks (extra ranks idle);
    without one, a cluster of workers + 1 ranks is started for the call.

    Returns a dict of per-update arrays: tau, worker, version (the parameter version the
    gradient was computed on), loss_before, loss_after, backward (the applied gradient
    points uphill at the current parameters), t (s since start);
    and elapsed_s, updates_per_s, step_back (fraction of updates that raised the loss),
    final_loss, initial_loss.
    """
    if fix not in FIXES:
        raise ValueError(f"fix must be one of {FIXES}, got {fix!r}")
    draws = compute_draws(workers, max(updates, 1), compute_s, exp_mean_s, seed, slow_worker,
                          slowdown)
    with use_or_open(cluster, min_ranks=workers + 1, nodes=workers + 1, nic=nic, seed=seed,
                     timeout=timeout) as cl:
        out = cl.run(_ps_rank, draws, workers, updates, lr, fix, bound, dim, noise, seed)
    rec = out[0]
    lam, x0 = quadratic(dim)
    return {
        **{k: rec[k] for k in ("tau", "worker", "loss_before", "loss_after", "t")},
        # update i is applied to version i; its gradient was computed on version i - τ
        "version": np.arange(len(rec["tau"])) - rec["tau"].astype(int),
        "backward": rec["backward"].astype(bool),
        "workers": workers, "fix": fix, "lr": lr, "bound": bound,
        "elapsed_s": rec["elapsed_s"], "updates_per_s": updates / rec["elapsed_s"],
        "step_back": float(np.mean(rec["loss_after"] > rec["loss_before"])),
        "initial_loss": float(0.5 * (lam * x0 * x0).sum()),
        "final_loss": float(rec["loss_after"][-1]),
        "pushed": [o.get("pushed", 0) for o in out[1:workers + 1]],
    }


def in_flight_staleness(result: dict) -> int:
    """The staleness carried by the gradients still in flight when a plain asynchronous
    `async_parameter_server` run stops (fix None or "scale").

    Each worker but the one that pushed last holds one gradient, computed on the version it
    pulled after its last applied update (version 0 if it never pushed). Every applied update
    makes each of the other W - 1 gradients in flight one version older, so
    sum(tau) + in_flight_staleness(result) == (W - 1)·U exactly, whatever the workers'
    speeds: the mean τ is W - 1 up to this end term. Under SSP a blocked worker holds no
    gradient, fewer are in flight, and the identity does not apply (ValueError).
    """
    if result.get("fix") not in (None, "scale"):
        raise ValueError("the identity holds for plain asynchronous runs, not under SSP")
    worker = np.asarray(result["worker"], dtype=int)
    updates = len(worker)
    last = {int(w): i for i, w in enumerate(worker)}  # each worker's last applied update
    return sum(updates - 1 - last.get(w, -1) for w in range(1, result["workers"] + 1)
               if w != worker[-1])


def shared_versions(result: dict, *, skip_start: bool = True) -> dict:
    """Group the applied gradients of an `async_parameter_server` run by the version they
    were computed on.

    Plain asynchronous SGD hands every version to one worker only (the one that just
    pushed), so each version is used once. Under SSP the workers that were blocked are
    released together, pull the same version and push gradients of the same parameters:
    k gradients of one version add up to one step of k·a along the stiffest coordinate,
    stable only while k·a < 2, whatever their τ. Version 0 (every worker starts on it) is
    left out when `skip_start`.

    Returns {"sizes": count of gradients per version used (array), "shared": versions used
    by >= 2 gradients (synchronised releases), "in_shared": fraction of the gradients that
    belong to such a version, "typical": the most common group size among shared versions
    (1 if none), "largest": the largest group}.
    """
    version = np.asarray(result["version"], dtype=int)
    if skip_start:
        version = version[version > 0]
    if version.size == 0:
        raise ValueError("no applied gradient beyond the starting version")
    _, sizes = np.unique(version, return_counts=True)
    shared = sizes[sizes >= 2]
    typical = int(np.bincount(shared).argmax()) if shared.size else 1
    return {"sizes": sizes, "shared": int(shared.size),
            "in_shared": float(shared.sum() / sizes.sum()), "typical": typical,
            "largest": int(sizes.max())}


# ---------------------------------------------------------------------------------------------
# 4. Delayed gradient descent on a 1-D quadratic: deterministic.
# ---------------------------------------------------------------------------------------------


def delayed_gd(a: float, tau: int, steps: int = 100, x0: float = 1.0) -> np.ndarray:
    """x_{t+1} = x_t - a·x_{t-τ} (gradient descent on f = λx²/2 with a = ηλ, τ-stale).

    History before the start is x0 (x_t = x0 for t <= 0). Returns x_0 .. x_steps (steps + 1
    values). Deterministic. Stable (x_t -> 0) iff 0 < a < 2 sin(π/(4τ + 2)).
    """
    tau, steps = int(tau), int(steps)
    if tau < 0 or steps < 0:
        raise ValueError("tau and steps must be >= 0")
    x = np.empty(steps + tau + 1)
    x[: tau + 1] = x0
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(tau, steps + tau):
            x[t + 1] = x[t] - a * x[t - tau]
    return x[tau:]


def _growth_python(a: float, tau: int, steps: int, block: int) -> float:
    buf = np.ones(tau + 1)  # ring buffer of the last τ + 1 values
    log_scale = 0.0
    half_log = 0.0
    pos = 0  # index of x_t in buf; x_{t-τ} is at pos + 1 (mod τ + 1)
    for t in range(steps):
        old = buf[(pos + 1) % (tau + 1)]
        pos = (pos + 1) % (tau + 1)
        buf[pos] = buf[(pos - 1) % (tau + 1)] - a * old
        if (t + 1) % block == 0:
            s = np.abs(buf).max()
            if s == 0:
                return -math.inf
            buf /= s
            log_scale += math.log(s)
            if t + 1 == steps // 2:
                half_log = log_scale
    return (log_scale - half_log) / (steps - steps // 2)


@functools.cache
def _growth_kernel():
    """`_growth_python` compiled by numba: 10^5-step runs take a millisecond (pure Python
    works, only slower). Made on first use, so that importing this module does not load
    numba (~300 modules) into this process and into every rank it forks."""
    try:
        from numba import njit
    except ImportError:  # pragma: no cover - numba is a dependency
        return _growth_python
    return njit(cache=True)(_growth_python)


def growth_rate(a: float, tau: int, steps: int = 100_000) -> float:
    """Measured growth per step of |x| in delayed GD: ≈ log of the spectral radius.

    Runs the iteration `steps` times from x = 1 (rescaling the state every 64 steps so that
    nothing overflows) and returns (log max|window| at the end - at half time) / (steps/2),
    where the window is the last τ + 1 values. Negative: converges; positive: diverges.
    """
    tau, steps = int(tau), int(steps)
    if tau < 0 or steps < 128:
        raise ValueError("tau must be >= 0 and steps >= 128")
    block = 64
    steps -= steps % (2 * block)  # the half-time mark falls on a rescaling
    return float(_growth_kernel()(float(a), tau, steps, block))


def stability_boundary(tau: int, tol: float = 1e-7, steps: int = 100_000) -> float:
    """The largest stable a = ηλ for τ-stale gradient descent, found by bisection.

    Each probe runs delayed GD and measures its growth rate (`growth_rate`): a probe is
    stable when |x| shrinks. The bracket starts at [1e-6, 2.5]. The result agrees with the
    closed form 2·sin(π/(4τ + 2)) (`models.delayed_gd_stable_step`) to about 1e-5.
    """
    tau = int(tau)
    lo, hi = 1e-6, 2.5
    if growth_rate(lo, tau, steps) >= 0 or growth_rate(hi, tau, steps) < 0:
        raise RuntimeError("the bisection bracket does not straddle the boundary")
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if growth_rate(mid, tau, steps) < 0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
