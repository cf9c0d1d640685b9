"""The lesson module of notebook 06b (lock-free updates): each verdict,
classification and formatted number on small synthetic runs."""

from __future__ import annotations

import numpy as np
import pytest

from clusterlab.experiments import common
from clusterlab.lessons import lock_free_updates as races


def test_far_above_median_uses_at_least_one_as_the_median():
    assert races.far_above_median([1, 2, 3, 40])  # 40 > 10 x 2.5
    assert not races.far_above_median([16, 12, 28, 20])
    assert races.far_above_median([0, 0, 0, 11]) and not races.far_above_median([0, 0, 0, 10])


def _rep(lost_wb=(0.4, 0.6), par_wb=(1.6, 1.75), par_in=(1.76, 1.75), lost_in=(16, 28)):
    rep = {}
    for k, w in enumerate((2, 4)):
        rep["writeback", w] = [{"lost_fraction": lost_wb[k] + d, "parallelism": par_wb[k],
                                "lost": 1000} for d in (-0.02, 0.0, 0.02)]
        rep["inplace", w] = [{"lost_fraction": lost_in[k] / 384000, "parallelism": par_in[k],
                              "lost": lost_in[k], "expected": 384000, "updates": 12000}
                             for _ in range(3)]
    return rep


def _runs_lost(lock_lost=0):
    return {("dense", "writeback"): {"lost_fraction": 0.57},
            ("dense", "lock"): {"lost_fraction": 0.0, "lost": lock_lost},
            ("dense", "seqlock"): {"lost_fraction": 0.0, "lost": 0}}


class _Problem:
    nnz = dim = 32


class _Sparse:
    """4 examples of 2 coordinates each out of 10: coordinate 0 in three of them."""
    idx = np.array([[0, 1], [0, 2], [0, 3], [4, 5]])
    dim, nnz, examples = 10, 2, 4


def test_hit_chance_counts_the_examples_sharing_a_coordinate():
    # n = (3, 1, 1, 1, 1, 1) on the coordinates written: (3 + 1) x 3 + 1 + 1 over 8, / 4
    assert races.hit_chance(_Sparse()) == pytest.approx(14 / 8 / 4)
    dense = type("D", (), {"idx": np.tile(np.arange(32), (5, 1)), "dim": 32, "examples": 5})
    assert races.hit_chance(dense()) == 1.0


def test_explain_lost_updates_reads_the_ranges_and_the_parallelism(capsys):
    races.explain_lost_updates(_rep(), _runs_lost(), problem=_Problem(), cores=2)
    out = capsys.readouterr().out
    # the headline: the losses against (W - 1)/W, in place's worst run, the fixes
    assert ("Write-backs lost 38%-42% with 2 workers and 58%-62% with 4 (3 runs each), against "
            "(W - 1)/W = 50% and 75% if all W ran at once.\n") in out
    assert ("In place lost at most 0.007% of the counter increments (28 of 384,000, 12,000 "
            "updates × 32 coordinates, in its worst run, with 4 workers); lock and seqlock lost 0 "
            "and 0.") in out
    assert "too few to test its race" not in out
    # the fold: the measured concurrency's prediction, where the losses ended, the spread
    assert ("The one-run dense write-back (seed 0, its loss printed in the next section) lost 57%, "
            "the same settings and seed rerun here 58%: only the") in out
    assert ("Workers at once on 2 cores (CPU seconds ÷ wall seconds): write-back 1.60 and 1.75, "
            "in place 1.76 and 1.75. A rough heuristic, (p − 1)/p with p the workers at once "
            "(an average, not workers running throughout), gives 38% and 43% for the "
            "write-backs; the 2-worker losses ended 0-4 points "
            "above it, the 4-worker losses ended 15-19 points above it. A worker paused "
            "mid-update erases more (a hypothesis") in out
    assert "In place lost a median of 16 increments with 2 workers and 28 with 4." in out
    assert "far above the median" not in out
    assert "Two effects" not in out
    races.explain_lost_updates(_rep(lost_wb=(0.4, 0.3)), _runs_lost(), problem=_Problem(),
                               cores=2)
    out = capsys.readouterr().out
    assert "the 4-worker losses ended 11-15 points below it." in out
    assert "A worker paused mid-update erases more" not in out
    races.explain_lost_updates(_rep(par_wb=(1.9, 3.5), par_in=(1.2, 1.9)), _runs_lost(),
                               problem=_Problem(), cores=4)
    out = capsys.readouterr().out
    assert ("In place ran only 1.20 workers at once at best: too few to test its race here "
            "(the cost runs below") in out
    races.explain_lost_updates(_rep(par_wb=(0.89, 0.91)), _runs_lost(), problem=_Problem(),
                               cores=2)
    out = capsys.readouterr().out
    assert "Fewer than one write-back worker ran at a time on average" in out
    assert "cannot come from" not in out and "An average cannot tell" in out
    assert "is -" not in out


