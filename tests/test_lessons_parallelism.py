"""The lesson modules of notebooks 10, 10b, 11 and 11b on small synthetic runs: each verdict,
classification and formatted number they print or assert, without running a cluster."""

from __future__ import annotations

import types

import numpy as np
import pytest

from clusterlab.experiments import common
from clusterlab.lessons import compressing_communication as l11
from clusterlab.lessons import error_feedback_and_accuracy as l11b
from clusterlab.lessons import sharding_and_parallelism_traffic as l10
from clusterlab.lessons import tensor_pipeline_expert_parallelism as l10b


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """A conclusion that does not hold is then a failure (AssertionError), not 'busy'."""
    monkeypatch.setattr(common, "load_per_core", lambda: 0.0)


# --- 10: sharding ------------------------------------------------------------------------

def test_say_prints_plain_wrapped_text(capsys):
    l10.say("**bold** and `code` " + "word " * 40)
    out = capsys.readouterr().out
    assert "**" not in out and "`" not in out and out.startswith("bold and code word")
    assert max(len(line) for line in out.splitlines()) <= 96 and len(out.splitlines()) > 1


def _row(nic, ddp, fsdp, ddp_comm, fsdp_comm, *, ddp_pred=None, fsdp_pred=None):
    return {"nic": nic, "ddp_s": ddp, "fsdp_s": fsdp, "ddp_comm_s": ddp_comm,
            "fsdp_comm_s": fsdp_comm, "ddp_predicted_s": ddp_pred or ddp,
            "fsdp_predicted_s": fsdp_pred or fsdp, "ddp_sent": 100, "fsdp_sent": 150,
            "steps": 8}


def _sweep(fsdp_hi=0.101, ddp_hi=0.028):
    # 2 rounds for DDP, 9 for FSDP2: +18 ms and +81 ms of closed form from 1 ms to 10 ms.
    return [_row("delay 1ms", 0.010, 0.020, 0.004, 0.018),
            _row("delay 5ms", 0.018, 0.056, 0.012, 0.054),
            _row("delay 10ms", ddp_hi, fsdp_hi, 0.022, 0.099),
            _row("delay 1ms rate 50mbit", 0.042, 0.068, 0.036, 0.066)]


def test_step_times_conclude_when_fsdp_grows_as_its_closed_form(capsys):
    assert l10.explain_step_times(_sweep()) is True
    out = capsys.readouterr().out
    assert "Shown on this run: FSDP2's step grew over twice" in out
    assert "FSDP2's step grew 4.5x as much as DDP's for latency, for 1.50x the bytes" in out
    assert "DDP          18.0 ms [ 18.0 ms]" in out  # DDP's growth and its closed form


def test_step_times_fail_when_fsdp_grows_like_ddp():
    with pytest.raises(AssertionError, match="not shown on a quiet machine"):
        l10.explain_step_times(_sweep(ddp_hi=0.070))  # DDP +60 ms, 3.3x its closed form


def test_step_times_assert_the_networks_floor():
    sweep = _sweep()
    sweep[1]["ddp_s"] = 0.5 * sweep[1]["ddp_comm_s"]
    with pytest.raises(AssertionError):
        l10.explain_step_times(sweep)


def test_report_misses_classifies_points_below_and_above(capsys):
    lo = _row("delay 1ms", 0.010, 0.020, 0.004, 0.018)  # overhead: DDP 6 ms, FSDP2 2 ms
    inside = _row("delay 5ms", 0.018, 0.056, 0.012, 0.054, ddp_pred=0.022)  # 4 ms under
    l10.report_misses([lo, inside], lo)
    out = " ".join(capsys.readouterr().out.split())
    assert "below their predictions: DDP at delay 5ms by 4.0 ms" in out
    assert "within the delay 1ms run's overhead" in out
    beyond = _row("delay 5ms", 0.018, 0.056, 0.012, 0.054, fsdp_pred=0.066)  # 10 ms under
    l10.report_misses([lo, beyond], lo)
    assert "not explained by this run" in " ".join(capsys.readouterr().out.split())
    over = _row("delay 5ms", 0.018, 0.070, 0.012, 0.054, fsdp_pred=0.056)
    l10.report_misses([lo, over], lo)
    assert ("over 10% above the prediction: FSDP2 at delay 5ms by 14.0 ms (25% of its predicted "
            "step)") in " ".join(capsys.readouterr().out.split())
    l10.report_misses([lo, _row("delay 5ms", 0.018, 0.056, 0.012, 0.054)], lo)
    assert capsys.readouterr().out == ""


def test_ring_rounds_bytes_and_their_crossing():
    # One GPU per node, 1 s per step between nodes: 3 (n-1) s of rounds against
    # 3 (n-1)/n * 2 psi / B of bytes, so the rounds win once n > 2 psi / B = 10.
    assert l10.ring_rounds_s(4, 1, units=1, a_net=1.0, a_nv=0.0) == 9.0
    assert l10.ring_rounds_s(8, 4, units=2, a_net=1.0, a_nv=0.5) == 6 * (1 + 6 * 0.5)
    assert l10.ring_wire_s(4, 2, psi=5.0, nic_bw=1.0) == pytest.approx(3 * 3 / 4 * 10 / 2)
    assert l10.crossing(1, 1, units=1, a_net=1.0, a_nv=0.0, psi=5.0, nic_bw=1.0) == 11


