"""Lab 03: DDP from scratch - blocking all-reduces, then hooks, then buckets, then the timeline.

The learner writes, in the notebook:

    allreduce_gradients(model)      step 1: after backward, one blocking all_reduce per gradient
    HookDDP(model).finish()         step 2: post-accumulate-grad hooks launch async all_reduces
    BucketDDP(model, bucket_bytes)  step 3: the same, one all_reduce per bucket of ~B bytes
    fifo_timeline(ready_s, comm_s)  step 4: when each message of a FIFO stream starts and ends

How it is graded. `train_on_rank` trains a small language model on every rank of a real cluster
with the learner's synchronisation, on each rank's shard of one global batch, and records
every `dist.all_reduce` call (it wraps the function on the rank: when, how many bytes, which
parameter's `.grad`, blocking or not, how long the call took) and when each parameter's
gradient was final (a post-accumulate-grad hook registered before the learner's). The parent
trains the same model in one process on the whole global batch: after k steps of SGD the
ranks must hold those parameters to float precision. The model has a FROZEN layer
(requires_grad=False: no hook, no all-reduce, no change) and TIED weights (the embedding is
also the output projection: one parameter used twice, whose gradient is final only after
both uses). When the result is wrong, the parent also trains the answers of known mistakes
(summed gradients = the baseline at world x the learning rate; no synchronisation = each
rank alone on its shard) and names the mistake the learner's parameters match.

The overlap check runs naive, hooks and buckets on one time-dilated cluster whose NICs are
"delay 1ms rate 1gbit" and compares each measured saving over naive with the timeline's
prediction: backward compute per parameter measured in the naive run, every message's
all-reduce from the alpha-beta model, queued FIFO (the backend's completion thread is FIFO,
like a communication stream).
"""

from __future__ import annotations

import time

import numpy as np

from .. import models
from ..experiments.ddp import beta_of
from ..netem import Netem
from .core import Fail, Lab

LAB = Lab("03_ddp_from_scratch", "DDP from scratch: hooks, buckets and the overlap they buy",
          follows="03_ddp_step_anatomy")

TIED, TIED_ALIAS = "embed.weight", "head.weight"  # one parameter, two names
RTOL = 1e-5  # relative tolerance on every parameter after k steps (float32; see _close)

# The visible configuration (hidden checks draw others from ctx.rng).
SMALL = dict(vocab=48, dim=32, layers=3, batch=4, steps=3, lr=0.5, seed=3, backward_s=0.0)
# The timed configuration: per-layer backward compute (emulated seconds), bigger tensors.
TIMED = dict(vocab=512, dim=128, layers=4, batch=8, steps=5, warmup=1, lr=0.05, seed=1,
             backward_s=0.003)
TIMED_NIC = "delay 1ms rate 1gbit"
TIMED_DILATION = 5.0
TIMED_BUCKET = 160_000  # bytes: about two blocks per bucket
SAVING_TOL = 0.30  # |measured - predicted| saving, relative to the prediction (see ddp_overlap)


# --- the model every rank trains -------------------------------------------------------------


def _accelerator():
    """An autograd Function that sleeps in backward: the accelerator's per-layer compute,
    in emulated seconds (multiplied by the dilation, since clusterlab.now() divides by it)."""
    import torch

    from ..clock import dilation

    class Accelerator(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, backward_s):
            ctx.backward_s = backward_s
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            if ctx.backward_s > 0:
                time.sleep(ctx.backward_s * dilation())
            return grad, None

    return Accelerator


def build_model(vocab: int = 48, dim: int = 32, layers: int = 3, seed: int = 0,
                backward_s: float = 0.0, **_):
    """A tiny language model: embedding (TIED with the output projection), a FROZEN linear
    layer, `layers` residual tanh blocks (each with `backward_s` of emulated backward
    compute), and the output projection (the embedding's weight, plus its own bias)."""
    import torch

    accelerator = _accelerator()

    class TinyLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, dim)
            self.frozen = torch.nn.Linear(dim, dim)
            self.frozen.requires_grad_(False)
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(layers))
            self.head = torch.nn.Linear(dim, vocab)
            self.head.weight = self.embed.weight  # tied: one Parameter, used twice

        def forward(self, tokens):
            h = torch.tanh(self.frozen(self.embed(tokens)))
            for block in self.blocks:
                h = accelerator.apply(h + torch.tanh(block(h)), backward_s)
            return self.head(h)

    torch.manual_seed(seed)
    return TinyLM()


def _batch(cfg: dict, step: int, world: int):
    """The global batch of one step (same on every rank): tokens and next tokens."""
    import torch

    gen = torch.Generator().manual_seed(cfg["seed"] * 7919 + step)
    n = cfg["batch"] * world
    tokens = torch.randint(0, cfg["vocab"], (n,), generator=gen)
    targets = torch.randint(0, cfg["vocab"], (n,), generator=gen)
    return tokens, targets


