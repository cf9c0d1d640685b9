"""Sharding and model parallelism, measured through the emulated network (notebook 10).

Every function here starts real ranks (`clusterlab.Cluster`), trains or runs real layers
through the "netem" backend, and returns plain data next to the closed forms of
`clusterlab.parallelism`:

* `sharded_traffic` - bytes each rank sends per step for DDP (torch's DDP), ZeRO-1 and
  ZeRO-2 (written out below, a dozen lines each), ZeRO-3 as torch's FSDP2 (`fully_shard`)
  and FSDP2 without resharding, counted by the backend (`backend.traffic`);
* `step_time_sweep` - step time of DDP, FSDP2 and Megatron-style tensor parallelism as the
  network's latency or bandwidth changes;
* `fsdp_prefetch` - FSDP2's forward with and without prefetching the next all-gather;
* `pipeline` - GPipe and 1F1B with real send/recv of activations between stage processes
  (`pipeline_growth`: what a rougher network added to each, measured and replayed);
* `moe_alltoall`, `alltoall_growth` - a mixture of experts' dispatch and combine
  all-to-alls with a hot expert, and an all-to-all's time against N under jitter.

Compute: real layers compute real values, but most of a layer's time is a sleep standing
for an accelerator (as in `experiments.ddp`), so 2-8 ranks on a 2-core laptop keep clean
timelines and compute time is a parameter. The network's timing is emulated; the processes,
bytes and calls are real.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import parallelism as par
from ..cluster import Cluster
from ..netem import Netem
from ..wire import wire_beta
from .common import first_ranks, release
from .ddp import _accelerator_fn, layer_stack

# Ranks leave an all-reduce on a jittery network up to a few jitters apart; the all-to-all
# timings start every rank at one agreed instant this far ahead, as `clusterlab.doctor` does.
GO_MARGIN_NS = 60_000_000
SHARDED = ("ddp", "zero1", "zero2", "zero3", "fsdp_no_reshard")
# What each measured strategy's traffic is predicted by (parallelism.sharded_traffic).
CLOSED_FORM = {"ddp": ("ddp", True), "zero1": ("zero1", True), "zero2": ("zero2", True),
               "zero3": ("zero3", True), "fsdp_no_reshard": ("fsdp", False)}


def preload() -> None:
    """Import FSDP2, DTensor and DDP in this process before ranks fork (they inherit them),
    and silence torch 2.13's notice that all_gather_into_tensor and reduce_scatter_tensor
    have new names (FSDP2 itself still calls the old ones, on every rank, every step)."""
    import warnings

    from .common import preload_ddp

    warnings.filterwarnings("ignore", message=r".*is deprecated\. Please use `torch\.distributed",
                            category=FutureWarning)

    preload_ddp()
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.tensor  # noqa: F401


def _network(nic) -> tuple[float, float]:
    """(alpha, beta) of a NIC spec: its delay and its wire seconds per byte."""
    spec = nic if isinstance(nic, Netem) else Netem.parse(nic)
    return spec.delay_ns / 1e9, wire_beta(spec.rate_bps)


# --- on every rank ----------------------------------------------------------------------------


def _layers(width: int, depth: int, forward_s: float, backward_s: float):
    """depth x (Linear(width, width), ReLU, accelerator sleep), identical on every rank."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(*layer_stack(width, depth, forward_s, backward_s))


