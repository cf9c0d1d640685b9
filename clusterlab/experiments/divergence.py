"""Silent divergence: data-parallel replicas that drift apart while rank 0's loss looks fine.

Under correct data parallelism every rank holds a bitwise identical copy of the model: the
same initial weights (DDP broadcasts rank 0's at construction), the same all-reduced
gradient, the same optimizer update. Anything that breaks that symmetry goes unnoticed by
the loss log most people read (rank 0's), because rank 0's own replica is fine. The
experiments here break it on purpose, on real ranks of a `clusterlab.Cluster`, and measure
the replicas' parameter fingerprints step by step:

* `train` - one seeded training loop (a small MLP, SGD, DDP or a hand-written all-reduce)
  under a named fault `SCENARIOS`: a parameter changed on one rank after wrapping, per-rank
  RNG misuse, a gradient corrupted (NaN, one flipped bit) before or after the all-reduce,
  different rounding on one rank before the all-reduce (harmless to agreement) or after it
  (a split), and two loops that silently stop learning (an optimizer that holds other
  tensors, a learning rate divided by a wrong divisor); optionally watched by
  `clusterlab.monitor.SyncMonitor`;
* `data_order` - per-rank sampler seeds: duplicated and missing samples;
* `mismatched_collective` - one rank calls a different collective (or another size): a hang
  or a crash, and a named error with TORCH_DISTRIBUTED_DEBUG=DETAIL;
* `crossed_groups` - two process groups used in opposite orders by one rank: a deadlock;
* `swapped_order` - two same-shape all-reduces issued in opposite orders on two ranks: no
  error, no hang, not even with TORCH_DISTRIBUTED_DEBUG=DETAIL; each rank's sums are wrong;
* `missed_barrier` - a rank that never arrives, named by a monitored barrier;
* `detection` - SyncMonitor on several faults: each flagged with its rank and step, and
  silence on a healthy run.

Everything is seeded and deterministic; every run is bounded by the cluster's timeout.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import asdict, dataclass

import numpy as np

from ..cluster import Cluster, ClusterError
from .common import describe_error, preload_ddp
from .gradient_scaling import DEFAULT_NIC, make_regression

# What `train` can do to the replicas (see Fault).
SCENARIOS = (
    "healthy",            # DDP, nothing wrong
    "param_changed",      # `rank` scales its last layer by 1.01 at `step` (after wrapping)
    "init_before_wrap",   # every rank re-initialises with its own seed BEFORE DDP: harmless
    "init_after_wrap",    # ... AFTER DDP wrapped the model: every replica differs
    "dropout_rank_seeds",  # dropout with a different seed per rank: legitimate
    "grad_before",        # `rank` corrupts its gradient before the all-reduce, at `step`
    "grad_after",         # ... after the all-reduce (before the optimizer step)
    "manual_allreduce",   # hand-written data parallelism: all_reduce, then divide (healthy)
    "sum_order",          # hand-written: all_gather, `rank` adds the parts in reverse order
    "float64_update",     # hand-written: `rank` computes its SGD update in float64
    "split_batch_before",  # hand-written: `rank` computes its gradient in two half-batch
                          # backward passes (same math, other rounding), then all_reduce
    "optimizer_detached",  # every rank: the optimizer holds another copy's parameters (built
                          # before a resume branch re-created the model): nothing is updated
    "lr_divided",         # every rank: the learning rate divided by the global batch size,
                          # although the loss is already a mean over it
)
MANUAL = ("manual_allreduce", "sum_order", "float64_update", "split_batch_before")


@dataclass(frozen=True)
class Fault:
    """A scenario of `train`: what goes wrong, on which rank, at which step.

    corruption: "nan" (one gradient element becomes NaN) or "bitflip" (bit `bit` of one
    float32 gradient element is flipped: bit 22 is the top mantissa bit, a change of up to
    50% of that element; 23-30 are the exponent; 31 the sign)."""

    scenario: str = "healthy"
    rank: int = 2
    step: int = 0
    corruption: str = "bitflip"
    bit: int = 22

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}; choose from {SCENARIOS}")
        if self.corruption not in ("nan", "bitflip"):
            raise ValueError(f"corruption must be 'nan' or 'bitflip', got {self.corruption!r}")
        if not 0 <= self.bit <= 31:
            raise ValueError(f"bit must be in 0..31 (float32), got {self.bit!r}")


def corrupt_(t, corruption: str = "bitflip", bit: int = 22, index: int = 0):
    """Corrupt element `index` of float32 tensor `t` in place: NaN, or flip one bit of it
    (seen as int32, xor 1 << bit). Returns (value before, value after)."""
    import torch

    flat = t.view(-1)
    before = float(flat[index])
    if corruption == "nan":
        flat[index] = float("nan")
    else:
        if t.dtype != torch.float32:
            raise TypeError(f"bit flips are defined here for float32, got {t.dtype}")
        mask = (1 << bit) if bit < 31 else -(1 << 31)  # int32 has no +2^31
        flat.view(torch.int32)[index] ^= mask
    return before, float(flat[index])


def build_model(features: int = 8, hidden: int = 16, seed: int = 0, dropout: float = 0.0):
    """The small MLP of these experiments: Linear, Tanh, (Dropout), Linear; seeded."""
    import torch

    torch.manual_seed(seed)
    layers = [torch.nn.Linear(features, hidden), torch.nn.Tanh()]
    if dropout:
        layers.append(torch.nn.Dropout(dropout))
    layers.append(torch.nn.Linear(hidden, 1))
    return torch.nn.Sequential(*layers)


# --- the training loop on every rank ------------------------------------------------------------


def _gather_params(module):
    """Every rank's parameters (float64, flattened): a collective, rows ordered by rank."""
    import torch
    import torch.distributed as dist

    mine = torch.cat([p.detach().reshape(-1).double() for p in module.parameters()])
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, mine)
    return torch.stack(parts)


