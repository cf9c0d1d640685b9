"""What `notebooks/08_silent_divergence.ipynb` reads from its runs.

The experiments are `clusterlab.experiments.divergence`; each function here turns one cell's
runs into the sentences, the table or the figure the learner reads, and checks what the text
claims. `fingerprint` and `odd_ranks` are the core replica check the notebook runs on Gloo.
"""

from __future__ import annotations

import numpy as np


def explain_changed(changed: dict, healthy: dict, *, steps: int) -> None:
    """Rank 2 changed its weights after wrapping: which ranks' fingerprints differ, how its gap
    to rank 0 stayed what it was, how far rank 0's loss and both replicas' losses on a fixed
    batch of training rows (the same on every rank, not held out) are from the healthy run's;
    asserts each of these."""
    from ..experiments import divergence

    dev = divergence.loss_deviation(changed, healthy)
    d2 = changed["distance"][:, 2]
    drift = np.max(np.abs(d2 / d2[0] - 1))
    ev0, ev2 = changed["eval_loss"][-1, 0], changed["eval_loss"][-1, 2]
    evh = healthy["eval_loss"][-1, 0]
    off = max(abs(ev0 - evh), abs(ev2 - evh)) / evh
    from . import show

    print(f"In short: rank 2 stays apart from rank 0 for all {steps} steps (largest weight "
          f"difference {d2[-1]:.1e}), while rank 0's loss stays within {dev:.2%} of a healthy "
          "run's: in this run the loss hides it, the replica fingerprints show it.")
    lines = [
        f"ranks whose fingerprint differs from rank 0's: {divergence.replicas_agree(changed)}",
        f"rank 2's gap to rank 0: {d2[0]:.6e} after step 0, {d2[-1]:.6e} after step "
        f"{steps - 1} (relative change <= {drift:.1e}: rounding only)",
        f"rank 0's loss, last 10 steps: {dev:.2%} off the healthy run's (one seeded run)",
        f"loss on a fixed batch of training rows (the same on every rank): rank 0's replica "
        f"{ev0:.5f}, rank 2's {ev2:.5f}, healthy run {evh:.5f} (both within {off:.1%} of it)"]
    if off < 0.05:
        lines.append("so evaluating either replica alone shows nothing wrong; which replica the "
                     "checkpoint holds is a real question")
    show.fold("The numbers: fingerprints, rank 2's gap, the losses", "\n".join(lines))
    assert divergence.replicas_agree(healthy) == [] and np.all(healthy["distance"] == 0)
    assert divergence.replicas_agree(changed) == [2]
    assert np.all(d2 > 0) and drift < 1e-4, "the gap stays what it was, up to rounding"
    assert dev < 0.05, "rank 0's loss stays within 5% of the healthy run"
    assert changed["eval_loss"][-1, 2] != changed["eval_loss"][-1, 0]


