"""What notebook 11b (compressing communication: what it costs) reads from its runs.

The training runs are `clusterlab.experiments.compression.accuracy_table`; here are the
curves' smoothing, the steps to a target loss, the paired accuracy table, the consistency
asserts, and the rounding of a long ring's 16-bit sum (arithmetic in this process).
"""

from __future__ import annotations

import contextlib
import io
import math

import numpy as np

from . import show

WINDOW = 10  # steps per running mean of the training loss
MIN_DISCORDANT = 10  # fewer discordant samples: the normal approximation says nothing
BORDERLINE_SE, CLEAR_SE = 2.0, 3.0  # paired differences: beyond 2 s.e. borderline, 3 clear
NEGLIGIBLE_LOSS = 1e-3  # a test-loss gap below this is too small to matter, however sure
LABELS = {"none": "fp32 (none)", "topk:0.01": "top-k 1%, error feedback",
          "topk-noef:0.01": "top-k 1%, no error feedback"}  # the figure's legend


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
        ax.plot(np.arange(len(curve)) + WINDOW, curve, style, label=LABELS[m])
    ax.axhline(target, color="grey", ls=":",
               label=f"fp32, mean of steps {budget - WINDOW + 1}-{budget}")
    ax.axvline(budget, color="grey", lw=0.8, label=f"fp32's {budget}-step budget")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (4 ranks, 10-step mean)")
    ax.set_title("Same start, same batches: top-k 1% with and without error feedback",
                 fontsize=9)
    ax.legend(fontsize=8)
    plt.tight_layout()
    plt.show()


def explain_error_feedback(ef_runs: dict, longer: dict, *, target: float,
                           budget: int) -> tuple[int | None, int | None]:
    """One lead sentence (when the asserts below hold), then the test losses after
    the budget (fp32, top-k with and without error feedback, and
    the bytes per step both top-k runs sent) and the steps each top-k run took to reach
    fp32's end-of-budget training loss (its mean over the budget's last WINDOW steps).
    Asserts that error feedback is what makes top-k work here: a clearly better test loss,
    the same bytes, and under 1/1.5 of the steps. Returns the two step counts (with, without
    error feedback)."""
    ef, noef = ef_runs["topk:0.01"], ef_runs["topk-noef:0.01"]
    n_ef, n_noef = (steps_to(longer[m]["loss_curve"], target)
                    for m in ("topk:0.01", "topk-noef:0.01"))
    if (noef["test_loss"] > ef["test_loss"] + 0.1 and ef["sent_bytes"] == noef["sent_bytes"]
            and n_ef and n_noef and n_noef > 1.5 * n_ef):  # the asserts below
        lower = f"{noef['test_loss'] - ef['test_loss']:.2f} lower"
        if "sample_loss" in ef and "sample_loss" in noef:  # paired on the same test samples
            d = np.asarray(noef["sample_loss"], float) - np.asarray(ef["sample_loss"], float)
            lower = (f"{d.mean():.2f} ± {d.std(ddof=1) / math.sqrt(len(d)):.2f} lower "
                     "(± one s.e. of the per-sample differences)")
        print(f"In short: for the same bytes, top-k with error feedback reached fp32's training "
              f"loss in {n_ef} steps (without it: {n_noef}) and ended the budget with a test "
              f"loss {lower}.")
    if n_noef:
        print(f"So without error feedback top-k did not stall here: it reached fp32's training "
              f"loss {n_noef / n_ef:.1f}x later ({n_noef} against {n_ef} steps, within "
              f"{4 * budget})" if n_ef else f"Without error feedback top-k reached fp32's "
              f"training loss in {n_noef} steps")
        print("(whether it would level off higher on a much longer run was not run).")
    else:
        print(f"Without error feedback top-k did not reach fp32's training loss within "
              f"{4 * budget} steps.")
    print(f"After {budget} steps, test loss: fp32 DDP {ef_runs['none']['test_loss']:.3f}, top-k "
          f"1% with error feedback {ef['test_loss']:.3f}, without {noef['test_loss']:.3f} (both "
          f"send {ef['sent_bytes'] / 1e3:.1f} kB/step).")
    print(f"Steps to reach fp32's end-of-budget training loss ({target:.2f}, its mean over "
          f"steps {budget - WINDOW + 1}-{budget}), within {4 * budget}: top-k with error "
          f"feedback {n_ef}, without {n_noef}.")
    last, before = smooth(ef_runs["none"]["loss_curve"])[[-1, -1 - WINDOW]]
    print(f"fp32's training loss {'was still falling' if last < before else 'had stopped falling'}"
          f" at the end of the budget: {before:.3f} over steps {budget - 2 * WINDOW + 1}-"
          f"{budget - WINDOW}, {last:.3f} over steps {budget - WINDOW + 1}-{budget} (10-step "
          "means).")
    assert noef["test_loss"] > ef["test_loss"] + 0.1, "error feedback is what makes top-k work here"
    assert ef["sent_bytes"] == noef["sent_bytes"]
    assert n_ef and n_noef and n_noef > 1.5 * n_ef, (n_ef, n_noef)
    return n_ef, n_noef


