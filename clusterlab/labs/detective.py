"""Lab 08: the silent-divergence detective.

A data-parallel training run on real ranks hides one synchronisation fault, drawn from a
seed: which fault, on which rank, from which step. The learner reads what every rank logged
(losses, gradient norms, parameters, buffers), writes detectors of increasing power (the
loss; the replicas; the replicas, the buffers and the ranks' own gradients), and finally
names the fault, the rank and the first bad step (`diagnose`). Hidden checks run the same
functions on cases drawn from other seeds.

The run (`observe`): a small MLP with BatchNorm, hand-written data parallelism on every rank
of a `clusterlab.Cluster`: backward, ONE collective that averages the gradients and the
BatchNorm running statistics, gradient noise from a generator seeded alike on every rank
(noisy SGD), then the update. Healthy runs come in two kinds: `reduce="allreduce"` (one
all_reduce: every rank gets the same bits) and `reduce="ring"` (each rank adds the gathered
parts itself, starting from its own: the sums differ in the last bits, legitimately).
Everything is seeded; the same case gives the same observations on any network.
"""

from __future__ import annotations

import dataclasses
import functools
import getpass
import hashlib
import os

import numpy as np

from ..cluster import Cluster
from .core import Fail, Lab

# --- the training run and its faults -------------------------------------------------------------

FAULTS = ("rng_desync", "skipped_allreduce", "wrong_scale", "wrong_lr", "bit_flip",
          "stale_buffer")
REDUCES = ("allreduce", "ring")
FEATURES, HIDDEN, BATCH, LR, NOISE = 8, 16, 512, 0.02, 0.05
STEPS, DATA = 24, 4096
FLIP_BITS = (17, 18, 19, 20, 21, 22, 30)  # float32 mantissa bits (silent), the exponent's top
SERIES = ("loss", "grad_norm", "synced_norm", "params", "buffers")  # (steps, world, ...)

# What each fault does to rank r from step s (the learner reads these in the notebook).
WHAT = {
    "rng_desync": "rank r's noise generator is reseeded with its rank at step s (after a "
                  "restart, say): from then on it adds different noise to its update",
    "skipped_allreduce": "at step s rank r takes part in the all-reduce but applies its own "
                         "gradient instead of the average (the result went to a copy)",
    "wrong_scale": "from step s rank r's gradient is k times too large before the all-reduce "
                   "(k micro-batches accumulated, never divided by k)",
    "wrong_lr": "from step s rank r uses another learning rate (its scheduler was not "
                "restored)",
    "bit_flip": "after the update of step s one bit of one of rank r's weights flips "
                "(memory corruption)",
    "stale_buffer": "from step s rank r keeps its own BatchNorm running statistics instead of "
                    "the averaged ones (takes part in the collective, discards the result)",
}
# Which step is the first bad one, in words (for the messages).
FIRST = {
    "rng_desync": "the first step whose update differs (params[t] is after step t)",
    "skipped_allreduce": "the step whose update used rank r's own gradient",
    "wrong_scale": "the first step whose gradient on rank r is scaled",
    "wrong_lr": "the first step whose update differs (params[t] is after step t)",
    "bit_flip": "the step after which one weight of rank r differs (params[t] is after step t)",
    "stale_buffer": "the first step after which rank r's buffers differ (buffers[t] is after "
                    "step t)",
}
# Where each fault shows in the observations (what a detector that missed it should read).
SIGNS = {
    "rng_desync": "rank r's parameters leave the other replicas' at step s and keep drifting; "
                  "every rank's synced gradient still agrees",
    "skipped_allreduce": "rank r's parameters leave the others' at step s, the one step where "
                         "its synced_norm differs (it equals its own grad_norm)",
    "wrong_scale": "every replica stays identical (the all-reduce hands the wrong gradient to "
                   "all ranks), but rank r's own grad_norm is k times the others' from step s",
    "wrong_lr": "rank r's parameters leave the others' at step s; its update is an exact "
                "multiple of theirs",
    "bit_flip": "rank r's parameters differ from the others' at step s in exactly one element",
    "stale_buffer": "rank r's parameters agree with the others' but its buffers (BatchNorm "
                    "running statistics) do not, from step s",
}
TOL = 1e-5  # what the notebook recommends: rounding between replicas stays below ~1e-7 here
DELAY = 2  # an alarm counts if it comes at the first bad step or at most this many steps later