def _train(strategy: str, *, width: int, depth: int, steps: int, batch: int,
           forward_s: float = 0.0, backward_s: float = 0.0, prefetch: bool = False) -> dict:
    """`steps` SGD steps of one strategy; per step: duration (s) and this rank's traffic."""
    import torch
    import torch.distributed as dist

    from .. import backend, clock

    rank, world = dist.get_rank(), dist.get_world_size()
    model = _layers(width, depth, forward_s, backward_s)
    params = list(model.parameters())
    lr = 0.05
    if strategy == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif strategy in ("zero3", "fsdp_no_reshard"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        reshard = strategy == "zero3"
        for layer in model:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        if prefetch:
            # The next layer's all-gather starts as this layer starts, and runs while it
            # computes. (FSDP2's own set_modules_to_forward_prefetch issues it synchronously
            # unless the group's unshard_async_op is set: on a GPU that only queues it on a
            # side stream, but on CPU it would block.)
            def prefetch_next(module, args, following):
                following.unshard(async_op=True)  # its pre-forward waits for it

            for a, b in zip(model[:-1], model[1:]):
                a.register_forward_pre_hook(functools.partial(prefetch_next, following=b))
        params = list(model.parameters())
    elif strategy not in ("zero1", "zero2"):
        raise ValueError(f"strategy must be one of {', '.join(SHARDED)}, got {strategy!r}")
    shard = [p.detach().reshape(-1).chunk(world)[rank].clone() for p in params]  # ZeRO-1/2
    pending = []
    if strategy == "zero2":  # each gradient is reduce-scattered as soon as backward made it
        def reduce_now(p, i):
            out = torch.empty_like(shard[i])
            pending.append((i, out, dist.reduce_scatter_tensor(
                out, p.grad.reshape(-1), op=dist.ReduceOp.AVG, async_op=True)))
            p.grad = None  # ZeRO-2 keeps only its shard of the gradient

        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: reduce_now(p, i))
    gen = torch.Generator().manual_seed(1 + rank)
    out = []
    for _ in range(steps):
        x = torch.randn(batch, width, generator=gen)
        dist.barrier()
        backend.traffic(reset=True)
        t0 = clock.now()
        loss = model(x).square().mean()
        forward_end = clock.now()
        loss.backward()
        if strategy in ("zero1", "zero2"):
            if strategy == "zero1":  # one reduce-scatter per gradient after the backward
                for i, p in enumerate(params):
                    g = torch.empty_like(shard[i])
                    dist.reduce_scatter_tensor(g, p.grad.reshape(-1), op=dist.ReduceOp.AVG)
                    pending.append((i, g, None))
            works = []
            for i, g, work in pending:
                if work is not None:
                    work.wait()
                shard[i] -= lr * g  # the optimizer updates this rank's shard only
                works.append(dist.all_gather_into_tensor(
                    params[i].data.reshape(-1), shard[i], async_op=True))
            for w in works:
                w.wait()
            pending.clear()
            for p in params:
                p.grad = None
        else:
            with torch.no_grad():
                for p in params:
                    p -= lr * p.grad
                    p.grad = None
        t1 = clock.now()
        out.append({"step_s": t1 - t0, "forward_s": forward_end - t0,
                    "traffic": backend.traffic()})
    n_params = sum(p.numel() for p in _layers(width, depth, 0, 0).parameters())
    return {"steps": out, "params": n_params}


# --- tensor parallel (Megatron-style MLP) -----------------------------------------------------


def _tp_step(*, width: int, layers: int, batch: int, steps: int, compute_s: float,
             mode: str) -> dict:
    """Megatron MLP blocks (column-split Linear, ReLU, row-split Linear) with `mode="tp"`:
    one all-reduce of the block's output in forward (g) and one of its input gradient in
    backward (f); `mode="dp"`: the full blocks on 1/N of the batch, then one all-reduce of
    all gradients. compute_s: the whole step's compute on one rank without parallelism."""
    import torch
    import torch.distributed as dist

    from .. import backend, clock

    rank, world = dist.get_rank(), dist.get_world_size()
    accelerator = _accelerator_fn()
    hidden = 4 * width
    per_layer = compute_s / world / layers  # either way each rank does 1/N of the work

    class AllReduceForward(torch.autograd.Function):  # Megatron's g
        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            dist.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad

    class AllReduceBackward(torch.autograd.Function):  # Megatron's f
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    torch.manual_seed(0)
    full = [(torch.randn(hidden, width) / width**0.5, torch.randn(width, hidden) / hidden**0.5)
            for _ in range(layers)]
    if mode == "tp":  # rank r holds rows r of the first matrix, columns r of the second
        weights = [(a.chunk(world, 0)[rank].clone(), b.chunk(world, 1)[rank].clone())
                   for a, b in full]
    elif mode == "dp":
        weights = [(a.clone(), b.clone()) for a, b in full]
    else:
        raise ValueError(f"mode must be 'tp' or 'dp', got {mode!r}")
    weights = [(a.requires_grad_(), b.requires_grad_()) for a, b in weights]
    gen = torch.Generator().manual_seed(7)
    out = []
    check = None
    for step in range(steps):
        x = torch.randn(batch, width, generator=gen)
        if mode == "dp":
            x = x.chunk(world)[rank]
        x.requires_grad_()  # as if a layer below needed its gradient: f's all-reduce runs
        dist.barrier()
        backend.traffic(reset=True)
        t0 = clock.now()
        h = x
        for a, b in weights:
            if mode == "tp":
                h = AllReduceBackward.apply(h)  # (the input's gradient, for the layer below)
            y = accelerator.apply(torch.relu(h @ a.t()) @ b.t(), per_layer / 3,
                                  2 * per_layer / 3)
            h = AllReduceForward.apply(y) if mode == "tp" else y
        h.square().mean().backward()
        if mode == "dp":
            grads = torch.cat([p.grad.reshape(-1) for ab in weights for p in ab])
            dist.all_reduce(grads)
        t1 = clock.now()
        if step == 0 and mode == "tp":  # the split blocks compute the unsplit ones' output
            with torch.no_grad():
                ref = x.detach()
                for a, b in full:
                    ref = torch.relu(ref @ a.t()) @ b.t()
            check = float((h.detach() - ref).abs().max())
        for ab in weights:
            for p in ab:
                p.grad = None
        out.append({"step_s": t1 - t0, "traffic": backend.traffic()})
    return {"steps": out, "max_error_vs_unsplit": check}