def three_rank_example() -> np.ndarray:
    """The three-rank counterexample worked out: each rank's gradient, the entry its top-1
    sends, the sum sent against the true sum, and the first-order change of the total loss
    for an SGD step of size lr along the sum sent. Asserts that it climbs. Returns the sum
    sent."""
    g = np.array([[-5, 4, 4], [4, -5, 4], [4, 4, -5]])
    sent = np.zeros_like(g)
    for r, row in enumerate(g):
        i = int(np.argmax(np.abs(row)))  # top-1: the entry of largest magnitude
        sent[r, i] = row[i]
        print(f"rank {r}: gradient {tuple(row.tolist())}, its top-1 sends "
              f"{tuple(sent[r].tolist())}")
    total, true = sent.sum(0), g.sum(0)
    change = -int(true @ total)  # the step is -lr x the sum sent; the loss moves by true . step
    print(f"sum sent {tuple(total.tolist())}, true sum {tuple(true.tolist())}: a step of lr "
          f"along the sum sent changes the total loss by about {change:+d} lr (it climbs).")
    assert change > 0
    return total


def show_formats() -> None:
    """The three formats as a Markdown table from torch.finfo: exponent and significand
    bits, eps (the gap between 1 and the next number) and the largest finite value."""
    import torch

    rows = ["| format | exponent bits | significand bits (stored) | eps | largest |",
            "| --- | --- | --- | --- | --- |"]
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        f = torch.finfo(dt)
        stored = round(-math.log2(f.eps))  # eps = 2^-(stored significand bits)
        exponent = f.bits - 1 - stored
        rows.append(f"| {name} | {exponent} | {stored} | {f.eps:.1e} | {f.max:.3g} |")
    show.say("\n".join(rows))


def check_same_trajectory(ef_runs: dict, longer: dict, *, budget: int) -> None:
    """Asserts that the longer top-k runs repeat the budget runs over their first `budget`
    steps (the same weights, batches and arithmetic), so the figure's curves and the test
    losses after the budget come from one trajectory per method."""
    for m in longer:
        short, long = ef_runs[m]["loss_curve"], longer[m]["loss_curve"][:budget]
        assert np.allclose(long, short, rtol=0, atol=1e-3), (
            f"{m}: the {len(longer[m]['loss_curve'])}-step run left the {budget}-step one by "
            f"up to {np.abs(long - short).max():.2g} in training loss")


def accuracy_gap_se(res: dict, m: str) -> float:
    """`m`'s test accuracy minus fp32's ("none"), in standard errors of the paired difference
    (the same test samples, sample by sample); 0 when the two answered identically."""
    d = res[m]["correct"].astype(float) - res["none"]["correct"].astype(float)  # same samples
    sd = d.std(ddof=1)
    return d.mean() / (sd / math.sqrt(len(d))) if sd > 0 else 0.0


def loss_gap(res: dict, m: str) -> tuple[float, float] | None:
    """`m`'s test loss minus fp32's, as the mean over the test samples of the paired
    per-sample cross-entropy differences, and that mean's standard error; None without
    per-sample losses."""
    if "sample_loss" not in res[m] or "sample_loss" not in res["none"]:
        return None
    d = np.asarray(res[m]["sample_loss"], float) - np.asarray(res["none"]["sample_loss"], float)
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d)))


