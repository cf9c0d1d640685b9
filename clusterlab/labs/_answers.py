"""The checks' reference answers, kept out of the lab modules.

The lab notebooks import their lab's module (`from clusterlab.labs import races as lab`,
`ddp as lab`, ...), so anything defined there is one attribute away from a learner's kernel.
The reference answers the checks need (to calibrate a measurement, to compute a truth, to
compare a timeline) live here instead, and the checks import them inside their functions.
This module is no secret - the package's source is on the learner's disk - but no lab
imports it, and no notebook names it.

Not for learners: these are the solutions of labs 02, 03, 04 and 06.
"""

from __future__ import annotations

import math
import os

import numpy as np

from .. import models

# --- lab 06 (races): the three updates and the price ----------------------------------------


def reference_hogwild(p, idx, step):
    """Step 1: read, step, write back, with no lock (a read-modify-write that races)."""
    xv = p.x[idx]
    p.x[idx] = xv + step(xv)


def reference_locked(p, idx, step):
    """Step 2: the same read-modify-write inside one critical section."""
    with p.lock:
        xv = p.x[idx]
        p.x[idx] = xv + step(xv)


def reference_seqlock(p, idx, step):
    """Step 3: read without a lock, retried until no write overlapped it; then add the
    step to the current values under a short lock, the version odd while writing."""
    while True:
        v = p.seq[0]
        if v % 2 == 0:  # no write in progress
            xv = p.x[idx]
            if p.seq[0] == v:  # and none started or finished while we copied
                break
        os.sched_yield()  # let the writer we wait for run (more workers than cores)
    d = step(xv)  # the long part, outside any lock
    with p.lock:
        p.seq[0] += 1
        p.x[idx] += d
        p.seq[0] += 1


def reference_price(run_safe, run_unsafe, repeats=5):
    """Step 4: interleaved pairs, one ratio per pair, the median and every sample."""
    samples = []
    for _ in range(repeats):
        unsafe = run_unsafe()
        safe = run_safe()
        samples.append(safe / unsafe)
    return {"ratio": float(np.median(samples)), "samples": samples}


# --- lab 03 (ddp): the FIFO timeline -----------------------------------------------------------


def reference_fifo(ready_s, comm_s) -> list[tuple[float, float]]:
    """A FIFO stream: message i starts when it is ready AND message i-1 has completed."""
    out, free = [], -np.inf
    for ready, comm in zip(ready_s, comm_s):
        start = max(float(ready), free)
        free = start + float(comm)
        out.append((start, free))
    return out


# --- lab 04 (collapse): E[max] and the chain predictor -----------------------------------------


def _Z() -> np.ndarray:
    from .collapse import _Z as z

    return z


def expected_max(values, n: int) -> float:
    """Exact E[max of n iid draws] of equally likely `values`: sum_k v_(k) [F_k^n - F_(k-1)^n]
    with F_k = (k + 1)/M over the sorted values (order statistics; ties included)."""
    v = np.sort(np.asarray(values, dtype=np.float64).ravel())
    cdf = np.arange(len(v) + 1, dtype=np.float64) / len(v)
    return float(np.dot(v, np.diff(cdf ** n)))


def reference_step(setup, emax=expected_max) -> float:
    """The chain predictor: E[max over ranks of (compute_i + chain_i)], each chain the sum of
    2(p-1) message delays taken as normal (mean 2(p-1)E[d], std sqrt(2(p-1)) std(d))."""
    comp = setup.compute_values()
    p = setup.ranks
    if p == 1:
        return emax(comp, 1)
    d = setup.delay_values()
    rounds = 2 * (p - 1)
    spread = math.sqrt(rounds) * d.std()
    per_rank = comp[::16, None] + spread * _Z()[None, :]  # 256 x 256 equally likely finishes
    return rounds * float(d.mean()) + emax(per_rank.ravel(), p)


# --- lab 02 (ring): the alpha-beta crossover --------------------------------------------------


def crossover(p: int, alpha: float, beta: float) -> float:
    """The message size (bytes) above which the ring beats recursive doubling in the
    alpha-beta model (`clusterlab.models`); math.inf when it never does."""
    lat_r, bw_r = models.ring_allreduce(p, 0, alpha, beta), models.ring_allreduce(p, 1, 0, beta)
    lat_d = models.recursive_doubling_allreduce(p, 0, alpha, beta)
    bw_d = models.recursive_doubling_allreduce(p, 1, 0, beta)
    if bw_d <= bw_r:
        return math.inf
    return max(0.0, (lat_r - lat_d) / (bw_d - bw_r))
