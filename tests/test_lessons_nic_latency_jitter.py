"""Notebook 01's lesson module (clusterlab/lessons/nic_latency_jitter.py): the sentences the
review of round 13 added, from small synthetic runs (no processes, no clocks). The rest of the
module is tested in tests/test_lessons_start.py."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from clusterlab import facts, models  # noqa: E402
from clusterlab.lessons import nic_latency_jitter as link  # noqa: E402


def test_sweep_reads_the_machine_lateness_off_the_smallest_message(capsys):
    sizes = 2 ** np.arange(10, 24)
    alpha, beta = 2e-3, 8e-9
    best_s = alpha + sizes * beta
    best_s[0] += 90e-6  # the smallest message 90 µs late, the fit's α pulled by less
    fit = models.fit_alpha_beta(sizes, best_s)
    link.explain_sweep({"fit": fit, "sizes": sizes, "best_ms": best_s * 1e3,
                        "latency_share": alpha / (alpha + sizes * beta),
                        "configured_alpha": alpha, "configured_beta": beta,
                        "crossover_bytes": fit.alpha / fit.beta,
                        "configured_crossover_bytes": alpha / beta}, show_details=True)
    out = capsys.readouterr().out
    assert "details: the 1 KiB message: +90 µs against the configured α + nβ" in out
    # the fitted α's excess is the least-squares weights times every size's excess: here only
    # the 1 KiB message is late, so it is 90 µs times that size's weight
    extra = (fit.alpha - alpha) * 1e6
    assert (f"details: the fitted α's {extra:+.0f} µs comes from every size's excess (here "
            "+0 to +90 µs): what all sizes share moves a line's intercept, not its slope") in out
    assert "weights" not in out  # the least-squares weights stay in the check, not the text
    link.explain_sweep({"fit": fit, "sizes": sizes, "best_ms": best_s * 1e3,
                        "latency_share": alpha / (alpha + sizes * beta),
                        "configured_alpha": alpha, "configured_beta": beta,
                        "crossover_bytes": fit.alpha / fit.beta,
                        "configured_crossover_bytes": alpha / beta})
    out = capsys.readouterr().out
    assert out.startswith("fit: α = ") and "details" not in out  # the excess only on request
    x = sizes.astype(float)
    w0 = 1 / len(x) - x.mean() * (x[0] - x.mean()) / np.sum((x - x.mean()) ** 2)
    assert abs(extra - 90 * w0) < 0.01


def test_a_p99_of_200_pings_is_said_to_have_no_upper_bound(capsys):
    link.explain_excess({"noise_ms": np.linspace(0.040, 0.044, 200)}, np.array([]))
    assert "over 200 pings (one run; 200 samples cannot bound a p99 from above)" in \
        capsys.readouterr().out


def test_a_ring_step_nstar_comes_from_the_ledger():
    per_us = facts.get("nvidia.connectx7_rate_bytes").value  # GB/s = 1e9 B/s = kB per µs
    simple = facts.get("nccl.tuner_net_ring_step_latency_simple").value * per_us
    # LL: its own α, and at most half the bandwidth (half of each LL line is data)
    ll = facts.get("nccl.tuner_net_ring_step_latency_ll").value * per_us * 0.5
    assert facts.get("nccl.proto_ll_efficiency").value == 50
    text = " ".join(facts.render(link.TRANSPORT_AND_CONGESTION).split())
    main = text.split("<details>")[0]
    # said as the cost model's, not as a measured latency; the range per protocol is folded
    assert "not measured latencies" in main and "tens to hundreds of kB" in main
    assert f"The tuner's α with the line rate gives n* from at most ≈ {ll:.0f} kB with LL to " \
        f"≈ {simple:.0f} kB with Simple" in text
    assert "LL128" not in main and "Framing" not in main  # protocol machinery: folded for 02c
    ll_us = facts.get("nccl.tuner_net_ring_step_latency_ll").value
    assert f"at most about {ll_us:g} µs × {per_us * 0.5:g} GB/s ≈ {ll:.0f} kB" in text  # shown
    assert f"about {per_us:.0f} kB per µs" in text
