"""Lab 05: backup workers against stragglers, and the stability limit of stale gradients.

The staircase (notebook 05 comes first):

1. `straggler_wait_all`: the naive synchronous step. Every rank computes for c + Exp(m) (a
   seeded sleep, on real ranks) and all-reduces: the step waits for the slowest of N, and
   its mean is c + m·H_N.
2. `straggler_backups`: N workers and a coordinator (rank 0). The coordinator uses the
   first N - b gradients to ARRIVE, sends their average to everyone, and the b late workers
   stop computing when it reaches them. The wait drops to the (N - b)-th arrival:
   c + m·(H_N - H_b). Checked: the exact average of exactly those gradients, the same on
   every rank, and the saving measured against the formula with a confidence interval.
3. `stale_stability`: gradient descent on a quadratic with τ-step-stale gradients, judged
   by simulation, and a bisection for the largest stable learning rate, checked against
   2 sin(π/(4τ+2)) / curvature (`models.delayed_gd_stable_step`).
4. `stale_explain`: how that limit scales for large τ, and why.

How the checks see what happened: every worker's gradient carries a one-hot tag in its
first N entries (worker i has a 1 at i), so the update a rank returns tells which
gradients it averaged (the tags that are non-zero) and what it divided by (their value).
`compute` records when each gradient was really ready (on the clock all ranks share), so
the checks know which workers finished first, and how long each step waited for its
gradients (the measured order statistic) and for the coordination after them.

The timing checks judge two things. The mechanism, from the recorded times: did a step
with backups end before its slowest worker finished (were the late ones cut short), and
did the coordination after the first N - b gradients stay small next to the tail it
should cut? And the formula: the measured wait against c + m·H_N or c + m·(H_N - H_b),
within a 99.9% normal confidence interval from the per-step spread plus a small allowance
for this machine's scheduling. Backups are measured paired (the same draws with and
without them), which narrows the interval of the saving.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time

import numpy as np
import torch
import torch.distributed as dist

from .. import clock, models
from ..cluster import Cluster
from ..experiments.common import use_or_open
from ..experiments.staleness import backup_step_prediction, compute_draws
from .core import Fail, Lab, shorten

LAB = Lab("05_backups_and_staleness", "Backup workers and stale gradients",
          follows="05_stragglers_and_staleness")

NIC = "delay 100us"  # the visible checks' network; hidden ones draw from HIDDEN_NICS
HIDDEN_NICS = ("delay 100us", "delay 1ms 100us", "delay 500us rate 1gbit")
PAYLOAD = 8  # random entries after the one-hot tags: the average must be exact on them too
Z999 = 3.29  # two-sided 99.9% normal quantile: a correct answer fails 1 seed in 1000
ORDER_SLACK_S = 0.005  # arrivals closer than this may swap (scheduling on a busy machine)


# ---------------------------------------------------------------------------------------------
# What the learner's rank code uses: compute (a sleep that an update can cut short).
# ---------------------------------------------------------------------------------------------


class Update:
    """The coordinator's update for this step, received in the background.

    `Update(like, src=0)` posts the receive at once (a tensor shaped like `like`);
    `arrived()` says whether it is in; `wait()` blocks until it is and returns the tensor.
    Pass it to `compute(..., interrupt=update)` to stop computing when it arrives. Always
    call `wait()` rather than waiting on the underlying work yourself: one thread waits.
    """

    def __init__(self, like: torch.Tensor, src: int = 0) -> None:
        self.tensor = torch.empty_like(like)
        self._event = threading.Event()
        work = dist.irecv(self.tensor, src)
        self._thread = threading.Thread(target=self._wait_for, args=(work,), daemon=True)
        self._thread.start()

    def _wait_for(self, work) -> None:
        work.wait()
        self._event.set()

    def arrived(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float = 30.0) -> torch.Tensor:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the update did not arrive within {timeout:g} s: did the "
                               "coordinator send it to this rank?")
        return self.tensor


def compute(seconds: float, interrupt: Update | None = None) -> bool:
    """Compute a gradient for `seconds` (a sleep standing in for forward + backward).

    With `interrupt` (an `Update`), stop as soon as it arrives: the coordinator has moved
    on and this gradient would be thrown away. Returns True if the compute finished, False
    if it was cut short.
    """
    seconds = max(0.0, float(seconds)) * clock.dilation()
    if interrupt is None:
        time.sleep(seconds)
        finished = True
    else:
        finished = not interrupt._event.wait(seconds)
        if not finished and _STAGE["late_send_s"]:
            # A staged race (checks only): this cut-short worker's message leaves late, after
            # an early worker's next gradient. Whoever drains late messages by source is
            # unaffected; an any-source drain takes the early worker's next gradient instead.
            time.sleep(_STAGE["late_send_s"] * clock.dilation())
    # The checks read when each worker's gradient was really ready (sleeps overshoot on a
    # busy machine), to know who arrived first.
    _LAST_COMPUTE["done_at"] = clock.now() if finished else math.inf
    return finished


_LAST_COMPUTE: dict = {}
_STAGE = {"late_send_s": 0.0}  # set by the checks on the ranks (see compute)
STAGED_LATE_S = 0.1  # > the slowest designed compute (35 ms at N = 4) plus a busy machine's lag


# ---------------------------------------------------------------------------------------------
# Rank side: run the learner's step on every rank, step after step, and time it.
# ---------------------------------------------------------------------------------------------


def tagged_gradient(seed: int, step: int, worker: int, workers: int) -> torch.Tensor:
    """Worker `worker`'s gradient at `step`: a one-hot tag (which worker), then a payload."""
    g = torch.zeros(workers + PAYLOAD, dtype=torch.float64)
    g[worker] = 1.0
    rng = np.random.default_rng([seed, step, worker])
    g[workers:] = torch.from_numpy(rng.standard_normal(PAYLOAD))
    return g


