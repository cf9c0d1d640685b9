"""Lesson modules of notebooks 03 (anatomy of a DDP step) and 04 (jitter at scale): what they
decide and print, on small synthetic runs (no processes, no absolute times)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from clusterlab import models
from clusterlab.lessons import ddp_step_anatomy as ddp_lesson
from clusterlab.lessons import jitter_and_scale as jit_lesson


@pytest.fixture
def said(monkeypatch):
    """Capture the Markdown sentences of notebook 04's lesson."""
    texts = []
    monkeypatch.setattr(jit_lesson, "say", texts.append)
    return texts


# --- notebook 03 ------------------------------------------------------------------------------


class FakeRun:
    """A DDPRun stand-in: per-step times (ranks x steps) and a summary."""

    def __init__(self, steps, **summary):
        self._steps = np.asarray(steps, dtype=float)
        self._summary = summary
        self.bucket_sizes = [262_144] * 8

    def phases(self):
        return {"step": self._steps}

    def summary(self):
        return self._summary


def test_buckets_done_before_backward_counts_only_complete_rank_steps():
    records = [
        {"backward_end": 10, "buckets": [{"done": 5}, {"done": 10}, {"done": 11}]},
        {"backward_end": 10, "buckets": [{"done": 12}, {"done": 13}, {"done": 14}]},
        {"backward_end": 10, "buckets": [{"done": 1}]},          # incomplete: not counted
    ]
    run = SimpleNamespace(ranks=[{"records": records}, {"records": records[:1]}],
                          bucket_sizes=[1, 2, 3])
    assert ddp_lesson.buckets_done_before_backward(run) == [2, 0, 2]


def sweep_row(delay, rate, busy, model):
    return {"delay_ms": delay, "rate_mbit": rate, "comm_busy_s": busy, "predicted_comm_s": model}


def test_sweep_effects_measures_each_knob_and_the_networks_close_to_the_model():
    sweep = {"delay": [sweep_row(0.5, 1000, 0.030, 0.028), sweep_row(4, 1000, 0.050, 0.049)],
             "rate": [sweep_row(0.5, 250, 0.110, 0.105), sweep_row(0.5, 1000, 0.031, 0.028)]}
    e = ddp_lesson.sweep_effects(sweep)
    assert e["by_delay"] == pytest.approx(0.020)
    assert e["by_rate"] == pytest.approx(0.079)
    # (0.5, 1000) appears in both sweeps: the rate sweep's row wins, 0.031 against 0.028 is
    # within 15 %; a point 20 % off the model is not close
    assert len(e["points"]) == 3
    assert sorted(e["close"]) == [(0.5, 250), (0.5, 1000), (4, 1000)]
    sweep["delay"][1] = sweep_row(4, 1000, 0.060, 0.049)
    assert (4, 1000) not in ddp_lesson.sweep_effects(sweep)["close"]


def test_explain_sweep_agrees_only_when_the_rate_moved_more(verdicts, capsys):
    rows = {"delay": [sweep_row(0.5, 1000, 0.030, 0.028), sweep_row(4, 1000, 0.050, 0.049)],
            "rate": [sweep_row(0.5, 250, 0.110, 0.105), sweep_row(0.5, 1000, 0.030, 0.028)]}
    ddp_lesson.explain_sweep(rows, bandwidth_over_latency=8.46)
    out = capsys.readouterr().out
    assert verdicts[-1][0] is True
    assert ("bandwidth term is 8.5x its latency term: bandwidth-bound; the sweep agrees, as it "
            "must: the emulator implements this model.") in out
    assert "3 of 3 networks within 15 %" in out
    rows["rate"][0] = sweep_row(0.5, 250, 0.040, 0.105 / 3)   # the rate cut moved it less
    ddp_lesson.explain_sweep(rows, bandwidth_over_latency=8.46)
    out = capsys.readouterr().out
    assert verdicts[-1][0] is False
    assert "latency term: bandwidth-bound.\n" in out   # no agreement claimed
    assert out.startswith("The bucket's bandwidth term")   # the message before the table