def _flat(module):
    """The module's parameters as one float64 vector (a copy)."""
    import torch

    return torch.cat([p.detach().reshape(-1).double() for p in module.parameters()])


def _train_rank(faults, steps, features, hidden, batch, lr, seed, every, monitor_options):
    import warnings

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..monitor import SyncMonitor, SyncWarning, fingerprint

    rank, world = dist.get_rank(), dist.get_world_size()
    x_all, y_all = make_regression(4096, features, seed, dtype="float32")
    x_eval, y_eval = x_all[:256], y_all[:256]  # one fixed batch, the same on every rank (training
    # draws from all 4096 rows, so it is an evaluation batch, not a held-out set)
    results = {}
    for f in faults:
        f = Fault(**f)
        me = rank == f.rank
        model = build_model(features, hidden, seed,
                            dropout=0.2 if f.scenario == "dropout_rank_seeds" else 0.0)
        if f.scenario == "init_before_wrap":  # every rank its own initial weights...
            torch.manual_seed(seed + 100 + rank)
            for m in model:
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
        manual = f.scenario in MANUAL
        net = model if manual else DDP(model)  # ...which DDP's broadcast overwrites here
        if f.scenario == "init_after_wrap":  # a layer (re)initialised after wrapping
            torch.manual_seed(seed + 100 + rank)
            model[-1].reset_parameters()
        if f.scenario == "dropout_rank_seeds":
            torch.manual_seed(seed + 100 + rank)
        step_now = {"step": -1}
        injected = {}  # the corrupted element's (value before, value after), on its rank
        if f.scenario == "grad_before" and me:
            def hook(grad, f=f, step_now=step_now, injected=injected):
                if step_now["step"] == f.step:
                    grad = grad.clone()
                    injected["values"] = corrupt_(grad, f.corruption, f.bit)
                return grad

            model[0].weight.register_hook(hook)  # runs before DDP sees the gradient
        if f.scenario == "optimizer_detached":  # SGD skips tensors whose .grad is None: silent
            opt = torch.optim.SGD(build_model(features, hidden, seed).parameters(), lr=lr)
        elif f.scenario == "lr_divided":
            opt = torch.optim.SGD(model.parameters(), lr=lr / (world * batch))
        else:
            opt = torch.optim.SGD(model.parameters(), lr=lr)
        mon = SyncMonitor(net, every=every, **monitor_options) if every else None
        gen = torch.Generator().manual_seed(7919 * (seed + 1) + rank)  # this rank's batches
        loss_log, eval_log, dist_log, finite_log, fp_log = [], [], [], [], []
        gnorm_log, ratio_log, unorm_log = [], [], []
        delivered = []  # per alert: the step at whose end the monitor delivered it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyncWarning)
            for step in range(steps):
                step_now["step"] = step
                with mon.step(step) if mon else contextlib.nullcontext() as s:
                    if f.scenario == "param_changed" and me and step == f.step:
                        with torch.no_grad():  # e.g. a rank-local "fix-up" of the weights
                            model[-1].weight.mul_(1.01)
                    idx = torch.randint(0, len(x_all), (batch,), generator=gen)
                    if f.scenario == "split_batch_before" and me:  # the same mean gradient,
                        half = batch // 2  # accumulated from two halves: other rounding
                        for part in (idx[:half], idx[half:]):
                            (0.5 * F.mse_loss(net(x_all[part]), y_all[part])).backward()
                        with torch.no_grad():
                            loss = F.mse_loss(net(x_all[idx]), y_all[idx])
                    else:
                        loss = F.mse_loss(net(x_all[idx]), y_all[idx])
                        loss.backward()
                    grads = [p.grad for p in model.parameters()]
                    if manual:
                        flat = torch.cat([g.reshape(-1) for g in grads])
                        if f.scenario != "sum_order":  # one all_reduce: the same bytes everywhere
                            dist.all_reduce(flat)
                        else:  # sum_order: gather everybody's gradient, add them up here
                            parts = [torch.empty_like(flat) for _ in range(world)]
                            dist.all_gather(parts, flat)
                            order = range(world - 1, -1, -1) if me else range(world)
                            flat = torch.zeros_like(flat)
                            for j in order:
                                flat += parts[j]
                        flat /= world
                        offset = 0
                        for g in grads:
                            g.copy_(flat[offset:offset + g.numel()].view_as(g))
                            offset += g.numel()
                    if f.scenario == "grad_after" and me and step == f.step:
                        injected["values"] = corrupt_(model[0].weight.grad, f.corruption,
                                                      f.bit)
                    if s is not None:
                        s.after_backward()
                    # What a cheap stall detector reads: the norm of the gradient the
                    # optimizer is given (after the sync) and the size of the update.
                    gnorm_log.append(float(torch.cat([g.reshape(-1) for g in grads]).norm()))
                    before = _flat(model)
                    if f.scenario == "float64_update" and me:
                        with torch.no_grad():  # the same update in float64 arithmetic; its float32
                            # rounding differs from opt.step()'s on some elements
                            for p in model.parameters():
                                p.copy_((p.double() - lr * p.grad.double()).float())
                    else:
                        opt.step()
                    model.zero_grad()  # through the model, as many loops do
                    update = float((_flat(model) - before).norm())
                    unorm_log.append(update)
                    ratio_log.append(update / float(before.norm()))
                    if s is not None:
                        s.record_loss(loss)
                if mon is not None:  # a check's verdict arrives at the end of the next step
                    delivered += [step] * (len(mon.alerts) - len(delivered))
                model.eval()
                with torch.no_grad():
                    eval_loss = F.mse_loss(model(x_eval), y_eval).item()
                model.train()
                everyone = _gather_params(model)
                diff = torch.nan_to_num((everyone - everyone[0]).abs(), nan=float("inf"))
                loss_log.append(loss.item())
                eval_log.append(eval_loss)
                dist_log.append(diff.max(dim=1).values.tolist())
                finite_log.append(bool(torch.isfinite(everyone[rank]).all()))
                fp_log.append(fingerprint(model).tolist())
            alerts = []
            if mon is not None:
                mon.check()  # the last verdict: after the loop, "reported" = steps
                delivered += [steps] * (len(mon.alerts) - len(delivered))
                alerts = [{"step": a.step, "kind": a.kind, "ranks": list(a.ranks),
                           "message": a.message, "reported": at}
                          for a, at in zip(mon.alerts, delivered)]
                report = mon.report()
                mon.close()
        results[f.scenario if f.scenario not in results else f"{f.scenario}#{len(results)}"] = {
            "loss": np.array(loss_log), "eval_loss": np.array(eval_log),
            "distance": np.array(dist_log), "finite": np.array(finite_log),
            "fingerprint": np.array(fp_log, dtype=np.int64), "alerts": alerts,
            "grad_norm": np.array(gnorm_log), "update_ratio": np.array(ratio_log),
            "update_norm": np.array(unorm_log),
            "params": _flat(model).numpy(),
            "report": report if mon is not None else "",
            "injected": injected.get("values"),
        }
    return results


