"""The lesson modules of notebooks 00, 01, 01b and 09: each verdict, classification and
formatted number from small synthetic runs (no processes, no clocks)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from clusterlab import facts, models  # noqa: E402
from clusterlab.experiments import common, links  # noqa: E402
from clusterlab.lessons import interview_rehearsal as rehearsal  # noqa: E402
from clusterlab.lessons import nic_latency_jitter as link  # noqa: E402
from clusterlab.lessons import start_here as start  # noqa: E402
from clusterlab.lessons import tails_jitter_loss_contention as tails  # noqa: E402


@pytest.fixture
def busy_machine(monkeypatch):
    """conclude() without evidence of its own reads the load average: make it high."""
    monkeypatch.setattr(common, "load_per_core", lambda: 99.0)


# --- 00 start here ---------------------------------------------------------------------------


@pytest.mark.parametrize("k, capped, tail, lines", [
    (1, False, 300.0, ["dilation K = 1: this machine passed the doctor's check for the 2 ms "
                       "delay (appendix: Check your machine)"]),
    (3, True, 5900.0, ["dilation K = 3: experiments run 3 times slower and reported times "
                       "are divided by 3, so compute looks 3x faster than this CPU (appendix: "
                       "Check your machine) (capped: expect this "
                       "machine's noise to show)",
                       "warning: this machine is busy; the lateness it adds to messages (p99, "
                       "the lateness 1 message in 100 exceeds, over 2 x 300 messages) is 98% of "
                       "the delay x K, so single messages "
                       "below may arrive late (appendix)"]),
])
def test_dilation_sentence_and_busy_warning(k, capped, tail, lines, capsys):
    start.explain_dilation({"k": k, "capped": capped, "tail_us": tail, "samples": 300},
                           delay_us=2000.0)
    assert capsys.readouterr().out.splitlines() == lines


def loop_run(step, checksums=(7.0, 7.0), loss=(2.3, 2.2)):
    return {"step_median": step, "steps": 12, "checksums": list(checksums), "loss": list(loss)}


def test_runs_sentences_and_identity_checks(capsys, monkeypatch):
    runs = (loop_run(0.0164), loop_run(0.0442), loop_run(0.0049, checksums=(7.0,)))
    start.explain_runs(runs, show_details=False, dilation=1)
    assert capsys.readouterr().out.splitlines() == [  # the steps come after the prediction
        "plain and impaired runs: losses and weights bit-for-bit identical: True"]
    monkeypatch.setattr(start.basics, "format_breakdown", lambda runs: "(breakdown)")
    start.explain_runs(runs, show_details=True, dilation=1)
    assert ("details: median step (12 steps): one rank alone 4.9 ms, plain Gloo 16.4 ms, "
            "impaired 44.2 ms") in capsys.readouterr().out
    with pytest.raises(AssertionError, match="never the numbers"):
        start.explain_runs((loop_run(0.0164), loop_run(0.0442, checksums=(7.5, 7.5)), runs[2]),
                           show_details=False, dilation=1)
    with pytest.raises(AssertionError, match="replicas must stay identical"):
        start.explain_runs((loop_run(0.0164, checksums=(7.0, 7.1)),
                            loop_run(0.0442, checksums=(7.0, 7.1)), runs[2]),
                           show_details=False, dilation=1)


def test_all_reduce_sentences_split_the_gap_into_jitter_and_machine(capsys):
    start.explain_all_reduce([64.0, 63.0, 70.0], [62.5, 62.7, 62.9], predicted_ms=62.3,
                             sums=[4.0] * 4)
    assert "the gap" not in capsys.readouterr().out  # the split only on request
    start.explain_all_reduce([64.0, 63.0, 70.0], [62.5, 62.7, 62.9], predicted_ms=62.3,
                             sums=[4.0] * 4, show_details=True)
    out = capsys.readouterr().out
    assert "every rank got the sum 4 (4 ranks x 1.0)" in out
    assert "measured:   64.0 ms  (median of 3 repeats, slowest rank; range 63.0-70.0)" in out
    # both parts (+0.4, +1.3 ms) inside the repeats' 7 ms range: no split printed
    assert ("the gap, +1.7 ms, is jitter plus this machine (fold below: where the gap comes "
            "from); this run cannot split it: both parts are smaller than the range of its "
            "repeats, 7.0 ms") in out
    assert "jitter +0.4" not in out
    start.explain_all_reduce([64.0, 63.9, 64.1], [62.5, 62.7, 62.9], predicted_ms=62.3,
                             sums=[4.0] * 4, show_details=True)
    assert ("the gap, roughly (fold below: where the gap comes from): jitter +0.4 ms "
            "(emulator replay, 3 draws; message headers at most 0.06 ms of it), this machine "
            "+1.3 ms (range of the repeats 0.2 ms)") in capsys.readouterr().out


def test_all_reduce_checks_the_sum_and_the_floor():
    with pytest.raises(AssertionError):
        start.explain_all_reduce([64.0], [62.5], predicted_ms=62.3, sums=[4.0, 4.0, 3.0, 4.0])
    with pytest.raises(AssertionError, match="6 x 0.5 ms"):
        start.explain_all_reduce([40.0], [62.5], predicted_ms=62.3, sums=[4.0] * 4)


def run(forward, all_reduce, step, ranks=2, steps=4):
    """A `basics.compare` run with constant phases (seconds)."""
    phases = {name: np.full((ranks, steps), v) for name, v in
              (("forward", forward), ("backward", forward), ("optimizer", forward),
               ("all_reduce", all_reduce))}
    return {"phases": phases, "step_median": step, "steps": steps,
            "step": np.full((ranks, steps), step), "median": {"all_reduce": all_reduce}}


def test_compute_median_counts_forward_backward_and_optimizer_only():
    assert start.compute_median(run(0.001, 0.5, 0.6)) == pytest.approx(0.003)


def test_impaired_step_within_the_jitter_range_is_shown(capsys):
    plain, impaired = run(0.002, 0.010, 0.016), run(0.002, 0.039, 0.044)
    solo = run(0.0015, 0, 0.005)
    kwargs = dict(replay=np.full(200, 0.0375), compute=0.006, model_ar=0.0368, spread=0.006,
                  efficiency=0.005 / 0.044, dilation=1)
    start.explain_impaired_step(plain, impaired, solo, **kwargs)
    out = capsys.readouterr().out
    fold = out[out.index("measured - predicted"):]  # the fold prints last here
    main = out[:out.index("measured - predicted")]
    assert main.strip().splitlines()[-4:] == [  # the medians, then three lines on the main path
        "",
        "measured:   44.0 ms per step (median, 4 steps x 2 ranks)",
        "predicted:  42.8 ms = compute 6.0 (the plain run's median) + α-β all-reduce 36.8",
        "efficiency: 11% = one rank alone's 5.0 ms / 44.0 ms (median steps)"]
    # the second prediction (the impaired run's own compute) is folded
    assert ("With the impaired run's own compute (6.0 ms against 6.0: same work, shared cores) "
            "the model gives 42.8 ms.") in fold
    assert "own compute" not in main
    assert "impaired             6.0        39.0   44.0" in main  # each run's medians, visible
    assert "median, ms" not in fold
    # 44.0 - (6.0 + 36.8) = +1.2 ms; the split only in the details
    assert "measured - predicted = +1.2 ms (show_details=True splits it)" in fold
    assert "jitter" not in fold and "details:" not in fold
    # holds by construction on a quiet machine: a check of the emulator, not a finding
    assert ("Consistency check of the emulator, which holds each all_reduce until its replay "
            "(its own timing of the ring) ends: the emulated network set most of the "
            "all-reduce phase (medians: its replay is 96% of the slowest rank's phase; that "
            "phase ranged 39.0-39.0 ms over the 4 steps).") in fold
    start.explain_impaired_step(plain, impaired, solo, show_details=True, **kwargs)
    out = capsys.readouterr().out
    # this run's compute 6.0 (the plain run's) + 0; jitter 37.5 - 36.8 = +0.7; the rest +0.5
    assert ("details: the gap, +1.2 ms = this run's compute +0.0 ms against the plain run's "
            "(the prediction used the plain run's; shared cores) + jitter +0.7 ms (the "
            "emulator's replay of the network over the α-β model) + the rest +0.5 ms (this "
            "machine: waits for a core, ranks entering late)") in out
    assert ("details: all-reduce phase 39.0 ms (slowest rank, median over steps); the emulator's "
            "replay of the network alone: 37.5 ms (200 draws), so this machine added about "
            "+1.5 ms (a difference of medians)") in out
    assert ("the network allows 36.8-48.8 ms (the plain run's compute, every delay at an "
            "extreme: a loose sanity bound); all-reduce phases above its top, 42.8 ms: 0 of "
            "4") in out
    assert "single steps" not in out


def test_impaired_single_steps_above_the_ceiling_are_named_with_their_cause(capsys):
    plain, impaired = run(0.002, 0.010, 0.016), run(0.002, 0.039, 0.044)
    impaired["step"][1, 2] = 0.0495  # one slow step, its all-reduce phase within the bound
    solo = run(0.0015, 0, 0.005)
    kwargs = dict(replay=np.full(200, 0.0375), compute=0.006, model_ar=0.0368, spread=0.006,
                  efficiency=0.005 / 0.044, dilation=1, show_details=True)
    start.explain_impaired_step(plain, impaired, solo, **kwargs)
    assert ("1 of 4 single steps (slowest rank, right panel) above the top of that range, up to "
            "49.5 ms: "
            "their all-reduce phases stayed within the jitter's bound, so the excess was their "
            "compute") in capsys.readouterr().out
    impaired["phases"]["all_reduce"][0, 2] = 0.045
    start.explain_impaired_step(plain, impaired, solo, **kwargs)
    assert "some all-reduce phases beyond the jitter's bound" in capsys.readouterr().out


def test_all_reduce_phase_far_above_the_replay_is_not_shown_when_compute_was_slow_too(capsys):
    plain, impaired = run(0.002, 0.010, 0.016), run(0.002, 0.080, 0.090)
    solo = run(0.0015, 0, 0.005)
    start.explain_impaired_step(plain, impaired, solo, replay=np.full(200, 0.0375),
                                compute=0.004, model_ar=0.0368, spread=0.006,
                                efficiency=0.005 / 0.090, dilation=3)
    main = capsys.readouterr().out.split("measured - predicted", 1)[0]
    assert ("efficiency: 6% = one rank alone's 5.0 ms / 90.0 ms (median steps; times "
            "divided by K = 3, which shrinks compute but not the network: lower than at "
            "K = 1)") in main
    # a busy machine's "Not shown" stays on the main path, where the reader is
    assert "Not shown on this run: the emulated network set most of the all-reduce phase" in main
    assert "a run above 1.3x the closed form: 6 ms against 4 ms" in main


def test_impaired_step_checks_the_efficiency_is_the_ratio_of_median_steps():
    plain, impaired = run(0.002, 0.010, 0.016), run(0.002, 0.039, 0.044)
    with pytest.raises(AssertionError, match="efficiency is one rank's median step"):
        start.explain_impaired_step(plain, impaired, run(0.0015, 0, 0.005),
                                    replay=np.full(3, 0.0375), compute=0.006, model_ar=0.0368,
                                    spread=0.006, efficiency=0.16, dilation=2)


def test_impaired_step_must_be_slower_than_plain_gloo():
    plain, impaired = run(0.002, 0.010, 0.050), run(0.002, 0.039, 0.044)
    solo = run(0.0015, 0, 0.005)
    with pytest.raises(AssertionError, match="must make the step slower"):
        start.explain_impaired_step(plain, impaired, solo, replay=np.full(3, 0.0375),
                                    compute=0.006, model_ar=0.0368, spread=0.006,
                                    efficiency=0.005 / 0.044, dilation=1)


def test_real_cluster_text_computes_the_crossover_and_renders():
    text = start.real_cluster_text(alpha=2e-3, rate_Bps=125e6, alpha_nccl=14e-6, nic_Bps=50e9,
                                   first_bucket=2**20)
    facts.render(text)  # every [[fact]] is in the ledger
    main, fold = text.split("<details>")
    assert "n*" not in main  # the crossover needs notebook 01: behind the fold
    fold = " ".join(fold.split())
    # n* is defined before it is used, in kB (1000 B)
    assert fold.index("n* = α × bandwidth is the message size") < fold.index("≈ 0.7 MB")
    assert "here 2 ms × 125 MB/s = 250 kB" in fold and "KB" not in fold
    # a cost model's heuristic, said so, with the lower-α protocols it also weighs
    assert "line rate ([[nvidia.connectx7_rate_bytes]]) gives n* ≈ 0.7 MB" in fold
    assert "in NCCL's cost model and if it ran ring/Simple" in fold
    assert "would be latency-bound from 2 nodes" in fold  # 1 MiB / 2 = 0.52 MB
    assert "[[nccl.tuner_net_tree_step_latency_ll128]]" in fold
    text = " ".join(text.split())
    assert ("the transport ([[rdma.kernel_bypass]] between registered buffers, into which NCCL "
            "copies the user's data unless that buffer is registered too)") in text
    assert ("plus, twice for Simple, the latency the network plugin reports, 0 for NCCL's own "
            "InfiniBand and socket") in text
    text = start.real_cluster_text(alpha=2e-3, rate_Bps=125e6, alpha_nccl=14e-6, nic_Bps=50e9,
                                   first_bucket=1.5e6)
    assert "from 3 nodes" in " ".join(text.split())  # 1.5 MB / 2 is above 0.7 MB, / 3 below


def test_real_cluster_text_low_latency_constants_are_the_ledgers():
    """With one GPU per node NCCL's tuner charges the tree's network step (tuning.cc)."""
    assert facts.get("nccl.tuner_net_tree_step_latency_ll128").value == 8.5
    assert facts.get("nccl.tuner_net_tree_step_latency_ll").value == 5.0
    assert facts.get("nccl.tuner_net_ring_step_latency_simple").value == 14


def doctor_inputs(*, native_p99, tail, floor=500.0, capped=False):
    info = {"native_one_way_us": {"p50": 140.0, "p99": native_p99, "samples": 200},
            "smallest_faithful_delay_us": floor}
    dil = {"floor_us": floor, "tail_us": tail, "samples": 300, "capped": capped}
    return info, dil


@pytest.mark.parametrize("native_p99, tail, k, case", [
    (1500.0, 300.0, 1, "fits"),          # plain Gloo's p99 inside the 2 ms delay
    (3650.0, 300.0, 1, "connection"),    # above it, but the emulator's tail is low
    (3650.0, 3400.0, 1, "busy"),         # above it, and the emulator's tail is high too
    (3650.0, 300.0, 2, "fits"),          # inside the delay x K
])
def test_native_tail_case(native_p99, tail, k, case):
    info, dil = doctor_inputs(native_p99=native_p99, tail=tail)
    assert start.native_tail_case(info, dil, delay_us=2000.0, dilation=k) == case


def test_doctor_sentences_and_warning_at_the_edge(capsys):
    info, dil = doctor_inputs(native_p99=3650.0, tail=300.0)
    start.explain_doctor(info, dil, delay_us=2000.0, dilation=1)
    out = capsys.readouterr().out
    assert out.startswith("K = 1: the 2 ms delay covers this machine's floor 0.5 ms x 2 = 1 ms "
                          "and its late tail 0.30 ms (p99 over 2 x 300 messages), so the "
                          "experiments above ran at 2 ms\n")  # the verdict first
    assert ("(about its 4 slowest of 2 x 200 messages), lies above the delay: shown for scale, "
            "it is not the criterion (the late tail through the emulator, 0.30 ms, is)") in out
    assert "at the edge" not in out
    info, dil = doctor_inputs(native_p99=3650.0, tail=5900.0)
    start.explain_doctor(info, dil, delay_us=2000.0, dilation=3)
    out = capsys.readouterr().out
    assert out.startswith("K = 3: the 2 ms delay does not cover both this machine's floor")
    assert "ran at 6 ms and reported times divided by 3" in out
    assert "below the delay x K" in out
    assert "late tail is 98% of the dilated delay" in out
    info, dil = doctor_inputs(native_p99=3940.0, tail=3370.0)
    start.explain_doctor(info, dil, delay_us=2000.0, dilation=2)
    out = capsys.readouterr().out
    assert "3.94 ms, is just below the delay x K" in out
    assert "jitter" not in out  # only when told the jitter
    start.explain_doctor(info, dil, delay_us=2000.0, dilation=2, jitter_us=500.0)
    assert ("the late tail in reported time, 1.69 ms (p99 over 2 x 300 messages, ÷ K), is "
            "above the ±0.5 ms jitter: K makes the delay faithful, not a single message's "
            "jitter that small") in capsys.readouterr().out
    start.explain_doctor(info, dil, delay_us=2000.0, dilation=4, jitter_us=1000.0)
    assert "late tail in reported time" not in capsys.readouterr().out  # 0.84 ms: within it


def test_doctor_checks_k_against_its_criterion():
    info, dil = doctor_inputs(native_p99=1500.0, tail=2500.0)
    with pytest.raises(AssertionError):
        start.explain_doctor(info, dil, delay_us=2000.0, dilation=1)
    info, dil = doctor_inputs(native_p99=1500.0, tail=2500.0, capped=True)
    start.explain_doctor(info, dil, delay_us=2000.0, dilation=1)  # capped: noise is expected


def test_start_figures_draw():
    start.plot_all_reduce(np.full((4, 7), 64.0), predicted_ms=62.3)
    runs = [run(0.002, 0.010, 0.016), run(0.002, 0.039, 0.044), run(0.0015, 0, 0.005)]
    for r, (nodes, nic) in zip(runs, ((2, None), (2, "delay 2ms"), (1, None))):
        r.update(nodes=nodes, nic=nic)
    start.plot_impaired(runs)
    info, dil = doctor_inputs(native_p99=3650.0, tail=300.0)
    start.plot_doctor(info, dil, delay_us=2000.0, dilation=2)


# --- 01 a link ---------------------------------------------------------------------------------


def ping_pong(one_way, rtt):
    one_way, rtt = np.asarray(one_way), np.asarray(rtt)
    return {"one_way_ms": one_way, "rtt_ms": rtt, "emulated_ms": np.full(len(one_way), 4.0),
            "noise_ms": one_way - 4.0,
            "percentiles": {"p50": float(np.median(one_way)), "min": float(one_way.min())},
            "rtt_percentiles": {"p50": float(np.median(rtt)), "min": float(rtt.min())}}


def test_late_round_trips_are_one_ms_over_two_delays():
    late, late_ms = link.late_round_trips([8.1, 8.99, 9.0, 12.0], delay_ms=4.0)
    assert late_ms == 9.0 and late.tolist() == [False, False, True, True]


def test_ping_pong_sentences(capsys):
    pp = ping_pong([4.04, 4.05, 4.03, 4.10], [8.08, 8.07, 8.09, 11.6])
    link.explain_ping_pong(pp, delay_ms=4.0)
    out = capsys.readouterr().out
    assert "one-way: median 4.045 ms, fastest 4.030 ms   (configured 4 ms; median +1.1% off)" in out
    assert ("late tail: 1 of 4 round trips (25.0%) took 9 ms or more; the slowest took "
            "11.600 ms") in out


def test_ping_pong_checks_no_message_beats_the_delay():
    pp = ping_pong([3.9, 4.05], [8.08, 8.07])
    with pytest.raises(AssertionError, match="beat the configured delay"):
        link.explain_ping_pong(pp, delay_ms=4.0)


def test_effective_bandwidth_in_mbit():
    assert link.effective_mbit([10**6], [8.0]) == pytest.approx([1000.0])


def sweep(alpha=2e-3, beta=8e-9, fit_alpha=None):
    sizes = 2 ** np.arange(10, 24)
    best_s = (fit_alpha or alpha) + sizes * beta
    fit = models.fit_alpha_beta(sizes, best_s)
    return {"fit": fit, "sizes": sizes, "best_ms": best_s * 1e3,
            "latency_share": alpha / (alpha + sizes * beta),
            "configured_alpha": alpha, "configured_beta": beta,
            "crossover_bytes": fit.alpha / fit.beta, "configured_crossover_bytes": alpha / beta}


def test_sweep_sentences_recover_the_configured_link(capsys):
    link.explain_sweep(sweep(fit_alpha=2.048e-3))  # n* = 256.0 kB, off a rounding edge
    out = capsys.readouterr().out
    assert "fit: α = 2.048 ms (configured 2.0, +48 µs), β = 8.000 ns/byte" in out
    assert "worst residual 0.0%" in out
    assert "n* = 256 kB (configured 250)" in out
    assert "at 1 KiB" in out and "at 64 KiB" in out and "at 8 MiB" in out


def test_sweep_checks_the_fit_against_the_configuration():
    with pytest.raises(AssertionError):
        link.explain_sweep(sweep(fit_alpha=3e-3))


@pytest.mark.parametrize("us, text", [
    ([100.0] * 10, "none of 10 took 1 ms or more"),
    ([100.0] * 8 + [2500.0, 1000.0], "2 outliers of 10 took 1 ms or more (1.0, 2.5 ms)"),
    ([100.0] * 4 + [2000.0] * 6, "slow mode: 6 of 10 (60.0%) took 1 ms or more (median 2.0 ms)"),
])
def test_slow_messages_text(us, text):
    assert link.slow_messages_text(us) == text


def test_noise_floor_returns_the_fast_path(capsys):
    one_way = np.array([0.15, 0.16, 0.17, 0.18, 1.2])
    floor = {"one_way_ms": one_way,
             "percentiles": {"p1": 0.15, "p50": 0.17, "p99": 1.1}}
    fast = link.explain_noise_floor(floor)
    assert fast.tolist() == pytest.approx([150.0, 160.0, 170.0, 180.0])
    out = capsys.readouterr().out
    assert "fast path: median 165 µs (4 of 5 messages under 1 ms)" in out
    assert "1 outlier of 5 took 1 ms or more (1.2 ms); load average" in out


def test_excess_sentences(capsys):
    pp = {"noise_ms": np.linspace(0.040, 0.044, 200)}
    link.explain_excess(pp, np.linspace(160.0, 170.0, 200), delay_ms=4.0)
    out = capsys.readouterr().out
    # the takeaway first: the excess and its share of the delay
    assert out.startswith("the emulator and this machine add a median 42 µs per message (95% "
                          "interval ")
    assert ("200 pings): 1.1% of the 4 ms delay, small against the delays of the "
            "lessons\n") in out  # 42 µs of 4 ms
    link.explain_excess({"noise_ms": np.full(200, 0.6)}, np.array([]))
    assert "15.0% of the 4 ms delay, not small: this machine was busy" in \
        capsys.readouterr().out
    assert "its p99: 44 µs over 200 pings" in out
    assert ("for scale, plain Gloo's fast path (another path, its transfer included): median "
            "165 µs") in out
    link.explain_excess(pp, np.array([]))
    assert "plain Gloo" not in capsys.readouterr().out  # no native message under 1 ms


def test_link_notes_render_from_the_ledger():
    facts.render(link.TRANSPORT_AND_CONGESTION)


def test_tcp_after_idle_is_worked_through_window_by_window(capsys):
    sizes = np.array([1024 * 2**k for k in range(14)])
    alpha, beta = 2e-3, (1 + 66 / 65536) / 125e6
    idle = links.tcp_after_idle(sizes, alpha, beta, 1448, 10)
    link.explain_tcp_after_idle(idle, alpha=alpha, beta=beta, first_window=14480)
    assert capsys.readouterr().out == (  # one line; the windows behind a fold
        "slowed most (a rough sketch, not measured): 128 KiB takes 15.0 ms from TCP's initial "
        "window instead of 3.0 ms: 3 round trips more\n"
        "The window starts at 14.5 kB and doubles every round trip: 14.5, 29.0, 57.9 kB, 101 "
        "kB sent in 3 round trips; the rest of the 131 kB goes in round trip 4. So 3 round "
        "trips more than the emulator's one burst, 4 ms each.\n")
    link.plot_tcp_after_idle(idle, alpha=alpha, beta=beta)


def test_link_figures_draw():
    pp = ping_pong([4.04, 4.05], [8.08, 8.07])
    link.plot_ping_pong(pp, delay_ms=4.0)
    link.plot_excess(pp, {"one_way_ms": np.array([0.15, 0.2, 1.3])})


# --- 01b tails ---------------------------------------------------------------------------------


def test_noise_dominated_compares_the_machine_with_the_network_tail():
    step64 = {"uniform": {"measured": 5.1, "network": 4.97},   # machine 0.13 < tail 0.97
              "pareto": {"measured": 9.0, "network": 4.5}}     # machine 4.5 > tail 0.5
    assert tails.noise_dominated(step64) == ["pareto"]


def jitter_runs(noise=0.05, seed=1):
    rng = np.random.default_rng(seed)
    runs = {}
    for name in tails.DISTRIBUTIONS:
        network = 4.0 + rng.uniform(-1.0, 1.0, 200)
        runs[name] = {"one_way_ms": network + noise, "emulated_ms": network}
    return runs


def test_slowest_of_p_pairs_the_measured_and_the_network_resample():
    curves, step64 = tails.slowest_of_p(jitter_runs(), ranks=[1, 8, 64])
    for name in tails.DISTRIBUTIONS:
        v = step64[name]
        assert v["n"] == 200 and curves[name]["n"] == 200
        assert v["measured"] == pytest.approx(v["network"] + 0.05)  # the same indices
        assert v["model"] == pytest.approx(4.0 + models.expected_max(64, name, 1.0))
        assert len(curves[name]["mean"]) == 3


def step64_of(measured):
    return {name: {"measured": m, "network": 4.97, "model": 4.97, "median": 4.0, "n": 200,
                   "network_p99": 4.97, "model_p99": 4.98}
            for name, m in zip(tails.DISTRIBUTIONS, measured)}


def test_slowest_of_64_shown_when_the_network_sets_every_tail(capsys):
    parts = {name: {"beyond_network": 0} for name in tails.DISTRIBUTIONS}
    quote, details = tails.explain_slowest_of_64(step64_of([5.0, 5.1, 5.2]), parts, busy=None)
    assert quote == {name: True for name in tails.DISTRIBUTIONS}
    out = capsys.readouterr().out
    # the main path: the network's draws against the model, one line each
    assert ("  normal: network alone, median ping 4.00 ms, slowest of 64 4.97 ms (mean of 2000 "
            "draws; model 4.97)\n") in out
    assert "this machine" not in out and "Shown" not in out
    # the split and the verdict: the appendix's
    assert ("  normal: slowest of 64 measured 5.10 ms = network alone 4.97 + this machine "
            "+0.13") in details
    assert details[-1] == ("Shown on this run: for every distribution the network's tail "
                           "(network alone - the 4 ms delay) moved the slowest of 64 more than "
                           "this machine did.")


def test_slowest_of_64_names_the_distributions_this_machine_moved(capsys):
    parts = {name: {"beyond_network": 3 if name == "pareto" else 0}
             for name in tails.DISTRIBUTIONS}
    quote, _ = tails.explain_slowest_of_64(step64_of([5.0, 5.1, 7.0]), parts, busy=None)
    assert quote == {"uniform": True, "normal": True, "pareto": False}
    out = capsys.readouterr().out
    assert ("Not shown on this run: for every distribution the network's tail (network alone "
            "- the 4 ms delay) moved the slowest of 64 more than this machine did (this machine "
            "moved it more for pareto) (3 pings later than any network draw;") in out


def test_slowest_of_64_checks_noise_only_adds():
    parts = {name: {"beyond_network": 0} for name in tails.DISTRIBUTIONS}
    with pytest.raises(AssertionError, match="noise only lengthened"):
        tails.explain_slowest_of_64(step64_of([4.0, 5.1, 5.2]), parts, busy=None)


def test_p99_text():
    assert tails.p99_text({"percentiles": {"p99": 201.06}, "p99_gap": None}) == "p99 201.06 ms"
    assert tails.p99_text({"percentiles": {"p99": 90.0}, "p99_gap": (2.2, 201.0)}) == \
        "p99 falls between two pings, 2.2 and 201 ms"


def loss_run(timeouts, *, late=0, n=200):
    emulated = np.full(n, 1.0)
    emulated[:timeouts] = 201.0
    measured = emulated + 0.04
    return {"one_way_ms": measured, "emulated_ms": emulated, "late_ms": (1.5, 101.0),
            "percentiles": {"p50": float(np.median(measured)),
                            "p99": float(np.percentile(measured, 99))},
            "p99_gap": None, "emulated_rto": timeouts, "rto_delayed": timeouts,
            "expected_rto": n * timeouts / n, "late": late,
            "emulated": {"p50": float(np.median(emulated)), "mean": float(emulated.mean())}}


def test_loss_sentences_and_checks(capsys):
    runs = {0: loss_run(0, late=1), 1: loss_run(2), 5: loss_run(10)}
    tails.explain_loss(runs)
    out = capsys.readouterr().out
    assert "loss 5%: median 1.04 ms, p99 201.04 ms; 10 of 200 waited for a timeout" in out
    assert "(1 of 200 pings at 0% loss were delayed by this machine: appendix)" in out
    runs[1]["emulated_ms"][5] = 50.0  # the network never draws between the delay and a timeout
    with pytest.raises(AssertionError, match="draws nothing there"):
        tails.explain_loss(runs)


def contention(alone, own, shares):
    rows = {1: {"own": {"per_process": alone}}}
    for p_, share in shares.items():
        rows[p_] = {"own": {"per_process": own},
                    "shared": {"share": np.asarray(share, dtype=float), "window_messages": 40}}
    return {"rate_Bps": 12.5e6, "rows": rows}


def test_sharing_concludes_rate_over_p_and_says_when_it_cannot_tell(capsys):
    cont = contention(12.4e6, 12.45e6, {2: [6.3e6, 6.2e6], 4: [np.nan, 3.1e6, 3.1e6, 3.2e6]})
    saturated, details = tails.explain_sharing(cont)
    out = capsys.readouterr().out
    assert saturated is True
    assert "P = 1: 99 Mbit/s alone (the NIC's rate: 100 Mbit/s)\n" in out
    assert ("P = 2 behind one NIC: 50.4, 49.6 Mbit/s each (rate / P = 50.0); with a NIC each: "
            "100 Mbit/s each\n") in out
    assert "P = 4: cannot tell each process's share" in out
    assert "Shown on this run" not in out  # the verdicts shown go to the appendix
    assert details == [
        "Shown on this run: a lone stream reached the NIC's rate (it reached 99 of 100 Mbit/s), "
        "so that the NIC, not this machine's CPUs, sets the pace and the sharing can show.",
        "P = 2: shares from 40 messages (all 2 receiving); own node each 99.6 Mbit/s",
        "Shown on this run: with P = 2, a NIC of its own gave each process the full rate (it "
        "gave 100 Mbit/s).",
        "Shown on this run: with P = 2, each process behind one NIC got rate / P within 15% (they "
        "got 50.4, 49.6 Mbit/s).",
        "P = 4: shares from 40 messages (all 4 receiving); own node each 99.6 Mbit/s"]


def test_sharing_concludes_nothing_more_when_the_lone_stream_is_cpu_bound(capsys, busy_machine):
    cont = contention(6.0e6, 6.0e6, {2: [3.0e6, 3.0e6]})
    saturated, _ = tails.explain_sharing(cont)
    out = capsys.readouterr().out
    assert saturated is False
    assert "Not shown on this run: a lone stream reached the NIC's rate" in out
    assert "with P = 2" not in out


def test_sharing_that_misses_rate_over_p_is_not_shown_on_a_busy_machine(capsys, busy_machine):
    cont = contention(12.4e6, 12.45e6, {2: [9.0e6, 3.5e6]})
    tails.explain_sharing(cont)
    assert "Not shown on this run: with P = 2, each process behind one NIC got rate / P" in \
        capsys.readouterr().out


def queueing(loaded):
    loaded = np.asarray(loaded, dtype=float)
    return {"idle": {"p50": 1.2, "p90": 1.5}, "loaded": {"p50": float(np.median(loaded))},
            "loaded_ms": loaded, "message_ms": 21.0, "offered": 0.91}


def test_queueing_details_and_checks(capsys):
    details = tails.explain_queueing(queueing([1.3, 8.0, 10.0, 12.0, 25.0, 31.0]), saturated=True)
    assert "median 1.20 ms idle, 11.00 ms behind bulk traffic (n = 6 each)" in \
        capsys.readouterr().out
    assert details == ["the stream kept the NIC busy 91% of the time; 83% of loaded pings were "
                       "slower than the idle p90",
                       "median wait 0.47 of one bulk message (21.0 ms); 2 waited longer than a "
                       "whole message, 1 beyond the 30 ms clip"]
    short_waits = queueing([1.3, 1.4, 2.0, 3.0])
    with pytest.raises(AssertionError, match="queueing behind bulk data"):
        tails.explain_queueing(short_waits, saturated=True)
    tails.explain_queueing(short_waits, saturated=False)  # not NIC-bound: nothing to check


def dilated(busy=None):
    return {"busy": busy, "k": 1 if busy is None else 3, "noise_p99_ms": 0.18,
            "noise_p99_dilated_ms": 0.18, "target_ms": 0.5, "wanted": 3, "capped": False}


def jitter_parts(runs):
    parts = {}
    for name, r in runs.items():
        measured, network = np.percentile(r["one_way_ms"], 99), np.percentile(r["emulated_ms"], 99)
        parts[name] = {"measured": measured, "network": network, "noise": 0.05, "n": 200,
                       "beyond_network": 2, "measured_ci": (measured - 0.1, np.inf),
                       "machine_extra": measured - network}
    return parts


def test_jitter_sentences_say_when_the_machine_was_busy(capsys):
    runs = jitter_runs()
    for r in runs.values():
        r["percentiles"] = {"p50": float(np.median(r["one_way_ms"]))}
    parts = jitter_parts(runs)
    parts["normal"]["machine_extra"] = 0.24
    tails.explain_jitter(runs, parts, dilated())
    out = capsys.readouterr().out
    assert out.endswith("\nThis machine moved every measured p99 by at most 0.24 ms "
                        "(appendix).\n")
    median = np.median(runs["normal"]["emulated_ms"])
    network = parts["normal"]["network"]
    assert (f"  normal: median {median:.2f} ms, p99 {network:.2f} ms (network alone, n = 200); "
            "model p99 6.33 ms\n") in out
    tails.explain_jitter(runs, parts, dilated(busy="noise p99 0.9 ms"))
    out = capsys.readouterr().out
    assert out.endswith("by at most 0.24 ms, but it was busier than planned during the runs "
                        "(noise p99 up to 0.18 ms, not 0.50; appendix), so it may move the "
                        "slowest of 64 more.\n")


def appendix_runs():
    runs = jitter_runs()
    runs["none"] = {"one_way_ms": np.full(200, 4.05), "emulated_ms": np.full(200, 4.0)}
    for r in runs.values():
        r["emulated"] = {"p1": float(np.percentile(r["emulated_ms"], 1)),
                         "p50": float(np.median(r["emulated_ms"])),
                         "p99": float(np.percentile(r["emulated_ms"], 99))}
    runs["pareto"]["emulated_ms"] = np.r_[np.full(190, 3.6), np.full(10, 8.0)]
    runs["pareto"]["one_way_ms"] = runs["pareto"]["emulated_ms"] + 0.05
    runs["pareto"]["emulated"] = {"p1": 3.6, "p50": 3.6, "p99": 8.0}
    return runs


def test_noise_appendix_sentences_and_checks(capsys):
    runs = appendix_runs()
    tails.explain_noise_appendix(runs, jitter_parts(runs), dilated())
    out = capsys.readouterr().out
    assert "machine noise: p99 0.18 ms over 200 jitter-free pings, so K = 1\n" in out
    assert "(J/2): plan met" in out
    assert "    none: p99 4.05 ms, network 4.00 ms (+0.05), noise alone 0.05 ms\n" in out
    assert "  pareto: p99 95% interval 7.95 .. open ms; 190/200 before the 4 ms delay" in out
    runs["uniform"]["one_way_ms"] = runs["uniform"]["emulated_ms"] - 0.01
    with pytest.raises(AssertionError, match="noise only adds"):
        tails.explain_noise_appendix(runs, jitter_parts(runs), dilated())


def test_more_late_pings_needs_intervals_apart():
    runs = {0: {"late_ci": (0.0, 0.02)}, 1: {"late_ci": (0.01, 0.05)}, 5: {"late_ci": (0.03, 0.09)}}
    assert tails.more_late_pings(runs) == ["5%"]


def test_loss_and_contention_appendix(capsys):
    runs = {p: dict(loss_run(t), loss_ci=(t / 200 * 0.5, t / 200 * 2 + 0.019),
                    late_ci=(0.0, 0.02)) for p, t in ((0, 0), (1, 2), (5, 10))}
    tails.explain_loss_and_contention_appendix(runs, ["P = 2: shares"])
    out = capsys.readouterr().out
    assert "loss 5%: 10 timeouts (expected 10; rate 2.5% .. 11.9%); 0/200 pings between 1.5 and " \
           "101 ms" in out
    assert "about as many as at 0% loss (95% intervals overlap)" in out
    assert out.endswith("contention:\n  P = 2: shares\n")


def test_tails_notes_render_from_the_ledger():
    text = facts.render(tails.ON_A_REAL_GPU_CLUSTER)
    main, fold = text.split("<details>", 1)
    assert main.count("- **") == 4  # four one-line points; the rest behind the fold
    assert "NCCL_IB_TIMEOUT" not in main and "head-of-queue" in fold  # IB's drops are sourced
    facts.render(tails.LOSS_RECOVERY)


def test_loss_at_scale_folds_the_reasoned_gloo_estimate(capsys):
    tails.explain_loss_at_scale(8, losses=(0.001,))
    out = capsys.readouterr().out
    main, fold = out.split("A lower estimate", 1)
    assert main.splitlines() == [
        "at 0.1% loss per message, about 1 all-reduce in 9 on 8 ranks stalls for >= 200 ms "
        "(this emulator: a loss among the 112 messages of its ring, each one lone here)"]
    assert "- loss 0.10%: from about 1.6% of all-reduces (emulator 10.6%)" in fold
    assert "reasoned, not measured" in fold and "pytorch/gloo" in fold  # its source


def test_tails_figures_draw():
    curves, _ = tails.slowest_of_p(jitter_runs(), ranks=[1, 8, 64])
    tails.plot_slowest_of_p(curves, ranks=[1, 8, 64])


# --- 09 interview rehearsal --------------------------------------------------------------------


@pytest.mark.parametrize("topic, notebooks, mark", [
    ("ddp", ["03"], ""),
    ("sharding", ["10", "10b"], "  (after 10-12)"),
    ("real-cluster", ["01", "02b"], "  (nearest sections)"),
])
def test_review_mark(topic, notebooks, mark):
    assert rehearsal.review_mark(topic, notebooks, {"ddp"}) == mark


def test_topic_table_counts_every_question_once(capsys):
    from clusterlab.quiz import TOPICS_TO_08B, Bank

    bank = Bank.load()
    rehearsal.print_topics(bank, so_far=TOPICS_TO_08B)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["topic", "choice", "numeric", "open", "review", "in"]
    assert len(lines) == len(bank.topics()) + 3  # header, topics, total, the SO_FAR count
    assert lines[-2].split() == ["total", str(len(bank.questions))]
    counted = sum(int(n) for line in lines[1:-2]
                  for n in line[45:].split()[:3])
    assert counted == len(bank.questions)
    so_far = sum(1 for q in bank.questions if q.topic in TOPICS_TO_08B)
    assert lines[-1].startswith("of them in the topics of SO_FAR") and \
        lines[-1].split()[-1] == str(so_far)


def test_fold_keeps_the_text_behind_a_details_block():
    md = rehearsal.fold_markdown("Key points", "1. one\n2. two")
    assert md.startswith("<details><summary>Key points (click to open)</summary>")
    assert "```text\n1. one\n2. two\n```" in md and md.endswith("</details>")


@pytest.mark.parametrize("lang", ["en", "ru"])
def test_seed_question_prints_the_short_version_and_folds_the_rest(lang, capsys, monkeypatch):
    from clusterlab.quiz import Bank
    from clusterlab.quiz.i18n import t

    shown = []
    monkeypatch.setattr(rehearsal, "display", lambda md: shown.append(md.data))
    bank = Bank.load()
    rehearsal.seed_question("seed-nic-latency-jitter", bank=bank, lang=lang)
    printed = capsys.readouterr().out
    assert t("key_points", lang) not in printed  # the checklist is folded, not printed
    assert len(shown) == 2
    assert shown[0].startswith(f"<details><summary>{t('model_answer', lang)}: about two minutes")
    assert shown[1].startswith(f"<details><summary>{t('key_points', lang)}: the checklist")
    head, answer, points = rehearsal.seed_parts("seed-nic-latency-jitter", bank=bank, lang=lang)
    assert printed == head + "\n"
    assert " ".join(answer[0].split()[:4]) in shown[0]  # the model answer, rewrapped
    assert points in shown[1]
    assert not points.startswith(t("key_points", lang))