def test_step_range_is_over_steps_of_the_rank_mean():
    row = {"run": FakeRun([[0.10, 0.20, 0.30], [0.30, 0.20, 0.10]])}
    lo, hi, n = ddp_lesson.step_range(row)
    assert (lo, hi, n) == (pytest.approx(0.2), pytest.approx(0.2), 3)
    row = {"run": FakeRun([[0.10, 0.30], [0.12, 0.32]])}
    assert ddp_lesson.step_range(row)[:2] == (pytest.approx(0.11), pytest.approx(0.31))


def grid_row(steps, wait=0.01, busy=0.02, backward=0.04):
    steps = np.asarray(steps, dtype=float)
    return {"run": FakeRun([steps]), "step_s": float(np.median(steps)), "wait_s": wait,
            "comm_busy_s": busy, "backward_s": backward, "buckets": 1}


def make_grid(*, small_bw_steps, big_bw_wait=0.05, small_bw_wait=0.02):
    lat = {(0.25, "overlap"): grid_row([0.12, 0.13]), (0.25, "deferred"): grid_row([0.15, 0.16]),
           (25.0, "overlap"): grid_row([0.07, 0.08]), (25.0, "fused"): grid_row([0.07, 0.09])}
    bw = {(0.25, "overlap"): grid_row(small_bw_steps, wait=small_bw_wait),
          (0.25, "deferred"): grid_row([0.12, 0.13], wait=0.06),
          (25.0, "overlap"): grid_row([0.11, 0.12], wait=big_bw_wait),
          (25.0, "fused"): grid_row([0.11, 0.115], wait=big_bw_wait + 0.01)}
    return {"latency-bound": lat, "bandwidth-bound": bw}


def test_bucket_verdicts_compare_medians_with_the_fastest_and_order_ranges():
    v = ddp_lesson.bucket_verdicts(make_grid(small_bw_steps=[0.09, 0.10]))
    assert v["big_median"] == pytest.approx(0.08)     # the slower of 0.075 and 0.08
    assert v["small_fastest"] == pytest.approx(0.12)  # the faster of 0.12 and 0.15
    assert v["big_wait"] == pytest.approx(0.05)
    assert v["clear"] and not v["beaten"]
    v = ddp_lesson.bucket_verdicts(make_grid(small_bw_steps=[0.10, 0.115]))
    assert not v["clear"] and not v["beaten"]          # ranges overlap
    v = ddp_lesson.bucket_verdicts(make_grid(small_bw_steps=[0.125, 0.14]))
    assert not v["clear"] and v["beaten"]


@pytest.mark.parametrize(("steps", "tail"), [
    ([0.09, 0.10], "Its step was also the shortest, its range clear of every other."),
    ([0.10, 0.115], "Its median step was 7.5 ms shorter than one big bucket's (107.5 ms against "
                    "115.0 ms), less than the 30.0 ms of exposure it saved: this host's backward "
                    "took 40.0 ms against 40.0 ms deferred. Their step ranges overlap (table in "
                    "the fold)."),
    ([0.11, 0.125], "But its median step was not shorter than one big bucket's (117.5 ms against "
                    "115.0 ms): this host's backward took 40.0 ms against 40.0 ms deferred. Their "
                    "step ranges overlap (table in the fold)."),
    ([0.125, 0.14], "But 25 MiB fused's slowest step (115.0 ms) beat its fastest (125.0 ms)."),
])
def test_explain_buckets_says_only_what_the_step_ranges_support(verdicts, capsys, steps, tail):
    grid = make_grid(small_bw_steps=steps)
    networks = {"latency-bound": "delay 2ms", "bandwidth-bound": "delay 200us rate 500mbit"}
    ddp_lesson.explain_buckets(grid, networks)
    out = capsys.readouterr().out
    assert [h for h, _, _ in verdicts] == [True, True]   # no third, weaker latency verdict
    assert verdicts[0][1].startswith("latency-bound, big buckets win")
    assert verdicts[1][1] == ("bandwidth-bound, 0.25 MiB with overlap exposed the least (20.0 ms "
                              "against 50.0 ms for one big bucket)")
    assert tail in out


