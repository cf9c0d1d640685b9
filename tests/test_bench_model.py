"""The model bench's measurement rules: how much to dilate, and how an operation is timed."""

import numpy as np
import pytest

from clusterlab.bench.model import MAX_DILATION, _model_all_reduce, dilation_for
from clusterlab.timing import durations


@pytest.mark.parametrize(("native", "network", "share", "k"), [
    (0.024, 0.007, 0.1, 35),   # 8 ranks on 2 cores against a 7 ms ring: dilate 35x
    (0.001, 0.010, 0.1, 1),    # the machine is already 10x faster than the network
    (0.002, 0.010, 0.1, 2),    # just over: round up, never down
    (5.0, 0.001, 0.1, MAX_DILATION),  # capped
    (0.01, 0.0, 0.1, 1),       # no network time to protect
])
def test_dilation_for(native, network, share, k):
    got = dilation_for(native, network, share)
    assert got == k
    if 1 < got < MAX_DILATION:
        assert native / got <= share * network < native / (got - 1)


def test_span_runs_from_the_last_entry_to_the_last_exit():
    # Two ranks, two repeats: rank 1 left the barrier 3 s late in repeat 0.
    spans = [[(0.0, 5.0), (10.0, 12.0)],
             [(3.0, 5.5), (10.5, 12.0)]]
    np.testing.assert_allclose(durations(spans), [2.5, 1.5])


def test_model_all_reduce_uses_segments_and_the_wire_rate():
    # 1 Gbit/s, 2 ranks, 1 MiB: 2 rounds of 1 ms plus 2 * (1/2) MiB on the wire with headers.
    wire = 2 * 0.5 * 2**20 * 8 / 1e9 * (65536 + 66) / 65536
    assert _model_all_reduce(2, "delay 1ms rate 1gbit", 2**20) == pytest.approx(0.002 + wire)
    # Jitter: a 16 MiB message on 4 ranks is 64 segments per round, each waits for its last.
    jittery = _model_all_reduce(4, "delay 2ms 1ms", 16 << 20)
    shifted = 0.012 + 6 * 1e-3 * 63 / 65  # 6 rounds of delay + E[max of 64 uniform draws]
    assert shifted < jittery < shifted + 0.3e-3  # plus the small spread of that max


def test_results_table_per_configuration():
    from clusterlab.bench import markdown

    rows = [{"kind": "all_reduce", "ranks": 4, "nic": "delay 2ms", "bytes": n, "dilation": 33,
             "measured_s": 0.010, "model_s": m, "sim_s": 0.010,
             "measured_undilated_s": 0.020, "model_undilated_s": 0.010,
             "sim_undilated_s": 0.010} for n, m in ((1024, 0.011), (65536, 0.012), (2**20, 0.0))]
    text = markdown([{"bench": "model", "machine": {}, "rows": rows, "checks": []}])
    # model errors 0.1, 0.2, 1.0 -> median 0.2; as is, every prediction is half the time.
    assert "| 4 | delay 2ms | 33 | 0.200 | 0.000 | 0.500 | 0.500 |" in text


def test_step_model_rows_carry_the_simulated_steps_and_check_them():
    from clusterlab.bench.model import STEP_NODES, STEP_TOLERANCE, _rel, step_model_rows

    rows, checks = step_model_rows(quick=True)
    assert [r["nodes"] for r in rows] == list(STEP_NODES) * 3 and len(checks) == 3
    for c in checks:  # each check recomputed from its rows' raw step times
        mine = [r for r in rows if r["nic"] in c["name"].split(", 1 MiB")[0]]
        worst = max(_rel(r["closed_form_s"], float(np.mean(r["sim_step_s"]))) for r in mine)
        assert c["measured"] == pytest.approx(worst, abs=1e-4)
        assert c["ok"] == (worst <= STEP_TOLERANCE)


def test_results_table_of_the_p2p_ring():
    from clusterlab.bench import markdown

    row = {"kind": "p2p_ring", "ranks": 8, "dilation": 30, "measured_s": [0.044, 0.046],
           "sim_p2p_mean_s": 0.0441, "replay_mean_s": 0.0424,
           "no_jitter_measured_s": [0.0288, 0.0290], "no_jitter_ideal_s": 0.028}
    text = markdown([{"bench": "model", "machine": {}, "rows": [row], "checks": []}])
    assert "| 8 | 30 | 45.0 | 44.1 | 42.4 | 28.9 / 28.0 |" in text
