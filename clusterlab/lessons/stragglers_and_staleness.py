"""What notebook 05 reads from its runs: stragglers, backup workers, staleness and its fixes.

The experiments are in `clusterlab.experiments.staleness` (synchronous step times, backup
workers, an asynchronous parameter server with its fixes); the functions here turn their plain
data into the figures, the sentences and the verdicts the learner reads.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from clusterlab import facts, models
from clusterlab.experiments import staleness
from clusterlab.experiments.common import conclude
from clusterlab.lessons.show import details, fold, say

# --- one slow rank ----------------------------------------------------------------------------


def plot_slow_rank(even: dict, slow: dict, *, c: float) -> None:
    """The step times of 4 equal ranks and of the same ranks with one twice as slow, against
    c and 2c."""
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot(1e3 * even["step_s"], "o-", label="4 equal ranks")
    ax.plot(1e3 * slow["step_s"], "s-", label="rank 3 twice as slow")
    ax.axhline(1e3 * c, color="gray", ls=":", label="c")
    ax.axhline(2e3 * c, color="gray", ls="--", label="2c")
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms)")
    ax.legend()
    ax.set_ylim(bottom=0)
    ax.set_title("One slow rank sets the pace")
    plt.show()


def slow_rank_medians(even: dict, slow: dict) -> dict:
    """The median step of each run: a host spike in one step does not move them."""
    return {k: float(np.median(r["step_s"])) for k, r in (("even", even), ("slow", slow))}


def explain_slow_rank(even: dict, slow: dict, *, c_ms: float) -> None:
    """States whether one slow rank slowed the median step by most of its extra c (over 60%: the
    one threshold) and, when it did, prints the medians, what it added as a share of its extra c
    and the fast ranks' estimated idle share; checks that no median step ends before the slow
    rank's 2c."""
    c = c_ms / 1e3
    med = slow_rank_medians(even, slow)
    added = med["slow"] - med["even"]
    if conclude(added > 0.6 * c, "one slow rank slowed the median step by most of its extra c "
                "(over 60% of it): the step is the maximum, not the mean"):
        print(f"Median step: {1e3 * med['even']:.0f} ms with 4 equal ranks, "
              f"{1e3 * med['slow']:.0f} ms with one slow rank ({len(slow['step_s'])} steps each).\n"
              f"One slow rank added {1e3 * added:.0f} ms, {added / c:.0%} of its extra "
              f"c = {c_ms} ms.\nSo the fast ranks "
              f"idled roughly that long, about {added / med['slow']:.0%} of each step (estimated "
              "from the medians, not timed per rank).")
    assert med["slow"] > 0.97 * 2 * c  # the barrier: no step ends before the slow rank's 2c


# --- exponential compute times ----------------------------------------------------------------


def plot_straggler_curve(runs: list, sim: dict, *, c: float, m: float) -> None:
    """c + m·H_N against N, with the simulated means, the measured slowest sleeps (a check of
    the set-up) and the measured whole steps."""
    ns = np.array([r["nodes"] for r in runs])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    grid = np.unique(np.geomspace(1, 1024, 60).astype(int))
    ax.plot(grid, [1e3 * models.straggler_step(c, m, int(n)) for n in grid], "k-",
            label="c + m·H_N")
    ax.plot(sim["nodes"], 1e3 * sim["mean_step_s"], "x", ms=9, label="simulated (sampled draws)")
    ax.plot(ns, [1e3 * r["mean_slowest_s"] for r in runs], "o",
            label="check: slowest seeded sleep")
    ax.plot(ns, [1e3 * r["mean_step_s"] for r in runs], "s",
            label="measured: whole step (above the ● by the all-reduce and overhead)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks N")
    ax.set_ylabel("mean step (ms)")
    ax.set_title("The slowest of N exponentials")
    ax.legend(fontsize=8)
    plt.show()


def emulated_ring(runs: list) -> dict:
    """The emulated link's share of the all-reduce per N: a ring, 2(N-1) rounds of 100 µs for
    1 KiB."""
    return {r["nodes"]: models.ring_allreduce(r["nodes"], 4 * 256, 100e-6, 0.0) for r in runs}


def straggler_table(runs: list) -> None:
    """Prints, per N, c + m·H_N, the slowest sleep, the whole step and the all-reduce alone;
    checks that no sleep is shorter than its draw and no step ends before its slowest rank."""
    print(" N   c + m·H_N   slowest sleep   whole step   all-reduce alone")
    for r in runs:
        print(f"{r['nodes']:2d}{1e3 * r['model_s']:9.1f} ms{1e3 * r['mean_slowest_s']:13.1f} ms"
              f"{1e3 * r['mean_step_s']:10.1f} ms{1e3 * r['comm_s']:16.1f} ms")
        # a sleep is never shorter than its draw; no step ends before its slowest rank
        assert r["mean_slowest_s"] > 0.97 * r["sample_max_s"]
        assert r["mean_step_s"] > 0.97 * r["mean_slowest_s"]


