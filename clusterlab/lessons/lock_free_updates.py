"""What `notebooks/06b_lock_free_updates.ipynb` reads from its runs.

The experiments are `clusterlab.experiments.races`; each function here turns one cell's runs
into the figure and the sentences the learner reads, and checks what the text claims.
"""

from __future__ import annotations

import os

import numpy as np

from ..experiments.common import conclude
from .show import fold, say

MODES = ("writeback", "inplace", "lock", "seqlock")
COLORS = {"writeback": "C3", "inplace": "C1", "lock": "C2", "seqlock": "C0"}
NAME = {"writeback": "write-back", "inplace": "in place", "lock": "lock", "seqlock": "seqlock"}
# Markers and dashes that tell the modes apart where their lines coincide.
STYLE = {"writeback": {"marker": "o", "ls": "-"}, "inplace": {"marker": "s", "ls": "--"},
         "lock": {"marker": "^", "ls": "-"}, "seqlock": {"marker": "x", "ls": ":"}}


# --- Hogwild-style updates ----------------------------------------------------------------------

def time_slice_here() -> float | None:
    """This kernel's default time slice in ms, by the ledger's linux.eevdf_base_slice (0.70 ms
    x (1 + ilog2 of the online CPUs, at most 8), Linux 6.15 and later; None on another
    system or an older kernel)."""
    import platform
    import re

    m = re.match(r"(\d+)\.(\d+)", platform.release())
    if platform.system() == "Linux" and m and (int(m[1]), int(m[2])) >= (6, 15):
        return 0.70 * (1 + int(np.log2(min(os.cpu_count() or 1, 8))))
    return None