def explain_exponent_flip(expo: dict, healthy: dict) -> None:
    """An exponent bit (30) flipped before the all-reduce: the element before and after, the
    gradient-norm spike at step 10 on every rank and the normal norms after it, how many
    elements of the healthy run's averaged gradient could reach 1 (an illustration: the flip
    hits rank 2's own gradient, not that one), the replicas, the huge weight it left and
    the hidden unit it saturated; asserts each of these."""
    from ..experiments import divergence
    from . import show

    g, h = expo["grad_norm"][:, 0], healthy["grad_norm"][:, 0]
    was, now = expo["injected"]
    sat = divergence.hidden_saturation(expo)  # that weight's hidden unit, over the inputs
    if divergence.replicas_agree(expo) == [] and expo["finite"].all():
        print(f"In short: one flipped exponent bit left every replica identical and finite, "
              f"yet hidden unit {sat['unit']} is saturated: its tanh slope is 0 on "
              f"{sat['zero_grad_share']:.0%} of the training inputs, so its input weights get "
              "no gradient.")
    big, big_h = np.abs(expo["params"][0]).max(), np.abs(healthy["params"][0]).max()
    where = int(np.argmax(np.abs(expo["params"][0])))  # flat index; 0 is model[0].weight[0, 0]
    lines = [
        f"the flipped gradient element: {was:.4f} before, {now:.2e} after",
        f"gradient norm after the sync at step 10: {g[10]:.1e}"
        + (" (its float32 sum of squares overflows)" if np.isinf(g[10]) else "")
        + f", the same on every rank: {np.all(expo['grad_norm'][10] == g[10])}",
        f"healthy run at step 10: {h[10]:.2f}, so at most {int(h[10] ** 2)} of its "
        f"{expo['params'].shape[1]} synchronised gradient elements can reach 1 in magnitude "
        "(an illustration: the flip hits rank 2's own gradient, before averaging, whose norm "
        "is usually larger)",
        f"gradient norm at steps 11-12: {', '.join(f'{x:.1e}' for x in g[11:13])} (healthy: "
        f"{', '.join(f'{x:.2f}' for x in h[11:13])})",
        f"replicas differing from rank 0 at the end: {divergence.replicas_agree(expo)}; "
        f"all weights finite: {bool(expo['finite'].all())}",
        f"largest |weight| at the end: {big:.1e} (healthy run: {big_h:.2f}), at flat index "
        f"{where}: the flipped element, first layer's weight[0, 0]",
        f"it feeds hidden unit {sat['unit']}: its tanh input |z| over the {sat['n']} training "
        f"inputs is at least {sat['min_abs_z']:.1e}",
        f"share of those inputs where 1 - tanh(z)^2 is exactly 0 in float32: "
        f"{sat['zero_grad_share']:.0%}"]
    show.fold("The evidence: the flipped element, the norm spike, the frozen unit",
              "\n".join(lines))
    assert 0 < abs(was) < 1 and abs(now) > 1e30, "a normal value below 1, times 2^128"
    assert g[10] > 1e20 * np.median(h) and np.all(expo["grad_norm"][10] == g[10])
    assert np.all(g[11:13] < 10 * h[11:13]), "steps 11-12: back to the healthy run's scale"
    assert divergence.replicas_agree(expo) == []
    assert big > 1e30 and big_h < 10 and where == 0
    assert sat["unit"] == 0 and sat["zero_grad_share"] == 1.0, "saturated on every input"



def explain_recreated(runs: dict) -> None:
    """A layer re-created after DDP wrapped the model (`divergence.recreated_layer`, keyed by
    `find_unused_parameters`): without it DDP raises at the second iteration; with it the run
    is silent while the new layer's replicas drift apart and the still-hooked first layer
    stays identical. DDP's error, in full, is folded. Asserts each of these."""
    from . import show

    strict, lenient = runs[False], runs[True]
    print(f"In short: without find_unused_parameters DDP raises in iteration "
          f"{strict['step'] + 1} (the first left the old layer without gradients); "
          f"with it the run is silent, and the re-created layer's replicas drift apart "
          f"(largest gap {lenient['last_gap']:.1e}) while the still-hooked first layer stays "
          f"identical (gap {lenient['first_gap']:g}).")
    show.fold("DDP's error without find_unused_parameters, in full", strict["message"])
    assert strict["step"] == 1 and "Expected to have finished reduction" in strict["message"]
    assert lenient["step"] is None and lenient["first_gap"] == 0 and lenient["last_gap"] > 0


def sampler_indices(*, dataset_size: int = 64, world: int = 2, count: int = 8,
                    seed: int = 0) -> None:
    """The first `count` indices `DistributedSampler` gives each of `world` ranks in epoch 0:
    with one seed for every rank, the shuffled order dealt out in turns (rank r takes every
    world-th index from position r); with seed + rank, each rank shuffles its own way, so the
    shards overlap (the indices both ranks drew among their first `count` are named). Asserts
    both."""
    import torch
    from torch.utils.data import DistributedSampler

    data = torch.arange(dataset_size)

    def shard(rank, rank_seed, replicas=world):
        return list(DistributedSampler(data, num_replicas=replicas, rank=rank, seed=rank_seed))

    order = shard(0, seed, replicas=1)  # the whole shuffled order every rank computes
    print(f"same seed on every rank: the shuffled order starts {order[:world * count]}")
    for r in range(world):
        mine = shard(r, seed)
        assert mine == order[r::world]
        print(f"    rank {r} takes positions {r}, {r + world}, {r + 2 * world}, ...: "
              f"{mine[:count]}")
    own = [shard(r, seed + r) for r in range(world)]
    both = sorted(set(own[0][:count]) & set(own[1][:count]))
    print("seed = rank: " + "; ".join(f"rank {r} {o[:count]}" for r, o in enumerate(own))
          + (f" (both drew {both})" if both else ""))
    assert set(own[0]) & set(own[1]), "per-rank seeds: the shards overlap"


# --- Detection ----------------------------------------------------------------------------------