def growth_sentence(runs: list) -> str:
    """The result in one sentence: whether the slowest seeded sleep followed c + m·H_N (its
    largest gap), and how the whole step grew from the smallest to the largest N against that
    prediction: about as predicted (within 20%), or more or less, and, when more and the host's
    overhead (whole step minus slowest sleep) grew by over half the excess, that overhead's
    growth beside this host's all-reduce timed alone (and what the emulated link's ring
    needs): on this host the step has a part that grows with N."""
    ring = emulated_ring(runs)
    off = max(abs(r["mean_slowest_s"] - r["model_s"]) / r["model_s"] for r in runs)
    first, last = runs[0], runs[-1]
    grew, predicted = last["mean_step_s"] - first["mean_step_s"], last["model_s"] - first["model_s"]
    n0, n1 = first["nodes"], last["nodes"]
    compute = (f"the slowest seeded sleep followed c + m·H_N (within {off:.0%} at every N)"
               if off < 0.15 else
               f"the slowest seeded sleep missed c + m·H_N by up to {off:.0%}")
    size = (f"{1e3 * grew:.1f} ms against {1e3 * predicted:.1f} ms predicted, from N = {n0} to "
            f"{n1}")
    if abs(grew - predicted) <= 0.2 * predicted:
        step = f"the whole step grew about as predicted ({size})"
    elif grew < predicted:
        step = f"the whole step grew less ({size})"
    else:
        step = f"the whole step grew more ({size})"
        over = [r["mean_step_s"] - r["mean_slowest_s"] for r in (first, last)]
        if over[1] - over[0] > 0.5 * (grew - predicted):
            step += (f": the host's overhead (whole step minus slowest sleep) grew "
                     f"{1e3 * over[0]:.1f} → {1e3 * over[1]:.1f} ms, "
                     + ("as the all-reduce timed alone grew" if last["comm_s"] > first["comm_s"]
                        else "while the all-reduce timed alone went")
                     + f" ({1e3 * first['comm_s']:.1f} → {1e3 * last['comm_s']:.1f} ms; "
                     f"the emulated link's ring needs {1e3 * ring[n1]:.1f} ms at N = {n1}): "
                     "on this host the step has a part that grows with N, on top of c + m·H_N")
    return f"{compute}; {step}."


def explain_straggler_growth(runs: list, sim: dict) -> None:
    """Prints the result in one sentence first (`growth_sentence`), then states the set-up check
    (the slowest seeded sleep within 15% of c + m·H_N at every N, with the largest gap and the
    steps per N); checks the simulator against the closed form."""
    off = max(abs(r["mean_slowest_s"] - r["model_s"]) / r["model_s"] for r in runs)
    # one line; the sleeps are seeded draws, so "within x%" checks the set-up, not the model
    print("In short: " + growth_sentence(runs) + f" ({len(runs[0]['step_s'])} steps per N)")
    if off >= 0.15:
        print("Set-up check failed: the slowest seeded sleep should follow c + m·H_N by "
              "construction; rerun on a quieter machine.")
    assert np.allclose(sim["mean_step_s"], sim["model_s"], rtol=0.05)


# --- backup workers ---------------------------------------------------------------------------


def plot_backups(bk: list) -> None:
    """Mean step against the backup workers b: c + m·(H_N − H_b), this sample's (N−b)-th draw
    and the measured step."""
    b = np.array([r["backups"] for r in bk])
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(b, [1e3 * r["predicted_s"] for r in bk], "k-o", label="c + m·(H_N − H_b)")
    ax.plot(b, [1e3 * r["sample_s"] for r in bk], "x", ms=9, label="(N−b)-th draw of this sample")
    ax.plot(b, [1e3 * r["mean_step_s"] for r in bk], "s", label="measured step")
    ax.set_xticks(b)
    ax.set_xlabel("backup workers b (of N = 8)")
    ax.set_ylabel("mean step (ms)")
    ax.legend(fontsize=8)
    ax.set_title("Backup workers cut off the tail")
    ax.set_ylim(bottom=0)
    plt.show()


def saving_se(r: dict, base: dict) -> float:
    """One standard error of the mean saving of run `r` against `base`: paired step by step
    when both ran the same number of steps (every b draws the same compute times), else
    unpaired."""
    a, b = np.asarray(base["step_s"]), np.asarray(r["step_s"])
    if len(a) == len(b):
        return float(np.std(a - b, ddof=1) / np.sqrt(len(a)))
    return float(np.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b)))


