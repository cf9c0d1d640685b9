"""Notebook 03's lesson: the overlap an ideal host would give, and the sentences built on it
(synthetic runs, no processes). The other helpers of the module are tested in
tests/test_lessons_ddp_jitter.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from test_lessons_ddp_jitter import idle_row as jitter_idle_row

from clusterlab.lessons import ddp_step_anatomy as lesson

# notebook 03's MLP in 0.25 MiB buckets: the classifier shares the first with the last layer
SMALL = [256 * 257 * 4 + 257 * 10 * 4] + [256 * 257 * 4] * 7
BIG = [sum(SMALL)]


def test_nominal_overlap_latency_bound_hides_only_the_rest_of_backward():
    ideal = lesson.nominal_overlap(4, SMALL, "delay 2ms", backward_s=0.032)
    assert ideal["per_bucket"] == pytest.approx([0.012] * 8)
    # first bucket ready at 4 ms, the stream busy from then on: 28 of 96 ms hide
    assert ideal["busy"] == pytest.approx(0.096)
    assert ideal["hidden"] == pytest.approx(0.028)
    assert ideal["exposed"] == pytest.approx(0.068)
    assert ideal["interval"] == pytest.approx(0.004)


def test_nominal_overlap_bandwidth_bound_queues_when_a_bucket_outlasts_the_interval():
    ideal = lesson.nominal_overlap(4, SMALL, "delay 200us rate 500mbit", backward_s=0.032)
    assert np.median(ideal["per_bucket"]) == pytest.approx(0.0075, abs=1e-4)   # > 4 ms apart
    assert ideal["busy"] == pytest.approx(0.0604, abs=1e-4)
    assert ideal["hidden"] == pytest.approx(0.028)
    assert ideal["exposed"] == pytest.approx(0.0324, abs=1e-4)
    big = lesson.nominal_overlap(4, BIG, "delay 200us rate 500mbit", backward_s=0.032)
    assert big["hidden"] == pytest.approx(0.0, abs=1e-12)   # one bucket: ready at the end
    assert big["exposed"] == pytest.approx(0.0520, abs=1e-4)


def test_nominal_overlap_leaves_gaps_when_buckets_are_quick():
    ideal = lesson.nominal_overlap(4, SMALL, "delay 100us", backward_s=0.032)
    # each 0.6 ms all-reduce ends long before the next bucket: only the last one is exposed
    assert ideal["exposed"] == pytest.approx(0.0006)
    assert ideal["hidden"] == pytest.approx(7 * 0.0006)


def fake_run(sizes, steps):
    return SimpleNamespace(bucket_sizes=sizes,
                           phases=lambda: {"step": np.asarray([steps], dtype=float)})


def row(sizes, steps, wait, busy, backward):
    return {"run": fake_run(sizes, steps), "step_s": float(np.median(steps)), "wait_s": wait,
            "comm_busy_s": busy, "backward_s": backward, "buckets": len(sizes)}


def grid(small_bw_hidden: float) -> dict:
    lat = {(0.25, "overlap"): row(SMALL, [0.122, 0.123], 0.057, 0.097, 0.045),
           (0.25, "deferred"): row(SMALL, [0.155, 0.159], 0.098, 0.098, 0.038),
           (25.0, "overlap"): row(BIG, [0.071, 0.083], 0.014, 0.014, 0.038),
           (25.0, "fused"): row(BIG, [0.071, 0.080], 0.015, 0.015, 0.037)}
    bw = {(0.25, "overlap"): row(SMALL, [0.099, 0.111], 0.023, 0.023 + small_bw_hidden, 0.059),
          (0.25, "deferred"): row(SMALL, [0.127, 0.131], 0.067, 0.067, 0.039),
          (25.0, "overlap"): row(BIG, [0.114, 0.119], 0.056, 0.056, 0.038),
          (25.0, "fused"): row(BIG, [0.115, 0.119], 0.057, 0.057, 0.038)}
    return {"latency-bound": lat, "bandwidth-bound": bw}


@pytest.mark.parametrize(("hidden", "said"), [
    # stream busy 74.8 ms against the model's 60.4 ms: more than 1.2 times it
    (0.0518, "Its stream was busy 74.8 ms against the model's 60.4 ms of communication: 14.4 ms "
             "of it buckets in flight beyond the model (waiting for a peer or for this host; this "
             "run cannot tell which), so its 51.8 ms \"hidden\" is not all communication. An "
             "ideal host (32.0 ms backward) hides 28.0 ms. Judge by the step."),
    # hid more than the ideal host, with a stretched backward: said to be the stretch's doing
    (0.0290, "Its stream was busy 52.0 ms against the model's 60.4 ms of communication; it hid "
             "29.0 ms, an ideal host (32.0 ms backward) 28.0 ms: more here mainly because the "
             "stretched backward left more time under it. Judge by the step."),
])
def test_explain_buckets_puts_the_ideal_host_beside_the_run(verdicts, capsys, hidden, said):
    networks = {"latency-bound": "delay 2ms", "bandwidth-bound": "delay 200us rate 500mbit"}
    lesson.explain_buckets(grid(hidden), networks)
    out = capsys.readouterr().out
    assert ("Host cost: on the bandwidth-bound network backward took 59.0 ms with overlap "
            "against 39.0 ms deferred (same buckets, none in flight during backward): buckets in "
            "flight stretch this host's backward (as in the per-rank timeline).\n\n" + said) in out
    # the table opens the fold, before this host's costs
    assert out.index("bandwidth-bound 0.25 MiB overlap") < out.index("Host cost")
    # each verdict carries its numbers, once: no line repeats it
    claims = [claim for _, claim, _ in verdicts]
    assert claims[0] == ("latency-bound, big buckets win: both 25 MiB medians (75.5 ms, "
                         "77.0 ms) beat even the fastest 0.25 MiB step (122.0 ms)")
    assert claims[1] == ("bandwidth-bound, 0.25 MiB with overlap exposed the least (23.0 ms "
                         "against 56.0 ms for one big bucket)")
    assert "big buckets win" not in out and "busy-model" not in out


def idle_row(ranks, idle, sim, native, wait):
    return jitter_idle_row(ranks, idle, sim, native, wait, 0.344, forward=0.021, backward=0.039)


def test_explain_idle_compares_the_shares_as_printed(verdicts, capsys):
    # 81.9% and 82.4% both print as 82%: no point apart
    idle = [idle_row(2, 0.41, 0.42, 0.003, 0.040), idle_row(8, 0.819, 0.824, 0.0294, 0.2816)]
    lesson.explain_idle(idle, delay_s=20e-3, compute_s=0.048)
    out = capsys.readouterr().out
    assert "gives 82% at 8 ranks (within 1 point)" in out
    assert "the real layers and Python's autograd add time" in out
    holds, claim, _ = verdicts[-1]
    assert holds and ("the wait (281.6 ms) was close to the network's closed form (280.0 ms, "
                      "which is 9.5 times plain Gloo's wait, this machine's own), so the "
                      "network, not this host, set it") in claim


def test_explain_idle_prints_what_four_times_the_ranks_bought(verdicts, capsys):
    # samples per second go as ranks / step: (8 / 346 ms) / (2 / 96 ms) = 1.11; the closed
    # form with the nominal 48 ms compute: (8 / 328 ms) / (2 / 88 ms) = 1.07
    idle = [jitter_idle_row(2, 0.42, 0.42, 0.01, 0.040, 0.096, forward=0.021, backward=0.039),
            jitter_idle_row(8, 0.82, 0.82, 0.04, 0.283, 0.346, forward=0.021, backward=0.039)]
    lesson.explain_idle(idle, delay_s=20e-3, compute_s=0.048)
    out = capsys.readouterr().out
    assert ("Throughput (ranks / step time): x1.11 from 2 to 8 ranks, for x4 the hardware "
            "(predicted x1.07 with the nominal compute).") in out
    assert "lifts the measured gain above the predicted one" in out


def overlap_run(backward_s, wait_s=0.055):
    records = [{"backward_end": 10, "buckets": [{"done": 5}] * 3 + [{"done": 11}] * 5}] * 6
    summary = {"backward_s": backward_s, "forward_s": 0.021, "step_s": 0.12, "wait_s": wait_s,
               "comm_busy_s": 0.097, "hidden_fraction": 0.44}
    return SimpleNamespace(
        config={"depth": 8, "forward_s": 0.002, "backward_s": 0.004, "nic": "delay 2ms"},
        world_size=4, bucket_sizes=SMALL, ranks=[{"records": records}] * 4,
        summary=lambda: summary, phases=lambda: {"step": np.zeros((4, 6))},
        hidden_fractions=lambda: np.array([0.40, 0.50]))


CHECKS = {"phase_sum_error": 0.0, "latency_slack": 0.0, "fifo": True, "collectives": 48,
          "gap": 0.0}


@pytest.mark.parametrize(("backward_s", "said"), [
    (0.0485, "Backward took 48.5 ms, not 32.0 ms, which leaves more time to hide under: the "
             "same model with this 48.5 ms backward hides 44%."),
    (0.0330, "Backward took 33.0 ms, close to its nominal 32.0 ms."),
])
def test_explain_overlap_puts_the_ideal_bound_first_and_the_stretch_on_a_baseline(
        capsys, backward_s, said):
    run = overlap_run(backward_s)
    baseline = SimpleNamespace(summary=lambda: {"backward_s": 0.036})
    lesson.explain_overlap(run, [run], CHECKS, baseline=baseline)
    out = capsys.readouterr().out
    lines = out.splitlines()
    # the exposed wait and why first, then the share against the ideal host; the rest in the
    # details
    assert lines[0] == ("55.0 ms of the exchange stayed exposed per step: a median of 5 of 8 "
                        "buckets were still unfinished when backward ended (over 4 ranks x 6 "
                        "steps), because the stream runs one bucket at a time.")
    head = ("Overlap hid 43% of the 97.0 ms on the stream; an ideal host (the nominal 32.0 ms "
            "backward, the alpha-beta model) hides at most 29%")
    # the share against the ideal host opens the details
    assert lines[1] == head + (". This host hid more mainly because, for this run, its backward "
                               "ran 16.5 ms long (48.5 ms), which left the queue more time under "
                               "it." if backward_s > 0.04 else ".")
    assert lines[2] == ("Hidden share = 1 - wait / stream busy = 1 - 55.0 ms / 97.0 ms = 43%; "
                        "the ideal host hides 28.0 ms of 96.0 ms.")
    assert lines[3] == said
    if backward_s > 0.04:   # the split, hedged, in the details
        assert ("Backward 36.0 ms in the one-bucket run of the first section (no bucket in "
                "flight: the sleeps run long, the real layers and autograd add time), 12.5 ms "
                "more here, with buckets in flight (likely the hook, Gloo's threads and the "
                "emulator competing with the layers for this host's cores and Python's GIL; "
                "these runs do not separate the causes).") in out


def test_explain_overlap_without_a_baseline_names_only_the_stretch(capsys):
    run = overlap_run(0.0485)
    lesson.explain_overlap(run, [run], CHECKS)
    out = capsys.readouterr().out
    assert ("Backward took 48.5 ms, not 32.0 ms, which leaves more time to hide "
            "under") in out
    assert "in flight" not in out


def test_explain_buckets_prints_the_hosts_floor_beside_the_latency_bound_all_reduce(capsys):
    networks = {"latency-bound": "delay 2ms", "bandwidth-bound": "delay 200us rate 500mbit"}
    lesson.explain_buckets(grid(0.029), networks, floor_s=0.0104)
    out = capsys.readouterr().out
    assert ("Latency-bound: one all-reduce costs 12.0 ms on the network; this host's own cost, "
            "plain Gloo's wait in the first section (a separate run, a rough guide), was 10.4 ms, "
            "about as large") in out
    assert out.index("Medians and ranges") < out.index("Latency-bound: one") < out.index(
        "Host cost")
    lesson.explain_buckets(grid(0.029), networks, floor_s=0.0285)
    assert ("was 28.5 ms, larger: one big bucket's wait measures this host more than the "
            "network.") in capsys.readouterr().out


def test_toy_timeline_queues_what_the_stream_cannot_take_and_waits_for_the_rest(capsys,
                                                                               monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "show", lambda: plt.close("all"))
    # ready at 4, 8, 12 ms; 6 ms each, first in, first out: done at 10, 16, 22 ms, backward
    # ends at 12 ms, so 10 ms wait and 18 - 10 = 8 ms hidden
    lesson.plot_toy_timeline()
    assert capsys.readouterr().out == ("Toy: stream busy 18 ms, of which 8 ms ran under backward "
                                       "(hidden) and 10 ms after it (the wait).\n")