def param_table(cfg: dict) -> list[dict]:
    """Each parameter of the model, in model.parameters() order: name, bytes, trainable."""
    model = build_model(**cfg)
    return [{"name": n, "bytes": p.numel() * p.element_size(), "trainable": p.requires_grad}
            for n, p in model.named_parameters()]


def bucket_plan(cfg: dict, bucket_bytes: int) -> list[list[str]]:
    """The buckets the lab asks for: trainable parameters in REVERSE model.parameters()
    order, added to the current bucket until it holds >= bucket_bytes, then a new one."""
    buckets, current, size = [], [], 0
    for row in reversed(param_table(cfg)):
        if not row["trainable"]:
            continue
        current.append(row["name"])
        size += row["bytes"]
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


# --- what runs on every rank ------------------------------------------------------------------


def train_on_rank(cfg: dict, kind: str, learner) -> dict:
    """Train cfg["steps"] steps (after cfg["warmup"]) with the learner's synchronisation;
    record every all_reduce call and every gradient's ready time; return the parameters."""
    import torch
    import torch.distributed as dist

    from ..clock import dilation

    rank, world = dist.get_rank(), dist.get_world_size()
    k = dilation()  # report emulated seconds
    model = build_model(**cfg)
    named = dict(model.named_parameters())  # a tied weight appears once, as embed.weight
    ready: dict[str, int] = {}
    for name, p in named.items():  # registered first: runs before the learner's hooks
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(
                lambda _p, name=name: ready.__setitem__(name, time.monotonic_ns()))
    state = {"step": -1, "phase": "setup"}
    calls: list[dict] = []
    works: list[tuple[dict, object]] = []

    def which(t) -> str | None:
        for name, p in named.items():
            if p.grad is not None and p.grad.data_ptr() == t.data_ptr() \
                    and p.grad.numel() == t.numel():
                return name
        for name, p in named.items():
            if p.data_ptr() == t.data_ptr():
                return name + " (the parameter itself, not its .grad)"
        return None

    real = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        async_op = bool(kwargs.get("async_op", args[2] if len(args) > 2 else False))
        entry = {"step": state["step"], "phase": state["phase"], "call": time.monotonic_ns(),
                 "bytes": tensor.numel() * tensor.element_size(), "async": async_op,
                 "param": which(tensor)}
        work = real(tensor, *args, **kwargs)
        entry["return"] = time.monotonic_ns()
        entry["blocked_ns"] = entry["return"] - entry["call"] if work is None else 0
        calls.append(entry)
        if work is None:
            return None
        works.append((entry, work))
        return _Tracked(work, entry, state)

    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])  # skips grads that are None
    dist.all_reduce = counted
    steps = []
    try:
        sync = None
        if kind == "hooks":
            sync = learner(model)
        elif kind == "buckets":
            sync = learner(model, cfg["bucket_bytes"])
        b = cfg["batch"]
        for step in range(cfg.get("warmup", 0) + cfg["steps"]):
            tokens, targets = _batch(cfg, step, world)
            tokens, targets = tokens[rank * b:(rank + 1) * b], targets[rank * b:(rank + 1) * b]
            opt.zero_grad(set_to_none=True)
            ready.clear()
            state.update(step=step, phase="forward")
            t0 = time.monotonic_ns()
            loss = torch.nn.functional.cross_entropy(model(tokens), targets)
            state["phase"] = "backward"
            t1 = time.monotonic_ns()
            loss.backward()
            state["phase"] = "finish"
            t2 = time.monotonic_ns()
            if kind == "naive":
                learner(model)
            else:
                sync.finish()
            t3 = time.monotonic_ns()
            pending = [e["param"] or f"a {e['bytes']}-byte tensor" for e, w in works
                       if e["step"] == step and not w.is_completed()]
            state["phase"] = "optimizer"
            opt.step()
            t4 = time.monotonic_ns()
            steps.append({"t": [t0, t1, t2, t3, t4], "ready": dict(ready), "pending": pending,
                          "measured": step >= cfg.get("warmup", 0)})
    finally:
        dist.all_reduce = real
    for s in steps:  # emulated seconds since the step began
        t0 = s["t"][0]
        s["t"] = [(t - t0) / 1e9 / k for t in s["t"]]
        s["ready"] = {n: (t - t0) / 1e9 / k for n, t in s["ready"].items()}
    for c in calls:  # how long the caller was blocked in backward, emulated seconds
        c["blocked"] = c["blocked_ns"] / 1e9 / k
    params = {n: p.detach().numpy().copy() for n, p in named.items()}
    grads_frozen = [n for n, p in named.items() if not p.requires_grad and p.grad is not None]
    return {"rank": rank, "params": params, "steps": steps, "calls": calls,
            "frozen_with_grad": grads_frozen}