@dataclasses.dataclass(frozen=True)
class Case:
    """One training run: world size, steps, seed, reduction, and the (sealed) fault."""

    seed: int
    world: int = 4
    steps: int = STEPS
    reduce: str = "allreduce"
    fault: str = "healthy"
    rank: int = 0
    step: int = 0
    size: float = 0.0  # the fault's size: gradient scale k, learning-rate factor, flipped bit
    index: int = 0  # which weight a bit flip hits (among those with |w| >= 0.1)
    # A learner's own case (case_for): answer() refuses it, and the check solves a second
    # case with the learner's diagnose, so that reading this object earns nothing.
    sealed: bool = dataclasses.field(default=False, compare=False)

    def __post_init__(self) -> None:
        if self.fault not in ("healthy", *FAULTS):
            raise ValueError(f"unknown fault {self.fault!r}; the faults are {FAULTS}")
        if self.reduce not in REDUCES:
            raise ValueError(f"reduce must be one of {REDUCES}, got {self.reduce!r}")

    def __repr__(self) -> str:  # a sealed case file: printing it does not give the answer
        return f"Case(world={self.world}, steps={self.steps}, sealed)"


def _average(t, mode: str, rank: int, world: int):
    """The mean over ranks of t: one all_reduce (the same bits everywhere), or an all_gather
    that each rank adds up itself starting from its own part (the last bits differ)."""
    import torch
    import torch.distributed as dist

    if mode == "allreduce":
        out = t.clone()
        dist.all_reduce(out)
        return out / world
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t)
    out = parts[rank].clone()
    for j in range(1, world):
        out += parts[(rank + j) % world]
    return out / world


@functools.lru_cache(maxsize=4)
def _data(seed: int):
    """y = X w + 0.5 + 0.1 noise, X ~ N(0, I), float32: the same on every rank. (Written here:
    importing clusterlab.experiments would load torch._dynamo in every rank, for seconds.)"""
    import torch

    g = torch.Generator().manual_seed(1000 + seed % 1000)
    x = torch.randn(DATA, FEATURES, generator=g, dtype=torch.float64)
    w = torch.randn(FEATURES, 1, generator=g, dtype=torch.float64)
    y = x @ w + 0.5 + 0.1 * torch.randn(DATA, 1, generator=g, dtype=torch.float64)
    return x.float(), y.float()


def _train_one(c: Case, rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    torch.manual_seed(c.seed)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.BatchNorm1d(HIDDEN),
                                torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1))
    params = list(model.parameters())
    bufs = [model[1].running_mean, model[1].running_var]
    n_p = sum(p.numel() for p in params)
    with torch.no_grad():
        flat = parameters_to_vector(params)
        dist.broadcast(flat, 0)  # every replica starts from rank 0's weights
        vector_to_parameters(flat, params)
    start = flat.clone()
    x, y = _data(c.seed)
    batches = torch.Generator().manual_seed(7919 * c.seed + rank)  # each rank its own batches
    noise_gen = torch.Generator().manual_seed(104729 + c.seed)  # the same on every rank
    me = rank == c.rank
    log = {k: [] for k in SERIES}
    for t in range(c.steps):
        now = me and t == c.step
        since = me and t >= c.step
        idx = torch.randint(0, len(x), (BATCH,), generator=batches)
        loss = F.mse_loss(model(x[idx]), y[idx])
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            g = torch.cat([p.grad.reshape(-1) for p in params])
            if c.fault == "wrong_scale" and since:
                g = g * c.size
            b = torch.cat([v.reshape(-1) for v in bufs])
            avg = _average(torch.cat([g, b]), c.reduce, rank, world)  # one collective a step
            synced = g if c.fault == "skipped_allreduce" and now else avg[:n_p]
            if not (c.fault == "stale_buffer" and since):
                off = n_p
                for v in bufs:
                    v.copy_(avg[off:off + v.numel()].view_as(v))
                    off += v.numel()
            if c.fault == "rng_desync" and now:
                noise_gen.manual_seed(104729 + c.seed + 1 + rank)
            noise = NOISE * torch.randn(n_p, generator=noise_gen)
            lr = LR * c.size if c.fault == "wrong_lr" and since else LR
            flat = parameters_to_vector(params) - lr * (synced + noise)
            if c.fault == "bit_flip" and now:
                big = torch.nonzero(flat.abs() >= 0.1).reshape(-1)
                i = int(big[c.index % len(big)])
                bit = int(c.size)
                flat.view(torch.int32)[i] ^= (1 << bit) if bit < 31 else -(1 << 31)
            vector_to_parameters(flat, params)
        log["loss"].append(loss.item())
        log["grad_norm"].append(float(g.norm()))
        log["synced_norm"].append(float(synced.norm()))
        log["params"].append(flat.numpy().copy())
        log["buffers"].append(torch.cat([v.reshape(-1) for v in bufs]).numpy().copy())
    return {**{k: np.array(v) for k, v in log.items()}, "start": start.numpy()}