def _se(se: float) -> str:
    return f"{se:.3f}" if se >= 5e-4 else "<0.001"


def loss_verdict(res: dict, m: str) -> str:
    """`verdict` of `m`'s paired test-loss gap; "negligible" below NEGLIGIBLE_LOSS, where a
    tiny but consistent shift (a 16-bit sum's) can lie many standard errors from zero."""
    lg = loss_gap(res, m)
    if lg is None:
        return "not measured"
    if abs(lg[0]) < NEGLIGIBLE_LOSS:
        return f"negligible (under {NEGLIGIBLE_LOSS:g})"
    return verdict(lg[0] / lg[1], "higher", "lower")


def verdict(z: float | None, more: str, less: str) -> str:
    """A paired difference of `z` standard errors in words: `more`/`less` beyond CLEAR_SE,
    "borderline" between BORDERLINE_SE and CLEAR_SE, else "cannot tell" (None: n/a)."""
    if z is None:
        return "cannot tell (n/a)"
    word = more if z > 0 else less
    if abs(z) >= CLEAR_SE:
        return f"{word} ({z:+.1f} s.e.)"
    if abs(z) >= BORDERLINE_SE:
        return f"borderline {word} ({z:+.1f} s.e.)"
    return f"cannot tell ({z:+.1f} s.e.)"


def accuracy_z(res: dict, m: str) -> float | None:
    """`accuracy_gap_se`, or None with fewer than MIN_DISCORDANT discordant samples."""
    return accuracy_gap_se(res, m) if sum(only(res, m)) >= MIN_DISCORDANT else None


def only(res: dict, m: str) -> tuple[int, int]:
    """The discordant samples: (right only under `m`, right only under fp32)."""
    mine, base = res[m]["correct"], res["none"]["correct"]
    return int((mine & ~base).sum()), int((base & ~mine).sum())


def print_accuracy_table(res: dict, *, gap: dict, n_test: int, reach: dict | None = None) -> None:
    """The `summary_line`, then one compact table (method, bytes per step, the paired test-loss
    gap to fp32 with its verdict, the paired accuracy gap with its verdict, the steps to fp32's
    end-of-budget training loss from `reach`), so the reader meets each comparison once; in a
    fold, the full table (test loss, paired and unpaired accuracy), the n/a note, the
    verdicts in words, c and b per method and a worked example (`full_accuracy_table`,
    `explain_verdicts`)."""
    print(summary_line(res))
    print(f"{'method':>11}  kB/step  {'test loss vs fp32 (paired s.e.)':46s}  "
          f"{'accuracy vs fp32 (paired)':26s}  steps to fp32's loss")
    for m, r in res.items():
        if m == "none":
            print(f"{'fp32 (none)':>11}  {r['sent_bytes'] / 1e3:7.1f}  {'reference':46s}  "
                  f"{'reference':26s}  -")
            continue
        lg = loss_gap(res, m)
        loss = (f"{gap[m]:+.3f}" + (f" ± {_se(lg[1])}" if lg else "")
                + f": {loss_verdict(res, m)}")
        acc = verdict(accuracy_z(res, m), "higher", "lower")
        n, horizon = (reach or {}).get(m, (0, 0))
        steps = "-" if not horizon else str(n) if n else f"not within {horizon}"
        print(f"{m:>11}  {r['sent_bytes'] / 1e3:7.1f}  {loss:46s}  {acc:26s}  {steps}")
    with contextlib.redirect_stdout(io.StringIO()) as full:
        full_accuracy_table(res, gap=gap, n_test=n_test, reach=reach)
    counted = [m for m in res if m != "none" and accuracy_z(res, m) is not None]
    with contextlib.redirect_stdout(io.StringIO()) as how:
        explain_verdicts(res, counted, [m for m in res if m != "none"])
    show.fold("The full table (both accuracies, test loss), the verdicts in words, and how they "
              "are read: c and b, a worked example, the thresholds",
              "```text\n" + full.getvalue().rstrip("\n") + "\n```\n\n"
              + "\n\n".join(line for line in how.getvalue().splitlines() if line.strip()),
              markdown=True)