class _Tracked:
    """The Work that dist.all_reduce returned, noting who waits for it and when: a wait()
    inside backward is a hook that blocks. Everything else is the Work's own."""

    def __init__(self, work, entry: dict, state: dict) -> None:
        self._work, self._entry, self._state = work, entry, state

    def _note(self, t0: int) -> None:
        if self._state["phase"] == "backward":
            self._entry["waited_in_backward"] = True
            self._entry["blocked_ns"] += time.monotonic_ns() - t0

    def wait(self, *args, **kwargs):
        t0 = time.monotonic_ns()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._note(t0)

    def get_future(self):
        if self._state["phase"] == "backward":
            self._entry["future_in_backward"] = True
        return self._work.get_future()

    def __getattr__(self, name):
        return getattr(self._work, name)


# --- what the parent does: baselines, diagnosis -----------------------------------------------


def baseline(cfg: dict, world: int, *, lr_scale: float = 1.0, only_rank: int | None = None):
    """One process, SGD for cfg["steps"] (+warmup) steps on the global batch (or, with
    only_rank, on that rank's shard alone): {name: parameter}."""
    import torch

    model = build_model(**{**cfg, "backward_s": 0.0})
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"] * lr_scale)
    b = cfg["batch"]
    for step in range(cfg.get("warmup", 0) + cfg["steps"]):
        tokens, targets = _batch(cfg, step, world)
        if only_rank is not None:
            tokens = tokens[only_rank * b:(only_rank + 1) * b]
            targets = targets[only_rank * b:(only_rank + 1) * b]
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(tokens), targets).backward()
        opt.step()
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))


def _close(a, b) -> bool:
    # float32: the ranks sum their shards' mean gradients in another order than one process
    # sums the global batch; after a few steps that is ~1e-7 relative, a mistake is >1e-2.
    return _rel(a, b) <= RTOL


def _names(names) -> str:
    names = [f"`{n}`" + (f" (= `{TIED_ALIAS}`, tied)" if n == TIED else "") for n in names]
    return ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]


def diagnose(results: list[dict], cfg: dict, kind: str) -> str:
    """Fail with the likely mistake if the ranks' parameters differ from the baseline;
    else return a detail string."""
    world = len(results)
    table = {row["name"]: row for row in param_table(cfg)}
    trainable = [n for n, r in table.items() if r["trainable"]]
    frozen = [n for n, r in table.items() if not r["trainable"]]
    ref = baseline(cfg, world)
    init = build_model(**cfg)
    init = {n: p.detach().numpy() for n, p in init.named_parameters()}
    for r in results:
        for s in r["steps"]:
            if s["pending"]:
                raise Fail(f"rank {r['rank']}: when finish() returned, the all-reduce of "
                           f"{_names(s['pending'][:4])} had not completed, so the optimizer "
                           "stepped on half-reduced gradients: wait() every work (and then "
                           "average) before finish() returns.")
    for r in results:
        touched = [n for n in frozen if not np.array_equal(r["params"][n], init[n])]
        if touched or r["frozen_with_grad"]:
            raise Fail(f"rank {r['rank']}: the frozen parameter(s) "
                       f"{_names(touched or r['frozen_with_grad'])} (requires_grad=False) "
                       "got a gradient or changed: skip parameters that do not require grad "
                       "(no hook, no all-reduce, grad stays None).")
    bad = {r["rank"]: [n for n in trainable if not _close(r["params"][n], ref[n])]
           for r in results}
    if not any(bad.values()):
        err = max(_rel(r["params"][n], ref[n]) for r in results for n in trainable)
        return (f"{world} ranks x {cfg['steps'] + cfg.get('warmup', 0)} steps equal one "
                f"process on the global batch (largest relative error {err:.1e}); the frozen "
                "layer is unchanged")
    rank = next(r for r in results if bad[r["rank"]])
    wrong = bad[rank["rank"]]
    summed = baseline(cfg, world, lr_scale=world)
    if all(_close(rank["params"][n], summed[n]) for n in wrong):
        raise Fail(f"rank {rank['rank']}: {_names(wrong)} equal the baseline trained with "
                   f"{world}x the learning rate: those gradients were summed over the ranks, "
                   f"not averaged - divide each reduced gradient by the world size ({world}).")
    halved = baseline(cfg, world, lr_scale=1 / world)
    if all(_close(rank["params"][n], halved[n]) for n in wrong):
        raise Fail(f"rank {rank['rank']}: {_names(wrong)} equal the baseline trained with "
                   f"1/{world} of the learning rate: those gradients were divided by the "
                   f"world size twice (in the hook and again in finish(), say) - divide each "
                   "reduced gradient once.")
    # A gradient that was never all-reduced leaves the ranks with different values (each
    # stepped on its own shard's gradient); a reduced one is bitwise equal on every rank.
    split = [n for n in trainable if any(not _close(r["params"][n], results[0]["params"][n])
                                         for r in results[1:])]
    tied = (f" The tied weight {_names([TIED])} is used twice; its gradient is complete only "
            "after both uses have accumulated: all-reduce p.grad once, from "
            "register_post_accumulate_grad_hook (Tensor.register_hook runs BEFORE "
            "accumulation: the tensor it reduces need not be the p.grad the optimizer reads - "
            "for a tied weight it is not).")
    if split:
        why = {"naive": "all-reduce every trainable parameter's .grad after backward.",
               "hooks": "each hook must all-reduce p.grad once it is accumulated, and "
                        "finish() must wait() for each work BEFORE dividing that gradient (a "
                        "division while its all-reduce still runs races with it, and the "
                        "ranks drift apart; a list of pending works that is never cleared "
                        "does that too: the earlier steps' entries divide the new gradients "
                        "before their all-reduces are done).",
               "buckets": "is the last, partial bucket ever all-reduced? finish() must flush "
                          "it, and each bucket's result must be copied back into p.grad."}[kind]
        local = baseline(cfg, world, only_rank=results[0]["rank"])
        if len(split) == len(trainable) and all(
                _close(results[0]["params"][n], local[n]) for n in trainable):
            raise Fail("every parameter equals rank 0 training alone on its own shard: no "
                       "gradient was averaged across the ranks before the optimizer step - "
                       f"{why}")
        raise Fail(f"{_names(split)} never synchronized: the ranks ended with different "
                   f"values - {why}" + (tied if TIED in split and kind == "hooks" else ""))
    if wrong == [TIED]:
        raise Fail(f"rank {rank['rank']}: the tied weight is wrong (relative error "
                   f"{_rel(rank['params'][TIED], ref[TIED]):.1e}).{tied}")
    if len(wrong) == len(trainable):
        raise Fail(f"rank {rank['rank']}: every trainable parameter differs from one process "
                   f"trained on the global batch (largest relative error "
                   f"{max(_rel(rank['params'][n], ref[n]) for n in wrong):.1e}), yet the ranks "
                   "agree with each other: the all-reduces happened, the scale is off. Divide "
                   "each reduced gradient by the world size exactly once per step (a list of "
                   "pending works that is never cleared divides earlier steps' gradients "
                   "again; a division in the hook and another in finish() divides twice).")
    raise Fail(f"rank {rank['rank']}: {_names(wrong)} differ from one process trained on the "
               f"global batch (largest relative error "
               f"{max(_rel(rank['params'][n], ref[n]) for n in wrong):.1e}).")