def backup_line(r: dict, base: dict) -> str:
    """One b's line: its step and spread and, for b > 0, what it saved against b = 0 with one
    standard error (and the prediction) and what became of the unused gradients."""
    line = (f"b={r['backups']}: step {1e3 * r['mean_step_s']:.1f} ± "
            f"{1e3 * np.std(r['step_s'], ddof=1):.1f} ms")
    if r is not base:
        saved = base["mean_step_s"] - r["mean_step_s"]
        predicted = base["predicted_s"] - r["predicted_s"]
        unused = r["backups"] * len(r["step_s"])   # b gradients per step are not used
        line += (f"; saved {1e3 * saved:.1f} ± {1e3 * saving_se(r, base):.1f} ms (predicted "
                 f"{1e3 * predicted:.1f} ms); of {unused} "
                 f"unused gradients, {r['cancelled']} were cut short"
                 + (f", {unused - r['cancelled']} finished too late and were discarded"
                    if unused >= r["cancelled"] else ""))
    return line


def backups_shortened(bk: list) -> bool:
    """Whether every b > 0 shortened the mean step, and the largest b saved at least half of
    what c + m·(H_N − H_b) predicts for it."""
    base = bk[0]
    return (all(r["mean_step_s"] < base["mean_step_s"] for r in bk[1:])
            and base["mean_step_s"] - bk[-1]["mean_step_s"]
            > 0.5 * (base["predicted_s"] - bk[-1]["predicted_s"]))


def within_se(bk: list) -> str:
    """How the savings of b > 0 compare with their predictions, in standard errors."""
    base = bk[0]
    off = [abs(base["mean_step_s"] - r["mean_step_s"] - (base["predicted_s"] - r["predicted_s"]))
           / max(saving_se(r, base), 1e-12) for r in bk[1:]]
    short = [base["mean_step_s"] - r["mean_step_s"] < base["predicted_s"] - r["predicted_s"]
             for r in bk[1:]]
    if all(o <= 1 for o in off) and all(short):
        return ("Every saving fell short of its prediction, each by less than one standard "
                f"error: {len(base['step_s'])} steps cannot tell a small bias from noise.")
    if all(o <= 1 for o in off):
        return "Every saving is within one standard error of its prediction."
    return (f"{sum(o <= 1 for o in off)} of {len(off)} savings are within one standard error of "
            f"their prediction, {sum(o <= 2 for o in off)} within two.")


def explain_backups(bk: list) -> None:
    """Prints each b's line (`backup_line`) with how to read them, checks that b = 0 cut nothing
    short and the largest b did, states whether every b > 0 shortened the step as predicted,
    and how far each saving is from its prediction in standard errors (`within_se`)."""
    base = bk[0]
    for r in bk:
        print(backup_line(r, base))
    above = [1e3 * (r["mean_step_s"] - r["sample_s"]) for r in bk]
    # A step's ± is the standard deviation over steps; a saving's ± is one standard error of it
    # (paired step by step: every b draws the same compute times).
    print(f"Each step is {min(above):.1f} to {max(above):.1f} ms above this sample's (N−b)-th "
          f"draw, overhead not timed apart here (the aggregator's messaging, the emulator, "
          f"the processes sharing this machine's cores; {len(base['step_s'])} steps per b, the "
          "same compute draws at every b).")
    # b = 0 waits for all; b > 0 cuts some short
    assert base["cancelled"] == 0 and bk[-1]["cancelled"] > 0
    conclude(backups_shortened(bk), f"every b > 0 shortened the step, and b = {bk[-1]['backups']} "
             "saved at least half of the saving m·H_b that c + m·(H_N − H_b) predicts for it")
    print(within_se(bk))


# --- stale gradients --------------------------------------------------------------------------


def tau_counts(r: dict) -> np.ndarray:
    """How many updates of one run had each staleness τ = 0, 1, ..., max τ."""
    taus = np.arange(int(r["tau"].max()) + 1)
    return np.bincount(r["tau"].astype(int), minlength=len(taus))