def _train_rank(cases: list[dict]) -> list[dict]:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    return [_train_one(Case(**c), rank, world) for c in cases]


# A case's observations are a function of the case (and, for honesty, of the network it ran
# on, which changes nothing): each is run once per kernel.
_CACHE: dict[tuple[Case, str | None], dict] = {}


def _copy(obs: dict) -> dict:
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in obs.items()}


def observe_many(cases, nic=None, timeout: float = 60) -> list[dict]:
    """Run the cases (all of one world size) on one cluster: each case's observations.

    Observations are a dict: "world", "steps", "lr", and arrays indexed [step, rank, ...]:
      "loss"        (steps, world): each rank's training loss on its own batch
      "grad_norm"   (steps, world): the norm of the gradient the rank handed to the
                    all-reduce (its own, before averaging)
      "synced_norm" (steps, world): the norm of the gradient the rank applied (after it)
      "params"      (steps, world, P) float32: the rank's parameters AFTER step t
      "buffers"     (steps, world, B) float32: its BatchNorm running mean and var after step t
      "start"       (world, P): the parameters before step 0.
    The network (`nic`) changes when the bytes arrive, never which: results do not depend
    on it."""
    cases = list(cases)
    net = None if nic is None else str(nic)
    todo = [c for c in dict.fromkeys(cases) if (c, net) not in _CACHE]
    if todo:
        world = todo[0].world
        if any(c.world != world for c in todo):
            raise ValueError("observe_many runs cases of one world size at a time")
        with Cluster(nodes=world, nic=nic, timeout=timeout) as cl:
            out = cl.run(_train_rank, [dataclasses.asdict(c) for c in todo])
        if len(_CACHE) > 256:
            _CACHE.clear()
        for i, c in enumerate(todo):
            per = [o[i] for o in out]
            obs = {k: np.stack([p[k] for p in per], axis=1) for k in SERIES}
            obs["start"] = np.stack([p["start"] for p in per])
            obs.update(world=c.world, steps=c.steps, lr=LR)
            _CACHE[c, net] = obs
    return [_copy(_CACHE[c, net]) for c in cases]


def observe(case: Case, nic=None) -> dict:
    """One case's observations (see observe_many)."""
    return observe_many([case], nic=nic)[0]


def cut(obs: dict, steps: int) -> dict:
    """The observations of the first `steps` steps only (what an online detector has seen)."""
    out = _copy(obs)
    for k in SERIES:
        out[k] = out[k][:steps]
    out["steps"] = steps
    return out


def draw(rng: np.random.Generator, fault: str, world: int = 4, steps: int = STEPS,
         reduce: str | None = None, size: float | None = None) -> Case:
    """A case of `fault` (or "healthy") with rank, first bad step and size drawn from rng."""
    sizes = {"wrong_scale": [8.0, 16.0], "wrong_lr": [0.5, 2.0, 3.0],
             "bit_flip": [float(b) for b in FLIP_BITS]}
    if size is None:
        size = float(rng.choice(sizes[fault])) if fault in sizes else 0.0
    return Case(seed=int(rng.integers(1, 10**6)), world=world, steps=steps,
                reduce=reduce or str(rng.choice(REDUCES)), fault=fault,
                rank=int(rng.integers(world)), step=int(rng.integers(4, steps - 6)),
                size=size, index=int(rng.integers(1000)))


def learner_seed() -> int:
    """Your case's seed, from your user name (JupyterHub's, or this machine's)."""
    name = os.environ.get("JUPYTERHUB_USER") or getpass.getuser()
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 10**6


def case_for(seed: int) -> Case:
    """The sealed case file of `seed`: one of the FAULTS, on 4 ranks."""
    rng = np.random.default_rng([int(seed), 8])
    return dataclasses.replace(draw(rng, str(rng.choice(FAULTS)), world=4), sealed=True)


def _second_case(seed: int, grader_seed: int) -> Case:
    """Another fault than case_for(seed)'s, drawn from both seeds: the check's own case."""
    own = case_for(seed).fault
    rng = np.random.default_rng([int(seed), int(grader_seed), 9])
    return draw(rng, str(rng.choice([f for f in FAULTS if f != own])), world=4)