# --- a run, cached so that the checks of one exercise share it ---------------------------------

_cache: dict = {}


def train(ctx, kind: str, learner, cfg: dict, *, nodes: int = 2, nic: str | None = None,
          dilation: float = 1.0) -> list[dict]:
    """Run `train_on_rank` on a fresh cluster (or return the same run for the same learner)."""
    key = (kind, tuple(sorted(cfg.items())), nodes, nic, dilation)
    hit = _cache.get(key)
    if hit is not None and hit[0] is learner:
        return hit[1]
    with ctx.cluster(nodes=nodes, nic=nic, dilation=dilation) as cl:
        try:
            out = ctx.run(cl, train_on_rank, cfg, kind, learner)
        except Fail as exc:
            text = str(exc)
            if "NoneType" in text:
                raise Fail(f"{text} - a parameter's .grad was None: the frozen layer "
                           "(requires_grad=False) gets no gradient; skip it.") from None
            if "doesn't require gradient" in text or "does not require grad" in text:
                raise Fail(f"{text} - only hook parameters with requires_grad=True (the "
                           "frozen layer has none).") from None
            raise
    _cache.clear()
    _cache[key] = (learner, out)
    return out


def _hidden_cfg(ctx, **extra) -> tuple[dict, int]:
    rng = ctx.rng
    cfg = dict(vocab=int(rng.integers(24, 80)), dim=int(rng.choice([16, 24, 40])),
               layers=int(rng.integers(2, 5)), batch=int(rng.integers(2, 6)),
               steps=int(rng.integers(2, 5)), lr=float(rng.choice([0.3, 0.5, 1.0])),
               seed=int(rng.integers(0, 10_000)), backward_s=0.0, **extra)
    return cfg, int(rng.integers(3, 5))


def _steps_calls(results: list[dict], step: int) -> list[list[dict]]:
    return [[c for c in r["calls"] if c["step"] == step] for r in results]


# --- step 1: naive -----------------------------------------------------------------------------

NAIVE = LAB.exercise(
    "ddp_naive", needs=("allreduce_gradients",),
    title="Naive: after backward, one blocking all-reduce per gradient, then divide",
    hints=("The idea: after backward each rank holds the gradient of its own shard; the global "
           "batch's gradient is the mean of those. Make every trainable .grad that mean, in "
           "place, once per parameter (a tied weight is one parameter).",
           "Loop over model.parameters(); skip p with p.grad None (the frozen layer).",
           "dist.all_reduce(p.grad) sums in place on every rank; then "
           "p.grad.div_(dist.get_world_size()) makes it the mean.",
           "A tied weight is one Parameter: model.parameters() yields it once, so it is "
           "reduced once."))


