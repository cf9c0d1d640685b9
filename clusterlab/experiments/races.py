"""Lock-free updates: the experiments of notebook 06b.

Several OS processes (multiprocessing, fork) run SGD on ONE parameter vector that lives in
shared memory (a torch tensor after `share_memory_()`), Hogwild-style: no lock, each worker
reads the coordinates an example touches, computes its gradient, and writes the result back
(a read-modify-write). Next to the parameters the workers keep, just as non-atomically,

* a per-coordinate update counter, read with the parameters and written back with them:
  when two updates of one coordinate overlap, one write wins and the counter shows it
  (lost updates = expected increments - counted increments);
* per-coordinate version stamps written before (`begin`) and after (`end`) the values, as in
  a seqlock: a read that finds begin != end on any coordinate overlapped a write, so the
  values it got may mix two versions (a mixed, or torn, read).

Mode "inplace" is Hogwild as the paper and PyTorch's shared-memory training write it: the
worker subtracts its step from the shared coordinates in place, element by element
(`np.subtract.at`, as `optimizer.step()`'s `param.add_` does on a shared tensor), so an
update that lands meanwhile is not erased, except inside one element's load-to-store window:
rare, unless the worker is descheduled there, when its store erases every increment the
others made to that element during their time slice (up to thousands on the dense problem).
The write-back of mode "writeback" instead stores values computed from its (possibly old)
read, which erases everything that landed since.

Fixes, each measured for its cost (updates per second) and its effect: a lock around the
whole read-compute-write ("lock"); lock-free reads retried until consistent plus writes that
apply their delta under a short lock ("seqlock"); and synchronous data parallelism with an
all-reduce over `clusterlab.Cluster` (`sync_allreduce`), where no two writers ever meet.

Source: Niu, Recht, Ré & Wright, "Hogwild!: A Lock-Free Approach to Parallelizing Stochastic
Gradient Descent", NeurIPS 2011 (sparse problems converge nearly as fast as with a lock);
Lameter, "Effective synchronization on Linux/NUMA systems" (2005) for the seqlock.

`writeback_model` is the write-back scheme with no scheduler at all: an event model of
workers that each own a core and are never paused, for what write-backs lose by overlapping.

Public API: `make_problem`, `loss`, `hogwild`, `writeback_model`, `throughput`,
`sync_allreduce`.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import resource
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ..cores import usable_cores
from .common import use_or_open

__all__ = ["MODES", "Problem", "hogwild", "loss", "make_problem", "repeat_runs",
           "sync_allreduce", "throughput", "writeback_model"]

MODES = ("writeback", "inplace", "lock", "seqlock")
_ALIASES = {"none": "writeback"}  # the old name of the write-back mode


@dataclass(frozen=True)
class Problem:
    """Least squares min_x ½·mean_e (a_e·x - y_e)², each example touching `nnz` coordinates.

    idx: (examples, nnz) coordinates of each example; val: (examples, nnz) its values;
    y: (examples,) targets; x_star: the solution (y = A x_star exactly).
    """

    kind: str
    dim: int
    idx: np.ndarray
    val: np.ndarray
    y: np.ndarray
    x_star: np.ndarray

    @property
    def nnz(self) -> int:
        return self.idx.shape[1]

    @property
    def examples(self) -> int:
        return self.idx.shape[0]


def make_problem(kind: str = "dense", dim: int | None = None, nnz: int | None = None,
                 examples: int = 2000, seed: int = 0) -> Problem:
    """A seeded least-squares problem: "dense" (every example touches all `dim` = 32
    coordinates) or "sparse" (each touches `nnz` = 4 of `dim` = 10000). Rows are scaled to
    unit norm, so a learning rate below 1 is stable for a single worker."""
    if kind not in ("dense", "sparse"):
        raise ValueError(f"kind must be 'dense' or 'sparse', got {kind!r}")
    rng = np.random.default_rng([seed, 0 if kind == "dense" else 1])
    if kind == "dense":
        dim = dim or 32
        nnz = dim
        idx = np.tile(np.arange(dim), (examples, 1))
    else:
        dim = dim or 10_000
        nnz = nnz or 4
        idx = np.stack([rng.choice(dim, nnz, replace=False) for _ in range(examples)])
    val = rng.standard_normal((examples, nnz))
    val /= np.linalg.norm(val, axis=1, keepdims=True)
    x_star = rng.standard_normal(dim)
    y = (val * x_star[idx]).sum(axis=1)
    return Problem(kind, dim, idx, val, y, x_star)


def loss(problem: Problem, x: np.ndarray) -> float:
    """½·mean over examples of the squared residual at x (0 at the solution)."""
    r = (problem.val * np.asarray(x)[problem.idx]).sum(axis=1) - problem.y
    return float(0.5 * np.mean(r * r))


# ---------------------------------------------------------------------------------------------
# Hogwild: processes on shared memory.
# ---------------------------------------------------------------------------------------------


def _worker(w, problem, shared, lock, go, mode, updates, lr, seed):
    x, count, begin, end, stats, cpu, done = (t.numpy() for t in shared)
    idx_all, val_all, y_all = problem.idx, problem.val, problem.y
    order = np.random.default_rng([seed, w]).integers(0, problem.examples, updates)
    reads = mixed = retries = retried = 0  # retried: updates whose read needed >= 1 retry
    # writes after exactly one other update landed since the read, or two or more, and their
    # sum: with a write-back ("writeback") those updates are erased; otherwise they are only the
    # gradient's staleness (always 0 under the lock)
    one = big = big_sum = 0
    whole = problem.nnz == problem.dim  # every update writes every coordinate (dense)
    go.wait()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)  # this worker's context switches, from here
    t0 = time.monotonic()  # the workers time themselves: the parent only polls
    cpu0 = time.process_time()  # CPU this worker burns (a worker blocked on the lock burns none)
    for k, e in enumerate(order):
        idx, a = idx_all[e], val_all[e]
        stamp = (w + 1) * 10_000_000 + k + 1  # unique per update
        if mode == "lock":
            lock.acquire()
        spun = False
        while True:  # read: end stamps, values, counters, begin stamps (a seqlock's order)
            e_seen = end[idx]
            xv = x[idx]
            c = count[idx]
            b_seen = begin[idx]
            reads += 1
            # A write to these coordinates was in flight (begin != end), or (dense) the
            # coordinates carry the stamps of different updates: a mix of versions.
            if (b_seen != e_seen).any() or (whole and e_seen.min() != e_seen.max()):
                mixed += 1
                if mode == "seqlock":
                    retries += 1
                    spun = True
                    continue
            break
        retried += spun
        step = lr * (a @ xv - y_all[e]) * a  # the gradient of this example, times lr
        # The same bookkeeping in every mode, so that the modes differ only in how they write:
        # updates that landed on the first coordinate's counter since our read (racy, too).
        age = int(count[idx[0]] - c[0])
        if age == 1:
            one += 1
        elif age >= 2:
            big += 1
            big_sum += age
        if mode == "seqlock":
            with lock:  # apply the delta to the CURRENT values: no write is lost
                begin[idx] = stamp
                x[idx] -= step
                count[idx] += 1
                end[idx] = stamp
        elif mode == "inplace":  # Hogwild: subtract in place, element by element, no lock
            begin[idx] = stamp
            np.subtract.at(x, idx, step)
            np.add.at(count, idx, 1)
            end[idx] = stamp
        else:  # write back what we computed from what we read: a read-modify-write
            begin[idx] = stamp
            x[idx] = xv - step
            count[idx] = c + 1
            end[idx] = stamp
        done[w] = k + 1  # progress, published after every update (the loss samples read it)
        if mode == "lock":
            lock.release()
        if (k & 255) == 255 or k == updates - 1:
            stats[w] = (k + 1, reads, mixed, retries, one, big, big_sum, retried)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu[w] = (time.process_time() - cpu0, t0, time.monotonic(),
              ru1.ru_nivcsw - ru0.ru_nivcsw, ru1.ru_nvcsw - ru0.ru_nvcsw)


def hogwild(
    problem: Problem | str = "dense",
    workers: int = 4,
    updates: int = 20_000,
    lr: float = 0.1,
    mode: str = "writeback",
    seed: int = 0,
    *,
    sample_every_s: float = 0.005,
    timeout: float = 60,
) -> dict:
    """`workers` processes each run `updates` SGD steps on one shared parameter vector.

    problem: a `Problem` or "dense"/"sparse" (`make_problem` with defaults).
    mode: "writeback" (lock-free read-modify-write: write back values computed from the read),
    "inplace" (Hogwild: subtract the step in place, element by element), "lock" (a
    multiprocessing.Lock held across read, gradient and write), "seqlock" (reads retried
    until no write overlapped them, writes apply their delta under a lock held only for the
    write).
    Every worker picks examples from its own seeded stream and publishes how many updates it
    has done after each one. The parent samples the loss every `sample_every_s` while the
    workers run: it reads the total of those counts, copies the parameters, and reads the
    total again. No process outlives the call: workers
    still alive after `timeout` s are terminated, then killed, and the call raises.

    Returns a dict: mode, kind, workers, updates (total), expected (coordinate increments
    that should have happened), counted, lost (= expected - counted), lost_fraction,
    reads (read attempts, retries included), mixed_reads, mixed_fraction, retries (every
    retry of a seqlock read, so one update's read can count several), retried_reads (updates
    whose read needed at least one retry); for mode "writeback", from a racy look at the
    first touched coordinate's counter just before each write-back: overwrote_one (write-
    backs that found exactly one update landed since their read), rollbacks (two or more)
    and rollback_mean (updates found per rollback). That counter is itself written back, so
    these say how stale the write-backs were, not exactly what each one erased;
    age_mean (updates that landed between a worker's read and its write, per update, on the
    same racy counter: erased by a write-back, only staleness otherwise; 0 under the lock);
    switches_involuntary / switches_voluntary (context switches of all workers while they
    ran, getrusage: the scheduler took the CPU away / the worker blocked);
    elapsed_s (the first worker's start to the
    last worker's finish, timed by the workers: the parent only polls), updates_per_s, cpu_s
    (CPU seconds of all workers), parallelism (cpu_s / elapsed_s: how many workers ran at
    once, on average), curve_t, curve_loss (the sampled loss), curve_updates (updates done
    just before the sample's copy of the parameters), curve_updates_after (just after it: the
    copy holds between the two counts of updates, an update in flight possibly in part),
    initial_loss, final_loss; lr and seed as given.
    """
    mode = _ALIASES.get(mode, mode)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if isinstance(problem, str):
        problem = make_problem(problem)
    ctx = mp.get_context("fork")
    x = torch.zeros(problem.dim, dtype=torch.float64).share_memory_()
    count = torch.zeros(problem.dim, dtype=torch.int64).share_memory_()
    begin = torch.zeros(problem.dim, dtype=torch.int64).share_memory_()
    end = torch.zeros(problem.dim, dtype=torch.int64).share_memory_()
    stats = torch.zeros((workers, 8), dtype=torch.int64).share_memory_()
    done = torch.zeros(workers, dtype=torch.int64).share_memory_()  # updates done, per worker
    # cpu s, start, end, involuntary and voluntary context switches
    cpu = torch.zeros((workers, 5), dtype=torch.float64).share_memory_()
    shared = (x, count, begin, end, stats, cpu, done)
    lock, go = ctx.Lock(), ctx.Event()
    procs = [ctx.Process(target=_worker, name=f"hogwild-{w}", daemon=True,
                         args=(w, problem, shared, lock, go, mode, updates, lr, seed))
             for w in range(workers)]
    xn, sn, dn = x.numpy(), stats.numpy(), done.numpy()
    initial = loss(problem, xn)
    curve_t, curve_u, curve_u2, curve_l = [0.0], [0], [0], [initial]
    try:
        for p in procs:
            p.start()
        time.sleep(0.05)  # let every worker reach the starting line
        t0 = time.monotonic()
        go.set()
        deadline = t0 + timeout
        while any(p.is_alive() for p in procs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"hogwild workers still running after {timeout} s")
            time.sleep(sample_every_s)
            curve_t.append(time.monotonic() - t0)
            curve_u.append(int(dn.sum()))
            snap = xn.copy()
            curve_u2.append(int(dn.sum()))
            curve_l.append(loss(problem, snap))
        for p in procs:
            p.join()
        bad = [p.exitcode for p in procs if p.exitcode != 0]
        if bad:
            raise RuntimeError(f"hogwild workers failed with exit codes {bad}")
    finally:
        for p in procs:
            if p.is_alive():
                with contextlib.suppress(Exception):
                    p.terminate()
        for p in procs:
            with contextlib.suppress(Exception):
                p.join(1.0)
                if p.is_alive():
                    p.kill()
                    p.join(1.0)
    total = workers * updates
    expected = total * problem.nnz
    counted = int(count.sum())
    times = cpu.numpy()
    cpu_s = float(times[:, 0].sum())
    elapsed = float(times[:, 2].max() - times[:, 1].min())  # first start to last finish
    reads, mixed, retries, one, big, big_sum, retried = (int(v) for v in sn[:, 1:].sum(axis=0))
    final = loss(problem, xn)
    curve_t.append(elapsed)
    curve_u.append(total)
    curve_u2.append(total)
    curve_l.append(final)
    return {
        "mode": mode, "kind": problem.kind, "workers": workers, "updates": total,
        "lr": lr, "seed": seed,
        "expected": expected, "counted": counted, "lost": expected - counted,
        "lost_fraction": (expected - counted) / expected,
        "reads": reads, "mixed_reads": mixed, "mixed_fraction": mixed / max(reads, 1),
        "retries": retries, "retried_reads": retried,
        "overwrote_one": one if mode == "writeback" else 0,
        "rollbacks": big if mode == "writeback" else 0,
        "rollback_mean": big_sum / big if big and mode == "writeback" else 0.0,
        "age_mean": (one + big_sum) / total,
        "switches_involuntary": int(times[:, 3].sum()),
        "switches_voluntary": int(times[:, 4].sum()),
        "elapsed_s": elapsed, "updates_per_s": total / elapsed,
        "cpu_s": cpu_s, "parallelism": cpu_s / elapsed,
        "curve_t": np.array(curve_t), "curve_updates": np.array(curve_u),
        "curve_updates_after": np.array(curve_u2),
        "curve_loss": np.array(curve_l), "initial_loss": initial, "final_loss": final,
    }


def repeat_runs(problem: Problem, *, modes: tuple[str, ...], workers: tuple[int, ...],
            total_updates: int, lr: float, repeats: int = 3, reuse: dict | None = None) -> dict:
    """{(mode, W): [`repeats` runs of `hogwild`, seeds 0, 1, ...]}: each mode with each number
    of workers, `total_updates` split among them. A run in `reuse` ({(kind, mode): run}, as a
    notebook keeps its first runs) made with the same settings and seed 0 stands in for that
    seed's run, so that the run later sections read is one of the repeats shown."""
    out = {}
    for m in modes:
        for w in workers:
            runs = []
            for s in range(repeats):
                old = (reuse or {}).get((problem.kind, m))
                same = old is not None and s == 0 and (old["workers"], old["updates"], old["lr"],
                                                       old["seed"]) == (w, (total_updates // w)
                                                                        * w, lr, 0)
                runs.append(old if same else hogwild(problem, workers=w,
                                                     updates=total_updates // w, lr=lr, mode=m,
                                                     seed=s))
            out[m, w] = runs
    return out


def writeback_model(workers: int = 4, window: float = 0.8, updates: int = 8_000,
                    jitter: float = 0.1, seed: int = 0) -> dict:
    """Write-backs with no pauses: an event model of `workers` workers, each on its own core.

    Every worker loops with a period of 1 (times 1 + `jitter` x a standard normal, at least
    0.1), starting at a random phase: it reads the parameters at the start of a loop and
    writes back `window` of a loop later, its read snapshot plus its own update; nothing is
    ever descheduled. Each write-back makes a new version: the one it read plus its update, so
    the updates in the final version are a chain of write-backs, each of which read its
    predecessor's result. `updates` in all, split over the workers.

    Returns {"workers", "window", "updates", "lost_fraction" (updates missing from the final
    version, exactly), "bound" ((workers - 1) / workers)}.
    """
    if workers < 1 or not 0 < window <= 1:
        raise ValueError("need workers >= 1 and 0 < window <= 1")
    rng = np.random.default_rng(seed)
    per = max(1, updates // workers)
    events = []  # (time, 0 = write / 1 = read, worker): at one instant a write goes first
    for w in range(workers):
        t = rng.random()
        for period in np.maximum(0.1, 1 + jitter * rng.standard_normal(per)):
            events += [(t, 1, w), (t + window * period, 0, w)]
            t += period
    events.sort()
    current, snap = 0, [0] * workers  # the updates each version holds: its chain's length
    total = 0
    for _, kind, w in events:
        if kind == 1:
            snap[w] = current
        else:
            current = snap[w] + 1  # what was read, plus this update: the rest is erased
            total += 1
    return {"workers": workers, "window": window, "updates": total,
            "lost_fraction": 1 - current / total, "bound": (workers - 1) / workers}


# ---------------------------------------------------------------------------------------------
# The synchronous alternative: every rank computes, one all-reduce, everyone applies.
# ---------------------------------------------------------------------------------------------


def _sync_rank(problem, updates, batch, lr, seed):
    rank, world = dist.get_rank(), dist.get_world_size()
    x = np.zeros(problem.dim)
    counts = torch.zeros(problem.dim, dtype=torch.float64)
    order = np.random.default_rng([seed, rank]).integers(0, problem.examples, updates)
    g = torch.zeros(problem.dim, dtype=torch.float64)
    gn = g.numpy()
    curve_u, curve_l = [0], [loss(problem, x)]
    dist.barrier()
    t0 = time.monotonic()
    for s in range(0, updates, batch):
        ex = order[s:s + batch]
        idx, a = problem.idx[ex], problem.val[ex]
        r = (a * x[idx]).sum(axis=1) - problem.y[ex]
        gn[:] = 0
        np.add.at(gn, idx.ravel(), (r[:, None] * a).ravel())
        np.add.at(counts.numpy(), idx.ravel(), 1.0)
        dist.all_reduce(g)  # the sum of every rank's gradients: one consistent update
        x -= lr * gn / world  # each rank applies the same step to its own replica
        if rank == 0 and (s // batch) % 4 == 3:
            curve_u.append((s + len(ex)) * world)
            curve_l.append(loss(problem, x))
    elapsed = time.monotonic() - t0
    dist.all_reduce(counts)
    return {"x": x, "elapsed": elapsed, "counts": counts.numpy(), "curve_u": curve_u,
            "curve_l": curve_l}


def sync_allreduce(
    problem: Problem | str = "dense",
    workers: int = 4,
    updates: int = 2_000,
    batch: int = 32,
    lr: float = 0.1,
    seed: int = 0,
    *,
    nic: str | None = "delay 100us",
    cluster=None,
    timeout: float = 60,
) -> dict:
    """Synchronous data parallelism on a `clusterlab.Cluster` of `workers` ranks.

    Each rank keeps its own replica of x, takes `batch` examples per step from its seeded
    stream, and all-reduces the summed gradient through the emulated network `nic`; every
    rank applies x -= lr·(sum of all ranks' example gradients)/workers: ONE parameter update
    per step, as large as `batch` sequential Hogwild updates taken from a single point.
    Examples per worker: `updates`. Coordinate counts are all-reduced too, so lost
    increments are counted per example the same way as in `hogwild` (and are 0: no two
    writers ever share memory).

    Returns the keys of `hogwild` that apply (mixed_reads and retries are 0 by
    construction; "updates" counts examples, as the lost-update accounting does) plus
    examples, steps (parameter updates actually applied), examples_per_s, steps_per_s and
    replicas_agree (every rank's x has the same bytes).
    """
    if isinstance(problem, str):
        problem = make_problem(problem)
    with use_or_open(cluster, nodes=workers, nic=nic, seed=seed, timeout=timeout) as cl:
        out = cl.run(_sync_rank, problem, updates, batch, lr, seed)
    total = workers * updates
    expected = total * problem.nnz
    counted = int(round(out[0]["counts"].sum()))
    elapsed = max(o["elapsed"] for o in out)
    replicas_agree = all(np.array_equal(o["x"], out[0]["x"]) for o in out)
    return {
        "mode": "allreduce", "kind": problem.kind, "workers": workers, "updates": total,
        "expected": expected, "counted": counted, "lost": expected - counted,
        "lost_fraction": (expected - counted) / expected,
        "reads": total, "mixed_reads": 0, "mixed_fraction": 0.0, "retries": 0, "retried_reads": 0,
        "elapsed_s": elapsed, "examples": total, "batch": batch, "steps": -(-updates // batch),
        "examples_per_s": total / elapsed, "steps_per_s": -(-updates // batch) / elapsed,
        "curve_updates": np.array(out[0]["curve_u"]), "curve_loss": np.array(out[0]["curve_l"]),
        "initial_loss": float(out[0]["curve_l"][0]), "final_loss": loss(problem, out[0]["x"]),
        "replicas_agree": replicas_agree, "nic": nic if cluster is None else None,
    }


def throughput(
    problem: Problem | str = "dense",
    workers: tuple[int, ...] = (1, 2, 4),
    modes: tuple[str, ...] = MODES,
    *,
    total_updates: int = 8000,
    repeats: int = 3,
    lr: float = 0.05,
    seed: int = 0,
) -> dict:
    """Updates per second of each `mode` with each number of `workers`, `repeats` times.

    The same `total_updates` are split over the workers, and the runs are interleaved
    (repeat 1 of every configuration, then repeat 2, ...), so that a burst of load from
    other processes on the machine hits every configuration alike; the medians are what to
    compare. Parallelism is the workers' CPU seconds per second of wall time: about 1 when
    a lock lets one worker run at a time, up to the number of free cores without one.

    Returns {"workers", "modes", "repeats", "cores", "rate": {mode: [[per repeat] per W]},
    "median": {mode: [median updates/s per W]}, "lost_fraction": {mode: [[per repeat] per
    W]}, "useful_median": {mode: [median over repeats of updates/s x (1 - lost_fraction),
    the updates that survived, per W]}, "parallelism": {mode: [median per W]},
    "cpu_us_per_update": {mode: [median CPU µs per update per W]}, "median_run": {mode:
    [(updates/s, parallelism, CPU µs per update) of the median-rate repeat, per W]}}.
    updates/s = parallelism / CPU seconds per update, exactly, within one run.
    """
    if isinstance(problem, str):
        problem = make_problem(problem)
    rate = {m: [[] for _ in workers] for m in modes}
    par = {m: [[] for _ in workers] for m in modes}
    cpu = {m: [[] for _ in workers] for m in modes}
    lost = {m: [[] for _ in workers] for m in modes}
    for rep in range(repeats):
        for i, w in enumerate(workers):
            for m in modes:
                r = hogwild(problem, workers=w, updates=max(1, total_updates // w), lr=lr,
                            mode=m, seed=seed + rep, sample_every_s=0.05)
                rate[m][i].append(r["updates_per_s"])
                par[m][i].append(r["parallelism"])
                cpu[m][i].append(1e6 * r["cpu_s"] / r["updates"])
                lost[m][i].append(r["lost_fraction"])
    return {
        "workers": list(workers), "modes": list(modes), "repeats": repeats,
        "cores": usable_cores(),
        "rate": rate,
        "median": {m: [float(np.median(v)) for v in rate[m]] for m in modes},
        "lost_fraction": lost,
        # updates that survived (not erased by a later write-back), per second, run by run
        "useful_median": {m: [float(np.median(np.multiply(rate[m][i], np.subtract(1, lost[m][i]))))
                              for i in range(len(workers))] for m in modes},
        "parallelism": {m: [float(np.median(v)) for v in par[m]] for m in modes},
        "cpu_us_per_update": {m: [float(np.median(v)) for v in cpu[m]] for m in modes},
        # rate = parallelism / CPU per update holds exactly within one run: the median run's
        "median_run": {m: [_median_run(rate[m][i], par[m][i], cpu[m][i])
                           for i in range(len(workers))] for m in modes},
    }


def _median_run(rates, pars, cpus):
    """(updates/s, parallelism, CPU µs per update) of the repeat whose rate is the median."""
    k = int(np.argsort(rates)[len(rates) // 2])
    return float(rates[k]), float(pars[k]), float(cpus[k])