def test_explain_buckets_falls_back_to_the_medians_only_when_the_strong_claim_fails(verdicts):
    grid = make_grid(small_bw_steps=[0.09, 0.10])
    grid["latency-bound"][(0.25, "deferred")] = grid_row([0.075, 0.16])   # one fast small step
    networks = {"latency-bound": "delay 2ms", "bandwidth-bound": "delay 200us rate 500mbit"}
    ddp_lesson.explain_buckets(grid, networks)
    assert [h for h, _, _ in verdicts] == [False, True, True]
    assert "shorter median step than eight small ones" in verdicts[-1][1]


def test_network_share_needs_the_host_under_40_percent_of_the_network():
    assert ddp_lesson.network_share(0.0255, 0.280) == (pytest.approx(0.0911, abs=1e-4), True)
    share, network_set = ddp_lesson.network_share(0.120, 0.280)
    assert share == pytest.approx(0.4286, abs=1e-4) and not network_set


def idle_row(ranks, idle, sim, native, wait, step=0.34, *, forward=0.02, backward=0.037):
    return {"ranks": ranks, "idle_fraction": idle, "sim_idle_fraction": sim,
            "native_wait_s": native, "wait_s": wait, "step_s": step, "forward_s": forward,
            "backward_s": backward,
            "run": SimpleNamespace(param_bytes=2_115_624, phases=lambda: {"step": [[0.3] * 6]})}


def test_explain_idle_says_who_set_the_wait_and_passes_the_evidence(verdicts, capsys):
    idle = [idle_row(2, 0.42, 0.43, 0.003, 0.041), idle_row(8, 0.82, 0.83, 0.0255, 0.2817)]
    ddp_lesson.explain_idle(idle, delay_s=20e-3, compute_s=0.048)
    out = capsys.readouterr().out
    assert "2(p-1) x 20 ms = 280.0 ms" in out and ": the network set the wait." in out
    assert "(-1 points)" in out
    holds, claim, busy = verdicts[-1]
    assert holds and busy is None and "11.0 times plain Gloo's wait, this machine's own" in claim
    idle[-1] = idle_row(8, 0.82, 0.82, 0.140, 0.2817)
    ddp_lesson.explain_idle(idle, delay_s=20e-3, compute_s=0.048)
    out = capsys.readouterr().out
    assert "too close to say the network alone set the wait." in out
    assert "(within 1 point)" in out
    holds, _, busy = verdicts[-1]
    assert not holds and busy == "plain Gloo alone waited 140.0 ms, 50% of the network's 280.0 ms"


def test_notebook_03_real_cluster_notes_compute_their_numbers_from_the_ledger():
    text = ddp_lesson.real_cluster_notes()
    assert "[[nccl.max_ctas]]" in text and "{" not in text
    assert "n\\* = α/β" in text          # Markdown's escaped star, as the notebook had it
    assert "like the stream above (point-to-point sends and\n  receives can use streams" in text


# --- notebook 04 ------------------------------------------------------------------------------


def test_table_clipped_only_when_p99_reaches_a_spread_tables_max():
    assert jit_lesson.table_clipped({"max_s": 0.016, "p50_s": 0.003, "p99_s": 0.016})
    assert not jit_lesson.table_clipped({"max_s": 0.016, "p50_s": 0.003, "p99_s": 0.010})
    assert not jit_lesson.table_clipped({"max_s": 0.002, "p50_s": 0.002, "p99_s": 0.002})


def test_message_mean_waits_for_the_last_of_its_segments():
    assert jit_lesson.message_mean("delay 2ms", 1 << 20) == (16, pytest.approx(2e-3))
    nic = "delay 4ms 3ms distribution pareto"
    k1, one = jit_lesson.message_mean(nic, 1024)
    k16, whole = jit_lesson.message_mean(nic, 1 << 20)
    assert (k1, k16) == (1, 16)
    assert one == pytest.approx(4e-3 + 3e-3 * models.expected_max(1, "pareto"))
    assert whole == pytest.approx(4e-3 + 3e-3 * models.expected_max(16, "pareto"))
    assert whole > one


