"""Gradient scaling under data parallelism: who divides by what, and what it costs when wrong.

Every experiment runs real `torch.nn.parallel.DistributedDataParallel` (DDP) on the ranks of
a `clusterlab.Cluster` (real processes, Gloo, an emulated network) and compares what DDP
produced with what a single process computes on all the data at once.

The one fact behind the whole topic: DDP all-reduces every gradient and divides it by the
world size W. Each rank's gradient is the gradient of *its own* loss, so with the usual
``reduction="mean"`` loss DDP computes a **mean of means**

    g_DDP = 1/W * sum_r ( 1/n_r * sum_{i on r} g_i )

which equals the true full-batch gradient ``1/N * sum_i g_i`` only when every rank holds the
same number of samples (n_r = N / W). The fix is to divide by the GLOBAL sample count N
(an all-reduce of the local counts): each rank's loss is ``sum_i l_i * W / N`` (the factor W
undoes DDP's own division), or equivalently its mean loss weighted by ``n_r * W / N``.

Public API (each returns plain numbers / numpy arrays; every random draw is seeded, every
run is deterministic: same arguments, same numbers, on any machine):

* `make_regression` - the seeded linear-regression data every experiment shares;
* `full_batch_gradient`, `full_batch_descent` - the single-process reference;
* `uneven_batches` - unequal local batches: mean of means vs the global-count fix;
* `sum_vs_mean` - reduction="sum" makes the gradient (and the effective learning rate)
  depend on the world size;
* `accumulation` - gradient accumulation with and without dividing by the micro-steps;
* `token_accumulation` - accumulation over micro-batches of unequal token counts: the
  per-micro-batch mean / k against the summed token loss * W / T (`token_loss_sum`);
* `no_sync_misuse` - `DDP.no_sync` used wrongly: replicas drift apart;
* `uneven_inputs` - a rank with fewer batches: a hang without `Join`, completion with it;
* `minimisers` - where full-batch training and the mean of means converge (closed form);
* `clipping` - gradient clipping when each rank holds a shard of the weights: by the shard's
  own norm (the bug) or by the global norm;
* `loss_scaling` - GradScaler's skip decision under DDP and with sharded gradients, with and
  without agreeing on it across ranks (ShardedGradScaler).

`uneven_batches` and `sum_vs_mean` also take ``optimizer="adam"``: Adam's update is (up to
its eps) invariant to a constant gradient scale, but not to a re-weighting of the samples.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from ..cluster import Cluster, ClusterError
from .common import describe_error, preload_ddp

# The experiments' default network: every node's NIC adds 1 ms +- 200 us. The lessons here
# are about numbers, not timing, so the impairment is mild; the results do not depend on it
# (Gloo's sums are the same bit for bit whatever the delays).
DEFAULT_NIC = "delay 1ms 200us"
METHODS = ("mean_of_means", "global_count", "weighted")
OPTIMIZERS = ("sgd", "adam")
NO_SYNC_VARIANTS = ("correct", "step_inside_no_sync", "no_final_sync")


# --- data, models and the single-process reference --------------------------------------------


def make_regression(n: int, features: int = 8, seed: int = 0, dtype: str = "float64"):
    """n samples of y = X w* + b* + 0.1 * noise, X ~ N(0, I): the same (X, y) for the same seed.

    Returns torch tensors X (n, features) and y (n, 1). Every rank builds the whole data set
    from the seed and takes its own slice, so ranks need not exchange data."""
    import torch

    g = torch.Generator().manual_seed(1000 + seed)
    dt = getattr(torch, dtype)
    x = torch.randn(n, features, generator=g, dtype=torch.float64)
    w = torch.randn(features, 1, generator=g, dtype=torch.float64)
    y = x @ w + 0.5 + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    return x.to(dt), y.to(dt)


def _linear(features: int, seed: int, dtype: str):
    """nn.Linear(features, 1) with seeded initial weights (the same on every rank)."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Linear(features, 1).to(getattr(torch, dtype))


def _flat_grad(module) -> np.ndarray:
    import torch

    return torch.cat([p.grad.detach().reshape(-1) for p in module.parameters()]).numpy().copy()


def _flat_params(module) -> np.ndarray:
    import torch

    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy().copy()


def _offsets(sizes) -> list[int]:
    return [0, *np.cumsum(sizes).tolist()]


def _optimizer(name: str, params, lr: float):
    """torch.optim.SGD or torch.optim.Adam (default betas and eps) over `params`."""
    import torch

    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")


def full_batch_gradient(n: int, features: int = 8, seed: int = 0) -> np.ndarray:
    """The gradient of the mean squared error over all n samples, in one process (float64),
    at the same initial weights the experiments use: the reference every method is judged by.
    Flattened as [weight..., bias]."""
    import torch

    x, y = make_regression(n, features, seed)
    model = _linear(features, seed, "float64")
    torch.nn.functional.mse_loss(model(x), y).backward()
    return _flat_grad(model)


def full_batch_descent(n: int, features: int = 8, seed: int = 0, steps: int = 30,
                       lr: float = 0.1, optimizer: str = "sgd") -> dict:
    """Full-batch descent (SGD or Adam) on all n samples in one process: parameters and loss
    per step."""
    import torch

    x, y = make_regression(n, features, seed)
    model = _linear(features, seed, "float64")
    opt = _optimizer(optimizer, model.parameters(), lr)
    params, losses = [], []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        params.append(_flat_params(model))
    return {"params": np.array(params), "loss": np.array(losses)}