def _rank_steps(fn, draws: np.ndarray, seed: int, backups: int | None,
                stage_s: float = 0.0) -> dict:
    """Call the learner's step once per row of `draws`, back to back, as a training loop.

    Synchronous (backups None): every rank is a worker. With backups: rank 0 coordinates
    (no gradient: zeros, compute 0) and ranks 1..N are workers 0..N-1. The ranks start
    together (one barrier); from then on the step itself paces the loop, as in training.
    Returns the loop's start, each call's start and end, and when the rank's compute
    finished (inf: cut short; nan: compute() was not called) - all on the shared clock.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    workers = world if backups is None else world - 1
    worker = rank if backups is None else rank - 1
    steps = draws.shape[0]
    if worker >= 0:
        grads = [tagged_gradient(seed, k, worker, workers) for k in range(steps)]
        seconds = [float(draws[k, worker]) for k in range(steps)]
    else:
        grads = [torch.zeros(workers + PAYLOAD, dtype=torch.float64)] * steps
        seconds = [0.0] * steps
    begin, end, done, outs = np.empty(steps), np.empty(steps), np.full(steps, np.nan), []
    dist.barrier()
    start = clock.now()
    _STAGE["late_send_s"] = float(stage_s)
    try:
        for k in range(steps):
            _LAST_COMPUTE.clear()
            args = (grads[k].clone(), seconds[k]) + (() if backups is None else (backups,))
            begin[k] = clock.now()
            out = fn(*args)
            end[k] = clock.now()
            done[k] = _LAST_COMPUTE.get("done_at", np.nan)
            outs.append(out.detach().clone() if isinstance(out, torch.Tensor) else out)
    finally:
        _STAGE["late_send_s"] = 0.0
    return {"start": start, "begin": begin, "end": end, "done": done, "out": outs}


def _run(ctx, cl, fn, draws, seed, backups=None, stage_s: float = 0.0) -> dict:
    """Run on every rank (through the check context when there is one, so the learner's
    failures become sentences). Returns step_s (steps,): rank 0's loop period, one return
    to the next; begin/end/done (steps, world) on the shared clock; out[rank][step].
    stage_s: delay each cut-short worker's message by this much (a staged race)."""
    args = (_rank_steps, fn, draws, seed, backups, stage_s)
    res = ctx.run(cl, *args) if ctx is not None else cl.run(*args)
    ends0 = res[0]["end"]
    return {"step_s": np.diff(np.concatenate([[res[0]["start"]], ends0])),
            "begin": np.stack([r["begin"] for r in res], axis=1),
            "end": np.stack([r["end"] for r in res], axis=1),
            "done": np.stack([r["done"] for r in res], axis=1),
            "out": [r["out"] for r in res]}


def _order_stat(run: dict, b: int, first: int) -> np.ndarray:
    """Per step: the (N-b)-th shortest compute the workers really did (compute() measured
    it: sleeps overshoot on a busy machine), i.e. how long the step had to wait for its
    gradients. Workers are columns first.. of the run; nan where compute() was not called."""
    took = run["done"][:, first:] - run["begin"][:, first:]
    n = took.shape[1]
    return np.sort(took, axis=1)[:, n - b - 1]  # inf (cut short) sorts last, nan after


def _use_or_open(ctx, cluster, world: int, nic, seed: int):
    """The caller's open cluster (it must have `world` ranks), or a new one: the check
    context's (its short timeout) in a check, else one with a 30 s timeout."""
    start = ctx.cluster if ctx is not None else functools.partial(Cluster, timeout=30)
    return use_or_open(cluster, ranks=world, start=start, nodes=world, nic=nic, seed=seed)


# ---------------------------------------------------------------------------------------------
# Measurements: the notebook's cells and the checks run the same code.
# ---------------------------------------------------------------------------------------------


def measure_sync(sync_step, nodes: int, compute_s: float, exp_mean_s: float, steps: int = 30,
                 seed: int = 0, *, nic: str | None = NIC, calib_steps: int = 5, draws=None,
                 cluster=None, _ctx=None, _after=None) -> dict:
    """Run `sync_step(grad, compute_s)` on `nodes` real ranks, `steps` times in a row.

    Compute times are `staleness.compute_draws` (c + Exp(m), seeded per rank) unless
    `draws` (steps, nodes) is given. A step's time is rank 0's loop period (from one
    return of `sync_step` to the next). First, `calib_steps` steps with no compute measure
    what the aggregation alone costs (the overhead).

    Returns a dict: step_s (steps,), overhead_s (median calibration step), wait_s = step_s -
    overhead_s, sample_s (steps,) = the largest draw of each step (the order statistic of
    this very sample), draws, and the per-rank begin/end/done times and outputs (run).
    """
    if draws is None:
        draws = compute_draws(nodes, steps, compute_s, exp_mean_s, seed)
    with _use_or_open(_ctx, cluster, nodes, nic, seed) as cl:
        overhead = 0.0
        if calib_steps:
            cal = _run(_ctx, cl, sync_step, np.zeros((calib_steps, nodes)), seed)
            overhead = float(np.median(cal["step_s"]))
            if _after:
                _after({"nodes": nodes, "steps": calib_steps, "seed": seed, "out": cal["out"]})
        run = _run(_ctx, cl, sync_step, draws, seed)
    wait = _order_stat(run, 0, first=0)
    return {"nodes": nodes, "compute_s": compute_s, "exp_mean_s": exp_mean_s,
            "steps": len(draws), "seed": seed, "step_s": run["step_s"],
            "overhead_s": overhead, "wait_s": wait, "lag_s": run["step_s"] - wait,
            "sample_s": draws.max(axis=1), "draws": draws, "run": run, "out": run["out"]}


def measure_backups(backup_step, nodes: int, backups, compute_s: float, exp_mean_s: float,
                    steps: int = 40, seed: int = 0, *, nic: str | None = NIC,
                    calib_steps: int = 5, draws=None, cluster=None, _ctx=None,
                    _after=None, _stage_s: float = 0.0) -> dict:
    """Run `backup_step(grad, compute_s, b)` on `nodes` workers + a coordinator (rank 0),
    `steps` times in a row for each b in `backups`, on the SAME draws (so a saving is
    paired step by step).

    A step's time is the coordinator's loop period (one return to the next): with b
    backups the next step can start once the first N - b gradients are in and the late
    workers have stopped. The overhead is measured with no compute, with the largest b.
    Returns {b: dict(step_s; wait_s = the (N-b)-th shortest compute
    measured on the workers; lag_s = step_s - wait_s; sample_s = the (N-b)-th smallest draw;
    run = per-rank begin/end/done/out)}, overhead_s (median step with no compute),
    draws, and the parameters.
    """
    backups = [int(b) for b in backups]
    for b in backups:
        if not 0 <= b < nodes:
            raise ValueError(f"backups must be in 0..{nodes - 1}, got {b}")
    if draws is None:
        draws = compute_draws(nodes, steps, compute_s, exp_mean_s, seed)
    out: dict = {"nodes": nodes, "compute_s": compute_s, "exp_mean_s": exp_mean_s,
                 "steps": len(draws), "draws": draws, "seed": seed, "overhead_s": 0.0}
    ordered = np.sort(draws, axis=1)
    with _use_or_open(_ctx, cluster, nodes + 1, nic, seed) as cl:
        if calib_steps:
            zero = np.zeros((calib_steps, nodes))
            cal = _run(_ctx, cl, backup_step, zero, seed, max(backups))
            out["overhead_s"] = float(np.median(cal["step_s"]))
            if _after:
                _after({**out, "steps": calib_steps, "draws": zero,
                        max(backups): {"run": cal, "out": cal["out"]}}, max(backups))
        for b in backups:
            run = _run(_ctx, cl, backup_step, draws, seed, b, _stage_s)
            wait = _order_stat(run, b, first=1)
            out[b] = {"step_s": run["step_s"], "wait_s": wait, "lag_s": run["step_s"] - wait,
                      "sample_s": ordered[:, nodes - b - 1], "run": run, "out": run["out"]}
            if _after:
                _after(out, b)
    return out


