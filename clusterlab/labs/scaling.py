"""Lab 07: gradient scaling - make every sample count once, checked against one process.

The learner writes losses (and one accumulation loop) that run inside real
`torch.nn.parallel.DistributedDataParallel` on the ranks of a `clusterlab.Cluster`. Each
check runs them on real ranks, takes the gradient DDP left in `.grad`, and compares it with
the gradient a single process computes on all the data at once (float64).

How the checks judge a gradient: the relative error max|g - ref| / max|ref| must be below
TOL[dtype]: 1e-10 in float64 (measured errors are ~1e-16), 2e-6 in float32, about 17
float32 epsilons (2^-23) of the largest component (the ranks add the same numbers in
another order than the reference; the worst of 75 random float32 cases of these checks was
3.4 epsilons). The wrong answers differ by percents or by whole factors, far outside either.
When a gradient is wrong, the check computes in this process what each classic mistake
would have produced (mean of means, the world size divided twice, the local count, ...)
and names the one the learner's gradient matches.

Gradient all-reduces are counted with a DDP communication hook (one call per bucket, the
same all-reduce DDP's built-in path does); the learner's own `dist.all_reduce` calls are
counted by wrapping `torch.distributed.all_reduce` on the ranks while their code runs.

Nothing here imports torch at module level: `clusterlab.labs` imports every lab module,
and importing torch (and what DDP imports lazily: `experiments.common.preload_ddp`) is left
to the first check or measurement that starts ranks.
"""

from __future__ import annotations

import contextlib

import numpy as np

from .core import Fail, Lab

LAB = Lab("07_gradient_scaling", "Gradient scaling: every sample counts once",
          follows="07_gradient_scaling")

FEATURES = 8  # inputs per sample (and per token)
HIDDEN = 16  # the accumulation exercise's MLP: 8 -> 16 -> 1, 161 parameters
TOKENS = 6  # the token exercise's sequence length (shorter sequences are padded)
BUCKET_CAP_MB = 0.0001  # ~100 bytes: the MLP's gradients fill 2-3 DDP buckets (a bucket
# closes once it reaches the cap, so a cap this small gives each layer its own)
TOL = {"float64": 1e-10, "float32": 2e-6}
NIC = "delay 1ms 200us"  # the mild network of notebook 07: the sums do not depend on it
NETWORKS = (None, NIC)  # what hidden checks draw from


# --- data and models (the same on every rank and in the checking process) ---------------------


def _torch():
    """torch, and what DDP's constructor imports lazily (once, before ranks fork)."""
    import torch

    from ..experiments.common import preload_ddp

    preload_ddp()
    return torch


def _regression(n: int, seed: int, dtype: str):
    from ..experiments.gradient_scaling import make_regression

    return make_regression(n, FEATURES, seed, dtype)


def _model(kind: str, seed: int, dtype: str):
    """The seeded initial model: nn.Linear(8, 1), or the 8-16-1 MLP for accumulation. The
    float64 model starts from exactly the float32 model's values (a cast)."""
    import torch

    torch.manual_seed(seed)
    if kind == "accumulate":
        m = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(),
                                torch.nn.Linear(HIDDEN, 1))
    else:
        m = torch.nn.Linear(FEATURES, 1)
    return m.to(getattr(torch, dtype))


def _token_data(lengths, seed: int, dtype: str):
    """Sequences of TOKENS positions, sequence s holding lengths[s] real tokens, then padding
    (zeros in x and y, as a collator pads). Returns x (S, T, F), y (S, T, 1), mask (S, T)."""
    import torch

    g = torch.Generator().manual_seed(5000 + seed)
    s = len(lengths)
    x = torch.randn(s, TOKENS, FEATURES, generator=g, dtype=torch.float64)
    w = torch.randn(FEATURES, 1, generator=g, dtype=torch.float64)
    y = x @ w + 0.5 + 0.1 * torch.randn(s, TOKENS, 1, generator=g, dtype=torch.float64)
    mask = torch.arange(TOKENS)[None, :] < torch.tensor(list(lengths))[:, None]
    x, y = x * mask[..., None], y * mask[..., None]
    dt = getattr(torch, dtype)
    return x.to(dt), y.to(dt), mask


def _offsets(sizes) -> list[int]:
    return [0, *np.cumsum(sizes).astype(int).tolist()]


def _flat_grad(model) -> np.ndarray:
    import torch

    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()]).double().numpy()


def relative_error(g, ref) -> float:
    """max |g - ref| / max |ref|: the error in units of the reference's largest component."""
    g, ref = np.asarray(g, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(g)):
        return float("inf")
    return float(np.max(np.abs(g - ref)) / np.max(np.abs(ref)))


# --- what the ranks run ------------------------------------------------------------------------


class _Counter:
    """DDP's gradient all-reduces (one per bucket, via the comm hook) and the learner's own."""

    def __init__(self, orig_all_reduce) -> None:
        self.orig, self.buckets, self.bucket_bytes, self.calls = orig_all_reduce, 0, 0, 0


def _count_hook(state: _Counter, bucket):
    """What DDP does by default (divide by W, all-reduce the bucket), counted."""
    import torch.distributed as dist

    buf = bucket.buffer()
    state.buckets += 1
    state.bucket_bytes += buf.numel() * buf.element_size()
    buf.div_(dist.get_world_size())
    return state.orig(buf, async_op=True).get_future().then(lambda fut: fut.value()[0])


def _ddp(model):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    counter = _Counter(dist.all_reduce)
    ddp.register_comm_hook(counter, _count_hook)
    return ddp, counter