def train(faults=(Fault(),), steps: int = 40, world: int = 4, features: int = 8,
          hidden: int = 16, batch: int = 16, lr: float = 0.05, seed: int = 0,
          monitor_every: int | None = None, monitor_options: dict | None = None,
          nic=DEFAULT_NIC, timeout: float = 60) -> dict:
    """Train the same seeded MLP once per fault (a `Fault`, or a scenario name) on one
    cluster of `world` ranks, recording every rank at every step.

    Each rank draws its own mini-batches from a seeded generator (so a healthy run and a
    faulty run see the same batches). With `monitor_every`, a `SyncMonitor(every=...,
    **monitor_options)` watches the loop (on_alert="warn", warnings silenced; the alerts
    are returned).

    Returns {scenario: {
      "loss": (steps, world) each rank's training loss (rank 0's is what gets logged),
      "eval_loss": (steps, world) each replica's loss on one fixed evaluation batch (rows
                 the training batches are also drawn from: not held out),
      "distance": (steps, world) max |params_r - params_0| after each step (inf: NaN),
      "finite": (steps, world) the replica's parameters are all finite,
      "fingerprint": (steps, world, 2) clusterlab.monitor.fingerprint of each replica,
      "grad_norm": (steps, world) L2 norm of the gradient the optimizer is given (after the
                   sync, and after a "grad_after" corruption),
      "update_ratio": (steps, world) ||w_after - w_before|| / ||w_before|| of each step,
      "update_norm": (steps, world) ||w_after - w_before||: divided by grad_norm, the
                     learning rate SGD actually applied (compare with the configured lr),
      "params": (world, n) each replica's parameters after the last step (float64),
      "alerts": rank 0's SyncMonitor alerts as dicts (step, kind, ranks, message, and
          "reported": the step at whose end the alert was delivered, `steps` for the
          final mon.check(); "step" is the label, the step the problem was seen at),
      "report": rank 0's mon.report() ("" without a monitor),
      "injected": a gradient corruption's (element before, element after) on the faulty
                  rank, or None}}.
    `faults` may also be a dict {name: fault}: the results are then keyed by those names.
    Otherwise they are keyed by scenario name (a scenario used twice: "name#i").
    """
    names = list(faults) if isinstance(faults, dict) else None
    faults = list(faults.values()) if isinstance(faults, dict) else list(faults)
    faults = [Fault(f) if isinstance(f, str) else f for f in faults]
    preload_ddp()
    with Cluster(nodes=world, nic=nic, seed=seed, timeout=timeout) as cl:
        out = cl.run(_train_rank, [asdict(f) for f in faults], steps, features, hidden,
                     batch, lr, seed, monitor_every, dict(monitor_options or {}))
    res = {}
    for i, key in enumerate(out[0]):
        name = names[i] if names else key
        res[name] = {k: np.stack([o[key][k] for o in out], axis=1)
                     for k in ("loss", "eval_loss", "finite", "fingerprint", "grad_norm",
                               "update_ratio", "update_norm")}
        res[name]["params"] = np.stack([o[key]["params"] for o in out])
        res[name]["distance"] = out[0][key]["distance"]  # every rank computed the same rows
        res[name]["alerts"] = out[0][key]["alerts"]
        res[name]["report"] = out[0][key]["report"]
        res[name]["injected"] = next((tuple(o[key]["injected"]) for o in out
                                      if o[key]["injected"] is not None), None)
    return res


def replicas_agree(run: dict, step: int = -1) -> list[int]:
    """The ranks whose fingerprint differs from rank 0's at `step` (of one `train` result)."""
    fp = run["fingerprint"][step]
    return [r for r in range(len(fp)) if not np.array_equal(fp[r], fp[0])]


