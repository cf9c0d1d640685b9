"""Lab 04 (predict throughput collapse): the reference passes every check, hidden ones too;
plausible wrong answers fail the check that should catch them, with the sentence that teaches."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from clusterlab.labs import EXERCISES, Fail, NotDone, run_checks
from clusterlab.labs._answers import reference_step
from clusterlab.labs.collapse import _Z
from clusterlab.labs.core import Context

# --- the reference answers -------------------------------------------------------------------


def naive_step_time(setup):
    return setup.compute_values().mean() + 2 * (setup.ranks - 1) * setup.delay_values().mean()


def expected_max(values, n):
    v = np.sort(np.asarray(values, dtype=np.float64).ravel())
    cdf = np.arange(len(v) + 1) / len(v)
    return float(np.dot(v, np.diff(cdf ** n)))


def predict_step_time(setup):
    return reference_step(setup, expected_max)


def scaling_efficiency(setup):
    return predict_step_time(dataclasses.replace(setup, ranks=1)) / predict_step_time(setup)


REFERENCE = {"naive_step_time": naive_step_time, "expected_max": expected_max,
             "predict_step_time": predict_step_time, "scaling_efficiency": scaling_efficiency}


def outcome(exercise: str, check_prefix: str, **given) -> tuple[str, str]:
    """(status, message) of ONE check (run_checks would start every real run of the
    exercise), with the grader's context and seed."""
    checks = [c for c in EXERCISES[exercise].checks if c.name.startswith(check_prefix)]
    assert len(checks) == 1, [c.name for c in EXERCISES[exercise].checks]
    ctx = Context({**REFERENCE, **given}, seed=2026, hidden=True)
    try:
        return "pass", checks[0].fn(ctx) or ""
    except Fail as exc:
        return "fail", str(exc)
    except NotDone as exc:
        return "todo", str(exc)


# --- wrong answers ---------------------------------------------------------------------------


def naive_half_ring(setup):  # forgets the all-gather: N-1 rounds
    return setup.compute_values().mean() + (setup.ranks - 1) * setup.delay_values().mean()


def naive_in_ms(setup):
    return 1e3 * naive_step_time(setup)


def emax_mean(values, n):  # the mean instead of E[max]
    return float(np.mean(values))


def emax_minus_one(values, n):  # off by one: n - 1 draws
    return expected_max(values, max(n - 1, 1))


def emax_plus_one(values, n):  # off by one: n + 1 draws
    return expected_max(values, n + 1)


def emax_half_width(values, n):  # "uniform: mean plus the half-width", whatever n is
    v = np.asarray(values)
    return float(v.mean() + (v.max() - v.min()) / 2)


def emax_unsorted(values, n):  # the formula, but on the values in the order given
    v = np.asarray(values, dtype=np.float64)
    cdf = np.arange(len(v) + 1) / len(v)
    return float(np.dot(v, np.diff(cdf ** n)))


def emax_models(values, n):  # leans on clusterlab.models instead of the values
    from clusterlab import models

    return models.expected_max(n, "normal")


def predict_mean(setup):  # the naive, mean-based step
    return naive_step_time(setup)


def predict_no_compute_jitter(setup):
    d, n = setup.delay_values(), setup.ranks
    if n == 1:
        return setup.compute_values().mean()
    r = 2 * (n - 1)
    chain = math.sqrt(r) * d.std() * expected_max(_Z, n)
    return setup.compute_values().mean() + r * d.mean() + chain


def predict_one_draw_per_step(setup):  # the network's jitter drawn once per step, not per round
    comp, d, n = setup.compute_values(), setup.delay_values(), setup.ranks
    if n == 1:
        return comp.mean()
    return expected_max(comp, n) + 2 * (n - 1) * d.mean() + expected_max(d, n) - d.mean()


def predict_barrier(setup):  # every ring round waits for the slowest of N messages
    comp, d, n = setup.compute_values(), setup.delay_values(), setup.ranks
    return expected_max(comp, n) + 2 * (n - 1) * expected_max(d, n)


def predict_in_ms(setup):
    return 1e3 * predict_step_time(setup)


def efficiency_inverted(setup):
    return 1 / scaling_efficiency(setup)


def efficiency_times_n(setup):
    return setup.ranks * scaling_efficiency(setup)


def naive_2n_minus_1(setup):  # probe: 2N-1 rounds, called "N rounds" when judged at N = 1
    return setup.compute_values().mean() + (2 * setup.ranks - 1) * setup.delay_values().mean()


def predict_no_network(setup):  # probe: E[max] of the compute, and no network at all
    return expected_max(setup.compute_values(), setup.ranks)