def relative_error(g: np.ndarray, ref: np.ndarray) -> float:
    """max |g - ref| / max |ref|: the error in units of the reference's largest component."""
    return float(np.max(np.abs(g - ref)) / np.max(np.abs(ref)))


# --- 1. unequal local batches ------------------------------------------------------------------


def _uneven_rank(batch_sizes, features, seed, steps, lr, methods, optimizer):
    """On every rank: one DDP gradient per method at the initial weights, then `steps` steps."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_regression(sum(batch_sizes), features, seed)
    lo, hi = _offsets(batch_sizes)[rank], _offsets(batch_sizes)[rank + 1]
    x, y = x[lo:hi], y[lo:hi]
    model = _linear(features, seed, "float64")
    init = [p.detach().clone() for p in model.parameters()]
    ddp = DDP(model)
    # The fix needs the global sample count: one all-reduce of the local counts.
    count = torch.tensor([float(len(x))], dtype=torch.float64)
    dist.all_reduce(count)
    n_global = float(count)

    def loss_of(method):
        out = ddp(x)
        if method == "mean_of_means":  # what everybody writes: DDP then averages the means
            return F.mse_loss(out, y)
        if method == "global_count":  # sum / N, times W to undo DDP's division by W
            return F.mse_loss(out, y, reduction="sum") * world / n_global
        if method == "weighted":  # the local mean weighted by n_r / N (times W, as above)
            return F.mse_loss(out, y) * (len(x) * world / n_global)
        raise ValueError(f"unknown method {method!r}; choose from {METHODS}")

    result = {"n_global": n_global, "grad": {}, "params": {}}
    for method in methods:
        with torch.no_grad():
            for p, p0 in zip(model.parameters(), init):
                p.copy_(p0)
        opt = _optimizer(optimizer, ddp.parameters(), lr)
        params = []
        for step in range(steps + 1):
            opt.zero_grad()
            loss_of(method).backward()
            if step == 0:
                result["grad"][method] = _flat_grad(model)
            if step == steps:
                break
            opt.step()
            params.append(_flat_params(model))
        result["params"][method] = np.array(params)
    return result


def uneven_batches(batch_sizes=(8, 16, 32, 64), features: int = 8, steps: int = 30,
                   lr: float = 0.1, seed: int = 0, methods=METHODS, optimizer: str = "sgd",
                   nic=DEFAULT_NIC, timeout: float = 60) -> dict:
    """Ranks with unequal local batches (rank r holds batch_sizes[r] samples) under DDP.

    For each method of writing the loss ("mean_of_means": the usual mean loss;
    "global_count": summed loss divided by the all-reduced global count; "weighted": the mean
    loss weighted by n_r / N), the DDP gradient at the initial weights is compared with the
    single-process full-batch gradient over all N = sum(batch_sizes) samples (float64), and
    `steps` of `optimizer` ("sgd" or "adam") are compared with full-batch descent by the same
    optimizer.

    Returns a dict with:
      batch_sizes, world, n_global;
      reference: the full-batch gradient; predicted_mean_of_means: 1/W sum_r (mean gradient
        of shard r), computed in one process (what DDP should produce with mean losses);
      grad[method]: rank 0's DDP gradient; ranks_agree[method]: all ranks held the same one;
      max_abs_error[method], rel_error[method]: against the reference (see relative_error);
      sample_weight[method]: the weight each rank's samples get relative to the full batch
        (N / (W n_r) for mean_of_means, 1 for the fixes);
      param_error[method]: per step, max |params - full-batch descent's params|;
      loss[method]: per step, the full-data loss of the parameters the method reached,
        and loss["full_batch"].
    """
    import torch

    world, n = len(batch_sizes), int(sum(batch_sizes))
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    preload_ddp()
    with Cluster(nodes=world, nic=nic, seed=seed, timeout=timeout) as cl:
        out = cl.run(_uneven_rank, tuple(batch_sizes), features, seed, steps, lr,
                     tuple(methods), optimizer)
    ref = full_batch_gradient(n, features, seed)
    # What DDP should compute with mean losses, predicted in one process.
    offsets, shard_means = _offsets(batch_sizes), []
    x, y = make_regression(n, features, seed)
    for r in range(world):
        model = _linear(features, seed, "float64")
        lo, hi = offsets[r], offsets[r + 1]
        torch.nn.functional.mse_loss(model(x[lo:hi]), y[lo:hi]).backward()
        shard_means.append(_flat_grad(model))
    descent = full_batch_descent(n, features, seed, steps, lr, optimizer)

    def data_loss(params: np.ndarray) -> float:
        w = torch.from_numpy(params[:features]).reshape(1, features)
        b = torch.from_numpy(params[features:])
        return float(torch.nn.functional.mse_loss(x @ w.T + b, y))

    res = {"batch_sizes": list(batch_sizes), "world": world, "n_global": n,
           "optimizer": optimizer, "params": {"full_batch": descent["params"]},
           "reference": ref, "predicted_mean_of_means": np.mean(shard_means, axis=0),
           "grad": {}, "ranks_agree": {}, "max_abs_error": {}, "rel_error": {},
           "sample_weight": {}, "param_error": {}, "loss": {"full_batch": descent["loss"]}}
    for m in methods:
        g = out[0]["grad"][m]
        res["grad"][m] = g
        res["ranks_agree"][m] = all(np.array_equal(g, o["grad"][m]) for o in out)
        res["max_abs_error"][m] = float(np.max(np.abs(g - ref)))
        res["rel_error"][m] = relative_error(g, ref)
        res["sample_weight"][m] = ([n / (world * b) for b in batch_sizes]
                                   if m == "mean_of_means" else [1.0] * world)
        params = out[0]["params"][m]
        res["params"][m] = params
        res["param_error"][m] = np.max(np.abs(params - descent["params"]), axis=1)
        # The loss of the parameters *before* each step, as descent["loss"] records it.
        before = np.vstack([_flat_params(_linear(features, seed, "float64")), params[:-1]])
        res["loss"][m] = np.array([data_loss(p) for p in before])
    return res


# --- 2. sum or mean ------------------------------------------------------------------------


def _sum_mean_rank(global_batch, features, seed, steps, lr, optimizer):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    per = global_batch // world
    x, y = make_regression(global_batch, features, seed)
    x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
    out = {}
    for reduction in ("mean", "sum"):
        model = _linear(features, seed, "float64")
        ddp = DDP(model)
        opt = _optimizer(optimizer, ddp.parameters(), lr)
        losses, norm = [], None
        for _ in range(steps):
            opt.zero_grad()
            loss = F.mse_loss(ddp(x), y, reduction=reduction)
            loss.backward()
            if norm is None:
                norm = float(np.linalg.norm(_flat_grad(model)))
            opt.step()
            with torch.no_grad():  # the loss as a mean over the global batch, comparable
                full = F.mse_loss(model(x), y).reshape(1)
            dist.all_reduce(full)
            losses.append(float(full) / world)
        out[reduction] = {"grad_norm": norm, "loss": losses, "params": _flat_params(model)}
    return out


def sum_vs_mean(world_sizes=(1, 2, 4), global_batch: int = 64, features: int = 8,
                steps: int = 15, lr: float = 0.03, seed: int = 0, optimizer: str = "sgd",
                nic=DEFAULT_NIC, timeout: float = 60) -> dict:
    """The same global batch split over W ranks, with reduction="mean" and "sum" losses.

    DDP divides the summed gradients by W. With mean losses the result is the full-batch
    gradient whatever W is; with summed losses it is (global_batch / W) times that: the
    gradient, and so the effective learning rate, changes whenever the world size does.

    Returns {"world_sizes", "per_rank_batch", "grad_norm": {"mean": [...], "sum": [...]},
    "loss": {"mean": [[per step] per W], "sum": ...}, "effective_lr": {"mean", "sum"}}, where
    the loss is the global-batch mean squared error after each step with the same lr, and
    "params": {"mean": [...], "sum": [...]} the final parameters per W. With
    optimizer="adam" the effective learning rate is lr whatever the gradient's scale (Adam
    divides the step by the gradient's running RMS), up to Adam's eps.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    res = {"world_sizes": list(world_sizes), "global_batch": global_batch, "optimizer": optimizer,
           "params": {"mean": [], "sum": []},
           "per_rank_batch": [global_batch // w for w in world_sizes], "lr": lr,
           "grad_norm": {"mean": [], "sum": []}, "loss": {"mean": [], "sum": []},
           "effective_lr": {"mean": [], "sum": []}}
    for w in world_sizes:
        if global_batch % w:
            raise ValueError(f"global_batch={global_batch} does not split over {w} ranks")
        preload_ddp()
        with Cluster(nodes=w, nic=nic, seed=seed, timeout=timeout) as cl:
            out = cl.run(_sum_mean_rank, global_batch, features, seed, steps, lr, optimizer)[0]
        for red in ("mean", "sum"):
            res["grad_norm"][red].append(out[red]["grad_norm"])
            res["loss"][red].append(np.array(out[red]["loss"]))
            res["params"][red].append(out[red]["params"])
        res["effective_lr"]["mean"].append(lr)
        res["effective_lr"]["sum"].append(lr * global_batch / w if optimizer == "sgd" else lr)
    return res


# --- 3. gradient accumulation --------------------------------------------------------------------


def _accumulation_rank(ks, micro_batch, features, seed):
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for k in ks:
        local = k * micro_batch
        x, y = make_regression(world * local, features, seed)
        x, y = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
        model = _linear(features, seed, "float64")
        ddp = DDP(model)
        # Reference: the whole local batch in one synchronised backward.
        F.mse_loss(ddp(x), y).backward()
        big = _flat_grad(model)
        grads = {}
        for divide in (False, True):
            model.zero_grad()
            for i in range(k):
                xs = x[i * micro_batch:(i + 1) * micro_batch]
                ys = y[i * micro_batch:(i + 1) * micro_batch]
                # The usual pattern: no all-reduce for the first k-1 micro-steps.
                ctx = ddp.no_sync() if i < k - 1 else contextlib.nullcontext()
                with ctx:
                    loss = F.mse_loss(ddp(xs), ys)
                    (loss / k if divide else loss).backward()
            grads[divide] = _flat_grad(model)
        out[k] = {"big_batch": big, "no_division": grads[False], "divided": grads[True]}
    return out


def accumulation(ks=(1, 2, 4, 8), micro_batch: int = 8, world: int = 2, features: int = 8,
                 seed: int = 0, nic=DEFAULT_NIC, timeout: float = 60) -> dict:
    """Gradient accumulation over k micro-batches (k-1 under no_sync, then one synchronised).

    Compares with one synchronised backward over the same k * micro_batch samples per rank:
    summing k mean-loss gradients without dividing by k gives k times that gradient (as if
    the learning rate were k times larger); dividing each micro-loss by k gives it exactly
    (up to rounding).

    Returns {"ks", "ratio": |no_division| / |big_batch| per k, "ratio_divided",
    "rel_error_no_division": against k * big_batch (should be ~1e-16),
    "rel_error_divided": against big_batch}.
    """
    preload_ddp()
    with Cluster(nodes=world, nic=nic, seed=seed, timeout=timeout) as cl:
        out = cl.run(_accumulation_rank, tuple(ks), micro_batch, features, seed)[0]
    res = {"ks": list(ks), "ratio": [], "ratio_divided": [], "rel_error_no_division": [],
           "rel_error_divided": []}
    for k in ks:
        big, nodiv, div = (out[k][key] for key in ("big_batch", "no_division", "divided"))
        res["ratio"].append(float(np.linalg.norm(nodiv) / np.linalg.norm(big)))
        res["ratio_divided"].append(float(np.linalg.norm(div) / np.linalg.norm(big)))
        res["rel_error_no_division"].append(relative_error(nodiv, k * big))
        res["rel_error_divided"].append(relative_error(div, big))
    return res


def token_loss_sum(model, mb):
    """Summed next-token cross-entropy of micro-batch `mb` ({"input_ids", "labels"}, both
    (B, L)): position t predicts label t + 1, and label -100 (padding, the prompt) is left out.
    A sum, not a mean, so the caller chooses the divisor (the global token count)."""
    import torch.nn.functional as F

    logits = model(mb["input_ids"])[:, :-1]   # shift: position t predicts t + 1
    labels = mb["labels"][:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=-100, reduction="sum")


def _token_model(vocab: int, dim: int, seed: int):
    """A tiny float64 language model (embedding, then a linear layer to the vocabulary)."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(vocab, dim),
                               torch.nn.Linear(dim, vocab)).double()


def _token_batches(kept, seq_len: int, vocab: int, seed: int):
    """One micro-batch (1 sequence of seq_len tokens) per entry of `kept`: the first
    kept[i] + 1 labels are real, the rest -100 (padding), so it holds kept[i] loss tokens."""
    import torch

    g = torch.Generator().manual_seed(2000 + seed)
    out = []
    for n in kept:
        ids = torch.randint(vocab, (1, seq_len), generator=g)
        labels = ids.clone()
        labels[:, n + 1:] = -100     # after the shift, exactly n labels remain
        out.append({"input_ids": ids, "labels": labels})
    return out


def _token_accumulation_rank(kept, seq_len, vocab, dim, seed):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    mbs = _token_batches(kept[rank], seq_len, vocab, seed + rank)
    k = len(mbs)
    grads = {}
    for method in ("mean_over_k", "global_tokens"):
        model = _token_model(vocab, dim, seed)
        ddp = DDP(model)
        # T: loss tokens over all k micro-batches and all ranks; one all-reduce per step.
        t = sum((mb["labels"][..., 1:] != -100).sum() for mb in mbs)
        dist.all_reduce(t)
        for i, mb in enumerate(mbs):
            ctx = ddp.no_sync() if i < k - 1 else contextlib.nullcontext()
            with ctx:
                if method == "mean_over_k":   # the bug: each micro-batch's own token mean / k
                    n = (mb["labels"][..., 1:] != -100).sum()
                    loss = token_loss_sum(ddp, mb) / n / k
                else:                          # the fix: summed token loss * W / T
                    loss = token_loss_sum(ddp, mb) * world / t
                loss.backward()
        grads[method] = _flat_grad(model)
    return {"grads": grads, "batches": mbs}


def token_accumulation(kept=((10, 90), (40, 25)), seq_len: int = 96, vocab: int = 16,
                       dim: int = 8, seed: int = 0, nic=DEFAULT_NIC,
                       timeout: float = 60) -> dict:
    """Gradient accumulation over micro-batches with different numbers of loss tokens, on
    real DDP (len(kept) ranks, k = len(kept[r]) micro-steps, no_sync on the first k - 1).

    kept[r][i]: loss tokens (labels not -100) in rank r's micro-batch i. Compares the
    per-micro-batch token mean / k ("mean_over_k") and the summed token loss * W / T
    ("global_tokens") with one process's per-token mean over all micro-batches of all ranks.

    Returns {"tokens": kept, "total": T, "rel_error": {method: error against the reference}}.
    """
    import torch

    preload_ddp()
    world = len(kept)
    with Cluster(nodes=world, nic=nic, seed=seed, timeout=timeout) as cl:
        outs = cl.run(_token_accumulation_rank, tuple(map(tuple, kept)), seq_len, vocab, dim,
                      seed)
    # Reference: one process, every micro-batch of every rank, one per-token mean.
    model = _token_model(vocab, dim, seed)
    batches = [mb for out in outs for mb in out["batches"]]
    total = sum(int((mb["labels"][..., 1:] != -100).sum()) for mb in batches)
    (sum(token_loss_sum(model, mb) for mb in batches) / torch.tensor(float(total))).backward()
    ref = _flat_grad(model)
    return {"tokens": [list(k) for k in kept], "total": total,
            "rel_error": {m: relative_error(outs[0]["grads"][m], ref)
                          for m in ("mean_over_k", "global_tokens")}}


# --- 4. no_sync misuse -----------------------------------------------------------------------


def _mlp(features: int, hidden: int, seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, 1))


def _divergence(module) -> tuple[float, list[float]]:
    """(max over ranks of max |params_r - params_0|, per-rank values): a collective."""
    import torch
    import torch.distributed as dist

    mine = torch.cat([p.detach().reshape(-1).double() for p in module.parameters()])
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, mine)
    per_rank = [float((p - parts[0]).abs().max()) for p in parts]
    return max(per_rank), per_rank


def _no_sync_rank(variants, steps, k, micro_batch, features, hidden, lr, seed):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    out = {}
    for variant in variants:
        model = _mlp(features, hidden, seed)
        ddp = DDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=lr)
        g = torch.Generator().manual_seed(10_000 * (seed + 1) + rank)  # this rank's data
        x_all, y_all = make_regression(4096, features, seed, dtype="float32")
        divergence, per_rank, losses = [], [], []
        for _ in range(steps):
            step_loss = 0.0
            if variant == "no_final_sync":  # every micro-step under no_sync: never synced
                with ddp.no_sync():
                    for _ in range(k):
                        idx = torch.randint(0, len(x_all), (micro_batch,), generator=g)
                        loss = F.mse_loss(ddp(x_all[idx]), y_all[idx]) / k
                        loss.backward()
                        step_loss += loss.item()
                    opt.step()
                    opt.zero_grad()
            else:
                for i in range(k):
                    idx = torch.randint(0, len(x_all), (micro_batch,), generator=g)
                    last = i == k - 1
                    with contextlib.nullcontext() if last else ddp.no_sync():
                        loss = F.mse_loss(ddp(x_all[idx]), y_all[idx]) / k
                        loss.backward()
                        step_loss += loss.item()
                        if variant == "step_inside_no_sync":  # a local step per micro-step
                            opt.step()
                            opt.zero_grad()
                if variant == "correct":
                    opt.step()
                    opt.zero_grad()
            d, pr = _divergence(model)
            divergence.append(d)
            per_rank.append(pr)
            losses.append(step_loss)
        out[variant] = {"divergence": np.array(divergence), "per_rank": np.array(per_rank),
                        "loss": np.array(losses)}
    return out


def no_sync_misuse(variants=NO_SYNC_VARIANTS, steps: int = 20, k: int = 4, world: int = 4,
                   micro_batch: int = 8, features: int = 8, hidden: int = 16, lr: float = 0.05,
                   seed: int = 0, nic=DEFAULT_NIC, timeout: float = 60) -> dict:
    """Gradient accumulation with `DDP.no_sync()`, done right and done wrong, on a small MLP.

    "correct": k-1 micro-steps under no_sync, the k-th outside it (that backward all-reduces
    the accumulated gradients), then one optimizer step. "step_inside_no_sync": an optimizer
    step after every micro-step, so k-1 of every k updates use this rank's own gradient only.
    "no_final_sync": every backward under no_sync (the synchronised last backward forgotten):
    the gradients are never all-reduced. Each rank draws its own micro-batches.

    Returns {variant: {"divergence": per step, max over ranks of max |params_r - params_0|;
    "per_rank": (steps, world) the same per rank; "loss": rank 0's training loss per step}}.
    """
    preload_ddp()
    with Cluster(nodes=world, nic=nic, seed=seed, timeout=timeout) as cl:
        out = cl.run(_no_sync_rank, tuple(variants), steps, k, micro_batch, features, hidden,
                     lr, seed)
    return out[0]


# --- 5. uneven inputs and Join ---------------------------------------------------------------


def _uneven_inputs_rank(batches, use_join, divide_by_initial, micro_batch, features, seed):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    model = _linear(features, seed, "float64")
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    x_all, y_all = make_regression(micro_batch * sum(batches), features, seed)
    start = _offsets(batches)[rank] * micro_batch
    local, synced = [], []
    ctx = (Join([ddp], divide_by_initial_world_size=divide_by_initial) if use_join
           else contextlib.nullcontext())
    with ctx:
        for b in range(batches[rank]):
            lo = start + b * micro_batch
            x, y = x_all[lo:lo + micro_batch], y_all[lo:lo + micro_batch]
            # This rank's own gradient, for the record (not part of training).
            own = torch.autograd.grad(F.mse_loss(model(x), y), list(model.parameters()))
            local.append(torch.cat([t.reshape(-1) for t in own]).numpy().copy())
            opt.zero_grad()
            F.mse_loss(ddp(x), y).backward()
            synced.append(_flat_grad(model))
            opt.step()
        own_end = _flat_params(model)  # before Join's exit hook broadcasts the last joiner's
    return {"steps": batches[rank], "local": local, "synced": synced,
            "params": _flat_params(model), "params_own_end": own_end}


def uneven_inputs(batches=(8, 8, 8, 5), use_join: bool = True,
                  divide_by_initial_world_size: bool = True, micro_batch: int = 8,
                  features: int = 8, seed: int = 0, nic=DEFAULT_NIC,
                  timeout: float = 5.0) -> dict:
    """Rank r trains on batches[r] batches under DDP; one rank runs out of data first.

    Without `Join` the ranks that still have data wait in their next gradient all-reduce for
    a rank that will never come: a hang, which the cluster's `timeout` turns into a
    ClusterTimeout naming the waiting ranks. With `torch.distributed.algorithms.join.Join`
    the finished rank "shadows" the all-reduces with zeros until everybody is done. DDP then
    divides by the initial world size (default), so after a rank joined the gradient is
    |active| / W of the active ranks' mean: a silent gradient-scaling change.

    On exit, Join's DDP hook broadcasts the parameters (not the optimizer state) of the last
    rank to join, so the final replicas agree whatever happened before; "gap_before_exit" is
    each rank's max |params - rank 0's| when its own loop ended (a rank that left early
    stopped updating then).

    Returns {"completed", "wall_s", "batches"}, plus on success "steps" per rank,
    "replicas_agree" (final parameters identical on all ranks), "gap_before_exit" and
    "grad_scale" per step
    (|synced gradient| / |mean of the active ranks' own gradients|, rank 0) with
    "active" per step; on failure describe_error's "error", "ranks", "message".
    """
    world = len(batches)
    t0 = time.monotonic()
    res: dict = {"batches": list(batches), "use_join": use_join}
    try:
        preload_ddp()
        with Cluster(nodes=world, nic=nic, seed=seed, timeout=timeout) as cl:
            out = cl.run(_uneven_inputs_rank, tuple(batches), use_join,
                         divide_by_initial_world_size, micro_batch, features, seed)
    except ClusterError as exc:
        res.update(completed=False, wall_s=time.monotonic() - t0, **describe_error(exc))
        return res
    res.update(completed=True, wall_s=time.monotonic() - t0,
               steps=[o["steps"] for o in out],
               replicas_agree=all(np.array_equal(o["params"], out[0]["params"]) for o in out),
               gap_before_exit=np.array([float(np.max(np.abs(o["params_own_end"]
                                                              - out[0]["params_own_end"])))
                                         for o in out]))
    scale, active = [], []
    for t in range(max(batches)):
        ranks = [r for r in range(world) if batches[r] > t]
        mean_own = np.mean([out[r]["local"][t] for r in ranks], axis=0)
        synced = out[ranks[0]]["synced"][t]
        scale.append(float(np.linalg.norm(synced) / np.linalg.norm(mean_own)))
        active.append(len(ranks))
    res.update(grad_scale=np.array(scale), active=np.array(active))
    return res


# --- 6. where the mean of means converges ------------------------------------------------------


def minimisers(batch_sizes=(3, 10, 40, 99), features: int = 8, seed: int = 0) -> dict:
    """The parameters full-batch training converges to, and those the mean of means does.

    The mean-of-means loss (1/W) sum_r (1/n_r) sum_{i on r} (x_i w + b - y_i)^2 is a weighted
    least-squares problem (sample weight 1 / (W n_r)); its minimiser differs from the ordinary
    least-squares one unless the shards look alike. Closed form, one process (float64).

    Returns {"full_batch", "mean_of_means": parameter vectors [w..., b]; "shift": max |their
    difference|; "scale": max |full_batch|; "min_loss": the full-data loss at the full-batch
    minimiser; "excess_loss": the full-data loss at the mean-of-means minimiser over
    "min_loss", minus 1}.
    """
    x, y = make_regression(int(sum(batch_sizes)), features, seed)
    a = np.hstack([x.numpy(), np.ones((len(x), 1))])
    t = y.numpy()[:, 0]
    weights = np.concatenate([np.full(n, 1.0 / (len(batch_sizes) * n)) for n in batch_sizes])
    full = np.linalg.lstsq(a, t, rcond=None)[0]
    root = np.sqrt(weights)
    mom = np.linalg.lstsq(a * root[:, None], t * root, rcond=None)[0]

    def loss(p):
        return float(np.mean((a @ p - t) ** 2))

    return {"full_batch": full, "mean_of_means": mom,
            "shift": float(np.max(np.abs(mom - full))), "scale": float(np.max(np.abs(full))),
            "min_loss": loss(full), "excess_loss": loss(mom) / loss(full) - 1}


# --- 7. clipping sharded gradients -----------------------------------------------------------

CLIP_MODES = ("none", "local", "global")


def _shard_data(n, features, world, seed):
    """Regression data whose feature blocks (one per rank) have scales 1, 2, 4, ...: the
    shards' gradient norms then differ, as the layers of a real model do."""
    import torch

    x, y = make_regression(n, features, seed)
    scale = torch.repeat_interleave(2.0 ** torch.arange(world, dtype=torch.float64),
                                    features // world)
    return x * scale, y


def _clip_rank(features, n, max_norm, steps, lr, seed):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = _shard_data(n, features, world, seed)
    per = features // world
    cols = slice(rank * per, (rank + 1) * per)
    w0 = torch.linspace(-0.5, 0.5, features, dtype=torch.float64).reshape(features, 1)
    out = {}
    for mode in CLIP_MODES:
        # This rank's block of the weights, as under tensor parallelism (a column block of a
        # linear layer) or FSDP (a shard of the flat parameter).
        w = torch.nn.Parameter(w0[cols].clone())
        opt = torch.optim.SGD([w], lr=lr)
        grads, params, local_norms = [], [], []
        for _ in range(steps):
            partial = x[:, cols] @ w
            total = partial.detach().clone()
            dist.all_reduce(total)  # the full prediction: the sum of every block's part
            pred = partial + (total - partial.detach())  # its gradient flows to this block
            opt.zero_grad()
            F.mse_loss(pred, y).backward()
            local_norms.append(float(w.grad.norm()))
            if mode == "local":  # what clip_grad_norm_ does on the parameters it is given
                torch.nn.utils.clip_grad_norm_([w], max_norm)
            elif mode == "global":  # the norm of the WHOLE gradient: sum the squares first
                sq = w.grad.pow(2).sum().reshape(1)
                dist.all_reduce(sq)
                coef = torch.clamp(max_norm / (sq.sqrt() + 1e-6), max=1.0)  # as clip_grad_norm_
                w.grad.mul_(coef)
            grads.append(w.grad.detach().reshape(-1).clone())
            opt.step()
            params.append(w.detach().reshape(-1).clone())
        # Put the blocks back together, as a checkpoint would.
        g_all = [torch.empty(steps * per, dtype=torch.float64) for _ in range(world)]
        p_all = [torch.empty(steps * per, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(g_all, torch.cat(grads))
        dist.all_gather(p_all, torch.cat(params))
        n_all = [torch.empty(steps, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(n_all, torch.tensor(local_norms, dtype=torch.float64))
        out[mode] = {
            "grad": torch.cat([g.reshape(steps, per) for g in g_all], dim=1).numpy(),
            "params": torch.cat([p.reshape(steps, per) for p in p_all], dim=1).numpy(),
            "local_norms": torch.stack(n_all, dim=1).numpy()}
    return out


def _clip_reference(features, n, world, max_norm, steps, lr, seed, clip):
    """The same model in one process, clipped (or not) with clip_grad_norm_ on all weights."""
    import torch
    import torch.nn.functional as F

    x, y = _shard_data(n, features, world, seed)
    w = torch.nn.Parameter(torch.linspace(-0.5, 0.5, features, dtype=torch.float64)
                           .reshape(features, 1))
    opt = torch.optim.SGD([w], lr=lr)
    grads, params, norms = [], [], []
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(x @ w, y).backward()
        norms.append(float(w.grad.norm()))
        if clip:
            torch.nn.utils.clip_grad_norm_([w], max_norm)
        grads.append(w.grad.detach().reshape(-1).clone().numpy())
        opt.step()
        params.append(w.detach().reshape(-1).clone().numpy())
    return {"grad": np.array(grads), "params": np.array(params), "norm": np.array(norms)}


def clipping(world: int = 4, features: int = 16, n: int = 256, max_norm: float = 1.0,
             steps: int = 20, lr: float = 0.02, seed: int = 0, nic=DEFAULT_NIC,
             timeout: float = 60) -> dict:
    """Gradient clipping when each of `world` ranks holds one block of a linear model's
    weights (as under tensor parallelism or FSDP), against one process that holds them all.

    "local": every rank calls clip_grad_norm_(its block, max_norm), so every block is clipped
    by its OWN norm; "global": the squared block norms are all-reduced first, so every block
    is scaled by the same factor max_norm / ||whole gradient|| (what clip_grad_norm_ computes
    in one process, and what FSDP's clip_grad_norm_ and DTensor-aware clipping do);
    "none": no clipping. The feature blocks have scales 1, 2, 4, ... so the blocks' gradient
    norms differ.

    Returns {"max_norm", "reference": {"grad", "params", "norm"} (one process, clipped),
    "unclipped_reference", and per mode: "grad" (steps, features) the clipped gradient,
    "params" (steps, features), "local_norms" (steps, world) each block's norm before
    clipping, "rel_error" of step 0's gradient against the reference (see relative_error),
    "cosine" between step 0's gradient and the reference's, "block_scale" (world,) the
    factor each block's gradient was multiplied by at step 0, "param_error" per step}.
    """
    if features % world:
        raise ValueError(f"features={features} does not split into {world} blocks")
    preload_ddp()
    with Cluster(nodes=world, nic=nic, seed=seed, timeout=timeout) as cl:
        out = cl.run(_clip_rank, features, n, max_norm, steps, lr, seed)[0]
    ref = _clip_reference(features, n, world, max_norm, steps, lr, seed, clip=True)
    raw = _clip_reference(features, n, world, max_norm, steps, lr, seed, clip=False)
    res = {"max_norm": max_norm, "world": world, "reference": ref, "unclipped_reference": raw}
    per = features // world
    g_raw = raw["grad"][0]
    for mode, r in out.items():
        g = r["grad"][0]
        scale = [float(np.linalg.norm(g[b * per:(b + 1) * per])
                       / np.linalg.norm(g_raw[b * per:(b + 1) * per])) for b in range(world)]
        res[mode] = {**r, "rel_error": relative_error(g, ref["grad"][0]),
                     "cosine": float(g @ ref["grad"][0]
                                     / (np.linalg.norm(g) * np.linalg.norm(ref["grad"][0]))),
                     "block_scale": np.array(scale),
                     "param_error": np.max(np.abs(r["params"] - ref["params"]), axis=1)}
    return res


# --- 8. loss scaling (GradScaler) and its skip decision ----------------------------------------

SCALER_CASES = ("ddp", "sharded_local", "sharded_synced")


def _scaler_rank(cases, steps, inf_step, inf_rank, features, batch, lr, init_scale, seed):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    x_all, y_all = make_regression(world * batch, features, seed, dtype="float32")
    x, y = x_all[rank * batch:(rank + 1) * batch], y_all[rank * batch:(rank + 1) * batch]
    out = {}
    for case in cases:
        torch.manual_seed(seed)
        flat0 = torch.randn(features + 1) * 0.1  # [w..., b], the same on every rank
        scales, skipped, params = [], [], []
        if case == "ddp":
            model = torch.nn.Linear(features, 1)
            with torch.no_grad():
                model.weight.copy_(flat0[:features].reshape(1, -1))
                model.bias.copy_(flat0[features:])
            ddp = DDP(model)
            opt = torch.optim.SGD(ddp.parameters(), lr=lr)
            scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
            state = {"step": -1}

            def overflow(grad, state=state):  # this rank's backward overflows (as fp16 can)
                if state["step"] == inf_step and rank == inf_rank:
                    grad = grad.clone()
                    grad.view(-1)[0] = float("inf")
                return grad

            model.weight.register_hook(overflow)  # runs before DDP's all-reduce
            for step in range(steps):
                state["step"] = step
                opt.zero_grad()
                before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
                scaler.scale(F.mse_loss(ddp(x), y)).backward()  # DDP all-reduces here
                scaler.step(opt)  # skipped if this rank's (synchronised) gradient has an inf
                scaler.update()
                now = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
                skipped.append(bool(torch.equal(before, now)))
                scales.append(float(scaler.get_scale()))
                params.append(now.numpy().copy())
        else:
            # FSDP-style: each rank owns one shard of the flat parameter vector and updates
            # only that shard; the full vector is all-gathered for the forward pass.
            per = (features + 1) // world  # loss_scaling checks that it divides
            lo, hi = rank * per, (rank + 1) * per
            shard = torch.nn.Parameter(flat0[lo:hi].clone())
            opt = torch.optim.SGD([shard], lr=lr)
            scaler = (ShardedGradScaler(device="cpu", init_scale=init_scale)
                      if case == "sharded_synced"
                      else torch.amp.GradScaler("cpu", init_scale=init_scale))
            full = flat0.clone()
            for step in range(steps):
                theta = full.clone().requires_grad_(True)
                loss = F.mse_loss(x @ theta[:features].reshape(-1, 1) + theta[features], y)
                scaler.scale(loss).backward()
                g = theta.grad
                if step == inf_step and rank == inf_rank:  # overflow in this rank's backward,
                    g[lo] = float("inf")  # in an element of its own shard
                dist.all_reduce(g)  # then each rank keeps its shard (a reduce-scatter)
                shard.grad = g[lo:hi] / world
                before = shard.detach().clone()
                scaler.step(opt)  # decided on THIS rank's shard only, unless synchronised
                scaler.update()
                skipped.append(bool(torch.equal(before, shard.detach())))
                scales.append(float(scaler.get_scale()))
                parts = [torch.empty(per) for _ in range(world)]
                dist.all_gather(parts, shard.detach().clone())
                full = torch.cat(parts)
                params.append(full.numpy().copy())
                opt.zero_grad()
        out[case] = {"skipped": skipped, "scale": scales, "params": np.array(params)}
    return out


def loss_scaling(cases=SCALER_CASES, world: int = 4, steps: int = 6, inf_step: int = 2,
                 inf_rank: int = 2, features: int = 7, batch: int = 16, lr: float = 0.05,
                 init_scale: float = 2.0 ** 16, seed: int = 0, nic=DEFAULT_NIC,
                 timeout: float = 60) -> dict:
    """torch.amp.GradScaler on `world` real ranks when one rank's backward overflows.

    At step `inf_step`, rank `inf_rank`'s gradient gets an inf (what an fp16 overflow
    produces; here float32 with a scaled loss, so that it runs on CPU). GradScaler then skips
    the optimizer step and halves its scale - on the ranks that see the inf.

    "ddp": DDP all-reduces the gradients before the scaler looks at them, so every rank sees
    the inf, skips, and halves its scale: consistent. "sharded_local": each rank owns a shard
    of the parameters (as under FSDP) and a plain GradScaler checks only that shard, so only
    the shard's owner skips; its scale then differs from the others' and the next all-reduce
    sums gradients scaled by different factors. "sharded_synced": ShardedGradScaler (FSDP's)
    all-reduces the found-inf flag, so every rank skips.

    Returns {case: {"skipped": (steps, world) the step left this rank's parameters unchanged,
    "scale": (steps, world) the scale after the step, "params": (steps, world, n) the full
    parameter vector every rank holds after the step}} plus "inf_step", "inf_rank".
    """
    unknown = set(cases) - set(SCALER_CASES)
    if unknown:
        raise ValueError(f"unknown cases {sorted(unknown)}; choose from {SCALER_CASES}")
    if not 0 <= inf_rank < world:
        raise ValueError(f"inf_rank must be in 0..{world - 1}, got {inf_rank}")
    if (features + 1) % world:
        raise ValueError(f"features + 1 = {features + 1} parameters do not split into {world} "
                         "equal shards")
    preload_ddp()
    with Cluster(nodes=world, nic=nic, seed=seed, timeout=timeout) as cl:
        out = cl.run(_scaler_rank, tuple(cases), steps, inf_step, inf_rank, features, batch,
                     lr, init_scale, seed)
    res: dict = {"inf_step": inf_step, "inf_rank": inf_rank, "world": world}
    for case in cases:
        res[case] = {k: np.stack([np.array(o[case][k]) for o in out], axis=1)
                     for k in ("skipped", "scale", "params")}
    return res


# --- 9. a scale that changes mid-run, under Adam ---------------------------------------------


def rescaled_midway(factor: float = 0.75, before: int = 1000, after: int = 3000,
                    lr: float = 1e-3, optimizer: str = "adam",
                    probes=(1, 10, 100, 1000, 3000)) -> dict:
    """The step size when every gradient is multiplied by `factor` from step `before` on.

    One parameter, gradient 1 for `before` steps, then `factor` (as `Join`'s active / W does
    once a rank is done), `optimizer` with PyTorch's defaults (one process, float64). A
    constant factor over the whole run cancels in Adam's m / sqrt(v); a factor that switches
    mid-run does not at once: m follows within ~1/(1-beta1) steps, v within ~1/(1-beta2).

    Returns {"factor", "before", "optimizer", "betas" (Adam's, else None), "probes": steps
    after the switch, "ratio": the step size `probe` steps after the switch over the last
    step size before it}.
    """
    import torch

    p = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = _optimizer(optimizer, [p], lr)
    sizes = []
    for t in range(before + max(probes)):
        p.grad = torch.full_like(p, 1.0 if t < before else factor)
        old = p.detach().clone()
        opt.step()
        sizes.append(float((p.detach() - old).abs()))
    ref = sizes[before - 1]
    return {"factor": factor, "before": before, "optimizer": optimizer,
            "betas": tuple(opt.defaults["betas"]) if "betas" in opt.defaults else None,
            "probes": list(probes), "ratio": [sizes[before - 1 + k] / ref for k in probes]}
