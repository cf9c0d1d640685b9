"""The dilation policy notebook 00 runs under: a margin above the faithful floor, and the
machine's own late tail no longer than the (dilated) delay."""

import pytest

from clusterlab.doctor import FLOOR_CANDIDATES_US, dilation_needed, dilation_with_margin


def test_the_defaults_only_reach_the_floor():
    assert dilation_needed(2000, floor_us=2000) == 1
    assert dilation_needed(2000, floor_us=5000) == 3


def test_a_margin_and_a_tail_raise_k():
    # the review's machine: floor 2 ms, a late tail of 2.8 ms, delay 2 ms -> K = 1 was lax
    assert dilation_needed(2000, floor_us=2000, margin=2) == 2
    assert dilation_needed(2000, floor_us=2000, tail_us=2787) == 2
    assert dilation_needed(2000, floor_us=500, margin=2, tail_us=7000) == 4
    assert dilation_needed(2000, floor_us=500, margin=2, tail_us=100) == 1


@pytest.mark.parametrize("bad", [dict(margin=0.5), dict(tail_us=-1)])
def test_bad_options_are_refused(bad):
    with pytest.raises(ValueError):
        dilation_needed(2000, floor_us=1000, **bad)


def info(floor, tail):
    return {"smallest_faithful_delay_us": floor, "added_p99_us": tail,
            "faithful_floor": {"samples": 300}}


def test_dilation_with_margin_says_which_requirement_set_k():
    assert dilation_with_margin(2000, info(500, 300))["reason"] == "none"
    d = dilation_with_margin(2000, info(2000, 1000))
    assert (d["k"], d["reason"]) == (2, "floor")
    d = dilation_with_margin(2000, info(1000, 7000))
    assert (d["k"], d["reason"]) == (4, "tail")
    d = dilation_with_margin(2000, info(None, 100))  # nothing passed: the largest candidate
    assert d["floor_us"] == FLOOR_CANDIDATES_US[-1] and d["k"] == 10
    d = dilation_with_margin(100, info(10000, 0), limit=16)
    assert d["k"] == 16 and d["capped"]