def plot_staleness(ps: dict) -> None:
    """The loss per applied update for each worker count (red: 4 workers' updates that raised
    it) and, for 4 workers, the updates per staleness τ with the fraction that raised the loss
    (drawn only where τ has at least 10 updates)."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
    for w, r in ps.items():
        ax1.semilogy(r["loss_after"], label=f"{w} worker(s), mean τ = {r['tau'].mean():.1f}")
    r4 = ps[4]
    up = np.flatnonzero(r4["loss_after"] > r4["loss_before"])
    ax1.semilogy(up, r4["loss_after"][up], "r.", ms=4, label="4 workers: loss went up")
    ax1.set_xlabel("update")
    ax1.set_ylabel("loss")
    ax1.legend(fontsize=8)
    ax1.set_title("Loss per applied update")
    taus = np.arange(int(r4["tau"].max()) + 1)
    n_tau = tau_counts(r4)
    enough = n_tau >= 10  # a fraction over fewer updates is noise: draw it only where n >= 10
    frac = np.array([np.mean(r4["loss_after"][r4["tau"] == t] > r4["loss_before"][r4["tau"] == t])
                     if n_tau[t] else np.nan for t in taus])
    ax2.bar(taus, n_tau, color="C0", alpha=0.6)
    for t in taus[n_tau > 0]:
        ax2.text(t, n_tau[t], str(n_tau[t]), ha="center", va="bottom", fontsize=7)
    ax2b = ax2.twinx()
    ax2b.plot(taus[enough], frac[enough], "ro", label="fraction that raised the loss (one run)")
    ax2b.set_ylim(0, 1)
    ax2b.legend(fontsize=8, loc="upper right")
    ax2.set_xlabel("staleness τ (4 workers)")
    ax2.set_ylabel("updates (count on each bar)")
    ax2b.set_ylabel("step-back fraction (τ with ≥ 10 updates)")
    ax2.set_title("Staleness and the step back")
    plt.tight_layout()
    plt.show()


def step_back_by_tau(r: dict, *, min_updates: int = 10) -> dict:
    """The share of a run's updates that raised the loss, per staleness τ with at least
    `min_updates` updates (the red dots of `plot_staleness`)."""
    n_tau = tau_counts(r)
    return {t: float(np.mean(r["loss_after"][r["tau"] == t] > r["loss_before"][r["tau"] == t]))
            for t in range(len(n_tau)) if n_tau[t] >= min_updates}


def explain_staleness(ps: dict) -> None:
    """Prints the result in one line first (the share of updates that raised the loss with 1 and
    4 workers, and how the 4 workers' loss ended), then 4 workers' updates per τ with the share
    of them that raised the loss (τ with at
    least 10 updates) and, per worker count, the mean and largest τ, the share of updates that
    raised the loss and the final loss; checks that one worker never steps back and converges
    while four, τ close to W − 1, step back and diverge."""
    n_tau = tau_counts(ps[4])
    one, four = ps[1], ps[4]
    ended = ("above its start: diverged" if four["final_loss"] > four["initial_loss"]
             else "below its start")
    print(f"In short: with 1 worker {one['step_back']:.0%} of updates raised the loss; with 4 "
          f"workers (mean τ {four['tau'].mean():.1f}) {four['step_back']:.0%} did, and the loss "
          f"ended at {four['final_loss']:.1e}, {ended} ({len(four['tau'])} updates per run).")
    print("4 workers, updates per τ: " + ", ".join(f"τ={t}: {c}" for t, c in enumerate(n_tau) if c)
          + f" ({n_tau[2:5].sum()} of {n_tau.sum()} in τ = 2–4)")
    print("  of them, raised the loss (red dots; τ with ≥ 10 updates): "
          + ", ".join(f"τ={t}: {round(f * n_tau[t])} of {n_tau[t]}"
                      for t, f in step_back_by_tau(ps[4]).items()))
    for w, r in ps.items():
        print(f"{w} worker(s): mean τ {r['tau'].mean():.2f} (max {int(r['tau'].max())} of "
              f"{len(r['tau'])} updates), "
              f"updates that raised the loss {100 * r['step_back']:.0f}%, "
              f"final loss {r['final_loss']:.2e} (start {r['initial_loss']:.2f})")
    assert (ps[1]["tau"] == 0).all() and ps[1]["step_back"] == 0
    assert 1.5 < ps[4]["tau"].mean() < 4.5 and ps[4]["step_back"] > 0.05  # τ close to W − 1
    # 4 diverge, 1 converges
    assert ps[4]["final_loss"] > ps[4]["initial_loss"] > ps[1]["final_loss"]


# --- stability of delayed gradient descent ----------------------------------------------------


def plot_stability(taus: list, measured: list, closed: list) -> None:
    """The largest stable a against τ (closed form, bisection, π/(2τ+1)), and x_t for τ = 3
    below, at and above the limit."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
    ax1.plot(taus, closed, "k-", label="2 sin(π/(4τ+2))")
    ax1.plot(taus, measured, "o", label="bisection (numerical check)")
    ax1.plot(taus[1:], [np.pi / (2 * t + 1) for t in taus[1:]], ":", label="π/(2τ+1)")
    ax1.set_xlabel("staleness τ")
    ax1.set_ylabel("largest stable a = ηλ")
    ax1.legend()
    ax1.set_ylim(0, 2.1)
    ax1.set_title("Stability limit of delayed GD")
    limit = models.delayed_gd_stable_step(3)
    for f in (0.8, 1.0, 1.2):
        ax2.plot(staleness.delayed_gd(f * limit, 3, 120), label=f"a = {f:.1f} × limit")
    ax2.set_ylim(-3, 3)
    ax2.set_xlabel("step t")
    ax2.set_ylabel("x_t")
    ax2.legend(fontsize=8)
    ax2.set_title("τ = 3: below, at and above the limit")
    plt.tight_layout()
    plt.show()


def stability_title(a: float, tau: int) -> str:
    """The explorer's title: a, τ, the fixed-delay limit and whether x_t converges."""
    lim = models.delayed_gd_stable_step(tau)
    return f"a = {a:.3f}, τ = {tau}: limit {lim:.3f} -> {'converges' if a < lim else 'diverges'}"


def explore_delayed_gd() -> None:
    """Sliders for a and τ over delayed gradient descent x_t (needs ipywidgets and a live
    Jupyter front-end); without ipywidgets, says to see the static figure."""
    try:
        import ipywidgets as widgets
    except ImportError:
        print("ipywidgets is not installed: see the static figure above")
        return

    def show(a=0.4, tau=3):
        x = staleness.delayed_gd(a, tau, 150)
        fig, ax = plt.subplots(figsize=(6, 2.8))
        ax.plot(x)
        ax.set_ylim(-3, 3)
        ax.set_title(stability_title(a, tau))
        plt.show()

    widgets.interact(show, a=widgets.FloatSlider(value=0.4, min=0.01, max=2.0, step=0.01),
                     tau=widgets.IntSlider(value=3, min=0, max=10))


# --- fixes for staleness ----------------------------------------------------------------------


def plot_fixes(fix: dict) -> None:
    """The fixes' figure: each run's loss (a diverging run stops where it leaves the plot, ▲),
    each run's largest τ, and the updates per second with the slow worker, plain against SSP."""
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 3.8))
    start = fix["plain (4 equal)"]["initial_loss"]
    top = 10 * start  # above this a run has diverged: say so instead of stretching the axis
    floor = max(1e-8, min(r["loss_after"].min() for r in fix.values()) / 2)
    for name, r in fix.items():
        loss_curve = r["loss_after"]
        out = np.flatnonzero(loss_curve > top)
        label = (f"{name}: diverges (final {r['final_loss']:.0e})" if r["final_loss"] > top
                 else name)
        shown = loss_curve.copy()
        if out.size:  # draw up to where the curve leaves the plot, and mark that point
            shown[out[0]:] = np.nan
        line, = ax1.semilogy(shown, label=label)
        if out.size:
            ax1.plot(out[0], top, "^", color=line.get_color(), ms=8)
    ax1.axhline(start, color="gray", ls=":", lw=1)
    ax1.set_ylim(floor, 1.5 * top)
    ax1.set_xlabel("update")
    ax1.set_ylabel("loss (clipped at 10 × start)")
    ax1.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    ax1.set_title("Convergence (▲ = left the plot)")
    names = list(fix)
    ax2.bar(range(len(names)), [r["tau"].max() for r in fix.values()])
    ax2.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax2.set_ylabel("largest τ (updates)")
    ax2.set_title("Staleness")
    pair = ["plain, slow worker", "SSP s=1, slow worker"]   # the comparison this panel is for
    ax3.bar(range(2), [fix[k]["updates_per_s"] for k in pair], color="C1")
    ax3.set_xticks(range(2), pair, rotation=30, ha="right", fontsize=8)
    ax3.set_ylabel("updates / s")
    ax3.set_title("Throughput with the slow worker\n(one run each)", fontsize=10)
    plt.tight_layout()
    plt.show()