@contextlib.contextmanager
def _counting_all_reduce(counter: _Counter):
    """Count the learner's dist.all_reduce calls while their code runs (the hook calls the
    original, so DDP's bucket all-reduces are not counted twice)."""
    import torch.distributed as dist

    def all_reduce(*args, **kwargs):
        counter.calls += 1
        return counter.orig(*args, **kwargs)

    dist.all_reduce = all_reduce
    try:
        yield
    finally:
        dist.all_reduce = counter.orig


def _as_loss(loss, name: str):
    import torch

    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
        got = (f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor)
               else type(loss).__name__)
        raise Fail(f"{name} must return the loss: a one-element tensor computed from ddp(...) "
                   f"(so that it requires grad); it returned {got}")
    return loss.reshape(())


def _rank_loss_case(kind, fn, name, case):
    """One case of exercises 1-3 on this rank: fn's loss, backward, DDP's gradient."""
    import torch.distributed as dist

    rank, seed, dtype = dist.get_rank(), case["seed"], case["dtype"]
    model = _model(kind, seed, dtype)
    ddp, counter = _ddp(model)
    if kind == "tokens":
        x, y, mask = _token_data(case["lengths"], seed, dtype)
        lo, hi = _offsets(case["seqs"])[rank:rank + 2]
        args = (ddp, x[lo:hi], y[lo:hi], mask[lo:hi])
    else:
        x, y = _regression(sum(case["sizes"]), seed, dtype)
        lo, hi = _offsets(case["sizes"])[rank:rank + 2]
        args = (ddp, x[lo:hi], y[lo:hi])
    with _counting_all_reduce(counter):
        loss = fn(*args)
        if len(args[1]) == 0 and not getattr(loss, "requires_grad", False):
            raise Fail(f"{name} got 0 samples on this rank and returned no loss that requires "
                       "grad: an empty rank must still run ddp(x) and backward (its sum is 0), "
                       "because DDP's all-reduce needs every rank")
        _as_loss(loss, name).backward()
    return {"grad": _flat_grad(model), "buckets": counter.buckets, "calls": counter.calls}


def _rank_accumulate_case(fn, case):
    """One case of the accumulation exercise on this rank."""
    import torch.distributed as dist

    rank, seed, dtype = dist.get_rank(), case["seed"], case["dtype"]
    sizes = case["sizes"]  # sizes[r][j]: samples of rank r's micro-batch j
    flat = [n for row in sizes for n in row]
    x, y = _regression(sum(flat), seed, dtype)
    offs = _offsets(flat)
    first = sum(len(row) for row in sizes[:rank])
    micro = [(x[offs[first + j]:offs[first + j + 1]], y[offs[first + j]:offs[first + j + 1]])
             for j in range(len(sizes[rank]))]
    model = _model("accumulate", seed, dtype)
    ddp, counter = _ddp(model)
    # One bucket set: what one synchronised backward all-reduces. Measured on the second
    # backward, because DDP rebuilds its buckets after the first.
    for _ in range(2):
        counter.buckets = 0
        ddp(micro[0][0]).sum().backward()
        model.zero_grad(set_to_none=True)
    bucket_set = counter.buckets
    counter.buckets = counter.bucket_bytes = 0
    with _counting_all_reduce(counter):
        fn(ddp, micro)
    if any(p.grad is None for p in model.parameters()):
        raise Fail("after accumulate, some parameters have no .grad: accumulate must run "
                   "forward and backward on every micro-batch (the check reads .grad)")
    return {"grad": _flat_grad(model), "buckets": counter.buckets, "calls": counter.calls,
            "bucket_set": bucket_set, "bytes": counter.bucket_bytes}


def _on_rank(kind, fn, name, cases):
    if kind == "accumulate":
        return [_rank_accumulate_case(fn, c) for c in cases]
    return [_rank_loss_case(kind, fn, name, c) for c in cases]


# --- the single-process reference, and what each known mistake would give -------------------


def _sum_grad(kind: str, seed: int, x, y, mask=None) -> np.ndarray:
    """Gradient of the SUMMED squared error over (x, y) (masked tokens only, if mask), at the
    initial weights, in float64: the building block of every reference and candidate."""
    model = _model(kind, seed, "float64")
    err = (model(x.double()) - y.double()) ** 2
    if mask is not None:
        err = err.squeeze(-1) * mask
    err.sum().backward()
    return _flat_grad(model)


def _weighted(parts, weights) -> np.ndarray:
    return np.sum([w * p for w, p in zip(weights, parts)], axis=0)


def _uneven_parts(case) -> tuple[list[np.ndarray], list[int]]:
    sizes, seed = case["sizes"], case["seed"]
    x, y = _regression(sum(sizes), seed, case["dtype"])
    off = _offsets(sizes)
    return [_sum_grad("uneven", seed, x[off[r]:off[r + 1]], y[off[r]:off[r + 1]])
            for r in range(len(sizes))], list(sizes)


def _mean_of_means(parts, sizes) -> np.ndarray:
    """What per-rank mean losses give under DDP. A rank with 0 samples contributes a zero
    gradient (the mean's backward over no elements adds nothing), yet DDP still divides by W."""
    return _weighted(parts, [1 / (len(sizes) * n) if n else 0.0 for n in sizes])