def paired_saving(m: dict, b: int) -> dict:
    """What b backups saved per step against b = 0, on the same draws, step by step.

    wait: the saving in the wait for gradients (the measured order statistic: what
    c + m·(H_N - H_b) predicts); step: the saving in the whole step (the wait minus what the
    coordination added). Each has n, mean_s, se_s, ci95_s and ci999_s (normal intervals from
    the per-step differences). sample_s: the saving of the draws themselves.
    """
    out = {"n": m["steps"],
           "sample_s": float((m[0]["sample_s"] - m[b]["sample_s"]).mean())}
    for key, series in (("wait", "wait_s"), ("step", "step_s")):
        d = m[0][series] - m[b][series]
        n = len(d)
        mean = float(d.mean())
        se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
        out[key] = {"n": n, "mean_s": mean, "se_s": se,
                    "ci95_s": (mean - 1.96 * se, mean + 1.96 * se),
                    "ci999_s": (mean - Z999 * se, mean + Z999 * se)}
    return out


# ---------------------------------------------------------------------------------------------
# Reading an update: which gradients it averages, and what it divided by.
# ---------------------------------------------------------------------------------------------


def _as_update(out, rank: int, step: int, size: int) -> torch.Tensor:
    if out is None:
        raise Fail(f"rank {rank} returned None at step {step}: every rank (the coordinator "
                   "and the late workers too) must return the update")
    if not isinstance(out, torch.Tensor):
        raise Fail(f"rank {rank} returned a {type(out).__name__}, not a tensor: return the "
                   "averaged gradient")
    if out.numel() != size:
        raise Fail(f"rank {rank} returned a tensor of {out.numel()} values; the gradient "
                   f"has {size}: return the update, shaped like grad")
    return out.detach().reshape(-1).to(torch.float64)


def _names(workers) -> str:
    return ", ".join(str(w) for w in workers)


def _describe(update: torch.Tensor, workers: int) -> tuple[list[int], np.ndarray]:
    tags = update[:workers].numpy()
    used = [i for i in range(workers) if abs(tags[i]) > 1e-9]
    return used, tags


def _payload_mean(seed: int, step: int, used, workers: int) -> torch.Tensor:
    return torch.stack([tagged_gradient(seed, step, i, workers)[workers:]
                        for i in used]).mean(dim=0)


def _check_sync_values(m: dict) -> None:
    """Every rank's result must be the average of the N gradients of that step."""
    n = m["nodes"]
    size = n + PAYLOAD
    for k in range(m["steps"]):
        for r in range(n):
            u = _as_update(m["out"][r][k], r, k, size)
            used, tags = _describe(u, n)
            if len(used) == n and np.allclose(tags, 1 / n, rtol=1e-12, atol=0):
                want = _payload_mean(m["seed"], k, range(n), n)
                if not torch.allclose(u[n:], want, rtol=1e-9, atol=1e-12):
                    raise Fail(f"rank {r} at step {k}: the update averages the right gradients"
                               " by count but not their values (a gradient from another "
                               "step?)")
                continue
            if used == [r] and abs(tags[r] - 1) < 1e-9:
                raise Fail(f"rank {r} returned its own gradient: nothing was exchanged. "
                           "All-reduce the gradient (dist.all_reduce sums it in place), "
                           "then divide by the world size")
            if len(used) == n and np.allclose(tags, 1.0):
                raise Fail(f"rank {r} returned the SUM of the {n} gradients: all_reduce "
                           f"sums; divide by dist.get_world_size() ({n}) for the average")
            if len(used) == n and np.allclose(tags, tags[0]) and tags[0] > 0:
                raise Fail(f"rank {r} divided the sum by {1 / tags[0]:.3g}, not by the world "
                           f"size {n}")
            raise Fail(f"rank {r} at step {k} returned a mix of gradients {_names(used)} "
                       f"with weights {np.round(tags[used], 4).tolist()}, not the average of "
                       f"all {n}")


def _ready_times(m: dict, b: int, k: int) -> np.ndarray:
    """When each worker's gradient of step k was ready: measured by compute() on the
    shared clock (inf: cut short), or, if the learner did not call compute(), the draw."""
    done = m[b]["run"]["done"][k, 1:]
    return m["draws"][k] if np.isnan(done).any() else done


def _chosen_ok(ready: np.ndarray, used, slack: float) -> bool:
    """Is `used` a set of first finishers: nobody outside was ready clearly earlier?"""
    outside = [i for i in range(len(ready)) if i not in used]
    return not outside or max(ready[used]) <= min(ready[outside]) + slack


def _check_backup_values(m: dict, b: int, slack: float) -> None:
    """Every rank holds the same update: the exact average of the first N - b to finish.

    Who finished first is judged from the measured ready times, give or take `slack`; on a
    busy machine a process can also be descheduled between its compute and its send, so
    one step in 8 may disagree (the first RANKS, not the first arrivals, disagree in most).
    """
    n = m["nodes"]
    keep = n - b
    size = n + PAYLOAD
    outs = m[b]["out"]
    disorder = []  # (step, used, first) where the choice does not match the arrivals
    always_lowest = True
    for k in range(m["steps"]):
        ups = [_as_update(outs[r][k], r, k, size) for r in range(n + 1)]
        ref = ups[0]
        for r in range(1, n + 1):
            if not torch.equal(ups[r], ref):
                used_r, tags_r = _describe(ups[r], n)
                if used_r == [r - 1] and abs(tags_r[r - 1] - 1) < 1e-9:
                    why = "its own gradient"
                else:
                    why = f"an update built from workers {_names(used_r)}"
                late = r - 1 not in _describe(ref, n)[0]
                raise Fail(f"with b={b}, at step {k} rank {r}{' (a late worker)' if late else ''}"
                           f" holds {why}, not the coordinator's update: ranks ended with "
                           "DIFFERENT updates. One rank must choose, and send the same update "
                           "to every rank, the late ones included")
        used, tags = _describe(ref, n)
        if b and len(used) == n and np.allclose(tags, 1 / n):
            raise Fail(f"with b={b} the update averages all {n} gradients: it must use only "
                       f"the first {keep} to arrive (and not wait for the other {b})")
        if np.allclose(tags[used], 1.0) and len(used) > 1:
            raise Fail(f"with b={b} the update is the SUM of {len(used)} gradients: divide by "
                       f"the number you used ({keep})")
        if len(used) == keep and np.allclose(tags[used], 1 / n) and b:
            raise Fail(f"with b={b} the update divides the sum of the {keep} gradients it "
                       f"used by N = {n}: the average is over the gradients used, N - b = "
                       f"{keep} (dividing by N shrinks every step by {keep}/{n})")
        if not used:
            raise Fail(f"with b={b}, at step {k} the update holds no worker's gradient at "
                       f"all: it averages {keep} messages that were all empty (the messages "
                       "of cut-short workers, whose first entry 0 says 'no gradient'). Were "
                       "they left over from an earlier step? Drain the late messages BY "
                       "SOURCE (dist.recv(msg, src=w) for each worker not heard from): an "
                       "any-source drain can take an early worker's next gradient instead")
        if len(used) < keep and np.allclose(tags[used], 1 / keep, rtol=1e-12, atol=0):
            raise Fail(f"with b={b}, at step {k} the update divides by {keep} but holds only "
                       f"{len(used)} gradients (workers {_names(used)}): an empty message "
                       "of a cut-short worker from the step before was counted. Drain the "
                       "late messages BY SOURCE (dist.recv(msg, src=w) for each worker not "
                       "heard from): an any-source drain can take an early worker's next "
                       "gradient instead")
        if len(used) != keep or not np.allclose(tags[used], 1 / keep, rtol=1e-12, atol=0):
            raise Fail(f"with b={b}, at step {k} the update weights workers {_names(used)} "
                       f"by {np.round(tags[used], 4).tolist()}: it must be the plain average "
                       f"of exactly N - b = {keep} gradients (1/{keep} each)")
        want = _payload_mean(m["seed"], k, used, n)
        if not torch.allclose(ref[n:], want, rtol=1e-9, atol=1e-12):
            raise Fail(f"with b={b}, at step {k} the update names the right workers but not "
                       "their gradients of THIS step: a late gradient of an earlier step was "
                       "used. Receive (and drop) the late messages, by source, before "
                       "returning")
        ready = _ready_times(m, b, k)
        first = sorted(np.argsort(ready, kind="stable")[:keep].tolist())
        always_lowest &= used == list(range(keep))
        if not _chosen_ok(ready, used, slack):
            disorder.append((k, used, first))
    if len(disorder) <= m["steps"] // 8:
        return
    k, used, first = disorder[0]
    if always_lowest:
        raise Fail(f"with b={b} the update always uses workers 0..{keep - 1} (ranks "
                   f"1..{keep}): the first N - b RANKS, not the first N - b to ARRIVE. At step"
                   f" {k} the first {keep} to finish were workers {_names(first)}. Receive "
                   "from any source: dist.recv(buf) without src returns the sender")
    raise Fail(f"with b={b}, in {len(disorder)} of {m['steps']} steps the update did not use "
               f"the first {keep} to finish: at step {k} it used workers {_names(used)}, but "
               f"the first to finish their compute were {_names(first)} (worker i is rank "
               "i + 1)")


