"""The lesson modules of notebooks 07 (gradient scaling) and 08 (silent divergence): each
verdict, classification and formatted number on small synthetic runs. (06's and 06b's are in
test_lessons_async_collective_races.py and test_lessons_lock_free_updates.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from clusterlab.lessons import gradient_scaling as gs
from clusterlab.lessons import silent_divergence as sd

# --- 07: gradient scaling ------------------------------------------------------------------------


def _fix(own=1e-8, mom_end=0.0301, gc_end=2e-16, rel_mom=0.48):
    methods = {"mean_of_means": mom_end, "global_count": gc_end, "weighted": gc_end}
    return {"rel_error": {"mean_of_means": rel_mom, "global_count": 3.3e-16, "weighted": 3.3e-16},
            "param_error": {m: np.linspace(0.1, e, 200) for m, e in methods.items()},
            "params": {"mean_of_means": [np.array([1.0, 2.0 + own])]},
            "batch_sizes": (3, 10, 40, 99)}


OPT = {"shift": 0.0301, "scale": 1.7, "excess_loss": 0.26, "min_loss": 0.0094,
       "mean_of_means": np.array([1.0, 2.0])}


def test_distance_to_own_minimiser():
    assert gs.distance_to_own_minimiser({"mean_of_means": [np.array([1.0, 2.5])]}, OPT) == 0.5


def test_explain_fix(capsys):
    gs.explain_fix(_fix(), OPT, steps=200, mom=0.326)
    out = capsys.readouterr().out
    assert "max |w - w_full| after 200 steps" in out and "after 30" not in out
    assert "relative error, step 0" in out
    assert "gradient exact (error 3e-16, against 48% for the mean of means)" in out
    assert out.index("In short:") < out.index("max |w - w_full| after 200 steps")
    assert out.index("converges, but to another point") < out.index("one all-reduce of a single")
    assert "its own minimiser, 0.0301 from the full-batch one (1.8% of the largest" in out
    assert "full-data loss is 0.0118 instead of the optimum's 0.0094 (+26%)" in out
    assert "the lowest this model reaches on these 152 samples" in out
    # the shift's cause is stated as a principle, not as something this run shows
    assert "1.0e-08" not in out and "only sampling noise moves it" in out
    assert "in principle" in out and "not run here" in out
    with pytest.raises(AssertionError, match="its own minimiser"):
        gs.explain_fix(_fix(own=1e-3), OPT, steps=200, mom=0.326)
    with pytest.raises(AssertionError):  # not "tens of percent"
        gs.explain_fix(_fix(), OPT, steps=200, mom=0.05)


def test_micro_batch_weights_give_each_token_its_share_ratio(capsys):
    gs.micro_batch_weights(tokens=(10, 90))
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("= 0.0500 instead of 1/T = 0.0100: 5.00x its share")
    assert out[1].endswith(": 0.56x its share")


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
    assert ("2.400000e-03 after step 0, 2.400000e-03 after step 24 (relative change <= 0.0e+00: "
            "rounding only)") in out
    assert "rank 0's loss, last 10 steps: 0.10% off" in out
    assert "(both within 0.8% of it)" in out and "which replica the checkpoint" in out
    assert "loss on a fixed batch of training rows (the same on every rank)" in out
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
    expo["grad_norm"][12] = 30.0  # the norm has not come back down
    with pytest.raises(AssertionError, match="back to the healthy run's scale"):
        sd.explain_exponent_flip(expo, healthy)
    expo["grad_norm"][12] = 1.9
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


def _detection(first_step=14, reported=15, later_ranks=(0, 1, 2, 3), repeats=True):
    nan_first = {"kind": "nan", "ranks": [3], "step": 23, "reported": 25}
    first = {"kind": "parameter_mismatch", "ranks": [2], "step": first_step, "reported": reported}
    again = [dict(first, step=s, reported=s + 1) for s in range(first_step + 5, 30, 5)]
    return [
        {"scenario": "healthy", "first": None, "alerts": [], "rank": None, "step": None},
        {"scenario": "param_changed", "rank": 2, "step": 12, "first": first,
         "alerts": [first] + (again if repeats else [])},
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
    assert "alert again at every later check, up to step 29: a split persists" in out
    sd.explain_detection(_detection(later_ranks=(3,)), every=5, world=4)
    assert "on ranks [3]\n" in capsys.readouterr().out
    with pytest.raises(AssertionError):  # delivered two steps after its check
        sd.explain_detection(_detection(reported=16), every=5, world=4)
    with pytest.raises(AssertionError):  # labelled after the first check step
        sd.explain_detection(_detection(first_step=19, reported=20), every=5, world=4)
    with pytest.raises(AssertionError):  # the split's later checks were silent
        sd.explain_detection(_detection(repeats=False), every=5, world=4)


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
    assert row == (f"{'optimizer_detached':19s} {'2.800 -> 2.800':>23s}      2.80 "
                   f"{'0.0e+00':>20s} {'0 of 29':>21s}      0")
    assert "29 of 29" in sd.stall_row("healthy", _stall()["healthy"], steps=30)


def test_explain_stall(capsys):
    sd.explain_stall(_stall(), steps=30, lr=0.05, world=4, batch=16)
    out = capsys.readouterr().out
    assert ("lr_divided's first update is 0.0156 of the healthy run's, "
            "1 / (W x batch) = 0.0156") in out
    assert out.rstrip().endswith("a checksum that never moves flags optimizer_detached")
    assert "loss after step 0 -> 29" in out and "steps weights changed" in out
    assert "‖Δw‖/‖g‖ (SGD: = lr)" in out  # the column named by its formula
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
    assert "NVIDIA/nccl#434" in text  # the reported split, folded for reference
    assert "Corruption while the sum is forwarded** (our inference" in text
    assert "end of `Join`" in text  # DDP's one other parameter broadcast
    visible = facts.render(sd.IDENTICAL_BYTES)
    assert visible.count("\n- ") == 2, "three one-liners on the learner's path"


def test_explain_recreated_names_the_error_and_the_silent_drift(capsys):
    runs = {False: {"find_unused": False, "step": 1,
                    "message": "Expected to have finished reduction in the prior iteration"},
            True: {"find_unused": True, "step": None, "message": "", "first_gap": 0.0,
                   "last_gap": 0.081}}
    sd.explain_recreated(runs)
    out = capsys.readouterr().out
    assert "DDP raises in iteration 2 (the first left" in out and "largest gap 8.1e-02" in out
    assert "first layer stays identical (gap 0)" in out
    with pytest.raises(AssertionError):  # the hooked layer drifting too is another story
        sd.explain_recreated({**runs, True: {**runs[True], "first_gap": 1e-3}})


def test_sampler_indices_deal_one_order_out_or_overlap(capsys):
    sd.sampler_indices(dataset_size=64, world=2, count=8)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("same seed on every rank: the shuffled order starts [")
    assert out[1].startswith("    rank 0 takes positions 0, 2, 4, ...: [")
    assert out[3].startswith("seed = rank: rank 0 [")
