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
                        "configured_crossover_bytes": alpha / beta})
    assert "the 1 KiB message: +90 µs against the configured α + nβ" in capsys.readouterr().out


def test_a_p99_of_200_pings_is_said_to_have_no_upper_bound(capsys):
    link.explain_excess({"noise_ms": np.linspace(0.040, 0.044, 200)}, np.array([]))
    assert "over 200 pings (one run; 200 samples cannot bound a p99 from above)" in \
        capsys.readouterr().out


def test_a_ring_step_nstar_comes_from_the_ledger():
    per_us = facts.get("nvidia.connectx7_rate_bytes").value  # GB/s = 1e9 B/s = kB per µs
    lo = facts.get("nccl.tuner_net_ring_step_latency_ll").value * per_us
    hi = facts.get("nccl.tuner_net_ring_step_latency_simple").value * per_us
    text = facts.render(link.TRANSPORT_AND_CONGESTION)
    assert f"roughly {lo:.0f} to {hi:.0f} kB" in text and f"about {per_us:.0f} kB per µs" in text
