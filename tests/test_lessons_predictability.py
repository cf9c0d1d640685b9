"""The lesson modules of notebooks 04b, 04c and 05: each verdict, classification and formatted
number on small synthetic runs (no processes, no absolute times)."""

from __future__ import annotations

import numpy as np
import pytest

from clusterlab import models
from clusterlab.lessons import predictability_and_mitigations as pm
from clusterlab.lessons import stragglers_and_staleness as ss
from clusterlab.lessons import time_to_train as tt


@pytest.fixture
def said(monkeypatch):
    """The Markdown sentences the lesson modules would display, captured."""
    out: list[str] = []
    for module in (pm, tt):
        monkeypatch.setattr(module, "say", out.append)
    return out


# --- 04b: predictability ----------------------------------------------------------------------


def ci(est, lo, hi):
    return (est, lo, hi)


def test_moved_more_needs_the_tail_shift_to_beat_the_median_shift_at_the_interval_ends():
    calm = {"p50": ci(10, 9, 11), "p90": ci(20, 19, 21)}
    apart = {"p50": ci(11, 10, 12), "p90": ci(30, 29, 31)}     # p90 moved >= 8, p50 <= 3
    close = {"p50": ci(14, 12, 16), "p90": ci(24, 22, 26)}     # p90 >= 1, p50 <= 7
    assert pm.moved_more(calm, apart, "p90", "p50")
    assert not pm.moved_more(calm, close, "p90", "p50")
    assert pm.q({"ci": apart}, "p90") == 30


def test_ci_text_and_ms_format_an_estimate_with_its_interval():
    assert pm.ci_text((0.01, 0.009, 0.0125)) == "10.0 ms [9.0 ms, 12.5 ms]"


def _pred(rough_p90_lo):
    """Two networks on 4 real ranks, simulated on 4 and 16 nodes."""
    def real(p50, p90):
        return {"steps": 60, "step_times": np.array([0.02, 0.03]), "ci": {"p50": p50, "p90": p90}}

    def sim(nodes, p50, p99):
        return {"nodes": nodes, "steps": 400,
                "ci": {"p50": ci(p50, p50 - 1e-4, p50 + 1e-4),
                       "p99": ci(p99, p99 - 1e-4, p99 + 1e-4)}}

    return {"real": {"calm": real(ci(0.020, 0.019, 0.021), ci(0.025, 0.024, 0.026)),
                     "rough": real(ci(0.023, 0.022, 0.024), ci(0.035, rough_p90_lo, 0.036))},
            "sim": {"calm": [sim(4, 0.020, 0.021), sim(16, 0.030, 0.031)],
                    "rough": [sim(4, 0.022, 0.033), sim(16, 0.040, 0.050)]}}


def test_predictability_sentence_says_whether_the_intervals_resolve_the_p90():
    resolved = pm.predictability_sentence(_pred(0.034), calm_nic="calm", rough_nic="rough")
    assert "The p90 moved more, by the 95 % intervals (which treat the steps as independent" \
        in resolved
    assert "from 20.0 ms to 23.0 ms and the p90 from 25.0 ms to 35.0 ms" in resolved
    # 4 nodes: 33/22 = 1.50, 16 nodes: 50/40 = 1.25; p99 - p50 from 11.0 ms to 10.0 ms
    assert "p99 / p50 = 1.50 on 4 nodes and 1.25 on 16" in resolved
    # the p90's shift at least 0.0275 - 0.026 = 1.5 ms, the median's at most 0.024 - 0.019 = 5 ms
    open_ = pm.predictability_sentence(_pred(0.0275), calm_nic="calm", rough_nic="rough")
    assert "60 steps cannot tell" in open_
    assert "at least 1.5 ms" in open_ and "at most 5.0 ms" in open_


def test_explain_predictability_checks_that_the_tail_spreads_less_relatively_more_absolutely(
        said, capsys):
    pred = _pred(0.034)
    pred["sim"]["rough"][1] = {"nodes": 16, "steps": 400,
                               "ci": {"p50": ci(0.040, 0.0399, 0.0401),
                                      "p99": ci(0.055, 0.0549, 0.0551)}}
    pm.explain_predictability(pred, calm_nic="calm", rough_nic="rough")
    assert said and "Shown on this run: at the same mean delay" in capsys.readouterr().out
    pred["sim"]["rough"][1]["ci"]["p99"] = ci(0.070, 0.0699, 0.0701)   # relatively MORE spread
    with pytest.raises(AssertionError):
        pm.explain_predictability(pred, calm_nic="calm", rough_nic="rough")



def test_chains_or_coupled_couples_the_ranks_only_in_the_coupled_rule():
    # no jitter: both rules give compute + 2(N-1) x delay exactly
    flat = pm.chains_or_coupled("delay 1ms", 8, compute_s=0.02, draws=4)
    assert flat["chains_s"] == pytest.approx(0.02 + 14e-3)
    assert flat["coupled_s"] == pytest.approx(0.02 + 14e-3)
    # heavy jitter on many rounds: waiting also for the rank's own previous round costs more
    rough = pm.chains_or_coupled("delay 8ms 9ms distribution pareto", 64, compute_s=0.02,
                                 draws=20)
    assert rough["coupled_s"] > 1.2 * rough["chains_s"]