# ---------------------------------------------------------------------------------------------
# The learner's closed forms, compared with known mistakes.
# ---------------------------------------------------------------------------------------------

H = models.harmonic
CASES_SYNC = ((0.01, 0.02, 1), (0.01, 0.02, 4), (0.0, 0.05, 8), (0.1, 0.01, 64), (0.02, 0.0, 3))
CASES_BACKUP = ((0.01, 0.02, 4, 1), (0.01, 0.02, 8, 2), (0.0, 0.05, 8, 0), (0.1, 0.01, 30, 2),
                (0.02, 0.03, 5, 4))


def _closed_form(ctx, fn, cases, truth, mistakes, what: str) -> str:
    got = []
    for case in cases:
        v = ctx.call(fn, *case)
        try:
            got.append(float(v))
        except (TypeError, ValueError):
            raise Fail(f"{what}{case} returned {v!r}: return a number (seconds)") from None
    want = [truth(*c) for c in cases]
    if np.allclose(got, want, rtol=1e-9, atol=1e-12):
        return f"matches on {len(cases)} cases"
    for text, wrong in mistakes:
        if np.allclose(got, [wrong(*c) for c in cases], rtol=1e-6, atol=1e-12):
            raise Fail(text)
    i = int(np.argmax(np.abs(np.array(got) - want)))
    raise Fail(f"{what}{cases[i]} = {got[i]:.6g} s, expected {want[i]:.6g} s")


# ---------------------------------------------------------------------------------------------
# Exercise 1: the naive synchronous step.
# ---------------------------------------------------------------------------------------------

WAIT_ALL = LAB.exercise(
    "straggler_wait_all", needs=("sync_step", "sync_step_model"),
    title="The naive synchronous step waits for the slowest of N",
    hints=("The idea: a synchronous step is as slow as its slowest rank. The step itself is "
           "compute, then the all-reduce; the model is the mean of the slowest of n compute "
           "times.",
           "sync_step: call compute(compute_s) first (the gradient's compute), then "
           "dist.all_reduce(grad) (it sums in place on every rank), then return grad divided "
           "by dist.get_world_size().",
           "sync_step_model(c, m, n): the step ends when the LAST of n ranks is done; the "
           "largest of n exponentials of mean m has mean m·H_n, H_n = 1 + 1/2 + ... + 1/n "
           "(clusterlab.models.harmonic(n)).",
           "If the measured step is longer than the slowest compute by much more than the "
           "overhead, something waits twice (a barrier and an all-reduce, or compute called "
           "twice)."))


@WAIT_ALL.check("sync_step_model(c, m, n) = c + m·H_n", points=1)
def _wait_all_model(ctx):
    return _closed_form(
        ctx, ctx.learner("sync_step_model"), CASES_SYNC, models.straggler_step,
        (("c + m·n: the largest of n exponentials is not n times one of them; its mean is "
          "m·H_n (H_n = 1 + 1/2 + ... + 1/n, about ln n + 0.58)", lambda c, m, n: c + m * n),
         ("c + m: that is the MEAN rank's time; a synchronous step waits for the slowest, "
          "whose mean is c + m·H_n", lambda c, m, n: c + m),
         ("c + m·ln n: close, but H_n = 1 + 1/2 + ... + 1/n is exact (ln n + 0.577... only "
          "for large n)", lambda c, m, n: c + m * math.log(n)),
         ("m·H_n without c: every rank also spends the fixed compute c",
          lambda c, m, n: m * H(n)),
         ("c + m·H_(n-1): H_n sums 1/k for k = 1..n", lambda c, m, n: c + m * H(n - 1))),
        "sync_step_model")


def _need_compute(wait: np.ndarray, who: str) -> None:
    if np.isnan(wait).any():
        raise Fail(f"{who} did not call compute(compute_s) in every step: the gradient's "
                   "compute is compute(compute_s) (not time.sleep), so the check can see when "
                   "each gradient was ready")