def test_time_slice_here_follows_the_ledger_formula(monkeypatch):
    import os
    import platform

    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "release", lambda: "6.18.4-generic")
    for cpus, ms in ((1, 0.7), (2, 1.4), (3, 1.4), (4, 2.1), (64, 2.8)):
        monkeypatch.setattr(os, "cpu_count", lambda c=cpus: c)
        assert races.time_slice_here() == pytest.approx(ms)
    monkeypatch.setattr(platform, "release", lambda: "6.14.0")  # base 0.75 ms: not stated
    assert races.time_slice_here() is None


def test_explain_lost_updates_asserts_what_the_text_says():
    with pytest.raises(AssertionError):
        races.explain_lost_updates(_rep(), _runs_lost(lock_lost=1), problem=_Problem(), cores=2)
    with pytest.raises(AssertionError):  # in place losing as much as write-backs
        races.explain_lost_updates(_rep(lost_in=(150000, 230000)), _runs_lost(),
                                   problem=_Problem(), cores=2)


def _mixed_runs(retries=6595, retried=2439, lock_mixed=0, seq_mixed=None):
    return {("dense", "writeback"): {"mixed_reads": 3806, "updates": 12000,
                                     "lost_fraction": 0.607},
            ("dense", "inplace"): {"mixed_reads": 3732, "updates": 12000, "lost_fraction": 0.0},
            ("dense", "lock"): {"mixed_reads": lock_mixed, "updates": 12000},
            ("dense", "seqlock"): {"mixed_reads": retries if seq_mixed is None else seq_mixed,
                                   "retries": retries, "retried_reads": retried,
                                   "updates": 12000}}


def test_explain_mixed_reads(capsys, monkeypatch):
    from clusterlab import facts

    shown = []
    monkeypatch.setattr(facts, "show", shown.append)
    races.explain_mixed_reads(_mixed_runs())
    out = capsys.readouterr().out
    assert ("write-backs computed 3,806 of 12,000 updates (31.7%) from a read the stamps "
            "flagged; lock 0.") in out
    assert ("Checked against the prediction: updates from a flagged read, in place 31.1%, "
            "write-backs 31.7%; counter increments lost, in place 0.00%, write-backs 60.7%.\n"
            "Flagged reads show overlap, not lost updates: an in-place add that overlaps "
            "another still lands.\n") in out
    # why, in the fold
    assert ("A flag needs stamps that disagree at the read: a write in flight during the short "
            "read, or stamps two unlocked writes left mixed. A write-back's loss needs a write "
            "anywhere in its longer read-to-write window") in out
    assert ("The seqlock: 2,439 of 12,000 updates had to re-read (6,595 retries in all), and "
            "it computed only from reads its check passed") in out
    assert not shown  # under 100 retries per retried read
    races.explain_mixed_reads(_mixed_runs(retries=50000, retried=400))
    assert shown and "[[linux.seqlock_writer_not_preempted]]" in shown[0]
    with pytest.raises(AssertionError):  # the lock saw a flagged read
        races.explain_mixed_reads(_mixed_runs(lock_mixed=1))
    with pytest.raises(AssertionError):  # the seqlock computed from a flagged read
        races.explain_mixed_reads(_mixed_runs(seq_mixed=6596))


def _locked_curve():
    return {"curve_loss": np.array([1.0, 0.5, 0.1, 0.01]),
            "curve_updates": np.array([0, 100, 200, 300]),
            "curve_updates_after": np.array([5, 105, 205, 305])}


def _convergence_runs(wb_final=0.2, counted=150 * 32):
    curve = _locked_curve()
    return {("dense", "writeback"): {"lost_fraction": 0.568, "final_loss": wb_final,
                                     "counted": counted, "updates": 1000,
                                     "curve_updates": np.array([0, 300, 600, 900, 1000]),
                                     "curve_loss": np.array([1.0, 0.8, 0.5, 0.3, wb_final])},
            ("dense", "lock"): {"final_loss": 1e-8, **curve},
            ("sparse", "writeback"): {"lost_fraction": 0.0014, "final_loss": 1.02e-3,
                                      "initial_loss": 1.0, "age_mean": 0.0012,
                                      "updates": 60000},
            ("sparse", "lock"): {"final_loss": 1e-3}}


