"""What notebook 11b (compressing communication: what it costs) reads from its runs.

The training runs are `clusterlab.experiments.compression.accuracy_table`; here are the
curves' smoothing, the steps to a target loss, the paired accuracy table, the consistency
asserts, and the rounding of a long ring's 16-bit sum (arithmetic in this process).
"""

from __future__ import annotations

import math

import numpy as np

WINDOW = 10  # steps per running mean of the training loss
MIN_DISCORDANT = 10  # fewer discordant samples: the normal approximation says nothing


def smooth(x, w: int = WINDOW) -> np.ndarray:
    """The `w`-step running means of `x` (one per full window)."""
    return np.convolve(x, np.ones(w) / w, mode="valid")


def steps_to(curve, target: float) -> int | None:
    """The last step of the first 10-step window whose mean training loss is at or below
    `target`; None if no window reaches it."""
    below = np.flatnonzero(smooth(curve) <= target)
    return int(below[0]) + WINDOW if below.size else None


def plot_error_feedback(ef_runs: dict, longer: dict, *, target: float, budget: int) -> None:
    """The training loss (10-step means) of fp32 over the budget and of top-k 1% with and
    without error feedback over the longer runs, with fp32's end-of-budget loss as a line."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    for m, r, style in (("none", ef_runs["none"], "-"),
                        ("topk:0.01", longer["topk:0.01"], "-"),
                        ("topk-noef:0.01", longer["topk-noef:0.01"], "--")):
        curve = smooth(r["loss_curve"])
        ax.plot(np.arange(len(curve)) + WINDOW, curve, style,
                label="fp32 (none)" if m == "none" else m)
    ax.axhline(target, color="grey", ls=":", label=f"fp32 at step {budget}")
    ax.axvline(budget, color="grey", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (4 ranks, 10-step mean)")
    ax.set_title("Same start, same batches: top-k 1% with and without error feedback",
                 fontsize=9)
    ax.legend(fontsize=8)
    plt.tight_layout()
    plt.show()


def explain_error_feedback(ef_runs: dict, longer: dict, *, target: float,
                           budget: int) -> tuple[int | None, int | None]:
    """The test losses after the budget (fp32, top-k with and without error feedback, and
    whether both top-k runs sent the same bytes) and the steps each top-k run took to reach
    fp32's end-of-budget training loss. Asserts that error feedback is what makes top-k work
    here: a clearly better test loss, the same bytes, and under 1/1.5 of the steps. Returns
    the two step counts (with, without error feedback)."""
    ef, noef = ef_runs["topk:0.01"], ef_runs["topk-noef:0.01"]
    n_ef, n_noef = (steps_to(longer[m]["loss_curve"], target)
                    for m in ("topk:0.01", "topk-noef:0.01"))
    print(f"After {budget} steps, test loss: fp32 DDP {ef_runs['none']['test_loss']:.3f}, top-k "
          f"1% with error feedback {ef['test_loss']:.3f}, without {noef['test_loss']:.3f} (the "
          f"same bytes per step: {ef['sent_bytes'] == noef['sent_bytes']}).")
    print(f"Steps to reach fp32's training loss at step {budget} ({target:.2f}), within "
          f"{4 * budget}: top-k with error feedback {n_ef}, without {n_noef}.")
    assert noef["test_loss"] > ef["test_loss"] + 0.1, "error feedback is what makes top-k work here"
    assert ef["sent_bytes"] == noef["sent_bytes"]
    assert n_ef and n_noef and n_noef > 1.5 * n_ef, (n_ef, n_noef)
    return n_ef, n_noef


def accuracy_gap_se(res: dict, m: str) -> float:
    """`m`'s test accuracy minus fp32's ("none"), in standard errors of the paired difference
    (the same test samples, sample by sample); 0 when the two answered identically."""
    d = res[m]["correct"].astype(float) - res["none"]["correct"].astype(float)  # same samples
    sd = d.std(ddof=1)
    return d.mean() / (sd / math.sqrt(len(d))) if sd > 0 else 0.0


def only(res: dict, m: str) -> tuple[int, int]:
    """The discordant samples: (right only under `m`, right only under fp32)."""
    mine, base = res[m]["correct"], res["none"]["correct"]
    return int((mine & ~base).sum()), int((base & ~mine).sum())


def print_accuracy_table(res: dict, *, gap: dict, n_test: int) -> None:
    """Per method: bytes per step, test loss and its gap to fp32, accuracy ± 1 s.e., and the
    paired difference from fp32 with the samples only one of the two got right ("n/a" with
    fewer than MIN_DISCORDANT of those); then the paired difference of the method farthest
    from fp32 worked out from its two counts, (c - b) / sqrt(b + c)."""
    print(f"{'method':>11}  kB/step  test loss (vs fp32)  accuracy ± 1 s.e. (n={n_test})  "
          "paired vs fp32  right only here / only fp32")
    for m, r in res.items():
        se = math.sqrt(r["accuracy"] * (1 - r["accuracy"]) / n_test)
        c, b = only(res, m) if m != "none" else (0, 0)
        paired = "" if m == "none" else ((f"{accuracy_gap_se(res, m):+5.1f} s.e."
                                          if c + b >= MIN_DISCORDANT else f"{'n/a':>10}")
                                         + f"{c:>21} / {b}")
        name = "fp32 (none)" if m == "none" else m
        print(f"{name:>11}  {r['sent_bytes'] / 1e3:7.1f}  {r['test_loss']:9.3f} "
              f"({gap[m]:+.3f})  {r['accuracy']:17.1%} ± {se:.1%}    {paired}".rstrip())
    counted = [m for m in res if m != "none" and sum(only(res, m)) >= MIN_DISCORDANT]
    if len(counted) < len(res) - 1:
        print(f"n/a: fewer than {MIN_DISCORDANT} samples right under only one of the two, too "
              f"few for a difference in standard errors")
    if counted:
        m = max(counted, key=lambda k: abs(accuracy_gap_se(res, k)))
        c, b = only(res, m)
        print(f"Worked example, {m}: c = {c} samples right only here, b = {b} only under fp32: "
              f"(c - b) / sqrt(b + c) = ({c} - {b}) / sqrt({b + c}) = "
              f"{(c - b) / math.sqrt(b + c):+.1f} s.e. (the column, from the same samples one "
              f"by one: {accuracy_gap_se(res, m):+.1f})")


def check_accuracy(res: dict, *, gap: dict, n_test: int, budget: int) -> None:
    """Asserts that fp16 and bf16 end where fp32 does on this toy model (test loss within
    0.01) and that top-k with error feedback ends within 0.1, and prints how close the 16-bit
    sums came, with the samples they answered as fp32 did."""
    assert abs(gap["fp16"]) < 0.01 and abs(gap["bf16"]) < 0.01, "16-bit sums: the same toy model"
    assert gap["topk:0.01"] < 0.1, (f"top-k with error feedback ends about as well after "
                                    f"{budget} steps")
    same = {m: int((res[m]["correct"] == res["none"]["correct"]).sum()) for m in ("fp16", "bf16")}
    print(f"fp16 and bf16 ended within {max(abs(gap['fp16']), abs(gap['bf16'])):.0e} of fp32's "
          f"test loss, with the same answer on {same['fp16']} and {same['bf16']} of {n_test} "
          f"samples.")


def ring_sum_error(p: int, dtype, n: int = 2048, seed: int = 0, common: float = 0.0) -> float:
    """Relative error of a chunk's sum after p - 1 ring hops, rounded to `dtype` at each hop,
    for n synthetic Gaussian gradient values per rank (one draw from `seed`). `common`: the
    weight of a gradient all ranks share (0: independent ranks)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(1, n, generator=g, dtype=torch.float64)
    noise = torch.randn(p, n, generator=g, dtype=torch.float64)
    x = (common * shared + noise) * 1e-3
    acc = x[0].to(dtype)
    for i in range(1, p):
        acc = (acc.double() + x[i].to(dtype).double()).to(dtype)  # one hop: add, round
    exact = x.sum(0)
    return float((acc.double() - exact).norm() / exact.norm())