def _timing_sync(ctx, nodes, c, mexp, steps, seed, nic) -> str:
    fn = ctx.learner("sync_step")
    m = measure_sync(fn, nodes, c, mexp, steps=steps, seed=seed, nic=nic, _ctx=ctx,
                     _after=_check_sync_values)
    _check_sync_values(m)
    _need_compute(m["wait_s"], "a rank")
    ms = 1e3
    wait, step, lag = (float(m[k].mean()) for k in ("wait_s", "step_s", "lag_s"))
    run = m["run"]
    took = run["done"] - run["begin"]  # each rank's measured compute, against its draw
    if np.median(took / np.maximum(m["draws"], 1e-4)) > 1.5:
        raise Fail(f"the ranks computed {np.median(took / m['draws']):.2f} times as long as "
                   "their draws (median): is compute() called more than once per step, or "
                   "does something wait before it?")
    if lag < -0.001:
        raise Fail(f"the step ({ms * step:.1f} ms) ended before the slowest rank's gradient "
                   f"was ready ({ms * wait:.1f} ms): a synchronous step must wait for all")
    model = models.straggler_step(c, mexp, nodes)
    se = float(m["wait_s"].std(ddof=1) / math.sqrt(steps))
    if abs(wait - model) > Z999 * se + 0.003 + 0.05 * model:
        raise Fail(f"the measured wait for the slowest rank, {ms * wait:.1f} ms, is "
                   f"{ms * abs(wait - model):.1f} ms from c + m·H_N = {ms * model:.1f} ms: more "
                   f"than sampling explains (standard error {ms * se:.1f} ms, {steps} steps)")
    return (f"N={nodes}, {steps} steps: waited {ms * wait:.1f} ms for the slowest (95% CI "
            f"± {ms * 1.96 * se:.1f}) vs c + m·H_N = {ms * model:.1f} ms; the whole step "
            f"{ms * step:.1f} ms (the all-reduce added {ms * lag:.1f} ms)")


@WAIT_ALL.check("every rank returns the average of all N gradients; the measured step ≈ "
                "c + m·H_N (4 ranks, 30 steps)", points=3)
def _wait_all_timing(ctx):
    return _timing_sync(ctx, 4, 0.005, 0.020, 30, 11, NIC)


@WAIT_ALL.check("other world sizes, seeds and networks", points=2, hidden=True)
def _wait_all_hidden(ctx):
    nodes = int(ctx.rng.choice([2, 3, 5, 6]))
    c, mexp = float(ctx.rng.uniform(0.003, 0.010)), float(ctx.rng.uniform(0.015, 0.025))
    nic = str(ctx.rng.choice(HIDDEN_NICS))
    return _timing_sync(ctx, nodes, c, mexp, 24, int(ctx.rng.integers(1 << 20)), nic)


# ---------------------------------------------------------------------------------------------
# Exercise 2: backup workers.
# ---------------------------------------------------------------------------------------------

BACKUPS = LAB.exercise(
    "straggler_backups", needs=("backup_step", "backup_step_model"),
    title="Backup workers: proceed with the first N - b gradients",
    hints=("backup_step_model: the (N-b)-th arrival of N exponentials. The gaps between "
           "consecutive arrivals are exponentials of means m/N, m/(N-1), ... (Rényi), so the "
           "(N-b)-th comes after m·(1/N + ... + 1/(b+1)) on average.",
           "Coordinator (rank 0): dist.recv(msg) with no src returns the rank it came from, in "
           "arrival order. Take N - b of them, average those, isend the update to EVERY "
           "worker, then recv (and drop) one message from each worker you have not heard "
           "from, by source: dist.recv(msg, src=w). Then wait the isends.",
           "Why drain by source? Without a barrier, an early worker can finish its NEXT "
           "gradient before a late worker's message of this step arrives: an any-source "
           "drain would take (and drop) the wrong one.",
           "Why the Update before compute()? Gloo's send blocks until the peer has posted its "
           "receive: posting it first lets the coordinator send to every worker at once, and "
           "lets compute() stop when the update comes.",
           "Worker: update = Update(grad, src=0) BEFORE computing; finished = compute(compute_s,"
           " interrupt=update); send [1, grad] if finished, else [0, zeros] (exactly one "
           "message per worker per step, so the coordinator always knows what to drain); "
           "return update.wait().",
           "No saving measured? If the first workers got the update early but the step still "
           "lasted as long as the slowest compute, the late workers did not stop: pass "
           "interrupt=update to compute()."))


@BACKUPS.check("backup_step_model(c, m, n, b) = c + m·(H_n - H_b)", points=1)
def _backups_model(ctx):
    return _closed_form(
        ctx, ctx.learner("backup_step_model"), CASES_BACKUP,
        lambda c, m, n, b: backup_step_prediction(n, b, c, m),
        (("c + m·(H_N - H_(N-b)) is the wait for the first b arrivals, not the first N - b: "
          "the (N-b)-th of N arrivals comes after m·(1/N + 1/(N-1) + ... + 1/(b+1)) = "
          "m·(H_N - H_b)", lambda c, m, n, b: c + m * (H(n) - H(n - b))),
         ("c + m·H_(N-b) is the slowest of N - b FIXED ranks; with b backups the step waits "
          "for the (N-b)-th arrival of all N: c + m·(H_N - H_b), which is smaller",
          lambda c, m, n, b: c + m * H(n - b)),
         ("c + m·(H_N - H_(b+1)): one term too many; the (N-b)-th arrival is m·(1/N + ... + "
          "1/(b+1)) = m·(H_N - H_b)", lambda c, m, n, b: c + m * (H(n) - H(b + 1))),
         ("c + m·H_N ignores the backups: with b backups the step stops waiting for the last "
          "b", lambda c, m, n, b: c + m * H(n))),
        "backup_step_model")


def _designed_draws(nodes: int, reps: int, rng) -> np.ndarray:
    """Compute times 5 ms + 10 ms x a permutation: the arrival order is unambiguous, and
    the first worker is the slowest at least once (so the first RANKS are not the first
    ARRIVALS)."""
    rows = [np.roll(np.arange(nodes)[::-1], k) for k in range(min(reps, nodes))]
    rows += [rng.permutation(nodes) for _ in range(max(0, reps - len(rows)))]
    return 0.005 + 0.010 * np.array(rows[:reps], dtype=float)


def _aggregate(ctx, nodes, backups, nic) -> str:
    fn = ctx.learner("backup_step")
    draws = _designed_draws(nodes, 8, ctx.rng)
    # Staged: every cut-short worker's message leaves STAGED_LATE_S late, so that an early
    # worker's next gradient always comes first (an any-source drain fails every time).
    try:
        m = measure_backups(fn, nodes, backups, 0, 0, draws=draws, nic=nic, calib_steps=0,
                            seed=ctx.seed % 1000, _ctx=ctx, _stage_s=STAGED_LATE_S)
    except Fail as exc:
        if "timed out" in str(exc) and "recv from any source" in str(exc):
            raise Fail(f"{exc} Here a cut-short worker's empty message arrived late, after an "
                       "early worker's NEXT gradient (this check delays it on purpose, as a "
                       "busy network would): an any-source drain took that gradient instead, "
                       "and from then on the messages no longer match the steps. Drain the "
                       "late messages BY SOURCE: dist.recv(msg, src=w) for each worker not "
                       "heard from") from None
        raise
    for b in backups:
        _check_backup_values(m, b, slack=ORDER_SLACK_S)
    return (f"N={nodes}, b in {list(backups)}: every rank holds the exact average of the "
            "first N - b arrivals")


@BACKUPS.check("the update: the exact average of the first N - b ARRIVALS, the same on "
               "every rank (N = 4, b = 1, 2)", points=3)
def _backups_aggregate(ctx):
    return _aggregate(ctx, 4, (1, 2), NIC)


