"""Notebook 04's lesson (jitter at scale): the measured-against-simulated ratio with its
standard error, the split of a step without a hiccup, and the collapse's step times, on small
synthetic inputs (no processes, no absolute times). The rest is in test_lessons_ddp_jitter.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from clusterlab.lessons import jitter_and_scale as lesson


@pytest.fixture
def said(monkeypatch):
    texts = []
    monkeypatch.setattr(lesson, "say", texts.append)
    return texts


def test_measured_over_simulated_gives_the_ratio_and_one_standard_error():
    x, se = lesson.measured_over_simulated([1.0, 1.2, 1.4], 1.0)
    assert x == pytest.approx(1.2) and se == pytest.approx(0.2 / np.sqrt(3))


def fake_collapse(calm_steps, rough_steps, sim_calm=0.078, sim_rough=0.13):
    """Real rows at 1, 2, 4 and 8 ranks and simulated rows at 2, 4 and 8, one rank per node."""
    def real(steps8, eff2):
        steps8 = np.asarray(steps8)
        return [{"nodes": 1, "efficiency": 1.0, "mean_step_s": 0.05},
                {"nodes": 2, "efficiency": eff2, "mean_step_s": 0.05 / eff2},
                {"nodes": 4, "efficiency": 0.75, "mean_step_s": 0.05 / 0.75},
                {"nodes": 8, "efficiency": 0.05 / steps8.mean(), "mean_step_s": steps8.mean(),
                 "run": SimpleNamespace(step_times=steps8)}]

    def sim(step8):
        return [{"nodes": n, "efficiency": 0.05 / s, "mean_step_s": s}
                for n, s in ((2, 0.054), (4, 0.062), (8, step8))]
    return {"real": {"calm": real(calm_steps, 0.9), "rough": real(rough_steps, 0.8)},
            "sim": {"calm": sim(sim_calm), "rough": sim(sim_rough)}}


def test_explain_measured_says_within_or_above_by_the_standard_error(verdicts, said):
    calm = [0.0815, 0.0820, 0.0825]          # x1.05, se tiny: above by the host's cost
    rough = [0.10, 0.13, 0.16]               # x1.00, se 0.13: within
    lesson.explain_measured(fake_collapse(calm, rough))
    text = said[-1]
    assert "×1.051 ± 0.004 without jitter and ×1.000 ± 0.133 with the tail" in text
    assert "Within two standard errors of 1 with the tail; more than two above without " \
           "jitter (probably this host's own cost" in text
    # x1.051: the deviation is rounded up
    assert "The measured mean steps are within 6 % of the simulated: the dots sit" in text
    assert text.index("</details>") > text.index("Within two standard errors")
    assert verdicts[-1][0] is True


def test_explain_measured_says_when_the_host_shows(verdicts, said):
    lesson.explain_measured(fake_collapse([0.0900, 0.0905, 0.0910], [0.13, 0.13, 0.13]))
    assert "differ from the simulated by up to 17 %: slower without jitter" in said[-1]


def test_explain_measured_does_not_call_an_unresolved_step_slower(said):
    # without jitter x1.15 but se ~0.1: within two standard errors, so not "slower"
    lesson.explain_measured(fake_collapse([0.07, 0.09, 0.11], [0.13, 0.13, 0.13]))
    assert "not resolved from the simulated without jitter (within two standard errors)" \
        in said[-1]
    assert "slower without jitter" not in said[-1] and "host's own cost" not in said[-1]


def test_split_without_hiccup_adds_up_to_the_mean_step():
    run = SimpleNamespace(slow=np.array([[1, 0], [0, 0], [0, 1], [0, 0]], dtype=bool),
                          wait_for_slowest=np.array([0.018, 0.070, 0.019]),
                          after_last_arrival=np.array([0.5, 0.021, 0.020, 0.022]))
    to_arrival, exchange = lesson.split_without_hiccup(run)
    assert to_arrival == pytest.approx(0.0185) and exchange == pytest.approx(0.0215)


def tail_rows(agree, steps=50):
    """Tail-at-scale rows at 2, 4 and 8 ranks whose step duration matched the draws on a share
    `agree` of the steps (one per rank count); every step without a hiccup is 34 ms."""
    run = SimpleNamespace(slow=np.zeros((5, 2), dtype=bool),
                          step_times=np.full(4, 0.034), wait_for_slowest=np.full(4, 0.016),
                          after_last_arrival=np.full(5, 0.018), config={"compute_s": 0.015})
    return [{"nodes": n, "slow_share": s, "predicted": p, "steps": steps, "drawn_share": s,
             "agree": a, "run": run}
            for (n, s, p), a in zip(((2, 0.16, 0.19), (4, 0.40, 0.34), (8, 0.68, 0.57)), agree)]


def test_explain_tail_says_on_how_many_steps_the_duration_told_the_hiccups(verdicts, said):
    lesson.explain_tail(tail_rows((1.0, 1.0, 1.0)), native={8: 0.0191}, ring_s=0.0028)
    assert verdicts[0][1] == ("every step's duration told whether a rank drew a hiccup, on "
                              "50 of 50, 50 of 50 and 50 of 50 steps on 2, 4 and 8 ranks")
    lesson.explain_tail(tail_rows((1.0, 0.98, 0.9)), native={8: 0.0191}, ring_s=0.0028)
    holds, claim, _ = verdicts[2]
    assert holds and claim.startswith("a step's duration told") and "49 of 50 and 45 of 50" in claim
    # the host's bookkeeping of a step without a hiccup is collapsed
    assert "<details><summary>What a step without a hiccup is made of</summary>" in said[-1]
    assert said[-1].index("</details>") < said[-1].index("At 1024 ranks")


def test_explain_jitter_growth_pairs_the_step_with_its_own_last_arrivals(verdicts, said):
    def row(n, extra, arrival, predicted):
        return {"nodes": n, "extra_s": extra, "predicted_s": predicted,
                "arrival_extra_s": arrival, "calm_lateness_s": arrival - extra,
                "jittery_after_s": 0.002, "calm_after_s": 0.002, "drawn_max_s": arrival,
                "jittery": SimpleNamespace(step_times=np.array([0.10, 0.25, 0.15])),
                "calm": SimpleNamespace(step_times=np.array([0.11, 0.11, 0.12]))}
    lesson.explain_jitter_growth([row(2, 0.0366, 0.0372, 0.0333), row(8, 0.0715, 0.0785, 0.0778)],
                                 native={2: 0.0024, 8: 0.0191})
    # the paired last-arrival sentence is cut (its sign made "hid" false on some runs)
    assert "last arrival minus step growth" not in said[-1]
    assert said[-1].endswith("so the points are not independent tests. For scale, this host's own "
                             "plain Gloo all-reduce took 2.4 ms and 19.1 ms on 2 and 8 ranks."
                             "\n</details>")
    # why the interval is wide, in sight: the spread of 3 steps, not the prediction's fault
    assert ("The ± is wide (44.2 ms on 2 ranks) because jitter this large makes single steps "
            "vary a lot: 3 steps show the trend, they do not pin the value.") in said[-1]


def test_explain_gap_words_the_all_reduce_after_from_its_sign(verdicts, said):
    def row(n, calm_after, jittery_after):
        return {"nodes": n, "extra_s": 0.03, "predicted_s": 0.0333, "arrival_extra_s": 0.031,
                "calm_lateness_s": 0.001, "calm_after_s": calm_after,
                "jittery_after_s": jittery_after, "drawn_max_s": 0.031}
    lesson.explain_gap([row(2, 0.0021, 0.0020), row(4, 0.002, 0.0028), row(8, 0.002, 0.005)],
                       jitter_s=0.1)
    assert ("On this run it was shorter with jitter on 2 ranks and longer with jitter on 4 "
            "and 8 ranks; the run does not measure why.") in said[-1]
    assert "probably ranks arriving one by one" not in said[-1]


def fake_sim_collapse():
    """Simulated rows of notebook 04's collapse at 4 and 1024 nodes: the calm and the jittery
    ring, the jittery tree, and the same-mean control."""
    def rows(step4, step1024):
        return [{"nodes": 4, "efficiency": 0.05 / step4, "mean_step_s": step4},
                {"nodes": 1024, "efficiency": 0.05 / step1024, "mean_step_s": step1024}]
    calm, rough = "delay 2ms", "delay 4ms 3ms distribution pareto"
    return ({"real": {calm: [], rough: []},
             "sim": {calm: rows(0.062, 4.142), rough: rows(0.095, 10.345)},
             "sim_alt": {calm: {"tree": rows(0.058, 0.09)}, rough: {"tree": rows(0.093, 0.25)}}},
            rows(0.0734, 8.029))


def test_explain_tail_cost_splits_the_step_into_the_mean_and_the_tail(said):
    collapse, same_mean = fake_sim_collapse()
    lesson.explain_tail_cost(collapse, same_mean, "delay 3900us")
    text = said[-1]
    # 10345 / 4142 = 2.50 = (8029 / 4142 = 1.94) x (10345 / 8029 = 1.29)
    assert text.startswith("**At 1024 nodes the tail makes the simulated ring's mean step ×2.50 "
                           "as long: ×1.94 from its higher mean (the control, delay 3900us) and "
                           "×1.29 beyond that mean, from the tail (why: our reading, in the "
                           "fold).**")
    # the chain explanation is said as a reading, not as a measured cause
    assert "That is our reading of the ×1.29: no run here removes" in text
    assert "simulated efficiency 54% for the tree against 53% for the ring" in text


def test_explain_explorer_says_which_way_the_closed_form_errs(capsys):
    pred = SimpleNamespace(nodes=8, step_s=0.1401, compute_s=0.05, exposed_s=0.0901)
    sim = SimpleNamespace(mean_step=0.1321, step_times=np.zeros(20))
    lesson.explain_explorer(SimpleNamespace(prediction=pred, sim=sim))
    assert capsys.readouterr().out == (
        "At 8 nodes the closed form gives a step of 140.1 ms (50 ms compute + 90.1 ms exposed), "
        "the simulator 132.1 ms (mean of 20 steps: 50 ms + 82.1 ms): the closed form's exposed "
        "part is 10% high here.\n")
    lesson.explain_explorer(SimpleNamespace(prediction=pred, sim=None))
    assert "the simulator did not run in this kernel." in capsys.readouterr().out