def _pre(forward, forward_pre, predicted=0.096, predicted_pre=0.056):
    return {"forward_s": forward, "forward_prefetch_s": forward_pre, "predicted_s": predicted,
            "predicted_prefetch_s": predicted_pre, "depth": 6, "steps": 7}


def test_prefetch_saving_close_to_the_closed_form(capsys):
    assert l10.explain_prefetch(_pre(0.102, 0.062)) is True
    out = " ".join(capsys.readouterr().out.split())
    assert "prefetching saved 40.0 ms, 100% of the closed form's 40.0 ms" in out
    assert "about 1.0 per layer" not in out and "about 1.0 ms per layer" in out
    assert "prefetching added" not in out
    assert "Shown on this run: prefetching saved within 25%" in out


def test_prefetch_names_extra_time_and_busy_evidence(capsys):
    # Prefetching's forward 30 ms above its closed form (> 1.3x): the machine set it.
    assert l10.explain_prefetch(_pre(0.100, 0.086)) is False
    out = " ".join(capsys.readouterr().out.split())
    assert "prefetching added 26.0 ms more" in out
    assert "between 0.7 ms and 5.0 ms per layer" in out  # both forwards' excess per layer
    assert "Not shown on this run" in out and "86 ms against 56 ms" in out


def test_prefetch_fails_on_a_quiet_run():
    with pytest.raises(AssertionError):
        l10.explain_prefetch(_pre(0.100, 0.070))  # saved 30 of 40 ms, forwards within 1.3x


def _traffic(zero3_sent=112320):
    ddp = {"ops": 1, "by_kind": {"allreduce": 74880}, "sent": [74880] * 4, "predicted": 74880}
    zero3 = {"ops": 9, "by_kind": {}, "sent": [zero3_sent] * 4, "predicted": zero3_sent}
    zero1 = {"ops": 12, "by_kind": {}, "sent": [74880] * 4, "predicted": 74880}
    return {"ddp": ddp, "zero1": zero1, "zero2": dict(zero1), "zero3": zero3,
            "fsdp_no_reshard": {"ops": 6, "by_kind": {}, "sent": [74880] * 4,
                                "predicted": 74880}}


def test_traffic_ratio_and_its_checks():
    names = dict.fromkeys(("ddp", "zero1", "zero2", "zero3", "fsdp_no_reshard"), "")
    assert l10.explain_traffic(_traffic(), names) == 1.5
    with pytest.raises(AssertionError):
        l10.explain_traffic(_traffic(zero3_sent=100000), names)
    uneven = _traffic()
    uneven["zero1"]["sent"][2] += 1
    with pytest.raises(AssertionError, match="zero1"):
        l10.explain_traffic(uneven, names)


# --- 10b: tensor, pipeline and expert parallelism ----------------------------------------

def test_kb():
    assert l10b.kb(12345) == "12.3 kB"


def _tp_row(nic, tp, dp, tp_comm, dp_comm):
    return {"nic": nic, "tp_s": tp, "tp_dp_s": dp, "tp_comm_s": tp_comm,
            "tp_dp_comm_s": dp_comm, "tp_allreduces": 8, "dp_allreduces": 1,
            "tp_max_error": 1e-7, "tp_sent": 65536, "tp_dp_sent": 131072, "steps": 8}


def _tp_sweep(tp_hi=0.180, dp_hi=0.040):
    return [_tp_row("delay 1ms", 0.030, 0.020, 0.016, 0.002),
            _tp_row("delay 5ms", 0.100, 0.030, 0.080, 0.010),
            _tp_row("delay 10ms", tp_hi, dp_hi, 0.160, 0.020)]


def test_tp_concludes_and_flags_dp_noise(capsys):
    details = []
    assert l10b.explain_tp(_tp_sweep(), details=details) is True
    out = capsys.readouterr().out
    assert ("Shown on this run: the tensor-parallel step grew 7.5x as much as the data-parallel "
            "one (closed forms: ") in out and "expected" not in out
    assert "), TP's growth 4% from its closed form" in out
    assert "TP step +150.0 ms, DP step +20.0 ms (closed forms +144.0 ms and +18.0 ms)." in out
    assert "DP's growth is 111%" in details[0]
    assert "fp32 matrices) to 1.0e-07 (tolerance 1e-5)" in details[0]
    l10b.explain_tp(_tp_sweep(dp_hi=0.030), details=details)  # DP +10 ms against 18 ms
    assert "within this machine's noise on this run" in capsys.readouterr().out


def test_tp_fails_when_tp_grows_like_dp():
    with pytest.raises(AssertionError, match="not shown"):
        l10b.explain_tp(_tp_sweep(dp_hi=0.100), details=[])  # DP +80 ms: over 1/3 of TP's


def test_tp_asserts_the_all_reduce_counts():
    sweep = _tp_sweep()
    sweep[0]["tp_allreduces"] = 4
    with pytest.raises(AssertionError):
        l10b.explain_tp(sweep, details=[])