def full_accuracy_table(res: dict, *, gap: dict, n_test: int, reach: dict | None = None) -> None:
    """Per method: bytes per step, test loss and its gap to fp32 (± the paired standard
    error when per-sample losses are there), the paired accuracy difference from fp32 beside
    it ("n/a" with fewer than MIN_DISCORDANT samples right under only one of the two), and
    the accuracy ± 1 unpaired s.e.; then `reach` (the steps each method took to fp32's
    end-of-budget training loss, `steps_to_target`) and a verdict per method on its accuracy
    and its test loss."""
    print(f"{'method':>11}  kB/step  test loss (vs fp32 ± paired s.e.)  accuracy vs fp32 "
          f"(paired)  accuracy ± 1 s.e. (n={n_test})")
    for m, r in res.items():
        se = math.sqrt(r["accuracy"] * (1 - r["accuracy"]) / n_test)
        z = accuracy_z(res, m) if m != "none" else None
        paired = "" if m == "none" else (f"{z:+5.1f} s.e." if z is not None else "n/a")
        lg = loss_gap(res, m) if m != "none" else None
        loss = f"({gap[m]:+.3f}" + (f" ± {_se(lg[1])})" if lg else ")")
        name = "fp32 (none)" if m == "none" else m
        print(f"{name:>11}  {r['sent_bytes'] / 1e3:7.1f}  {r['test_loss']:9.3f} {loss:<23}  "
              f"{paired:>16}  {r['accuracy']:18.1%} ± {se:.1%}")
    counted = [m for m in res if m != "none" and accuracy_z(res, m) is not None]
    if len(counted) < len(res) - 1:
        print(f"n/a: fewer than {MIN_DISCORDANT} samples right under only one of the two, too "
              f"few for a difference in standard errors")
    if reach:
        print(reach_line(reach))
    print(f"Verdicts against fp32 (paired; 'higher' or 'lower' only beyond {CLEAR_SE:g} s.e. of "
          "the test set's sampling):")
    for m in [m for m in res if m != "none"]:
        print(f"  {m:>11}: accuracy {verdict(accuracy_z(res, m), 'higher', 'lower'):28s} "
              f"test loss {loss_verdict(res, m)}")


def steps_to_target(res: dict, longer: dict, *, target: float) -> dict:
    """Per method of `res` with a run in `longer` (the same run, continued), (the steps its
    training loss took to reach `target`, or None, and the steps it was given)."""
    return {m: (steps_to(longer[m]["loss_curve"], target), len(longer[m]["loss_curve"]))
            for m in res if m in longer}


def reach_line(reach: dict) -> str:
    """`steps_to_target` in one line, fp32's own reference first."""
    return ("Steps to reach fp32's end-of-budget training loss, on the runs continued 4x longer: "
            + ", ".join(f"{m} " + (f"{n}" if n else f"not within {horizon}")
                        for m, (n, horizon) in reach.items())
            + " (later than the budget: slower, not necessarily worse; never: possibly worse)."
            + (" Equal counts are a coincidence of separate runs (the loss is checked at every"
               " step)." if len({n for n, _ in reach.values() if n})
               < sum(1 for n, _ in reach.values() if n) else ""))