@NAIVE.check("equals one process on the global batch after k steps (2 ranks; frozen + tied)",
             points=2)
def _naive_equal(ctx):
    fn = ctx.learner("allreduce_gradients")
    return diagnose(train(ctx, "naive", fn, SMALL), SMALL, "naive")


@NAIVE.check("one blocking all-reduce per trainable gradient, none for the frozen layer")
def _naive_calls(ctx):
    fn = ctx.learner("allreduce_gradients")
    results = train(ctx, "naive", fn, SMALL)
    trainable = [r["name"] for r in param_table(SMALL) if r["trainable"]]
    calls = _steps_calls(results, 0)[0]
    named = [c["param"] for c in calls]
    if any(n and n.startswith("frozen") for n in named):
        raise Fail("the frozen layer's gradient was all-reduced: skip parameters with "
                   "requires_grad=False.")
    twice = sorted({n for n in named if n and named.count(n) > 1})
    if twice:
        raise Fail(f"{_names(twice)} all-reduced {named.count(twice[0])} times in one step: "
                   "reduce each parameter once (model.parameters() yields a tied weight once).")
    missing = [n for n in trainable if n not in named]
    if missing:
        raise Fail(f"{len(calls)} all-reduce(s) in step 0, and none of them was the .grad of "
                   f"{_names(missing)}: step 1 reduces each trainable parameter's .grad in "
                   "place, one call each.")
    return f"{len(calls)} all-reduces per step, one per trainable parameter"


@NAIVE.check("3-4 ranks, other seeds, model shapes and k", points=2, hidden=True)
def _naive_hidden(ctx):
    cfg, world = _hidden_cfg(ctx)
    fn = ctx.learner("allreduce_gradients")
    return diagnose(train(ctx, "naive", fn, cfg, nodes=world), cfg, "naive")


# --- step 2: hooks -----------------------------------------------------------------------------

HOOKS_NIC = "delay 1ms"  # slow enough that a blocking hook, or a missing wait(), shows

HOOKS = LAB.exercise(
    "ddp_hooks", needs=("HookDDP",),
    title="Hooks: each gradient's async all-reduce starts as soon as it is final",
    hints=("The idea: a gradient can travel as soon as it is final, while backward still "
           "computes the others. Start its all-reduce at that moment without waiting, and wait "
           "for all of them only in finish(), before dividing.",
           "In __init__: for p in model.parameters(): if p.requires_grad: "
           "p.register_post_accumulate_grad_hook(self._hook).",
           "The hook receives the parameter; p.grad is final there (a tied weight's hook runs "
           "once, after both uses). Launch work = dist.all_reduce(p.grad, async_op=True) and "
           "keep (p, work) - do not wait here.",
           "finish(): for each (p, work): work.wait(); p.grad.div_(world). Then clear the "
           "list for the next step."))


def _async_problems(results: list[dict], *, after_backward_ok: int = 0) -> None:
    """Fail if the all-reduces block the caller, or are launched after backward."""
    for r in results:
        for c in (c for c in r["calls"] if c["step"] >= 1 and c["phase"] == "backward"):
            if not c["async"] or c.get("waited_in_backward"):
                how = ("calls dist.all_reduce without async_op=True" if not c["async"]
                       else "calls wait() on the work it launched")
                raise Fail(f"rank {r['rank']}: the hook blocks: it {how}, so backward stopped "
                           f"for {c['blocked'] * 1e3:.1f} ms at an all-reduce and nothing "
                           "overlaps. Launch with async_op=True, keep the work, and wait() "
                           "in finish().")
        late = [c for c in r["calls"] if c["step"] == 1 and c["phase"] != "backward"]
        if len(late) > after_backward_ok:
            raise Fail(f"rank {r['rank']}: {len(late)} all-reduce(s) per step were launched "
                       "after loss.backward() returned (in finish()): launch each one from "
                       "its hook, during backward, so it overlaps the rest of backward.")


@HOOKS.check("equals one process on the global batch after k steps (2 ranks; frozen + tied)",
             points=2)
def _hooks_equal(ctx):
    cls = ctx.learner("HookDDP")
    return diagnose(train(ctx, "hooks", cls, SMALL, nic=HOOKS_NIC), SMALL, "hooks")


@HOOKS.check("one async all-reduce per trainable parameter, launched from its hook during "
             "backward", points=2)