def plot_lost_updates(rep: dict, runs: dict) -> None:
    """Bar chart of the counter increments lost on the dense problem (the proxy for lost
    coordinate updates): write-back and in place
    with 2 and 4 workers (median, min-max over the seeds of `rep`), lock and seqlock (one run
    each in `runs`), with (W - 1)/W dashed over the write-back bars."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3))
    names = ["write-back,\n2 workers", "write-back,\n4 workers", "in place,\n2 workers",
             "in place,\n4 workers", "lock,\n4 workers", "seqlock,\n4 workers"]
    vals = [[r["lost_fraction"] for r in rep[m, w]] for m in ("writeback", "inplace")
            for w in (2, 4)]
    vals += [[runs["dense", "lock"]["lost_fraction"]], [runs["dense", "seqlock"]["lost_fraction"]]]
    med = [100 * np.median(v) for v in vals]
    ax.bar(names, med, color=["C3", "C3", "C1", "C1", "C2", "C0"],
           yerr=[np.subtract(med, [100 * min(v) for v in vals]),
                 np.subtract([100 * max(v) for v in vals], med)],
           capsize=3)
    for k, m_ in enumerate(med):  # inside a tall bar, above a short one
        ax.text(k, m_ / 2 if m_ > 10 else m_ + 1, f"{m_:.2g}%", ha="center", fontsize=8,
                color="white" if m_ > 10 else "black")
    ax.hlines([50, 75], [-0.4, 0.6], [0.4, 1.4], colors="k", linestyles="--",
              label="(W − 1)/W: all W workers at once")
    p2, p4 = (np.median([r["parallelism"] for r in rep["writeback", w]]) for w in (2, 4))
    ax.set_ylabel("counter increments lost (%)")
    ax.set_title(f"Dense problem: median, min-max of {len(rep['writeback', 2])} runs "
                 f"(lock, seqlock: 1 run); write-back workers at once (median): {p2:.2f} of 2, "
                 f"{p4:.2f} of 4")
    ax.legend(fontsize=8)
    plt.show()


def far_above_median(losses: list) -> bool:
    """Whether the worst in-place run lost more than 10 times the median (at least 1)."""
    return max(losses) > 10 * max(np.median(losses), 1)


def _beside(losses: list, predicted: float) -> str:
    """Where a range of lost fractions ended against a prediction, in points, computed from
    the whole percentages the reader sees beside it (so 48-49% against 48% is 0-1 points)."""
    lo, hi = (round(100 * x) - round(100 * predicted) for x in (min(losses), max(losses)))
    if lo > 0 or (lo == 0 and hi > 0):
        return (f"{lo} point{'s' * (lo != 1)} above it" if lo == hi
                else f"{lo}-{hi} points above it")
    if hi < 0 or (hi == 0 and lo < 0):
        return (f"{-hi} point{'s' * (hi != -1)} below it" if lo == hi
                else f"{-hi}-{-lo} points below it")
    return "on both sides of it" if lo < 0 < hi else "at it"


def explain_lost_updates(rep: dict, runs: dict, *, problem, cores: int) -> None:
    """How much write-backs and in-place adds lost over the seeds of `rep` (2 and 4 workers;
    `rep[m, w][k]` ran with seed k), beside the one-run write-back, lock and seqlock in `runs`
    (the write-back with the settings and seed of `rep["writeback", 4][0]`), how many workers
    really ran at once on `cores` cores, what a far-out in-place run or too few workers at
    once means, and how long a time slice is (a sourced note); asserts that every 4-worker
    write-back lost, the lock and seqlock lost nothing, and in place lost far less than
    write-back."""
    from .. import facts

    lost = {k: [r["lost_fraction"] for r in v] for k, v in rep.items()}
    par = {(m, w): np.median([r["parallelism"] for r in rep[m, w]])
           for m in ("writeback", "inplace") for w in (2, 4)}
    n_runs = len(lost["writeback", 2])
    # (p - 1)/p with p the workers measured at once: what all-at-once predicts for this run
    meas = {w: (par["writeback", w] - 1) / par["writeback", w] if par["writeback", w] > 1 else 0.0
            for w in (2, 4)}
    above = [w for w in (2, 4) if min(lost["writeback", w]) > meas[w] + 0.05]
    # The headline: the losses against (W - 1)/W, and in place's worst run. Everything that
    # explains the gap (workers at once, pauses, run-to-run spread) goes in the fold below.
    print(f"Write-backs lost {min(lost['writeback', 2]):.0%}-{max(lost['writeback', 2]):.0%} "
          f"with 2 workers and {min(lost['writeback', 4]):.0%}-{max(lost['writeback', 4]):.0%} "
          f"with 4 ({n_runs} runs each), against (W - 1)/W = 50% and 75% if all W ran at once.")
    par_in = min(par["inplace", w] for w in (2, 4))
    in_runs = [(r["lost"], w) for w in (2, 4) for r in rep["inplace", w]]
    in_lost = [lost for lost, _ in in_runs]
    worst_w = max(in_runs)[1]  # the worker count of the run that lost the most
    expected = rep["inplace", 4][0]["expected"]
    print(f"In place lost at most {max(in_lost) / expected:.3%} of the counter increments "
          f"({max(in_lost):,} of {expected:,}, {rep['inplace', 4][0]['updates']:,} updates × "
          f"{problem.nnz} coordinates, in its worst run, with {worst_w} workers); lock and "
          "seqlock lost "
          f"{runs['dense', 'lock']['lost']} and {runs['dense', 'seqlock']['lost']}.")
    if par_in <= 1.3:
        print(f"In place ran only {par_in:.2f} workers at once at best: too few to test its race "
              "here (the cost runs below count it with overlapping workers).")
    in_med = {w: np.median([r["lost"] for r in rep["inplace", w]]) for w in (2, 4)}
    detail = (
        f"Workers at once on {cores} cores (CPU seconds ÷ wall seconds): write-back "
        f"{par['writeback', 2]:.2f} and {par['writeback', 4]:.2f}, in place "
        f"{par['inplace', 2]:.2f} and {par['inplace', 4]:.2f}. A rough heuristic, (p − 1)/p "
        f"with p the workers at once (an average, not workers running throughout), gives "
        f"{meas[2]:.0%} and {meas[4]:.0%} for the write-backs; "
        + ", ".join(f"the {w}-worker losses ended {_beside(lost['writeback', w], meas[w])}"
                    for w in (2, 4))
        + (". A worker paused mid-update erases more (a hypothesis, not measured: below)."
           if above else ".")
        + f"\n\nIn place lost a median of {in_med[2]:,.0f} increments with 2 workers and "
        f"{in_med[4]:,.0f} with 4"
        + (": the worst run is far above the median, so in-place losses vary a lot from run "
           "to run. Two adds colliding on an element, or a worker paused between its load and "
           "store, each lose increments; these runs do not tell which happened."
           if far_above_median(in_lost) else ".")
        + "\n\n")
    rerun = "" if rep["writeback", 4][0] is runs["dense", "writeback"] else (
        f"The one-run dense write-back (seed 0, its loss printed in the next section) lost "
        f"{runs['dense', 'writeback']['lost_fraction']:.0%}, the same settings and seed "
        f"rerun here {rep['writeback', 4][0]['lost_fraction']:.0%}: only the scheduling "
        "differs between them.\n\n")
    p4 = par["writeback", 4]
    pause_note = ""  # how many ran at once against the 4-worker losses: folded with the slices
    if p4 < 1:
        print("Fewer than one write-back worker ran at a time on average (why they still lost "
              "updates: the fold below).")
        pause_note = (
            "\n\nOn this run fewer than one write-back worker ran at a time on average. An "
            "average cannot tell how often two ran together (at the staggered start and finish, "
            "say, or while other load let up), so these runs cannot tell how much of the loss "
            "that caused; the losses fit workers the scheduler paused between read and "
            "write-back (not measured apart here): paused in turn, each resumed worker erases "
            "the others' slices, about (W - 1)/W again, for a different reason.")
    slice_ms = time_slice_here()
    here = "" if slice_ms is None else (
        f"; with this kernel's {os.cpu_count()} online CPUs (the count it scales by, which "
        f"can exceed the cores this notebook may use) {slice_ms:.1f} ms, or up to a scheduler "
        "tick more (the slice ends on a tick: 4 ms at HZ=250), about the stretch a paused "
        "worker can erase")
    say("<details><summary>Why the losses are not (W − 1)/W: workers at once, pauses and "
        "time slices</summary>\n\n"
        + detail + rerun
        + "Shared cores add a second route to lost updates: the scheduler runs each process "
        "for a **time slice**, then switches, and a worker paused inside its read-to-write "
        "window erases, when it resumes, the others' whole slices: in that picture about "
        "(W − 1)/W again (not measured apart here).\n\n"
        + facts.render("A worker waiting for a core waits, roughly, for the others' time "
                       "slices (the scheduler also weighs each task's lag and deadline, so this "
                       "is an order of magnitude, not a rule), on mainline Linux 6.15 and "
                       f"later by default [[linux.eevdf_base_slice]]{here}.")
        + pause_note + "\n\n</details>")
    assert all(r["lost"] > 0 for r in rep["writeback", 4])
    assert runs["dense", "lock"]["lost"] == 0 and runs["dense", "seqlock"]["lost"] == 0
    for w in (2, 4):  # in place, only the one-element load-to-store window loses increments
        assert np.median(lost["inplace", w]) < np.median(lost["writeback", w]) / 20


# --- Reads of mixed versions --------------------------------------------------------------------

def explain_mixed_reads(runs: dict) -> None:
    """How many dense write-backs (4 workers, one run) computed from a read the stamps
    flagged, set against the counter increments lost (in place beside them: flags measure
    overlap, not damage), and how many reads the seqlock retried; why so many retries per read, when
    there are (a sourced note); asserts that the lock saw no flagged read and that the seqlock
    never computed from one (that no unflagged read mixed versions holds by construction, on
    x86: the appendix's memory-ordering note)."""
    from .. import facts

    wb, sq, lk = (runs["dense", m] for m in ("writeback", "seqlock", "lock"))
    print(f"Dense, 4 workers, one run each: write-backs computed {wb['mixed_reads']:,} of "
          f"{wb['updates']:,} updates ({wb['mixed_reads'] / wb['updates']:.1%}) from a read the "
          f"stamps flagged; lock {lk['mixed_reads']}.")
    import platform

    x86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
    print(f"The seqlock: {sq['retried_reads']:,} of {sq['updates']:,} updates had to re-read "
          f"({sq['retries']:,} retries in all), and it computed only from reads its check "
          "passed" + ("." if x86 else " (on this host the check also needs the memory barriers "
                                     "the appendix names)."))
    ip = runs["dense", "inplace"]
    share, ip_share = wb["mixed_reads"] / wb["updates"], ip["mixed_reads"] / ip["updates"]
    # The headline and the conclusion on the main path; why flags and losses differ, folded.
    print(f"Checked against the prediction: updates from a flagged read, in place {ip_share:.1%}, "
          f"write-backs {share:.1%}; counter increments lost, in place "
          f"{ip['lost_fraction']:.2%}, write-backs {wb['lost_fraction']:.1%}.")
    print("Flagged reads show overlap, not lost updates: an in-place add that overlaps another "
          "still lands.")
    fold("Why flags and losses differ",
         "A flag needs stamps that disagree at the read: a write in flight during the short "
         "read, or stamps two unlocked writes left mixed. A write-back's loss needs a write "
         "anywhere in its longer read-to-write window. On the dense problem a read is also "
         "flagged when its coordinates carry different updates' stamps, which two unlocked "
         "writes can leave behind. In place's reads overlap writes too"
         + (" (more often than the write-backs' on this run; a likely cause, not measured "
            "apart: its element-by-element writes, np.subtract.at, take longer than a "
            "write-back's one store, so more reads meet one in flight)" if ip_share > share
            else " (less often than the write-backs' on this run)")
         + ", but its adds lose almost nothing to an overlap.")
    if sq["retries"] > 100 * max(sq["retried_reads"], 1):
        facts.show("So many retries per read suggest a writer was paused mid-write (descheduled) "
                   "while readers spun on its half-written stamps; that is why Linux rules: "
                   "[[linux.seqlock_writer_not_preempted]].")
    assert lk["mixed_reads"] == 0
    assert sq["retries"] == sq["mixed_reads"]  # the seqlock never computes from a flagged read
    assert (sq["retries"] > 0) == (sq["retried_reads"] > 0)
    assert sq["retried_reads"] <= sq["updates"]


# --- Sparse and dense problems ------------------------------------------------------------------

def plot_convergence(runs: dict) -> None:
    """Loss / initial loss against updates done (dense write-back, in place (marked: it lies
    under the lock's curve) and lock; sparse write-back and lock)."""
    import matplotlib.pyplot as plt

    fig, ax1 = plt.subplots(figsize=(6, 3.2))
    label = {"writeback": "write-back, no lock", "inplace": "in place, no lock (circles)",
             "lock": "lock"}
    for name, mode, ls in (("dense", "writeback", "-"), ("dense", "inplace", "-."),
                           ("dense", "lock", "--"), ("sparse", "writeback", "-"),
                           ("sparse", "lock", "--")):
        r = runs[name, mode]
        ax1.semilogy(r["curve_updates"], r["curve_loss"] / r["initial_loss"], ls,
                     marker="o" if mode == "inplace" else None, markevery=4, markersize=4,
                     label=f"{name}, {label[mode]}")
    ax1.set_xlabel("updates done")
    ax1.set_ylabel("loss / initial loss")
    ax1.legend(fontsize=8)
    ax1.set_title("Convergence")
    plt.tight_layout()
    plt.show()


def hit_chance(problem) -> float:
    """The chance that an update on a uniformly drawn example touches a given coordinate of
    another update, averaged over the coordinates updates write: mean n_j / examples, n_j the
    examples touching coordinate j. 1 on the dense problem; on the sparse one above nnz / dim,
    since a few thousand examples are drawn again and again and one may be drawn twice."""
    n = np.bincount(np.ravel(problem.idx), minlength=problem.dim)
    return float(n[problem.idx].mean() / problem.examples)


def explain_convergence(runs: dict, *, problem, sparse, rep: dict | None = None) -> None:
    """The lost fractions and final-loss ratios (without / with a lock) on the dense and
    sparse problems, folded: the chance that an overlapping update touches a given coordinate
    of the `sparse` problem and the updates its write-backs found landed on their first
    coordinate between read and write (age_mean, measured; with the raw count), and the
    verdict that it was still converging over its last third (with `rep`, the lost-updates
    section's runs, the range of their in-place losses beside this run's); asserts the
    conflicts' gap, that the sparse problem trained, and the loss ratios."""
    d, s = runs["dense", "writeback"], runs["sparse", "writeback"]
    ratio = {n: runs[n, "writeback"]["final_loss"] / runs[n, "lock"]["final_loss"]
             for n in ("dense", "sparse")}
    hit = hit_chance(sparse)
    print(f"Write-backs lost: dense {d['lost_fraction']:.1%}, sparse "
          f"{s['lost_fraction']:.2%} (one run each).")
    if ("sparse", "inplace") in runs:
        print(f"Plain (non-atomic) in-place adds lost: dense "
              f"{runs['dense', 'inplace']['lost_fraction']:.2%}, sparse "
              f"{runs['sparse', 'inplace']['lost_fraction']:.2%} (one run each)."
              + ("" if rep is None else
                 f" The {len(rep['inplace', 4])} dense 4-worker in-place runs of *Lost "
                 f"updates* lost {min(r['lost_fraction'] for r in rep['inplace', 4]):.3%}-"
                 f"{max(r['lost_fraction'] for r in rep['inplace', 4]):.3%}: in-place losses "
                 "vary from run to run with the scheduling."))
    landed = round(s["age_mean"] * s["updates"])
    fold("Why the sparse problem loses so little: the chance of touching the same coordinate",
         f"On the sparse problem an update touches a given coordinate of another with chance "
         f"{hit:.1e}: {sparse.nnz}/{sparse.dim} = {sparse.nnz / sparse.dim:.1e} if the two "
         f"examples were unrelated, plus about 1/{sparse.examples:,} = "
         f"{1 / sparse.examples:.1e}, the chance that the other update is the same example "
         f"(there are only {sparse.examples:,}).\n"
         f"Measured directly (one run): {landed:,} updates landed on a write-back's first "
         f"coordinate between its read and its write, over {s['updates']:,} write-backs "
         f"({100 * s['age_mean']:.2f} per 100), beside {s['lost_fraction']:.2%} of increments "
         "lost. Both come from the same racy counter and need not match: the first samples "
         "one coordinate per write-back and sees no gap where an earlier write-back had "
         "rolled the counter back below this read's value (that write-back still erases), the "
         "second counts every erased increment. One run: it does not split the gap.")
    mant, exp = f"{ratio['dense']:.1e}".split("e")
    print(f"Final loss, write-back (no lock) / lock (one run each): sparse "
          f"{ratio['sparse']:.2f} times, dense {mant} × 10^{int(exp)} times."
          + ("" if ("dense", "inplace") not in runs else
             " In place (no lock) / lock: dense "
             f"{runs['dense', 'inplace']['final_loss'] / runs['dense', 'lock']['final_loss']:.2g}"
             " times."))
    cu, cl = d["curve_updates"], d["curve_loss"]
    conclude(d["final_loss"] < cl[np.searchsorted(cu, 2 * cu[-1] / 3)],
             "the write-back run's loss was still falling over its last third (one run)")
    assert d["lost_fraction"] > 20 * s["lost_fraction"]
    assert s["final_loss"] < 1e-2 * s["initial_loss"]  # trained: a comparison can mean something
    assert 1 / 3 < ratio["sparse"] < 3 and ratio["dense"] > 3 * ratio["sparse"]


# --- Fixes and their cost -----------------------------------------------------------------------

def cost_workers(cores: int) -> tuple[int, ...]:
    """The worker counts the cost runs use: 1, 2 and 4, but no more workers than cores beyond
    2 (on 2 or 3 cores, 1 and 2), so that a lock-free mode can really run them at once."""
    return (1, 2, 4) if cores >= 4 else (1, 2)


def costs_measurable(cost: dict) -> bool:
    """Whether the wall-clock costs mean something: only if the lock-free workers really ran
    in parallel. The measured parallelism is itself the evidence: fewer than 1.3 cores for 2
    in-place workers means another process held the second core, whatever the load average
    says. Prints which it was, and returns it."""
    i2 = cost["workers"].index(2)
    p_in2 = cost["parallelism"]["inplace"][i2]
    ran = (f"2 in-place workers ran {p_in2:.2f} at once on {cost['cores']} cores; above 1.3 "
           "counts as parallel here")
    if p_in2 > 1.3:
        print(f"Measured with the lock-free workers in parallel ({ran}).")
        return True
    print(f"Skipped: the lock-free workers did not run in parallel ({ran}), so wall-clock costs "
          "would measure the scheduler, not the fixes. Rerun on a quieter machine.")
    return False


def explain_cost_skipped(runs: dict) -> None:
    """What the lock and in place pay when the costs were not measurable: what holds by
    construction, with the write-backs' losses counted in the runs above."""
    wb = runs["dense", "writeback"]
    print("What the two pay, without timing them: the lock lets one worker update at a time, "
          "so more workers cannot beat one; in place can use a free core but computes from "
          "stale values (and a write-back, also lock-free, loses updates: "
          f"{wb['lost_fraction']:.0%} above).")


def explain_seqlock_skipped(runs: dict) -> None:
    """The seqlock's price when its cost was not measurable: its retries, counted above."""
    sq = runs["dense", "seqlock"]
    print("Not timed (the lock-free workers did not run in parallel: see *Fixes and their "
          f"cost*). With the seqlock, {sq['retried_reads']:,} of {sq['updates']:,} updates had "
          "to re-read (*Reads of mixed versions*), and each write takes a short lock.")


def surviving_rates(cost: dict) -> dict:
    """Updates/s that were not erased later, run by run: {mode: [array per worker count]}."""
    return {m: [np.multiply(cost["rate"][m][i], np.subtract(1, cost["lost_fraction"][m][i]))
                for i in range(len(cost["workers"]))] for m in cost["modes"]}


def plot_cost(cost: dict, *, modes=None) -> None:
    """Surviving updates/s of `modes` (all the cost runs' modes if None) against the number of
    workers (median, min-max of the repeats), beside how many workers really ran at once (CPU
    s per wall s)."""
    import matplotlib.pyplot as plt

    ws, surv = cost["workers"], surviving_rates(cost)
    modes = cost["modes"] if modes is None else modes
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
    for m in modes:
        med = [float(np.median(v)) for v in surv[m]]
        ax1.errorbar(ws, med, yerr=[np.subtract(med, [v.min() for v in surv[m]]),
                                    np.subtract([v.max() for v in surv[m]], med)],
                     capsize=3, color=COLORS[m], label=NAME[m], **STYLE[m])
        ax2.plot(ws, cost["parallelism"][m], color=COLORS[m], label=NAME[m], **STYLE[m])
    ax1.set_xticks(ws)
    ax1.set_xlabel("workers")
    ax1.set_ylim(bottom=0)
    ax1.legend(fontsize=8)
    ax1.set_ylabel(f"surviving updates / s\n(median, min-max of {cost['repeats']})")
    ax1.set_title("Cost on the dense problem")
    ax2.axhline(cost["cores"], color="gray", ls=":", label=f"{cost['cores']} cores")
    ax2.set_xticks(ws)
    ax2.set_xlabel("workers")
    ax2.set_ylim(bottom=0)
    ax2.set_ylabel("CPU s per wall s (workers at once)")
    ax2.legend(fontsize=8)
    ax2.set_title("How many workers really ran at once")
    plt.tight_layout()
    plt.show()
    say("**Read the figure.** Left: a lock-free mode gains from a second worker only if the "
        "workers really ran at once (right). At 1 worker nothing contends: the modes differ "
        "there only by their per-update code and run-to-run noise.")


def versus_one(runs2, runs1) -> str:
    """2 workers against 1, by the ranges of the runs, with the gap between the nearest runs
    when the ranges are apart."""
    if runs2.min() > runs1.max():
        return f"higher, ranges apart by {runs2.min() / runs1.max() - 1:.0%}"
    if runs2.max() < runs1.min():
        return f"lower, ranges apart by {runs1.min() / runs2.max() - 1:.0%}"
    return "ranges overlap"


def ranking(surv: dict, modes, i: int) -> str:
    """The modes by median surviving rate at worker-count index `i`, fastest first: '>' when
    the next mode's runs all lie below this one's, '≥' when their ranges overlap."""
    best = sorted(modes, key=lambda m: -np.median(surv[m][i]))
    return NAME[best[0]] + "".join((" > " if surv[b][i].max() < surv[a][i].min() else " ≥ ")
                                   + NAME[b] for a, b in zip(best, best[1:]))


def explain_cost(cost: dict, *, problem) -> None:
    """From 1 to 2 workers, the surviving rates of in place and the lock (with the CPU per
    update of the median runs when it grew); hedged possible causes of extra CPU per update;
    how far the runs' ranges support the 1 -> 2 change; and what in place lost with
    overlapping workers. The other modes are the appendix's (`explain_cost_order`)."""
    ws, surv = cost["workers"], surviving_rates(cost)
    i1, i2 = ws.index(1), ws.index(2)
    mr = cost["median_run"]  # (updates/s, workers at once, CPU µs per update)
    pair = ("inplace", "lock")
    med = {m: [float(np.median(surv[m][i])) for i in (i1, i2)] for m in pair}
    # updates/s = workers at once / CPU s per update: a fall with CPU per update grown is that
    cpu_why = [f"each {NAME[m]} update's CPU went from {mr[m][i1][2]:.0f} to {mr[m][i2][2]:.0f} "
               f"µs" for m in pair if med[m][1] < med[m][0] and mr[m][i2][2] > 1.3 * mr[m][i1][2]]
    in1s = surv["inplace"][i1]
    in_spread = (in1s.max() - in1s.min()) / np.median(in1s)
    gain = {m: med[m][1] / med[m][0] for m in pair}
    at_once = {m: cost["parallelism"][m][i2] for m in pair}
    # updates/s = workers at once / CPU per update: a gain above the ratio of workers at once
    # (2 against 1) needs cheaper updates, i.e. noise; said only at the printed precision
    in_one = cost["parallelism"]["inplace"][i1]
    ceiling = at_once["inplace"] / in_one
    beyond = round(gain["inplace"], 2) > round(ceiling, 2)
    # the fix's price at equal workers first (what the learner predicted), then the gains
    lk2, in2 = (np.asarray(surv[m][i2]) for m in ("lock", "inplace"))
    ratio = np.median(lk2) / np.median(in2)
    print(f"In short, with 2 workers on {cost['cores']} cores (medians of {cost['repeats']} "
          f"runs): the lock ran {np.median(lk2):,.0f} surviving updates/s, in place "
          f"{np.median(in2):,.0f}: ×{ratio:.2f}"
          + (" (every lock run slower)." if lk2.max() < in2.min() else
             " (every lock run faster)." if lk2.min() > in2.max() else
             " (the runs' ranges overlap: not resolved on these runs)."))
    print(f"{'Why' if ratio < 1 else 'Yet'}: the lock's 2 workers ran {at_once['lock']:.2f} at "
          f"once, in place's {at_once['inplace']:.2f}: the lock serialises the update.")
    print(f"From 1 worker to 2: in place ×{gain['inplace']:.2f} "
          f"({versus_one(surv['inplace'][i2], surv['inplace'][i1]).split(',')[0]}), the lock "
          f"×{gain['lock']:.2f} ({versus_one(surv['lock'][i2], surv['lock'][i1]).split(',')[0]}"
          "; the fold has the ranges).")
    lines = [f"On {cost['cores']} cores, 1 -> 2 workers (surviving updates/s, medians of "
             f"{cost['repeats']} runs): "
             + ", ".join(f"{NAME[m]} {med[m][0]:,.0f} -> {med[m][1]:,.0f}" for m in pair)
             + (f", as {' and '.join(cpu_why)}." if cpu_why else ".")]
    if beyond:  # updates/s = workers at once / CPU per update: more needs cheaper updates
        lines.append(f"In place's ×{gain['inplace']:.2f} is more than the "
                     f"×{ceiling:.2f} its workers at once can give ({at_once['inplace']:.3f} "
                     f"at once with 2 workers against {in_one:.3f} with 1): its 1-worker runs "
                     f"alone spread by {in_spread:.0%}, so part of that is run-to-run noise.")
    why = {"inplace": f"in place, two cores writing the same {problem.dim} coordinates (their "
                      "cache lines move between the cores) or cores sharing hardware",
           "lock": "the lock, handing it and the coordinates from process to process (waking "
                   "the waiting process)"}
    grown = [m for m in pair if mr[m][i2][2] > 1.3 * mr[m][i1][2]]
    if grown:
        lines.append("Possible causes of the extra CPU per update, not measured here: "
                     + "; ".join(why[m] for m in grown) + ".")
    lines.append(f"2 workers against 1, by the ranges of the {cost['repeats']} runs: "
          + "; ".join(f"{NAME[m]}: {versus_one(surv[m][i2], surv[m][i1])}" for m in pair)
          + (" (a gap between the nearest runs rests on one run each)"
             if any(versus_one(surv[m][i2], surv[m][i1]) != "ranges overlap" for m in pair)
             else "") + ".")
    lf, pin = cost["lost_fraction"]["inplace"], cost["parallelism"]["inplace"]
    multi = [i for i, w in enumerate(ws) if w > 1]
    lines.append("In place, its workers overlapping ("
                 + " and ".join(f"{pin[i]:.2f}" for i in multi) + " at once with "
                 + " and ".join(str(ws[i]) for i in multi) + "): it lost at most "
                 + " and ".join(f"{100 * max(lf[i]):.2g}%" for i in multi)
                 + f" of the counter increments ({cost['repeats']} runs each).")
    fold("How sure is this? The medians, their ranges, CPU per update", "\n".join(lines))


def explain_cost_order(cost: dict) -> None:
    """The appendix's reading of all four modes' cost runs: the seqlock's and the write-backs'
    surviving rates from 1 to 2 workers; how much slower in place ran than write-back with 1
    worker (ufunc.at against plain stores is a guess: not timed apart); and the ranking of the
    modes with the most workers run, with how far one more run could reorder it."""
    ws, modes, surv = cost["workers"], cost["modes"], surviving_rates(cost)
    i1, i2, top = ws.index(1), ws.index(2), len(ws) - 1   # top: the most workers run
    spread = max((v.max() - v.min()) / np.median(v) for v in (surv[m][i1] for m in modes))
    print(f"1 -> 2 workers ({cost['cores']} cores, surviving updates/s, medians of "
          f"{cost['repeats']} runs): "
          + ", ".join(f"{NAME[m]} {np.median(surv[m][i1]):,.0f} -> {np.median(surv[m][i2]):,.0f}"
                      for m in ("seqlock", "writeback")) + ".")
    sq2, lk2, in2 = (float(np.median(surv[m][i2])) for m in ("seqlock", "lock", "inplace"))
    print(f"So with 2 workers the seqlock's {sq2:,.0f} is nearer "
          + (f"in place's {in2:,.0f} than the lock's {lk2:,.0f}." if abs(sq2 - in2) < abs(sq2 - lk2)
             else f"the lock's {lk2:,.0f} than in place's {in2:,.0f}."))
    wb1, in1 = (np.asarray(cost["rate"][m][i1]) for m in ("writeback", "inplace"))
    slow = np.median(wb1) / np.median(in1)
    if slow > 1.2:  # one worker: nothing races; the two differ in how they write
        apart = "apart" if in1.max() < wb1.min() else "overlapping"
        print(f"With 1 worker, write-back ran {slow:.1f}x as many updates/s as in place "
              f"(medians; ranges of the {cost['repeats']} runs {apart}), perhaps because "
              "numpy's ufunc.at is slower than a plain store: not timed on its own here.")
    print(f"{ws[top]} workers on {cost['cores']} cores"
          f"{' (more workers than cores)' if cost['cores'] < ws[top] else ''}: "
          f"{ranking(surv, modes, top)} (by median surviving updates/s; 'A > B': every run of "
          "A faster than every run of B, 'A ≥ B': their ranges overlap). With "
          f"{cost['repeats']} runs a mode, and one mode's own runs spread by up to "
          f"{spread:.0%} with 1 worker, another run can reorder the modes.")


def summary_table(runs: dict) -> None:
    """The dense 4-worker runs of every mode side by side (one run each): workers at once,
    counter increments lost, updates computed from a flagged read (the seqlock retries those),
    final loss. Then the verdict that in place ended below write-back; asserts that the lock
    and the seqlock lost nothing, that both lock-free runs trained and that the lock beat the
    write-backs."""
    rows = ["| mode | workers at once | counter increments lost | updates from flagged reads "
            "| final loss |", "|---|---|---|---|---|"]
    for m in MODES:
        r = runs["dense", m]
        used = 0 if m == "seqlock" else r["mixed_reads"]  # the seqlock retries a flagged read
        rows.append(f"| {NAME[m]} | {r['parallelism']:.2f} | {r['lost_fraction']:.2%} | "
                    f"{used / r['updates']:.1%} | {r['final_loss']:.1e} |")
    say(f"**The four modes side by side** (dense problem, 4 workers, "
        f"{runs['dense', 'writeback']['updates']:,} updates, one run each)\n\n"
        + "\n".join(rows) + "\n\n"
        "How to read it: *workers at once*, CPU s per wall s; *lost*, the racy counter's "
        "erased increments, standing in for erased updates; *flagged reads*, updates computed "
        "from a read the version stamps flagged as mixed (an indicator); *final loss*, where "
        f"the run ended (it started at {runs['dense', 'lock']['initial_loss']:.2f}).")
    free, inpl, lk = (runs["dense", m] for m in ("writeback", "inplace", "lock"))
    assert lk["lost"] == 0 and runs["dense", "seqlock"]["lost"] == 0  # by construction
    assert free["final_loss"] < free["initial_loss"] and inpl["final_loss"] < inpl["initial_loss"]
    assert lk["final_loss"] < free["final_loss"]
    conclude(inpl["final_loss"] < free["final_loss"],
             "the in-place run ended below the write-back run")


def explain_allreduce(runs: dict, cost: dict | None = None) -> None:
    """The synchronous all-reduce's updates, examples per second, ms per step beside the ring's
    network-delay floor (cores from `cost`), replicas, and its final loss beside
    the write-back run's on the same examples; asserts that the all-reduce lost nothing, that
    both saw the same examples, and that the replicas agree."""
    ar_run, hw = runs["dense", "allreduce"], runs["dense", "writeback"]
    w = ar_run["workers"]
    import re

    delay = re.search(r"delay (\d+(?:\.\d+)?)us", ar_run.get("nic") or "")
    step_ms = 1e3 * ar_run["elapsed_s"] / ar_run["steps"]
    versus = f", {step_ms:.1f} ms per step"
    if delay:  # a ring all-reduce sends 2 (W - 1) times in turn, each delayed once
        versus += (f" against about {2 * (w - 1) * float(delay[1]) / 1e3:.1f} ms the network "
                   f"delay alone needs (Gloo's ring: 2 × ({w} − 1) steps in turn × {delay[1]} "
                   "µs, each step delayed once, at the sender's NIC, as netem delays a node's "
                   "egress; its segments pipelined within a step); "
                   f"the rest, not split up here, is {w} ranks sharing "
                   f"{cost['cores'] if cost else os.cpu_count()} cores, the user-space network "
                   "emulator and the gradient compute")
    print(f"Synchronous all-reduce ({w} ranks, emulated network): "
          f"{ar_run['examples']:,} examples in {ar_run['steps']} updates (up to {w} ranks × "
          f"{ar_run['batch']} examples each; the last one takes what is left), "
          f"{ar_run['elapsed_s']:.2f} s: {ar_run['steps_per_s']:,.0f} updates/s, "
          f"{ar_run['examples_per_s']:,.0f} examples/s{versus}; {ar_run['lost']} lost by "
          f"construction; replicas bit-identical: {ar_run['replicas_agree']}.")
    above = ar_run["final_loss"] > hw["final_loss"]
    print(f"  Final loss {ar_run['final_loss']:.1e}, against {hw['final_loss']:.1e} for the "
          "write-back run on the same examples"
          + (f": that does not rank the two, since it took {ar_run['steps']} large steps at the "
             "lr of the small ones, not an lr tuned for it." if above else "."))
    assert ar_run["lost"] == 0  # no shared writes: by construction
    assert ar_run["examples"] == hw["updates"]  # the same examples: a fair comparison of losses
    assert ar_run["replicas_agree"] and ar_run["final_loss"] < ar_run["initial_loss"]


# --- Appendix ----------------------------------------------------------------------------------

def show_memory_ordering() -> None:
    """Why the seqlock's check misses no mixed read, and what that relies on: the order of
    loads and of stores, which x86 keeps and ARM does not (sourced)."""
    import platform

    from .. import facts

    host = ("this x86 host" if platform.machine().lower() in ("x86_64", "amd64")
            else "the host")
    facts.show(
        "**Why the seqlock's check misses no mixed read.** Its writers take turns (the lock). "
        "A writer stores its begin stamps, then x, then its end stamps; a reader loads the end "
        "stamps, then x, then the begin stamps. Suppose a read mixed versions: it saw writer "
        "W's value of some x_j but an older x_k. It loaded begin_k after x_j, which W stored "
        "after begin_k, so begin_k shows W's stamp (or a later one); it loaded end_k before "
        "x_k, which W stored before end_k, so end_k shows an older one. The stamps differ: "
        "the read is flagged.\n\n"
        "**Memory ordering.** That argument needs loads to stay in order with loads and stores "
        "with stores. This seqlock's reader issues no memory barriers, and its writers' lock "
        "does not order the stores inside one write (separate NumPy operations, issued in "
        f"program order), so its check relies on {host} keeping that order, which x86 does "
        "and ARM does not: [[linux.smp_rmb_x86_arm64]]. On ARM it would need the barriers "
        "Linux's seqlock has: [[linux.seqlock_barriers]].")


# --- On a real GPU cluster ----------------------------------------------------------------------

# Where lock-free updates meet GPU training (from the sources, not run here), for `facts.show`.
GPU_LOCK_FREE = """
- **Lock-free on purpose**: Hogwild! ([[paper.hogwild_niu2011]]); PyTorch's Hogwild example,
  which steps in place ([[pytorch.mnist_hogwild]]): its `add_` on a shared tensor is
  non-atomic (vector loads, adds and stores), this notebook's *in place* mode, not the atomic
  adds Hogwild!'s analysis assumes.
- **Dense GPU training uses synchronous collectives** (all-reduce; reduce-scatter and
  all-gather when parameters are sharded): each rank's optimizer step writes only that
  rank's own copy or shard of the parameters, so no update is lost between ranks, and the
  price is that everyone waits. Llama 3: [[meta.llama3_synchronous]].
"""
