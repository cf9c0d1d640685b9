"""Races users of torch.distributed write themselves: the experiments of notebook 06.

`async_collective_races`: reading or editing a tensor while its
`dist.all_reduce(t, async_op=True)` is still in flight (Gloo reduces in place, in chunks, on
its own thread, so what a racing read or edit meets is decided by this machine's timing).

`ddp_hook_race`: unmodified DDP with a communication hook whose returned future does, or
does not, chain on the collective it launched. DDP waits on the future the hook returns
and then uses the bucket as the averaged gradient; a future that is complete before the
all-reduce is hands DDP the bucket as it was, so each rank steps with its own gradient.

Public API: `ASYNC_VARIANTS`, `async_collective_races`, `HOOKS`, `ddp_hook_race`.
"""

from __future__ import annotations

import datetime
import hashlib

import numpy as np
import torch
import torch.distributed as dist

from .common import use_or_open

__all__ = ["ASYNC_VARIANTS", "HOOKS", "async_collective_races", "ddp_hook_race"]

ASYNC_VARIANTS = ("read_before_wait", "wait_then_read", "edit_before_wait", "wait_then_edit")


def _digest(a: np.ndarray) -> str:
    """A fingerprint of the array's bytes that every process computes alike. (hash() of bytes
    is salted per interpreter: ranks started by "spawn", Cluster's default on macOS and
    Windows, would disagree on identical bytes.)"""
    return hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest()


def _async_races_rank(numel, trials, add):
    rank, world = dist.get_rank(), dist.get_world_size()
    total = world * (world + 1) / 2  # every rank contributes rank + 1: the reduced value
    out = {v: [] for v in ASYNC_VARIANTS}
    for _ in range(trials):
        for v in ASYNC_VARIANTS:
            g = torch.full((numel,), float(rank + 1))  # this rank's gradient bucket
            dist.barrier()  # all ranks issue the collective together
            if v == "read_before_wait":  # use the result before the collective is done
                work = dist.all_reduce(g, async_op=True)
                seen = g.clone()
                work.wait()
            elif v == "wait_then_read":
                work = dist.all_reduce(g, async_op=True)
                work.wait()
                seen = g.clone()
            elif v == "edit_before_wait":  # e.g. weight decay added into the bucket in place
                work = dist.all_reduce(g, async_op=True)
                g.add_(add)
                work.wait()
                seen = g.clone()
            else:  # wait_then_edit
                work = dist.all_reduce(g, async_op=True)
                work.wait()
                g.add_(add)
                seen = g.clone()
            want = total if v in ("read_before_wait", "wait_then_read") else total + add
            s = seen.numpy()
            out[v].append({
                "wrong": int(np.count_nonzero(s != want)),
                # what the wrong elements hold (edits): the rank's own value (not reduced yet),
                # the edit summed over all ranks (it was sent), the edit lost (overwritten)
                "local": int(np.count_nonzero(s == rank + 1)),
                "edit_sent": int(np.count_nonzero(s == total + world * add)),
                "edit_lost": int(np.count_nonzero(s == total)) if want != total else 0,
                # some ranks' edits sent, not all and not exactly one (that is 110: right)
                "edit_partly": int(np.count_nonzero(np.isin(
                    s, [total + k * add for k in range(2, world)]))) if want != total else 0,
                "digest": _digest(s),
            })
    return out


def async_collective_races(
    workers: int = 4,
    trials: int = 20,
    numel: int = 1 << 18,
    *,
    add: float = 100.0,
    cluster=None,
    timeout: float = 60,
) -> dict:
    """Read or edit a tensor while its `dist.all_reduce(t, async_op=True)` is in flight.

    Every rank fills a float32 bucket of `numel` elements with rank + 1 (so the reduced value
    is W(W+1)/2), and per trial runs each variant once:
    read_before_wait (clone the bucket right after issuing, then wait), wait_then_read,
    edit_before_wait (`g.add_(add)` before wait(): the intended result is sum + add, as in the
    synchronous program), wait_then_edit. Runs on plain Gloo without an emulated network
    (`cluster` defaults to `Cluster(nodes=workers, nic=None)`): Gloo reduces in place into the
    caller's tensor, in chunks, on its own thread, so what a racing read or edit meets is
    decided by this machine's real timing.

    Returns {"workers", "trials", "numel", "variants": {v: {"wrong_trials": reads (rank x
    trial) with any wrong element, "reads": trials x workers, "wrong_elements": fraction of
    all elements wrong, "local", "edit_sent", "edit_lost", "edit_partly": fractions of
    elements in those states (this rank's own value; every rank's edit summed; no edit; from 2
    to W - 1 ranks' edits), "disagree_trials": trials whose ranks ended with different bytes}}}.
    """
    with use_or_open(cluster, nodes=workers, nic=None, timeout=timeout) as cl:
        out = cl.run(_async_races_rank, numel, trials, add)
    world = len(out)
    variants = {}
    for v in ASYNC_VARIANTS:
        rows = [o[v] for o in out]  # [rank][trial]
        cells = [rows[r][t] for r in range(world) for t in range(trials)]
        n = world * trials * numel
        variants[v] = {
            "reads": world * trials,
            "wrong_trials": sum(c["wrong"] > 0 for c in cells),
            "wrong_elements": sum(c["wrong"] for c in cells) / n,
            "local": sum(c["local"] for c in cells) / n,
            "edit_sent": sum(c["edit_sent"] for c in cells) / n,
            "edit_lost": sum(c["edit_lost"] for c in cells) / n,
            "edit_partly": sum(c["edit_partly"] for c in cells) / n,
            "disagree_trials": sum(len({rows[r][t]["digest"] for r in range(world)}) > 1
                                   for t in range(trials)),
        }
    return {"workers": world, "trials": trials, "numel": numel, "add": add,
            "variants": variants}


