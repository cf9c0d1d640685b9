"""The lesson modules of notebooks 06 (races), 07 (gradient scaling) and 08 (silent
divergence): each verdict, classification and formatted number on small synthetic runs."""

from __future__ import annotations

import numpy as np
import pytest

from clusterlab.experiments import common
from clusterlab.lessons import gradient_scaling as gs
from clusterlab.lessons import races_and_lock_free_updates as races
from clusterlab.lessons import silent_divergence as sd

# --- 06: races and lock-free updates -----------------------------------------------------------


def _variant(reads=80, wrong=0, disagree=0, **extra):
    return {"reads": reads, "wrong_trials": wrong, "disagree_trials": disagree, **extra}


def _async(edit_wrong=80, read_wrong=80, edit_disagree=0, fix_wrong=0):
    v = {n: _variant(wrong=fix_wrong) for n in races.ASYNC_FIXES}
    v["read_before_wait"] = _variant(wrong=read_wrong, wrong_elements=0.997, local=0.96)
    v["edit_before_wait"] = _variant(wrong=edit_wrong, disagree=edit_disagree, edit_sent=0.737,
                                     edit_lost=0.0, wrong_elements=1.0)
    return {"variants": v, "trials": 20, "workers": 4}


def test_agreeing_wrong_trials_subtracts_disagreeing_and_possibly_right_trials():
    assert races.agreeing_wrong_trials(_async(edit_wrong=80, edit_disagree=3)) == 17
    # 8 right reads: at most 8 // 4 = 2 trials were right on every rank
    assert races.agreeing_wrong_trials(_async(edit_wrong=72, edit_disagree=3)) == 15


def test_explain_async_races_says_at_least_only_when_some_reads_were_right(capsys):
    races.explain_async_races(_async(), _async())
    out = capsys.readouterr().out
    assert "own value 96.0%, partly reduced 3.7%" in out
    assert "  in 20 of 20 trials every rank held the same wrong values" in out
    assert "happened to be right: 0 of 80 (1 MiB bucket), 0 of 80 (one element): none" in out
    races.explain_async_races(_async(edit_wrong=72, read_wrong=76), _async(read_wrong=80))
    out = capsys.readouterr().out
    assert "  in at least 18 of 20 trials" in out
    assert "right: 4 of 80 (1 MiB bucket), 0 of 80 (one element): such a read passes" in out


def test_explain_async_races_asserts_the_fixes_were_right():
    with pytest.raises(AssertionError, match="wait_then_read"):
        races.explain_async_races(_async(fix_wrong=1), _async())
    with pytest.raises(AssertionError):
        races.explain_async_races(_async(read_wrong=0), _async())


def test_overlap_sentence_classifies_by_1_3_cores():
    assert races.overlap_sentence(1.71).endswith(
        "1.71 at once (CPU s per wall s): they overlapped.")
    assert "mostly took turns" in races.overlap_sentence(1.3)


def _hogwild(final, initial=0.43, **extra):
    return {"updates": 12000, "initial_loss": initial, "final_loss": final, **extra}


def test_explain_hogwild_states_the_verdict_once(capsys, monkeypatch):
    runs = {("dense", "writeback"): _hogwild(1.1e-7), ("dense", "lock"): _hogwild(6.5e-15),
            ("dense", "inplace"): _hogwild(6.0e-15, parallelism=1.71)}
    races.explain_hogwild(runs)
    out = capsys.readouterr().out
    assert "loss 0.43 -> 1.1e-07 with write-backs, 6.0e-15 in place, 6.5e-15 with a lock" in out
    assert "Shown on this run: the in-place run ended below the write-back run." in out
    assert out.count("in-place run ended below") == 1  # no duplicate of conclude's line
    runs["dense", "inplace"] = _hogwild(1e-6, parallelism=1.71)  # above the write-back run
    runs["dense", "lock"] = _hogwild(1e-8)
    monkeypatch.setattr(common, "load_per_core", lambda: 0.0)  # a quiet machine: a real failure
    with pytest.raises(AssertionError, match="in-place run ended below"):
        races.explain_hogwild(runs)


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