def test_explain_convergence(capsys):
    races.explain_convergence(_convergence_runs(), problem=_Problem(), sparse=_Sparse())
    out = capsys.readouterr().out
    assert "Write-backs lost: dense 56.8%, sparse 0.14% (one run each)." in out
    assert ("touches a given coordinate of another with chance 4.4e-01: 2/10 = 2.0e-01 if the "
            "two examples were unrelated, plus about 1/4 = 2.5e-01, the chance that the other "
            "update is the same example (there are only 4).") in out
    # the raw count with its base, not only the rate
    assert ("Measured directly (one run): 72 updates landed on a write-back's first coordinate "
            "between its read and its write, over 60,000 write-backs (0.12 per 100), beside "
            "0.14% of increments lost") in out and "as if" not in out
    assert "sparse 1.02 times, dense 2.0 × 10^7 times." in out
    assert "A second prediction" not in out  # cut: a side prediction the runs cannot explain
    assert ("Shown on this run: the write-back run's loss was still falling over its last third "
            "(one run).") in out
    assert "The write-back run's loss" not in out
    assert "still falling over its last third (one run)." in out
    races.explain_convergence(_convergence_runs(counted=300 * 32), problem=_Problem(),
                              sparse=_Sparse())
    out = capsys.readouterr().out
    assert "missed by" not in out and "These runs cannot say why" not in out


def _cost(p_in2=1.97, grow=True):
    ws, modes = [1, 2, 4], list(races.MODES)
    base = {"writeback": 30e3, "inplace": 68e3, "lock": 59e3, "seqlock": 60e3}
    rate = {m: [np.array([base[m] * f] * 3) * np.array([0.9, 1.0, 1.1]) for f in (1, 1.0, 1.0)]
            for m in modes}
    rate["lock"][1] = rate["lock"][1] * 0.63  # the lock slowed down with 2 workers
    lost = {m: [np.zeros(3)] * 3 for m in modes}
    lost["writeback"] = [np.full(3, 0.5)] * 3
    par = {m: [1.0, 1.2, 1.3] for m in modes}
    par["inplace"] = [1.0, p_in2, 1.9]
    mr = {m: [(1, 1.0, 15), (1, 1.9, 28 if grow else 16), (1, 1.9, 30)] for m in modes}
    return {"workers": ws, "modes": modes, "rate": rate, "lost_fraction": lost,
            "parallelism": par, "median_run": mr, "cores": 2, "repeats": 3}


def test_costs_measurable_needs_1_3_cores_for_two_in_place_workers(capsys):
    assert races.costs_measurable(_cost(p_in2=1.97))
    assert capsys.readouterr().out == ("Measured with the lock-free workers in parallel (2 "
                                       "in-place workers ran 1.97 at once on 2 cores; above 1.3 "
                                       "counts as parallel here).\n")
    assert not races.costs_measurable(_cost(p_in2=1.1))
    out = capsys.readouterr().out
    assert out.startswith("Skipped: the lock-free workers did not run in parallel (2 in-place "
                          "workers ran 1.10 at once on 2 cores; above 1.3 counts as parallel "
                          "here), so wall-clock "
                          "costs would measure the scheduler, not the fixes.")


def test_cost_workers_run_no_more_workers_than_cores_beyond_two():
    assert races.cost_workers(2) == (1, 2) and races.cost_workers(3) == (1, 2)
    assert races.cost_workers(8) == (1, 2, 4)


def test_explain_cost_skipped_says_what_holds_by_construction(capsys):
    runs = {("dense", "seqlock"): {"retried_reads": 1489, "updates": 12000},
            ("dense", "writeback"): {"lost_fraction": 0.724}}
    races.explain_cost_skipped(runs)
    out = capsys.readouterr().out
    assert "the lock lets one worker update at a time, so more workers cannot beat one" in out
    assert "in place can use a free core but computes from stale values" in out
    assert "loses updates: 72% above)" in out and "seqlock" not in out  # the appendix's
    races.explain_seqlock_skipped(runs)
    out = capsys.readouterr().out
    assert out.startswith("Not timed (the lock-free workers did not run in parallel")
    assert "With the seqlock, 1,489 of 12,000 updates had to re-read" in out


