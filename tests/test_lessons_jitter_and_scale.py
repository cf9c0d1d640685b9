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
    assert "×1.05 ± 0.00 without jitter and ×1.00 ± 0.13 with the tail" in text
    assert "Within two standard errors of 1 with the tail; more than two above without " \
           "jitter (this host's own cost" in text
    assert "All within ×1.1: the dots sit on the lines" in text
    assert verdicts[-1][0] is True


def test_explain_measured_says_when_the_host_shows(verdicts, said):
    lesson.explain_measured(fake_collapse([0.0900, 0.0905, 0.0910], [0.13, 0.13, 0.13]))
    assert "Not all within ×1.1" in said[-1]


def test_split_without_hiccup_adds_up_to_the_mean_step():
    run = SimpleNamespace(slow=np.array([[1, 0], [0, 0], [0, 1], [0, 0]], dtype=bool),
                          wait_for_slowest=np.array([0.018, 0.070, 0.019]),
                          after_last_arrival=np.array([0.5, 0.021, 0.020, 0.022]))
    to_arrival, exchange = lesson.split_without_hiccup(run)
    assert to_arrival == pytest.approx(0.0185) and exchange == pytest.approx(0.0215)