def fingerprint(model):  # two int64 per tensor: sum of raw bits, and position-weighted sum
    """The replica fingerprint: for each parameter tensor, the sum of its raw float32 bits as
    integers (exact and order-independent) and a position-weighted sum (catches two swapped
    values). Equal on every rank exactly when the replicas are (up to checksum collisions)."""
    import torch

    out = []
    for p in model.parameters():  # float32 parameters: their bits as int32
        bits = p.detach().reshape(-1).view(torch.int32).to(torch.int64)
        pos = torch.arange(1, bits.numel() + 1, dtype=torch.int64, device=bits.device)
        out += [bits.sum(), (bits * pos).sum()]  # int64 wraps around: fine for a checksum
    return torch.stack(out)


def odd_ranks(model):  # ranks whose parameters differ from rank 0's
    """The ranks whose parameters differ from rank 0's: every rank all-gathers the others'
    fingerprints and compares (call it on every rank of an initialised process group)."""
    import torch
    import torch.distributed as dist

    fp = fingerprint(model)
    every = [torch.empty_like(fp) for _ in range(dist.get_world_size())]
    dist.all_gather(every, fp)
    return [r for r, f in enumerate(every) if not torch.equal(f, every[0])]


def first_check_at_or_after(step: int, every: int) -> int:
    """The first check step (every - 1, 2 * every - 1, ...) at or after `step`."""
    return step + (every - 1 - step) % every


def alert_sentence(d: dict) -> str:
    """One detection run's first alert: its kind, the ranks named, the step it is labelled
    with and the step at whose end it was delivered (or 'no alert'), after the scenario."""
    first = d["first"]
    where = ("no alert" if first is None
             else f"{first['kind']} on ranks {first['ranks']}, labelled step {first['step']}, "
                  f"delivered at the end of step {first['reported']}")
    injected = "" if d["scenario"] == "healthy" else f" (rank {d['rank']}, step {d['step']})"
    return f"{d['scenario'] + injected:32s} -> {where}"


def explain_detection(det: list, *, every: int, world: int) -> None:
    """Per scenario of `divergence.detection`, the first alert (`alert_sentence`), and the
    later alerts of the NaN run, which name every rank once the all-reduce spread the NaN;
    asserts silence on the healthy run, that every fault is named on its rank, labelled by
    the next check step and delivered one step later, and that the weight-change runs (all
    but the first and the last) alert again at every later check. The later alerts are
    folded."""
    from . import show

    faulty = [d for d in det if d["scenario"] != "healthy"]
    named = [d for d in faulty if d["first"] is not None and d["first"]["ranks"] == [d["rank"]]]
    print(f"In short: no alert on the healthy run; in {len(named)} of the {len(faulty)} faulty "
          "runs the first alert names the faulty rank, delivered one step after the next check."
          if det[0]["alerts"] == [] else "In short: the healthy run raised an alert.")
    for d in det:
        print(alert_sentence(d))
    assert det[0]["scenario"] == "healthy" and det[0]["alerts"] == [], "silent on a healthy run"
    for d in det[1:]:
        first = d["first"]
        check = first_check_at_or_after(d["step"], every)
        assert first is not None and first["ranks"] == [d["rank"]], d
        assert d["step"] <= first["step"] <= check and first["reported"] == check + 1, d
    last = max(a["reported"] for d in det for a in d["alerts"]) - 1  # the last check step
    for d in det[1:-1]:  # a weight change: the split persists
        labels = sorted({a["step"] for a in d["alerts"] if a["kind"] == d["first"]["kind"]})
        assert labels == list(range(d["first"]["step"], last + 1, every)), d
    nan_run = det[-1]
    later = [a for a in nan_run["alerts"] if a["reported"] > nan_run["first"]["reported"]]
    later_ranks = sorted({r for a in later for r in a["ranks"]})
    delivered_at = sorted({a["reported"] for a in later})  # several alerts can share a step
    show.fold("The later alerts", "\n".join([
        f"the weight-change runs alert again at every later check, up to step {last}: a split "
        "persists",
        f"later checks in the NaN run deliver {len(later)} more alert(s), on ranks {later_ranks}"
        + (": the all-reduce spread the NaN to every rank, so only the first alert names the "
           "source" if later_ranks == list(range(world)) else ""),
        f"they arrive at the ends of {len(delivered_at)} step(s), {delivered_at}: several "
        "alerts can arrive at the end of one step"]))