def _pipe_rows():
    rows = []
    for nic in ("calm", "rough"):
        for schedule in ("gpipe", "1f1b"):
            rows.append({"nic": nic, "schedule": schedule, "steps_kept_of": 7,
                         "activation_bytes": 10, "p2p_sent": [80, 160, 160, 80],
                         "bubble": 0.30, "bubble_formula": 0.27, "simulated_bubble": 0.28,
                         "step_s": 0.5, "simulated_step_s": 0.5, "ideal_step_s": 0.495})
    return rows


def _growth(gpipe, f1b):
    return {"gpipe": {"measured": np.array(gpipe), "replay": np.array([0.07, 0.08])},
            "1f1b": {"measured": np.array(f1b), "replay": np.array([0.15, 0.17])}}


def test_pipeline_verdict_from_the_least_grown_step(monkeypatch, capsys):
    monkeypatch.setattr(l10b.exp, "pipeline_growth",
                        lambda pipe, calm, rough: _growth([0.06, 0.07, 0.09], [0.10, 0.16]))
    monkeypatch.setattr(l10b, "replay_split", lambda pipe, calm, rough: {
        "gpipe": {"delay": 0.0594, "drift": -0.0062}, "1f1b": {"delay": 0.1584, "drift": 0.002}})
    rows = _pipe_rows()
    rows[0]["step_s"] = 0.52  # calm GPipe: 20 ms of this machine's overhead over its replay
    details = []
    assert l10b.explain_pipeline(rows, calm="calm", rough="rough", details=details)
    out = capsys.readouterr().out
    assert "grew by 70.0 ms (GPipe) and 130.0 ms (1F1B), medians of 7 steps: 1F1B paid more." in out
    # r20: the replay's delay-alone growth in ms is the appendix's; the main output gives hops
    assert "the delay alone, without its jitter, adds 59.4 ms (GPipe) and 158.4 ms (1F1B)" in \
        details[0] and "59.4 ms" not in out
    assert "below the replay's mean" not in out and "jitter adds" not in out
    assert "Bubble on the calm network: GPipe 30%, 1F1B 30% (formula 27%)." in out
    # GPipe's median 70 ms inside the replay's 70 to 80 ms; 1F1B's 130 ms below 150 ms.
    assert "gpipe measured median 70.0 ms (range 60.0 ms to 90.0 ms, 7 steps), inside" in \
        details[0]
    assert "1f1b  measured median 130.0 ms (range 100.0 ms to 160.0 ms, 7 steps), below" in \
        details[0]
    assert "gpipe mean 75.0 ms = delay 59.4 ms + jitter 21.8 ms + drift -6.2 ms" in details[0]
    assert "1f1b  mean 160.0 ms = delay 158.4 ms + jitter -0.4 ms + drift 2.0 ms" in details[0]
    # One 1F1B step grew less than GPipe's median: not shown, and on a quiet machine a failure.
    monkeypatch.setattr(l10b.exp, "pipeline_growth",
                        lambda pipe, calm, rough: _growth([0.06, 0.07, 0.09], [0.065, 0.16]))
    with pytest.raises(AssertionError):
        l10b.explain_pipeline(_pipe_rows(), calm="calm", rough="rough", details=[])


def test_replay_without_jitter_counts_the_hops():
    from clusterlab import parallelism as par

    assert l10b.without_jitter("delay 10ms 5ms") == "delay 10ms"
    rows = []
    for nic, forward in (("delay 100us", 0.016), ("delay 10ms 5ms", 0.015)):
        for schedule in par.PIPELINE_SCHEDULES:
            own = par.simulate_pipeline(schedule, stages=4, microbatches=8, forward_s=forward,
                                        backward_s=0.030, nic=nic, activation_bytes=4096)
            rows.append({"nic": nic, "schedule": schedule, "ops": [[None] * 16] * 4,
                         "forward_took_s": forward, "backward_took_s": 0.030,
                         "activation_bytes": 4096, "simulated_step_s": own.step_s})
    split = l10b.replay_split(rows, "delay 100us", "delay 10ms 5ms")
    # 2(p-1) = 6 hops for GPipe, 2(p-1)m/p + 2(p-2) = 16 for 1F1B, each 9.9 ms longer, with
    # the same operation times; the calm run's forwards 1 ms slower: 11 slots 1 ms shorter.
    assert split["gpipe"]["delay"] == pytest.approx(6 * 0.0099)
    assert split["1f1b"]["delay"] == pytest.approx(16 * 0.0099)
    assert split["gpipe"]["drift"] == pytest.approx(-0.011)
    assert split["1f1b"]["drift"] == pytest.approx(-0.011)


def test_pipeline_asserts_the_replay_floor(monkeypatch):
    monkeypatch.setattr(l10b.exp, "pipeline_growth",
                        lambda pipe, calm, rough: _growth([0.06], [0.16]))
    rows = _pipe_rows()
    rows[3]["step_s"] = 0.4  # 0.8 of its replay: faster than the network allows
    with pytest.raises(AssertionError):
        l10b.explain_pipeline(rows, calm="calm", rough="rough", details=[])