def run_distance(run: dict, other: dict) -> float:
    """max |params - other's params| over every rank after the last step: how far two runs'
    results are apart (two `train` results of the same model)."""
    return float(np.max(np.abs(run["params"] - other["params"])))


def hidden_saturation(run: dict, rank: int = 0, features: int = 8, hidden: int = 16,
                      seed: int = 0, n: int = 4096) -> dict:
    """Where the first layer's largest |weight| ends up, on `rank`'s final parameters (of one
    `train` result with the default model): its hidden unit's tanh pre-activation z over the
    training inputs, and the share of inputs on which that unit passes back no gradient at
    all in float32 (1 - tanh(z)^2 == 0). Returns {"unit", "input", "n", "median_abs_z",
    "min_abs_z", "zero_grad_share"}."""
    import torch

    model = build_model(features, hidden, seed)
    flat = torch.as_tensor(run["params"][rank])
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(flat.to(torch.float32), model.parameters())
    w, b = model[0].weight.detach(), model[0].bias.detach()
    big = int(torch.argmax(w.abs()))
    unit, inp = divmod(big, features)
    x, _ = make_regression(n, features, seed, dtype="float32")
    with torch.no_grad():
        z = x @ w[unit] + b[unit]
        t = torch.tanh(z)
        zero = (1 - t * t) == 0
    return {"unit": unit, "input": inp, "n": n,
            "median_abs_z": float(z.abs().median()), "min_abs_z": float(z.abs().min()),
            "zero_grad_share": float(zero.double().mean())}


def loss_deviation(run: dict, healthy: dict, last: int = 10, rank: int = 0) -> float:
    """|mean of rank's last `last` losses - the healthy run's| / the healthy run's."""
    a = float(np.mean(run["loss"][-last:, rank]))
    b = float(np.mean(healthy["loss"][-last:, rank]))
    return abs(a - b) / b


# --- random number misuse: data order -------------------------------------------------------------


SEEDINGS = ("shared", "per_rank")


def _data_order_rank(dataset_size, epochs, set_epoch, seed):
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for seeding in SEEDINGS:
        sampler = DistributedSampler(range(dataset_size), num_replicas=world, rank=rank,
                                     shuffle=True,
                                     seed=seed if seeding == "shared" else seed + rank)
        orders = []
        for epoch in range(epochs):
            if set_epoch:
                sampler.set_epoch(epoch)
            orders.append(list(sampler))
        out[seeding] = orders
    return out


def data_order(dataset_size: int = 64, epochs: int = 2, world: int = 4, set_epoch: bool = True,
               seed: int = 0, nic=DEFAULT_NIC, timeout: float = 30) -> dict:
    """Which samples each rank draws with torch's DistributedSampler, per epoch, when every
    rank uses the same seed ("shared") and when each uses its own ("per_rank": seed + rank).

    The sampler shuffles the WHOLE data set with its seed, then rank r takes every W-th
    index from position r. With the same seed on every rank the shards partition the data;
    with a per-rank seed each rank shuffles differently, so some samples are drawn twice and
    others never. Forgetting set_epoch gives the same order every epoch.

    Returns {seeding: {"counts": (epochs, dataset_size) times each sample was drawn,
    "missing": per epoch, samples nobody drew; "duplicated": per epoch, samples drawn more
    than once; "same_order_as_previous_epoch": per epoch after the first (rank 0);
    "orders": [rank][epoch] index lists}} for seeding in SEEDINGS.
    """
    with Cluster(nodes=world, nic=nic, seed=seed, timeout=timeout) as cl:
        out = cl.run(_data_order_rank, dataset_size, epochs, set_epoch, seed)
    res = {}
    for seeding in SEEDINGS:
        orders = [o[seeding] for o in out]
        counts = np.zeros((epochs, dataset_size), dtype=int)
        for per_rank in orders:
            for e, idx in enumerate(per_rank):
                np.add.at(counts[e], idx, 1)
        res[seeding] = {
            "counts": counts, "missing": (counts == 0).sum(axis=1).tolist(),
            "duplicated": (counts > 1).sum(axis=1).tolist(),
            "same_order_as_previous_epoch": [orders[0][e] == orders[0][e - 1]
                                             for e in range(1, epochs)],
            "orders": orders}
    return res


# --- a layer re-created after wrapping ----------------------------------------------------------