def _waited_for_all(m: dict, b: int) -> None:
    """Fail if b backups did not take the tail off the step.

    With backups the late workers are cut short (their compute never finishes). A step in
    which every worker finished and the coordinator returned only after the last of them
    waited for all N: either the late workers were not stopped (the update reached the
    workers used quickly), or the aggregation itself is a barrier (it did not).
    """
    ms, r, nodes = 1e3, m[b], m["nodes"]
    run = r["run"]
    done, end = run["done"][:, 1:], run["end"][:, 1:]
    keep = nodes - b
    waited = np.isfinite(done).all(axis=1) & (run["end"][:, 0] >= done.max(axis=1))
    if waited.mean() > 0.5:
        rows = np.flatnonzero(waited)
        ordered = np.sort(done[rows], axis=1)
        last_used = np.argsort(done[rows], axis=1)[:, keep - 1]
        latency = end[rows, last_used] - ordered[:, keep - 1]  # its update came after...
        tail = ordered[:, -1] - ordered[:, keep - 1]  # ...vs the wait for the slowest
        if latency.mean() < 0.5 * tail.mean():
            raise Fail(f"with b={b} the workers used had the update {ms * latency.mean():.1f} "
                       f"ms after the last of them was ready, yet in {len(rows)} of "
                       f"{len(waited)} steps no worker was cut short and the step ended only "
                       "after the slowest finished: the late workers kept computing a gradient "
                       "nobody uses, and the next step waits for them. Pass interrupt=update to"
                       " compute() so that they stop when the update comes")
        raise Fail(f"with b={b}, in {len(rows)} of {len(waited)} steps every rank waited for "
                   f"the slowest worker: the workers used got the update "
                   f"{ms * latency.mean():.1f} ms after the last of them was ready, about as "
                   f"long as the slowest took longer ({ms * tail.mean():.1f} ms). A collective "
                   "(all_gather, all_reduce) or a recv from EVERY worker waits for all N; "
                   "receive the first N - b from any source and send the update at once")


def _lag_grew(m: dict, b: int) -> None:
    """Fail if the coordination after the first N - b gradients took most of the tail that
    b backups should cut (measured against b = 0, on the same draws)."""
    ms, r, keep = 1e3, m[b], m["nodes"] - b
    lag, lag0 = float(r["lag_s"].mean()), float(m[0]["lag_s"].mean())
    gap = float((m[0]["sample_s"] - r["sample_s"]).mean())  # the tail b backups should cut
    if lag - lag0 > 0.5 * gap:
        raise Fail(f"with b={b} each step lasted {ms * lag:.1f} ms after its first {keep} "
                   f"gradients were ready (with b=0: {ms * lag0:.1f} ms after all of them), "
                   f"most of the {ms * gap:.1f} ms tail the backups should cut: what does the "
                   "coordinator wait for after the first N - b gradients?")


def _saving(ctx, nodes, backups, c, mexp, steps, seed, nic) -> str:
    fn = ctx.learner("backup_step")
    # b = 0 (the baseline) last: most mistakes show in the first run with backups
    bs = [*sorted({b for b in backups if b}), 0]

    def after(m: dict, b: int) -> None:  # fail as soon as a run shows the mistake
        calibration = "step_s" not in m[b]  # no compute: every order is a right one
        _check_backup_values(m, b, slack=math.inf if calibration else ORDER_SLACK_S)
        if "step_s" in m[b]:
            _need_compute(m[b]["wait_s"], "a worker")
            if b:
                _waited_for_all(m, b)

    m = measure_backups(fn, nodes, bs, c, mexp, steps=steps, seed=seed, nic=nic, _ctx=ctx,
                        _after=after)
    ms = 1e3
    for b in bs[:-1]:
        _lag_grew(m, b)
    lines = []
    for b in bs[:-1]:
        sv = paired_saving(m, b)
        w, st = sv["wait"], sv["step"]
        pred = (backup_step_prediction(nodes, 0, c, mexp)
                - backup_step_prediction(nodes, b, c, mexp))
        if abs(w["mean_s"] - pred) > Z999 * w["se_s"] + 0.002 + 0.05 * pred:
            raise Fail(f"b={b} cut the wait for gradients by {ms * w['mean_s']:.1f} ms per step"
                       f" (99.9% CI {ms * w['ci999_s'][0]:.1f} to {ms * w['ci999_s'][1]:.1f} ms"
                       f" over {w['n']} paired steps; the draws themselves: "
                       f"{ms * sv['sample_s']:.1f} ms), but c + m·(H_N - H_b) predicts m·H_b ="
                       f" {ms * pred:.1f} ms")
        lines.append(f"b={b}: the wait fell by {ms * w['mean_s']:.1f} ms (95% CI "
                     f"{ms * w['ci95_s'][0]:.1f} to {ms * w['ci95_s'][1]:.1f}, n={w['n']}) vs "
                     f"m·H_b = {ms * pred:.1f} ms; the whole step by {ms * st['mean_s']:.1f} ms")
    return f"N={nodes}: " + "; ".join(lines)


@BACKUPS.check("measured saving vs c + m·(H_N - H_b) (N = 4, b = 1, 2, 30 paired steps)",
               points=3)
def _backups_saving(ctx):
    return _saving(ctx, 4, (1, 2), 0.005, 0.020, 30, 5, NIC)


@BACKUPS.check("other N, b, seeds and networks", points=3, hidden=True)
def _backups_hidden(ctx):
    nodes = int(ctx.rng.choice([3, 5, 6]))
    b = int(ctx.rng.integers(1, nodes - 1))
    nic = str(ctx.rng.choice(HIDDEN_NICS))
    c, mexp = float(ctx.rng.uniform(0.003, 0.010)), float(ctx.rng.uniform(0.015, 0.025))
    return _saving(ctx, nodes, (b,), c, mexp, 24, int(ctx.rng.integers(1 << 20)), nic)


# ---------------------------------------------------------------------------------------------
# Exercise 3: the stability limit of τ-stale gradient descent.
# ---------------------------------------------------------------------------------------------

STALE_TAUS = tuple(range(9))
NEAR = 1e-3  # the probes just below and above the limit, in a = lr·curvature
PROBES = ("half", "below", "above", 1.2, 1.5, 3.0)  # where is_stable is asked, around a*


def _probe_lr(kind, tau: int, curvature: float) -> float:
    a = models.delayed_gd_stable_step(tau)
    a = {"half": 0.5 * a, "below": a - NEAR, "above": a + NEAR}[kind] if isinstance(kind, str) \
        else a * kind
    return a / curvature


def stable_limit(tau: int, curvature: float = 1.0) -> float:
    """The largest stable lr: 2 sin(π/(4τ+2)) / curvature (a = lr·curvature)."""
    return models.delayed_gd_stable_step(tau) / curvature


def _growth(lr: float, tau: int, curvature: float) -> float:
    """log of the spectral radius: |x| grows (or shrinks) by this per step, eventually."""
    return math.log(max(models.delayed_gd_spectral_radius(lr * curvature, tau), 1e-300))


