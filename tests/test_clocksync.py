"""Clock offsets between ranks: a known skew is recovered, the emulated delays stay faithful
under it, and drift is followed by re-estimation (clusterlab.clocksync, clusterlab.clock)."""

from __future__ import annotations

import numpy as np
import pytest

from clusterlab import Cluster, clock, clocksync
from clusterlab.doctor import (
    MEDIAN_DELAY_TOLERANCE,
    median_delay_error,
    median_delay_met,
    one_way_delays,
)

pytestmark = pytest.mark.timeout(120)

SKEW_S = 0.25
TARGET_NS = 50_000  # the bound on the recovered offset


def test_estimate_brackets_a_known_offset():
    rng = np.random.default_rng(3)
    offset = 123_456_789
    t1 = np.cumsum(rng.integers(10_000, 20_000, 40))
    there = rng.exponential(30_000, 40).astype(np.int64) + 20_000  # asymmetric, long tails
    back = rng.exponential(80_000, 40).astype(np.int64) + 25_000
    t2 = t1 + there + offset
    t3 = t2 + rng.integers(1_000, 5_000, 40)
    t4 = t3 - offset + back
    est = clocksync.estimate(t1, t2, t3, t4)
    assert abs(est.offset_ns - offset) <= est.uncertainty_ns
    assert est.uncertainty_ns <= (there.min() + back.min()) // 2 + 1
    assert est.min_rtt_ns == int(((t4 - t1) - (t3 - t2)).min())
    # A clock that stepped within the burst: no common interval; the min-RTT exchange decides.
    t2b = t2.copy()
    t2b[:20] += 10**6
    stepped = clocksync.estimate(t1, t2b, t3, t4)
    assert stepped.uncertainty_ns > 0
    with pytest.raises(ValueError, match="non-empty"):
        clocksync.estimate([], [], [], [])


def test_skew_variable_errors_name_it():
    assert clock.skew_from_env(1, {clock.SKEW_VARIABLE: "1=0.5,2=-1"}) == (0.5, 0.0)
    assert clock.skew_from_env(3, {clock.SKEW_VARIABLE: "0.25"}) == (0.25, 0.0)
    with pytest.raises(ValueError, match=clock.SKEW_VARIABLE):
        clock.skew_from_env(0, {clock.SKEW_VARIABLE: "soon"})
    with (pytest.raises(ValueError, match=clocksync.RESYNC_VARIABLE),
          pytest.MonkeyPatch.context() as mp):
        mp.setenv(clocksync.RESYNC_VARIABLE, "-1")
        clocksync._resync_from_env()


def _estimates(offsets_ns, *, spacing_ns, uncertainty_ns):
    return [clocksync.Estimate(offset_ns=int(o), uncertainty_ns=uncertainty_ns, min_rtt_ns=0,
                               samples=32, at_raw_ns=i * spacing_ns)
            for i, o in enumerate(offsets_ns)]


def test_drift_rate_is_not_fitted_out_of_the_estimates_own_noise():
    rng = np.random.default_rng(5)
    hits = 0
    for _ in range(200):  # no drift: offsets anywhere within each estimate's +-80 us bound
        noise = rng.uniform(-80_000, 80_000, 3)
        rate = clocksync.drift_rate(_estimates(noise, spacing_ns=10**9, uncertainty_ns=80_000))
        hits += rate != 0.0
    assert hits <= 20, hits  # 2 standard errors: seldom fooled by noise alone
    assert clocksync.drift_rate(_estimates([5], spacing_ns=10**9, uncertainty_ns=80_000)) == 0.0


def test_drift_rate_recovers_a_drift_that_stands_above_the_noise():
    rng = np.random.default_rng(6)
    ppm = 300
    offsets = ppm * 1e-6 * np.arange(6) * 2e8 + rng.uniform(-10_000, 10_000, 6)
    rate = clocksync.drift_rate(_estimates(offsets, spacing_ns=2 * 10**8, uncertainty_ns=10_000))
    assert abs(rate * 1e6 - ppm) <= 0.2 * ppm, rate * 1e6
    # Tighter estimates weigh more: one loose outlier does not drag the fit.
    loose = _estimates(offsets, spacing_ns=2 * 10**8, uncertainty_ns=10_000)
    loose[2] = clocksync.Estimate(offset_ns=loose[2].offset_ns + 400_000, uncertainty_ns=400_000,
                                  min_rtt_ns=0, samples=32, at_raw_ns=loose[2].at_raw_ns)
    assert abs(clocksync.drift_rate(loose) * 1e6 - ppm) <= 0.2 * ppm


def _offset_error():
    """(recovered offset + skew, the estimate's bound): 0 means the skew was undone."""
    corr = clock.correction()
    if corr is None:
        return None, None
    return corr.at(clock.raw_ns()) + clock.test_skew_ns(), corr.uncertainty_ns


def _skewed_run(n, spacing_s):
    err, bound = _offset_error()
    return {"error_ns": err, "bound_ns": bound, "delays": one_way_delays(n, spacing_s)}


ATTEMPTS = 3


def test_skew_is_recovered_and_delays_stay_faithful(no_leftovers):
    """Judged as the fidelity bench judges a delay row (both ranks' delays pooled: from the
    skewed rank and to it). A busy machine can make one whole measurement late, so up to
    ATTEMPTS are made and one must meet the target; a clock error would shift every attempt,
    and early as often as late, so no attempt may be early."""
    delay_ns = 5e6
    env = {clock.SKEW_VARIABLE: f"1={SKEW_S}"}
    errors = []
    with Cluster(nodes=2, nic="delay 5ms", environ=env, timeout=60) as cl:
        for _ in range(ATTEMPTS):
            out = cl.run(_skewed_run, 100, 6e-3)
            delays = np.concatenate([o["delays"] for o in out])
            errors.append(median_delay_error(delays, delay_ns))
            assert errors[-1] >= -MEDIAN_DELAY_TOLERANCE, errors  # never early
            if median_delay_met(delays, delay_ns):
                break
    assert median_delay_met(delays, delay_ns), f"median off by {errors} in {len(errors)} runs"
    assert out[0]["error_ns"] is None  # rank 0's clock is the reference
    err, bound = out[1]["error_ns"], out[1]["bound_ns"]
    assert abs(err) <= TARGET_NS, f"skew {SKEW_S} s recovered to within {err} ns"
    assert abs(err) <= bound + 2_000  # the bound holds (2 us: reading the clocks apart)


def _drift_errors(reads, pause_s):
    import time

    errs = []
    for _ in range(reads):
        time.sleep(pause_s)
        errs.append(_offset_error()[0])
    return errs


@pytest.mark.parametrize("resync", ["0.2", "0"])
def test_drift_is_followed_by_re_estimates(resync, no_leftovers):
    ppm = 300
    env = {clock.SKEW_VARIABLE: "1=-0.5", clock.DRIFT_VARIABLE: f"1={ppm}",
           clocksync.RESYNC_VARIABLE: resync}
    with Cluster(nodes=2, nic="delay 1ms", environ=env, timeout=60) as cl:
        errs = np.array(cl.run(_drift_errors, 6, 0.25)[1], dtype=float)
    if resync != "0":
        assert np.abs(errs).max() <= TARGET_NS, errs
    else:  # one estimate at the start: the drift piles up, 300 us per second
        assert abs(errs[-1]) >= 0.5 * ppm * 1e-6 * 1.5 * 1e9, errs