def _hooks_calls(ctx):
    cls = ctx.learner("HookDDP")
    results = train(ctx, "hooks", cls, SMALL, nic=HOOKS_NIC)
    trainable = [r["name"] for r in param_table(SMALL) if r["trainable"]]
    _async_problems(results)
    for step, calls in enumerate(_steps_calls(results, 1)[:1], start=1):
        named = [c["param"] for c in calls]
        twice = sorted({n for n in named if n and named.count(n) > 1})
        if twice:
            tied = (" - the tied weight must be hooked once: model.parameters() yields it "
                    "once, but a loop over modules finds it in both embed and head"
                    if TIED in twice else "")
            raise Fail(f"{_names(twice)} all-reduced {named.count(twice[0])} times in step "
                       f"{step}{tied}.")
        missing = [n for n in trainable if n not in named]
        if missing:
            raise Fail(f"in step {step} no all-reduce carried the .grad of {_names(missing)}: "
                       "hook every trainable parameter with register_post_accumulate_grad_hook "
                       "and reduce p.grad itself (its argument is the parameter; "
                       "Tensor.register_hook hands you a gradient that is not p.grad).")
        if len(calls) != len(trainable):
            raise Fail(f"{len(calls)} all-reduces in step {step} for {len(trainable)} "
                       "trainable parameters: one per parameter.")
    return f"{len(trainable)} async all-reduces per step, all launched during backward"


@HOOKS.check("3-4 ranks, other seeds, model shapes and k", points=2, hidden=True)
def _hooks_hidden(ctx):
    cfg, world = _hidden_cfg(ctx)
    cls = ctx.learner("HookDDP")
    results = train(ctx, "hooks", cls, cfg, nodes=world, nic=HOOKS_NIC)
    detail = diagnose(results, cfg, "hooks")
    _async_problems(results)
    return detail


# --- step 3: buckets ---------------------------------------------------------------------------

BUCKETS = LAB.exercise(
    "ddp_buckets", needs=("BucketDDP",),
    title="Buckets: one async all-reduce per ~B bytes of gradients",
    hints=("The idea: one message per parameter pays the latency once per parameter. Group the "
           "gradients, in the order they become ready, into buckets of about bucket_bytes, and "
           "send a bucket as soon as its last gradient is in.",
           "In __init__, walk reversed(list(model.parameters())), skip frozen ones, and cut "
           "the list into buckets: add a parameter, and close the bucket once it holds >= "
           "bucket_bytes (p.numel() * p.element_size()).",
           "Keep, per bucket, how many of its gradients are still missing this step; each "
           "post-accumulate hook decrements its bucket's count, and at zero launches "
           "dist.all_reduce(torch.cat([q.grad.reshape(-1) for q in bucket]), async_op=True).",
           "finish(): wait each bucket's work, divide the flat buffer by the world size, copy "
           "its slices back into each q.grad (view_as), and reset the counts."))


@BUCKETS.check("equals one process on the global batch after k steps (2 ranks; frozen + tied)",
               points=2)
def _buckets_equal(ctx):
    cls = ctx.learner("BucketDDP")
    cfg = {**SMALL, "bucket_bytes": 9000}
    return diagnose(train(ctx, "buckets", cls, cfg, nic=HOOKS_NIC), cfg, "buckets")


@BUCKETS.check("at most one all-reduce per bucket, launched during backward, never blocking",
               points=2)
def _buckets_calls(ctx):
    cls = ctx.learner("BucketDDP")
    cfg = {**SMALL, "bucket_bytes": 9000}
    return _bucket_calls(train(ctx, "buckets", cls, cfg, nic=HOOKS_NIC), cfg)


def _bucket_calls(results: list[dict], cfg: dict) -> str:
    plan = bucket_plan(cfg, cfg["bucket_bytes"])
    # the last bucket may be flushed by finish(); every other one overlaps backward
    _async_problems(results, after_backward_ok=1)
    calls = _steps_calls(results, 1)[0]
    if len(calls) > len(plan):
        raise Fail(f"{len(calls)} all-reduces per step, but {cfg['bucket_bytes']}-byte "
                   f"buckets make {len(plan)} (reverse parameter order, a bucket closes once "
                   f"it holds >= bucket_bytes): one all-reduce per bucket, not per parameter.")
    total = sum(r["bytes"] for r in param_table(cfg) if r["trainable"])
    sent = sum(c["bytes"] for c in calls)
    if sent < total:
        raise Fail(f"the all-reduces of one step carried {sent} bytes, but the trainable "
                   f"gradients are {total}: some bucket (the last, partial one?) was never "
                   "all-reduced - flush it.")
    return f"{len(calls)} all-reduce(s) per step for {len(plan)} bucket(s) of <= ~B bytes"


@BUCKETS.check("3-4 ranks, other bucket sizes, seeds, model shapes and k", points=2,
               hidden=True)
def _buckets_hidden(ctx):
    cfg, world = _hidden_cfg(ctx)
    total = sum(r["bytes"] for r in param_table(cfg) if r["trainable"])
    cfg["bucket_bytes"] = int(total * ctx.rng.uniform(0.15, 0.6))
    cls = ctx.learner("BucketDDP")
    results = train(ctx, "buckets", cls, cfg, nodes=world, nic=HOOKS_NIC)
    detail = diagnose(results, cfg, "buckets")
    return f"{detail}; {_bucket_calls(results, cfg)}"


