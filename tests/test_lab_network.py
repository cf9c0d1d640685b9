"""Lab 01 (measure a network): the reference passes every check; plausible wrong answers are
rejected with the sentence that teaches.

The wrong answers live at module level, as a learner's notebook functions would; those that
run on ranks reach them by fork. The mystery-network wrong answers transform one reference
measurement per network (cached), so that the file measures each network once.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

import clusterlab
from clusterlab.labs import EXERCISES, run_checks
from clusterlab.labs.network import HiddenNetwork, mystery_network, reveal, truth

pytestmark = pytest.mark.timeout(120)

SIZES = (8, 1024, 16 * 1024, 64 * 1024, 256 * 1024)
REPEATS = 11
DILATION = 2


# --- the reference answer -------------------------------------------------------------------------


def naive_latency(nbytes):
    x = torch.zeros(max(1, nbytes // 4))
    if dist.get_rank() == 0:
        t0 = clusterlab.now()
        dist.send(x, 1)
        dist.recv(x, 1)
        return clusterlab.elapsed(t0)
    dist.recv(x, 0)
    dist.send(x, 0)
    return None


def ping_pong(nbytes, repeats):
    x = torch.zeros(max(1, nbytes // 4))
    rtts = []
    for _ in range(repeats):
        if dist.get_rank() == 0:
            t0 = clusterlab.now()
            dist.send(x, 1)
            dist.recv(x, 1)
            rtts.append(clusterlab.elapsed(t0))
        else:
            dist.recv(x, 0)
            dist.send(x, 0)
    return rtts


def one_way_latency(rtts):
    return float(np.median(rtts)) / 2


def fit_alpha_beta(sizes, times):
    n, t = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    if len(np.unique(n)) < 2:
        raise ValueError("need at least two different sizes to fit a line")
    beta = float(np.sum((n - n.mean()) * (t - t.mean())) / np.sum((n - n.mean()) ** 2))
    return float(t.mean() - beta * n.mean()), beta


_MEASURED: dict[str, tuple[float, float]] = {}


def measure_network(nic):
    """The reference. It measures every time it is called (a check may measure twice); the
    wrong answers below reuse its latest measurement of a network."""
    with clusterlab.Cluster(nodes=2, nic=nic, dilation=DILATION) as cl:
        times = [one_way_latency(cl.run(ping_pong, n, REPEATS)[0]) for n in SIZES]
    alpha, beta = fit_alpha_beta(SIZES, times)
    _MEASURED[str.__str__(nic)] = (alpha, 1 / beta)
    return alpha, 1 / beta


def measured(nic):
    """The reference's latest measurement of `nic` (measuring it if there is none)."""
    return _MEASURED.get(str.__str__(nic)) or measure_network(nic)


REFERENCE = {"naive_latency": naive_latency, "ping_pong": ping_pong,
             "one_way_latency": one_way_latency, "fit_alpha_beta": fit_alpha_beta,
             "measure_network": measure_network, "SIZES": SIZES, "REPEATS": REPEATS,
             "DILATION": DILATION}


def outcome(exercise: str, check_prefix: str, **wrong):
    """The outcome of the check of `exercise` whose name starts with `check_prefix`, with the
    reference answer except for `wrong` (that check alone is run, hidden or not)."""
    names = [c.name for c in EXERCISES[exercise].checks if c.name.startswith(check_prefix)]
    assert len(names) == 1, names
    report = run_checks(exercise, {**REFERENCE, **wrong}, hidden=True, only=names[0])
    (o,) = [o for o in report.outcomes if o.check == names[0]]
    return o


def rejected(exercise: str, check_prefix: str, phrase: str, **wrong) -> None:
    o = outcome(exercise, check_prefix, **wrong)
    assert o.status == "fail", (o.status, o.message)
    assert phrase in o.message, o.message


# --- the mystery network itself -------------------------------------------------------------------


def test_mystery_network_hides_itself_but_clusters_take_it():
    net = mystery_network(7)
    assert isinstance(net, HiddenNetwork) and isinstance(net, str)
    for shown in (repr(net), str(net), f"{net}", f"{net:>30}"):
        assert "delay" not in shown and "7" in shown, shown
    spec = clusterlab.Netem.parse(net)  # what Cluster(nic=...) does with it
    assert spec == reveal(net) and spec.rate_bps > 0 and spec.jitter_ns > 0
    assert clusterlab.Topology.build(2, nic=net).nic == spec
    assert mystery_network(7) == net and mystery_network(8) != net  # drawn from the seed
    alpha, bandwidth = truth(net)
    assert 1e-3 <= alpha <= 5e-3 and 100e6 / 8 <= bandwidth <= 500e6 / 8
    import pickle

    assert repr(pickle.loads(pickle.dumps(net))) == repr(net)