def explain_verdicts(res: dict, counted: list, others: list) -> None:
    """What c and b are, the paired difference of the method farthest from fp32 worked out
    from its two counts, (c - b) / sqrt(b + c), and the thresholds of the verdicts."""
    print("Two standard errors: the accuracy's ± 1 s.e. is each model's own sampling error "
          "(unpaired); the paired column uses the s.e. of the difference on the same samples, "
          "which is smaller, as most samples are answered alike.")
    print("c and b are the test samples the two models disagree on: c right only under the "
          "method, b right only under fp32: "
          + ", ".join(f"{m} {c} / {b}" for m in others for c, b in [only(res, m)]) + ".")
    if counted:
        m = max(counted, key=lambda k: abs(accuracy_gap_se(res, k)))
        c, b = only(res, m)
        print(f"Worked example, {m}: c = {c} samples right only here, b = {b} only under fp32: "
              f"(c - b) / sqrt(b + c) = ({c} - {b}) / sqrt({b + c}) = "
              f"{(c - b) / math.sqrt(b + c):+.1f} s.e. (the column, from the same samples one "
              f"by one: {accuracy_gap_se(res, m):+.1f})")
    print(f"The verdicts are in standard errors of the test set's sampling only (the spread "
          f"between training seeds was not measured). Beyond {CLEAR_SE:g} s.e.: higher or lower "
          f"beyond test-set noise; {BORDERLINE_SE:g} to {CLEAR_SE:g}: borderline, as "
          f"{2 * len(others)} comparisons are made (accuracy and test loss of {len(others)} "
          f"methods), so one beyond {BORDERLINE_SE:g} could be chance.")


def summary_line(res: dict) -> str:
    """One line built from the verdicts: after how many steps, and whether fp32's training
    loss was still falling then (a gap can then be a delay); the methods grouped by what their
    test loss did against fp32; whether any accuracy moved beyond test-set noise."""
    others = [m for m in res if m != "none"]
    groups: dict[str, list[str]] = {}
    for m in others:
        word = loss_verdict(res, m).split(" (")[0]
        word = {"negligible": "changed it negligibly", "cannot tell": "left it within noise",
                "not measured": "not measured", "higher": "raised it beyond test-set noise",
                "lower": "lowered it beyond test-set noise", "borderline higher":
                "raised it, borderline", "borderline lower": "lowered it, borderline"}[word]
        groups.setdefault(word, []).append(m)
    moved = [m for m in others if not verdict(accuracy_z(res, m), "higher", "lower")
             .startswith("cannot tell")]
    curve = res["none"].get("loss_curve")
    when = ""
    if curve is not None and len(curve) >= 2 * WINDOW:
        last, before = smooth(curve)[[-1, -1 - WINDOW]]
        state = "still improving" if last < before else "no longer improving"
        when = f"after {len(curve)} steps (fp32 {state}), "
    return (f"In short, {when}test loss against fp32: "
            + "; ".join(f"{', '.join(ms)} {w}" for w, ms in groups.items())
            + ". Accuracy: " + ("within test-set noise for every method" if not moved else
                                ", ".join(
                                    f"{m} {verdict(accuracy_z(res, m), 'higher', 'lower')}"
                                    for m in moved) + ", the others within noise")
            + " (one run per method).")


def check_accuracy(res: dict, *, gap: dict, n_test: int, budget: int) -> None:
    """Asserts that fp16 and bf16 end where fp32 does on this toy model (test loss within
    0.01) and that top-k with error feedback ends within 0.1, and prints how close the 16-bit
    sums came, with the samples they answered as fp32 did."""
    assert abs(gap["fp16"]) < 0.01 and abs(gap["bf16"]) < 0.01, "16-bit sums: the same toy model"
    assert gap["topk:0.01"] < 0.1, (f"top-k with error feedback ends about as well after "
                                    f"{budget} steps")
    same = {m: int((res[m]["correct"] == res["none"]["correct"]).sum()) for m in ("fp16", "bf16")}
    curves = [res[m].get("loss_curve") for m in ("none", "fp16", "bf16")]
    followed = (max(float(np.abs(np.asarray(c) - np.asarray(curves[0])).max())
                    for c in curves[1:]) if all(c is not None for c in curves) else None)
    print(f"fp16 and bf16 ended within {max(abs(gap['fp16']), abs(gap['bf16'])):.0e} of fp32's "
          f"test loss, with the same answer on {same['fp16']} and {same['bf16']} of {n_test} "
          "samples" + ("." if followed is None else
                       f", and followed fp32's training loss within {followed:.0e} at every "
                       "step" + (": neither slower nor worse here (4 ranks)."
                                 if followed < 1e-2 else ".")))


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