def test_explain_lost_updates_reads_the_ranges_and_the_parallelism(capsys):
    races.explain_lost_updates(_rep(), _runs_lost(), problem=_Problem(), cores=2)
    out = capsys.readouterr().out
    assert "Write-backs lost 38%-42% with 2 workers and 58%-62% with 4 (3 runs each" in out
    assert "lost 57%; only the scheduling differs" in out
    assert "In place lost a median of 22 and at worst 28 of 384,000" in out
    assert "(12,000 updates × 32 coordinates) in one run (6 runs)" in out
    assert "far above the median" not in out
    assert "in place 1.76 and 1.75." in out
    assert "Only 1.75 of the 4 write-back workers ran at once" in out
    races.explain_lost_updates(_rep(par_wb=(1.9, 3.5), par_in=(1.2, 1.9)), _runs_lost(),
                               problem=_Problem(), cores=4)
    out = capsys.readouterr().out
    assert ": too few at once to test the in-place race on this run." in out
    assert "Only" not in out


def test_explain_lost_updates_asserts_what_the_text_says():
    with pytest.raises(AssertionError):
        races.explain_lost_updates(_rep(), _runs_lost(lock_lost=1), problem=_Problem(), cores=2)
    with pytest.raises(AssertionError):  # in place losing as much as write-backs
        races.explain_lost_updates(_rep(lost_in=(150000, 230000)), _runs_lost(),
                                   problem=_Problem(), cores=2)


def _locked_curve():
    return {"curve_loss": np.array([1.0, 0.5, 0.1, 0.01]),
            "curve_updates": np.array([0, 100, 200, 300]),
            "curve_updates_after": np.array([5, 105, 205, 305])}


def test_survivor_prediction_brackets_the_locked_run():
    wb = {"counted": 150 * 32, "final_loss": 0.2}
    assert races.survivor_prediction(wb, _locked_curve(), nnz=32) == (150, 100, 205)
    with pytest.raises(AssertionError):  # the locked run's first sample is already that low
        races.survivor_prediction({"counted": 0, "final_loss": 2.0}, _locked_curve(), nnz=32)


def test_prediction_sentence_held_or_missed_by():
    held = races.prediction_sentence(150, 100, 205, 1000)
    assert held.startswith("The prediction above (the loss of as many locked updates as "
                           "survived) held: 150 of 1,000 dense write-backs survived")
    assert held.endswith("after 100-205 updates.")
    assert "missed by 32%:" in races.prediction_sentence(300, 100, 205, 1000)  # 95 / 300
    assert "missed by 100%:" in races.prediction_sentence(50, 100, 205, 1000)  # 50 / 50


def _convergence_runs(wb_final=0.2, counted=150 * 32):
    curve = _locked_curve()
    return {("dense", "writeback"): {"lost_fraction": 0.568, "final_loss": wb_final,
                                     "counted": counted, "updates": 1000,
                                     "curve_updates": np.array([0, 300, 600, 900, 1000]),
                                     "curve_loss": np.array([1.0, 0.8, 0.5, 0.3, wb_final])},
            ("dense", "lock"): {"final_loss": 1e-8, **curve},
            ("sparse", "writeback"): {"lost_fraction": 0.0014, "final_loss": 1.02e-3,
                                      "initial_loss": 1.0},
            ("sparse", "lock"): {"final_loss": 1e-3}}


def test_explain_convergence(capsys):
    races.explain_convergence(_convergence_runs(), problem=_Problem())
    out = capsys.readouterr().out
    assert "Lost without a lock: dense 56.8%, sparse 0.14%." in out
    assert "sparse 1.02x, dense 2.0e+07x." in out
    assert "survived) held: 150 of 1,000" in out and "cannot say why" not in out
    assert ("Shown on this run: the write-back run's loss was still falling over its last third: "
            "it converges, only slower.") in out
    assert "The write-back run's loss" not in out
    assert "it converges, only slower." in out
    races.explain_convergence(_convergence_runs(counted=300 * 32), problem=_Problem())
    out = capsys.readouterr().out
    assert "missed by 32%" in out and "These runs cannot say why" in out


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
    assert ("Shown on this run: wall-clock costs, which need a second core free for the "
            "lock-free workers: 2 in-place workers got 1.97 cores, 1.3 needed.") in (
                capsys.readouterr().out)
    assert not races.costs_measurable(_cost(p_in2=1.1))
    out = capsys.readouterr().out
    assert out.startswith("Not shown on this run") and "shared about 1.10 cores" in out


