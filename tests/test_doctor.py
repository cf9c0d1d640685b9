"""The doctor's floor and the fidelity bench judge a delay the same way, and measure it the
same way: `one_way_delays`, whose sends follow their schedule whatever the receives do."""

from __future__ import annotations

import numpy as np
import pytest

from clusterlab import doctor
from clusterlab.bench.fidelity import (
    STALL_MARGIN_NS,
    _repeated,
    delay_ceiling_ns,
    floor_agreement,
    ks_distance,
)
from clusterlab.link import sample_delay_ns
from clusterlab.netem import Netem


def _constant_lateness(late_us):
    """A fake measurement: every message `late_us` later than configured."""
    calls = []

    def measure(delay_us, *, samples):
        calls.append(delay_us)
        return np.full(samples, (delay_us + late_us) * 1e3)

    return measure, calls


def test_floor_is_the_first_candidate_within_the_tolerance():
    # 15 us late: 2% of 500 us is 10 us (missed), 2% of 1000 us is 20 us (met).
    measure, calls = _constant_lateness(15)
    floor = doctor.faithful_floor(samples=10, measure=measure)
    assert floor["smallest_faithful_delay_us"] == 1000
    assert calls == [50, 100, 200, 500, 1000]  # stops at the floor
    assert [r["median_error_us"] for r in floor["tried"]] == pytest.approx([15] * 5)
    assert floor["added_p99_us"] == pytest.approx(15)


def test_no_floor_when_every_candidate_misses():
    measure, _ = _constant_lateness(1000)
    floor = doctor.faithful_floor(samples=5, candidates=(100, 200), measure=measure)
    assert floor["smallest_faithful_delay_us"] is None
    assert len(floor["tried"]) == 2


@pytest.mark.parametrize("kwargs", [{"samples": 0}, {"candidates": ()},
                                    {"candidates": (200, 100)}, {"candidates": (0, 100)}])
def test_floor_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        doctor.faithful_floor(measure=_constant_lateness(0)[0], **kwargs)


def test_median_delay_met_is_relative_and_two_sided():
    tol = doctor.MEDIAN_DELAY_TOLERANCE
    assert doctor.median_delay_met([1e6 * (1 + 0.9 * tol)] * 3, 1e6)
    assert doctor.median_delay_met([1e6 * (1 - 0.9 * tol)] * 3, 1e6)
    assert not doctor.median_delay_met([1e6 * (1 + 1.1 * tol)] * 3, 1e6)
    assert not doctor.median_delay_met([1e6 * (1 - 1.1 * tol)] * 3, 1e6)
    assert doctor.median_delay_error([1.1e6, 1.0e6, 5e6], 1e6) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="delay_ns"):
        doctor.median_delay_error([1.0], 0)


def test_floor_agreement_at_the_rows_resolution():
    both = {1: True, 5: True}
    assert floor_agreement(1000.0, both)[1] and floor_agreement(200.0, both)[1]
    assert not floor_agreement(2000.0, both)[1]
    assert not floor_agreement(None, both)[1]
    only5 = {1: False, 5: True}
    assert floor_agreement(2000.0, only5)[1] and floor_agreement(5000.0, only5)[1]
    assert not floor_agreement(1000.0, only5)[1]  # the doctor calls faithful what the rows missed
    none = {1: False, 5: False}
    assert floor_agreement(None, none)[1] and floor_agreement(10000.0, none)[1]
    assert not floor_agreement(5000.0, none)[1]


def test_a_repeated_check_is_met_only_when_met_every_time():
    c = _repeated("x", "< 1", [0.2, 0.5, 0.3], [True, True, True], 3)
    assert c["ok"] and c["measured"]["median"] == 0.3
    assert (c["measured"]["min"], c["measured"]["max"]) == (0.2, 0.5)
    assert "every one of 3 repeats" in c["name"]
    assert not _repeated("x", "< 1", [0.2, 1.5, 0.3], [True, False, True], 3)["ok"]
    assert _repeated("x", "< 1", [0.2], [True], 1)["measured"] == 0.2


@pytest.mark.parametrize("text", ["delay 5ms 2ms", "delay 5ms 2ms distribution normal",
                                  "delay 5ms 5ms distribution pareto"])
def test_ks_distance_tells_the_table_from_a_shifted_table(text):
    spec = Netem.parse(text)
    n = 5000
    draws = sample_delay_ns(spec, np.random.default_rng(1), n)
    assert ks_distance(draws, spec) < 1.63 / np.sqrt(n)  # 99% band of the KS statistic
    # A quarter of the jitter added to every message: far outside that band.
    assert ks_distance(draws + spec.jitter_ns // 4, spec) > 0.05 + ks_distance(draws, spec)


@pytest.mark.parametrize("text", ["delay 5ms 2ms", "delay 5ms 2ms distribution normal",
                                  "delay 5ms 5ms distribution pareto"])
def test_the_stall_ceiling_lies_above_every_delay_the_table_can_produce(text):
    spec = Netem.parse(text)
    draws = sample_delay_ns(spec, np.random.default_rng(2), 50_000)
    ceiling = delay_ceiling_ns(spec)
    assert draws.max() <= ceiling - STALL_MARGIN_NS < ceiling  # none would count as stalled
    if "distribution" not in text:
        assert ceiling == spec.delay_ns + spec.jitter_ns + STALL_MARGIN_NS
    # a stall as long as the ceiling: those delays count as stalled, the others do not
    stalled = np.concatenate([draws[:100] + ceiling, draws[100:]]) > ceiling
    assert stalled[:100].all() and not stalled[100:].any()


def _first_send(n, spacing_s):
    import torch.distributed as dist

    doctor.one_way_delays(n, spacing_s)
    return dist.group.WORLD.trace[1][1]  # [0] is the warm-up; [1] = (peer, sent_ns, ...)


@pytest.mark.timeout(60)
def test_ranks_start_on_one_schedule_whenever_they_left_the_barrier(no_leftovers):
    from clusterlab import Cluster

    # On this network ranks leave a collective tens of ms apart (~40 ms measured with a start
    # of each rank's own, after a barrier); a rank that started its own schedule there would
    # ask for its messages late.
    with Cluster(nodes=4, nic="delay 10ms 10ms distribution pareto", timeout=40,
                 trace=True) as cl:
        first = np.array(cl.run(_first_send, 5, 15e-3))
    # Each rank oversleeps the common start by a wake-up at most: ~1 ms on a busy machine.
    assert np.ptp(first) < 8e6