def lineup(seed: int = 0) -> dict[str, Case]:
    """Labelled cases to learn from: two healthy runs (one all_reduce; ranks that sum in
    their own order) and one run per fault (a bit flip both in the mantissa and in the
    exponent), all with the same training seed, on 4 ranks."""
    rng = np.random.default_rng([int(seed), 88])
    train = int(rng.integers(1, 10**6))
    cases = {"healthy": Case(train), "healthy, ring order": Case(train, reduce="ring")}
    for f in FAULTS:
        cases[f] = draw(rng, f, size=float(rng.choice(FLIP_BITS[:-1])) if f == "bit_flip" else None)
    cases["bit_flip, exponent"] = draw(rng, "bit_flip", size=30.0)
    return {k: dataclasses.replace(c, seed=train) for k, c in cases.items()}


def healthy_cases() -> list[Case]:
    """Six healthy runs on 4 ranks: the line-up's two, and two more seeds, both reductions."""
    return [Case(seed, reduce=r) for seed in (lineup()["healthy"].seed, 2026, 2027)
            for r in REDUCES]


def answer(case: Case) -> dict:
    """The truth of a line-up case: {"fault", "rank", "step"} (None, None for a healthy run).
    Your own case is sealed: check("detective_case") says whether you solved it."""
    if case.sealed:
        raise ValueError("this case is sealed: diagnose it from its observations, and "
                         'check("detective_case") tells you whether you are right')
    if case.fault == "healthy":
        return {"fault": "healthy", "rank": None, "step": None}
    return {"fault": case.fault, "rank": case.rank, "step": case.step}


# --- what the checks measure on the observations -------------------------------------------------