# --- A DDP communication hook that does not chain on its collective -------------------------

HOOKS = ("chained", "unchained")


def _hooks(world: int, pending: list) -> dict:
    """The two hooks: both divide the bucket by the world size and all-reduce it in place
    (what DDP's default hook does). "chained" returns a `.then()` of the collective's future
    that holds its one tensor (DDP takes a future of a single tensor; the collective's own
    future holds a list), so DDP's wait covers the collective; "unchained" returns a future
    that is already complete (the bug), and keeps the work in `pending` so that the rank can
    wait for it before it leaves."""
    def chained(state, bucket):
        t = bucket.buffer().div_(world)
        return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])

    def unchained(state, bucket):
        t = bucket.buffer().div_(world)
        pending.append(dist.all_reduce(t, async_op=True))
        done = torch.futures.Future()
        done.set_result(t)
        return done

    return {"chained": chained, "unchained": unchained}


def _ddp_hook_rank(hook, steps, seed, lr):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..monitor import compare_replicas

    rank, world = dist.get_rank(), dist.get_world_size()

    def net():
        torch.manual_seed(seed)  # the same start on every rank (DDP would broadcast it anyway)
        return torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(),
                                   torch.nn.Linear(256, 1))

    model, ref = net(), net()
    check = dist.new_group(backend="gloo")  # the reference and the checks: not DDP's group
    pending: list = []
    ddp = DDP(model)
    ddp.register_comm_hook(None, _hooks(world, pending)[hook])
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    data = torch.Generator().manual_seed(seed * 1000 + rank)  # each rank its own examples
    # One fixed held-out batch, the same on every rank: the loss before and after training is
    # measured on it, not on the changing training batches.
    held = torch.randn(512, 32, generator=torch.Generator().manual_seed(seed + 7919))

    def held_out_loss() -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(held), held.sum(1, keepdim=True)))

    before = held_out_loss()
    rows = []
    try:
        for _ in range(steps):
            x = torch.randn(64, 32, generator=data)
            y = x.sum(1, keepdim=True)
            # The reference: this rank's own gradient, and the true average over the ranks.
            ref.load_state_dict(model.state_dict())
            ref.zero_grad()
            torch.nn.functional.mse_loss(ref(x), y).backward()
            own = torch.cat([p.grad.flatten() for p in ref.parameters()])
            mean = own.clone()
            dist.all_reduce(mean, group=check)
            mean /= world
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            got = torch.cat([p.grad.flatten() for p in model.parameters()])
            opt.step()
            # DDP used this rank's own gradient / world, unreduced: counted only where that
            # differs from the true average (a zero gradient, say, is both)
            local = own / world
            distinct = ~torch.isclose(local, mean, rtol=1e-5, atol=0)
            rows.append({
                "error": float((got - mean).abs().max() / mean.abs().max()),
                "unreduced": int((torch.isclose(got, local, rtol=1e-5, atol=0) & distinct).sum()),
                "distinct": int(distinct.sum()),
                "differ": len(compare_replicas(model, group=check)),
            })
    finally:
        for work in pending:  # leave no collective in flight behind
            work.wait(datetime.timedelta(seconds=30))
    return {"rows": rows, "loss_first": before, "loss_last": held_out_loss()}


def ddp_hook_race(hook: str, *, workers: int = 4, steps: int = 20, seed: int = 0,
                  lr: float = 0.01, cluster=None, nic: str | None = None,
                  timeout: float = 60) -> dict:
    """Train a small MLP with unmodified DDP and the communication hook `hook` ("chained" or
    "unchained", see `_hooks`) for `steps` steps on `workers` ranks, each on its own random
    examples, and check every step against a reference computed on a separate group.

    Returns {"hook", "workers", "steps", "wrong_steps": rank-steps whose gradient differs
    from the true average by more than 1e-5 of its largest element, "unreduced": over those
    wrong rank-steps, the fraction of gradient elements equal to the rank's own gradient /
    workers, among the elements where that differs from the true average, "max_error",
    "differ_steps": steps after which some rank's parameters differ from rank 0's (the
    `monitor.compare_replicas` checksum), "loss_first", "loss_last": rank 0's loss on a fixed
    held-out batch of 512 examples before and after training}.
    """
    if hook not in HOOKS:
        raise ValueError(f"hook must be one of {HOOKS}, not {hook!r}")
    if workers < 2 or steps < 1:
        raise ValueError(f"need workers >= 2 and steps >= 1 (got workers={workers}, "
                         f"steps={steps})")
    with use_or_open(cluster, ranks=workers, ddp=True,
                     nodes=workers, nic=nic, timeout=timeout) as cl:
        out = cl.run(_ddp_hook_rank, hook, steps, seed, lr)
    cells = [r for rank in out for r in rank["rows"]]
    wrong = [c for c in cells if c["error"] > 1e-5]
    return {
        "hook": hook, "workers": len(out), "steps": steps,
        "wrong_steps": len(wrong),
        "rank_steps": len(cells),
        "unreduced": sum(c["unreduced"] for c in wrong) / max(1, sum(c["distinct"] for c in wrong)),
        "max_error": max(c["error"] for c in cells),
        "differ_steps": sum(r["differ"] > 0 for r in out[0]["rows"]),
        "loss_first": out[0]["loss_first"], "loss_last": out[0]["loss_last"],
    }
