"""Lab 10: a top-k DDP communication hook with error feedback (follows notebook
11b_error_feedback_and_accuracy).

The learner writes:

    topk_compress(grad, residual, ratio) -> (indices, values, new_residual)
        the k = ceil(ratio x numel) entries of largest magnitude of grad + residual, and what
        was not sent (the error feedback carried to the next step);
    topk_hook(state, bucket) -> torch.futures.Future
        a DDP communication hook (`ddp.register_comm_hook(TopKState(ratio), topk_hook)`):
        compress the bucket with `state.residuals[bucket.index()]`, all-gather every rank's
        indices and values, add them up, divide by the world size, return it in a Future.

How the checks see what the code did: `topk_compress` is called in this process on drawn
tensors; the identity sent + new_residual == grad + residual (nothing lost, nothing invented)
and the selection are checked exactly. The hook runs inside real DDP on real ranks, with
torch.distributed's collectives wrapped to count the bytes each rank hands them; its
gradients are compared with plain DDP's (ratio 1 must be exact), and a small regression task
the lab makes is trained with and without compression in the same run (one cluster run that
the visible checks share).
"""

from __future__ import annotations

import contextlib
import math
import weakref

import numpy as np

from .core import Fail, Lab, NotDone

LAB = Lab("10_compression_hook", "A top-k compression hook with error feedback",
          follows="11b_error_feedback_and_accuracy")

FEATURES, ROWS = 64, 256  # the regression task: ROWS samples per rank, FEATURES weights
STEPS, LR = 60, 0.1  # full-batch SGD steps, learning rate
CONVERGENCE_BOUND = 2.0  # compressed final loss <= this x uncompressed (+ a floor, below)
BYTES_SLACK = 1.05  # a rank may send this much more than k (value, index) pairs
COLLECTIVES = ("all_gather", "all_gather_into_tensor", "all_reduce", "broadcast",
               "all_to_all", "all_to_all_single", "reduce_scatter", "reduce_scatter_tensor",
               "gather", "scatter", "reduce")


class TopKState:
    """What DDP hands the hook on every call: the ratio and one residual per bucket."""

    def __init__(self, ratio: float) -> None:
        if not isinstance(ratio, int | float) or not 0 < ratio <= 1:
            raise ValueError(f"ratio must be a fraction in (0, 1], got {ratio!r}")
        self.ratio = float(ratio)
        self.residuals: dict = {}


def k_of(numel: int, ratio: float) -> int:
    """How many entries a bucket of `numel` sends at `ratio`: ceil(ratio x numel), at least 1."""
    return max(1, math.ceil(ratio * numel - 1e-9))


# --- exercise 1: the compressor, checked in this process --------------------------------------


def _compress(ctx, grad, residual, ratio):
    import torch

    fn = ctx.learner("topk_compress")
    out = ctx.call(fn, grad.clone(), residual.clone(), ratio)
    if not (isinstance(out, tuple) and len(out) == 3):
        raise Fail("topk_compress must return a tuple (indices, values, new_residual), got "
                   f"{type(out).__name__}")
    idx, vals, new = out
    for what, t in (("indices", idx), ("values", vals), ("new_residual", new)):
        if not isinstance(t, torch.Tensor):
            raise Fail(f"topk_compress returned {type(t).__name__} as {what}: a tensor")
    return idx, vals, new