# --- pipeline parallel ------------------------------------------------------------------------


def _pipeline_step(*, schedule: str, microbatches: int, width: int, rows: int,
                   forward_s: float, backward_s: float, steps: int) -> dict:
    """One Linear stage per rank; micro-batches' activations go forward by isend/irecv to the
    next stage, their gradients back to the previous one, in `parallelism.pipeline_order`."""
    import torch
    import torch.distributed as dist

    from .. import backend, clock

    stage, p = dist.get_rank(), dist.get_world_size()
    accelerator = _accelerator_fn()
    torch.manual_seed(stage)
    layer = torch.nn.Linear(width, width)
    order = par.pipeline_order(schedule, p, microbatches, stage)
    gen = torch.Generator().manual_seed(3)
    runs = []
    for _ in range(steps):
        data = torch.randn(microbatches, rows, width, generator=gen)
        inputs, outputs, sends = {}, {}, []
        ops = []
        dist.barrier()
        backend.traffic(reset=True)
        t0 = clock.now()
        for kind, j in order:
            if kind == "F":
                if stage == 0:
                    x = data[j].requires_grad_()
                else:
                    x = torch.empty(rows, width)
                    dist.recv(x, stage - 1)
                    x.requires_grad_()
                start = clock.now()
                y = accelerator.apply(torch.relu(layer(x)), forward_s, 0.0)
                ops.append(("F", j, start - t0, clock.now() - t0))
                inputs[j], outputs[j] = x, y
                if stage < p - 1:
                    sends.append(dist.isend(y.detach().contiguous(), stage + 1))
            else:
                if stage == p - 1:
                    grad = torch.ones(rows, width) / (rows * width)
                else:
                    grad = torch.empty(rows, width)
                    dist.recv(grad, stage + 1)
                start = clock.now()
                clock.sleep_until(int((start + backward_s) * 1e9 * clock.dilation()))
                outputs[j].backward(grad)
                ops.append(("B", j, start - t0, clock.now() - t0))
                if stage > 0:
                    sends.append(dist.isend(inputs[j].grad.contiguous(), stage - 1))
                del inputs[j], outputs[j]
        for w in sends:
            w.wait()
        runs.append({"ops": ops, "end": clock.now() - t0, "traffic": backend.traffic()})
    return {"runs": runs}


# --- mixture of experts -----------------------------------------------------------------------