def test_surviving_rates_discount_the_lost_updates():
    surv = races.surviving_rates(_cost())
    assert np.allclose(surv["writeback"][0], [13.5e3, 15e3, 16.5e3])
    assert np.allclose(surv["lock"][1], 0.63 * np.array([53.1e3, 59e3, 64.9e3]))


def test_versus_one_compares_ranges():
    assert races.versus_one(np.array([5, 6]), np.array([1, 4])) == "higher, ranges apart by 25%"
    assert races.versus_one(np.array([1, 2]), np.array([3, 4])) == "lower, ranges apart by 50%"
    assert races.versus_one(np.array([1, 3]), np.array([2, 4])) == "ranges overlap"


def test_largest_factor_names_the_biggest_of_the_identity():
    assert races.largest_factor(68, 69, 59, 37) == "the lock slowed down with 2"
    assert races.largest_factor(100, 190, 95, 90) == "in place sped up with 2"
    assert races.largest_factor(200, 210, 50, 45) == "in place was already faster with 1 worker"


def test_factor_ranges_apart_hedges_a_largest_factor_whose_runs_overlap(capsys):
    cost = _cost()
    apart = races.factor_ranges_apart(races.surviving_rates(cost), 0, 1)
    assert apart["the lock slowed down with 2"] and not apart["in place sped up with 2"]
    cost["rate"]["lock"][1] = cost["rate"]["lock"][0] * np.array([0.5, 0.6, 1.0])  # overlapping
    races.explain_cost(cost, problem=_Problem())
    assert "cannot say which factor is largest" in capsys.readouterr().out


def test_ranking_orders_by_median_and_marks_overlaps():
    surv = {"inplace": [np.array([9, 10, 11])], "seqlock": [np.array([8, 9, 10])],
            "lock": [np.array([4, 5, 6])], "writeback": [np.array([3, 4.5, 5])]}
    assert races.ranking(surv, races.MODES, 0) == "in place ≈ seqlock > lock ≈ write-back"


def test_explain_cost(capsys):
    races.explain_cost(_cost(), problem=_Problem())
    out = capsys.readouterr().out
    assert "in place 68,000 -> 68,000 (ranges overlap), lock 59,000 -> 37,170 (lower" in out
    assert "1.83x = 1.15x (with 1 worker) × 1.00x (in place, 2 workers / 1) × 1.59x" in out
    assert "the largest factor is that the lock slowed down with 2." in out
    assert "in place 1.00 -> 1.90 at once, 15 -> 28 µs of CPU per update" in out
    assert "two cores writing the same 32 coordinates" in out and "handing it" in out
    assert "4 workers on 2 cores (more workers than cores): in place" in out
    assert "spread by up to 20% with 1 worker" in out
    races.explain_cost(_cost(grow=False), problem=_Problem())
    assert "Possible causes" not in capsys.readouterr().out


def _allreduce_runs(final=6.6e-5, lock_lost=0):
    return {("dense", "allreduce"): {"examples": 12000, "steps": 47, "elapsed_s": 0.29,
                                     "steps_per_s": 160.0, "examples_per_s": 40754.0,
                                     "workers": 4, "lost": 0, "replicas_agree": True,
                                     "final_loss": final, "initial_loss": 0.43},
            ("dense", "writeback"): {"updates": 12000, "final_loss": 1.1e-7},
            ("dense", "lock"): {"lost": lock_lost}, ("dense", "seqlock"): {"lost": 0}}


def test_explain_allreduce(capsys):
    races.explain_allreduce(_allreduce_runs())
    out = capsys.readouterr().out
    assert "12,000 examples in 47 updates, 0.3 s: 160 updates/s, 40,754 examples/s" in out
    assert "Its final loss, above the write-back run's, does not rank the two" in out
    races.explain_allreduce(_allreduce_runs(final=1e-8))
    assert "does not rank" not in capsys.readouterr().out
    with pytest.raises(AssertionError):
        races.explain_allreduce(_allreduce_runs(lock_lost=3))