def explain_ring_errors(errors: dict, ps: list[int]) -> float:
    """The relative error of each dtype's ring sum at each ring size, bf16's after the
    longest ring against one hop and fp32's, and bf16's with correlated ranks. Asserts that
    bf16's error grows over 10x with the ring and stays 1000x fp32's. Returns the correlated
    error."""
    import torch

    for dt, errs in errors.items():
        print(f"{str(dt):15s}" + "".join(f"  p={p}: {e:.1e}" for p, e in zip(ps, errs)))
    bf = errors[torch.bfloat16]
    assert bf[-1] > 10 * bf[0] and bf[-1] > 1000 * errors[torch.float32][-1]
    print(f"bf16 (eps {torch.finfo(torch.bfloat16).eps:.1e}), synthetic Gaussian gradients, one "
          f"draw: an error of {bf[-1]:.1%} of the sum's norm")
    print(f"after {ps[-1] - 1} hops of a flat ring, against {bf[0]:.1%} after one (the cast of "
          f"each rank's values to bf16 and one rounded addition: the error is measured against "
          f"the exact sum of the unrounded values); fp32 after {ps[-1] - 1} hops: "
          f"{errors[torch.float32][-1]:.0e}.")
    corr = ring_sum_error(ps[-1], torch.bfloat16, common=1.0)
    print(f"Correlated ranks (a shared gradient as large as each rank's noise): bf16 {corr:.1%} "
          f"after {ps[-1] - 1} hops (the same synthetic draw).")
    return corr