def _recreated_rank(find_unused, steps, features, hidden, batch, seed):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    model = build_model(features, hidden, seed)
    ddp = DDP(model, find_unused_parameters=find_unused)
    # Re-created after wrapping (say, a head rebuilt for a new task): DDP registered its
    # gradient hooks on the old layer's parameters and never sees the new ones. The
    # optimizer is built afterwards, so it holds the new layer.
    model[-1] = torch.nn.Linear(hidden, 1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(seed + 1 + rank)  # each rank its own data
    for step in range(steps):
        x, y = torch.randn(batch, features, generator=gen), torch.randn(batch, 1, generator=gen)
        try:
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        except RuntimeError as exc:
            return {"step": step, "message": " ".join(str(exc).split())}
    # the first layer, still hooked, against the re-created last layer
    first = _gather_params(model[0])
    last = _gather_params(model[-1])
    return {"step": None, "message": "",
            "first_gap": float((first - first[0]).abs().max()),
            "last_gap": float((last - last[0]).abs().max())}


def recreated_layer(find_unused: bool, steps: int = 5, world: int = 2, features: int = 8,
                    hidden: int = 16, batch: int = 16, seed: int = 0,
                    timeout: float = 30) -> dict:
    """Each rank re-creates the model's last layer after DDP wrapped it, then trains `steps`
    SGD steps on its own data. Without `find_unused_parameters` DDP raises at the second
    iteration (the old layer's parameters got no gradient, so the prior reduction never
    finished); with it, training runs and each rank's new layer learns from its own gradient
    alone. Plain Gloo, no network emulation.

    Returns {"find_unused", "step" (the iteration that raised, or None), "message" (rank 0's
    error, whitespace collapsed), "first_gap", "last_gap" (largest |w_r - w_0| over the ranks
    of the still-hooked first layer and of the re-created last layer; absent after an
    error)}.
    """
    with Cluster(nodes=world, nic=None, timeout=timeout,
                 environ={"TORCH_DISTRIBUTED_DEBUG": "OFF"}) as cl:
        out = cl.run(_recreated_rank, find_unused, steps, features, hidden, batch, seed)
    return {"find_unused": find_unused, **out[0]}


# --- mismatched collectives and hangs ---------------------------------------------------------


def _quiet(path: str | None = None) -> None:
    """Send this rank's C++ stderr (Gloo's and c10d's log lines) to the file `path`, or to
    /dev/null: the error itself comes back through the launcher. The rank's cluster is closed
    right after."""
    import faulthandler

    fd = os.open(path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    if faulthandler.is_enabled():  # e.g. inherited from pytest, writing to its own copy of fd 2
        faulthandler.enable(file=2)


def _mismatch_rank(case, odd_rank, out_dir=None):
    import json

    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    # What Gloo prints before it aborts a rank (a job's log would show it) goes to a file
    _quiet(None if out_dir is None else os.path.join(out_dir, f"rank{rank}.stderr"))
    # Rank r holds 2**r: every sum of some ranks' inputs is a different number, so what a rank
    # holds afterwards says whose inputs went into it (its own, a peer's, the sum, a mix).
    t = torch.full((_mismatch_len(case, rank, odd_rank),), mismatch_input(rank))
    if case == "op" and rank == odd_rank:
        dist.broadcast(t, src=0)  # everybody else is in an all_reduce
    else:
        dist.all_reduce(t)
    if out_dir is not None:  # what a rank that returned holds, even if a peer still waits
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(t.tolist(), f)
    return t.tolist()


MISMATCH_CASES = ("op", "size", "smaller")


def _mismatch_len(case: str, rank: int, odd_rank: int) -> int:
    """Elements in rank `rank`'s tensor: 4, but the odd rank's has 8 in "size", 2 in "smaller"."""
    return {"size": 8, "smaller": 2}.get(case, 4) if rank == odd_rank else 4


def mismatch_input(rank: int) -> float:
    """The value every element of rank `rank`'s tensor holds in `mismatched_collective`: 2**rank,
    so that each sum of a set of ranks' inputs is a different number."""
    return float(2 ** rank)


def _contributors(value: float, world: int) -> list[int] | None:
    """The ranks whose inputs (2**r) add up to `value`, or None if no set of them does."""
    if not (value == value and 0 < value < 2 ** world and float(value).is_integer()):
        return None
    return [r for r in range(world) if int(value) >> r & 1]


def classify_held(held: list[float], rank: int, world: int) -> str:
    """What rank `rank` holds after a mismatched all_reduce, in words, element by element: its
    own input, a peer's input, the sum of every rank's input (the correct result), a partial
    sum of some ranks' inputs, or other values; "a mix: ..." when the elements differ."""
    def label(value):
        ranks = _contributors(value, world)
        if ranks is None:
            return "other values"
        if ranks == [rank]:
            return "its own input"
        if len(ranks) == 1:
            return f"rank {ranks[0]}'s input"
        if len(ranks) == world:
            return "the sum of every rank's input"
        return "a partial sum of ranks " + ", ".join(map(str, ranks))

    labels = [label(v) for v in held]
    kinds = list(dict.fromkeys(labels))
    if len(kinds) == 1:
        return kinds[0]
    return "a mix: " + "; ".join(f"{labels.count(k)} x {k}" for k in kinds)


GLOO_MISMATCH_HINT = "Is there a distributed collective mismatch"


def gloo_diagnostic(stderr: str) -> str | None:
    """Gloo's own diagnostic in a rank's stderr, shortened to what a person reads: the sentence
    before GLOO_MISMATCH_HINT and the hint itself (Gloo's check that a message fits the buffer
    posted for it, gloo/transport/tcp/pair.cc), else the text of the first `what():` line (an
    uncaught C++ exception), else None."""
    lines = stderr.splitlines()
    for line in lines:
        if GLOO_MISMATCH_HINT in line:
            found = re.search(r"[^.\]]*\.\s*[^.]*" + GLOO_MISMATCH_HINT + r"[^?]*\?", line)
            return found[0].strip() if found else line.split("what():")[-1].strip()
    for line in lines:
        if "what():" in line:
            return line.split("what():", 1)[1].strip()[:160] or None
    return None


def _what_it_says(res: dict) -> str:
    """The part of a mismatch's outcome a person reads: DETAIL's "differ in" line; else
    Gloo's own diagnostic from a rank's stderr (`res["stderr"]`) and how the run ended;
    else "nothing: " and how it ended (a signal, ranks still waiting)."""
    if res["error"] == "RankError":
        said = res["message"].split("differ in the following aspects:")[-1].strip()
        return said.replace("Tensor Tensor shapes", "Tensor shapes")  # torch doubles the word
    if res["error"] is None:
        ended = "it went through"
    elif "SIGABRT" in res["message"]:
        ended = "signal SIGABRT"
    else:
        ended = "still waiting"
    for rank, line in sorted(res["stderr"].items()):
        if line:
            return f'rank {rank}, Gloo: "{line}"; then {ended}'
    return "nothing: " + ended


def mismatched_collective(case: str = "op", debug: str | None = None, world: int = 2,
                          odd_rank: int = 1, timeout: float = 3.0) -> dict:
    """Rank `odd_rank` calls a different collective ("op": broadcast while the others call
    all_reduce) or the same one with a different size ("size": 8 elements instead of 4;
    "smaller": 2).

    Runs on plain Gloo (the debug wrapper wraps Gloo's process group). `debug` sets
    TORCH_DISTRIBUTED_DEBUG for the ranks (None: OFF; "DETAIL": every collective is first
    checked against the other ranks' - op, shapes, dtypes - and a mismatch is a RuntimeError
    naming both). Always bounded by the cluster's `timeout`.

    Rank r's tensor holds `mismatch_input(r)` = 2**r in every element, so that what a rank
    holds afterwards tells whose inputs reached it.

    Returns describe_error's {"error", "ranks", "message"} plus "case", "debug", "wall_s",
    "said" (the part of the outcome a person reads: DETAIL's "differ in" line, or Gloo's own
    diagnostic from a rank's stderr and how the run ended, or "nothing: " and how it ended),
    "stderr": {rank: `gloo_diagnostic` of that rank's C++ stderr, or None}, "inputs": {rank:
    its tensor before the call}, "returned": {rank: its tensor after the call} for every rank
    that returned (also when another rank still waits), "held": {rank: `classify_held` of it},
    and "sum": the correct element value, the sum of every rank's input; "error" is None (and
    "result" set) if, against expectation, it went through.
    """
    import json
    import tempfile
    import time

    if case not in MISMATCH_CASES:
        raise ValueError(f"case must be one of {MISMATCH_CASES}, got {case!r}")
    res = {"case": case, "debug": debug}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="clusterlab-mismatch-") as out_dir:
        try:
            # "OFF" rather than unset: a level set in this process's environment is not
            # inherited
            with Cluster(nodes=world, nic=None, timeout=timeout,
                         environ={"TORCH_DISTRIBUTED_DEBUG": debug or "OFF"}) as cl:
                res.update(error=None, ranks=[], message="",
                           result=cl.run(_mismatch_rank, case, odd_rank, out_dir))
        except ClusterError as exc:
            res.update(describe_error(exc))
        res["wall_s"] = time.monotonic() - t0
        res["returned"], res["stderr"] = {}, {}
        for r in range(world):
            with contextlib.suppress(OSError, ValueError), \
                    open(os.path.join(out_dir, f"rank{r}.json")) as f:
                res["returned"][r] = json.load(f)
            stderr = ""
            with contextlib.suppress(OSError), \
                    open(os.path.join(out_dir, f"rank{r}.stderr"), errors="replace") as f:
                stderr = f.read()
            res["stderr"][r] = gloo_diagnostic(stderr)
    res["inputs"] = {r: [mismatch_input(r)] * _mismatch_len(case, r, odd_rank)
                     for r in range(world)}
    res["held"] = {r: classify_held(v, r, world) for r, v in res["returned"].items()}
    res["sum"] = sum(mismatch_input(r) for r in range(world))
    res["said"] = _what_it_says(res)
    return res


def _crossed_rank(odd_rank):
    import torch
    import torch.distributed as dist

    _quiet()
    # Two groups over the same ranks, say a tensor-parallel and a data-parallel one; created
    # in the same order everywhere, as new_group requires. The odd rank uses them in the
    # other order.
    first, second = dist.new_group(backend="gloo"), dist.new_group(backend="gloo")
    order = [second, first] if dist.get_rank() == odd_rank else [first, second]
    for group in order:
        dist.all_reduce(torch.ones(4), group=group)
    return "done"


def crossed_groups(world: int = 2, odd_rank: int = 1, timeout: float = 2.0) -> dict:
    """Every rank all-reduces once on each of two process groups; rank `odd_rank` uses them in
    the opposite order. Each group's first collective waits for a rank that is blocked in the
    other group's: a deadlock, which only the cluster's `timeout` ends (the groups' own timeout
    is longer). Plain Gloo.

    Returns describe_error's {"error", "ranks", "message"} plus "wall_s"; "error" is None
    (and "result" set) if, against expectation, it went through.
    """
    import time

    t0 = time.monotonic()
    try:
        with Cluster(nodes=world, nic=None, timeout=timeout,
                     environ={"TORCH_DISTRIBUTED_DEBUG": "OFF"}) as cl:
            res = {"error": None, "ranks": [], "message": "",
                   "result": cl.run(_crossed_rank, odd_rank)}
    except ClusterError as exc:
        res = describe_error(exc)
    res["wall_s"] = time.monotonic() - t0
    return res


def _skipped_rank(odd_rank, wait_s, then):
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    _quiet()
    # A group of its own whose timeout is `wait_s`: under DETAIL the wrapper's monitored
    # barrier (a helper Gloo group) inherits it, so the wait is short here.
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=wait_s))
    # The odd rank took another branch and skipped the first all_reduce; every rank then
    # calls `then` more of the same shape, so each of them meets a call one position off.
    calls = then if dist.get_rank() == odd_rank else then + 1
    returned, t0 = 0, time.monotonic()
    for _ in range(calls):
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), group=group)
        except RuntimeError as exc:
            message = re.sub(r"\[/\S+\] ", "", " ".join(str(exc).split()))  # no build paths
            return {"message": message, "wait_s": time.monotonic() - t0, "returned": returned}
        returned += 1
    return {"message": "", "wait_s": time.monotonic() - t0 if calls else 0.0,
            "returned": returned}