def ring_sum_bias(p: int, dtype, *, draws: int = 20, n: int = 1024, seed: int = 1,
                  common: float = 0.0) -> tuple[float, float, float]:
    """Over `draws` synthetic draws (as `ring_sum_error`, rounded to `dtype` at each of p - 1
    hops): the error's component along the exact sum, <error, sum> / <sum, sum>, as a
    fraction of the sum (negative: the sum falls behind), averaged over the draws; that
    mean's standard error over the draws; and the mean relative size of the error. A mean
    component within a few standard errors of zero is noise; a consistent sign, a bias."""
    import torch

    g = torch.Generator().manual_seed(seed)
    shared = common * torch.randn(draws, n, generator=g, dtype=torch.float64) * 1e-3
    x = shared + torch.randn(draws, n, generator=g, dtype=torch.float64) * 1e-3
    exact, acc = x.clone(), x.to(dtype)
    for _ in range(1, p):  # one hop: the next rank's values, added and rounded
        x = shared + torch.randn(draws, n, generator=g, dtype=torch.float64) * 1e-3
        exact += x
        acc = (acc.double() + x.to(dtype).double()).to(dtype)
    err = acc.double() - exact
    along = (err * exact).sum(1) / (exact * exact).sum(1)
    size = err.norm(dim=1) / exact.norm(dim=1)
    return (float(along.mean()), float(along.std() / math.sqrt(draws)), float(size.mean()))


def bias_word(mean: float, se: float, size: float) -> str:
    """What `ring_sum_bias`'s numbers say: noise (the component along the sum within 3 s.e.
    of zero), mostly noise with a small real shrink or growth (beyond 3 s.e. but under a tenth of
    the error's size), or a bias."""
    way = "behind" if mean < 0 else "ahead"
    if abs(mean) < 3 * se:
        return "noise: zero within 3 s.e."
    if abs(mean) < size / 10:
        return f"mostly noise, with a small but real bias: the sum slightly {way}"
    return f"a bias: the sum falls {way}"


def explain_ring_bias(p: int, *, draws: int = 20) -> dict:
    """`ring_sum_bias` in bf16 at `p` ranks, independent and with a shared part as large as
    each rank's noise, each called noise or a bias (`bias_word`). Asserts that the shared
    part's is a bias that shrinks the sum. Returns {"independent": ..., "shared": ...}."""
    import torch

    out = {k: ring_sum_bias(p, torch.bfloat16, draws=draws, common=c)
           for k, c in (("independent", 0.0), ("shared", 1.0))}
    print(f"Noise or bias? Over {draws} draws at p = {p}, bf16: the error's component along the "
          "exact sum, as a share of the sum (mean ± s.e.), beside the error's size:")
    for k, (m, se, size) in out.items():
        label = "independent ranks" if k == "independent" else "a shared part"
        print(f"  {label:>17}: {m:+.2%} ± {se:.2%} (size {size:.1%}): {bias_word(m, se, size)}")
    m, se, size = out["shared"]
    assert m < -3 * se and abs(m) >= size / 10, "a shared part is rounded away: a bias"
    return out


def pct2(x: float) -> str:
    """A fraction as a percentage to two significant figures: 0.00249 -> '0.25%',
    0.02 -> '2.0%', 0.337 -> '34%' (the table prints the same values as 2.5e-03 and 3.4e-01)."""
    v = 100 * x
    return f"{v:.{max(0, 1 - math.floor(math.log10(v))) if v > 0 else 1}f}%"


