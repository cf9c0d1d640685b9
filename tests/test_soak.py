"""The soak bench's arithmetic (synthetic samples), and one very short real run."""

from __future__ import annotations

import numpy as np
import pytest

from clusterlab.bench import soak
from clusterlab.link import RTO_MIN_NS

MIN = 60e9  # ns


def test_slope_ignores_warm_up_and_measures_growth() -> None:
    t = np.linspace(0, 10 * MIN, 101)
    warm = [(x, 250.0 + (20.0 if x > 0 else 0.0)) for x in t]  # jumps at start, then flat
    assert abs(soak._slope(warm)["slope_mb_per_min"]) < 1e-6
    leak = [(x, 300.0 + 5.0 * x / MIN) for x in t]  # 5 MB/min
    m = soak._slope(leak)
    assert m["slope_mb_per_min"] == pytest.approx(5.0)
    assert m["share_per_min"] > soak.SLOPE_BOUND  # 5 MB/min of ~325 MB fails the bound
    assert m["samples"] == 81


def _rank(step_ms, comm_ms, rss_growth=0.0):
    n = len(step_ms)
    at = np.cumsum(np.array(step_ms) * 1e6).astype(np.int64)
    return {"step_ns": [np.array(step_ms) * 1e6], "comm_ns": [np.array(comm_ms) * 1e6],
            "at_ns": [at], "rss": [(float(a), 250.0 + rss_growth * a / MIN) for a in at[::10]],
            "n": n}


def test_report_sorts_slow_steps_into_network_host_and_engine() -> None:
    rng = np.random.default_rng(1)
    n = 3000
    step = np.tile(20 + rng.uniform(-1, 1, n), (4, 1))
    comm = step - 3
    step[:, 100], comm[:, 100] = 250, 247  # an emulated RTO: network
    step[:, 1000], comm[:, 1000] = 150, 140  # peers wait in the all_reduce for rank 2 ...
    comm[2, 1000] = 15  # ... which was busy (descheduled) outside it: host
    step[:, 2000], comm[:, 2000] = 150, 140  # every rank waited, under an RTO: the engine
    ranks = [_rank(step[r], comm[r]) for r in range(4)]
    parent = [(float(a), 300.0) for a in ranks[0]["at_ns"][0][::100]]
    out = soak._report(ranks, parent, None, minutes=1, chunks=[], wall_s=60)
    stalls = next(r for r in out["rows"] if r["kind"] == "stalls")
    assert (stalls["over_5x"], stalls["network_over_5x"], stalls["host_over_5x"],
            stalls["unexplained_over_5x"]) == (3, 1, 1, 1)
    assert 0.75 * RTO_MIN_NS > 140e6
    drift = next(r for r in out["rows"] if r["kind"] == "drift")
    assert drift["ratio"] == pytest.approx(1.0, abs=0.02) and drift["first_n"] > 100
    (stall_check,) = [c for c in out["checks"] if "not explained" in c["name"]]
    assert stall_check["ok"] is False
    assert all(c["ok"] for c in out["checks"] if "RSS" in c["name"])


def test_report_flags_drift_and_growth() -> None:
    n = 3000
    step = np.full(n, 20.0)
    comm = np.linspace(10, 13, n)  # emulated delays creep up 30 %
    ranks = [_rank(step, comm, rss_growth=10.0) for _ in range(4)]
    out = soak._report(ranks, [(0.0, 1.0), (1.0, 1.0)], None, minutes=1, chunks=[],
                       wall_s=60)
    failed = [c["name"] for c in out["checks"] if not c["ok"]]
    assert any("last vs first" in name for name in failed)
    assert sum("RSS slope of rank" in name for name in failed) == 4


def test_minutes_are_checked() -> None:
    for bad in (0, -1, float("nan"), 10**6):
        with pytest.raises(ValueError, match="minutes"):
            soak.soak(minutes=bad)


@pytest.mark.timeout(90)
def test_a_short_real_soak(no_leftovers) -> None:
    out = soak.soak(minutes=0.05)
    run = next(r for r in out["rows"] if r["kind"] == "run")
    assert run["error"] is None and run["chunks"] >= 1
    assert all(r["steps"] >= 1 for r in out["rows"] if r["kind"] == "chunk")
    stalls = next(r for r in out["rows"] if r["kind"] == "stalls")
    assert stalls["steps"] > 20 and stalls["median_comm_ms"] > 2 * 2  # >= 2 rounds of 2 ms
    assert {r["process"] for r in out["rows"] if r["kind"] == "rss"} == {
        "rank 0", "rank 1", "rank 2", "rank 3", "parent"}