def skipped_collective(debug: str | None = None, world: int = 3, odd_rank: int = 2,
                       wait_s: float = 1.0, timeout: float = 10.0, *, then: int = 0) -> dict:
    """Rank `odd_rank` skips one all_reduce (another branch); the others call it. With `then`
    > 0 every rank then calls `then` more all_reduces of the same shape, so the others' calls
    meet the odd rank's one position off, and their last has no partner.

    The all_reduces run on a Gloo group whose timeout is `wait_s`. Plain Gloo: the others
    wait `wait_s` and raise a timeout of their own send or receive, naming no rank. With
    TORCH_DISTRIBUTED_DEBUG=DETAIL (`debug`) the process-group wrapper runs a monitored
    barrier (wait_all_ranks) before every collective, on a helper Gloo group with the same
    timeout: rank 0's error names the ranks that did not arrive. Whether DETAIL's signature
    check notices the shift earlier is what `then` > 0 measures (`returned`).

    Returns {"debug", "then", "messages" (per rank; "" for a rank that raised nothing),
    "named_ranks" (ranks that rank 0's message names as missing), "waits_s" (per rank, of the
    call that raised or the last one), "returned" (per rank, calls that returned without
    error), "wall_s"}.
    """
    import time

    if not (isinstance(then, int) and 0 <= then <= 10):
        raise ValueError(f"then must be an int from 0 to 10, got {then!r}")
    t0 = time.monotonic()
    with Cluster(nodes=world, nic=None, timeout=timeout,
                 environ={"TORCH_DISTRIBUTED_DEBUG": debug or "OFF"}) as cl:
        out = cl.run(_skipped_rank, odd_rank, wait_s, then)
    found = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", out[0]["message"])
    named = [int(r) for r in found[1].split(",") if r.strip()] if found else []
    return {"debug": debug, "then": then, "messages": [o["message"] for o in out],
            "named_ranks": named, "waits_s": [o["wait_s"] for o in out],
            "returned": [o["returned"] for o in out], "wall_s": time.monotonic() - t0}