def test_surviving_rates_discount_the_lost_updates():
    surv = races.surviving_rates(_cost())
    assert np.allclose(surv["writeback"][0], [13.5e3, 15e3, 16.5e3])
    assert np.allclose(surv["lock"][1], 0.63 * np.array([53.1e3, 59e3, 64.9e3]))


def test_versus_one_compares_ranges():
    assert races.versus_one(np.array([5, 6]), np.array([1, 4])) == "higher, ranges apart by 25%"
    assert races.versus_one(np.array([1, 2]), np.array([3, 4])) == "lower, ranges apart by 50%"
    assert races.versus_one(np.array([1, 3]), np.array([2, 4])) == "ranges overlap"


def test_ranking_orders_by_median_and_marks_overlaps():
    surv = {"inplace": [np.array([9, 10, 11])], "seqlock": [np.array([8, 9, 10])],
            "lock": [np.array([4, 5, 6])], "writeback": [np.array([3, 4.5, 5])]}
    assert races.ranking(surv, races.MODES, 0) == "in place ≥ seqlock > lock ≥ write-back"


def test_explain_cost(capsys):
    races.explain_cost(_cost(), problem=_Problem())
    out = capsys.readouterr().out
    # one line first: each gain beside its workers at once, whether the ranges resolve it
    # the price at equal workers first, resolved or not by the runs' ranges; then the gains
    assert out.startswith("In short, with 2 workers on 2 cores (medians of 3 runs): the lock ran "
                          "37,170 surviving updates/s, in place 68,000: ×0.55 (every lock run "
                          "slower).\nWhy: the lock's 2 workers ran 1.20 at once, in place's "
                          "1.97: the lock serialises the update.\n"
                          "From 1 worker to 2: in place ×1.00 (ranges overlap), the lock ×0.63 "
                          "(lower; the fold has the ranges).\n")
    assert "all-reduce" not in out and "seqlock" not in out  # the appendix's
    assert ("On 2 cores, 1 -> 2 workers (surviving updates/s, medians of 3 runs): in place "
            "68,000 -> 68,000, lock 59,000 -> 37,170, as each lock update's CPU went from 15 to "
            "28 µs.") in out
    assert ("2 workers against 1, by the ranges of the 3 runs: in place: ranges overlap; lock: "
            "lower") in out and "rests on one run each" in out
    assert "largest factor" not in out
    assert "workers at once at" not in out and "ufunc.at" not in out  # in place not slower
    assert ("In place, its workers overlapping (1.97 and 1.90 at once with 2 and 4): it lost at "
            "most 0% and 0% of the counter increments (3 runs each).") in out
    assert "two cores writing the same 32 coordinates" in out and "handing it" in out
    assert "≈" not in out
    resolved = _cost(grow=False)  # both ranges apart: no line about overlaps
    resolved["rate"]["inplace"][1] = resolved["rate"]["inplace"][1] * 1.6
    races.explain_cost(resolved, problem=_Problem())
    out = capsys.readouterr().out
    assert "in place ×1.60 (higher)" in out and "(every lock run slower)" in out
    close = _cost()  # the lock as fast as in place at 2 workers: not resolved, said so
    close["rate"]["lock"][1] = close["rate"]["inplace"][1] * 1.02
    races.explain_cost(close, problem=_Problem())
    out = capsys.readouterr().out
    assert "(the runs' ranges overlap: not resolved on these runs).\nYet: the lock's 2" in out
    races.explain_cost(_cost(grow=False), problem=_Problem())
    out = capsys.readouterr().out
    assert "Possible causes" not in out and "37,170." in out and ", as each" not in out
    # on 2 cores the cost runs stop at 2 workers: the last lines read the largest count
    two = _cost()
    two["workers"] = [1, 2]
    for key in ("rate", "lost_fraction", "parallelism", "median_run"):
        two[key] = {m: v[:2] for m, v in two[key].items()}
    races.explain_cost(two, problem=_Problem())
    out = capsys.readouterr().out
    assert "(1.97 at once with 2): it lost at most 0% of the counter" in out
    races.explain_cost_order(two)
    out = capsys.readouterr().out
    assert "2 workers on 2 cores: in place" in out and "more workers than cores" not in out
    # a gain past the workers at once is named only when the printed numbers show it
    fast = _cost(p_in2=1.62)
    fast["rate"]["inplace"][1] = fast["rate"]["inplace"][1] * 2.003
    races.explain_cost(fast, problem=_Problem())
    out = capsys.readouterr().out
    assert "From 1 worker to 2: in place ×2.00 (higher)" in out
    assert ("In place's ×2.00 is more than the ×1.62 its workers at once can give (1.620 at "
            "once with 2 workers against 1.000 with 1): its 1-worker runs alone spread by 20%, "
            "so part of that is run-to-run noise.") in out
    even = _cost(p_in2=1.62)  # 1.62 against 0.81 allows ×2.00: not more at printed precision
    even["parallelism"]["inplace"][0] = 0.81
    even["rate"]["inplace"][1] = even["rate"]["inplace"][1] * 2.003
    races.explain_cost(even, problem=_Problem())
    out = capsys.readouterr().out
    assert "in place ×2.00 (higher)" in out and "In place's ×" not in out


