"""Notebook 01b's lesson (clusterlab/lessons/tails_jitter_loss_contention.py): the lines the
reviews of r13 and r14 added. Its other sentences are tested in tests/test_lessons_start.py."""

from __future__ import annotations

import numpy as np
import pytest
from test_lessons_start import appendix_runs, dilated, jitter_parts, jitter_runs

from clusterlab.experiments import links
from clusterlab.lessons import tails_jitter_loss_contention as tails


def test_slowest_of_p_carries_the_draws_p99_and_the_configured_one():
    runs = jitter_runs()
    _, step64 = tails.slowest_of_p(runs, ranks=[1, 64])
    assert step64["normal"]["model_p99"] == pytest.approx(
        links.configured_quantile("delay 4ms 1ms distribution normal", 0.99))
    assert step64["uniform"]["model_p99"] == pytest.approx(4.98, abs=0.01)
    assert step64["pareto"]["network_p99"] == pytest.approx(
        float(np.percentile(runs["pareto"]["emulated_ms"], 99)))


def test_the_gap_to_the_model_is_printed_in_the_appendix_not_beside_the_figure(capsys):
    step64 = {name: {"measured": m, "network": net, "model": model, "median": 4.0, "n": 200,
                     "network_p99": p99, "model_p99": cfg}
              for name, m, net, model, p99, cfg in (
                  ("uniform", 5.0, 4.97, 4.97, 4.97, 4.98),
                  ("normal", 6.78, 6.67, 6.33, 6.64, 6.33),
                  ("pareto", 7.74, 7.63, 7.38, 8.0, 8.0))}
    parts = {name: {"beyond_network": 0} for name in tails.DISTRIBUTIONS}
    tails.explain_slowest_of_64(step64, parts, busy=None)
    assert "netem's law" not in capsys.readouterr().out
    _, details = tails.explain_slowest_of_64(step64, parts, busy=None)
    capsys.readouterr()
    tails.explain_model_gap(step64, details=details)
    assert capsys.readouterr().out.split("\n", len(details))[-1] == (
        "network alone against the model (hollow markers against the line), farthest "
        "for normal: slowest of 64 6.67 vs 6.33 ms; these 200 draws' own p99 is 6.64 vs "
        "netem's configured 6.33 ms\n")


def test_a_verdict_not_shown_is_printed_where_it_was_reached(capsys, monkeypatch):
    monkeypatch.setattr("clusterlab.experiments.common.load_per_core", lambda: 99.0)
    details = []
    assert tails._verdict(True, "it held", details) is True
    assert tails._verdict(False, "it failed", details) is False
    assert details == ["Shown on this run: it held."]
    assert capsys.readouterr().out.startswith("Not shown on this run: it failed (load average")


@pytest.mark.parametrize("capped, says", [
    (False, "plan missed (the noise rose after the probe had chosen K)"),
    (True, "plan missed (K capped at 3)")])
def test_noise_appendix_says_why_the_plan_was_missed(capsys, capped, says):
    runs = appendix_runs()
    info = dict(dilated(busy="noise p99 0.9 ms"), capped=capped)
    tails.explain_noise_appendix(runs, jitter_parts(runs), info)
    assert says in capsys.readouterr().out


def test_a_margin_within_the_runs_noise_is_not_resolved(capsys):
    # r15 review: uniform's machine share 0.84 ms against a network tail of 0.97 ms
    step64 = {name: {"measured": m, "network": net, "model": net, "median": 4.0, "n": 200,
                     "network_p99": net, "model_p99": net, "margin_ci": ci}
              for name, m, net, ci in (("uniform", 5.81, 4.97, (-0.4, 0.5)),
                                       ("normal", 6.95, 6.67, (2.1, 2.6)),
                                       ("pareto", 7.72, 7.63, (3.2, 3.8)))}
    parts = {name: {"beyond_network": 0} for name in tails.DISTRIBUTIONS}
    quote, details = tails.explain_slowest_of_64(step64, parts, busy=None)
    assert quote == {"uniform": False, "normal": True, "pareto": True}
    out = capsys.readouterr().out
    assert ("Shown on this run: for normal and pareto the network's tail (network alone - the "
            "4 ms delay) moved the slowest of 64 more than this machine did.") in details
    assert ("Not resolved on this run for uniform: the network's tail minus this machine's "
            "share is -0.40 to +0.50 ms (95% bootstrap over the pings), which includes 0: quote "
            "the network's numbers\n") in out


def test_tail_margin_ci_brackets_the_margin_of_a_clean_run():
    rng = np.random.default_rng(0)
    network = 4.0 + rng.uniform(-1.0, 1.0, 200)
    lo, hi = tails.tail_margin_ci({"one_way_ms": network + 0.05, "emulated_ms": network})
    assert 0.5 < lo < hi < 1.0


def test_configured_distributions_lead_with_the_pareto_clip(capsys):
    tails.explain_configured({"uniform": "delay 4ms 1ms",
                              "normal": "delay 4ms 1ms distribution normal",
                              "pareto": "delay 4ms 1ms distribution pareto"})
    main, fold = capsys.readouterr().out.split("\n", 1)
    assert main.startswith("pareto (configured): draws from 3.33 to 8.00 ms;")
    assert main.endswith("sit at the clip, so its p99 is the clip")
    assert "  normal: median 4.00 ms, p99 6.33 ms, mean 4.00 ms" in fold
    assert "sch_netem.c" in fold  # the uniform default, sourced