def _moe_row(share, step, predicted, dispatch, combine, tokens):
    p = {"sent_hot": 100, "received_hot": 300, "sent_other": 50, "received_other": 50}
    return {"hot_share": share, "step_s": step, "predicted_step_s": predicted,
            "predicted_dispatch_s": dispatch, "predicted_combine_s": combine,
            "predicted": p, "sent": [100, 100, 100, 400], "hot_tokens": tokens,
            "repeats_kept_of": 5,
            "hot_phases": {"a": 0.01}, "hot_step_s": step, "best_step_s": step}


def test_incast_charges_the_hot_ranks_receiving_link():
    hot = _moe_row(0.75, 0.1, 0.080, 0.010, 0.044, 288)
    assert l10b.incast_step_s(hot) == pytest.approx(0.080 + 0.034)
    assert l10b.incast_step_s(_moe_row(0.75, 0.1, 0.080, 0.050, 0.044, 288)) == 0.080


def test_moe_verdict_and_busy_evidence(capsys):
    bal = _moe_row(0.25, 0.030, 0.028, 0.015, 0.015, 96)
    hot = _moe_row(0.75, 0.090, 0.080, 0.010, 0.044, 288)
    details = []
    assert l10b.explain_moe([bal, hot], details=details) is True
    out = capsys.readouterr().out
    assert "computed 288 tokens instead of 96" in out
    # r21: the incast lines split in two sentences
    assert "Behind a real switch the hot rank's receiving link would take" in out
    assert "By the closed form the layer would be at least 4.1x the balanced one, not 2.9x" in out
    assert "the layer took 3.0x as long as balanced." in out and "fastest of 5 repeats" in out
    assert details[0].startswith("MoE: 0 of 2 layers") and "add about 34.0 ms" in details[0]
    slow_bal = _moe_row(0.25, 0.070, 0.028, 0.015, 0.015, 96)  # 2.5x its closed form
    assert l10b.explain_moe([slow_bal, hot], details=[]) is False
    assert "1 of 2 layers over 25% above the closed form" in capsys.readouterr().out
    with pytest.raises(AssertionError):
        l10b.explain_moe([_moe_row(0.25, 0.070, 0.068, 0.015, 0.015, 96), hot], details=[])


def test_moe_scaling_numbers():
    assert l10b.inter_node_share(32, 8) == pytest.approx(24 / 31)
    assert l10b.bytes_per_peer(33, 64.0) == 2.0
    assert l10b.rdma_peers(256, 8) == 31 and l10b.rdma_peers(32, 8) == 3


# --- 11: compressing communication -------------------------------------------------------

def test_ms_whole_milliseconds():
    assert l11.ms(0.0123) == "12 ms" and l11.ms(0.0127) == "13 ms"


class FakeStats:
    """The parts of compression.SweepStats the lesson reads, from a table of verdicts."""

    def __init__(self, verdicts, *, rates=(25, 1600), band=0.004, step=None, extra=0.002,
                 crossing=(None, None, False), breakeven=(100.0, 200.0, 300.0)):
        self.verdicts, self.rates = verdicts, list(rates)
        self.slow, self.fast = self.rates[0], self.rates[-1]
        self._band, self._extra, self._crossing, self._be = band, extra, crossing, breakeven
        self._step = step or {}

    def verdict(self, m, q):
        return self.verdicts[m, q]

    def band(self, m):
        return self._band

    def step(self, m, q):
        return self._step.get((m, q), 0.05)

    def speedup(self, m, q):
        return 2.0

    def gain(self, m, q):
        return 0.0015

    def extra_s(self, m):
        return self._extra

    def crossing(self, m):
        return self._crossing

    def breakeven_mbit(self, m, p, delay_s):
        return self._be


def test_inside_band_names_the_rates_or_nothing():
    st = FakeStats({})
    assert l11.inside_band(st, "fp16", [25, 60]) == (
        "fp16 against fp32 at 25, 60 Mbit/s is inside this run's noise band of 4 ms")
    assert l11.inside_band(st, "fp16", []) is None


def test_sweep_verdict(capsys):
    methods = ("none", "fp16", "topk:0.01")
    ok = {(m, q): "faster" for m in methods for q in (25, 1600)}
    steps = {("none", 25): 0.170, ("topk:0.01", 25): 0.020}
    assert l11.explain_sweep(FakeStats(ok, step=steps), methods) is True
    out = capsys.readouterr().out
    # fp32's step over the method's, with the step plus or minus the 4 ms band: 170/24, 170/16
    assert "topk:0.01  4.0 ms |  20 ms  8.5x (7.1 to 11)" in out
    assert "fp16  4.0 ms |  50 ms  3.4x (3.1 to 3.7)" in out
    assert "Shown on this run: every compressed method beat fp32 DDP at 25 Mbit/s." in out
    assert "|  50 ms   +1.5 ms  borderline faster" in out  # 1.5 ms: within twice the band
    assert "|        50 ms  borderline faster" in out
    assert "dashed line than" not in out  # no table of predictions: nothing to say
    assert "Shown:" not in out.replace("Shown on this run:", "")
    unclear = {**ok, ("fp16", 25): "cannot tell"}
    assert l11.explain_sweep(FakeStats(unclear), methods) is False
    assert "fp16 against fp32 at 25 Mbit/s is inside" in capsys.readouterr().out
    with pytest.raises(AssertionError):
        l11.explain_sweep(FakeStats({**ok, ("fp16", 25): "slower"}), methods)