def test_print_delays_marks_the_clipped_maximum_and_the_single_segment(capsys, said):
    jit_lesson.print_delays(("delay 2ms", "delay 4ms 3ms distribution pareto"))
    lines = capsys.readouterr().out.splitlines()
    assert "clipped maximum" not in lines[0] and "pinned at the table's clipped maximum" in lines[1]
    # the per-message table, folded: it uses E[max], taught a section later
    assert said[-1].startswith("<details>") and said[-1].endswith("</details>")
    single = [line for line in said[-1].splitlines() if "= the mean per segment" in line]
    assert len(single) == 1 and "from 16 nodes on" in single[0] and "1 segment " in single[0]


def test_collapse_factors_split_the_step_into_mean_and_tail():
    x_mean, x_tail = jit_lesson.collapse_factors(1.0, 1.94, 2.5)
    assert x_mean == pytest.approx(1.94) and x_tail == pytest.approx(2.5 / 1.94)
    assert x_mean * x_tail == pytest.approx(2.5)


def test_and_list_and_signed_ms():
    assert jit_lesson.and_list([2]) == "2"
    assert jit_lesson.and_list([2, 4]) == "2 and 4"
    assert jit_lesson.and_list(x for x in (2, 4, 8)) == "2, 4 and 8"
    assert jit_lesson.sms(-0.00001) == "0.0 ms"
    assert jit_lesson.sms(-0.0035) == "-3.5 ms"
    assert jit_lesson.sms(0.0092) == "9.2 ms"


def test_se_diff_is_the_standard_error_of_a_difference_of_means():
    a, b = np.array([1.0, 2.0, 3.0]), np.array([0.0, 0.0, 2.0, 2.0])
    expected = np.sqrt(1.0 / 3 + (4 / 3) / 4)
    assert jit_lesson.se_diff(a, b) == pytest.approx(expected)


def test_against_prediction_splits_by_two_standard_errors():
    g = {2: {"predicted_s": 0.033, "extra_s": 0.037}, 4: {"predicted_s": 0.060, "extra_s": 0.040},
         8: {"predicted_s": 0.078, "extra_s": 0.100}}
    se = {2: 0.003, 4: 0.005, 8: 0.005}
    assert jit_lesson.against_prediction(g, se) == ([4], [8], [2])


def growth_row(nodes, extra, predicted, *, jittery, calm, drawn=None):
    arrival = extra + 0.001
    return {"nodes": nodes, "extra_s": extra, "predicted_s": predicted,
            "arrival_extra_s": arrival, "calm_lateness_s": 0.001, "jittery_after_s": 0.002,
            "calm_after_s": 0.002, "drawn_max_s": arrival if drawn is None else drawn,
            "jittery": SimpleNamespace(step_times=np.asarray(jittery)),
            "calm": SimpleNamespace(step_times=np.asarray(calm))}


def test_explain_jitter_growth_names_where_it_falls_below(verdicts, said):
    growth = [growth_row(2, 0.034, 0.0333, jittery=[0.10, 0.20, 0.15], calm=[0.11, 0.11, 0.12]),
              growth_row(8, 0.050, 0.0778, jittery=[0.16, 0.17, 0.18], calm=[0.11, 0.12, 0.11])]
    jit_lesson.explain_jitter_growth(growth, native={2: 0.0024, 8: 0.0191})
    text = said[-1]
    assert "on 2 and 8 ranks**" in text and "(3 steps each" in text
    assert "Within two standard errors on 2 ranks; below it on 8." in text
    assert "plain Gloo all-reduce took 2.4 ms and 19.1 ms on 2 and 8 ranks." in text
    assert verdicts[-1][:2] == (False, "jitter made the step longer end to end on 2 and 8 "
                                       "ranks, each by more than two standard errors")