def test_explain_cost_order_reads_the_appendix_modes(capsys):
    races.explain_cost_order(_cost())
    out = capsys.readouterr().out
    assert out.startswith("1 -> 2 workers (2 cores, surviving updates/s, medians of 3 runs): "
                          "seqlock 60,000 -> 60,000, write-back 15,000 -> 15,000.\n")
    assert "4 workers on 2 cores (more workers than cores): in place" in out
    assert "So with 2 workers the seqlock's 60,000 is nearer in place's 68,000 than" in out
    assert "spread by up to 20% with 1 worker, another run can reorder" in out
    assert ("(by median surviving updates/s; 'A > B': every run of A faster than every run of B, "
            "'A ≥ B': their ranges overlap). With 3 runs") in out
    assert "ufunc.at" not in out  # in place not slower with 1 worker
    slow = _cost()
    # plain lists, as the experiment returns them (a numpy-only path once raised in 06)
    slow["rate"]["inplace"] = [list(np.asarray(v) / 4) for v in slow["rate"]["inplace"]]
    slow["rate"]["writeback"] = [list(v) for v in slow["rate"]["writeback"]]
    races.explain_cost_order(slow)
    out = capsys.readouterr().out
    assert ("With 1 worker, write-back ran 1.8x as many updates/s as in place (medians; ranges "
            "of the 3 runs apart), perhaps because numpy's ufunc.at is slower than a plain "
            "store: not timed on its own here.") in out and "costs more" not in out


def _allreduce_runs(final=6.6e-5, lost=0):
    return {("dense", "allreduce"): {"examples": 12000, "batch": 64, "steps": 47, "elapsed_s": 0.29,
                                     "steps_per_s": 160.0, "examples_per_s": 40754.0,
                                     "workers": 4, "lost": lost, "replicas_agree": True,
                                     "final_loss": final, "initial_loss": 0.43},
            ("dense", "writeback"): {"updates": 12000, "final_loss": 1.1e-7}}


def test_explain_allreduce(capsys):
    races.explain_allreduce(_allreduce_runs())
    out = capsys.readouterr().out
    assert ("12,000 examples in 47 updates (up to 4 ranks × 64 examples each; the last one "
            "takes what is left), 0.29 s: 160 "
            "updates/s, 40,754 examples/s, 6.2 ms per step; 0 lost") in out
    races.explain_allreduce(_allreduce_runs(), _cost())
    assert "6.2 ms per step" in capsys.readouterr().out  # no nic given: no floor
    runs = _allreduce_runs()
    runs["dense", "allreduce"]["nic"] = "delay 100us"
    races.explain_allreduce(runs, _cost())
    assert ("6.2 ms per step against about 0.6 ms the network delay alone needs (Gloo's ring: "
            "2 × (4 − 1) steps in turn × 100 µs, each step delayed once, at the sender's NIC, as "
            "netem delays a node's egress; its segments pipelined within a step); the "
            "rest, not split up here, is 4 ranks sharing 2 cores") in capsys.readouterr().out
    assert ("Final loss 6.6e-05, against 1.1e-07 for the write-back run on the same examples: "
            "that does not rank the two, since it took 47 large steps") in out
    races.explain_allreduce(_allreduce_runs(final=1e-8))
    out = capsys.readouterr().out
    assert "Final loss 1.0e-08, against 1.1e-07 for the write-back" in out
    assert "does not rank" not in out
    with pytest.raises(AssertionError):
        races.explain_allreduce(_allreduce_runs(lost=3))