# --- 07: gradient scaling ------------------------------------------------------------------------


def _fix(own=1e-8, mom_end=0.0301, gc_end=2e-16, rel_mom=0.48):
    methods = {"mean_of_means": mom_end, "global_count": gc_end, "weighted": gc_end}
    return {"rel_error": {"mean_of_means": rel_mom, "global_count": 3.3e-16, "weighted": 3.3e-16},
            "param_error": {m: np.linspace(0.1, e, 200) for m, e in methods.items()},
            "params": {"mean_of_means": [np.array([1.0, 2.0 + own])]},
            "batch_sizes": (3, 10, 40, 99)}


OPT = {"shift": 0.0301, "scale": 1.7, "excess_loss": 0.26, "mean_of_means": np.array([1.0, 2.0])}


def test_distance_to_own_minimiser():
    assert gs.distance_to_own_minimiser({"mean_of_means": [np.array([1.0, 2.5])]}, OPT) == 0.5


def test_explain_fix(capsys):
    gs.explain_fix(_fix(), OPT, steps=200, mom=0.326)
    out = capsys.readouterr().out
    assert "parameters after 200 steps" in out and "after 30" not in out
    assert "from 48% to 3e-16, for one all-reduce" in out
    assert "has converged, but to its own minimiser (1.0e-08 away), 0.0301 from the" in out
    assert "0.0301 from the full-batch one (1.8% of the largest parameter)" in out
    assert "+26% above its minimum" in out and "sampling noise in 3 to 99 samples" in out
    with pytest.raises(AssertionError, match="its own minimiser"):
        gs.explain_fix(_fix(own=1e-3), OPT, steps=200, mom=0.326)
    with pytest.raises(AssertionError):  # not "tens of percent"
        gs.explain_fix(_fix(), OPT, steps=200, mom=0.05)


def test_explain_adam(capsys):
    sm = {"world_sizes": (1, 4),
          "loss": {"sum": [np.array([1.0, 0.5])] * 2, "mean": [np.array([1.0, 0.5])] * 2},
          "grad_norm": {"sum": [64.0, 16.0], "mean": [1.0, 1.0]}}
    gs.explain_adam(sm, _fix(mom_end=0.0300, own=3.7e-5), OPT, final={1: (0.5, 2.1e23)},
                    steps=200)
    out = capsys.readouterr().out
    assert "Adam, W=1: the summed loss's gradient is 64x" in out and "W=4" in out
    assert "(SGD, same lr, W=1: summed loss ended at 2.1e+23)" in out
    assert "ends 0.0300 from full-batch Adam and 3.7e-05 from" in out
    sm["loss"]["sum"] = [np.array([1.0, 0.6])] * 2  # a constant factor that did not cancel
    with pytest.raises(AssertionError):
        gs.explain_adam(sm, _fix(), OPT, final={1: (0.5, 2.1e23)}, steps=200)


# --- 08: silent divergence -----------------------------------------------------------------------


def _run(steps=25, world=4, odd=(), distance=0.0, loss=0.1, eval_loss=None):
    fp = np.zeros((steps, world, 2), dtype=np.int64)
    for r in odd:
        fp[:, r] = 1
    d = np.zeros((steps, world))
    for r in odd:
        d[:, r] = distance
    return {"fingerprint": fp, "distance": d, "loss": np.full((steps, world), loss),
            "eval_loss": np.full((steps, world), 0.0648) if eval_loss is None else eval_loss}


def test_explain_changed(capsys):
    healthy = _run()
    ev = np.full((25, 4), 0.0648)
    ev[-1, 2] = 0.0643
    changed = _run(odd=(2,), distance=2.4e-3, loss=0.1001, eval_loss=ev)
    sd.explain_changed(changed, healthy, steps=25)
    out = capsys.readouterr().out
    assert "differs from rank 0's: [2]" in out
    assert "2.400000e-03 after step 0, 2.400000e-03 after step 24 (moved by at most 0.0e+00" in out
    assert "rank 0's loss, last 10 steps: 0.10% off" in out
    assert "(both within 0.8% of it)" in out and "which replica the checkpoint" in out
    assert "loss on a fixed evaluation batch (the same on every rank)" in out
    assert "held-out" not in out  # the evaluation rows are also in the training pool
    with pytest.raises(AssertionError, match="within 5%"):
        sd.explain_changed(_run(odd=(2,), distance=1e-3, loss=0.2, eval_loss=ev), healthy,
                           steps=25)