def test_mystery_draws_stay_in_their_ranges():
    for seed in range(200):
        spec = reveal(mystery_network(seed))
        assert 1e-3 <= spec.delay_s <= 5e-3
        assert 100e6 <= spec.rate_bps <= 500e6
        assert spec.distribution in ("uniform", "normal")
        # symmetric and never clipped at zero: the median one-way delay is the delay
        reach = 4 if spec.distribution == "normal" else 1
        assert reach * spec.jitter_s < spec.delay_s


# --- the reference passes everything -------------------------------------------------------------


@pytest.mark.parametrize("exercise", ["net_naive", "net_ping_pong", "net_fit", "net_mystery"])
def test_reference_passes_visible_checks(exercise, no_leftovers):
    # The hidden checks of the solved notebook run under nbval (test.sh, strict): here the
    # reference only has to pass what the wrong answers below are compared against.
    report = run_checks(exercise, REFERENCE, hidden=False)
    assert report.passed, report.text()
    assert all(o.status in ("pass", "skip") for o in report.outcomes), report.text()


# --- step 1: the naive ping -----------------------------------------------------------------------


def naive_no_echo(nbytes):
    x = torch.zeros(max(1, nbytes // 4))
    if dist.get_rank() == 0:
        t0 = clusterlab.now()
        dist.send(x, 1)
        dist.recv(x, 1)
        return clusterlab.elapsed(t0)
    dist.recv(x, 0)  # ...and never sends it back
    return None


def naive_times_the_send(nbytes):
    x = torch.zeros(max(1, nbytes // 4))
    if dist.get_rank() == 0:
        t0 = clusterlab.now()
        dist.send(x, 1)
        t = clusterlab.elapsed(t0)
        dist.recv(x, 1)
        return t
    dist.recv(x, 0)
    dist.send(x, 0)
    return None


def naive_halves(nbytes):
    t = naive_latency(nbytes)
    return None if t is None else t / 2


def naive_ignores_size(nbytes):
    return naive_latency(8)


def naive_in_ms(nbytes):
    t = naive_latency(nbytes)
    return None if t is None else t * 1e3


def test_a_ping_that_is_never_echoed_times_out_naming_the_ranks(no_leftovers):
    report = run_checks("net_naive", {**REFERENCE, "naive_latency": naive_no_echo}, hidden=True)
    first, *others = report.outcomes
    assert first.status == "fail"
    assert "timed out" in first.message and "rank 0 in recv" in first.message, first.message
    assert "rank 1 must recv each ping and send it straight back" in first.message
    for o in others:  # the same deadlock, reported without waiting for it again
        assert o.status == "fail" and "found by an earlier check" in o.message, o.message


def test_timing_only_the_send_is_rejected(no_leftovers):
    rejected("net_naive", "one ping comes back", "before the ping arrived",
             naive_latency=naive_times_the_send)


def test_halving_in_step_1_is_rejected(no_leftovers):
    rejected("net_naive", "one ping comes back", "one crossing", naive_latency=naive_halves)


def test_a_ping_of_the_wrong_size_is_rejected(no_leftovers):
    rejected("net_naive", "the ping and its echo carry", "carried 8 bytes, not nbytes = 65536",
             naive_latency=naive_ignores_size)


def test_milliseconds_are_rejected(no_leftovers):
    rejected("net_naive", "one ping comes back", "return seconds", naive_latency=naive_in_ms)


# --- step 2: ping-pong and the median -------------------------------------------------------------


def one_way_is_the_round_trip(rtts):
    return float(np.median(rtts))


def one_way_from_the_mean(rtts):
    return float(np.mean(rtts)) / 2


def one_way_from_the_fastest(rtts):
    return float(np.min(rtts)) / 2


def ping_pong_cumulative(nbytes, repeats):
    x = torch.zeros(max(1, nbytes // 4))
    rtts = []
    t0 = clusterlab.now()  # started once: every "round trip" is the time since the first ping
    for _ in range(repeats):
        if dist.get_rank() == 0:
            dist.send(x, 1)
            dist.recv(x, 1)
            rtts.append(clusterlab.elapsed(t0))
        else:
            dist.recv(x, 0)
            dist.send(x, 0)
    return rtts


def ping_pong_halves(nbytes, repeats):
    return [t / 2 for t in ping_pong(nbytes, repeats)]


def ping_pong_wall_clock(nbytes, repeats):
    """Timed with the machine's clock, not the cluster's: at dilation 3, 3x the delay."""
    x = torch.zeros(max(1, nbytes // 4))
    rtts = []
    for _ in range(repeats):
        if dist.get_rank() == 0:
            t0 = time.perf_counter()
            dist.send(x, 1)
            dist.recv(x, 1)
            rtts.append(time.perf_counter() - t0)
        else:
            dist.recv(x, 0)
            dist.send(x, 0)
    return rtts


def test_probe_wall_clock_timing_under_dilation_is_named(no_leftovers):
    o = outcome("net_ping_pong", "close to the delay", ping_pong=ping_pong_wall_clock)
    assert o.status == "fail", o.message
    assert "dilated 3x" in o.message and "clusterlab.now()" in o.message, o.message


def test_the_round_trip_instead_of_one_way_is_rejected(no_leftovers):
    rejected("net_ping_pong", "one_way_latency is half the median",
             "your times are twice the one-way delay", one_way_latency=one_way_is_the_round_trip)


def test_the_mean_under_heavy_tailed_jitter_is_rejected(no_leftovers):
    o = outcome("net_ping_pong", "one_way_latency is half the median",
                one_way_latency=one_way_from_the_mean)
    assert o.status == "fail"
    for phrase in ("half the MEAN round trip", "pareto", "use the median"):
        assert phrase in o.message, o.message


def test_the_fastest_round_trip_is_rejected(no_leftovers):
    rejected("net_ping_pong", "one_way_latency is half the median", "FASTEST",
             one_way_latency=one_way_from_the_fastest)


def test_a_clock_started_once_is_rejected(no_leftovers):
    rejected("net_ping_pong", "ping_pong:", "restart the clock", ping_pong=ping_pong_cumulative)


def test_halved_round_trips_are_rejected(no_leftovers):
    rejected("net_ping_pong", "ping_pong:", "these look like one-way times",
             ping_pong=ping_pong_halves)


# --- step 3: the fit ------------------------------------------------------------------------------


def fit_swapped(sizes, times):
    alpha, beta = fit_alpha_beta(sizes, times)
    return beta, alpha


def fit_polyfit_order(sizes, times):
    return tuple(np.polyfit(np.asarray(sizes, float), np.asarray(times, float), 1))


def fit_bandwidth(sizes, times):
    alpha, beta = fit_alpha_beta(sizes, times)
    return alpha, 1 / beta


def fit_through_origin(sizes, times):
    n, t = np.asarray(sizes, float), np.asarray(times, float)
    return 0.0, float(n @ t / (n @ n))


def fit_endpoints(sizes, times):
    n, t = np.asarray(sizes, float), np.asarray(times, float)
    beta = (t[-1] - t[0]) / (n[-1] - n[0])
    return float(t[0] - beta * n[0]), float(beta)


def fit_lstsq_unchecked(sizes, times):
    n = np.asarray(sizes, float)
    a = np.vstack([np.ones_like(n), n]).T
    alpha, beta = np.linalg.lstsq(a, np.asarray(times, float), rcond=None)[0]
    return float(alpha), float(beta)


@pytest.mark.parametrize("wrong", [fit_swapped, fit_polyfit_order])
def test_swapped_intercept_and_slope_are_rejected(wrong):
    rejected("net_fit", "an exact line", "swapped intercept and slope", fit_alpha_beta=wrong)


def test_returning_the_bandwidth_for_beta_is_rejected():
    rejected("net_fit", "an exact line", "which is the bandwidth 1/β", fit_alpha_beta=fit_bandwidth)


def test_a_line_through_the_origin_is_rejected():
    rejected("net_fit", "an exact line", "through the origin", fit_alpha_beta=fit_through_origin)


def test_a_line_through_two_points_is_rejected():
    rejected("net_fit", "least squares over every point", "first and the last point only",
             fit_alpha_beta=fit_endpoints)


def test_a_fit_from_one_size_is_rejected():
    rejected("net_fit", "a sweep of one size", "one size cannot tell the latency from the "
             "bandwidth", fit_alpha_beta=fit_lstsq_unchecked)
    # ... while least squares itself is right wherever a line is determined
    report = run_checks("net_fit", {"fit_alpha_beta": fit_lstsq_unchecked}, hidden=True)
    assert [o.status for o in report.outcomes] == ["pass", "pass", "fail", "pass"]


# --- step 4: the mystery network ------------------------------------------------------------------


def measure_round_trip(nic):
    alpha, bandwidth = measured(nic)
    return 2 * alpha, bandwidth / 2  # what RTT instead of RTT/2 gives


def measure_bits(nic):
    alpha, bandwidth = measured(nic)
    return alpha, bandwidth * 8


def measure_swapped(nic):
    alpha, bandwidth = measured(nic)
    return 1 / bandwidth, 1 / alpha  # (slope, 1/intercept)


def measure_beta(nic):
    alpha, bandwidth = measured(nic)
    return alpha, 1 / bandwidth


def measure_one_size(nic):
    with clusterlab.Cluster(nodes=2, nic=nic, dilation=DILATION) as cl:
        times = [one_way_latency(cl.run(ping_pong, 64 * 1024, 5)[0])]
    alpha, beta = fit_alpha_beta([64 * 1024], times)
    return alpha, 1 / beta


def test_round_trips_are_twice_the_truth(no_leftovers):
    rejected("net_mystery", "the practice network", "your times are twice the one-way delay: "
             "divide the round trip by 2", measure_network=measure_round_trip)


def test_bits_per_second_are_8x_off(no_leftovers):
    rejected("net_mystery", "the practice network", "8x: that is bits per second",
             measure_network=measure_bits)


def test_swapped_alpha_and_bandwidth_are_rejected(no_leftovers):
    rejected("net_mystery", "the practice network", "swapped intercept and slope",
             measure_network=measure_swapped)


def test_beta_for_the_bandwidth_is_rejected(no_leftovers):
    rejected("net_mystery", "the practice network", "that is β in seconds per byte",
             measure_network=measure_beta)


def test_a_sweep_of_one_size_is_rejected(no_leftovers):
    rejected("net_mystery", "the practice network", "at least two different sizes",
             measure_network=measure_one_size)


def test_hidden_networks_are_not_the_practice_network(no_leftovers):
    """A hard-coded answer (what a measurement of the practice network printed) measures
    nothing: the visible check says so, and the hidden networks are other networks."""
    alpha, bandwidth = truth(mystery_network(1))
    printed = (alpha * 1.02, bandwidth * 0.98)
    report = run_checks("net_mystery", {"measure_network": lambda nic: printed}, hidden=True)
    assert [o.status for o in report.outcomes] == ["fail", "fail"], report.text()
    assert "it was read, not measured" in report.outcomes[0].message


def measure_from_truth(nic):
    """Probe item 1: the truth, made to look measured."""
    alpha, bandwidth = truth(nic)
    return alpha * 1.02, bandwidth * 0.98


def test_probe_reading_the_truth_with_noise_added_is_rejected():
    rejected("net_mystery", "the practice network", "sent 0 message(s) of 0 size(s)",
             measure_network=measure_from_truth)


def test_probe_the_truth_read_is_rejected_on_hidden_networks_too():
    rejected("net_mystery", "two networks", "it was read, not measured",
             measure_network=measure_from_truth)


def fit_torch_float32(sizes, times):
    """Probe item 2: the lab's own formula, on float32 tensors."""
    n = torch.tensor(sizes, dtype=torch.float32)
    t = torch.tensor(times, dtype=torch.float32)
    if len(torch.unique(n)) < 2:
        raise ValueError("need at least two different sizes to fit a line")
    beta = ((n - n.mean()) * (t - t.mean())).sum() / ((n - n.mean()) ** 2).sum()
    return float(t.mean() - beta * n.mean()), float(beta)


def test_probe_a_float32_fit_is_rejected_at_every_seed_saying_float64():
    for seed in (2026, 1, 4, 5, 19):
        report = run_checks("net_fit", {"fit_alpha_beta": fit_torch_float32}, hidden=True,
                            seed=seed, only="least squares over every point of a noisy sweep")
        (o,) = report.outcomes
        assert o.status == "fail", report.text()
        assert "compute in float64" in o.message and "float32" in o.message, o.message


def test_reading_the_spec_instead_of_measuring_is_rejected():
    def read_it(nic):
        return truth(nic)

    rejected("net_mystery", "the practice network", "it was read, not measured",
             measure_network=read_it)


def measure_in_one_run(nic):
    """A correct alternative: every size in one cluster run, the fit by np.polyfit."""
    def sweep():
        out = []
        for n in SIZES:
            rtts = ping_pong(n, REPEATS)  # both ranks ping-pong; rank 0 keeps the times
            out.append(one_way_latency(rtts) if dist.get_rank() == 0 else None)
        return out

    with clusterlab.Cluster(nodes=2, nic=nic, dilation=DILATION) as cl:
        times = cl.run(sweep)[0]
    beta, alpha = np.polyfit(np.asarray(SIZES, float), np.asarray(times, float), 1)
    return float(alpha), float(1 / beta)


def test_alternative_measuring_every_size_in_one_run_passes(no_leftovers):
    o = outcome("net_mystery", "the practice network", measure_network=measure_in_one_run)
    assert o.status == "pass", o.message