def test_sweep_names_dots_off_their_line_beyond_the_band(capsys):
    methods = ("none", "topk:0.01")
    st = FakeStats({(m, q): "faster" for m in methods for q in (25, 1600)})
    st.table = {(m, q): {"predicted_step_s": 0.05} for m in methods for q in (25, 1600)}
    st._step = {("topk:0.01", 25): 0.058}  # 8 ms above its line, the band 4 ms
    l11.explain_sweep(st, methods)
    assert "1 of 4 dots sit further from their dashed line than their method's noise band: " \
           "topk:0.01 at 25 Mbit/s. This run does not isolate why" in capsys.readouterr().out


def test_meter_overhead_is_set_against_powersgds_fitted_extra_time(capsys):
    median = l11.explain_meter_overhead(FakeStats({}, extra=0.004), starts=20)
    out = capsys.readouterr().out
    assert 0 < median < 0.1 and "(20 tries, this process)" in out
    assert "of its fitted t_extra (4.0 ms)." in out


def test_breakeven_verdicts_and_what_decides(capsys):
    rates = (25, 100, 1600)
    verdicts = {("powersgd:1", 25): "faster", ("powersgd:1", 100): "cannot tell",
                ("powersgd:1", 1600): "slower"}
    st = FakeStats(verdicts, rates=rates, crossing=(100, 1600, False), extra=0.002, band=0.003)
    assert l11.explain_breakeven(st, ("powersgd:1",)) is True
    out = capsys.readouterr().out
    assert "counts only beyond the method's noise band: powersgd:1 3.0 ms." in out
    assert "    100       1.5 ms       cannot tell" in out
    assert "Break-even, predicted (± noise band) and measured: powersgd:1 200 (100 to 300), " \
           "measured between 100 and 1600 Mbit/s." in out
    assert out.count("Shown on this run:") == 1 and "verdicts differ" not in out
    # Two extra all-reduces on 4 ranks at 2 ms: 2 x 6 delays = 24 ms > 2 + 3 ms.
    assert "wait 24 ms of delays per step" in out and "here, the rounds decide." in out
    st = FakeStats(verdicts, rates=rates, crossing=(100, 1600, False), extra=0.020, band=0.010)
    l11.explain_breakeven(st, ("powersgd:1",))
    assert "this run cannot tell which of the two decides." in capsys.readouterr().out


def test_breakeven_says_where_the_ranks_differ_and_by_what_margin(capsys):
    rates = (25, 130, 1600)
    methods = ("powersgd:1", "powersgd:4")
    verdicts = {(m, q): v for m in methods for q, v in zip(rates, ("faster", "x", "slower"))}
    verdicts["powersgd:1", 130], verdicts["powersgd:4", 130] = "cannot tell", "slower"
    st = FakeStats(verdicts, rates=rates, crossing=(25, 130, False), band=0.0059)
    gains = {("powersgd:1", 130): 0.0005, ("powersgd:4", 130): -0.0060}
    st.gain = lambda m, q: gains.get((m, q), 0.1 if q == 25 else -0.1)
    st._step = {("powersgd:4", 130): 0.056}  # its dot 6 ms above its dashed line (0.05)
    st.table = {(m, q): {"predicted_step_s": 0.05} for m in ("none", *methods) for q in rates}
    assert l11.explain_breakeven(st, methods) is True
    out = capsys.readouterr().out
    assert "At 130 Mbit/s the verdicts differ. powersgd:1: gain +0.5 ms, predicted +0.0 ms, " \
           "its dot 0.0 ms below its dashed line; powersgd:4: gain -6.0 ms, predicted +0.0 ms, " \
           "its dot 6.0 ms above its dashed line." in out
    assert "The model predicts 'cannot tell' for both: the difference rests on powersgd:4's " \
           "one point off its line" in out and "both cross between 25 and 130 Mbit/s." in out
    assert "Shown on this run: powersgd:1 and powersgd:4 paid at the low rates" in out
    st.table["powersgd:1", 130] = {"predicted_step_s": 0.049}  # the model: +1 ms, inside
    st.table["powersgd:4", 130] = {"predicted_step_s": 0.06}  # the model: powersgd:4 loses
    l11.explain_differing(st, methods, 130)
    assert "The model predicts different verdicts here too (powersgd:1 cannot tell, " \
           "powersgd:4 loses): its break-evens fall on either side of 130 Mbit/s, so the " \
           "ranks cross at different rates." in capsys.readouterr().out