def test_explain_exponent_flip(capsys, monkeypatch):
    from clusterlab.experiments import divergence

    monkeypatch.setattr(divergence, "hidden_saturation", lambda run: {
        "unit": 0, "n": 4096, "min_abs_z": 1.4e31, "zero_grad_share": 1.0})
    healthy = _run()
    healthy["grad_norm"] = np.full((25, 4), 2.29)
    healthy["params"] = np.full((4, 161), 0.5)
    expo = _run()
    expo["grad_norm"] = np.full((25, 4), 1.9)
    expo["grad_norm"][10] = np.inf
    expo["injected"] = (-0.0666, -2.27e37)
    expo["params"] = np.full((4, 161), 0.5)
    expo["params"][:, 0] = 2.8e35
    expo["finite"] = np.ones((25, 4), dtype=bool)
    sd.explain_exponent_flip(expo, healthy)
    out = capsys.readouterr().out
    assert "inf (its float32 sum of squares overflows), the same on every rank: True" in out
    assert "at most 5 of its 161 synchronised gradient elements" in out
    assert "at flat index 0: the flipped element" in out and "exactly 0 in float32: 100%" in out
    expo["params"][:, 0], expo["params"][:, 3] = 0.5, 2.8e35  # the huge weight elsewhere
    with pytest.raises(AssertionError):
        sd.explain_exponent_flip(expo, healthy)


def test_fingerprint_tells_swapped_weights_apart_and_equal_copies_alike():
    import copy

    import torch

    torch.manual_seed(0)
    a = torch.nn.Linear(4, 2)
    b, c = copy.deepcopy(a), copy.deepcopy(a)
    with torch.no_grad():
        w = b.weight.view(-1)
        w[[0, 1]] = w[[1, 0]].clone()
    fa, fb = sd.fingerprint(a), sd.fingerprint(b)
    assert fa.shape == (4,) and torch.equal(fa, sd.fingerprint(c))
    assert torch.equal(fa[0::2], fb[0::2]) and not torch.equal(fa[1::2], fb[1::2])


def test_first_check_at_or_after():
    assert [sd.first_check_at_or_after(s, 5) for s in (0, 4, 12, 14, 17, 23)] == [
        4, 4, 14, 14, 19, 24]


def _detection(first_step=14, reported=15, later_ranks=(0, 1, 2, 3)):
    nan_first = {"kind": "nan", "ranks": [3], "step": 23, "reported": 25}
    return [
        {"scenario": "healthy", "first": None, "alerts": [], "rank": None, "step": None},
        {"scenario": "param_changed", "rank": 2, "step": 12, "alerts": [],
         "first": {"kind": "parameter_mismatch", "ranks": [2], "step": first_step,
                   "reported": reported}},
        {"scenario": "grad_before", "rank": 3, "step": 23, "first": nan_first,
         "alerts": [nan_first, {"kind": "nan", "ranks": list(later_ranks), "step": 29,
                                "reported": 30}]},
    ]


def test_alert_sentence():
    det = _detection()
    assert sd.alert_sentence(det[0]) == f"{'healthy':32s} -> no alert"
    assert sd.alert_sentence(det[1]) == (
        f"{'param_changed (rank 2, step 12)':32s} -> parameter_mismatch on ranks [2], labelled "
        "step 14, delivered at the end of step 15")


def test_explain_detection(capsys):
    sd.explain_detection(_detection(), every=5, world=4)
    out = capsys.readouterr().out
    assert "deliver 1 more alert(s), on ranks [0, 1, 2, 3]: the all-reduce spread the NaN" in out
    sd.explain_detection(_detection(later_ranks=(3,)), every=5, world=4)
    assert "on ranks [3]\n" in capsys.readouterr().out
    with pytest.raises(AssertionError):  # delivered two steps after its check
        sd.explain_detection(_detection(reported=16), every=5, world=4)
    with pytest.raises(AssertionError):  # labelled after the first check step
        sd.explain_detection(_detection(first_step=19, reported=20), every=5, world=4)