def test_predictability_sentence_names_the_coupling_only_when_given():
    pred = _pred(0.034)
    plain = pm.predictability_sentence(pred, calm_nic="calm", rough_nic="rough")
    assert "No run here separates why (a hypothesis" in plain
    shown = pm.predictability_sentence(
        pred, calm_nic="calm", rough_nic="rough",
        coupling={"nodes": 16, "draws": 200, "chains_s": 0.033, "coupled_s": 0.039})
    # over the simulator's calm median on 16 nodes, 0.030 s
    assert "independent chains of 30 hops give ×1.10 on 16 nodes" in shown
    assert "as the simulator does, gives ×1.30" in shown
    assert "hypothesis" not in shown

# --- 04b: mitigations and hierarchy -----------------------------------------------------------


def _mit():
    names = ("baseline", "overlap", "bigger buckets", "fewer syncs")
    caps = (0.25, 0.25, 25.0, 25.0)
    real = {n: {"bucket_cap_mb": c, "bucket_sizes": [1] * (8 if c < 1 else 1)}
            for n, c in zip(names, caps)}
    eff = {"baseline": 0.01, "overlap": 0.0105, "bigger buckets": 0.06, "fewer syncs": 0.12,
           "ring, 8 per node": 0.05, "hierarchical": 0.055}
    sim = {k: [{"nodes": 4, "efficiency": 0.9}, {"nodes": 1024, "efficiency": e}]
           for k, e in eff.items()}
    buckets = {n: [1] * len(real[n]["bucket_sizes"]) for n in names}
    return {"real": real, "sim": sim,
            "config": {"accumulate": 4, "sim_buckets": buckets, "nic": "delay 2ms"}}


def _gain(lever, gain, beats):
    return {"lever": lever, "gain": gain, "beats": beats, "resolved": beats >= 0.9,
            "worse": beats <= 0.1, "steps": (30, 30)}


def test_factor_at_scale_divides_each_lever_by_the_one_before_and_the_hierarchy_by_its_ring():
    factor = pm.factor_at_scale(_mit())
    assert factor["overlap"] == pytest.approx(1.05)
    assert factor["bigger buckets"] == pytest.approx(0.06 / 0.0105)
    assert factor["fewer syncs"] == pytest.approx(2.0)
    assert factor["hierarchical"] == pytest.approx(1.1)


def test_verdict_names_resolved_slower_or_within_noise():
    assert pm.verdict(_gain("x", 0.5, 0.95)) == "resolved"
    assert pm.verdict(_gain("x", -0.2, 0.05)) == "slower"
    assert pm.verdict(_gain("x", 0.01, 0.5)) == "within noise"


def test_labels_read_the_caps_and_the_accumulation_from_the_run():
    labels = pm.labels(_mit())
    assert labels["baseline"] == "baseline\n(cap 0.25 MiB)"
    assert labels["bigger buckets"] == "+ bigger buckets\n(cap 25 MiB, no overlap left)"
    assert labels["fewer syncs"].startswith("+ fewer syncs\n(×4 batch")


def test_levers_sentence_marks_only_unresolved_levers_and_counts_the_buckets():
    mit = _mit()
    gains = {"overlap": _gain("overlap", 0.02, 0.5),
             "bigger buckets": _gain("bigger buckets", 3.0, 1.0),
             "fewer syncs": _gain("fewer syncs", 0.6, 0.97)}
    text = pm.levers_sentence(mit, gains, pm.factor_at_scale(mit))
    assert text.startswith("**Each lever over the one before it, measured on 4 ranks (30 steps "
                           "each):** overlap ×1.02 (within noise), bigger buckets ×4.00, fewer "
                           "syncs ×1.60; the unmarked ones *resolved* (faster than the one before "
                           "on at least 97% of step pairs; appendix 2). **Simulated")
    gains["overlap"] = _gain("overlap", 0.2, 0.95)
    assert "fewer syncs ×1.60, each *resolved* (faster than the one before on at least 95% of" in (
        pm.levers_sentence(mit, gains, pm.factor_at_scale(mit)))
    assert "overlap ×1.1, bigger buckets ×5.7, fewer syncs ×2.0" in text
    assert "fewer rounds: 8 buckets → 1, where fewer syncs cuts the rounds per sample by 4." in text
    # without the measured rank count, no measured-over-simulated line
    assert "Measured over simulated" not in text


def test_levers_sentence_puts_the_measured_beside_the_simulated_at_the_measured_count():
    mit = _mit()
    mit["config"].update(nodes=4, compute_s=0.03)
    for name, rate, step in (("baseline", 400, 0.08), ("overlap", 500, 0.064),
                             ("bigger buckets", 800, 0.04), ("fewer syncs", 1000, 0.128)):
        mit["real"][name].update(samples_per_s_per_rank=rate, step_s=step)
    gains = {k: _gain(k, 0.2, 1.0) for k in ("overlap", "bigger buckets", "fewer syncs")}
    text = pm.levers_sentence(mit, gains, pm.factor_at_scale(mit))
    assert "each *resolved* (faster than the one before on every pair of steps" in text
    # baseline: 0.03 / 0.08 = 0.375 measured over 0.9 simulated at 4 ranks
    assert ("Measured over simulated efficiency at 4 ranks: baseline ×0.42, overlap ×0.52, "
            "bigger buckets ×0.83, fewer syncs ×1.04") in text