def _verdict(ctx, fn, lr, tau, curvature) -> bool:
    v = ctx.call(fn, lr, tau, curvature)
    if not isinstance(v, (bool, np.bool_)):
        raise Fail(f"is_stable({lr:.6g}, {tau}, {curvature:g}) returned {v!r}: return True "
                   "(the iteration converges) or False")
    return bool(v)


def _probe(ctx, cases) -> str:
    """Ask is_stable around the limit for each (tau, curvature); explain any mistake."""
    fn = ctx.learner("is_stable")
    wrong = []
    for tau, curv in cases:
        lim = stable_limit(tau, curv)
        for kind in PROBES:
            lr = _probe_lr(kind, tau, curv)
            if _verdict(ctx, fn, lr, tau, curv) != (lr < lim):
                wrong.append((tau, curv, kind, lr))
    if not wrong:
        return (f"right at {len(cases) * len(PROBES)} learning rates, down to {NEAR:g} from "
                "the limit")
    # The most telling mistake first: far above the limit, then just above, then below.
    rank = {"half": 3, "below": 2, "above": 1}
    tau, curv, kind, lr = min(wrong, key=lambda w: (rank.get(w[2], 0), w[0]))
    lim = stable_limit(tau, curv)
    g = _growth(lr, tau, curv)
    at = f"is_stable(lr={lr:.6g}, tau={tau}, curvature={curv:g})"
    # A delay off by one moves every verdict to the τ ± 1 boundary: look for that first.
    for other in (tau - 1, tau + 1):
        probes = [_probe_lr(k, tau, curv) for k in PROBES]
        if other >= 0 and all(_verdict(ctx, fn, p, tau, curv) == (p < stable_limit(other, curv))
                              for p in probes):
            raise Fail(f"{at}: your verdicts follow the limit for τ = {other}, not τ = "
                       f"{tau}. The gradient is τ steps old: x_(t+1) = x_t - a·x_(t-τ), "
                       "with τ = 0 plain gradient descent")
    away = f"{abs(lr - lim) * curv:.2g} in lr·curvature"
    if lr < lim:
        raise Fail(f"{at} says unstable, but that lr is below the limit {lim:.6g} ({away}): "
                   f"|x| shrinks there by {100 * -math.expm1(g):.2g}% per step. Judge by the "
                   "trend of |x| over a long run (its peak late in the run against its peak "
                   "halfway), not by one value, and treat an x that has decayed to ~0 (below "
                   "1e-100, say) as converged")
    if kind == "above":
        raise Fail(f"{at} says stable, but that lr is above the limit {lim:.6g} ({away}): "
                   f"|x| grows there by only {100 * math.expm1(g):.2g}% per step "
                   f"(x{math.exp(g * 1000):.3g} per 1000 steps). A short simulation cannot see"
                   " a mode that grows this slowly: simulate thousands of steps (the hint says "
                   "how many)")
    raise Fail(f"{at} says stable, but that lr is {kind:g}x the limit {lim:.6g}: |x| grows "
               f"{100 * math.expm1(g):.2g}% per step. Does your test look at the first few "
               "steps only? A too-large stale step first moves towards 0 (the loss falls), "
               "overshoots, and only then oscillates with a growing amplitude. Judge by growth"
               " over a long run"
               + (", and treat overflow (inf, nan) as unstable" if kind > 2 else ""))


def _largest(ctx, cases) -> str:
    fn = ctx.learner("largest_stable_lr")
    stable = ctx.learner("is_stable")
    worst = 0.0
    for tau, curv in cases:
        v = ctx.call(fn, tau, curv)
        try:
            lr = float(v)
        except (TypeError, ValueError):
            raise Fail(f"largest_stable_lr({tau}, {curv:g}) returned {v!r}: return a number")\
                from None
        lim = stable_limit(tau, curv)
        tol = 1e-3 / curv  # 1e-3 in a = lr·curvature
        call = f"largest_stable_lr({tau}, curvature={curv:g}) = {lr:.6g}"
        if not math.isfinite(lr) or lr <= 0:
            raise Fail(f"{call}: the largest stable lr is a positive number")
        if not _verdict(ctx, stable, lr, tau, curv):
            if abs(lr - lim) <= 1e-9 * lim:
                raise Fail(f"{call}: the limit itself, 2 sin(π/(4τ+2)) / curvature to 9 "
                           "digits, where |x| neither grows nor decays, and your own "
                           "is_stable calls it unstable. Find the largest lr that your "
                           "is_stable calls stable (a bisection that returns its stable end)")
            raise Fail(f"{call}, an lr that your own is_stable calls UNSTABLE: the bisection "
                       "returns the first unstable lr (hi) instead of the largest stable one "
                       "(lo). Keep lo stable and hi unstable, and return lo")
        if abs(lr - lim) <= tol:
            worst = max(worst, abs(lr - lim) * curv)
            continue
        for other in (tau - 1, tau + 1):
            if other >= 0 and abs(lr - stable_limit(other, curv)) <= tol:
                raise Fail(f"{call} is the limit for τ = {other} ({stable_limit(other, curv):.6g})"
                           f", not τ = {tau} ({lim:.6g}): the delay is off by one")
        if curv != 1 and abs(lr - stable_limit(tau, 1.0)) <= 1e-3:
            raise Fail(f"{call} ignores the curvature: the iteration is x_(t+1) = x_t - "
                       f"lr·curvature·x_(t-τ), so the limit is {lim:.6g} = "
                       f"{stable_limit(tau):.6g} / {curv:g}")
        if lr < lim:
            raise Fail(f"{call} is {lr - lim:+.2g} from the limit {lim:.6g} (allowed: "
                       f"{tol:.2g}). Either the bisection stops while the bracket is still wide"
                       " (halve until hi - lo < 1e-5 / curvature, ~20 halvings) or your "
                       "is_stable calls lrs just below the limit unstable (a run too short to "
                       "tell slow decay from growth)")
        g = _growth(lr, tau, curv)
        raise Fail(f"{call} is above the limit {lim:.6g} by {lr - lim:.2g}: there |x| grows "
                   f"by {100 * math.expm1(g):.2g}% per step, but your is_stable calls it "
                   "stable: simulate longer so that such slow growth shows")
    return (f"{len(cases)} cases within 1e-3 of 2 sin(π/(4τ+2)) / curvature (worst "
            f"{worst:.1e} in lr·curvature), each stable by your own is_stable")