def _uneven_candidates(case):
    """(reference, {mistake: (gradient it gives, what to tell the learner)})."""
    parts, sizes = _uneven_parts(case)
    w, n = len(sizes), sum(sizes)
    ref = sum(parts) / n
    mom = _mean_of_means(parts, sizes)
    local = "divide by the GLOBAL count N = all-reduce of the local counts, not by len(x)"
    cands = {
        "mean of means": (mom, "this is the mean of means: each rank divided by its own "
                          "sample count, then DDP averaged the W ranks, so a sample on a "
                          f"small rank counts more. Sum the per-sample losses and {local} "
                          "(times W, which DDP's average divides out)"),
        "local count times W": (w * mom,
                                f"this is W x the mean of means: you multiplied by W but "
                                f"divided by the local count; {local}"),
        "W twice": (ref / w, f"this is exactly 1/W = 1/{w} of the full-batch gradient: DDP "
                    "already divides by the world size, so dividing your loss by W as well "
                    "(or forgetting the factor W) divides twice. Multiply by W: "
                    "sum * W / N"),
        "plain sum": (ref * n / w, f"this is N/W = {n}/{w} times the full-batch gradient: "
                      "the summed loss without any division. Divide by the global count "
                      "N and multiply by W"),
        "W too many": (ref * w, f"this is W = {w} times the full-batch gradient: multiply "
                       "by W once (DDP divides by W once)"),
        "mean over W": (mom / w,
                        "this is the mean of means divided by W again: divide the summed loss "
                        "by the global count and multiply by W"),
    }
    return ref, cands


def _token_candidates(case):
    seqs, lengths, seed = case["seqs"], case["lengths"], case["seed"]
    x, y, mask = _token_data(lengths, seed, case["dtype"])
    off = _offsets(seqs)
    w = len(seqs)
    per_seq = [_sum_grad("tokens", seed, x[i:i + 1], y[i:i + 1], mask[i:i + 1])
               for i in range(len(lengths))]
    ranks = [range(off[r], off[r + 1]) for r in range(w)]
    tok = [sum(lengths[i] for i in rr) for rr in ranks]
    n_tok, n_seq = sum(lengths), len(lengths)
    ref = sum(per_seq) / n_tok
    pad = [_sum_grad("tokens", seed, x[off[r]:off[r + 1]], y[off[r]:off[r + 1]])
           for r in range(w)]  # every position, padding included
    seq_mean = [_weighted([per_seq[i] for i in rr], [1 / lengths[i] for i in rr]) for rr in ranks]
    cands = {
        "per-sequence mean": (
            np.sum([sm / (w * len(rr)) for sm, rr in zip(seq_mean, ranks)], axis=0),
            "this is a per-sequence mean: each sequence's tokens averaged, then sequences "
            "averaged per rank, so a 1-token sequence counts as much as a full one. Sum the "
            "masked token losses and divide by the global TOKEN count (times W)"),
        "global per-sequence mean": (
            sum(seq_mean) / n_seq,
            "this is the mean over all sequences of each sequence's token mean, done right "
            "for sequences; but every TOKEN must count once, so long sequences count more: "
            "sum the masked token losses and divide by the global token count (times W)"),
        "local token mean": (
            _weighted([sum(per_seq[i] for i in rr) for rr in ranks],
                      [1 / (w * t) for t in tok]),
            "this is the mean of the ranks' token means: each rank divided by its own token "
            "count. All-reduce the token counts and divide the summed loss by the global "
            "count (times W)"),
        "padding counted": (
            _weighted(pad, [1 / (w * s * TOKENS) for s in seqs]),
            "this is the plain mean over every position, padding included (F.mse_loss on "
            "the padded tensors): apply the mask, and divide by the number of real tokens "
            "on all ranks"),
        "sequence count": (ref * n_tok / n_seq,
                           f"this is {n_tok}/{n_seq} times the full-batch gradient: you divided "
                           "the token sum by the global number of SEQUENCES; divide by the "
                           "global number of tokens (mask.sum(), all-reduced)"),
        "W twice": (ref / w, f"this is exactly 1/W = 1/{w} of the full-batch gradient: DDP "
                    "already divides by W, so multiply the loss by W"),
        "plain sum": (ref * n_tok / w, "this is the unnormalised masked sum: divide by the "
                      "global token count and multiply by W"),
    }
    return ref, cands


def _accumulate_candidates(case):
    sizes, seed = case["sizes"], case["seed"]
    flat = [n for row in sizes for n in row]
    x, y = _regression(sum(flat), seed, case["dtype"])
    off = _offsets(flat)
    parts = [_sum_grad("accumulate", seed, x[off[i]:off[i + 1]], y[off[i]:off[i + 1]])
             for i in range(len(flat))]
    w, k, n = len(sizes), len(sizes[0]), sum(flat)
    ref = sum(parts) / n
    idx = _offsets([len(row) for row in sizes])
    rank_parts = [parts[idx[r]:idx[r + 1]] for r in range(w)]
    rank_sums = [sum(p) for p in rank_parts]
    rank_n = [sum(row) for row in sizes]
    cands = {}
    if min(flat) > 0:
        micro_means = [_weighted(p, [1 / m for m in row]) for p, row in zip(rank_parts, sizes)]
        cands["divide by k"] = (
            sum(micro_means) / (w * k),
            f"this divides each micro-batch's MEAN loss by k = {k}: every micro-batch counts "
            "the same whatever its size, and every rank too. Divide the summed loss by the "
            "total sample count of all micro-batches on all ranks (all-reduced once), times W")
        cands["no division"] = (
            sum(micro_means) / w,
            f"this is the sum of k = {k} micro-batch mean gradients: nothing divides by the "
            "number of micro-batches. Divide the summed loss by the total sample count of "
            "all micro-batches on all ranks, times W")
    if min(rank_n) > 0:
        cands["local count"] = (
            _weighted(rank_sums, [1 / (w * m) for m in rank_n]),
            "this divides by each rank's own total (its k micro-batches' samples), so ranks "
            "with fewer samples count more: all-reduce the count and divide by the global "
            "total, times W")
        cands["local count times W"] = (
            _weighted(rank_sums, [1 / m for m in rank_n]),
            "this is W x the mean of the ranks' means: you divided by the local count; use "
            "the global total (all-reduced), times W")
    cands["W twice"] = (ref / w, f"this is exactly 1/W = 1/{w} of the full-batch gradient: "
                        "DDP already divides by W, so multiply the loss by W")
    cands["plain sum"] = (ref * n / w, "this is the unnormalised sum over all micro-batches: "
                          "divide by the global total count and multiply by W")
    return ref, cands