def test_hierarchy_sentence_tabulates_the_hops_and_folds_nccls_constants_as_a_what_if():
    mit = _mit()
    mit["config"].update(hier_nodes=2, hier_ppn=2, hier_intra="delay 50us",
                         hier_nic="delay 20ms")
    mit["sim"]["hierarchical"] = [{"nodes": 1024, "efficiency": 0.055}]
    mit["hierarchical"] = {a: {"emulated_s": e, "comm_s": c, "steps": 12,
                               "comm_per_step_s": [c - 0.001, c + 0.001]}
                           for a, e, c in (("ring", 0.0601, 0.0612),
                                           ("hierarchical", 0.0401, 0.0408))}
    one = {("delay 50us", "ring"): 0.602, ("delay 50us", "hierarchical"): 0.508,
           ("delay 1us", "ring"): 0.514, ("delay 1us", "hierarchical"): 0.508}
    text = pm.hierarchy_sentence(mit, one, pm.factor_at_scale(mit), fast_in="delay 1us")
    assert text.startswith("**Simulated at 1024 ranks (128 nodes × 8) the hierarchy gains ×1.10 "
                           "in training throughput with `delay 50us` inside a node (one "
                           "all-reduce alone: ×")
    assert "table), and almost nothing with `delay 1us`" in text
    # 2(R - 1) = 2046 hops: 256 cross the network, 1790 stay inside; the hierarchy's binomial
    # reduce and broadcast inside a node of 8 take 3 + 3
    assert "| flat ring | 256 | 1790 | 0.602 s | 0.514 s |" in text
    assert "| hierarchical | 254 | 6 | 0.508 s | 0.508 s |" in text
    # NCCL's constants only as a labelled what-if, in a fold, with their sources
    what_if = text[text.index("<details>"):]
    assert "If the tuner's constants were hop latencies" in what_if and "Sources" in what_if
    assert "If the tuner's constants" not in text[:text.index("<details>")]
    # a third link at NCCL's tuner ratio (3.4/14 of delay 2ms = 486us), in the fold
    near = pm.nccl_ratio_link(mit)
    assert near == "delay 486us"
    one |= {(near, "ring"): 1.382, (near, "hierarchical"): 0.511}
    text = pm.hierarchy_sentence(mit, one, pm.factor_at_scale(mit), fast_in="delay 1us",
                                 near_in=near)
    main, fold = text[:text.index("<details>")], text[text.index("<details>"):]
    assert "486us" not in main
    assert "**The rule:** a hierarchy gains about (p − 1)·t_intra / t_net; here t_net is " \
        "milliseconds" in main
    assert "most of its latency" not in main
    assert ("With `delay 486us` inside (the ratio of NCCL's tuner constants for an NVLink and a "
            "network ring step, 0.24; selection constants, not measured hops), the ratio "
            "gives 1.7 and the replay 1.7: in that model") in fold


def test_measured_efficiency_is_compute_over_step_per_sample_like_the_simulator():
    mit = _mit()
    mit["config"]["compute_s"] = 0.03
    for name, (rate, step) in {"baseline": (400, 0.08), "overlap": (500, 0.064),
                               "bigger buckets": (800, 0.04), "fewer syncs": (1000, 0.128)}.items():
        mit["real"][name].update(samples_per_s_per_rank=rate, step_s=step)
    eff = pm.measured_efficiency(mit)
    assert eff["baseline"] == pytest.approx(0.03 / 0.08)        # 32 samples a step
    assert eff["fewer syncs"] == pytest.approx(4 * 0.03 / 0.128)  # k micro-batches a step


def test_latency_ratio_gain_is_p_minus_1_intra_over_net():
    mit = _mit()
    mit["config"]["hier_intra"] = "delay 50us"
    est = pm.latency_ratio_gain(mit, fast_in="delay 1us")
    assert est["delay 50us"] == pytest.approx(7 * 50e-6 / 2e-3)
    assert est["delay 1us"] == pytest.approx(7 * 1e-6 / 2e-3)
    assert est["nccl"] == pytest.approx(7 * 3.4 / 14)       # NCCL 2.30.7's Simple ring steps


def test_the_nvls_sentence_compares_busbw_as_speed_not_as_wire_traffic():
    from clusterlab import facts

    text = facts.render(pm.REAL_CLUSTER)
    assert "not like for like" not in text
    assert "NVLS is about ×1.3\n  as fast" in text or "NVLS is about ×1.3 as fast" in text


def test_network_latencies_and_hops_count_the_diagram():
    # 2 nodes x 2: the flat ring crosses the network 2*2*3/4 = 3 times on average, the hierarchy 2
    assert pm.network_latencies(2, 2) == (3.0, 2)
    assert pm.net_hops(2, 2) == (3.0, 3, 2)      # longest chain 2n - 1 with 2 ranks per node
    assert pm.net_hops(4, 1) == (6.0, 6, 6)      # one rank per node: every hop crosses
    assert pm.net_hops(128, 8)[1] == 256         # more than 2 per node: 2n


def test_accumulation_bound_is_the_skipped_share_of_k_steps():
    # a 100 ms step with a 40 ms exchange; skipping 3 in 4: 400 / (400 - 120) - 1
    assert pm.accumulation_bound(0.1, 0.04, 4) == pytest.approx(400 / 280 - 1)
    assert pm.accumulation_bound(0.1, 0.0, 4) == pytest.approx(0.0)
    # with the local micro-steps as measured: 3 of 50 ms each beside the 100 ms synced step
    assert pm.accumulation_measured(0.1, 0.15, 4) == pytest.approx(400 / 250 - 1)
    # local micro-steps as long as the step outside its exchange: the bound itself
    assert pm.accumulation_measured(0.1, 3 * 0.06, 4) == pytest.approx(
        pm.accumulation_bound(0.1, 0.04, 4))