# --- step 4: the timeline, and the overlap measured against it ---------------------------------


def comm_time(world: int, nbytes: float, nic: str) -> float:
    """alpha-beta ring all-reduce of nbytes on this NIC (alpha = its delay, beta its rate)."""
    spec = Netem.parse(nic)
    return models.ring_allreduce(world, nbytes, spec.delay_s, beta_of(spec))


def _typical(results: list[dict], fn) -> float:
    """The mean over ranks of fn(step), then the median over the measured steps."""
    rows = [[fn(s) for s in r["steps"] if s["measured"]] for r in results]
    return float(np.median(np.mean(np.array(rows), axis=0)))


def step_time(results: list[dict]) -> float:
    """Typical step, emulated seconds: forward, backward, the exchange, the optimizer."""
    return _typical(results, lambda s: s["t"][4])


def messages(results: list[dict], cfg: dict, kind: str) -> tuple[list[float], list[int]]:
    """(ready time after backward began, bytes) of each message the timeline queues, in
    ready order: one per trainable parameter (naive, hooks) or per planned bucket."""
    rows = {r["name"]: r["bytes"] for r in param_table(cfg) if r["trainable"]}
    ready = {n: _typical(results, lambda s, n=n: s["ready"][n] - s["t"][1]) for n in rows}
    groups = bucket_plan(cfg, cfg["bucket_bytes"]) if kind == "buckets" else [[n] for n in rows]
    msgs = sorted((max(ready[n] for n in g), sum(rows[n] for n in g)) for g in groups)
    return [m[0] for m in msgs], [m[1] for m in msgs]


def predict_saving(naive: list[dict], cfg: dict, kind: str, nic: str, fifo=None) -> dict:
    """The timeline's prediction of what `kind` saves per step over naive. From the naive
    run: its measured exchange after backward (what overlap can save) and each gradient's
    measured ready time (the backward compute per layer); each message of `kind` costs its
    alpha-beta all-reduce on a FIFO stream, and what of it ends after backward is exposed:
    saving = naive exchange - exposed. `fifo`: a fifo_timeline (None: the checks' own)."""
    if fifo is None:
        from ._answers import reference_fifo as fifo
    world = len(naive)
    backward = _typical(naive, lambda s: s["t"][2] - s["t"][1])
    serial = _typical(naive, lambda s: s["t"][3] - s["t"][2])
    _, sizes = messages(naive, cfg, "hooks")
    serial_model = sum(comm_time(world, n, nic) for n in sizes)
    ready, sizes = messages(naive, cfg, kind)
    comm = [comm_time(world, n, nic) for n in sizes]
    timeline = [tuple(map(float, x)) for x in fifo(ready, comm)]
    exposed = max(0.0, timeline[-1][1] - backward) if timeline else 0.0
    return {"kind": kind, "messages": len(sizes), "backward_s": backward, "serial_s": serial,
            "serial_model_s": serial_model,
            "stream_s": sum(comm), "exposed_s": exposed, "saving_s": serial - exposed,
            "timeline": timeline, "ready": ready, "comm": comm}


def overlap_experiment(run, cl, learners: dict, cfg: dict = TIMED, nic: str = TIMED_NIC,
                       fifo=None) -> dict:
    """Naive, hooks and buckets on one open cluster `cl` (run = cl.run or ctx.run): measured
    steps and, for hooks and buckets, the measured saving next to the predicted one."""
    runs = {kind: run(cl, train_on_rank, cfg, kind, fn) for kind, fn in learners.items()}
    out = {"runs": runs, "steps": {k: step_time(v) for k, v in runs.items()},
           "world": cl.world_size, "nic": nic, "cfg": cfg}
    for kind in runs:
        if kind == "naive":
            continue
        pred = predict_saving(runs["naive"], cfg, kind, nic, fifo)
        pred["measured_s"] = out["steps"]["naive"] - out["steps"][kind]
        pred["error"] = (pred["measured_s"] - pred["saving_s"]) / pred["saving_s"]
        out[kind] = pred
    return out


OVERLAP = LAB.exercise(
    "ddp_overlap", needs=("fifo_timeline", "allreduce_gradients", "HookDDP", "BucketDDP"),
    title="The timeline: predict the overlap's saving, then measure it",
    hints=("Keep the time at which the stream becomes free (start: minus infinity).",
           "Message i starts at max(ready_s[i], free) and ends comm_s[i] later; that end is "
           "the new free.",
           "Return a list of (start, end) tuples, one per message, in the order given."))

CASES = (([0.0, 1.0, 2.0], [3.0, 1.0, 1.0]),   # a queue builds up
         ([0.0, 5.0], [1.0, 1.0]),             # the stream idles in between
         ([2.0, 2.0, 9.0, 9.5], [0.5, 0.5, 1.0, 0.2]))