def _table_runs(inplace_final=1e-14, lock_lost=0):
    row = {"writeback": (1.74, 0.54, 1824, 4.2e-7), "inplace": (1.72, 0.0022, 10, inplace_final),
           "lock": (1.0, 0.0, 0, 7e-15), "seqlock": (1.5, 0.0, 6260, 8e-15)}
    return {("dense", m): {"parallelism": p, "lost_fraction": lf, "mixed_reads": mx,
                           "updates": 12000, "final_loss": fl, "initial_loss": 0.43,
                           "lost": lock_lost if m == "lock" else round(lf * 12000 * 32)}
            for m, (p, lf, mx, fl) in row.items()}


def test_summary_table_lines_up_the_modes(capsys):
    said = []
    import clusterlab.lessons.lock_free_updates as mod

    orig = mod.say
    mod.say = said.append
    try:
        races.summary_table(_table_runs())
    finally:
        mod.say = orig
    table = said[0]
    assert "| write-back | 1.74 | 54.00% | 15.2% | 4.2e-07 |\n" in table
    assert "| seqlock | 1.50 | 0.00% | 0.0% | 8.0e-15 |\n" in table  # retried, not used
    assert "one run each)" in table and "it started at 0.43" in table
    assert "surviving updates/s" not in table  # one-run columns only: no medians beside them
    assert "Shown on this run: the in-place run ended below the write-back run." in \
        capsys.readouterr().out
    with pytest.raises(AssertionError):  # the in-place run did not train
        races.summary_table(_table_runs(inplace_final=1.0))
    with pytest.raises(AssertionError):  # the lock lost an update: the fix is broken
        races.summary_table(_table_runs(lock_lost=3))


def test_explain_convergence_sets_in_place_beside_the_lost_updates_runs(capsys):
    runs = _convergence_runs()
    runs["dense", "inplace"] = {"lost_fraction": 0.0022, "final_loss": 1.1e-8}
    runs["sparse", "inplace"] = {"lost_fraction": 0.0}
    rep = {("inplace", 4): [{"lost_fraction": f} for f in (0.00008, 0.00014, 0.00021)]}
    races.explain_convergence(runs, problem=_Problem(), sparse=_Sparse(), rep=rep)
    out = capsys.readouterr().out
    # each lock-free mode's final loss against the lock's, by name
    assert ("Final loss, write-back (no lock) / lock (one run each): sparse 1.02 times, dense "
            "2.0 × 10^7 times. In place (no lock) / lock: dense 1.1 times.") in out
    assert ("Plain (non-atomic) in-place adds lost: dense 0.22%, sparse 0.00% (one run each). "
            "The 3 dense 4-worker in-place runs of *Lost updates* lost 0.008%-0.021%: in-place "
            "losses vary from run to run") in out


def test_summary_table_verdict_fails_on_a_quiet_machine(monkeypatch):
    runs = _table_runs(inplace_final=1e-6)  # above the write-back run's 4.2e-7
    monkeypatch.setattr(common, "load_per_core", lambda: 0.0)  # a quiet machine: a real failure
    with pytest.raises(AssertionError, match="in-place run ended below"):
        races.summary_table(runs)


def test_explain_mixed_reads_names_a_likely_cause_only_when_in_place_is_flagged_more(capsys):
    runs = _mixed_runs()
    races.explain_mixed_reads(runs)
    out = capsys.readouterr().out
    assert "more often than the write-backs" not in out
    assert "(less often than the write-backs' on this run)" in out
    runs["dense", "inplace"]["mixed_reads"] = 4400  # 36.7% against the write-backs' 31.7%
    races.explain_mixed_reads(runs)
    out = capsys.readouterr().out
    assert ("In place's reads overlap writes too (more often than the write-backs' on this run; "
            "a likely cause, not measured apart:") in out


def test_beside_counts_points_from_the_percentages_the_reader_sees():
    assert races._beside([0.48, 0.49], 0.476) == "0-1 points above it"  # 48-49% against 48%
    assert races._beside([0.30, 0.40], 0.43) == "3-13 points below it"
    assert races._beside([0.40, 0.50], 0.45) == "on both sides of it"
    assert races._beside([0.452, 0.448], 0.45) == "at it"
    assert races._beside([0.46, 0.461], 0.45) == "1 point above it"