def test_nic_label_names_the_constant_and_the_pareto_network_by_their_mean():
    assert pm.nic_label("delay 7699us") == "constant 7.7 ms"
    rough = pm.nic_label("delay 8ms 9ms distribution pareto")
    assert rough.startswith("Pareto tail, mean ") and rough.endswith(" ms")


# --- 04c: time to train -----------------------------------------------------------------------


def test_span_and_settled():
    assert tt.span([8]) == "8" and tt.span([8, 16, 32]) == "8 to 32"
    batches = [32, 64, 128, 256, 512]
    # steps within twice the largest batch's (10) from 128 on; 64's 25 is not
    assert tt.settled({32: 40, 64: 25, 128: 19, 256: 12, 512: 10}, batches) == 128
    # a later batch above twice the minimum pushes the estimate past it
    assert tt.settled({32: 40, 64: 19, 128: 21, 256: 12, 512: 10}, batches) == 256


def test_least_rising_counts_the_doublings_past_the_best():
    past, ups = tt.least_rising({1: 9.0, 2: 5.0, 4: 6.0, 8: 5.5, 16: 7.0}, [1, 2, 4, 8, 16])
    assert past == [2, 4, 8, 16] and ups == 2


def _ttt(nodes, per_rank=32):
    """Steps that halve up to batch 128 and then flatten; a ring whose step doubles per node
    doubling past 4 nodes, and a flat tree."""
    steps = {1: 80.0, 2: 40.0, 4: 21.0, 8: 12.0, 16: 11.0, 32: 10.5, 64: 10.4, 128: 10.3,
             256: 10.2, 512: 10.1, 1024: 10.0}
    rows = [{"batch": n * per_rank, "steps": s, "per_seed": [s - 1, s + 1],
             "lr": 0.1 if n < 8 else 0.4, "lr_above": None} for n, s in steps.items()]
    step_times = {"ring": {n: 0.1 * max(1, n // 4) for n in nodes},
                  "tree": {n: 0.1 for n in nodes}}
    curves = {k: [{"nodes": n, "time_s": steps[n] * t[n]} for n in nodes]
              for k, t in step_times.items()}
    return {"steps": {"rows": rows, "seeds": [0, 1]}, "curves": curves}, step_times


def test_best_node_counts_finds_each_curves_optimum_and_the_critical_batch():
    nodes = [2 ** i for i in range(11)]
    ttt, step_times = _ttt(nodes)
    crit = tt.best_node_counts(ttt, step_times, nodes=nodes, per_rank=32)
    assert crit["best"]["ring"]["nodes"] == 4          # 21 x 0.1 = 2.1 s is the least
    assert crit["best"]["tree"]["nodes"] == 1024
    assert crit["seed_best"] == {"ring": [4], "tree": [1024]}
    # 21 > 2 x 10 at batch 128; 12 <= 20 from batch 256 on
    assert crit["b_crit"] == 8 * 32 and crit["n_crit"] == 8
    assert crit["top_from"] == 256 and crit["lr_top"] == 0.4 and len(crit["plateau"]) == 8
    # B_crit implied below the estimate 256: 32 x 7 = 224 ... 128 x 1.1 = 141; with 256
    assert crit["crit_range"] == (pytest.approx(140.8), 256)
    assert tt.crit_text(crit) == "B_crit ≈ 140 to 260 samples, 4 to 8 nodes: the grey band"
    text = tt.best_nodes_sentence(crit)
    # one bold line first: the ring's best against the critical batch's range, the tree's
    assert text.startswith("**The ring's time to train is least at 4 nodes (4 by seed), below "
                           "the critical batch (B_crit ≈ 140 to 260 samples, 4 to 8 nodes: the "
                           "grey band); the tree's best is at 1024 nodes by seed.**")
    # the edge-of-range caveat is only pointed to (the appendix prints it)
    assert "edge of the range" not in text
    assert ("the ring's step time grew ×2.00 while the steps to target fell only ×1.75: a step "
            "time that grows faster than the steps to target fall stops paying even before the "
            "critical batch.") in text
    # no fold: the estimate's arithmetic goes to the appendix
    assert "<details>" not in text and text.endswith(
        "Why the critical batch is only a range, and why the tree's optimum may lie past 1024 "
        "nodes: appendix.")
    assert "S_min" not in text and "rate grid (a factor" not in text
    inside = {**crit, "crit_range": (100, 600)}   # the ring's best, batch 128, lies inside it
    assert "(4 by seed), inside or past the critical batch" in tt.best_nodes_sentence(inside)
    assert "stops paying even before" not in tt.best_nodes_sentence(inside)
    assert tt.placed([256, 512], crit) == "inside or past" and tt.placed([512], crit) == "past"
    points = "\n".join(tt.estimate_points(crit))
    assert "from batch 256 on (8 nodes, past the ring's best) the mean steps stay below" in points
    assert ("Critical batch estimate: S_min ≈ 10.0 steps (the largest batch's), so 2 S_min = 20.0"
            in points)
    # 21 -> 12 is x1.75 into the estimate, steeper than the model's x1.5 there, as the rate rose
    assert ("The fall into it, 21.0 → 12.0 steps (×1.75), is steeper than the model allows at "
            "the estimate (×1.5), and the tuned rate rose 0.1 → 0.4 there.") in points
    assert "From batch 32 to 256 the rate grid" in points and "even rise" not in points


def test_grid_note_names_a_rise_past_the_estimate_and_stays_short_without_one():
    rows = [{"batch": b, "lr": 4} for b in (256, 512, 1024, 2048, 4096)]
    crit = {"steps": {256: 30.0, 512: 20.0, 1024: 12.0, 2048: 11.0, 4096: 11.5},
            "b_crit": 1024, "batches": [256, 512, 1024, 2048, 4096], "rows": rows}
    note = tt.grid_points(crit)   # 20 -> 12 is x1.67 > x1.5; same rate; 11.0 -> 11.5 rises
    assert note[1].endswith("(×1.67), is steeper than the model allows at the estimate (×1.5).")
    assert note[2].startswith("Past it the steps even rise (11.0 → 11.5 at batch 4096)")
    assert note[3].startswith("From batch 256 to 4096 the rate grid")
    # a fall of more than x2 per doubling: steeper than the model allows for any B_crit
    steep = tt.grid_points({**crit, "steps": {**crit["steps"], 512: 25.0}})
    assert steep[1] == ("The fall into it, 25.0 → 12.0 steps (×2.08), is steeper than the model "
                        "allows for any B_crit (at most ×2 per doubling of the batch).")
    crit["steps"] = {256: 30.0, 512: 16.0, 1024: 12.0, 2048: 11.0, 4096: 10.0}
    # B(S/S_min - 1) below the estimate: 256 x 2 = 512 and 512 x 0.6 = 307, two-sided
    assert tt.grid_points(crit) == ["Treat 1024 as approximate: in McCandlish's model the smaller "
                                    "batches' steps imply B_crit = B(S/S_min − 1) ≈ 310 to 510, "
                                    "and a lower true S_min would raise these and the estimate."]
    assert tt.implied_crit(crit["steps"], 256) is None   # nothing below the estimate
    assert tt.grid_points({**crit, "b_crit": 256})[0].startswith(
        "Treat 256 as approximate (a lower true S_min would move it right)")


def test_nccl_sentence_says_whether_every_seed_reached_the_critical_batch():
    crit = {"crit_range": (200, 260), "b_crit": 256, "per_rank": 32,
            "best": {"ring": {"nodes": 4}}, "step_times": {"ring": {8: 0.078, 16: 0.11}}}
    step = {n: 0.05 + 2 * (n - 1) * 1.4e-5 for n in (8, 16)}
    dc = {"alpha_s": 1.4e-5, "compute_s": 0.05, "step": step, "best": 16, "seeds": [8, 16]}
    past = tt.nccl_sentence(dc, crit)
    # the conclusion first, then the step worked at the best by the mean
    assert past.startswith("**At 14 µs per network step instead of 2 ms, the ring's best moves "
                           "from 4 nodes to 8 to 16 by seed: every seed's best is inside or past "
                           "the critical batch's range.** The step is then 50 ms + 2(N−1) × "
                           "14 µs: 16 nodes (the best by the mean) take 50 ms + 30 × 14 µs = "
                           "50 ms per step, against 0.11 s at 2 ms.")
    assert "small growth and seed noise decide the exact count" in past
    below = tt.nccl_sentence({**dc, "best": 8, "seeds": [4, 8]}, crit)
    assert "by seed: every seed's best is around the critical batch's range" in below
    assert "seed noise" not in below


def test_nccl_step_times_charge_the_ledger_constant_per_ring_step():
    from clusterlab import facts
    us = facts.get("nccl.tuner_net_ring_step_latency_simple").value
    step = tt.nccl_step_times([1, 4], compute_s=0.05)
    assert step[1] == pytest.approx(0.05) and step[4] == pytest.approx(0.05 + 6 * us * 1e-6)


def test_accumulation_decides_shorter_or_longer_by_the_steps_cut_against_the_step_growth():
    per_rank, acc, c = 32, 4, 0.05
    step_times = {"ring": {1: 0.05, 2: 0.25, 4: 0.45}}
    with_acc = {n: t + (acc - 1) * c for n, t in step_times["ring"].items()}
    # steps at B and 4B: one rank cuts 5-fold (step grows 4x); 2 nodes only 1.2-fold (step grows
    # 1.6x): longer; 4 nodes 1.6-fold (step grows 1.33x)
    steps = {32: 100.0, 64: 60.0, 128: 20.0, 256: 50.0, 512: 12.5}
    a = tt.accumulation(step_times, with_acc, steps, acc=acc, per_rank=per_rank, compute_s=c)
    assert a["verdict"] == {1: "shorter", 2: "longer", 4: "shorter"}
    assert a["grew"][2] == pytest.approx(0.4 / 0.25) and a["cut"][4] == pytest.approx(20 / 12.5)
    assert a["sps_gain"][1] == pytest.approx(1.0)
    assert a["share"][4] == pytest.approx(1 - 0.05 / 0.45)
    text = tt.accumulation_sentence(a, b_crit=128)
    assert "longer at 1 of those 2 node counts**: more samples per second" in text
    # the rule worked on the first multi-node count that got shorter: 4 nodes
    assert ("The rule on 4 nodes: the step time of 450 ms grows to 450 + 150 = 600 ms (×1.33), "
            "and the 4-fold batch cuts the steps to target 20.0 → 12.5 (×1.60 > 1.33), so the "
            "training is shorter (table).") in text
    assert "it still paid at 4 nodes (by the means)" in text   # 128 is at b_crit
    assert "for all" not in text   # no per-seed counts: no every-seed headline
    assert "seeds split" not in text   # no per-seed counts given
    # accumulating on 1 node (batch 128, 20 x 0.2 s) beats 4 nodes without it (20 x 0.45 s) and
    # the ring's best (1 node, 100 x 0.05 s)
    assert ("The accumulating ring's best, 1 nodes (4.00 s), reaches batch 128 faster than 4 "
            "nodes without it (9.00 s), and beats the ring's best (5.00 s on 1 nodes).") in text
    # per seed: the same seed's steps at B and 4B, against the step's growth (1.33x at 4 nodes)
    per_seed = {128: np.array([20.0, 20.0]), 512: np.array([10.0, 18.0])}
    assert tt.seed_wins(a, [4], per_seed) == {4: (1, 2)}
    text = tt.accumulation_sentence(a, b_crit=128, per_seed=per_seed)
    assert ("At and past the critical batch estimate (batch 128, 4 nodes) it paid at 4 nodes by "
            "the means but for only 1 of 2 seeds: not shown on this run (the exchange was at "
            "least 89% of the step time") in text
    # the accumulating curve's best is a visible line, outside the fold
    assert text.index("The accumulating ring's best") < text.index("<details>")
    assert "rule predicts" not in text
    # the model's cut at batch 128 -> 512, (1 + Bc/128)/(1 + Bc/512), against the growth x1.33:
    # B_crit implied below 128: 32 x (100/12.5 - 1) = 224, 64 x 3.8 = 243; with the estimate,
    # 128 to 243: x1.60 and x1.93, both wins
    assert ("(the exchange was at least 89% of the step time, so the step time grew at most "
            "×1.33). With "
            "B_crit anywhere in 130 to 240, McCandlish's model predicts a win there.") in text
    # a B_crit range across the break-even: the model cannot tell
    steps2 = {32: 13.5, 64: 12.5, 128: 11.0, 256: 10.5, 512: 10.0}
    b = tt.accumulation(step_times, with_acc, steps2, acc=acc, per_rank=per_rank, compute_s=c)
    # B_crit 11 (32 x 0.35) to 128: x1.06 to x1.60 against x1.33
    assert tt.model_says(b, [4], 128) == (" Whether McCandlish's model predicts a win there "
                                          "depends on B_crit, which this run pins only to about "
                                          "11 to 130.")
    assert tt.batch_range(801, 2219) == "800 to 2200" and tt.batch_range(128, 131) == "130"


def test_explain_accumulation_prints_the_table_and_checks_one_rank_gains_nothing(said, capsys):
    step_times = {"ring": {1: 0.05, 2: 0.25}}
    with_acc = {n: t + 3 * 0.05 for n, t in step_times["ring"].items()}
    steps = {32: 100.0, 64: 60.0, 128: 20.0, 256: 50.0}
    a = tt.accumulation(step_times, with_acc, steps, acc=4, per_rank=32, compute_s=0.05)
    tt.explain_accumulation(a, b_crit=10_000)
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[-1] == "shorter" and out[2].split()[-1] == "longer"
    assert said and "still paid" not in said[0]
    # with per-seed steps the table gains a column: for how many seeds the training got shorter
    per_seed = {b: np.array([s, s]) for b, s in steps.items()}
    tt.explain_accumulation(a, b_crit=10_000, per_seed=per_seed)
    out = capsys.readouterr().out.splitlines()
    assert "seeds shorter" in out[0] and out[2].split()[-4:] == ["0", "of", "2", "longer"]


# --- 05: stragglers and staleness -------------------------------------------------------------


def test_explain_slow_rank_reads_the_medians(capsys):
    even = {"step_s": np.array([0.10, 0.11, 0.10, 0.5])}   # one host spike: the median ignores it
    slow = {"step_s": np.array([0.20, 0.21, 0.20, 0.20])}
    assert ss.slow_rank_medians(even, slow) == pytest.approx({"even": 0.105, "slow": 0.2})
    ss.explain_slow_rank(even, slow, c_ms=100)
    out = capsys.readouterr().out
    assert "Shown on this run: one slow rank slowed the median step" in out
    assert "Median step: 105 ms with 4 equal ranks, 200 ms with one slow rank (4 steps each)" in out
    assert "added 95 ms, 95% of its extra c = 100 ms" in out and "about 48% of each step" in out
    assert "(over 60% of it)" in out and "tolerance" not in out   # one threshold, not two
    ss.explain_slow_rank(even, {"step_s": np.array([0.22, 0.22])}, c_ms=100)   # 115 ms: over c
    out = capsys.readouterr().out
    assert "added 115 ms, 115% of its extra c = 100 ms" in out


def _straggler_runs(steps_8, comm_8):
    """N = 2 and 8 with c = m = 20 ms: sleeps on the model, the whole step and the all-reduce
    alone at N = 8 as given."""
    def run(n, step, comm):
        model = models.straggler_step(0.02, 0.02, n)
        return {"nodes": n, "model_s": model, "mean_slowest_s": model * 1.02,
                "mean_step_s": step, "comm_s": comm, "step_s": np.full(60, step)}
    return [run(2, 0.0536, 0.0032), run(8, steps_8, comm_8)]


def test_growth_sentence_says_the_step_grew_more_where_this_hosts_all_reduce_did():
    # 90.7 - 53.6 = 37.1 ms against 74.4 - 50.0 = 24.4 ms predicted; the all-reduce grew 21.7 ms
    more = ss.growth_sentence(_straggler_runs(0.0907, 0.0249))
    assert more == ("the slowest seeded sleep followed c + m·H_N (within 2% at every N); the whole "
                    "step grew more (37.1 ms against 24.4 ms predicted, from N = 2 to 8): the "
                    "host's overhead (whole step minus slowest sleep) grew 2.6 → 14.9 ms, as "
                    "the all-reduce timed alone grew (3.2 → 24.9 ms; the emulated link's ring "
                    "needs 1.4 ms at N = 8): on this host the step has a part that grows with "
                    "N, on top of c + m·H_N.")
    assert "while the all-reduce timed alone went (3.2 → 2.0 ms" in ss.growth_sentence(
        _straggler_runs(0.0907, 0.0020))
    assert "about as predicted" in ss.growth_sentence(_straggler_runs(0.0790, 0.0040))
    assert "because" not in ss.growth_sentence(_straggler_runs(0.0907, 0.0040)).replace(
        "perhaps because", "")  # a cause is only ever offered as a guess
    # overhead that grew by less than half the excess is not named
    assert "overhead" not in ss.growth_sentence(_straggler_runs(0.0790, 0.0040))


def _bk(backups, mean, predicted, cancelled):
    return {"backups": backups, "mean_step_s": mean, "predicted_s": predicted,
            "sample_s": mean - 0.002, "step_s": np.array([mean - 0.001, mean + 0.001]),
            "cancelled": cancelled}


def test_backup_lines_and_the_shortening_verdict():
    bk = [_bk(0, 0.080, 0.074, 0), _bk(2, 0.050, 0.044, 3), _bk(4, 0.040, 0.034, 5)]
    base = bk[0]
    assert ss.backup_line(base, base) == "b=0: step 80.0 ± 1.4 ms"
    line = ss.backup_line(bk[1], base)
    assert ("saved 30.0 ± 0.0 ms (predicted 30.0 ms); of 4 unused gradients, 3 were cut short, "
            "1 ") in line   # the same draws at every b: the paired saving has no spread here
    assert "discarded" not in ss.backup_line(_bk(2, 0.05, 0.044, 5), base)   # more cut than unused
    assert ss.backups_shortened(bk)
    # b = 4 saved 40 ms of a predicted 40: fine; saving under half of it is not
    assert not ss.backups_shortened([bk[0], bk[1], _bk(4, 0.065, 0.034, 5)])
    assert not ss.backups_shortened([bk[0], _bk(1, 0.081, 0.06, 1), bk[2]])   # b = 1 slower


def test_within_se_counts_savings_against_their_predictions():
    base = {"mean_step_s": 0.080, "predicted_s": 0.074, "step_s": np.array([0.08, 0.09, 0.07])}
    near = {"mean_step_s": 0.050, "predicted_s": 0.044,
            "step_s": np.array([0.05, 0.058, 0.042])}   # saved 30, predicted 30
    far = dict(near, mean_step_s=0.070)                  # saved 10 of 30: many SE off
    assert ss.within_se([base, near]) == (
        "Every saving is within one standard error of its prediction.")
    short = dict(near, mean_step_s=0.051)                # saved 29 of 30: short, within one SE
    assert ss.within_se([base, short]) == (
        "Every saving fell short of its prediction, each by less than one standard error: 3 "
        "steps cannot tell a small bias from noise.")
    assert ss.within_se([base, near, far]).startswith(
        "1 of 2 savings are within one standard error of their prediction")


def test_explain_backups_prints_the_overhead_once(capsys):
    bk = [_bk(0, 0.080, 0.074, 0), _bk(2, 0.050, 0.044, 3), _bk(4, 0.040, 0.034, 5)]
    ss.explain_backups(bk)
    out = capsys.readouterr().out
    assert out.count("above this sample's (N−b)-th draw") == 1
    assert "Each step is 2.0 to 2.0 ms above" in out
    assert "Every saving is within one standard error of its prediction." in out


def test_saving_se_is_paired_when_the_steps_match():
    base = {"step_s": np.array([0.08, 0.10, 0.09])}
    r = {"step_s": np.array([0.05, 0.08, 0.06])}        # savings 30, 20, 30 ms
    assert ss.saving_se(r, base) == pytest.approx(np.std([0.03, 0.02, 0.03], ddof=1) / np.sqrt(3))
    short = {"step_s": np.array([0.05, 0.07])}           # other length: unpaired
    assert ss.saving_se(short, base) == pytest.approx(
        np.sqrt(np.var(base["step_s"], ddof=1) / 3 + np.var(short["step_s"], ddof=1) / 2))


def test_step_back_by_tau_only_where_tau_has_enough_updates():
    r = {"tau": np.array([1] * 10 + [2] * 3), "loss_before": np.ones(13),
         "loss_after": np.array([2.0] * 4 + [0.5] * 6 + [2.0] * 3)}
    assert ss.step_back_by_tau(r) == {1: pytest.approx(0.4)}   # τ = 2 has only 3 updates
    assert ss.step_back_by_tau(r, min_updates=3) == {1: pytest.approx(0.4), 2: 1.0}


def test_tau_counts_and_the_stability_title():
    assert list(ss.tau_counts({"tau": np.array([0, 2, 2, 3])})) == [1, 0, 2, 1]
    lim = models.delayed_gd_stable_step(3)
    assert ss.stability_title(0.4, 3) == f"a = 0.400, τ = 3: limit {lim:.3f} -> converges"
    assert ss.stability_title(0.5, 3).endswith("diverges")


def _run(initial, final, mean_tau):
    return {"initial_loss": initial, "final_loss": final, "tau": np.array([mean_tau, mean_tau])}


def test_unsettled_names_runs_below_the_start_that_rose_above_it_late():
    stalled = {"initial_loss": 1.0, "final_loss": 1e-3,
               "loss_after": np.array([0.5, 0.4, 0.3, 0.2, 4.0, 1e-3])}   # last third: 4.0, 1e-3
    settled = dict(stalled, loss_after=np.array([0.5, 0.4, 0.3, 0.2, 0.1, 1e-3]))
    diverged = dict(stalled, final_loss=1e6, loss_after=np.array([1.0, 2.0, 9.0, 1e3, 1e5, 1e6]))
    assert ss.last_third_max(stalled) == 4.0
    assert ss.unsettled({"a": stalled, "b": settled, "c": diverged}) == ["a"]


def test_separating_tau_finds_a_whole_tau_limit_between_two_step_sizes():
    assert ss.separating_tau(0.45, 0.55) is None        # τ = 2: 0.618, τ = 3: 0.445
    assert ss.separating_tau(0.5, 0.7) == 2              # 0.618 lies between
    assert ss.no_tau_between(0.45, 0.55).startswith(
        "No whole τ has its fixed-delay limit between a = 0.45 and 0.55 (τ = 2: 0.618, τ = 3: "
        "0.445)")


def test_k_a_matches_counts_runs_whose_outcome_k_a_predicted():
    runs = [_run(1.0, 1e6, 2.0), _run(1.0, 0.1, 2.0), _run(1.0, 1e6, 2.0)]
    assert ss.k_a_matches(runs, k=4, a=0.55) == 2      # 2.2 > 2: growth predicted
    assert ss.k_a_matches(runs, k=4, a=0.45) == 1      # 1.8 < 2: convergence predicted


def test_explain_ssp_lockstep_states_both_verdicts_when_released_together(capsys):
    def ps(version, final):
        return {"version": np.array(version), "initial_loss": 1.0, "final_loss": final,
                "tau": np.array([1, 2, 3, 1])}

    locked = [1, 1, 1, 1, 2, 2, 2, 2]          # 4 workers pull each version: all shared
    ssp_lr = {0.45: [ps(locked, 0.1)] * 3, 0.55: [ps(locked, 1e6)] * 3}
    shared = {"plain, slow worker": {"shared": 0},
              "SSP s=1, slow worker": {"in_shared": 1.0, "typical": 4}}
    ss.explain_ssp_lockstep(ssp_lr, shared, seeds=(0, 1, 2))
    out = capsys.readouterr().out
    assert "a = 0.45; 4·a = 1.80; over 3 seeds: mean τ 1.8, max τ 3 of 12 updates" in out
    assert "Shown on this run: SSP released the workers in lockstep" in out
    assert ("Shown on this run: 4·a predicted the outcome in every run at both step sizes "
            "(6 of 6 runs)") in out
    # no whole τ has its limit in (0.45, 0.55]: τ = 2 gives 0.618, τ = 3 gives 0.445
    assert "so no fixed-delay rule tells the two apart. The lockstep pattern (4·a), not τ" in out
    assert "In those runs 100% to 100%" in out
    assert "(not exact lockstep)" not in out


@pytest.mark.parametrize("box", [pm.REAL_CLUSTER, ss.REAL_CLUSTER, ss.REAL_CLUSTER_MORE],
                         ids=["predictability", "stragglers", "stragglers_more"])
def test_the_moved_real_cluster_boxes_cite_only_ledger_facts(box):
    """The "On a real GPU cluster" text left the notebooks, where tests/test_facts.py read its
    fact ids: each id must still be in the ledger, and the box must render."""
    from clusterlab import facts

    ids = facts.placeholders(box)
    assert ids and not set(ids) - set(facts.ledger())
    assert "[[" not in facts.render(box)


def _ps_run(tau, final, initial=2.65):
    return {"tau": np.asarray(tau), "final_loss": final, "initial_loss": initial,
            "loss_after": np.linspace(initial, final, 9)}


def test_row_three_sentence_reads_the_slow_worker_row_against_the_first():
    fix = {"plain (4 equal)": _ps_run([0, 3, 0, 9], 6.9),
           "plain, slow worker": _ps_run([0, 0, -15, 27], 8.5e-6)}
    text = ss.row_three_sentence(fix)
    assert text.startswith("Read *plain, slow worker*: mean τ 3.0, against 3.0 for *plain (4 "
                           "equal)*, yet it fell overall")
    assert "max τ 27 against 9)" in text and "not a rule" in text
    assert ("Our reading, not tested here: the fixed-delay limit assumes one τ for every "
            "gradient, and this mix of small and large τ happened not to diverge, so mean τ "
            "alone does not decide stability") in text
    fix["plain, slow worker"]["worker"] = np.array([1, 1, 1, 4])
    assert ("max τ 27 against 9; the slow worker's 1 updates at mean τ 27.0, the others' 3 at "
            "-5.0)") in ss.row_three_sentence(fix)
    assert "with large swings over its last third (up to 6.6e-01, final 8.5e-06)" in text
    assert text.endswith("below it is SSP's baseline (the same slow worker, no bound).")
    fix["plain, slow worker"] = _ps_run([0, 0, -15, 27], 9.0)
    assert ss.row_three_sentence(fix).endswith("; neither converged (one run each).")