# --- A model that stops learning ----------------------------------------------------------------

def stall_row(name: str, run: dict, *, steps: int) -> str:
    """One row of the stall table: the loss on a fixed batch of training rows after the first
    and after the last step, median gradient norm, median lr applied (|dw|/|g|: ||update|| /
    ||gradient||), the steps after the first that changed rank 0's weights (its checksum
    moved), alerts."""
    ev, fp = run["eval_loss"][:, 0], run["fingerprint"][:, 0]
    moved = int(np.any(fp[1:] != fp[:-1], axis=1).sum())
    applied = np.median(run["update_norm"][:, 0] / run["grad_norm"][:, 0])
    return (f"{name:19s} {f'{ev[0]:.3f} -> {ev[-1]:.3f}':>23s} {np.median(run['grad_norm']):9.2f} "
            f"{applied:20.1e} {f'{moved} of {steps - 1}':>21s} {len(run['alerts']):6d}")


def explain_stall(stall: dict, *, steps: int, lr: float, world: int, batch: int) -> None:
    """The table of the healthy, optimizer_detached and lr_divided runs (`stall_row`; the
    notebook defines its columns) and how much smaller lr_divided's first update is; asserts
    that both stalled runs look normal to a loss-and-sync dashboard (finite gradients as large
    as the healthy run's first, as in a run that has not begun to learn; agreeing replicas, no
    alert) while the applied lr and the checksum show them."""
    ok, detached, divided = stall["healthy"], stall["optimizer_detached"], stall["lr_divided"]
    g0 = ok["grad_norm"][0, 0]  # the healthy run's first gradient: same weights, same batch
    print("In short: the stalled runs barely lower the loss, yet their gradients are finite, "
          "their replicas agree and the monitor raises no alert; the lr actually applied, "
          "‖Δw‖/‖g‖, gives both away.")
    print(f"{'':19s} {f'loss after step 0 -> {steps - 1}':>23s} {'grad norm':>9s} "
          f"{'‖Δw‖/‖g‖ (SGD: = lr)':>20s} {'steps weights changed':>21s} {'alerts':>6s}")
    for name, run in stall.items():
        print(stall_row(name, run, steps=steps))
    shrink = divided["update_ratio"][0] / ok["update_ratio"][0]
    print(f"lr_divided's first update is {shrink.mean():.4f} of the healthy run's, "
          f"1 / (W x batch) = {1 / (world * batch):.4f}")
    assert ok["eval_loss"][-1, 0] < 0.1 * ok["eval_loss"][0, 0], "the healthy run learns"
    assert np.ptp(detached["eval_loss"]) == 0, "optimizer_detached learns nothing at all"
    assert divided["eval_loss"][-1, 0] > 0.9 * divided["eval_loss"][0, 0], "lr_divided crawls"
    for run in stall.values():
        assert np.all(run["distance"] == 0)
    for run in (detached, divided):  # everything a loss-and-sync dashboard shows looks normal
        assert run["alerts"] == []
        assert np.all(np.isfinite(run["grad_norm"])) and 0.5 < np.median(run["grad_norm"]) / g0 < 2
    # ... but the update's size shows it
    assert np.all(detached["update_ratio"] == 0)
    assert np.all(detached["fingerprint"] == detached["fingerprint"][0]), "checksum never changes"
    assert np.all(ok["update_ratio"] > 0) and np.all(np.any(ok["fingerprint"][1:] !=
                                                            ok["fingerprint"][:-1], axis=2))
    assert np.allclose(shrink, 1 / (world * batch), rtol=1e-3)
    assert np.allclose(ok["update_norm"] / ok["grad_norm"], lr, rtol=1e-3)
    assert np.allclose(divided["update_norm"] / divided["grad_norm"], lr / (world * batch),
                       rtol=1e-2)
    print("more cheaply still, a checksum that never moves flags optimizer_detached")


