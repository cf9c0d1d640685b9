"""What `notebooks/07_gradient_scaling.ipynb` reads from its runs.

The experiments are `clusterlab.experiments.gradient_scaling`; each function here turns one
cell's runs into the table, the sentences or the figure the learner reads, and checks what the
text claims.
"""

from __future__ import annotations

import numpy as np


def fix_table(fix: dict, *, steps: int) -> None:
    """Per weighting method: the gradient's relative error at step 0 and the parameters' max
    distance from full-batch descent after `steps` steps (`w_full`)."""
    from ..experiments import gradient_scaling

    last = f"max |w - w_full| after {steps} steps"
    print(f"{'':14s} {'relative error, step 0':>22s} {last:>{len(last) + 2}s}")
    for m in gradient_scaling.METHODS:
        print(f"{m:14s} {fix['rel_error'][m]:22.1e} {fix['param_error'][m][-1]:{len(last) + 2}.1e}")


def distance_to_own_minimiser(params: dict, minimisers: dict) -> float:
    """The mean of means' final parameters' max distance from its re-weighted loss's
    minimiser (`gradient_scaling.minimisers`)."""
    return float(np.max(np.abs(params["mean_of_means"][-1] - minimisers["mean_of_means"])))


def explain_fix(fix: dict, opt_pt: dict, *, steps: int, mom: float) -> None:
    """The table of `fix_table`, what dividing by the global count does to the gradient's
    error, and what the mean of means' other end point costs in full-data loss; folded: where
    it ends after `steps` steps (its own minimiser, off the full-batch one) and what moves
    that point. Asserts the "tens of percent" (`mom`: the mean of means' error on the first
    batches), the fixes to rounding, and that the mean of means converged to its own
    minimiser."""
    from . import show

    shift, mom_end = opt_pt["shift"], fix["param_error"]["mean_of_means"][-1]
    print(f"In short: dividing by the global count makes the gradient exact (error "
          f"{fix['rel_error']['global_count']:.0e}, against "
          f"{fix['rel_error']['mean_of_means']:.0%} for the mean of means), and the mean of "
          f"means trains to a different point, {shift:.4f} from the full-batch one.")
    fix_table(fix, steps=steps)
    own = distance_to_own_minimiser(fix["params"], opt_pt)  # asserted below, not printed
    floor, excess = opt_pt["min_loss"], opt_pt["excess_loss"]
    n = sum(fix["batch_sizes"])
    print(f"Where the mean of means ends, the full-data loss is {floor * (1 + excess):.4f} "
          f"instead of the optimum's {floor:.4f} (+{excess:.0%}).")
    # Why the point moves, and by how much, is reference detail: folded.
    show.fold("Where the mean of means ends, and what moves that point", "\n".join([
        f"The mean of means converges, but to another point: after {steps} steps it sits at "
        f"its own minimiser, {shift:.4f} from the full-batch one ({shift / opt_pt['scale']:.1%} "
        f"of the largest parameter). The optimum's loss, {floor:.4f}, is the lowest this "
        f"model reaches on these {n} samples.",
        "The shift is zero with equal counts. Here every shard is drawn from one distribution, "
        "so only sampling noise moves it; shards pinned to different sources (one distribution "
        "per rank) would, in principle, move it further (not run here).",
        "The fix costs one all-reduce of a single number per step."]))
    assert 0.1 < mom < 1 and 0.1 < fix["rel_error"]["mean_of_means"] < 1  # "tens of percent"
    assert fix["rel_error"]["global_count"] < 1e-6 and fix["rel_error"]["weighted"] < 1e-6
    assert fix["param_error"]["global_count"][-1] < 1e-10
    assert abs(mom_end - shift) < 0.05 * shift and own < 0.01 * shift, (
        "it converged to its own minimiser")


def micro_batch_weights(tokens=(10, 90)) -> None:
    """Gradient accumulation over micro-batches of `tokens` tokens, each with a per-token mean
    loss, averaged over the k micro-batches: each token's weight, 1 / (k n), against its
    correct share 1 / T (T: all tokens), and the ratio of the two."""
    k, total = len(tokens), sum(tokens)
    for n in tokens:
        print(f"a token of the {n}-token micro-batch: weight 1/(k x {n}) = {1 / (k * n):.4f} "
              f"instead of 1/T = {1 / total:.4f}: {total / (k * n):.2f}x its share")


def token_fix(tok: dict) -> None:
    """Print the token-count run (`experiments.gradient_scaling.token_accumulation`): each
    rank's micro-batch token counts and the two methods' gradient error against one process's
    per-token mean; assert that only the global token count is exact."""
    ranks = "; ".join(f"rank {r}: {', '.join(map(str, t))}" for r, t in enumerate(tok["tokens"]))
    err = tok["rel_error"]
    print(f"loss tokens per micro-batch ({ranks}), T = {tok['total']}\n"
          f"gradient error against one process's per-token mean:\n"
          f"  micro-batch mean / k     {err['mean_over_k']:.1e}\n"
          f"  summed tokens x W / T    {err['global_tokens']:.1e}")
    assert err["mean_over_k"] > 0.05, "unequal token counts re-weight the tokens"
    assert err["global_tokens"] < 1e-12, "the global token count is exact up to rounding"