# --- running and judging ------------------------------------------------------------------------


def _run(ctx, kind: str, fn, name: str, cases: list[dict], world: int, nic=None) -> list:
    """Run every case on one cluster of `world` ranks: result[case][rank]."""
    _torch()
    with ctx.cluster(nodes=world, nic=nic) as cl:
        out = ctx.run(cl, _on_rank, kind, fn, name, cases)
    return [[out[r][i] for r in range(world)] for i in range(len(cases))]


def _describe(case) -> str:
    if "seqs" in case:
        return (f"{len(case['seqs'])} ranks holding {list(case['seqs'])} sequences "
                f"({case['dtype']})")
    if isinstance(case["sizes"][0], (tuple, list)):
        return (f"{len(case['sizes'])} ranks, micro-batch sizes "
                f"{[list(r) for r in case['sizes']]} ({case['dtype']})")
    return f"{len(case['sizes'])} ranks holding {list(case['sizes'])} samples ({case['dtype']})"


def _judge(per_rank: list[dict], case: dict, ref, cands, what: str) -> float:
    """The gradient's relative error, or Fail naming the mistake it matches."""
    tol = TOL[case["dtype"]]
    where = _describe(case)
    grads = [r["grad"] for r in per_rank]
    if not all(np.all(np.isfinite(g)) for g in grads):
        bad = [r for r, g in enumerate(grads) if not np.all(np.isfinite(g))]
        empty = [r for r, n in enumerate(case.get("sizes", ())) if n == 0]
        why = (f" Rank {empty[0]} holds 0 samples: a mean over no samples is 0/0 = NaN, and "
               "DDP spreads it to every rank. Sum the per-sample losses (reduction='sum' is "
               "0 for an empty batch) and divide by the global count") if empty else ""
        raise Fail(f"with {where}, {what} gave a NaN or infinite gradient on ranks {bad}.{why}")
    spread = max(relative_error(g, grads[0]) for g in grads)
    if spread > tol:
        raise Fail(f"with {where}, the ranks hold different gradients (they differ by "
                   f"{spread:.2g} relative): DDP did not synchronise them")
    err = relative_error(grads[0], ref)
    if err <= tol:
        return err
    for _, (vec, message) in cands.items():
        if vec is not None and relative_error(grads[0], vec) <= tol:
            raise Fail(f"with {where}, {what}'s gradient is {err:.1%} off the full-batch "
                       f"gradient: {message}.")
    ratio = float(np.dot(grads[0], ref) / np.dot(ref, ref))
    if relative_error(grads[0], ratio * ref) <= tol:
        raise Fail(f"with {where}, {what}'s gradient is {ratio:.4g} times the full-batch "
                   "gradient: the direction is right, the scale is not. Each rank's loss "
                   "should be (sum of its per-sample losses) * W / N, N the global count")
    raise Fail(f"with {where}, {what}'s gradient is off the full-batch gradient by {err:.3g} "
               f"(relative; the tolerance is {tol:g}), and matches none of the usual "
               "mistakes: print your loss's value on each rank and compare it with "
               "(sum of the rank's per-sample losses) * W / N")


def _split(rng, world: int, total_min: int = 20, with_one: bool = True,
           with_zero: bool = False) -> tuple[int, ...]:
    """Clearly unequal local batch sizes: one rank with 1 sample (or 0), one with many."""
    sizes = [int(v) for v in rng.integers(2, 40, size=world)]
    big = int(rng.integers(0, world))
    sizes[big] = int(rng.integers(max(total_min, 3 * max(sizes)), 4 * max(sizes) + total_min))
    small = (big + 1 + int(rng.integers(0, world - 1))) % world
    if with_zero:
        sizes[small] = 0
    elif with_one:
        sizes[small] = 1
    return tuple(sizes)


def _hidden_world(ctx, visible: int) -> int:
    """A world size of 2-4 that the exercise's visible check does not use: an answer that
    hard-codes the visible world size fails the hidden check at every grader seed."""
    return int(ctx.rng.choice([w for w in (2, 3, 4) if w != visible]))


def _hidden_nic(ctx):
    return NETWORKS[int(ctx.rng.integers(0, len(NETWORKS)))]


def _seed(ctx) -> int:
    return int(ctx.rng.integers(1, 10_000))


# --- exercise 1: the naive loss, measured --------------------------------------------------------

NAIVE = LAB.exercise(
    "scale_naive", needs=("naive_loss", "mean_of_means_weights"),
    title="The naive loss under DDP: a mean of means, predicted and measured",
    hints=(
        "The idea: DDP averages the ranks' gradients, and each rank's gradient is of its own "
        "mean loss. With uneven batches that weighs a sample of a small batch more: work out by"
        " how much, per rank.",
        "naive_loss is what everybody writes first: return F.mse_loss(ddp(x), y), the mean "
        "over this rank's samples. Nothing else: DDP averages the ranks' gradients itself.",
        "DDP gives 1/W * sum_r (1/n_r) * sum_i g_i. The full-batch gradient is 1/N * sum_i "
        "g_i, i.e. weight 1/N per sample. Divide the two weights: N / (W * n_r).",
        "mean_of_means_weights((8, 16, 32, 64)) is [120/(4*8), 120/(4*16), ...] = "
        "[3.75, 1.875, 0.9375, 0.46875].",
    ))