def _swapped_rank(odd_rank):
    import torch
    import torch.distributed as dist

    _quiet()
    rank = dist.get_rank()
    # Two gradient buckets of the same shape, e.g. two layers of the same size. The odd rank
    # reduces them in the other order (say, it iterates over a set or a dict built in another
    # order, or its hooks fired in another order).
    grads = {"layer_a": torch.full((4,), float(rank + 1)),
             "layer_b": torch.full((4,), 10.0 * (rank + 1))}
    order = ["layer_b", "layer_a"] if rank == odd_rank else ["layer_a", "layer_b"]
    for name in order:
        dist.all_reduce(grads[name])
    return {name: t.tolist() for name, t in grads.items()}


def swapped_order(debug: str | None = None, world: int = 2, odd_rank: int = 1,
                  timeout: float = 10.0) -> dict:
    """Every rank all-reduces two same-shape tensors, "layer_a" (rank r holds r + 1) and
    "layer_b" (10 (r + 1)); rank `odd_rank` issues the two calls in the opposite order.

    Collectives are matched by their position in each rank's sequence, so the first call of
    one rank is summed with the first call of the other: the odd rank's "layer_b" is added to
    the others' "layer_a". Op, shape and dtype agree at every position, so nothing hangs and
    TORCH_DISTRIBUTED_DEBUG=DETAIL (`debug`), which compares exactly those, has nothing to
    report. Runs on plain Gloo, bounded by `timeout`.

    Returns {"debug", "error" (None if it completed), "message", "result": per rank
    {name: values}, "expected": {name: the correct sum}, "wrong": per rank, the names whose
    sum is wrong, "ranks_agree": every rank holds the same values for every name, "wall_s"}.
    """
    import time

    res: dict = {"debug": debug}
    t0 = time.monotonic()
    try:
        with Cluster(nodes=world, nic=None, timeout=timeout,
                     environ={"TORCH_DISTRIBUTED_DEBUG": debug or "OFF"}) as cl:
            out = cl.run(_swapped_rank, odd_rank)
        res.update(error=None, message="", result=out)
    except ClusterError as exc:
        res.update(describe_error(exc), result=None)
    res["wall_s"] = time.monotonic() - t0
    n = world * (world + 1) / 2
    res["expected"] = {"layer_a": [n] * 4, "layer_b": [10 * n] * 4}
    if res["result"] is not None:
        res["wrong"] = [[k for k, v in r.items() if v != res["expected"][k]]
                        for r in res["result"]]
        res["ranks_agree"] = all(r == res["result"][0] for r in res["result"])
    return res


def _barrier_rank(late_rank, late_s, barrier_timeout):
    import time
    from datetime import timedelta

    import torch.distributed as dist

    _quiet()
    if dist.get_rank() == late_rank:  # stuck elsewhere: I/O, a data loader, a deadlock
        time.sleep(late_s)
        return {"arrived": False, "message": "", "wait_s": None}
    t0 = time.monotonic()
    try:
        timeout = timedelta(seconds=barrier_timeout)
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=timeout, wait_all_ranks=True)
        else:  # dist.monitored_barrier accepts only "gloo"; the netem group runs Gloo's own
            dist.group.WORLD.monitored_barrier(timeout, True)
    except RuntimeError as exc:
        return {"arrived": True, "message": str(exc).strip().splitlines()[0],
                "wait_s": time.monotonic() - t0}
    return {"arrived": True, "message": "", "wait_s": time.monotonic() - t0}