def _stall(steps=30, world=4, batch=16, lr=0.05):
    def run(ev_last, ratio, moving):
        grad = np.full((steps, world), 2.8)
        fp = np.zeros((steps, world, 2), dtype=np.int64)
        if moving:
            fp += np.arange(steps)[:, None, None]
        return {"eval_loss": np.linspace(2.8, ev_last, steps)[:, None].repeat(world, axis=1),
                "grad_norm": grad, "update_norm": ratio * grad,
                "update_ratio": np.full((steps, world), ratio), "fingerprint": fp,
                "alerts": [], "distance": np.zeros((steps, world))}

    return {"healthy": run(0.05, lr, True), "optimizer_detached": run(2.8, 0.0, False),
            "lr_divided": run(2.66, lr / (world * batch), True)}


def test_stall_row_counts_the_checksum_moves():
    row = sd.stall_row("optimizer_detached", _stall()["optimizer_detached"], steps=30)
    assert row == f"{'optimizer_detached':19s}     2.800 -> 2.800      2.80    0.0e+00 " + (
        f"{'0 of 29':>21s}      0")
    assert "29 of 29" in sd.stall_row("healthy", _stall()["healthy"], steps=30)


def test_explain_stall(capsys):
    sd.explain_stall(_stall(), steps=30, lr=0.05, world=4, batch=16)
    out = capsys.readouterr().out
    assert ("lr_divided's first update is 0.0156 of the healthy run's, "
            "1 / (W x batch) = 0.0156") in out
    assert out.rstrip().endswith("a checksum that never moves flags optimizer_detached")
    assert "loss, step 0 -> 29" in out and "steps weights changed" in out
    assert "held-out" not in out and "*" not in out
    stall = _stall()
    stall["lr_divided"]["alerts"] = [{"kind": "nan"}]  # a dashboard would have flagged it
    with pytest.raises(AssertionError):
        sd.explain_stall(stall, steps=30, lr=0.05, world=4, batch=16)


def _drift(gap_ulps=1, weight=0.75):
    def run(split):
        p = np.full((4, 161), 0.5)
        p[:, 7] = weight
        if split:
            p[2, 7] = weight + gap_ulps * float(np.spacing(np.float32(weight)))
        d = np.zeros((25, 4))
        d[:, 2] = abs(p[2, 7] - p[0, 7])
        return {"params": p, "distance": d}

    return {"manual_allreduce": run(False), "split_batch_before": run(False),
            "sum_order": run(True), "float64_update": run(True)}


def test_ulps_apart_counts_float32_spacings_at_the_weight():
    gap, w, n = sd.ulps_apart(_drift(gap_ulps=1, weight=0.75)["sum_order"])
    assert w == 0.75 and n == 1 and gap == 2.0 ** -24
    assert sd.ulps_apart(_drift(gap_ulps=3, weight=-0.3)["sum_order"])[2] == 3


def test_explain_last_bits(capsys):
    sd.explain_last_bits(_drift(), steps=25)
    out = capsys.readouterr().out
    assert "vs manual_allreduce = max weight difference from that run" in out
    assert "sum_order: its gap 6.0e-08 is 1 ulp of the weight it sits at (+0.750)" in out
    assert "float64_update" in out and "split_batch_before" not in out
    assert "float32 eps = 1.2e-07 (dotted in the plot) is that spacing at 1.0" in out
    with pytest.raises(AssertionError, match="last bits"):
        sd.explain_last_bits(_drift(gap_ulps=5000), steps=25)


def test_reference_notes_fold_into_one_details_element():
    from clusterlab import facts

    text = facts.render(sd.REFERENCE)
    assert text.startswith("<details><summary>For reference")
    assert text.count("</details>") == 1 and "TORCH_NCCL_NAN_CHECK" in text
    assert "corruption while the sum is forwarded" in facts.render(sd.IDENTICAL_BYTES)