def test_differing_verdicts_on_the_same_side_of_break_even_are_the_bands(capsys):
    """The r16 case: at 100 Mbit/s both ranks are predicted to pay (+6.7, +6.0 ms); only
    powersgd:1's wider band makes it 'cannot tell'. Not 'the ranks cross at different rates'."""
    methods = ("powersgd:1", "powersgd:4")
    verdicts = {("powersgd:1", 100): "cannot tell", ("powersgd:4", 100): "faster"}
    st = FakeStats(verdicts, rates=(100,))
    bands = {"powersgd:1": 0.00674, "powersgd:4": 0.0037}
    st.band = bands.get
    gains = {"powersgd:1": 0.0063, "powersgd:4": 0.0052}
    st.gain = lambda m, q: gains[m]
    st.table = {("none", 100): {"predicted_step_s": 0.05},
                ("powersgd:1", 100): {"predicted_step_s": 0.05 - 0.00666},
                ("powersgd:4", 100): {"predicted_step_s": 0.044}}
    st._step = {("powersgd:1", 100): 0.0434, ("powersgd:4", 100): 0.0439}
    l11.explain_differing(st, methods, 100)
    out = capsys.readouterr().out
    assert "At 100 Mbit/s the verdicts differ. powersgd:1: gain +6.3 ms, predicted +6.7 ms" in out
    assert "different verdicts here too" not in out and "different rates" not in out
    assert "The model predicts that both pay: neither has reached its break-even (+6.7 ms, " \
           "+6.0 ms). powersgd:1 reads 'cannot tell' only because its noise band is wider " \
           "(powersgd:1 6.7 ms, powersgd:4 3.7 ms): the verdicts differ by the bands, not by " \
           "where the ranks cross." in out
    # Equal bands, powersgd:4 nearer its break-even: its gain, not its band, is the reason.
    bands["powersgd:1"] = bands["powersgd:4"] = 0.0064
    verdicts["powersgd:1", 100], verdicts["powersgd:4", 100] = "faster", "cannot tell"
    l11.explain_differing(st, methods, 100)
    out = capsys.readouterr().out
    assert "powersgd:4 reads 'cannot tell' because its predicted gain is inside its noise " \
           "band (powersgd:1 6.4 ms, powersgd:4 6.4 ms): the verdicts differ by how near " \
           "each is to its break-even, not by which side it is on." in out
    # Both predicted to lose, and the measured verdicts differ otherwise than predicted.
    for m, t in (("powersgd:1", 0.0567), ("powersgd:4", 0.0560)):
        st.table[m, 100] = {"predicted_step_s": t}
    verdicts["powersgd:1", 100], verdicts["powersgd:4", 100] = "cannot tell", "slower"
    st._step = {("powersgd:1", 100): 0.050, ("powersgd:4", 100): 0.0562}
    l11.explain_differing(st, methods, 100)
    out = capsys.readouterr().out
    assert "both lose: both are past their break-evens (-6.7 ms, -6.0 ms). powersgd:4 reads " \
           "'cannot tell' because its predicted gain" in out
    assert "; the measured verdicts differ otherwise, by powersgd:1's one point off its " \
           "line (one run per rate)." in out


def test_breakeven_not_shown_when_the_fastest_link_is_inside_the_band(capsys):
    verdicts = {("powersgd:1", 25): "faster", ("powersgd:1", 1600): "cannot tell"}
    assert l11.explain_breakeven(FakeStats(verdicts), ("powersgd:1",)) is False
    out = capsys.readouterr().out
    assert "Not shown on this run:" in out
    assert "powersgd:1 against fp32 at 1600 Mbit/s is inside this run's noise band" in out


def test_breakeven_fails_when_compression_still_pays_on_the_fastest_link():
    verdicts = {("powersgd:1", 25): "faster", ("powersgd:1", 1600): "faster"}
    with pytest.raises(AssertionError, match="lost at the high ones up to the fastest"):
        l11.explain_breakeven(FakeStats(verdicts), ("powersgd:1",))


def test_ratio_range_and_calls_text():
    st = FakeStats({}, step={("none", 25): 0.170, ("topk:0.01", 25): 0.003})
    assert l11.ratio_range(st, "topk:0.01", 25) == "57x (24 or more)"  # band above the step
    from clusterlab.experiments import compression

    assert l11.calls_text("powersgd:1", compression.predicted_calls("powersgd:1", 4)) == (
        "allreduce of vectors 2088 B, allreduce of P 2088 B, allreduce of Q 2176 B  "
        "(total 6352 B)")
    assert l11.calls_text("none", [("allreduce", 8)]) == "allreduce of 8 B  (total 8 B)"


def test_bucket_interpolation_is_log_log():
    sizes, be = [2**20, 2**30], [1.0, 1024.0]  # proportional
    assert l11.at_bucket(be, sizes, 32) == pytest.approx(32.0)
    assert l11.bytes_at_rate(be, sizes, 4.0) == pytest.approx(4 * 2**20)


def test_sig2_two_significant_figures_without_exponent():
    assert [l11.sig2(x) for x in (1716.0, 163.0, 1.88, 6.1e4)] == ["1700", "160", "1.9", "61000"]