def _weights_fail(got, sizes) -> None:
    w, n = len(sizes), sum(sizes)
    want = [n / (w * m) for m in sizes]
    try:
        arr = np.asarray(got, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise Fail(f"mean_of_means_weights({sizes}) must return one number per rank, got "
                   f"{got!r}") from None
    if arr.shape != (w,):
        raise Fail(f"mean_of_means_weights({sizes}) must return {w} numbers (one per rank), "
                   f"got {arr.size}")
    if np.allclose(arr, want, rtol=1e-9):
        return
    known = {
        "ones": ([1.0] * w, "1 is the weight every sample SHOULD get; with mean losses DDP "
                 "gives a sample on rank r the weight N / (W n_r)"),
        "share": ([m / n for m in sizes], "n_r / N is rank r's share of the samples, not the "
                  "weight of one of its samples: that is N / (W n_r)"),
        "inverse": ([w * m / n for m in sizes], "that is the inverse: small ranks' samples "
                    "count MORE, N / (W n_r)"),
        "absolute": ([1 / (w * m) for m in sizes], "that is the absolute weight 1/(W n_r); "
                     "relative to the full-batch weight 1/N it is N / (W n_r)"),
    }
    for vec, message in known.values():
        if np.allclose(arr, vec, rtol=1e-9):
            raise Fail(f"mean_of_means_weights({sizes}) returned {np.round(arr, 4).tolist()}: "
                       f"{message}")
    raise Fail(f"mean_of_means_weights({sizes}) returned {np.round(arr, 4).tolist()}, expected "
               f"{np.round(want, 4).tolist()}: the weight of one sample of rank r relative to "
               "the full batch, (1/(W n_r)) / (1/N)")


def _naive_judge(per_rank, case, weights) -> float:
    """The naive gradient must be the mean of means that the learner's weights predict."""
    parts, sizes = _uneven_parts(case)
    n = sum(sizes)
    predicted = _weighted(parts, [wt / n for wt in weights])
    ref = sum(parts) / n
    g = per_rank[0]["grad"]
    tol = TOL[case["dtype"]]
    where = _describe(case)
    if relative_error(g, predicted) <= tol:
        return relative_error(g, ref)
    if relative_error(g, ref) <= tol:
        raise Fail(f"with {where}, naive_loss already gives the full-batch gradient: step 1 "
                   "is the usual per-rank mean, F.mse_loss(ddp(x), y); the fix is the next "
                   "exercise")
    w = len(sizes)
    if relative_error(g, ref * n / w) <= tol:
        raise Fail(f"with {where}, naive_loss's gradient is N/W times the full batch: that "
                   "is reduction='sum'. Step 1 is the usual mean, F.mse_loss(ddp(x), y)")
    raise Fail(f"with {where}, naive_loss's DDP gradient is not the mean of means "
               f"(relative difference {relative_error(g, predicted):.3g}): return "
               "F.mse_loss(ddp(x), y), the mean over this rank's samples")


VISIBLE_SIZES = (8, 16, 32, 64)


@NAIVE.check("mean_of_means_weights gives N / (W n_r) for batches 8, 16, 32, 64", points=1)
def _naive_weights(ctx):
    fn = ctx.learner("mean_of_means_weights")
    for sizes in (VISIBLE_SIZES, (10, 30)):
        _weights_fail(ctx.call(fn, sizes), sizes)
    return "the weights match N / (W n_r)"


@NAIVE.check("naive_loss under DDP on 4 ranks is the mean of means your weights predict",
             points=1)
def _naive_ddp(ctx):
    fn, weights_fn = ctx.learner("naive_loss"), ctx.learner("mean_of_means_weights")
    case = {"sizes": VISIBLE_SIZES, "seed": 0, "dtype": "float64"}
    weights = ctx.call(weights_fn, case["sizes"])
    _weights_fail(weights, case["sizes"])  # a wrong prediction is named as such, first
    (per_rank,) = _run(ctx, "uneven", fn, "naive_loss", [case], 4)
    err = _naive_judge(per_rank, case, [float(v) for v in weights])
    return f"measured: {err:.1%} relative error against the full-batch gradient, as predicted"


@NAIVE.check("other world sizes, splits with a 1-sample rank, seeds and dtypes", points=1,
             hidden=True)
def _naive_hidden(ctx):
    fn, weights_fn = ctx.learner("naive_loss"), ctx.learner("mean_of_means_weights")
    world = _hidden_world(ctx, 4)
    cases = [{"sizes": _split(ctx.rng, world), "seed": _seed(ctx), "dtype": dt}
             for dt in ("float64", "float32")]
    for c in cases:
        _weights_fail(ctx.call(weights_fn, c["sizes"]), c["sizes"])
    out = _run(ctx, "uneven", fn, "naive_loss", cases, world, _hidden_nic(ctx))
    for per_rank, c in zip(out, cases):
        _naive_judge(per_rank, c, [float(v) for v in ctx.call(weights_fn, c["sizes"])])
    return f"{len(cases)} splits over {world} ranks predicted"


# --- exercise 2: the global count ---------------------------------------------------------------

UNEVEN = LAB.exercise(
    "scale_uneven", needs=("global_mean_loss",),
    title="Divide by the global sample count: the full-batch gradient to float precision",
    hints=(
        "The idea: the full-batch mean divides by N, the samples of ALL ranks, which no rank "
        "sees on its own; and DDP will divide the summed gradients by the world size "
        "afterwards. Build the loss so that both divisions come out right.",
        "Every rank needs N, the number of samples on ALL ranks: put len(x) in a float64 "
        "tensor and dist.all_reduce it (a sum).",
        "Sum this rank's per-sample losses (F.mse_loss(..., reduction='sum')) and divide by "
        "N: summed over ranks that is the full-batch mean loss.",
        "DDP divides the summed gradients by W: multiply your loss by "
        "dist.get_world_size() to undo it. loss = sum * W / N.",
    ))


def _check_uneven(ctx, cases, world, nic=None) -> list[float]:
    fn = ctx.learner("global_mean_loss")
    out = _run(ctx, "uneven", fn, "global_mean_loss", cases, world, nic)
    errs = []
    for per_rank, c in zip(out, cases):
        ref, cands = _uneven_candidates(c)
        errs.append(_judge(per_rank, c, ref, cands, "global_mean_loss"))
    return errs


@UNEVEN.check("4 ranks, batches 8/16/32/64, 3/10/40/99 and 30/30/30/30: the full-batch "
              "gradient (float64, relative error < 1e-10)", points=2)
def _uneven_visible(ctx):
    cases = [{"sizes": s, "seed": 0, "dtype": "float64"}
             for s in (VISIBLE_SIZES, (3, 10, 40, 99), (30, 30, 30, 30))]
    errs = _check_uneven(ctx, cases, 4)
    return f"largest relative error {max(errs):.1e} (float64 rounding)"


@UNEVEN.check("other world sizes (2, 3), splits with a 1-sample rank, seeds, float32 and "
              "float64", points=2, hidden=True)
def _uneven_hidden(ctx):
    world = _hidden_world(ctx, 4)
    cases = [{"sizes": _split(ctx.rng, world), "seed": _seed(ctx), "dtype": dt}
             for dt in ("float64", "float32", "float64")]
    errs = _check_uneven(ctx, cases, world, _hidden_nic(ctx))
    return f"{len(cases)} splits over {world} ranks, largest relative error {max(errs):.1e}"


@UNEVEN.check("a rank with 0 samples (the end of an epoch): still the full-batch gradient",
              points=1, hidden=True)
def _uneven_zero(ctx):
    # On 2 ranks the local count of the other is N; 4 is the visible checks' world size
    # (a hard-coded 4 would pass): 3 or 5 ranks.
    world = int(ctx.rng.choice([3, 5]))
    cases = [{"sizes": _split(ctx.rng, world, with_zero=True), "seed": _seed(ctx),
              "dtype": "float64"}]
    errs = _check_uneven(ctx, cases, world)
    return f"{_describe(cases[0])}: relative error {errs[0]:.1e}"


# --- exercise 3: per-token losses ------------------------------------------------------------

TOKENS_EX = LAB.exercise(
    "scale_sum_mean", needs=("token_loss",),
    title="Sum, then divide once: a per-token loss over padded sequences",
    hints=(
        "The target is the mean over every real token on every rank: (sum of the masked "
        "squared errors on all ranks) / (number of real tokens on all ranks).",
        "Per token: err = (ddp(x) - y).squeeze(-1) ** 2 has shape (sequences, T); "
        "(err * mask).sum() is this rank's sum over real tokens.",
        "The token count: mask.sum() as a float64 tensor, dist.all_reduce'd. Then "
        "loss = masked_sum * W / tokens (W undoes DDP's average).",
    ))

VISIBLE_SEQS = (2, 5, 9)


def _token_case(rng_or_seed, seqs, dtype, *, one_token: bool = False) -> dict:
    rng = np.random.default_rng(rng_or_seed) if isinstance(rng_or_seed, int) else rng_or_seed
    lengths = [int(v) for v in rng.integers(1, TOKENS + 1, size=sum(seqs))]
    if one_token:  # the first sequence of the smallest rank holds one token
        small = int(np.argmin(seqs))
        lengths[_offsets(seqs)[small]] = 1
    return {"seqs": tuple(seqs), "lengths": tuple(lengths), "seed": int(rng.integers(1, 10_000)),
            "dtype": dtype}


def _check_tokens(ctx, cases, world, nic=None) -> list[float]:
    fn = ctx.learner("token_loss")
    out = _run(ctx, "tokens", fn, "token_loss", cases, world, nic)
    errs = []
    for per_rank, c in zip(out, cases):
        ref, cands = _token_candidates(c)
        errs.append(_judge(per_rank, c, ref, cands, "token_loss"))
    return errs


@TOKENS_EX.check("3 ranks with 2, 5 and 9 padded sequences: the per-token full-batch gradient "
                 "(float64)", points=2)
def _tokens_visible(ctx):
    cases = [_token_case(7, VISIBLE_SEQS, "float64")]
    errs = _check_tokens(ctx, cases, 3)
    return f"relative error {errs[0]:.1e} against one process averaging all tokens"


@TOKENS_EX.check("other world sizes, sequence counts and lengths (a 1-token sequence, a rank "
                 "with one sequence), seeds, dtypes", points=2, hidden=True)
def _tokens_hidden(ctx):
    world = _hidden_world(ctx, 3)
    cases = []
    for dt in ("float64", "float32"):
        seqs = [int(v) for v in ctx.rng.integers(2, 9, size=world)]
        seqs[int(ctx.rng.integers(0, world))] = 1
        cases.append(_token_case(ctx.rng, seqs, dt, one_token=True))
    errs = _check_tokens(ctx, cases, world, _hidden_nic(ctx))
    return f"{len(cases)} cases over {world} ranks, largest relative error {max(errs):.1e}"


# --- exercise 4: accumulation with no_sync ---------------------------------------------------

ACCUMULATE = LAB.exercise(
    "scale_accumulate", needs=("accumulate",),
    title="Gradient accumulation: k micro-batches, no_sync, one bucket set per step",
    hints=(
        "The idea: the same loss as for uneven batches, with N counting every micro-batch of "
        "every rank; and DDP must synchronise exactly once, on the last micro-batch (it decides"
        " in forward).",
        "First the count: the samples of ALL k micro-batches on this rank, all-reduced once, "
        "give N. Each micro-batch's loss is its summed loss * W / N.",
        "Run the first k-1 micro-batches' forward AND backward inside `with ddp.no_sync():`; "
        "the last one outside it. That last backward all-reduces everything accumulated.",
        "Do not call zero_grad or optimizer.step inside accumulate: the gradients must add up "
        "in .grad across the k backwards, and the check reads .grad afterwards.",
    ))

VISIBLE_MICRO = ((3, 5, 2, 6), (8, 1, 4, 7))


def _micro_sizes(rng, world: int, k: int) -> tuple[tuple[int, ...], ...]:
    rows = [[int(v) for v in rng.integers(1, 12, size=k)] for _ in range(world)]
    rows[int(rng.integers(0, world))][int(rng.integers(0, k))] = 1
    return tuple(tuple(r) for r in rows)


_last_visible: list = []  # (namespace, fn, result): the two visible checks share one run


def _accumulate_run(ctx, cases, world, nic=None):
    fn = ctx.learner("accumulate")
    return _run(ctx, "accumulate", fn, "accumulate", cases, world, nic)


def _accumulate_visible(ctx):
    """The visible case's run, shared by the gradient and the count checks of one check()
    call (every check of one call sees the same namespace dict; a new call runs again)."""
    fn = ctx.learner("accumulate")
    if _last_visible and _last_visible[0] is ctx.namespace and _last_visible[1] is fn:
        return _last_visible[2]
    result = _accumulate_run(ctx, [VISIBLE_ACC], 2)[0]
    _last_visible[:] = [ctx.namespace, fn, result]
    return result


def _judge_accumulate_grad(per_rank, case) -> float:
    buckets = per_rank[0]["buckets"]
    grads = [r["grad"] for r in per_rank]
    tol = TOL[case["dtype"]]
    if max(relative_error(g, grads[0]) for g in grads) > tol:
        where = _describe(case)
        if buckets == 0:
            raise Fail(f"with {where}, the ranks hold different gradients after accumulate: "
                       "DDP never all-reduced them, because every backward ran inside "
                       "ddp.no_sync(), no_sync on the last micro-batch included. Run the LAST "
                       "micro-batch's forward and backward outside no_sync")
        raise Fail(f"with {where}, the ranks hold different gradients after accumulate "
                   f"although DDP all-reduced {buckets} bucket(s): the synchronised backward "
                   "must be the LAST one; what is accumulated after it stays local")
    ref, cands = _accumulate_candidates(case)
    return _judge(per_rank, case, ref, cands, "accumulate")


def _judge_accumulate_count(per_rank, case) -> str:
    r0 = per_rank[0]
    k, got, one = len(case["sizes"][0]), r0["buckets"], r0["bucket_set"]
    if got == one:
        return (f"{got} bucket all-reduce(s) per step (one bucket set, {r0['bytes']} bytes), "
                f"plus {r0['calls']} all-reduce(s) of your own")
    where = _describe(case)
    if got == 0:
        own = (f" Your {r0['calls']} dist.all_reduce calls of your own do by hand what the "
               "last backward should have done, one tensor at a time." if r0["calls"] > 1
               else " Each rank would step with its own gradient.")
        raise Fail(f"with {where}, DDP all-reduced no gradient bucket at all: no_sync on the "
                   "last micro-batch too, so DDP never synchronises the gradients. Run the "
                   f"last micro-batch's forward and backward outside ddp.no_sync().{own}")
    if k > 1 and got == k * one:
        raise Fail(f"with {where}, DDP all-reduced {got} buckets, k = {k} times one bucket set "
                   f"({one}): backward ran outside no_sync on every micro-batch, k all-reduces "
                   "per step. Run the forward and backward of the first k-1 micro-batches "
                   "inside `with ddp.no_sync():` (DDP decides in forward whether the next "
                   "backward synchronises)")
    raise Fail(f"with {where}, DDP all-reduced {got} buckets; one step should all-reduce one "
               f"bucket set ({one}): only the last micro-batch may run outside no_sync "
               "(forward and backward both inside the context for the others)")


VISIBLE_ACC = {"sizes": VISIBLE_MICRO, "seed": 0, "dtype": "float64"}


@ACCUMULATE.check("2 ranks, k = 4 uneven micro-batches: the full-batch gradient over all 36 "
                  "samples (float64)", points=2)
def _acc_grad(ctx):
    _last_visible.clear()  # the first check of a call always runs
    per_rank = _accumulate_visible(ctx)
    err = _judge_accumulate_grad(per_rank, VISIBLE_ACC)
    return f"relative error {err:.1e}"


@ACCUMULATE.check("one bucket set all-reduced per optimizer step, not k (counted by a DDP "
                  "comm hook)", points=2)
def _acc_count(ctx):
    per_rank = _accumulate_visible(ctx)
    return _judge_accumulate_count(per_rank, VISIBLE_ACC)


@ACCUMULATE.check("other world sizes (3, 4), k (1-5), micro-batch sizes (some of 1 sample), "
                  "seeds, dtypes: gradient and all-reduce count", points=2, hidden=True)
def _acc_hidden(ctx):
    world = _hidden_world(ctx, 2)
    cases = [{"sizes": _micro_sizes(ctx.rng, world, int(ctx.rng.integers(2, 6))),
              "seed": _seed(ctx), "dtype": dt} for dt in ("float64", "float32")]
    cases.append({"sizes": _micro_sizes(ctx.rng, world, 1), "seed": _seed(ctx),
                  "dtype": "float64"})
    out = _accumulate_run(ctx, cases, world, _hidden_nic(ctx))
    for per_rank, c in zip(out, cases):
        _judge_accumulate_grad(per_rank, c)
        _judge_accumulate_count(per_rank, c)
    return f"{len(cases)} cases over {world} ranks (k = {[len(c['sizes'][0]) for c in cases]})"


# --- measurements for the notebook -----------------------------------------------------------


class _Direct:
    """Enough of a check context for the measurements: plain runs, errors as they are."""

    def cluster(self, *, nodes, nic):
        import clusterlab

        return clusterlab.Cluster(nodes=nodes, nic=nic, timeout=60)

    @staticmethod
    def run(cl, fn, *args):
        from ..cluster import RankError

        try:
            return cl.run(fn, *args)
        except RankError as exc:
            if exc.kind != "NotImplementedError":
                raise
            what = getattr(args[1], "__name__", "your function")  # (kind, fn, name, cases)
            raise NotImplementedError(f"{what} is not written yet: fill in its TODO cell "
                                      "above, run it, then this measurement") from None


def _summary(per_rank, ref, extra=None) -> dict:
    g = per_rank[0]["grad"]
    return {"grad": g, "reference": ref, "rel_error": relative_error(g, ref),
            "ranks_agree": all(np.array_equal(r["grad"], g) for r in per_rank),
            "buckets": per_rank[0]["buckets"], "all_reduce_calls": per_rank[0]["calls"],
            **(extra or {})}


def _dtypes(dtype, n: int) -> list[str]:
    return [dtype] * n if isinstance(dtype, str) else list(dtype)


def measure_uneven(loss_fn, splits, *, dtype="float64", seed: int = 0, nic=NIC) -> list[dict]:
    """loss_fn(ddp, x, y) under DDP on real ranks, once per split: with split s, rank r holds
    s[r] samples. All splits must have the same number of ranks; they share one cluster.
    dtype: one for all splits, or one per split.

    Returns, per split, grad (rank 0's DDP gradient), reference (one process, all samples,
    float64), rel_error, ranks_agree (bitwise), shard_grad_sums (per rank, the gradient of
    its summed loss, computed in one process), mean_of_means (what per-rank mean losses
    give, computed in one process), world, n_global, dtype, buckets and all_reduce_calls
    (the learner's own)."""
    cases = [{"sizes": tuple(int(b) for b in s), "seed": seed, "dtype": dt}
             for s, dt in zip(splits, _dtypes(dtype, len(splits)))]
    worlds = {len(c["sizes"]) for c in cases}
    if len(worlds) != 1:
        raise ValueError(f"every split needs the same number of ranks, got {sorted(worlds)}")
    out = _run(_Direct(), "uneven", loss_fn, getattr(loss_fn, "__name__", "loss"), cases,
               worlds.pop(), nic)
    res = []
    for per_rank, case in zip(out, cases):
        parts, sizes = _uneven_parts(case)
        res.append(_summary(per_rank, sum(parts) / sum(sizes), {
            "mean_of_means": _mean_of_means(parts, sizes), "shard_grad_sums": parts,
            "world": len(sizes), "n_global": sum(sizes), "dtype": case["dtype"]}))
    return res


def token_case(seqs_per_rank, seed: int = 7, dtype: str = "float64") -> dict:
    """The padded-sequence data of the token exercise (the checks use seed 7, too)."""
    return _token_case(seed, tuple(seqs_per_rank), dtype)


def measure_tokens(loss_fn, seqs_per_rank, *, seed: int = 7, dtype: str = "float64",
                   nic=NIC) -> dict:
    """loss_fn(ddp, x, y, mask) on ranks holding seqs_per_rank[r] padded sequences.
    Returns as measure_uneven, plus tokens (real tokens per rank) and lengths."""
    case = token_case(seqs_per_rank, seed, dtype)
    (per_rank,) = _run(_Direct(), "tokens", loss_fn, getattr(loss_fn, "__name__", "loss"),
                       [case], len(case["seqs"]), nic)
    ref, _ = _token_candidates(case)
    off = _offsets(case["seqs"])
    tokens = [sum(case["lengths"][off[r]:off[r + 1]]) for r in range(len(case["seqs"]))]
    return _summary(per_rank, ref, {"tokens": tokens, "lengths": list(case["lengths"]),
                                    "padded_positions": [s * TOKENS for s in case["seqs"]]})


def measure_accumulate(fn, micro_sizes, *, dtype="float64", seed: int = 0,
                       nic=NIC) -> list[dict]:
    """fn(ddp, micro_batches) on real ranks, rank r's micro-batches holding micro_sizes[r][j]
    samples; once per dtype when dtype is a list (one cluster for all).

    Returns, per dtype, as measure_uneven, plus k, bucket_set (buckets one synchronised
    backward all-reduces), buckets (what fn's step all-reduced), bytes (gradient bytes it
    all-reduced, per rank) and spread (max relative difference between ranks' gradients)."""
    sizes = tuple(tuple(int(n) for n in row) for row in micro_sizes)
    dtypes = [dtype] if isinstance(dtype, str) else list(dtype)
    cases = [{"sizes": sizes, "seed": seed, "dtype": dt} for dt in dtypes]
    out = _run(_Direct(), "accumulate", fn, getattr(fn, "__name__", "accumulate"), cases,
               len(sizes), nic)
    res = []
    for per_rank, case in zip(out, cases):
        ref, _ = _accumulate_candidates(case)
        g0 = per_rank[0]["grad"]
        res.append(_summary(per_rank, ref, {
            "k": len(sizes[0]), "bucket_set": per_rank[0]["bucket_set"],
            "bytes": per_rank[0]["bytes"], "n_global": sum(map(sum, sizes)),
            "dtype": case["dtype"],
            "spread": max(relative_error(r["grad"], g0) for r in per_rank)}))
    return res
