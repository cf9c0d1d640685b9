"""What notebook 11b prints and asserts beyond tests/test_lessons_parallelism.py: the longer
top-k runs repeating the budget runs, the paired test-loss gaps, the verdicts, the tree's
worked depth and the lines under the ring errors."""

import numpy as np
import pytest

from clusterlab.lessons import error_feedback_and_accuracy as l11b


def test_the_longer_runs_must_repeat_the_budget_runs():
    curve = np.linspace(2.0, 0.5, 40)
    ef_runs = {"topk:0.01": {"loss_curve": curve[:10]}}
    l11b.check_same_trajectory(ef_runs, {"topk:0.01": {"loss_curve": curve}}, budget=10)
    moved = curve.copy()
    moved[5] += 0.01  # other batches move a step's loss by far more
    with pytest.raises(AssertionError, match="left the 10-step one"):
        l11b.check_same_trajectory(ef_runs, {"topk:0.01": {"loss_curve": moved}}, budget=10)


def _res():
    n = 400
    base = np.r_[np.ones(300, bool), np.zeros(100, bool)]
    loss = np.linspace(0.2, 1.2, n)

    def run(up, down, shift, noise=0.0):
        c = base.copy()
        c[300:300 + up] = True
        c[:down] = False
        sl = loss + shift + noise * np.sin(np.arange(n))
        return {"correct": c, "accuracy": c.mean(), "sent_bytes": 100, "test_loss": sl.mean(),
                "sample_loss": sl}

    return {"none": {"correct": base, "accuracy": 0.75, "sent_bytes": 400,
                     "test_loss": loss.mean(), "sample_loss": loss},
            "fp16": run(0, 0, 1e-5), "powersgd:1": run(5, 40, 0.05, 0.1),
            "powersgd:4": run(4, 14, 0.004, 0.5), "topk:0.01": run(10, 14, 0.03, 0.1)}


def test_loss_gap_is_paired_and_the_verdicts_use_two_and_three_se():
    res = _res()
    mean, se = l11b.loss_gap(res, "topk:0.01")
    d = res["topk:0.01"]["sample_loss"] - res["none"]["sample_loss"]
    assert mean == pytest.approx(d.mean()) and se == pytest.approx(d.std(ddof=1) / 20)
    assert l11b.loss_gap({"none": {}, "x": {}}, "x") is None
    assert l11b.verdict(-4.6, "higher", "lower") == "lower (-4.6 s.e.)"
    assert l11b.verdict(-2.3, "higher", "lower") == "borderline lower (-2.3 s.e.)"
    assert l11b.verdict(0.8, "higher", "lower") == "cannot tell (+0.8 s.e.)"
    assert l11b.verdict(None, "higher", "lower") == "cannot tell (n/a)"
    assert l11b.loss_verdict(res, "fp16").startswith("negligible")  # a tiny, sure shift
    assert l11b.accuracy_z(res, "fp16") is None  # no discordant samples


def test_accuracy_table_prints_loss_se_c_b_and_a_verdict_per_method(capsys):
    res = _res()
    gap = {m: r["test_loss"] - res["none"]["test_loss"] for m, r in res.items()}
    l11b.print_accuracy_table(res, gap=gap, n_test=400)
    out = capsys.readouterr().out
    lead, compact = out.splitlines()[:2]
    # One compact table first: each comparison once, gap and verdict side by side.
    assert compact.index("test loss vs fp32 (paired s.e.)") < \
        compact.index("accuracy vs fp32 (paired)") < compact.index("steps to fp32's loss")
    assert any(line.lstrip().startswith("powersgd:1") and "higher (+" in line
               and "lower (-5." in line for line in out.splitlines()[2:8])
    # The full table (folded): the paired accuracy column beside the test loss, then the
    # unpaired accuracy; c / b folded.
    header = next(line for line in out.splitlines() if "accuracy ± 1 s.e." in line)
    assert header.index("paired s.e.") < header.index("accuracy vs fp32 (paired)") < \
        header.index("accuracy ± 1 s.e.") and "c / b" not in header
    # One line first, built from the verdicts below.
    assert lead == ("In short, test loss against fp32: fp16 changed it negligibly; powersgd:1, "
                    "topk:0.01 raised it beyond test-set noise; powersgd:4 left it within "
                    "noise. Accuracy: powersgd:1 lower (-5.4 s.e.), powersgd:4 borderline "
                    "lower (-2.4 s.e.), the others within noise (one run per method).")
    assert "c and b are the test samples the two models disagree on" in out
    se = l11b.loss_gap(res, "powersgd:1")[1]
    assert f"(+0.050 ± {se:.3f})" in out and "powersgd:1 5 / 40" in out
    verdicts = {line.split(": accuracy")[0].strip(): line for line in out.splitlines()
                if line.startswith("  ")}
    assert "accuracy lower (-5." in verdicts["powersgd:1"]
    assert "test loss higher" in verdicts["powersgd:1"]
    assert "accuracy borderline lower (-2." in verdicts["powersgd:4"]
    assert "accuracy cannot tell (-0." in verdicts["topk:0.01"]
    assert "accuracy cannot tell (n/a)" in verdicts["fp16"]
    assert "test loss negligible" in verdicts["fp16"]