def test_breakeven_box_gives_ring_and_tree_as_a_pair(monkeypatch):
    from clusterlab import facts

    shown = []
    monkeypatch.setattr(facts, "show", lambda text: shown.append(facts.render(text)))
    scan = l11.breakeven_by_size([256, 1024, 4096, 16384], ranks=64, latency_s=10e-6)
    l11.show_breakeven_at_scale(scan, n_params=76810)
    text = " ".join(shown[0].split())
    # 25 MiB bucket: ring ~163, tree ~1716 Gb/s (126 against 12 extra rounds), either side
    # of a 400 Gb/s NIC: the 2 x 2 table.
    assert "| flat ring | 2(p−1) = 126 | 160 Gb/s | PowerSGD loses |" in text
    # The compute PowerSGD may add on the tree and still pay on one 400 Gb/s NIC:
    # 24 extra delays x 10 us x (1716 / 400 - 1) = 0.79 ms.
    assert ("| idealised tree | 2 lg p = 12 | 1700 Gb/s | PowerSGD pays while its compute "
            "per bucket < 0.79 ms |") in text
    # A bucket of gradients smaller than the cap closes below twice it: twice the break-even.
    assert "A bucket at twice the cap breaks even near 330 to 3400 Gb/s" in text
    assert "cap plus one gradient" in text
    assert ("A tree waits 12 delays per all-reduce instead of 126, so PowerSGD's two extra "
            "all-reduces cost 240 µs instead of 2.5 ms and its break-even rises 10.5x.") in text
    assert "- The bytes saved grow with the bucket, the added rounds do not:" in text
    # NCCL's tree at 64 ranks, 8 per node: up and down 7 + 3 hops, 6 of them across nodes.
    assert "about 2 × 10 = 20 hops, 6 of them across nodes" in text
    assert "the 14 hops inside nodes cost less than the 6 across them" in text
    assert "whether PowerSGD rank 1 beats fp32 on one fast NIC depends on how many message " \
           "delays an all-reduce pays: counted as a flat ring, no; as an idealised tree, it " \
           "can, if its compute per bucket stays under about 0.79 ms." in text
    assert "because of the compute compression adds" in text and "[[" not in text


def test_least_compression_rate_of_the_notebooks_mlp():
    # 32 -> 256 -> 256 -> 10: the 10 x 256 output matrix compresses least at rank 4.
    assert l11.least_compression_rate(4) == pytest.approx(10 * 256 / (4 * 266))


def test_prediction_errors(capsys):
    rows = [{"method": "none", "rate_mbit": 25, "step_s": 0.10, "predicted_step_s": 0.11},
            {"method": "fp16", "rate_mbit": 25, "step_s": 0.050, "predicted_step_s": 0.070}]
    st = FakeStats({}, step={("none", 1600): 0.05})
    st.rows = rows
    st.table = {("fp16", 25): {"compute_s": 0.01, "predicted_comm_s": 0.048}}
    st.prediction_errors = lambda: np.array([0.1, 0.2])
    assert l11.explain_prediction_errors(st) is True
    out = capsys.readouterr().out
    assert "within a median 15% of the 2 (method, rate) points (largest 20%, fp16 at 25" in out
    assert "with a median error of 15% (the check: under 30%)" in out
    assert "That point is 20 ms *below* the model" in out
    assert "The step is still above its exchange's closed form (48 ms)." in out
    st.prediction_errors = lambda: np.array([0.4, 0.5])
    with pytest.raises(AssertionError):
        l11.explain_prediction_errors(st)
    st._band = 0.02  # fp32's noise band alone over 30% of its fastest step: busy
    assert l11.explain_prediction_errors(st) is False


def test_gains_table_words(capsys):
    verdicts = {("powersgd:1", 25): "faster", ("powersgd:1", 1600): "slower"}
    l11.print_gains(FakeStats(verdicts, band=0.0005), ("powersgd:1",))
    out = capsys.readouterr().out
    assert "1.5 ms" + " " * 14 + "pays" in out and "1.5 ms" + " " * 13 + "loses" in out
    assert "noise band: powersgd:1 0.5 ms." in out
    # A gain beyond the band but within twice it: borderline, as in the sweep's verdicts.
    l11.print_gains(FakeStats(verdicts, band=0.001), ("powersgd:1",))
    out = capsys.readouterr().out
    assert "1.5 ms   borderline pays" in out and "1.5 ms  borderline loses" in out
    assert "(borderline: beyond the noise band, but within twice it)" in out


# --- 11b: error feedback and accuracy ----------------------------------------------------

def test_smooth_and_steps_to():
    assert np.allclose(l11b.smooth(np.arange(12.0)), [4.5, 5.5, 6.5])
    curve = np.r_[np.full(15, 2.0), np.full(20, 0.0)]
    # The first 10-step window with mean <= 1.0 is steps 10..19 (five 2s, five 0s): index 10.
    assert l11b.steps_to(curve, 1.0) == 20
    assert l11b.steps_to(curve, -1.0) is None


def _run(loss, sent=1000, curve=None):
    return {"test_loss": loss, "sent_bytes": sent, "loss_curve": curve}


def test_error_feedback_steps_and_asserts(capsys):
    fast = np.r_[np.full(30, 2.0), np.full(100, 0.0)]
    slow = np.r_[np.full(100, 2.0), np.full(100, 0.0)]
    falling = np.linspace(1.0, 0.0, 120)  # fp32's training loss over the budget
    ef_runs = {"none": _run(0.3, curve=falling), "topk:0.01": _run(0.35),
               "topk-noef:0.01": _run(0.6)}
    longer = {"topk:0.01": _run(0.3, curve=fast), "topk-noef:0.01": _run(0.5, curve=slow)}
    assert l11b.explain_error_feedback(ef_runs, longer, target=0.0, budget=120) == (40, 110)
    out = capsys.readouterr().out
    assert "top-k with error feedback 40, without 110." in out
    assert "fp32's training loss was still falling at the end of the budget" in out
    ef_runs["topk-noef:0.01"] = _run(0.4)  # no clear test-loss gap: error feedback not shown
    with pytest.raises(AssertionError, match="error feedback"):
        l11b.explain_error_feedback(ef_runs, longer, target=0.0, budget=120)