def missed_barrier(world: int = 3, late_rank: int = 2, late_s: float = 2.0,
                   barrier_timeout: float = 0.5, nic=None, timeout: float = 10.0) -> dict:
    """Rank `late_rank` is stuck for `late_s` seconds; the others wait in a monitored barrier.

    Rank 0 waits at most `barrier_timeout` for every other rank, then raises an error that
    names the ranks that did not arrive (wait_all_ranks=True: all of them, not only the
    first). Each rank catches its error and returns its first line and how long it waited in
    the barrier.

    Returns {"named_ranks": ranks named by rank 0's error, "message": rank 0's message,
    "messages": per rank, "waits_s": per rank, seconds in the barrier (None for the late
    rank), "wall_s"}.
    """
    import time

    t0 = time.monotonic()
    with Cluster(nodes=world, nic=nic, timeout=timeout) as cl:
        out = cl.run(_barrier_rank, late_rank, late_s, barrier_timeout)
    message = out[0]["message"]
    found = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", message)
    named = [int(r) for r in found[1].split(",") if r.strip()] if found else []
    return {"named_ranks": named, "message": message,
            "messages": [o["message"] for o in out], "waits_s": [o["wait_s"] for o in out],
            "wall_s": time.monotonic() - t0}


# --- detection ----------------------------------------------------------------------------------


DETECTION_FAULTS = (
    Fault("healthy"),
    Fault("param_changed", rank=2, step=12),
    Fault("grad_after", rank=1, step=17, corruption="bitflip", bit=22),
    Fault("grad_before", rank=3, step=23, corruption="nan"),
)


# Timing alerts (stragglers) are the subject of notebook 05. On a shared 2-core machine that
# runs 4 ranks, scheduling noise alone can make one rank's median step 2-5x the others', so
# the synchronisation checks here run with straggler alerts off: every alert below is then a
# deterministic function of the seeded run.
SYNC_ONLY = {"straggler_factor": float("inf")}


def detection(faults=DETECTION_FAULTS, steps: int = 40, every: int = 5, world: int = 4,
              seed: int = 0, monitor_options: dict | None = None, nic=DEFAULT_NIC,
              timeout: float = 60) -> list[dict]:
    """Run each fault under `SyncMonitor(every=every, **monitor_options)` (default
    SYNC_ONLY: straggler alerts off) and report what it flagged.

    Returns one dict per fault: the fault's fields, "alerts" (rank 0's alerts as dicts),
    "first" (the first alert, or None), "report" (mon.report()).
    """
    faults = [Fault(f) if isinstance(f, str) else f for f in faults]
    options = SYNC_ONLY if monitor_options is None else monitor_options
    runs = train(faults, steps=steps, world=world, seed=seed, monitor_every=every,
                 monitor_options=options, nic=nic, timeout=timeout)
    out = []
    for f, (_, run) in zip(faults, runs.items()):
        alerts = run["alerts"]
        out.append({**asdict(f), "alerts": alerts, "first": alerts[0] if alerts else None,
                    "report": run["report"]})
    return out


# --- plotting: replica distance on a log axis with two special rows ---------------------------

# On the log axis of the distance plots two rows are not distances: "0" (bitwise identical to
# rank 0) and "NaN" (this replica's parameters are NaN: no distance exists).
ZERO_ROW, NAN_ROW, TOP = 1e-12, 1e3, 1e1


def plot_distance(ax, run: dict, title: str, ranks=None) -> None:
    """Plot max |params_r - params_0| per step for `ranks` (default: all) of a `train` run."""
    d, steps = run["distance"], np.arange(len(run["distance"]))
    for r in range(d.shape[1]) if ranks is None else ranks:
        fin, zero = np.isfinite(d[:, r]), d[:, r] == 0
        y = np.where(fin & ~zero, np.maximum(d[:, r], ZERO_ROW), np.nan)  # NaN: a gap
        (line,) = ax.plot(steps, y, "o-", ms=2.5, label=f"rank {r}", alpha=0.85)
        # the "0" row on its own: no line joins it to a measured distance
        ax.plot(steps, np.where(zero, ZERO_ROW, np.nan), "o-", ms=2.5, alpha=0.85,
                color=line.get_color())
        nan_steps = steps[~run["finite"][:, r]]
        ax.plot(nan_steps, np.full(len(nan_steps), NAN_ROW), "x", ms=6, mew=1.5,
                color=line.get_color())
    if np.nanmax(np.where(np.isfinite(d), d, np.nan), initial=0) >= TOP:
        raise ValueError(f"a distance at or above {TOP}: it would be drawn on the NaN row")
    ax.axhspan(TOP, NAN_ROW * 10, color="0.9", zorder=0)  # the two rows off the distance scale
    ax.axhspan(ZERO_ROW / 3, ZERO_ROW * 30, color="0.9", zorder=0)
    ax.set_yscale("log")
    ax.set_ylim(ZERO_ROW / 3, NAN_ROW * 10)
    ax.set_yticks([ZERO_ROW, 1e-9, 1e-6, 1e-3, 1, NAN_ROW],
                  ["0", "1e-9", "1e-6", "1e-3", "1", "NaN"])
    ax.minorticks_off()
    ax.set_xlabel("step")
    ax.set_ylabel("max |params_r - params_0|")
    ax.set_title(title, fontsize=10)