def _check_once(ctx, n: int, ratio: float, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    grad, residual = torch.randn(n, generator=g), 0.3 * torch.randn(n, generator=g)
    idx, vals, new = _compress(ctx, grad, residual, ratio)
    k = k_of(n, ratio)
    if idx.numel() != k or vals.numel() != k:
        raise Fail(f"for {n} entries at ratio {ratio:g} send k = ceil(ratio x numel) = {k} "
                   f"entries; got {idx.numel()} indices and {vals.numel()} values")
    acc = grad + residual
    if idx.dtype not in (torch.int64, torch.int32) or len(set(idx.tolist())) != k:
        raise Fail("indices must be k distinct integer positions (acc.abs().topk(k).indices)")
    if not torch.equal(vals, acc[idx.long()]):
        if torch.allclose(vals, grad[idx.long()]):
            raise Fail("the values are grad[indices]: send (grad + residual)[indices], the "
                       "error-corrected gradient")
        raise Fail("values must be (grad + residual)[indices]")
    smallest_sent = acc[idx.long()].abs().min()
    mask = torch.ones(n, dtype=torch.bool)
    mask[idx.long()] = False
    if mask.any() and acc[mask].abs().max() > smallest_sent:
        raise Fail("an entry larger in magnitude than one you sent was left out: pick the k "
                   "largest |grad + residual| (topk of the absolute values)")
    sent = torch.zeros(n)
    sent[idx.long()] = vals
    if not torch.allclose(sent + new, acc, atol=1e-6):
        if torch.allclose(sent + new, grad, atol=1e-6):
            raise Fail("new_residual = grad - sent drops the old residual: it must be "
                       "(grad + residual) - sent, what this step did not send")
        raise Fail("sent + new_residual must equal grad + residual: the residual keeps "
                   "exactly what was not sent (zero at the sent indices)")


CHECKS_ONE = LAB.exercise(
    "topk_compress", needs=("topk_compress",),
    title="Top-k with error feedback: send the largest, keep the rest",
    hints=(
        "The idea: this step owes the gradient plus everything earlier steps left unsent "
        "(the residual). Send the k largest entries of that sum, by magnitude, and keep the "
        "rest, unchanged, as the new residual: small entries pile up until they are sent.",
        "The numbers: k = max(1, ceil(ratio x numel)); the selection is the top k of "
        "|grad + residual|; the identity to keep is sent + new_residual == grad + residual.",
        "A sketch: acc = grad + residual; indices = acc.abs().topk(k).indices; values = "
        "acc[indices]; new_residual = acc.clone(); new_residual[indices] = 0.",
    ))


@CHECKS_ONE.check("sends the k largest |grad + residual| and keeps exactly the rest", points=2)
def _compress_once(ctx):
    for n, ratio in ((1000, 0.01), (37, 0.1), (8, 1.0)):
        _check_once(ctx, n, ratio, n)
    return "1000 entries at 1%, 37 at 10%, 8 at 100%: selection and residual exact"


@CHECKS_ONE.check("error feedback accumulates: small entries are sent eventually", points=2)
def _compress_feedback(ctx):
    import torch

    n, ratio, steps = 16, 1 / 16, 40
    grad = torch.full((n,), 0.15)
    grad[0] = 1.0  # one large entry wins every step unless the others accumulate
    residual, total = torch.zeros(n), torch.zeros(n)
    for _ in range(steps):
        idx, vals, residual = _compress(ctx, grad, residual, ratio)
        total[idx.long()] += vals
    if not torch.allclose(total + residual, steps * grad, atol=1e-4):
        raise Fail(f"after {steps} steps, everything sent plus the residual should equal "
                   f"{steps} x the gradient (error feedback loses nothing); it is off by up to "
                   f"{float((total + residual - steps * grad).abs().max()):.3g}")
    unsent = int((total[1:] == 0).sum())
    if unsent:
        raise Fail(f"{unsent} of the {n - 1} small entries were never sent in {steps} steps: "
                   "without feedback top-k starves them; add the residual before selecting")
    return f"{steps} steps: sent + residual = {steps} x gradient, every small entry got through"


@CHECKS_ONE.check("hidden: other sizes and ratios", points=1, hidden=True)
def _compress_hidden(ctx):
    for _ in range(4):
        n = int(ctx.rng.integers(5, 5000))
        ratio = float(ctx.rng.choice([0.001, 0.01, 0.05, 0.3, 1.0]))
        _check_once(ctx, n, ratio, int(ctx.rng.integers(1e6)))


# --- rank side: DDP with the learner's hook -------------------------------------------------------


class _Bytes:
    """Bytes this rank handed to collectives while the hook ran."""

    def __init__(self) -> None:
        self.sent, self.calls = 0, []


def _spy(counter: _Bytes):
    """Wrap torch.distributed's collectives to count the bytes this rank contributes."""
    import torch
    import torch.distributed as dist

    saved = {}
    for name in COLLECTIVES:
        orig = getattr(dist, name, None)
        if orig is None:
            continue
        saved[name] = orig

        def call(*args, _orig=orig, _name=name, **kwargs):
            # the tensor this rank contributes: the input of gathers, the tensor otherwise
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if _name in ("all_gather", "all_gather_into_tensor", "gather") and len(tensors) > 1:
                tensors = tensors[-1:]
            elif _name == "all_gather":
                tensors = [a for a in args[1:2] if isinstance(a, torch.Tensor)]
            mine = tensors[-1] if tensors else None
            if mine is not None:
                counter.sent += mine.numel() * mine.element_size()
                counter.calls.append(_name)
            return _orig(*args, **kwargs)

        setattr(dist, name, call)
    return saved


def _watched(hook, problems: list[str]):
    """`hook`, with what it leaves in state.residuals checked on every call: the residual
    after the call must be the bucket plus the residual before it, minus the k entries sent
    (so at most k entries may differ), and it must not change until the next call for that
    bucket. Problems are appended as sentences."""
    import torch
    import torch.distributed as dist

    kept: dict = {}  # bucket index -> a copy of the residual the hook left last time

    def watched(state, bucket):
        key = bucket.index()
        watched.buckets.add(key)
        held = state.residuals.get(key)
        if (key in kept and isinstance(held, torch.Tensor) and held.shape == kept[key].shape
                and not problems and not torch.equal(held, kept[key])):
            moved = float((held - kept[key]).abs().max())
            problems.append(
                f"state.residuals[{key}] changed between two calls of the hook (by up to "
                f"{moved:.3g}), while nobody but your hook should touch it: it shares memory "
                "with bucket.buffer() (an in-place op such as grad.add_(residual), or a view "
                "of the buffer, stored as the residual), and DDP refills that buffer with the "
                "next step's gradients. Store a tensor of your own")
        grad = bucket.buffer().clone()  # before the hook, which may work in place
        before = state.residuals.get(key)
        before = torch.zeros_like(grad) if before is None else before.clone()
        try:
            fut = hook(state, bucket)
        except Exception:
            wrong = [(i, tuple(r.shape)) for i, r in state.residuals.items()
                     if i != key and isinstance(r, torch.Tensor) and r.shape != grad.shape]
            if not wrong:
                raise
            # One residual shared by buckets of different sizes: say so (the training
            # finishes with a plain average, so that every check can report).
            problems[:0] = [] if problems else [
                f"your hook failed on bucket {key} ({grad.numel()} entries) while "
                "state.residuals "
                f"held a residual of {wrong[0][1][0]} entries under key {wrong[0][0]}: "
                "keep one residual per bucket, under bucket.index()"]
            out = bucket.buffer().clone()
            dist.all_reduce(out)
            fut = torch.futures.Future()
            fut.set_result(out / dist.get_world_size())
            return fut
        after = state.residuals.get(key)
        if isinstance(after, torch.Tensor):
            kept[key] = after.detach().clone()
        k = k_of(grad.numel(), state.ratio)
        if k < grad.numel() and not problems:
            if not isinstance(after, torch.Tensor) or after.shape != grad.shape:
                problems.append(f"state.residuals[{key}] holds {type(after).__name__} after "
                                "the hook: keep there the residual of this bucket (a tensor "
                                "like bucket.buffer()), or error feedback is lost between steps")
            else:
                acc = grad + before
                moved = ((acc - after).abs() > 1e-6 * (acc.abs() + 1e-12)).sum().item()
                if moved > k:
                    problems.append(
                        f"after the hook, state.residuals[{key}] differs from bucket + the "
                        f"previous residual in {moved} entries, but only k = {k} were sent: the "
                        "new residual must be what was not sent of (bucket + previous residual), "
                        "so add the stored residual before selecting and store the new one")
        return fut

    watched.buckets = set()
    return watched


def _model(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 1))