def _res():
    base = np.array([1, 1, 1, 0, 0, 1, 1, 0], dtype=bool)
    return {"none": {"correct": base, "accuracy": 5 / 8, "sent_bytes": 300, "test_loss": 0.5},
            "fp16": {"correct": base.copy(), "accuracy": 5 / 8, "sent_bytes": 150,
                     "test_loss": 0.501},
            "bf16": {"correct": base.copy(), "accuracy": 5 / 8, "sent_bytes": 150,
                     "test_loss": 0.499},
            "topk:0.01": {"correct": np.array([1, 1, 1, 1, 1, 0, 1, 0], dtype=bool),
                          "accuracy": 6 / 8, "sent_bytes": 50, "test_loss": 0.55}}


def test_paired_accuracy_difference():
    res = _res()
    assert l11b.only(res, "topk:0.01") == (2, 1)
    assert l11b.accuracy_gap_se(res, "fp16") == 0.0
    d = np.array([0, 0, 0, 1, 1, -1, 0, 0], dtype=float)
    expected = d.mean() / (d.std(ddof=1) / np.sqrt(8))
    assert l11b.accuracy_gap_se(res, "topk:0.01") == pytest.approx(expected)


def test_accuracy_table_and_checks(capsys):
    res = _res()
    gap = {m: r["test_loss"] - 0.5 for m, r in res.items()}
    l11b.print_accuracy_table(res, gap=gap, n_test=8)
    out = capsys.readouterr().out
    assert "fp32 (none)" in out and "2 / 1" in out and "+0.050" in out
    assert "s.e." not in out.split("\n")[4] and "n/a" in out.split("\n")[4]  # 3 discordant
    assert "n/a: fewer than 10 samples" in out and "Worked example" not in out
    many = {**res, "topk:0.01": {**res["topk:0.01"],
                                 "correct": np.r_[np.ones(20, bool), np.zeros(4, bool)]},
            "none": {**res["none"], "correct": np.r_[np.zeros(16, bool), np.ones(8, bool)]}}
    many = {m: many[m] for m in ("none", "topk:0.01")}
    l11b.print_accuracy_table(many, gap=gap, n_test=24)
    out = capsys.readouterr().out
    assert "Worked example, topk:0.01: c = 16 samples right only here, b = 4 only under fp32: " \
           "(c - b) / sqrt(b + c) = (16 - 4) / sqrt(20) = +2.7 s.e." in out
    assert "n/a" not in out
    l11b.check_accuracy(res, gap=gap, n_test=8, budget=120)
    assert "with the same answer on 8 and 8 of 8 samples" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="16-bit"):
        l11b.check_accuracy(res, gap={**gap, "bf16": 0.02}, n_test=8, budget=120)
    with pytest.raises(AssertionError, match="top-k"):
        l11b.check_accuracy(res, gap={**gap, "topk:0.01": 0.2}, n_test=8, budget=120)


def test_ring_sum_error_grows_with_hops_in_16_bits():
    torch = pytest.importorskip("torch")
    assert l11b.ring_sum_error(64, torch.float64) < 1e-12
    short, long = (l11b.ring_sum_error(p, torch.bfloat16) for p in (2, 1024))
    assert long > 10 * short and long > 1000 * l11b.ring_sum_error(1024, torch.float32)


def test_ring_errors_assert_the_growth(capsys):
    torch = pytest.importorskip("torch")
    ps = [2, 8]
    flat = {torch.float32: [1e-8, 1e-8], torch.bfloat16: [1e-3, 2e-3]}  # bf16 grew only 2x
    with pytest.raises(AssertionError):
        l11b.explain_ring_errors(flat, ps)
    grown = {torch.float32: [1e-8, 1e-8], torch.bfloat16: [1e-3, 2e-2]}
    corr = l11b.explain_ring_errors(grown, ps)
    out = capsys.readouterr().out
    assert "an error of 2.0% of the sum's norm" in out and "after 7 hops" in out
    assert corr == pytest.approx(l11b.ring_sum_error(8, torch.bfloat16, common=1.0))


def test_modules_import_without_a_cluster():
    assert isinstance(l10, types.ModuleType) and l11.WORD["faster"] == "pays"


def test_real_cluster_boxes_render_from_the_ledger():
    from clusterlab import facts

    text = facts.render(l10b.real_cluster_text(one_nv=0.001, hot_share=0.75,
                                               capacity_factor=1.25))
    assert "[[" not in text and "at a capacity\n  factor of 1.25" in text
    assert "[[" not in facts.render(l11.real_cluster_text())
    assert "still shrinks 2.4x at rank 4" in l11.real_cluster_text()