def replica_spread(obs: dict, key: str = "params") -> np.ndarray:
    """(steps, world): max |x_r - median over ranks of x| per step and rank (inf if not finite)."""
    x = np.nan_to_num(obs[key].astype(np.float64), nan=np.inf)
    med = np.median(x, axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        d = np.abs(x - med)
    return np.where(np.isnan(d), np.inf, d).max(axis=2)


def grad_ratio(obs: dict) -> np.ndarray:
    """(steps, world): each rank's grad_norm over the median of the other ranks'."""
    g = obs["grad_norm"].astype(np.float64)
    w = g.shape[1]
    others = np.stack([np.median(np.delete(g, r, axis=1), axis=1) for r in range(w)], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return g / others


def loss_ratio(obs: dict) -> np.ndarray:
    """(steps, world): each rank's loss over the median of the ranks' losses at that step."""
    loss = obs["loss"].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return loss / np.median(loss, axis=1, keepdims=True)


# --- the lab -------------------------------------------------------------------------------------

LAB = Lab("08_divergence_detective", "The silent-divergence detective",
          follows="08_silent_divergence")

LOSS = LAB.exercise(
    "detective_loss", needs=("loss_detector",),
    title="Step 1: watch the loss",
    hints=("Loop over the steps t; at each step compare every rank's loss with the median "
           "of the ranks' losses at that step (np.median(obs['loss'][t])).",
           "A NaN fails every comparison (NaN > x is False): test np.isfinite(loss) first.",
           "Return (rank, t) at the first step where a rank's loss is not finite or more "
           "than 5 x the median; return None if no step qualifies."))
REPLICAS = LAB.exercise(
    "detective_replicas", needs=("replica_detector",),
    title="Step 2: compare the replicas",
    hints=("At every step, compare each rank's parameters obs['params'][t][r] with the "
           "elementwise median over ranks np.median(obs['params'][t], axis=0): with one odd "
           "rank among three or more, the median is a healthy replica.",
           "Exact equality false-alarms when the ranks add the gradients in different orders: "
           "their replicas differ by ~1e-7. Call a rank odd when its largest difference "
           "exceeds a tolerance such as 1e-5.",
           "A NaN difference must count as a difference: np.nan_to_num(x, nan=np.inf), or "
           "test `not (d <= tol)` instead of `d > tol`."))
DETECTOR = LAB.exercise(
    "detective_detector", needs=("detector",),
    title="Step 3: the detector that misses nothing",
    hints=("Start from replica_detector; at each step also compare obs['buffers'][t] across "
           "ranks the same way (BatchNorm running statistics are state, not parameters).",
           "For a gradient scaled on one rank before the all-reduce the replicas stay equal: "
           "compare each rank's own grad_norm with the median of the other ranks' at that "
           "step. Healthy ranks differ by a factor 2 to 3 at times (different batches); 4x "
           "is a fault.",
           "Decide at step t from steps 0..t only (no medians over the whole run): the check "
           "gives your detector the run cut after its alarm and expects the same alarm."))
QUIET = LAB.exercise(
    "detective_no_false_alarm", needs=("detector",),
    title="No false alarms on healthy runs",
    hints=("A healthy run with ranks that add in their own order has replicas that differ "
           "by rounding (~1e-7): your tolerance must be above that.",
           "Healthy ranks' own gradient norms differ by a factor 2 to 3 at times: alarm on "
           "a ratio of 4 or more, not 2."))
CASE = LAB.exercise(
    "detective_case", needs=("diagnose", "MY_SEED"),
    title="The verdict: fault, rank, first bad step",
    hints=("Find the first step at which any rank is odd in params, in buffers, or in its "
           "gradient norm: the earliest of the three tells the family.",
           "Parameters differ first: skipped_allreduce if that rank's synced_norm differs at "
           "that step; bit_flip if exactly one element differs; wrong_lr if its update "
           "(params[s] - params[s-1], or obs['start'] for s = 0) is a multiple of the "
           "others'; otherwise rng_desync.",
           "Only buffers differ: stale_buffer. Nothing differs but one rank's grad_norm is "
           "4x the others': wrong_scale."))


def _label(c: Case) -> str:
    if c.fault == "healthy":
        how = "ranks adding in their own order" if c.reduce == "ring" else "one all_reduce"
        return f"a healthy run ({c.world} ranks, {how}, seed {c.seed})"
    return f"{c.fault} on rank {c.rank} from step {c.step} ({c.world} ranks, seed {c.seed})"


def _sign(c: Case, fault: str | None = None) -> str:
    """SIGNS of a fault, with this case's rank and step filled in."""
    text = SIGNS[fault or c.fault]
    return text.replace("rank r", f"rank {c.rank}").replace("step s", f"step {c.step}")


def _alarm(ctx, fn, obs: dict, name: str):
    """fn(obs) as None or a (rank, step) pair of ints; anything else fails with a sentence."""
    out = ctx.call(fn, _copy(obs))
    if out is None:
        return None
    try:
        rank, step = out
        if int(rank) != rank or int(step) != step:
            raise ValueError
        return int(rank), int(step)
    except (TypeError, ValueError):
        raise Fail(f"{name} must return None or a pair (rank, step) of ints, got {out!r}") \
            from None


def _false_alarm(ctx, fn, c: Case, obs: dict, alarm, name: str) -> str:
    """Why a detector alarmed on a healthy run, inferred from what it saw at that step."""
    r, t = alarm
    msg = f"{name} alarms on {_label(c)} at step {t} (rank {r}): a false alarm"
    if not (0 <= t < obs["steps"] and 0 <= r < obs["world"]):
        return msg + f" (and step {t} / rank {r} is not in this run)"
    same = _copy(obs)  # every rank logs exactly what rank 0 logged: nothing to alarm on
    for k in SERIES:
        same[k][:] = same[k][:, :1]
    if _alarm(ctx, fn, same, name) is not None:
        return msg + ("; it alarms even on a run where every rank logged exactly the same "
                      "numbers: does it alarm whatever it sees?")
    spread = max(replica_spread(obs, "params")[t].max(), replica_spread(obs, "buffers")[t].max())
    g, lo = grad_ratio(obs), loss_ratio(obs)
    if name != "loss_detector" and 0 < spread < TOL:
        return msg + (f"; the replicas differ there by only {spread:.1e}: rounding, because "
                      "these ranks add the gathered gradients in different orders. Compare "
                      "with a tolerance (e.g. 1e-5), not exact equality")
    if name == "detector" and 1 < g[t, r] < 4:
        return msg + (f"; rank {r}'s own gradient norm is {g[t, r]:.2f}x the other ranks' "
                      f"median there, and healthy ranks reach {np.nanmax(g):.2f}x in this run "
                      "(their batches differ): alarm only from 4x")
    if name != "replica_detector" and 1 < lo[t, r] < 5:
        return msg + (f"; rank {r}'s loss is {lo[t, r]:.2f}x the ranks' median there, and "
                      f"healthy batches reach {np.nanmax(lo):.2f}x in this run: alarm only on "
                      "non-finite losses or jumps of 5x")
    return msg + (f"; nothing at step {t} differs beyond a healthy run's noise: does it compare "
                  "with other steps (a median over the whole run?)")


def _judge(c: Case, alarm, name: str) -> str | None:
    """None if `alarm` is right for faulty case c, else a sentence."""
    if alarm is None:
        return f"missed {_label(c)}: {_sign(c)}"
    r, t = alarm
    if t < c.step:
        return (f"alarmed at step {t} on {_label(c)}, before the fault started: a false alarm")
    if r != c.rank:
        why = ""
        if c.rank == 0:
            why = (": the other ranks agree with each other, rank 0 is the odd one; compare each "
                   "rank with the majority (the median over ranks), not with rank 0")
        return f"named rank {r} for {_label(c)}; the faulty rank is {c.rank}{why}"
    if t > c.step + DELAY:
        return (f"alarmed at step {t} on {_label(c)}: {t - c.step} steps after the first bad "
                f"step, more than the {DELAY} allowed")
    return None


def _grade(ctx, fn, cases: list[Case], obs: list[dict], name: str) -> str:
    """Every faulty case caught in time with the right rank; every healthy one silent."""
    problems, caught = [], []
    for c, o in zip(cases, obs):
        alarm = _alarm(ctx, fn, o, name)
        if c.fault == "healthy":
            if alarm is not None:
                problems.append(_false_alarm(ctx, fn, c, o, alarm, name))
            continue
        wrong = _judge(c, alarm, name)
        (problems if wrong else caught).append(wrong or c)
    faulty = [c for c in cases if c.fault != "healthy"]
    if problems:
        extra = f" (+{len(problems) - 2} more)" if len(problems) > 2 else ""
        loud = [c for c in caught if c.fault == "bit_flip" and c.size >= 23]
        why = ""
        if faulty and loud and len(caught) == len(loud) < len(faulty):
            why = (" Only the bit flip that made the weights non-finite was caught: silent "
                   "faults do not show in the loss; compare the ranks instead.")
        head = (f"{len(caught)} of {len(faulty)} faults caught: " if faulty else
                f"{len(problems)} false alarm(s) on {len(cases)} healthy runs: ")
        raise Fail(head + "; ".join(problems[:2]) + extra + "." + why)
    quiet = f"silent on {len(cases) - len(faulty)} healthy runs"
    if not faulty:
        return quiet
    return (f"{len(faulty)} faults caught in time, naming the rank"
            + (f"; {quiet}" if len(faulty) < len(cases) else ""))


def _lineup_obs(keys=None) -> tuple[list[Case], list[dict]]:
    cases = [c for k, c in lineup().items() if keys is None or k in keys]
    return cases, observe_many(cases)


HIDDEN_NIC = "delay 1ms 200us"


def _hidden(ctx, world: int, kinds=("healthy", *FAULTS)) -> tuple[list, list]:
    """The hidden cases on `world` ranks (healthy ones, and one per fault plus a second bit
    flip), drawn from the grader's seed: every hidden check of one grading shares them, so
    they run once, on one cluster per world size, over an impaired network."""
    rng = np.random.default_rng([ctx.grader_seed, world, 808])
    cases = [draw(rng, "healthy", world, reduce=REDUCES[i % 2]) for i in range(4 if world == 3
                                                                                  else 2)]
    cases += [draw(rng, f, world) for f in (*FAULTS, "bit_flip")]
    obs = observe_many(cases, nic=HIDDEN_NIC)
    keep = [i for i, c in enumerate(cases) if c.fault in kinds]
    return [cases[i] for i in keep], [obs[i] for i in keep]


def _both(ctx, kinds=("healthy", *FAULTS)) -> tuple[list, list]:
    three, four = _hidden(ctx, 3, kinds), _hidden(ctx, 4, kinds)
    return three[0] + four[0], three[1] + four[1]


PARAM_FAULTS = ("rng_desync", "skipped_allreduce", "wrong_lr", "bit_flip")


@LOSS.check("silent on healthy runs (one all_reduce; ranks adding in their own order)")
def _loss_quiet(ctx):
    cases, obs = _lineup_obs(("healthy", "healthy, ring order"))
    return _grade(ctx, ctx.learner("loss_detector"), cases, obs, "loss_detector")


@LOSS.check("alarms on a loss spike and on a non-finite loss, naming the rank")
def _loss_loud(ctx):
    fn = ctx.learner("loss_detector")
    (healthy,), (obs,) = _lineup_obs(("healthy",))
    for r, t, value, what in ((1, 9, 50.0, "a loss 50x its usual value"),
                              (2, 12, np.nan, "a NaN loss")):
        o = _copy(obs)
        o["loss"][t, r] = value if np.isnan(value) else value * o["loss"][t, r]
        got = _alarm(ctx, fn, o, "loss_detector")
        if got != (r, t):
            raise Fail(f"given a healthy run with {what} on rank {r} at step {t}, loss_detector "
                       f"returned {got}, not ({r}, {t})"
                       + (": a NaN fails every comparison, test np.isfinite"
                          if np.isnan(value) and got is None else ""))
    (flip,), (o,) = _lineup_obs(("bit_flip, exponent",))
    got = _alarm(ctx, fn, o, "loss_detector")
    want = (flip.rank, flip.step + 1)  # the flipped weight shows in the next forward pass
    if got != want:
        raise Fail(f"on a run where an exponent bit flip on rank {flip.rank} at step {flip.step} "
                   f"makes its loss NaN at step {flip.step + 1}, loss_detector returned {got}, "
                   f"not {want}")
    return "a spike, a NaN, and a real exponent bit flip caught"


@LOSS.check("silent on 4 hidden healthy runs (3 ranks)", hidden=True)
def _loss_hidden(ctx):
    cases, obs = _hidden(ctx, 3, ("healthy",))
    return _grade(ctx, ctx.learner("loss_detector"), cases, obs, "loss_detector")


@REPLICAS.check("silent on healthy runs, including ranks that differ by rounding")
def _replicas_quiet(ctx):
    cases, obs = _lineup_obs(("healthy", "healthy, ring order"))
    return _grade(ctx, ctx.learner("replica_detector"), cases, obs, "replica_detector")


def _nan_replica(ctx, fn, name: str) -> None:
    """A healthy run in which one rank's parameters hold a NaN at one step (and only there):
    the detector must name that rank at that step. |NaN - x| is NaN, and NaN > tol is False,
    so a detector without a NaN guard stays silent."""
    (_,), (obs,) = _lineup_obs(("healthy",))
    r, t = 2, 7
    o = _copy(obs)
    o["params"][t, r, 3] = np.nan
    got = _alarm(ctx, fn, o, name)
    if got != (r, t):
        raise Fail(f"given a healthy run where one of rank {r}'s parameters is NaN at step {t}, "
                   f"{name} returned {got}, not ({r}, {t})"
                   + (": a NaN difference fails every comparison (NaN > tol is False, and "
                      "max() of an array holding a NaN is NaN); count a non-finite difference "
                      "as a difference" if got is None else ""))


@REPLICAS.check("catches the faults that move a replica, at the first bad step", points=2)
def _replicas_catch(ctx):
    fn = ctx.learner("replica_detector")
    cases, obs = _lineup_obs(PARAM_FAULTS + ("bit_flip, exponent",))
    detail = _grade(ctx, fn, cases, obs, "replica_detector")
    _nan_replica(ctx, fn, "replica_detector")
    return detail + "; and a NaN in one rank's parameters"


@REPLICAS.check("the same on hidden runs (3 ranks, other seeds)", points=2, hidden=True)
def _replicas_hidden(ctx):
    cases, obs = _hidden(ctx, 3, ("healthy", *PARAM_FAULTS))
    return _grade(ctx, ctx.learner("replica_detector"), cases, obs, "replica_detector")


@DETECTOR.check("alarms on every fault of the line-up within 2 steps, naming the rank",
                points=2)
def _detector_lineup(ctx):
    cases, obs = _lineup_obs()
    return _grade(ctx, ctx.learner("detector"), cases, obs, "detector")


@DETECTOR.check("decides online: the run cut after its alarm gives the same alarm")
def _detector_online(ctx):
    fn = ctx.learner("detector")
    cases, obs = _lineup_obs(FAULTS)
    for c, o in zip(cases, obs):
        alarm = _alarm(ctx, fn, o, "detector")
        if alarm is None or not 0 <= alarm[1] < o["steps"]:
            continue  # the line-up check says what is wrong with it
        again = _alarm(ctx, fn, cut(o, alarm[1] + 1), "detector")
        if again != alarm:
            raise Fail(f"on {_label(c)} detector alarms with {alarm} on the whole run, but "
                       f"returns {again} given steps 0..{alarm[1]} only: it uses the future "
                       "(e.g. a median over the whole run). Decide at step t from steps 0..t")
    return "every alarm is raised from the steps up to it"


@DETECTOR.check("alarms on 14 hidden faults, every kind on 3 and 4 ranks", points=3,
                hidden=True)
def _detector_hidden(ctx):
    cases, obs = _both(ctx)
    return _grade(ctx, ctx.learner("detector"), cases, obs, "detector")


@QUIET.check("silent on 6 healthy runs: 3 seeds, both reductions")
def _quiet_visible(ctx):
    cases = healthy_cases()
    return _grade(ctx, ctx.learner("detector"), cases, observe_many(cases), "detector")


@QUIET.check("silent on 6 hidden healthy runs (3 and 4 ranks)", points=2, hidden=True)
def _quiet_hidden(ctx):
    cases, obs = _both(ctx, ("healthy",))
    return _grade(ctx, ctx.learner("detector"), cases, obs, "detector")


def _verdict(ctx, fn, obs: dict) -> dict:
    out = ctx.call(fn, _copy(obs))
    if not isinstance(out, dict) or not {"fault", "rank", "step"} <= set(out):
        raise Fail(f"diagnose must return a dict with keys 'fault', 'rank' and 'step', got "
                   f"{out!r}")
    fault = out["fault"]
    if fault not in FAULTS:
        raise Fail(f"diagnose named the fault {fault!r}; it must be one of {', '.join(FAULTS)}")
    try:
        return {"fault": fault, "rank": int(out["rank"]), "step": int(out["step"])}
    except (TypeError, ValueError):
        raise Fail(f"diagnose must give the rank and the step as ints, got {out!r}") from None


def _compare(c: Case, got: dict, *, reveal: bool) -> str | None:
    """None if the verdict is right; else what is wrong (the fault named only if reveal)."""
    if got["fault"] != c.fault:
        if reveal:
            return f"{_label(c)}: you named {got['fault']}; it is {c.fault}: {_sign(c)}"
        return (f"it is not {got['fault']}: {SIGNS[got['fault']]}, which is not what this "
                "run shows; compare with the line-up")
    where = _label(c) if reveal else "your case"
    if got["rank"] != c.rank:
        return f"{where}: the fault is right, the rank is not: you named rank {got['rank']}"
    if got["step"] != c.step:
        late = " (one step late)" if got["step"] == c.step + 1 else ""
        return (f"{where}: you reported step {got['step']}{late}; the first bad step is "
                f"{c.step}: {FIRST[c.fault].replace('rank r', f'rank {c.rank}')}")
    return None


def _diagnose_all(ctx, cases, obs, reveal=True) -> str:
    fn = ctx.learner("diagnose")
    wrong = [w for c, o in zip(cases, obs) if (w := _compare(c, _verdict(ctx, fn, o),
                                                             reveal=reveal))]
    if wrong:
        extra = f" (+{len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise Fail(f"{len(cases) - len(wrong)} of {len(cases)} cases solved: {wrong[0]}{extra}")
    return f"{len(cases)} of {len(cases)} cases solved"


@CASE.check("names the fault, rank and first bad step of every line-up case")
def _case_lineup(ctx):
    ctx.learner("diagnose")
    cases = [c for c in lineup().values() if c.fault != "healthy"]
    return _diagnose_all(ctx, cases, observe_many(cases))


@CASE.check("solves your case", points=2)
def _case_mine(ctx):
    ctx.learner("diagnose")
    seed = ctx.learner("MY_SEED")
    if not isinstance(seed, int | np.integer):
        raise Fail(f"MY_SEED must be an integer (your case's seed), got {seed!r}")
    case = case_for(int(seed))
    _diagnose_all(ctx, [case], [observe(case)], reveal=False)
    # A diagnose that reads the answer off `case` (a closure) solves this case and no other:
    # it must also solve a second case, of another fault, drawn from your seed
    other = _second_case(int(seed), ctx.grader_seed)
    try:
        _diagnose_all(ctx, [other], [observe(other)], reveal=False)
    except Fail as exc:
        raise Fail(f"your case is solved, but a second case drawn from your seed is not "
                   f"({exc}): diagnose must work from the observations it is given") from None
    return (f"case {seed} closed: fault, rank and first bad step are right (and on a second "
            "case drawn from it)")


@CASE.check("solves 14 hidden cases, every kind on 3 and 4 ranks", points=3, hidden=True)
def _case_hidden(ctx):
    ctx.learner("diagnose")
    cases, obs = _both(ctx, FAULTS)
    return _diagnose_all(ctx, cases, obs)