def test_verdicts_say_they_cover_test_set_sampling_only_and_count_the_comparisons(capsys):
    res = _res()
    gap = {m: r["test_loss"] - res["none"]["test_loss"] for m, r in res.items()}
    l11b.print_accuracy_table(res, gap=gap, n_test=400)
    out = capsys.readouterr().out
    assert "test set's sampling only" in out and "seeds was not measured" in out
    assert "8 comparisons are made (accuracy and test loss of 4 methods)" in out
    assert "clear" not in out


def test_tree_vs_ring_works_out_nccls_depth_estimate():
    assert l11b.tree_vs_ring(1024, 8) == ("1024 GPUs at 8 per node: 7 + log₂ 128 = 14, "
                                          "against up to 1023 on the ring")
    assert l11b.tree_vs_ring(96, 8).endswith("7 + log₂ 12 = 10, against up to 95 on the ring")


def test_ring_errors_say_what_fp16_keeps(capsys):
    torch = pytest.importorskip("torch")
    ps = [2, 8]
    errors = {torch.float32: [1e-8, 1e-8], torch.bfloat16: [1e-3, 4e-2],
              torch.float16: [1e-4, 5e-3]}
    l11b.explain_ring_errors(errors, ps)
    out = capsys.readouterr().out
    assert ("fp16 keeps 3 more significant bits than bf16 (an eps 8x finer); its error after 7 "
            "hops was 8x smaller") in out
    assert "Correlated ranks" in out and "  p=2: " in out and "  p=8: " in out
    assert "1/eps = 128 hops and two to four times it after 256 to 512" in out


def test_summary_line_says_after_how_many_steps_and_whether_fp32_still_improved():
    res = _res()
    res["none"]["loss_curve"] = np.linspace(1.0, 0.5, 120)
    assert l11b.summary_line(res).startswith(
        "In short, after 120 steps (fp32 still improving), test loss against fp32: ")
    res["none"]["loss_curve"] = np.full(120, 0.5)
    assert "(fp32 no longer improving)" in l11b.summary_line(res)


def test_steps_to_target_reads_the_longer_runs_and_says_never(capsys):
    fast = np.r_[np.full(30, 2.0), np.full(100, 0.0)]
    longer = {"powersgd:1": {"loss_curve": fast},
              "powersgd:4": {"loss_curve": np.full(480, 2.0)},
              "topk-noef:0.01": {"loss_curve": fast}}
    reach = l11b.steps_to_target({"none": {}, "powersgd:1": {}, "powersgd:4": {}}, longer,
                                 target=0.0)
    assert reach == {"powersgd:1": (40, 130), "powersgd:4": (None, 480)}  # only methods shown
    assert "powersgd:1 40, powersgd:4 not within 480 (later than the budget: slower" in \
        l11b.reach_line(reach)
    assert "coincidence" not in l11b.reach_line(reach)
    assert "Equal counts are a coincidence of separate runs" in \
        l11b.reach_line({"powersgd:1": (40, 130), "powersgd:4": (40, 480)})
    res = _res()
    gap = {m: r["test_loss"] - res["none"]["test_loss"] for m, r in res.items()}
    l11b.print_accuracy_table(res, gap=gap, n_test=400, reach=reach)
    assert "Steps to reach fp32's end-of-budget training loss" in capsys.readouterr().out


def test_three_rank_example_climbs(capsys):
    assert tuple(l11b.three_rank_example()) == (-5, -5, -5)
    out = capsys.readouterr().out
    assert "rank 1: gradient (4, -5, 4), its top-1 sends (0, -5, 0)" in out
    assert "true sum (3, 3, 3): a step of lr along the sum sent changes the total loss by " \
           "about +45 lr (it climbs)." in out


def test_formats_table_from_finfo(monkeypatch):
    pytest.importorskip("torch")
    said = []
    monkeypatch.setattr(l11b.show, "say", said.append)
    l11b.show_formats()
    rows = said[0].splitlines()
    assert rows[2] == "| fp32 | 8 | 23 | 1.2e-07 | 3.4e+38 |"
    assert rows[3] == "| bf16 | 8 | 7 | 7.8e-03 | 3.39e+38 |"
    assert rows[4] == "| fp16 | 5 | 10 | 9.8e-04 | 6.55e+04 |"


def test_bias_word_tells_noise_from_a_slight_shrink_from_a_bias():
    assert l11b.bias_word(-0.0005, 0.0004, 0.038) == "noise: zero within 3 s.e."
    assert l11b.bias_word(-0.002, 0.0004, 0.038) == ("mostly noise, with a small but real bias: "
                                                     "the sum slightly behind")
    assert l11b.bias_word(-0.31, 0.0016, 0.34) == "a bias: the sum falls behind"


def test_ring_bias_finds_the_shared_part_a_bias(capsys):
    pytest.importorskip("torch")
    out = l11b.explain_ring_bias(512, draws=4)  # past 1/eps = 128 hops by four times
    assert out["shared"][0] < 0 and "a shared part" in capsys.readouterr().out