def plot_stall(stall: dict, *, lr: float) -> None:
    """Three panels over the steps of the stall runs: rank 0's loss on a fixed batch of
    training rows, its gradient norm after the sync, and the lr SGD really applied
    (||update|| / ||gradient||, 0 on the bottom row) against the configured `lr`."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.4))
    style = {"healthy": dict(lw=2.5, alpha=0.5), "optimizer_detached": dict(ls="--"),
             "lr_divided": dict(ls=":", lw=2)}
    for name, run in stall.items():
        axes[0].plot(run["eval_loss"][:, 0], label=name, **style[name])
        axes[1].plot(run["grad_norm"][:, 0], **style[name])
        applied = run["update_norm"][:, 0] / run["grad_norm"][:, 0]  # the lr SGD really applied
        axes[2].plot(np.maximum(applied, 1e-6), **style[name],  # 0 drawn on the bottom row
                     label=name + (" (on the dashed line)" if name == "healthy" else ""))
    axes[0].set_ylabel("loss on the fixed training rows (MSE)")
    axes[0].legend(fontsize=8)
    axes[0].set_title("the loss stalls", fontsize=10)
    axes[1].set_ylabel("gradient L2 norm after the sync")
    axes[1].set_title("gradients: finite; no downward trend when stalled, falling when healthy",
                      fontsize=10)
    axes[2].axhline(lr, color="k", lw=1, ls="--", label=f"configured lr = {lr}")
    axes[2].set_yscale("log")
    axes[2].set_ylim(3e-7, 0.5)
    axes[2].set_yticks([1e-6, 1e-4, 1e-2], ["0", "1e-4", "1e-2"])
    axes[2].minorticks_off()
    axes[2].set_ylabel("||update|| / ||gradient||")
    axes[2].legend(fontsize=8, loc="center right", bbox_to_anchor=(1, 0.3))
    axes[2].set_title("the lr actually applied (0 drawn on the bottom row)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("step")
    axes[1].set_ylim(bottom=0)
    plt.tight_layout()
    plt.show()


# --- Numerical drift ----------------------------------------------------------------------------

def ulps_apart(run: dict, rank: int = 2) -> tuple[float, float, float]:
    """Rank `rank`'s largest |w_rank - w_0| after the last step, rank 0's weight where it
    occurs, and that gap in ulp (units in the last place: the spacing of float32 numbers at
    the smaller of the two weights' magnitudes)."""
    p = run["params"]
    d = np.abs(p[rank] - p[0])
    i = int(np.argmax(d))
    ulp = float(np.spacing(np.float32(min(abs(p[0, i]), abs(p[rank, i])))))
    return float(d[i]), float(p[0, i]), float(d[i]) / ulp


def explain_last_bits(num: dict, *, steps: int, reference: str = "manual_allreduce",
                      rank: int = 2) -> None:
    """Under the numerical-drift table: what its columns measure, and for each run that split
    rank `rank` off, its largest gap in ulp of the weight it sits at (float32 eps is that
    spacing at 1.0 only); asserts that the split lies in the last bits."""
    eps = float(np.finfo(np.float32).eps)
    print(f"(after {steps} steps; gap to rank 0 = max |w_{rank} - w_0|; vs {reference} = max "
          f"weight difference from that run, over every rank)")
    split = [name for name, run in num.items() if np.any(run["distance"][-1] > 0)]
    for name in split:
        gap, w, n = ulps_apart(num[name], rank)
        print(f"{name}: its gap {gap:.1e} is {n:g} ulp of the weight it sits at ({w:+.3f})")
        assert 0 < n <= 2 ** 10, "a difference in the last bits"
    print(f"ulp: the float32 spacing at a value; float32 eps = {eps:.1e} (dotted in the plot) "
          f"is that spacing at 1.0; in [0.5, 1) it is eps/2 = {eps / 2:.1e}")


# --- On a real GPU cluster ----------------------------------------------------------------------

# Sourced notes rendered by `facts.show`: what NCCL's all-reduce guarantees and where replicas
# can still split (IDENTICAL_BYTES); folded, for reference (REFERENCE): a reported split
# (FORWARDED_REPORT), what a replica is under sharded and tensor-parallel training
# (SHARDED_REPLICAS) and NaN checks on GPUs (GPU_NAN_CHECK).
IDENTICAL_BYTES = (
    "- **Identical bytes per call**: in an AllReduce [[nccl.allreduce_identical_results]] "
    "(NCCL's user guide).\n"
    "- **Rank-local work after the sync splits replicas** (an optimizer that rounds "
    "differently on one node, a rank-dependent code path).\n"
    "- **Buffers** (non-trained state such as BatchNorm running statistics) **are re-sent "
    "from rank 0 at every forward** by default: [[pytorch.ddp_forward_sync_buffers]]; so a "
    "rank-local change to them is undone at the next forward, and the fingerprint checks "
    "parameters only (with forward_sync_buffers=False, add the buffers to it, or a split in "
    "them goes unseen). Parameters are not re-sent (details in the fold).")

# Folded: how NCCL forwards the finished sum, when DDP re-sends parameters, and what a hop
# error would do (our inference); the learner's path keeps the three one-liners above.
FORWARDING = (
    "- **The finished sum is forwarded unchanged**: transmitted unchanged to all GPUs (NCCL's "
    "maintainer, [NVIDIA/nccl#855](https://github.com/NVIDIA/nccl/issues/855)). DDP re-sends "
    "parameters only at construction and at the end of `Join` "
    "([[pytorch.join_final_model_sync]], notebook 07).\n"
    "- **Corruption while the sum is forwarded** (our inference, not shown here: Gloo on one "
    "machine cannot corrupt a hop). *What NCCL does:* a ring all-reduce first reduces, then "
    "passes the finished sum from GPU to GPU (the loop commented \"k-2 steps: copy to next "
    "GPU\" in [`src/device/all_reduce.h`]"
    "(https://github.com/NVIDIA/nccl/blob/v2.30.7-1/src/device/all_reduce.h)). *What a hop "
    "error would do:* a bit flipped on one hop would reach only the ranks downstream of it and "
    "split the replicas; the fingerprint would catch it.")

# Reference, folded: a report of the forwarded-sum symptom (cause never found), and why
# run-to-run reproducibility is another property.
FORWARDED_REPORT = (
    "- **A reported split, cause never found**: "
    "[NVIDIA/nccl#434](https://github.com/NVIDIA/nccl/issues/434), one node's all-reduce "
    "result (always the same node) differing from the others'; the maintainer answered that "
    "all ranks should hold the same result. A bit flipped while forwarding (our inference, "
    "e.g. bad memory on a forwarding GPU) would look like this.\n"
    "- **Run-to-run reproducibility is another property.** Identical bytes hold within one "
    "call, not across runs or algorithms. Some CUDA kernels are non-deterministic "
    "([listed under `torch.use_deterministic_algorithms`]"
    "(https://docs.pytorch.org/docs/stable/generated/torch.use_deterministic_algorithms.html)): "
    "two runs differ, while the replicas within each run agree if that non-determinism comes "
    "before the sync.")

SHARDED_REPLICAS = (
    "- **Sharded training** (each rank holds only a slice of the parameters: FSDP's "
    "FULL_SHARD, DeepSpeed ZeRO-3) has no replica to compare: per-shard "
    "not-finite flags and norms still catch NaN and spikes. With hybrid sharding "
    "([[pytorch.fsdp2_hsdp]]) the ranks holding the same shard in different replica groups "
    "are replicas: fingerprint each shard against theirs. With ZeRO-1/2 every rank holds the "
    "whole model but updates only its own slice, then all-gathers the slices after every step "
    "([DeepSpeed `stage_1_and_2.py`](https://github.com/deepspeedai/DeepSpeed/blob/master/"
    "deepspeed/runtime/zero/stage_1_and_2.py)): "
    "a rank-local change to the parameters is overwritten by the owner's slice, and one to "
    "the fp32 master copy a rank owns reaches every rank. Either way the replicas agree again "
    "after the next all-gather.\n"
    "- **Parameters replicated across tensor-parallel ranks** are replicas too: under "
    "sequence parallelism each rank computes the LayerNorm gradients from its own slice of "
    "the sequence, and Megatron-LM sums them with "
    "[[megatron.sp_layernorm_grad_allreduce]]. A real case: "
    "[[gptneox.sp_layernorm_unsynced]].")

GPU_NAN_CHECK = (
    "- **On GPUs, keep the NaN check on the device**: [[pytorch.cuda_host_copy_sync]], so a "
    "norm read on the host every step costs a synchronisation per step. Read a not-finite "
    "flag accumulated on the GPU at check steps, or set [[pytorch.nccl_nan_check]]: it "
    "kills the rank whose send buffer holds a NaN (not an Inf), before the collective runs. "
    "After a device-side assert the process cannot use the GPU again "
    "([[cuda.error_assert_sticky]]).")

REFERENCE = ("<details><summary>For reference: how the sum is forwarded; a reported split; "
             "reproducibility; replicas under sharded and tensor-parallel training; NaN checks "
             "on GPUs</summary>\n\n"
             + FORWARDING + "\n" + FORWARDED_REPORT + "\n" + SHARDED_REPLICAS + "\n" + GPU_NAN_CHECK
             + "\n\n</details>")