def _fifo_verdict(fn, ready, comm) -> None:
    from ._answers import reference_fifo

    want = reference_fifo(ready, comm)
    got = fn(list(ready), list(comm))
    try:
        got = [(float(a), float(b)) for a, b in got]
    except (TypeError, ValueError):
        raise Fail(f"fifo_timeline returned {got!r}: return a list of (start, end) tuples, one "
                   "per message") from None
    if len(got) == len(want) and np.allclose(got, want):
        return
    def shown(pairs) -> str:  # 6 digits, not floats' 17-digit reprs
        return "[" + ", ".join(f"({a:.6g}, {b:.6g})" for a, b in pairs) + "]"

    case = (f"for ready_s={[float(f'{v:.6g}') for v in ready]}, comm_s="
            f"{[float(f'{v:.6g}') for v in comm]} you returned {shown(got)}, expected "
            f"{shown(want)}")
    if len(got) == len(want):
        parallel = [(r, r + c) for r, c in zip(ready, comm)]
        if np.allclose(got, parallel):
            raise Fail(f"{case}: a message started while the previous one was still on the "
                       "stream - it is FIFO: start = max(ready, previous end).")
        if any(a < r - 1e-12 for (a, _), r in zip(got, ready)):
            raise Fail(f"{case}: a message started before it was ready - start = max(ready, "
                       "previous end).")
    raise Fail(f"{case}.")


@OVERLAP.check("fifo_timeline on hand-made timelines (queueing, an idle stream)")
def _fifo_cases(ctx):
    fn = ctx.learner("fifo_timeline")
    for ready, comm in CASES:
        ctx.call(_fifo_verdict, fn, ready, comm)
    return f"{len(CASES)} timelines right"


@OVERLAP.check("fifo_timeline on random timelines", hidden=True)
def _fifo_random(ctx):
    fn = ctx.learner("fifo_timeline")
    for _ in range(20):
        n = int(ctx.rng.integers(1, 12))
        ready = np.sort(ctx.rng.uniform(0, 0.05, n)).tolist()
        ctx.call(_fifo_verdict, fn, ready, ctx.rng.uniform(1e-4, 0.01, n).tolist())
    return "20 random timelines right"


def _overlap_verdict(ctx, *, nodes: int, nic: str, dilation: float, cfg: dict) -> str:
    fifo = ctx.learner("fifo_timeline")
    learners = {"naive": ctx.learner("allreduce_gradients"), "hooks": ctx.learner("HookDDP"),
                "buckets": ctx.learner("BucketDDP")}
    with ctx.cluster(nodes=nodes, nic=nic, dilation=dilation, timeout=60) as cl:
        exp = overlap_experiment(ctx.run, cl, learners, cfg, nic, fifo)
    parts = []
    for kind in ("hooks", "buckets"):
        p = exp[kind]
        ref = predict_saving(exp["runs"]["naive"], cfg, kind, nic)
        if not np.isclose(ref["saving_s"], p["saving_s"], rtol=1e-6):
            raise Fail(f"your fifo_timeline predicts a {kind} saving of "
                       f"{p['saving_s'] * 1e3:.1f} ms where a FIFO stream gives "
                       f"{ref['saving_s'] * 1e3:.1f} ms: fix fifo_timeline first.")
        said = (f"{kind}: measured saving {p['measured_s'] * 1e3:.1f} ms per step vs "
                f"{p['saving_s'] * 1e3:.1f} ms predicted ({p['messages']} messages)")
        if abs(p["error"]) > SAVING_TOL:
            _async_problems(exp["runs"][kind], after_backward_ok=int(kind == "buckets"))
            raise Fail(f"{said}: off by {p['error']:+.0%}, beyond +-{SAVING_TOL:.0%}. "
                       + ("Less saved than the timeline predicts: does the communication "
                          "really overlap backward?" if p["error"] < 0 else
                          "More saved than a FIFO stream allows: are some messages missing?"))
        parts.append(said)
    return "; ".join(parts)


@OVERLAP.check(f"measured savings of hooks and buckets over naive within +-{SAVING_TOL:.0%} "
               f"of the timeline (2 ranks, {TIMED_NIC}, dilation {TIMED_DILATION:g})",
               points=3)
def _overlap_measured(ctx):
    return _overlap_verdict(ctx, nodes=2, nic=TIMED_NIC, dilation=TIMED_DILATION,
                            cfg={**TIMED, "bucket_bytes": TIMED_BUCKET})


@OVERLAP.check("the same on 3 ranks, another network, seed and bucket size", points=2,
               hidden=True)
def _overlap_hidden(ctx):
    delay = float(ctx.rng.choice([1.0, 1.5]))
    nic = f"delay {delay:g}ms rate 1gbit"
    cfg = {**TIMED, "seed": int(ctx.rng.integers(0, 1000)),
           "bucket_bytes": int(ctx.rng.choice([70_000, 100_000, 160_000]))}
    return _overlap_verdict(ctx, nodes=3, nic=nic, dilation=6.0, cfg=cfg)