def _task(rank: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(FEATURES, 1, generator=g)
    g.manual_seed(seed * 100 + rank + 1)
    x = torch.randn(ROWS, FEATURES, generator=g)
    y = torch.tanh(x @ w / math.sqrt(FEATURES)) + 0.05 * torch.randn(ROWS, 1, generator=g)
    return x, y


def _train_on_rank(runs: list, seed: int) -> list[dict]:
    """For each (hook, ratio, steps[, bucket_cap_mb]) in `runs` (hook None: plain DDP), DDP
    on this rank: `steps` of full-batch SGD from the same start (with a bucket cap: the
    model split over several buckets from the first step). Per run: the mean loss per step,
    the first step's gradients, the bytes handed to collectives per step, the model's size
    and how many buckets the hook saw."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, out = dist.get_rank(), []
    x, y = _task(rank, seed)
    for hook, ratio, steps, *cap in runs:
        if cap:  # find_unused_parameters: the buckets are cut by the cap at once, and not
            # rebuilt after the first step (a rebuild would hand the hook other buckets). One
            # weight the forward never uses gives it something to find (else torch warns).
            model = _model(seed)
            model.register_parameter("unused", torch.nn.Parameter(torch.zeros(1)))
            ddp = DDP(model, bucket_cap_mb=cap[0], find_unused_parameters=True)
        else:
            ddp = DDP(_model(seed))
        feedback: list[str] = []
        if hook is not None:
            watched = _watched(hook, feedback)
            ddp.register_comm_hook(TopKState(ratio), watched)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR)
        counter, losses, first = _Bytes(), [], None
        for step in range(steps):
            opt.zero_grad()
            loss = F.mse_loss(ddp(x), y)
            saved = _spy(counter)
            try:
                loss.backward()
            finally:
                for name, orig in saved.items():
                    setattr(dist, name, orig)
            if step == 0:
                first = [None if q.grad is None else q.grad.numpy().copy()
                         for q in ddp.parameters()]  # None: the split run's unused weight
            opt.step()
            t = loss.detach().clone()
            dist.all_reduce(t)
            losses.append(t.item() / dist.get_world_size())
        out.append({"losses": losses, "grads": first, "bytes": counter.sent / steps,
                    "buckets": len(watched.buckets) if hook is not None else None,
                    "calls": sorted(set(counter.calls)), "feedback": feedback[:1],
                    "numel": sum(q.numel() for q in ddp.parameters())})
    return out


def train(hook, *, ratios, ranks: int = 2, steps: int = STEPS, seed: int = 0,
          nic: str | None = None) -> dict:
    """Train the lab's regression task with DDP on `ranks` ranks from the same start: with
    `hook` at each of `ratios`, and with plain DDP. Returns {"plain": losses, ratio: {"losses",
    "bytes" (what rank 0 handed to collectives per step in the hook), "k"}, "numel": size}."""
    from ..cluster import Cluster

    runs = [(hook, r, steps) for r in ratios] + [(None, 1.0, steps)]
    with Cluster(nodes=ranks, nic=nic, timeout=90) as cl:
        *comp, plain = cl.run(_train_on_rank, runs, seed)[0]
    out: dict = {"plain": plain["losses"], "numel": plain["numel"]}
    for r, c in zip(ratios, comp):
        out[r] = {"losses": c["losses"], "bytes": c["bytes"], "k": k_of(c["numel"], r)}
    return out


def _run(ctx, runs, ranks, seed) -> list[list[dict]]:
    """Per rank, per run: see _train_on_rank."""
    with ctx.cluster(nodes=ranks, nic=None, timeout=60) as cl:
        return ctx.run(cl, _train_on_rank, runs, seed)


# The visible checks share one cluster run per learner hook (a cluster start costs seconds on
# a loaded machine): ratio 1 and plain DDP for one step, then ratio 5% and plain for STEPS.
_VISIBLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
VISIBLE_RATIO, VISIBLE_SEED = 0.05, 3
# The model (529 weights, 2 KiB) fits in one default bucket; a cap of 1000 bytes splits it in
# two (17 and 513 entries), so one residual per bucket is tested.
SPLIT_CAP_MB, SPLIT_STEPS = 1000 / 2**20, 4


def _visible(ctx) -> list[list[dict]]:
    hook = ctx.learner("topk_hook")
    try:
        cached = _VISIBLE.get(hook)
    except TypeError:  # not weak-referenceable: run without caching
        cached = None
    if cached is None:
        try:
            cached = _run(ctx, [(hook, 1.0, 1), (None, 1.0, 1), (hook, VISIBLE_RATIO, STEPS),
                                (None, 1.0, STEPS),
                                (hook, VISIBLE_RATIO, SPLIT_STEPS, SPLIT_CAP_MB)],
                          2, VISIBLE_SEED)
        except (Fail, NotDone) as exc:
            cached = exc
        with contextlib.suppress(TypeError):
            _VISIBLE[hook] = cached
    if isinstance(cached, BaseException):
        raise cached
    return cached


def _exact(out, ranks: int) -> str:
    """Runs 0 (the hook at ratio 1) and 1 (plain DDP) of `out` must give equal gradients."""
    for r, runs in enumerate(out):
        for ga, gb in zip(runs[0]["grads"], runs[1]["grads"]):
            if np.allclose(ga, gb * ranks, rtol=1e-4, atol=1e-6):
                raise Fail(f"rank {r}'s gradient is {ranks}x DDP's: divide the summed values "
                           "by the world size (DDP's hook contract is the average)")
            big = np.abs(gb) > 1e-6 * max(1.0, float(np.abs(gb).max()))
            if big.any():
                scale = float(np.median(ga[big] / gb[big]))
                if (abs(scale - 1) > 1e-3 and np.allclose(ga, gb * scale, rtol=1e-4, atol=1e-6)):
                    raise Fail(f"rank {r}'s gradient is {scale:.4g}x DDP's on {ranks} ranks: "
                               "the values are added right, but divided by "
                               f"{ranks / scale:.4g} instead of the world size, {ranks}: use "
                               "dist.get_world_size(), not a constant")
            if not np.allclose(ga, gb, rtol=1e-4, atol=1e-6):
                raise Fail(f"at ratio 1 (every entry sent) rank {r}'s gradients differ from "
                           "plain DDP's by up to "
                           f"{float(np.max(np.abs(ga - gb))):.3g}: every rank's values must be "
                           "added at their indices (index_add_), then averaged")
    return f"{ranks} ranks, ratio 1: every gradient equals plain DDP's"


HOOK = LAB.exercise(
    "topk_hook", needs=("topk_hook", "topk_compress"),
    title="The DDP hook: all-gather k (index, value) pairs, add them up",
    hints=(
        "The idea: DDP hands the hook one bucket (a flat tensor of gradients) and expects "
        "back a Future of what every rank should use: the average over ranks. Compress the "
        "bucket with topk_compress, using the residual of THIS bucket (state.residuals, keyed "
        "by bucket.index(): a model can have several buckets), and let every rank see every "
        "rank's (indices, values).",
        "Every rank sends the same k, so dist.all_gather works, once for the indices and once "
        "for the values. Add each rank's values at its indices into zeros shaped like the "
        "bucket (index_add_), divide by the world size. Store a residual of your own: "
        "bucket.buffer() is refilled by DDP at the next step.",
        "A sketch: buf = bucket.buffer(); residual = state.residuals.get(bucket.index(), "
        "torch.zeros_like(buf)); idx, vals, state.residuals[bucket.index()] = "
        "topk_compress(buf, residual, state.ratio); all_gather idx and vals into lists; out = "
        "torch.zeros_like(buf); out.index_add_(0, i, v) for each pair; fut = "
        "torch.futures.Future(); fut.set_result(out / world); return fut.",
    ))


@HOOK.check("ratio 1: exactly plain DDP's gradients, 2 ranks", points=2)
def _hook_exact(ctx):
    return _exact(_visible(ctx), 2)


@HOOK.check("bytes sent per step: k (index, value) pairs, not the dense bucket", points=2)
def _hook_bytes(ctx):
    ratio = VISIBLE_RATIO
    r0 = _visible(ctx)[0][2]
    k = k_of(r0["numel"], ratio)
    dense = r0["numel"] * 4
    if r0["bytes"] >= dense:
        raise Fail(f"each rank handed {r0['bytes']:.0f} bytes per step to "
                   f"{', '.join(r0['calls'])}: as many as the dense fp32 bucket ({dense} B). "
                   "Send only the k indices and values")
    if r0["bytes"] > BYTES_SLACK * k * (4 + 8):
        raise Fail(f"each rank sent {r0['bytes']:.0f} bytes per step; k = {k} pairs of a "
                   f"float32 value and an int64 index are {k * 12} B")
    return (f"{r0['bytes']:.0f} B per rank per step ({', '.join(r0['calls'])}) for k = {k} of "
            f"{r0['numel']} entries, against {dense} B dense")


@HOOK.check("error feedback kept in state.residuals from step to step", points=2)
def _hook_feedback(ctx):
    r0, split = _visible(ctx)[0][2], _visible(ctx)[0][4]
    if r0["feedback"]:
        raise Fail(r0["feedback"][0])
    if split["feedback"]:
        raise Fail(f"with the model split over two buckets: {split['feedback'][0]}")
    if split["buckets"] is not None and split["buckets"] < 2:
        raise RuntimeError(f"the split run saw {split['buckets']} bucket(s), not 2: the "
                           "check's bucket cap no longer splits the model")
    return (f"{STEPS} steps at ratio {VISIBLE_RATIO:g}: each residual was the previous one plus "
            "the bucket, minus exactly what was sent")


@HOOK.check("converges within a bound of uncompressed DDP (ratio 5%, 60 steps)", points=2)
def _hook_converges(ctx):
    comp, base = (r["losses"] for r in _visible(ctx)[0][2:4])
    bound = CONVERGENCE_BOUND * base[-1] + 0.02 * base[0]
    if not comp[-1] <= bound:
        raise Fail(f"after {STEPS} steps the compressed loss is {comp[-1]:.4f}, uncompressed "
                   f"{base[-1]:.4f} (bound {bound:.4f}); starting from {base[0]:.4f}. Is the "
                   "residual kept per bucket and added back before each selection?")
    return (f"loss {base[0]:.4f} -> {comp[-1]:.4f} compressed, {base[-1]:.4f} uncompressed "
            f"after {STEPS} steps")


@HOOK.check("hidden: 3 ranks, other weights, other ratios", points=2, hidden=True)
def _hook_hidden(ctx):
    seed = int(ctx.rng.integers(1e6))
    ratio = float(ctx.rng.choice([0.02, 0.1, 0.25]))
    hook = ctx.learner("topk_hook")
    out = _run(ctx, [(hook, 1.0, 1), (None, 1.0, 1), (hook, ratio, 1)], 3, seed)
    _exact(out, 3)
    r0 = out[0][2]
    if r0["feedback"]:
        raise Fail(f"3 ranks, ratio {ratio:g}: {r0['feedback'][0]}")
    k = k_of(r0["numel"], ratio)
    if r0["bytes"] > BYTES_SLACK * k * 12:
        raise Fail(f"3 ranks, ratio {ratio:g}: a rank sent {r0['bytes']:.0f} B for k = {k}")