def _moe_step(*, tokens: int, hidden: int, hot_share: float, expert_s_per_token: float,
              repeats: int) -> dict:
    """Top-1 routing to one expert per rank, `hot_share` of every rank's tokens to the last
    rank's expert: dispatch all-to-all (uneven splits), expert compute (a sleep per token),
    combine all-to-all back. Times and this rank's traffic per repeat.

    The hot expert sits on the last rank because the backend's replay sends a rank's
    all-to-all messages in rank order through its NIC's FIFO: the hot rank's then leave last,
    as they would finish last when TCP shares the NIC fairly among the flows."""
    import torch
    import torch.distributed as dist

    from .. import backend, clock

    rank, n = dist.get_rank(), dist.get_world_size()
    hot = round(hot_share * tokens)
    rest = tokens - hot
    send = [rest // (n - 1) + (1 if i < rest % (n - 1) else 0) for i in range(n - 1)] + [hot]
    counts = torch.tensor(send)
    table = [torch.zeros(n, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(table, counts)
    recv = [int(table[j][rank]) for j in range(n)]
    x = torch.randn(tokens, hidden)
    out = []
    for _ in range(repeats):
        dist.barrier()
        backend.traffic(reset=True)
        t0 = clock.now()
        got = torch.empty(sum(recv), hidden)
        dist.all_to_all_single(got, x, recv, send)
        t1 = clock.now()
        clock.sleep_until(int((t1 + expert_s_per_token * len(got)) * 1e9 * clock.dilation()))
        y = torch.tanh(got)  # the expert
        t2 = clock.now()
        back = torch.empty(tokens, hidden)
        dist.all_to_all_single(back, y, send, recv)
        t3 = clock.now()
        out.append({"dispatch_s": t1 - t0, "expert_s": t2 - t1, "combine_s": t3 - t2,
                    "step_s": t3 - t0, "traffic": backend.traffic()})
    return {"repeats": out, "received_tokens": sum(recv)}


def _alltoall_spans(ranks_list, *, nbytes: int, repeats: int) -> dict:
    """(entry, exit) of `repeats` all_to_all_single on the first n ranks, for each n."""
    import torch
    import torch.distributed as dist

    from .. import clock

    out = {}
    for n in ranks_list:
        group, members = first_ranks(n)
        if group is False:
            continue
        x = torch.zeros(n, max(1, nbytes // 4))
        y = torch.empty_like(x)
        dist.all_to_all_single(y, x, group=group)  # warm-up
        spans = []
        for _ in range(repeats):
            go = torch.tensor([clock.monotonic_ns() + int(GO_MARGIN_NS * clock.dilation())])
            dist.all_reduce(go, op=dist.ReduceOp.MAX, group=group)
            clock.sleep_until(int(go), spin_ns=200_000)  # every rank enters at one instant
            t0 = clock.now()
            dist.all_to_all_single(y, x, group=group)
            spans.append((t0, clock.now()))
        out[n] = spans
        release(group)
    return out


# --- in the notebook's process ----------------------------------------------------------------


def _fastest_step(per_rank: list[dict], key: str = "step_s", skip: int = 1) -> float:
    """The fastest step (after `skip` warm-up steps) of the slowest rank. On a network
    without jitter every step costs the same, and load on this shared machine only ever
    adds time: the fastest step is the best estimate of what the network and the code cost
    (a median would carry whatever else the machine was doing)."""
    return min(_slowest_rank_steps(per_rank, key, skip))


def _slowest_rank_steps(per_rank: list[dict], key: str = "step_s", skip: int = 1) -> list[float]:
    steps = len(per_rank[0]["steps"])
    return [max(r["steps"][k][key] for r in per_rank) for k in range(skip, steps)]


def _step_spread(per_rank: list[dict], key: str = "step_s", skip: int = 1) -> float:
    """The median step minus the fastest (slowest rank, after `skip` warm-up steps): how
    much this run's own steps scatter on a network without jitter, i.e. this machine's
    noise. A difference between two runs' fastest steps is only trusted to about it."""
    steps = _slowest_rank_steps(per_rank, key, skip)
    return float(np.median(steps)) - min(steps)


def sharded_traffic(*, ranks: int = 4, width: int = 64, depth: int = 3,
                    nic: str = "delay 1ms", steps: int = 2, timeout: float = 120) -> dict:
    """Bytes each rank sends in one training step (the last of `steps`) for every strategy
    of SHARDED, counted by the backend, with the closed form of each.

    Returns {strategy: {"sent": [per rank], "by_kind": rank 0's {kind: bytes},
    "predicted": closed-form total, "predicted_by_kind": ...}}, plus "params"."""
    preload()
    out = {}
    with Cluster(nodes=ranks, nic=nic, timeout=timeout) as cl:
        for strategy in SHARDED:
            res = cl.run(_train, strategy, width=width, depth=depth, steps=steps, batch=8)
            params = res[0]["params"]
            last = [r["steps"][-1]["traffic"] for r in res]
            name, reshard = CLOSED_FORM[strategy]
            predicted = par.sharded_traffic(name, params=params, ranks=ranks,
                                            reshard_after_forward=reshard)
            out[strategy] = {
                "sent": [t["total"]["sent"] for t in last],
                "received": [t["total"]["received"] for t in last],
                "by_kind": {k: v["sent"] for k, v in last[0].items() if k != "total"},
                "ops": last[0]["total"]["ops"],
                "predicted": predicted["total"],
                "predicted_by_kind": {k: v for k, v in predicted.items() if k != "total"},
            }
    out["params"] = params
    out["ranks"] = ranks
    return out


def step_time_sweep(nics, *, ranks: int = 2, width: int = 128, depth: int = 3,
                    tp_width: int = 64, tp_layers: int = 4, tp_batch: int = 32,
                    tp_compute_s: float = 0.004, steps: int = 6, dilation: float = 1.0,
                    parts=("sharded", "tp"), timeout: float = 120) -> list[dict]:
    """For each NIC spec: the fastest step (slowest rank, after a warm-up step) of DDP
    and FSDP2 (`zero3`) on `depth` layers of `width` (part "sharded"), and of tensor- vs
    data-parallel MLP blocks (part "tp": `tp_layers` blocks of width `tp_width`, hidden 4x,
    a batch of `tp_batch` rows). `parts` names which to run; the rows hold only their keys.

    Predictions: the closed-form communication time of each (`parallelism`), added to what
    the first NIC's run measured beyond its own closed form (the compute, Python and this
    machine's costs, which no network formula knows): predicted(nic) = measured(first) +
    comm(nic) - comm(first). The first NIC is the reference; the others test the formulas.
    `dilation` runs the cluster k times slower (times in emulated time): this machine's own
    costs shrink k-fold against the network's (the accelerator's sleeps too, which cancel in
    the comparison)."""
    nics = list(nics)
    if not nics:
        raise ValueError("nics must name at least one network (the first is the reference)")
    parts = tuple(parts)
    if not parts or set(parts) - {"sharded", "tp"}:
        raise ValueError(f"parts must be a non-empty subset of ('sharded', 'tp'), got {parts!r}")
    preload()
    rows = []
    for nic in nics:
        alpha, beta = _network(nic)
        row = {"nic": str(nic), "alpha": alpha, "beta": beta, "steps": steps - 1}
        with Cluster(nodes=ranks, nic=nic, timeout=timeout, dilation=dilation) as cl:
            if "sharded" in parts:
                ddp = cl.run(_train, "ddp", width=width, depth=depth, steps=steps, batch=8)
                fsdp = cl.run(_train, "zero3", width=width, depth=depth, steps=steps, batch=8)
            if "tp" in parts:
                tp = cl.run(_tp_step, width=tp_width, layers=tp_layers, batch=tp_batch,
                            steps=steps, compute_s=tp_compute_s, mode="tp")
                dp = cl.run(_tp_step, width=tp_width, layers=tp_layers, batch=tp_batch,
                            steps=steps, compute_s=tp_compute_s, mode="dp")
        if "sharded" in parts:
            params = ddp[0]["params"]
            row.update({
                "params": params, "ddp_s": _fastest_step(ddp), "fsdp_s": _fastest_step(fsdp),
                "ddp_spread_s": _step_spread(ddp), "fsdp_spread_s": _step_spread(fsdp),
                "ddp_comm_s": par.sharded_comm_seconds("ddp", params=params, ranks=ranks,
                                                       alpha=alpha, beta=beta),
                "fsdp_comm_s": par.sharded_comm_seconds("zero3", params=params, ranks=ranks,
                                                        alpha=alpha, beta=beta, units=depth),
                "ddp_sent": ddp[0]["steps"][-1]["traffic"]["total"]["sent"],
                "fsdp_sent": fsdp[0]["steps"][-1]["traffic"]["total"]["sent"],
            })
        if "tp" in parts:
            act = tp_batch * tp_width * 4
            tp_params = tp_layers * 2 * 4 * tp_width * tp_width
            row.update({
                "tp_params": tp_params, "activation_bytes": act,
                "tp_s": _fastest_step(tp), "tp_dp_s": _fastest_step(dp),
                "tp_spread_s": _step_spread(tp), "tp_dp_spread_s": _step_spread(dp),
                # Each block here is one MLP (column- then row-split): one all-reduce
                # forward (g) and one backward (f); a transformer layer has two such blocks.
                "tp_comm_s": par.tp_comm_seconds(layers=tp_layers, ranks=ranks,
                                                 activation_bytes=act, alpha=alpha, beta=beta,
                                                 blocks_per_layer=1),
                "tp_dp_comm_s": par.sharded_comm_seconds("ddp", params=tp_params, ranks=ranks,
                                                         alpha=alpha, beta=beta),
                "tp_max_error": max(r["max_error_vs_unsplit"] for r in tp),
                "tp_allreduces": tp[0]["steps"][-1]["traffic"]["allreduce"]["ops"],
                "dp_allreduces": dp[0]["steps"][-1]["traffic"]["allreduce"]["ops"],
                "tp_sent": tp[0]["steps"][-1]["traffic"]["total"]["sent"],
                "tp_dp_sent": dp[0]["steps"][-1]["traffic"]["total"]["sent"],
            })
        rows.append(row)
    base = rows[0]
    kinds = (("ddp", "fsdp") if "sharded" in parts else ()) + (
        ("tp", "tp_dp") if "tp" in parts else ())
    for row in rows:
        for kind in kinds:
            row[f"{kind}_predicted_s"] = (base[f"{kind}_s"] + row[f"{kind}_comm_s"]
                                          - base[f"{kind}_comm_s"])
    return rows


def fsdp_prefetch(*, ranks: int = 2, nic: str = "delay 8ms", width: int = 64, depth: int = 6,
                  layer_s: float = 0.008, steps: int = 7, timeout: float = 120) -> dict:
    """FSDP2's forward time with and without prefetching the next layer's all-gather
    (`FSDPModule.unshard(async_op=True)` as a layer starts): without it each layer waits for
    its own all-gather, which is what a CPU process gets (on a GPU, FSDP2's default already
    overlaps it, see `parallelism.fsdp_forward_seconds`); with it the next layer's
    all-gather travels while this layer computes. Only the forward is timed (the backward
    computes nothing). Returns the fastest forward of each (see `_fastest_step`) and the two
    closed forms (`parallelism.fsdp_forward_seconds`)."""
    preload()
    alpha, beta = _network(nic)
    with Cluster(nodes=ranks, nic=nic, timeout=timeout) as cl:
        res = {mode: cl.run(_train, "zero3", width=width, depth=depth, steps=steps, batch=8,
                            forward_s=layer_s, backward_s=0.0, prefetch=mode)
               for mode in (False, True)}
    params_per_layer = width * width + width
    gather = par.models.ring_allgather(ranks, params_per_layer * 4, alpha, beta)

    return {
        "forward_s": _fastest_step(res[False], "forward_s"),
        "forward_prefetch_s": _fastest_step(res[True], "forward_s"),
        "predicted_s": par.fsdp_forward_seconds(layers=depth, gather_s=gather,
                                                compute_s=layer_s, prefetch=False),
        "predicted_prefetch_s": par.fsdp_forward_seconds(layers=depth, gather_s=gather,
                                                         compute_s=layer_s, prefetch=True),
        "gather_s": gather, "layer_s": layer_s, "depth": depth, "steps": steps - 1,
    }


def pipeline(nics, *, stages: int = 4, microbatches: int = 8, forward_s: float = 0.015,
             backward_s: float = 0.030, width: int = 64, rows: int = 16, steps: int = 4,
             timeout: float = 120) -> list[dict]:
    """GPipe and 1F1B on `stages` processes for each NIC spec: measured step time and bubble
    (idle share of the step, averaged over stages) against `parallelism.bubble_fraction`
    and the replay `parallelism.simulate_pipeline` on the same network. Of `steps` steps,
    after the first (a warm-up), the fastest is kept: load on this shared machine only adds
    time (see `_fastest_step`); "steps_kept_of" says of how many it was the fastest."""
    out = []
    act = rows * width * 4
    for nic in nics:
        with Cluster(nodes=stages, nic=nic, timeout=timeout) as cl:
            for schedule in par.PIPELINE_SCHEDULES:
                res = cl.run(_pipeline_step, schedule=schedule, microbatches=microbatches,
                             width=width, rows=rows, forward_s=forward_s,
                             backward_s=backward_s, steps=steps)
                candidates = range(1, steps) if steps > 1 else range(steps)
                best = min(candidates, key=lambda k, res=res: max(r["runs"][k]["end"]
                                                                    for r in res))
                run = [r["runs"][best] for r in res]
                step = max(r["end"] for r in run)
                busy = sum(e - s for r in run for _, _, s, e in r["ops"]) / stages
                # The replay gets the operations' durations as measured (a sleep wakes up
                # late on a busy machine), so that it differs from the run by the network
                # and by the machine's cost of messages only.
                took = {k: float(np.mean([e - s for r in run for kind, _, s, e in r["ops"]
                                          if kind == k])) for k in ("F", "B")}
                sim = par.simulate_pipeline(schedule, stages=stages,
                                            microbatches=microbatches, forward_s=took["F"],
                                            backward_s=took["B"], nic=nic,
                                            activation_bytes=act)
                out.append({
                    "nic": str(nic), "schedule": schedule, "step_s": step,
                    "bubble": 1 - busy / step, "simulated_step_s": sim.step_s,
                    "simulated_bubble": sim.bubble,
                    "bubble_formula": par.bubble_fraction(stages, microbatches),
                    "ideal_step_s": par.pipeline_step_seconds(
                        stages=stages, microbatches=microbatches, forward_s=forward_s,
                        backward_s=backward_s),
                    "ops": [r["ops"] for r in run], "forward_took_s": took["F"],
                    "backward_took_s": took["B"],
                    "p2p_sent": [r["traffic"].get("p2p", {}).get("sent", 0) for r in run],
                    "activation_bytes": act, "steps_kept_of": len(candidates),
                    # every kept step's time (slowest rank), for a comparison step by step
                    "step_samples_s": [max(r["runs"][k]["end"] for r in res)
                                       for k in candidates],
                })
    return out


def pipeline_growth(rows: list[dict], calm: str, rough: str, *, groups: int = 20) -> dict:
    """How much each schedule's step grew from the `calm` network to the `rough` one, from
    `pipeline`'s rows: {schedule: {"measured": array, "replay": array}} (seconds).

    Measured: every kept step on the rough network minus the calm network's fastest step
    (without jitter every step costs the same; load on this machine only adds time).
    Replayed: `simulate_pipeline` with the run's measured operation times, one jitter draw
    per replayed step, `groups` x as many draws as steps were kept, minus the calm replay.
    A measured value inside the replay's range agrees with the link model; below its lowest
    draw the run does not measure the growth's size (machine overhead on the calm network
    can hide behind the rough network's waits); above it, load cannot be told from the
    network."""
    runs = {(r["nic"], r["schedule"]): r for r in rows}
    out = {}
    for schedule in par.PIPELINE_SCHEDULES:
        c, r = runs[(calm, schedule)], runs[(rough, schedule)]

        def replay(row, seed, schedule=schedule):
            return par.simulate_pipeline(
                schedule, stages=len(row["ops"]), microbatches=len(row["ops"][0]) // 2,
                forward_s=row["forward_took_s"], backward_s=row["backward_took_s"],
                nic=row["nic"], activation_bytes=row["activation_bytes"], seed=seed).step_s

        draws = groups * r["steps_kept_of"]
        base = replay(c, 0)
        out[schedule] = {
            "measured": np.array(r["step_samples_s"]) - c["step_s"],
            "replay": np.array([replay(r, k) for k in range(draws)]) - base,
        }
    return out


def moe_alltoall(*, ranks: int = 4, nic: str = "delay 2ms rate 40mbit", tokens: int = 96,
                 hidden: int = 256, hot_shares=(0.25, 0.5, 0.75),
                 expert_s_per_token: float = 0.0001, repeats: int = 3,
                 timeout: float = 120) -> list[dict]:
    """Dispatch, expert and combine times of one MoE layer as the hot expert's share grows,
    with each rank's all-to-all bytes counted by the backend and `parallelism.moe_traffic`."""
    out = []
    alpha, beta = _network(nic)
    with Cluster(nodes=ranks, nic=nic, timeout=timeout) as cl:
        for h in hot_shares:
            res = cl.run(_moe_step, tokens=tokens, hidden=hidden, hot_share=h,
                         expert_s_per_token=expert_s_per_token, repeats=repeats)
            reps = range(1, repeats) if repeats > 1 else range(repeats)

            def fastest(key, res=res, reps=reps):  # see _fastest_step
                return min(max(r["repeats"][k][key] for r in res) for k in reps)

            # One repeat's phases, on the hot rank's own clock: dispatch, expert and combine
            # follow each other there, so they add up to its step. (Stacking each phase's
            # maximum over ranks would count the hot expert twice: the other ranks' combine
            # already contains their wait for it.) The repeat is the one whose slowest rank
            # was fastest, as for the other times (see _fastest_step).
            best = min(reps, key=lambda k, res=res: max(r["repeats"][k]["step_s"] for r in res))
            hot_rank = res[-1]["repeats"][best]
            sent = [r["repeats"][-1]["traffic"]["alltoall"]["sent"] for r in res]
            received = [r["repeats"][-1]["traffic"]["alltoall"]["received"] for r in res]
            hot = round(h * tokens) / tokens  # the share the ranks really routed
            pred = par.moe_traffic(tokens_per_rank=tokens, hidden=hidden, ranks=ranks,
                                   hot_share=hot)
            # The step waits for the busiest sender in the dispatch, the hot expert's
            # compute, and the hot rank's combine (it sends back all it received).
            dispatch = alpha + max(pred["sent_hot"], pred["sent_other"]) * beta
            combine = alpha + pred["received_hot"] * beta
            out.append({
                "hot_share": hot, "dispatch_s": fastest("dispatch_s"),
                "expert_s": fastest("expert_s"),
                "combine_s": fastest("combine_s"), "step_s": fastest("step_s"),
                "hot_phases": {k: hot_rank[k] for k in ("dispatch_s", "expert_s", "combine_s")},
                "hot_step_s": hot_rank["step_s"],
                "best_step_s": max(r["repeats"][best]["step_s"] for r in res),
                "sent": sent, "received": received, "predicted": pred,
                "repeats_kept_of": len(reps),
                "hot_tokens": res[-1]["received_tokens"],
                "predicted_dispatch_s": dispatch, "predicted_combine_s": combine,
                "predicted_expert_s": expert_s_per_token * res[-1]["received_tokens"],
                "predicted_step_s": dispatch + combine
                + expert_s_per_token * res[-1]["received_tokens"],
            })
    return out


def alltoall_growth(*, ranks=(2, 3, 4), nic: str = "delay 10ms 2ms distribution normal",
                    nbytes: int = 64, repeats: int = 12, dilation: float = 1.0,
                    timeout: float = 120) -> list[dict]:
    """An all-to-all of small messages on the first n ranks of one cluster, for each n,
    every rank entering at one agreed instant: from the first entry ("mean_s", which also
    counts a rank that woke up late) and from the last ("last_entry_mean_s", which misses the
    head start of the others) to the last exit, against the order statistics (the last of
    n(n-1) jittered messages) and the replay `parallelism.simulate_alltoall`.

    Up to 4 ranks: on 2 cores more ranks wake up milliseconds late and Gloo's own
    all-to-all costs tens of milliseconds. The replay takes N further. `dilation` runs the
    cluster k times slower (times in emulated time)."""
    from .. import timing

    spec = Netem.parse(nic)
    with Cluster(nodes=max(ranks), nic=nic, timeout=timeout, dilation=dilation) as cl:
        res = cl.run(_alltoall_spans, list(ranks), nbytes=nbytes, repeats=repeats)
    out = []
    for n in ranks:
        spans = [r[n] for r in res if n in r]
        measured = timing.durations(spans, since="first")  # entries agreed: see GO_MARGIN_NS
        after_last = timing.durations(spans, since="last")
        out.append({
            "ranks": n, "samples": len(measured), "mean_s": float(np.mean(measured)),
            "last_entry_mean_s": float(np.mean(after_last)),
            "std_s": float(np.std(measured, ddof=1)) if len(measured) > 1 else 0.0,
            "predicted_s": par.alltoall_seconds(
                ranks=n, delay_s=spec.delay_ns / 1e9, jitter_s=spec.jitter_ns / 1e9,
                distribution=spec.distribution or "uniform", last_rank=True),
            "simulated_s": float(par.simulate_alltoall(
                ranks=n, nic=nic, nbytes=nbytes, repeats=200).max(axis=1).mean()),
        })
    return out