def explain_ring_errors(errors: dict, ps: list[int]) -> float:
    """The relative error of each dtype's ring sum at each ring size, bf16's after the
    longest ring against one hop and fp32's, and bf16's with correlated ranks at each ring
    size, with why a shared part is rounded away (bf16's spacing against one rank's value).
    Asserts that bf16's error grows over 10x with the ring and stays 1000x fp32's. Returns
    the correlated error after the longest ring."""
    import torch

    bf = errors[torch.bfloat16]
    assert bf[-1] > 10 * bf[0] and bf[-1] > 1000 * errors[torch.float32][-1]
    corr = {p: ring_sum_error(p, torch.bfloat16, common=1.0) for p in ps}
    tenth = ring_sum_error(ps[-1], torch.bfloat16, common=0.1)
    print(f"In short (synthetic gradients, one draw): with independent ranks bf16's error grew "
          f"with the ring, from {pct2(bf[0])} of the sum after one hop to {pct2(bf[-1])} after "
          f"{ps[-1] - 1}.")
    print(f"With a gradient part shared by all ranks, as large as each rank's noise: "
          f"{pct2(corr[ps[-1]])} after {ps[-1] - 1} hops ({pct2(tenth)} if a tenth as large).")
    table = io.StringIO()
    with contextlib.redirect_stdout(table):
        ring_error_table(errors, ps, corr, tenth)
    show.fold("Per dtype and ring size p, and with a shared part at each p", table.getvalue(),
              pre=True)
    inv = 1 / torch.finfo(torch.bfloat16).eps
    with contextlib.redirect_stdout(io.StringIO()) as why:
        spacing_argument(inv)
    show.fold("Why a long bf16 ring rounds a shared part away", why.getvalue())
    fp16, bf16 = torch.finfo(torch.float16), torch.finfo(torch.bfloat16)
    if torch.float16 in errors:
        finer = bf16.eps / fp16.eps
        print(f"fp16 keeps {round(math.log2(finer))} more significant bits than bf16 (an eps "
              f"{finer:.0f}x finer); its error after {ps[-1] - 1} hops was "
              f"{bf[-1] / errors[torch.float16][-1]:.0f}x smaller. Its risk is range (below).")
    return corr[ps[-1]]


def ring_error_table(errors: dict, ps: list[int], corr: dict, tenth: float) -> None:
    """`explain_ring_errors`'s detail: each dtype's error per ring size, bf16's after the
    longest ring against one hop and fp32's, and bf16's with a shared part at each p."""
    import torch

    bf = errors[torch.bfloat16]
    print("Relative error of the ring sum, per dtype and ring size p:")
    for dt, errs in errors.items():
        print(f"{str(dt):15s}" + "".join(f"  p={p}: {e:.1e}" for p, e in zip(ps, errs)))
    print(f"bf16 (eps {torch.finfo(torch.bfloat16).eps:.1e}), synthetic Gaussian gradients, one "
          f"draw: an error of {pct2(bf[-1])} of the sum's norm")
    print(f"after {ps[-1] - 1} hops of a flat ring, against {pct2(bf[0])} after one (the cast of "
          f"each rank's values to bf16 and one rounded addition: the error is measured against "
          f"the exact sum of the unrounded values); fp32 after {ps[-1] - 1} hops: "
          f"{errors[torch.float32][-1]:.0e}.")
    print("Correlated ranks (a shared gradient as large as each rank's noise), bf16, the same "
          "synthetic draw:" + "".join(f"  p={p}: {pct2(e)}" for p, e in corr.items()))
    print(f"The ratio matters: with the shared part a tenth of each rank's noise, {pct2(tenth)} at "
          f"p={ps[-1]}, as the partial sum grows more slowly against one rank's values. A real "
          "model's ratio depends on its gradients and per-rank batch; it was not measured here.")


def spacing_argument(inv: float) -> None:
    """Why a shared part is rounded away: bf16's spacing near a partial sum against one
    rank's value, with a number example (`inv` = 1/eps)."""
    print(f"Why: near a partial sum S, bf16 numbers are S x eps/2 to S x eps apart, and an added "
          f"value rounds to whole steps of that spacing (to zero if under half of one). The "
          f"shared part grows S by about one rank's value per hop, so the spacing reaches that "
          f"value after about 1/eps = {inv:.0f} hops and two to four times it after "
          f"{2 * inv:.0f} to {4 * inv:.0f}: from there many added values round to zero and the "
          f"sum falls behind.")
    print(f"For example, with each rank adding 1: once S = {2 * inv:.0f} (after "
          f"{2 * inv - 1:.0f} hops, the first rank's 1 being the start), "
          f"where bf16's numbers are {2 * inv / inv:.0f} apart ({2 * inv:.0f} x eps); adding 1, "
          f"half a step, rounds to {2 * inv:.0f} again (ties go to the even neighbour), so the "
          "sum stops growing.")