def last_third_max(r: dict) -> float:
    """The largest loss over the last third of a run's updates."""
    return float(r["loss_after"][2 * len(r["loss_after"]) // 3:].max())


def unsettled(fix: dict) -> list:
    """The runs that ended below their initial loss although their loss rose above it in the
    last third of their updates: lower when they stopped, not converged."""
    return [n for n, r in fix.items()
            if r["final_loss"] < r["initial_loss"] < last_third_max(r)]


def delay_mix(run: dict) -> str:
    """'; the slow worker's n updates at mean τ x, the others' m at y' from the run's
    per-update workers (the slow one: the fewest updates), or '' without them."""
    if "worker" not in run:
        return ""
    worker, tau = np.asarray(run["worker"], dtype=int), np.asarray(run["tau"])
    ids, counts = np.unique(worker, return_counts=True)
    if len(ids) < 2:
        return ""
    slow = worker == ids[counts.argmin()]
    return (f"; the slow worker's {slow.sum()} updates at mean τ {tau[slow].mean():.1f}, the "
            f"others' {(~slow).sum()} at {tau[~slow].mean():.1f}")


def row_three_sentence(fix: dict) -> str:
    """How to read *plain, slow worker* beside *plain (4 equal)*: the same mean τ, and whether
    the two runs ended alike. A converged slow-worker run beside a diverged equal one is the
    section's thesis (the delay pattern decides, not only τ), from one unasserted run each:
    the slow worker's τ beside the others' (`delay_mix`), why it may not diverge labelled a
    reading."""
    eq, slow = fix["plain (4 equal)"], fix["plain, slow worker"]
    tau = f"mean τ {slow['tau'].mean():.1f}, against {eq['tau'].mean():.1f} for *plain (4 equal)*"
    ok = {n: r["final_loss"] < r["initial_loss"] and n not in unsettled(fix)
          for n, r in (("eq", eq), ("slow", slow))}
    if ok["slow"] and not ok["eq"]:
        swung = last_third_max(slow) > 10 * slow["final_loss"]
        return (f"Read *plain, slow worker*: {tau}, yet it fell overall"
                + (f", with large swings over its last third (up to {last_third_max(slow):.1e}, "
                   f"final {slow['final_loss']:.1e})" if swung else "")
                + f": its delays are spread differently (max τ {int(slow['tau'].max())} against "
                f"{int(eq['tau'].max())}{delay_mix(slow)}). Our reading, not tested here: the "
                "fixed-delay limit assumes one τ for every gradient, and this mix of small and "
                "large τ happened not to diverge, so mean τ alone does not decide stability (SSP "
                "shows it more sharply next). One run each, so not a rule; below it is SSP's "
                "baseline (the same slow worker, no bound).")
    outcome = ("both converged" if ok["slow"] and ok["eq"] else
               "neither converged" if not (ok["slow"] or ok["eq"]) else
               "the equal run converged, the slow one did not")
    return f"Read *plain, slow worker*: {tau}; {outcome} (one run each)."


def explain_fixes(fix: dict) -> None:
    """Prints each fix run's mean and largest τ, step-back share, final loss and largest loss
    over its last third, with what those columns mean (and the updates each max is over), names
    the runs that ended below the start yet rose above it in that third, and checks what each
    fix must do: the τ + 1 step converges with fewer step-backs, SSP bounds τ and costs
    updates per second, SSP + τ + 1 converges, and mean τ = W − 1 by counting."""
    print(f"{'run (one each)':26s}{'mean τ':>7s}{'max τ':>7s}{'step back':>11s}{'final loss':>12s}"
          f"{'max, last third':>17s}")
    for name, r in fix.items():
        print(f"{name:26s}{r['tau'].mean():7.1f}{int(r['tau'].max()):7d}{r['step_back']:11.0%}"
              f"{r['final_loss']:12.1e}{last_third_max(r):17.1e}")
    n = {len(r["tau"]) for r in fix.values()}
    n_txt = " or ".join(map(str, sorted(n)))
    print(f"max τ: the largest of each run's {n_txt} updates; step back: the share of them that "
          "raised the loss; max, last third: the largest loss over the last third of its updates "
          "(a run that ends low but rose there has not converged).")
    for name in unsettled(fix):
        print(f"{name}: ended below the start ({fix[name]['initial_loss']:.2f}) but rose to "
              f"{last_third_max(fix[name]):.1e} in its last third: not converged, only low when "
              "it stopped.")
    print(row_three_sentence(fix))
    plain_slow, ssp = fix["plain, slow worker"], fix["SSP s=1, slow worker"]
    print(f"SSP's price: {plain_slow['updates_per_s']:.0f} → {ssp['updates_per_s']:.0f} updates/s "
          "with the slow worker (one run each; the figure's bars).")
    assert fix["τ+1 step (4 equal)"]["final_loss"] < fix["plain (4 equal)"]["final_loss"]
    assert fix["τ+1 step (4 equal)"]["step_back"] < fix["plain (4 equal)"]["step_back"]
    assert fix["SSP s=1, slow worker"]["tau"].max() < fix["plain, slow worker"]["tau"].max()
    assert fix["SSP s=1, slow worker"]["updates_per_s"] < fix["plain, slow worker"]["updates_per_s"]
    assert fix["SSP s=1 + τ+1 step, slow"]["final_loss"] < fix["SSP s=1, slow worker"]["final_loss"]
    assert (fix["SSP s=1 + τ+1 step, slow"]["final_loss"]
            < fix["SSP s=1 + τ+1 step, slow"]["initial_loss"])
    for r in fix.values():  # mean τ = W − 1 by counting (see below), whatever the speeds
        if r["fix"] in (None, "scale"):
            assert r["tau"].sum() + staleness.in_flight_staleness(r) == 3 * len(r["tau"])


def explain_ssp_alone(fix: dict, *, lr: float) -> None:
    """States whether SSP s=1 alone diverged with a smaller mean τ than plain async with the
    same slow worker and, when it did, prints its losses and both mean τ."""
    ssp, plain = fix["SSP s=1, slow worker"], fix["plain, slow worker"]
    if conclude(ssp["final_loss"] > ssp["initial_loss"] and ssp["tau"].mean() < plain["tau"].mean(),
                f"SSP s=1 alone diverged at a = {lr} with a smaller mean τ than plain async with "
                "the same slow worker"):
        print(f"SSP s=1 alone diverged at a = {lr} (loss {ssp['initial_loss']:.2f} -> "
              f"{ssp['final_loss']:.0e}) with mean τ {ssp['tau'].mean():.1f}, below the "
              f"{plain['tau'].mean():.1f} of plain async with the same slow worker.")


def print_shared(shared: dict) -> None:
    """Prints, per run, how many versions several workers pulled at once and the share of the
    gradients computed on one (`staleness.shared_versions`)."""
    for n, g in shared.items():
        print(f"{n}: {g['shared']} versions were pulled by several workers at once; "
              f"{g['in_shared']:.0%} of the gradients came from one (typically {g['typical']} "
              "per version)")


def plot_ssp(fix: dict, ssp_lr: dict, *, k: int, lr: float) -> None:
    """The loss of SSP s=1 at a = `lr` and at each a of `ssp_lr` (first seed), labelled with
    k·a, against the initial loss."""
    fig, ax = plt.subplots(figsize=(7, 3))
    for a, r in [(lr, fix["SSP s=1, slow worker"]), *((a, rs[0]) for a, rs in ssp_lr.items())]:
        ax.semilogy(np.minimum(r["loss_after"], 1e6),
                    label=f"SSP s=1, a = {a}: {k}·a = {k * a:.2f}")
    ax.axhline(fix["SSP s=1, slow worker"]["initial_loss"], color="gray", ls=":", lw=1)
    ax.set_xlabel("update")
    ax.set_ylabel("loss (clipped at 1e6)")
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(f"SSP releases {k} workers on one version: stable only while {k}·a < 2")
    plt.show()


def k_a_matches(rs: list, *, k: int, a: float) -> int:
    """In how many runs k·a predicted the outcome: the loss grew exactly when k·a > 2."""
    grew = [r["final_loss"] > r["initial_loss"] for r in rs]
    return sum(g == (k * a > 2) for g in grew)


def separating_tau(lo: float, hi: float, *, max_tau: int = 1000) -> int | None:
    """The first whole τ whose fixed-delay limit lies in (lo, hi]: a τ rule that calls a = lo
    stable and a = hi unstable; None when no τ up to `max_tau` does."""
    return next((t for t in range(max_tau + 1)
                 if lo < models.delayed_gd_stable_step(t) <= hi), None)


def no_tau_between(lo: float, hi: float) -> str:
    """Says that no whole τ has its fixed-delay limit between lo and hi, with the two limits
    either side of them."""
    t = next(t for t in range(1001) if models.delayed_gd_stable_step(t) <= hi)
    if t == 0:   # hi is at or above the synchronous limit: every τ calls both unstable
        return f"Every whole τ's fixed-delay limit is at or below a = {lo} and {hi}."
    return (f"No whole τ has its fixed-delay limit between a = {lo} and {hi} (τ = {t - 1}: "
            f"{models.delayed_gd_stable_step(t - 1):.3f}, τ = {t}: "
            f"{models.delayed_gd_stable_step(t):.3f}), so no fixed-delay rule tells the two "
            "apart.")


def explain_ssp_lockstep(ssp_lr: dict, shared: dict, *, seeds) -> None:
    """For each a: k·a, the mean and largest τ and how many seeds ended above their initial
    loss; then states whether SSP released the workers in
    lockstep in every run and, if so, whether k·a predicted the outcome for most seeds (or
    every run), with the count of runs it predicted, and whether any whole τ's fixed-delay
    limit could have told the smallest and largest a apart (`separating_tau`); the lockstep
    measured per seed goes into a fold."""
    k = shared["SSP s=1, slow worker"]["typical"]
    # the lockstep, measured on every run judged below, not only on the a = 0.7 run above
    lock = {a: [staleness.shared_versions(r) for r in rs] for a, rs in ssp_lr.items()}
    matches = {}
    for a, rs in ssp_lr.items():
        grew = [r["final_loss"] > r["initial_loss"] for r in rs]
        matches[a] = k_a_matches(rs, k=k, a=a)
        mean_t, max_t = np.mean([r["tau"].mean() for r in rs]), max(int(r["tau"].max()) for r in rs)
        print(f"a = {a}; {k}·a = {k * a:.2f}; over {len(rs)} seeds: mean τ {mean_t:.1f}, "
              f"max τ {max_t} of {sum(len(r['tau']) for r in rs)} updates; {sum(grew)} ended "
              "above their initial loss, "
              f"{len(rs) - sum(grew)} below it")
    judged = [g for gs in lock.values() for g in gs]
    # one worker per version: nothing released together
    assert shared["plain, slow worker"]["shared"] == 0
    lockstep = (shared["SSP s=1, slow worker"]["in_shared"] > 0.8 and k >= 2
                and all(g["in_shared"] > 0.8 and g["typical"] == k for g in judged))
    # mostly lockstep, not exactly: k gradients of one version are one step of k·a for the
    # gradients that shared a version, so the prediction should hold for most seeds (checked
    # only once the lockstep is shown)
    n_match, n_runs = sum(matches.values()), len(seeds) * len(matches)
    if (conclude(lockstep, f"SSP released the workers in lockstep in every run (over 80% of the "
                 f"gradients from a version {k} workers typically pulled at once), so the k·a "
                 "prediction can be checked")
            and conclude(all(m > len(seeds) / 2 for m in matches.values()),
                         f"{k}·a predicted the outcome "
                         + ("in every run" if n_match == n_runs else "for most seeds")
                         + f" at both step sizes ({n_match} of {n_runs} runs)")):
        print("In those runs "
              f"{min(g['in_shared'] for g in judged):.0%} to "
              f"{max(g['in_shared'] for g in judged):.0%} of the gradients shared a version"
              + (" (not exact lockstep)" if min(g["in_shared"] for g in judged) < 1 else "")
              + (f". {no_tau_between(min(ssp_lr), max(ssp_lr))} The lockstep pattern ({k}·a), "
                 "not τ, predicted the outcome."
                 if separating_tau(min(ssp_lr), max(ssp_lr)) is None
                 else f": the lockstep pattern ({k}·a) predicted the outcome."))
    fold("Per seed: the share of gradients from a version several workers pulled",
         "\n".join(f"a = {a}: " + ", ".join(f"{g['in_shared']:.0%} (typically {g['typical']} per "
                                             "version)" for g in gs) for a, gs in lock.items()))


# --- on a real GPU cluster --------------------------------------------------------------------

REAL_CLUSTER = """
- **Large-model pre-training as published is synchronous** (for example Llama 3's:
  [[meta.llama3_synchronous]]), pipeline schedules with a flush (every micro-batch finishes
  before the weights update: 1F1B, Megatron's interleaved one) included.
- **Persistent stragglers** cost their whole slowdown every step, as in the first experiment,
  until found and evicted: hardware that keeps working but slowly (Llama 3:
  [[meta.llama3_stragglers]]). Transient stalls (GC, data loading) cost the maximum over ranks
  instead (m·H_N only if they are independent exponentials, as assumed here).
- **Backup workers need an aggregator** ([[paper.chen2016_backup_workers]]); Chen et al. report
  that synchronous SGD with backups converged faster, and to better test accuracy, than
  asynchronous training. In an all-reduce job [[nccl.collective_every_rank]]: leaving a rank out
  takes a new communicator or an aggregation tier (more below).
- **Find the straggler and evict it** (hot spares): time every rank's compute, data loading and
  collectives; a slow-*compute* rank waits *least* in the collective, so a profile shows long
  all-reduce time on the *fast* ranks ("NCCL is slow" is often a compute straggler); a slow
  *link* stretches it on every rank of its ring.
"""
"""What carries over to a real GPU cluster, each constant cited from the ledger: shown with
`facts.show(REAL_CLUSTER)` in the notebook's "On a real GPU cluster" section."""

REAL_CLUSTER_MORE = """
- **Leaving a rank out**: an elastic restart, or [[nccl.comm_shrink]] in the running job;
  research partial collectives ([[paper.eager_sgd_partial_collectives]]) let fast ranks go on
  without the slow ones.
- **Straggler tools**: Megatron-LM's [[megatron.straggler_detector]] reports, per logging
  interval, the slowest and fastest rank's step time, beside GPU power, temperature and clocks
  (its README has the exact fields).
- **Drift is no rank to evict**: it slows the whole job ([[meta.llama3_diurnal_throughput]],
  from mid-day temperatures acting on GPU clocks).
- **Many synchronisations per step**: with FSDP, tensor or pipeline parallelism the ranks wait
  on each other many times per step (tensor parallelism without sequence parallelism:
  [[megatron.tp_allreduces_per_layer]] per layer and micro-batch; sequence parallelism turns
  each into an all-gather and a reduce-scatter), so the maximum is taken per segment between
  synchronisations, not once per step.
- **Causes**: GC at different moments on different ranks ([[megatron.manual_gc]] aligns it;
  [[python.gc_freeze]] exempts long-lived objects); data-loader stalls; power or thermal capping
  ([[nvidia.nvml_clock_event_reasons]]); a PCIe link trained down ([[nvidia.nvml_pcie_link]]); a
  bad NIC or cable.
- **Delay on purpose**: PipeDream's asynchronous 1F1B, with no flush
  ([[paper.pipedream_weight_stashing]] keeps a micro-batch's forward and backward on one
  weight version); asynchronous RL's
  policy lag, corrected by IMPALA's [[paper.impala_vtrace]]; SSP ([[paper.ssp_ho2013]]).
- **Infrequent synchronisation is not asynchrony**: local SGD ([[paper.local_sgd_stich2018]])
  and DiLoCo ([[paper.diloco]]) average replicas that drifted for H local steps, every replica
  joining each average: no gradient is applied to a later version, so the τ limit does not carry
  over directly.
"""
"""The rest of the real-cluster box, for the expert reader: shown folded by
`show_more_real_cluster`."""


def show_more_real_cluster() -> None:
    """Shows `REAL_CLUSTER_MORE`, cited from the ledger with its own sources, behind one fold."""
    say(details("More: evicting ranks, straggler tooling, drift, FSDP/TP, causes, deliberate "
                "asynchrony",
                facts.render(REAL_CLUSTER_MORE, one_per_source=True)))