def explain_adam(adam_sm: dict, adam_fix: dict, opt_pt: dict, *, final: dict,
                 steps: int) -> None:
    """With Adam: how much larger the summed loss's gradient is than the mean loss's and how
    little their loss curves differ (per world size), SGD's diverged run for contrast
    (`final`: per world size, the final (mean, sum) losses of the SGD runs), and where the
    mean of means ends after `steps` Adam steps; asserts that sum and mean give the same
    curves and that Adam converges to the mean of means' minimiser."""
    shift = opt_pt["shift"]
    gap = max(float(np.max(np.abs(s_ - m_) / m_))
              for s_, m_ in zip(adam_sm["loss"]["sum"], adam_sm["loss"]["mean"]))
    print(f"In short: under Adam, sum and mean losses train alike (loss curves within {gap:.0e}, "
          "relative), but the mean of means still ends at its own minimiser, not the "
          "full-batch one.")
    for i, w in enumerate(adam_sm["world_sizes"]):
        s_, m_ = adam_sm["loss"]["sum"][i], adam_sm["loss"]["mean"][i]
        print(f"Adam, W={w}: the summed loss's gradient is "
              f"{adam_sm['grad_norm']['sum'][i] / adam_sm['grad_norm']['mean'][i]:.0f}x the "
              f"mean loss's; the two loss curves differ by at most "
              f"{np.max(np.abs(s_ - m_) / m_):.1e} (relative) over {len(m_)} steps; final loss "
              f"{s_[-1]:.4f} vs {m_[-1]:.4f}")
    print(f"(SGD, same lr, W=1: summed loss ended at {final[1][1]:.1e})")
    adam_mom = adam_fix["param_error"]["mean_of_means"][-1]
    adam_own = distance_to_own_minimiser(adam_fix["params"], opt_pt)
    print(f"Adam, batches 3/10/40/99, {steps} steps: the mean of means ends {adam_mom:.4f} "
          f"from full-batch Adam and {adam_own:.1e} from its re-weighted loss's minimiser (the "
          f"minimisers are {shift:.4f} apart); the global count "
          f"{adam_fix['param_error']['global_count'][-1]:.1e}")
    for i in range(len(adam_sm["world_sizes"])):
        assert np.allclose(adam_sm["loss"]["sum"][i], adam_sm["loss"]["mean"][i], rtol=1e-5)
    assert abs(adam_mom - shift) < 0.05 * shift and adam_own < 0.01 * shift, (
        "Adam: the mean of means' minimiser")
    assert adam_fix["param_error"]["global_count"][-1] < 1e-10


def plot_scaler_and_clipping(scal: dict, clip: dict) -> None:
    """Three panels: the GradScaler's scale per rank (DDP and ShardedGradScaler: one line for
    every rank; plain GradScaler on shards: the rank with the inf apart from the others), the
    clipping factor per block at step 0 (local vs global norm), and the distance from
    one-process training under each clipping. Asserts the ranks that one line stands for."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    ax = axes[0]
    both = scal["ddp"]["scale"][:, 0]
    assert np.all(scal["ddp"]["scale"] == both[:, None]) and np.all(
        scal["sharded_synced"]["scale"] == both[:, None])
    ax.plot(both, color="0.6", lw=6, alpha=0.6, label="ddp and sharded_synced: every rank")
    local = scal["sharded_local"]["scale"]
    others = [r for r in range(scal["world"]) if r != scal["inf_rank"]]
    assert np.all(local[:, others] == local[:, others[:1]])  # one line stands for these ranks
    ax.plot(local[:, others[0]], "o--", color="C1", label=f"sharded_local: ranks {others}")
    ax.plot(local[:, scal["inf_rank"]], "s:", color="C3",
            label=f"sharded_local: rank {scal['inf_rank']}")
    ax.axvline(scal["inf_step"], color="k", lw=0.8, ls=":")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("step")
    ax.set_ylabel("GradScaler scale")
    ax.set_title("Loss scale per rank (inf on rank 2 at step 2)", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1]
    x = np.arange(clip["world"])
    ax.bar(x - 0.2, clip["local"]["block_scale"], 0.4, color="C3", label="local norm")
    ax.bar(x + 0.2, clip["global"]["block_scale"], 0.4, color="C2", label="global norm")
    ax.set_xticks(x, [f"block {b}\n|g|={n:.1f}"
                      for b, n in enumerate(clip["local"]["local_norms"][0])])
    ax.set_yscale("log")
    ax.set_ylabel("factor applied by clipping")
    ax.set_title("Clipping factor per block, step 0", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[2]
    for mode, c in (("local", "C3"), ("global", "C2")):
        ax.plot(np.maximum(clip[mode]["param_error"], 1e-18), color=c, label=f"{mode} norm")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("max |w - one process|")
    ax.set_title("Training vs clip_grad_norm_ in one process", fontsize=10)
    ax.legend(fontsize=8)
    plt.tight_layout()
    plt.show()