def test_draws_match_within_a_fifth_of_j_plus_3_ms():
    near = [growth_row(2, 0.03, 0.03, jittery=[0, 1], calm=[0, 1], drawn=0.031 + 0.019)]
    far = [growth_row(2, 0.03, 0.03, jittery=[0, 1], calm=[0, 1], drawn=0.031 + 0.024)]
    assert jit_lesson.draws_match(near, jitter_s=0.1)
    assert not jit_lesson.draws_match(far, jitter_s=0.1)


def test_explain_gap_tabulates_the_split_and_checks_the_draws(verdicts, said):
    growth = [growth_row(n, 0.03, 0.0333, jittery=[0, 1], calm=[0, 1]) for n in (2, 4, 8)]
    jit_lesson.explain_gap(growth, jitter_s=0.1)
    assert "| 2 | 3.3 ms | 2.3 ms | 1.0 ms | 0.0 ms |" in said[-1]
    assert "the sleeps matched the drawn values." in said[-1]
    assert verdicts[-1][0] is True


def tail_run(slow, steps, compute=0.015, exchange=0.02):
    """A free-running StepRun stand-in: each step is (steps - exchange) until the last
    arrival, then `exchange`; the first row is the reference end."""
    steps = np.asarray(steps)
    return SimpleNamespace(slow=np.asarray(slow, dtype=bool), step_times=steps,
                           wait_for_slowest=steps - exchange,
                           after_last_arrival=np.full(len(steps) + 1, exchange),
                           config={"compute_s": compute})


def test_steps_without_hiccup_skips_the_warm_up_row_and_any_slow_rank():
    run = tail_run([[1, 1], [0, 0], [0, 1], [0, 0]], [0.03, 0.08, 0.031])
    assert list(jit_lesson.steps_without_hiccup(run)) == [0.03, 0.031]


def test_binomial_sd_and_off_curve():
    r = {"predicted": 0.19, "steps": 50}
    assert jit_lesson.binomial_sd(r) == pytest.approx(np.sqrt(0.19 * 0.81 / 50))
    t = {2: {"predicted": 0.19, "steps": 50, "slow_share": 0.16},
         8: {"predicted": 0.57, "steps": 50, "slow_share": 0.85}}
    assert jit_lesson.off_curve(t) == [8]


def test_explain_tail_says_the_host_hides_the_network(verdicts, said):
    run = tail_run([[0, 0]] + [[0, 0]] * 4, [0.034, 0.035, 0.036, 0.033])
    tail = [{"nodes": n, "slow_share": s, "predicted": p, "steps": 50, "drawn_share": s,
             "agree": 0.95, "run": run}
            for n, s, p in ((2, 0.16, 0.19), (4, 0.40, 0.34), (8, 0.68, 0.57))]
    jit_lesson.explain_tail(tail, native={8: 0.0191}, ring_s=0.0028)
    text = said[-1]
    assert "16%, 40% and 68% of the steps were slow on 2, 4 and 8 ranks** (50 steps each)" in text
    assert "Consistent with the curve at every N (each within two s.d.)." in text
    assert "median of 34.5 ms" in text
    assert "against the emulated network's 2.8 ms: the rest is this host's own work" in text
    assert "a mean of 34.5 ms: 14.5 ms until the last rank reached the all-reduce" in text
    assert "then 20.0 ms of exchange" in text
    assert [h for h, _, _ in verdicts] == [True, True]
    jit_lesson.explain_tail(tail, native={8: 0.001}, ring_s=0.015)
    assert "hidden" not in said[-1]


def test_notebook_04_real_cluster_notes_compute_their_numbers_from_the_ledger():
    text = jit_lesson.real_cluster_notes()
    assert "[[linux.netem_dist_scale]]" in text and "{" not in text
    assert "4092 ms at this notebook's 2 ms" in text and "Simple protocol" in text
    assert "hits fewer steps at the same rate, but each hit step is still slow for\n  every rank" \
        in text