def predict_network_mean_only(setup):  # E[max] of the compute + the network's mean delays
    comp, d, n = setup.compute_values(), setup.delay_values(), setup.ranks
    return expected_max(comp, n) + 2 * (n - 1) * d.mean()


# --- tests -----------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_reference_passes_visible_checks(no_leftovers):
    # The hidden checks of the solved notebook run under nbval (test.sh, strict): here the
    # reference only has to pass what the wrong answers below are compared against.
    for exercise in ("collapse_naive", "collapse_emax", "collapse_predict",
                     "collapse_efficiency"):
        report = run_checks(exercise, REFERENCE, hidden=False, seed=7)
        bad = [(o.check, o.status, o.message) for o in report.outcomes
               if o.status not in ("pass", "skip")]
        assert not bad, bad


@pytest.mark.parametrize("fn, phrase", [
    (naive_half_ring, "all-gather half of the ring is missing"),
    (naive_in_ms, "1000x too large"),
])
def test_naive_mistakes(fn, phrase):
    status, message = outcome("collapse_naive", "mean compute", naive_step_time=fn)
    assert status == "fail" and phrase in message, message


@pytest.mark.parametrize("fn, check, phrase", [
    (emax_mean, "uniform", "waits for the slowest"),
    (emax_minus_one, "uniform", "E[max] of n-1 draws: off by one"),
    (emax_plus_one, "netem", "E[max] of n+1 draws: off by one"),
    (emax_half_width, "uniform", "ignores n"),
    (emax_unsorted, "netem", "sort them first"),
    (emax_models, "uniform", "off limits in this exercise"),
])
def test_emax_mistakes(fn, check, phrase):
    status, message = outcome("collapse_emax", check, expected_max=fn)
    assert status == "fail" and phrase in message, message


@pytest.mark.parametrize("fn, check, phrase", [
    (predict_mean, "against the simulator: compute", "waits for the slowest rank"),
    (predict_no_compute_jitter, "against the simulator: compute", "leaves out the compute jitter"),
    (predict_one_draw_per_step, "against the simulator: a latency", "once per step"),
    (predict_barrier, "against the simulator: a latency", "waits only for its left neighbour"),
    (predict_in_ms, "against the simulator: compute", "not milliseconds"),
])
def test_predict_mistakes(fn, check, phrase):
    status, message = outcome("collapse_predict", check, predict_step_time=fn)
    assert status == "fail" and phrase in message, message


@pytest.mark.timeout(120)
def test_predict_mean_fails_the_real_run(no_leftovers):
    status, message = outcome("collapse_predict", "against a real run on 4",
                              predict_step_time=predict_mean)
    assert status == "fail" and "below" in message and "slowest" in message, message


@pytest.mark.parametrize("fn, phrase", [
    (efficiency_inverted, "inverted"),
    (efficiency_times_n, "N times too large"),
])
def test_efficiency_mistakes(fn, phrase):
    status, message = outcome("collapse_efficiency", "against the simulator",
                              scaling_efficiency=fn)
    assert status == "fail" and phrase in message, message


def test_unwritten_functions_are_todo():
    def todo(*args):
        raise NotImplementedError("your code here")

    for exercise, name in (("collapse_naive", "naive_step_time"), ("collapse_emax", "expected_max"),
                           ("collapse_predict", "predict_step_time"),
                           ("collapse_efficiency", "scaling_efficiency")):
        report = run_checks(exercise, {**REFERENCE, name: todo}, hidden=True)
        assert {o.status for o in report.outcomes} == {"todo"}, report.text()


def test_emax_mean_at_n2_is_not_called_off_by_one():
    status, message = outcome("collapse_emax", "uniform", expected_max=emax_mean)
    assert status == "fail" and "off by one" not in message, message


def test_probe_2n_minus_1_rounds_is_named_as_such():
    status, message = outcome("collapse_naive", "mean compute", naive_step_time=naive_2n_minus_1)
    assert status == "fail" and "it counts 2N-1 rounds" in message, message
    assert "it counts N rounds" not in message, message


@pytest.mark.parametrize("fn, phrase", [
    (predict_no_network, "leaves out the network"),
    (predict_network_mean_only, "the network's jitter counts too"),
])
def test_probe_a_predictor_with_e_max_but_not_the_network_is_told_so(fn, phrase):
    status, message = outcome("collapse_predict", "against the simulator: a latency",
                              predict_step_time=fn)
    assert status == "fail" and phrase in message, message
    assert "not the mean" not in message, message