def tree_vs_ring(ranks: int, per_node: int) -> str:
    """NCCL's estimate of its tree's depth, (ranks per node - 1) + log2(nodes) with log2
    rounded down as NCCL's log2i does, worked out for `ranks` GPUs at `per_node` per node,
    against the ranks - 1 roundings of a flat ring."""
    nodes = ranks // per_node
    return (f"{ranks} GPUs at {per_node} per node: {per_node - 1} + log₂ {nodes} = "
            f"{per_node - 1 + int(math.log2(nodes))}, against up to {ranks - 1} on the ring")


def real_cluster_text(ps: list[int], *, budget: int, powersgd_start: int) -> str:
    """The "On a real GPU cluster" box, a template for `facts.show`: which of NCCL's ring,
    tree and NVLS rounds most (the tree's depth and NVLS's condition folded); the reduction
    precision of Megatron-LM, torchtitan and FSDP2 (their flags and sources folded) and
    fp16's range; PowerSGD as published and torch's defaults against these runs
    (`powersgd_start` plain steps of `budget`)."""
    return f"""
- **What NCCL runs.** The longer the chain of 16-bit additions, the larger the error: NCCL's
  ring rounds most, its tree (a tree of ranks, [02b](02b_hierarchy_busbw_and_nccl.ipynb))
  less, NVLS (where the NVSwitch itself adds the GPUs' values; only on NVSwitch systems that
  support it) least within a node in CUDA ≥ 12.2 builds.
  Its bf16 sums are
  [[nccl.half_sum_rounds_each_add]]. Its ring at {ps[-1]} ranks, if the tuner picks it, is the
  flat ring above; its tree passes each value through far fewer additions; NVLS adds in fp32
  inside the switch (CUDA ≥ 12.2 builds; across nodes its tree rounds again). NCCL picks one per call by [[nccl.tuner_model]]
  ([02b](02b_hierarchy_busbw_and_nccl.ipynb), [02c](02c_in_network_reduction_and_nccl.ipynb)).
- **Reduction precision.** Megatron-LM (under `--bf16`) and torchtitan reduce gradients in
  fp32 by default, at twice a bf16 reduce's bytes; FSDP2 on its own reduces in bf16 under bf16
  mixed precision (flags and sources in the fold below). fp16 rounds finer but its range ends
  at [[fp16.max_finite]]: larger values become inf in the cast, and as torch's hook divides by the
  world size after the cast, in fp16, before the sum, small gradients can underflow to zero.
- **PowerSGD** as published: [[powersgd.paper]]. torch's hook keeps [[pytorch.powersgd_warm_start]]
  by default, and starts after [[pytorch.powersgd_start_iter]] of plain all-reduce; the runs above
  compressed after {powersgd_start} plain all-reduce steps of {budget}, essentially
  without that warm-up.

<details><summary>In detail: NCCL's tree and NVLS, and the reduction flags with their
sources</summary>

- **NCCL's tree** (a [[nccl.double_binary_tree]] across nodes, each tree carrying half the
  data, and a chain inside each node) rounds the deepest rank's value about
  [[nccl.tree_depth_estimate]] times (NCCL's depth estimate, which its own comment calls an
  approximation, of the longest path;
  {tree_vs_ring(ps[-1], 8)}), and up to about twice that, as a tree node adds its children's
  data to its own one at a time, rounding after each
  ([`reduceCopyPacks`](https://github.com/NVIDIA/nccl/blob/v2.30.7-1/src/device/common_kernel.h)).
- **NVLS** (NVLink SHARP: the NVSwitch itself adds the GPUs' values) sums them
  [[nccl.nvls_sum_acc_f32]] when NCCL is built with CUDA 12.2 or later, and rounds once in a
  node; across nodes, the NVLS tree's additions round again.
- **Megatron-LM**: [[megatron.grad_reduce_fp32]]. **torchtitan** reduces FSDP's gradients in
  [[torchtitan.reduce_fp32]] by default. **FSDP2** on its own reduces in the compute dtype
  (bf16 under bf16 mixed precision; [[pytorch.fsdp2_reduce_dtype]]).
</details>
"""  # noqa: E501 (Markdown shown verbatim)