STABILITY = LAB.exercise(
    "stale_stability", needs=("is_stable", "largest_stable_lr"),
    title="The largest stable learning rate with τ-stale gradients",
    hints=("The idea: you cannot tell convergence from a few steps, because near the limit |x| "
           "grows or shrinks by a fraction of a percent per step and a too-large step first "
           "looks good. Simulate long, and compare the size of x late in the run with its size "
           "halfway.",
           "is_stable: keep the last τ + 1 values of x (x_t = 1 for t <= 0), step x_(t+1) = "
           "x_t - lr·curvature·x_(t-τ). Unstable at once if |x| > 1e6.",
           "Near the limit |x| grows or shrinks by only ~0.05% per step for an lr 1e-3 away: "
           "simulate about 20 000 steps and compare the peak |x| over a block near the end "
           "with the peak over a block just before half-time (blocks of ~8(τ+1) steps, longer "
           "than one oscillation). Treat an x that decayed to ~0 (below 1e-100) as stable.",
           "largest_stable_lr: bisect on [0, 2.5 / curvature]: every limit is at most 2 / "
           "curvature, so hi starts unstable, and lo = 0 stands for 'a tiny lr', which is "
           "stable. Keep lo stable and hi unstable; stop when hi - lo < 1e-6 / curvature; "
           "return lo.",
           "Check yourself: the limit for τ = 1 is exactly 1/curvature, for τ = 0 it is "
           "2/curvature."))


@STABILITY.check("is_stable is right 1e-3 below and above the limit (τ = 0, 1, 3, 8)",
                 points=2)
def _stability_probes(ctx):
    return _probe(ctx, [(t, 1.0) for t in (0, 1, 3, 8)])


@STABILITY.check("largest_stable_lr(τ) within 1e-3 of 2 sin(π/(4τ+2)), τ = 0..8", points=3)
def _stability_largest(ctx):
    return _largest(ctx, [(t, 1.0) for t in STALE_TAUS])


@STABILITY.check("other τ and curvatures", points=2, hidden=True)
def _stability_hidden(ctx):
    taus = [int(t) for t in ctx.rng.choice(np.arange(9, 21), size=2, replace=False)]
    taus.append(int(ctx.rng.integers(0, 9)))
    curvs = [float(np.exp(ctx.rng.uniform(math.log(0.2), math.log(5.0)))) for _ in taus]
    cases = list(zip(taus, curvs))
    return _probe(ctx, cases) + "; " + _largest(ctx, cases)


# ---------------------------------------------------------------------------------------------
# Exercise 4: why the limit falls like 1/τ.
# ---------------------------------------------------------------------------------------------

# Four explanations of the same length and specificity, each with a mechanism and a rate: the
# right one is not given away by its wording.
MECHANISMS = {
    "A": "stale gradients are noisier: their error variance grows with τ, and a step stays "
         "stable only while lr·λ times that noise stays below a constant, so the limit "
         "shrinks like 1/√τ, and above it the iterate drifts off in a random walk",
    "B": "the gradient is delayed feedback: a correction shows only τ steps later, and until "
         "then the same stale push is applied again every step; the total push over the "
         "delay, about a·τ, must stay below a constant (≈ π/2) or the iterate overshoots and "
         "oscillates with a growing amplitude",
    "C": "with stale gradients the effective curvature grows with τ: every step feels λ once "
         "per stale gradient in flight, about τλ in all, so the plain limit 2/λ becomes "
         "about 2/(τλ), and above it the loss grows steadily, step after step",
    "D": "stale gradients point where x was, not where it is: once x has crossed the minimum, "
         "about half of the τ pushes in flight point the wrong way, and the step must shrink "
         "until those are negligible, which takes a step exponentially small in τ",
}
WHY_NOT = {
    "A": "there is no noise at all in x_(t+1) = x_t - a·x_(t-τ): it is deterministic, and "
         "still diverges above the limit. And the limit falls like 1/τ, not 1/√τ",
    "C": "the loss λx²/2 has the same curvature λ for every τ, and above the limit x "
         "oscillates with a growing amplitude (its sign flips in blocks of about 2τ steps); "
         "it does not grow steadily. Only the feedback is late",
    "D": "the limit falls like π/(2τ+1), not exponentially: your own largest_stable_lr "
         "halves from τ = 4 to τ = 8, it does not square. And the stale push is not random "
         "or self-cancelling: every push in flight points the same way, where x was",
}


def _asymptote(ctx) -> str:
    fn = ctx.learner("large_tau_stable_lr")
    ratios = {}
    for tau in (50, 200, 1000):
        v = ctx.call(fn, tau)
        try:
            ratios[tau] = float(v) / models.delayed_gd_stable_step(tau)
        except (TypeError, ValueError):
            raise Fail(f"large_tau_stable_lr({tau}) returned {v!r}: return a number") from None
    r = ratios[1000]
    small = ctx.call(fn, 2)
    with contextlib.suppress(TypeError, ValueError):
        if abs(float(small) / models.delayed_gd_stable_step(2) - 1) < 1e-9:
            raise Fail(f"large_tau_stable_lr(2) = {float(small):.6g}, the exact limit "
                       "2 sin(π/(4τ+2)) itself: that is the closed form, not its large-τ "
                       "form. Expand it for large τ into a simple expression (what does "
                       "sin x become for small x?)")
    if all(abs(ratios[t] - 1) < 2 / t for t in ratios):
        return "≈ π/(2τ+1): " + ", ".join(f"τ={t}: {ratios[t]:.4f} x the exact limit"
                                         for t in ratios)
    if abs(ratios[50] / ratios[1000] - 1) > 0.1:
        raise Fail(f"large_tau_stable_lr(τ) / 2 sin(π/(4τ+2)) is {ratios[50]:.3g} at τ = 50 "
                   f"but {r:.3g} at τ = 1000: it does not fall like 1/τ. For small angles "
                   "sin x ≈ x")
    raise Fail(f"large_tau_stable_lr falls like 1/τ but is {r:.3g} x the exact limit at τ = "
               f"1000: the constant is wrong. 2 sin(π/(4τ+2)) ≈ 2·π/(4τ+2) = π/(2τ+1) for "
               "large τ (sin x ≈ x for small x)")


def _mechanism(ctx) -> str:
    v = ctx.call(ctx.learner("staleness_mechanism"))
    choice = v.strip().upper() if isinstance(v, str) else ""
    if choice not in MECHANISMS:
        raise Fail(f"staleness_mechanism() returned {shorten(repr(v), 80)}: return exactly "
                   f"one letter, one of {', '.join(MECHANISMS)} (a string such as 'A'), not "
                   "a sentence")
    if choice != "B":
        raise Fail(f"{choice} is not it: {WHY_NOT[choice]}")
    return "B: delayed feedback, a·τ bounded"


EXPLAIN = LAB.exercise(
    "stale_explain", needs=("large_tau_stable_lr", "staleness_mechanism"),
    title="Why the limit falls like 1/τ",
    hints=("For small x, sin x ≈ x: expand 2 sin(π/(4τ+2)) for large τ.",
           "Think of x_(t+1) = x_t - a·x_(t-τ) after x has crossed 0: for τ more steps the "
           "update still pushes it the old way."))


@EXPLAIN.check("large_tau_stable_lr(τ) ≈ 2 sin(π/(4τ+2)) for large τ", points=1)
def _explain_asymptote(ctx):
    return _asymptote(ctx)


@EXPLAIN.check("the mechanism", points=1)
def _explain_mechanism(ctx):
    return _mechanism(ctx)
