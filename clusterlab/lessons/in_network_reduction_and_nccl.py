"""What notebook 02c (in-network reduction and NCCL's algorithms) reads from its runs.

The rows are those of `clusterlab.experiments.allreduce_and_topology.ring_vs_switch`: per size,
one row for the ring among the workers and one for the emulated switch that adds, each with
its repetitions ("times"), their best and median, and its closed form ("model"). Each function
below prints the sentences the notebook shows, computed from those rows, and passes each
measured conclusion to `conclude`, which says whether this run showed it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clusterlab import models
from clusterlab.experiments import allreduce_and_topology as ex
from clusterlab.experiments.common import beyond_closed_form, conclude
from clusterlab.lessons.show import ms

SMALL, MEDIUM, LARGE = ex.SIZES


# --- the switch against the ring ------------------------------------------------------------

def medians_close(ring: dict, switch: dict) -> bool:
    """Whether the two medians are within 5 % of each other: within this machine's noise."""
    return abs(ring["median"] / switch["median"] - 1) < 0.05


def explain_switch(switch: Sequence[dict], ring4: Sequence[dict], *, link: float) -> None:
    """4 MiB on 4 workers: print both best and median times; when the medians are close
    (`medians_close`) but the switch's best is faster, say that by the median this run cannot
    tell; otherwise conclude that the switch beat the ring by both, and print by how much and
    whether even the switch's slowest run (the figure's black line) beat the ring's best.
    Then print the switch's busbw by the factor 2(p-1)/p, worked out from the best time (the
    table's statistic) in MB (10^6 bytes, the link rate's unit) and seconds, as a share of the
    link, and by the median (above the link: the factor assumes 1.5 n per NIC). Asserts that
    no switch run beat its closed form and that the ring's replay (the figure's green bar) is
    its closed form."""
    rs, ss = ex.one(ring4, nbytes=LARGE), ex.one(switch, nbytes=LARGE)
    k, kr = len(ss["times"]), len(rs["times"])
    size = ex.human_bytes(ss["nbytes"])
    model_bus = 1.5 * LARGE / ss["model"] / link
    print(f"{size} on 4 workers, {k} and {kr} runs interleaved: switch best {ms(ss['best'])}, "
          f"median {ms(ss['median'])}; ring best {ms(rs['best'])}, median {ms(rs['median'])}.")
    # Both statistics must agree, and neither may sit far above its closed form (then this
    # machine, not the emulated links, set the time).
    slowed = beyond_closed_form([(r[s], r["model"]) for r in (ss, rs) for s in ("best", "median")])
    if medians_close(rs, ss) and ss["best"] < rs["best"]:
        print(f"By the best of {k} the emulated switch was {rs['best'] / ss['best']:.2f}x faster "
              f"(closed forms {rs['model'] / ss['model']:.2f}x); the medians were within 5 % "
              f"({ms(ss['median'])} and {ms(rs['median'])}), so by the median this run cannot "
              "tell.")
    elif conclude(ss["best"] < rs["best"] and ss["median"] < rs["median"],
                  f"the emulated switch beat the ring at {size}, by the best and by the median "
                  f"of {k}", busy=slowed):
        slowest = max(ss["times"])
        print(f"By {rs['best'] / ss['best']:.2f}x (best) and {rs['median'] / ss['median']:.2f}x "
              f"(median); closed forms {rs['model'] / ss['model']:.2f}x: a consistency check of "
              f"the emulator's own switch model. The switch's slowest run (the black line in the "
              f"figure), {ms(slowest)}, was " + (
                  f"faster than the ring's best, {ms(rs['best'])}: the runs do not overlap."
                  if slowest < rs["best"] else
                  f"not faster than the ring's best, {ms(rs['best'])}: the runs overlap."))
    bus = {s: 1.5 * ss["nbytes"] / ss[s] / link for s in ("best", "median")}
    print(f"The switch's busbw, 2(p-1)/p x n / best = 1.5 x {ss['nbytes'] / 1e6:.2f} MB "
          f"({size}) / {ss['best']:.4f} s = {bus['best'] * link / 1e6:.1f} MB/s: "
          f"{bus['best']:.0%} of the link's "
          f"{link / 1e6:.2f} MB/s (by the median {bus['median']:.0%}; closed form "
          f"{model_bus:.0%})" + (": above the link, because the factor assumes 1.5 n per NIC "
                                 "and the switch needs only n." if model_bus > 1 and
                                 bus["median"] > 1 else "."))
    for r in switch:
        assert r["measured"] >= 0.98 * r["model"]  # the emulated network never delivers early
    assert abs(rs["replay"] / rs["model"] - 1) < 0.01  # the green bar: the closed form's links


# --- the closed forms over p ----------------------------------------------------------------

def closed_forms_over_p(nbytes: int, alpha: float, beta: float, ps: Sequence[int]) -> dict:
    """The closed forms on `ps` workers: the ring's time and its latency and bandwidth terms,
    and the switch's time (any p) with the number of pieces it streams."""
    ps = np.asarray(ps)
    pieces = ex.in_network_chunks(nbytes)
    return {
        "nbytes": nbytes, "alpha": alpha, "beta": beta, "ps": ps, "pieces": pieces,
        "ring_t": [models.allreduce_time("ring", int(p), nbytes, alpha, beta) for p in ps],
        "ring_lat": [models.allreduce_time("ring", int(p), nbytes, alpha, 0.0)  # 2(p-1) alpha
                     for p in ps],
        "ring_bw": [models.allreduce_time("ring", int(p), nbytes, 0.0, beta)  # 2(p-1)/p n beta
                    for p in ps],
        "switch_t": ex.in_network_time(nbytes, alpha, beta, pieces),
    }


def plot_closed_forms(curves: dict):
    """Draw the ring's closed form over p with its latency and bandwidth terms, and the
    switch's flat closed form. Returns the axes."""
    import matplotlib.pyplot as plt

    ps = curves["ps"]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(ps, np.array(curves["ring_t"]) * 1e3, label="ring, closed form")
    ax.plot(ps, np.array(curves["ring_lat"]) * 1e3, "--", color="C0", lw=1,
            label="ring: latency term")
    ax.plot(ps, np.array(curves["ring_bw"]) * 1e3, ":", color="C0", lw=1,
            label="ring: bandwidth term")
    ax.axhline(curves["switch_t"] * 1e3, color="C1", label="switch adds, closed form")
    ax.set(xlabel="workers p", ylabel="4 MiB all-reduce (ms)", ylim=(0, None),
           title="Model: the ring's latency term grows with p")
    ax.legend(fontsize=8)
    return ax


def switch_pays_from(ps: Sequence[int], ring_t: Sequence[float], switch_t: float) -> int | None:
    """The first p at which the ring's closed form is slower than the switch's, when the ring
    is faster at the smallest p; otherwise None."""
    if ring_t[0] < switch_t:
        return next(int(p) for p, t in zip(ps, ring_t) if t > switch_t)
    return None


def explain_closed_forms(curves: dict) -> None:
    """Print the closed forms worked out at 4 workers (n beta, then each term), the ring's
    time and latency share at the largest p, the bytes the switch saves (never 2x), and, when
    the ring is faster at p = 2, why (the switch waits for its last piece) and from which p the
    switch pays (`switch_pays_from`). Asserts that the worked sums are the closed forms, and
    that at the largest p the latency term is over half the ring's time and its bandwidth
    term below 2 n beta."""
    ps = [int(p) for p in curves["ps"]]
    ring_t, ring_lat, ring_bw = curves["ring_t"], curves["ring_lat"], curves["ring_bw"]
    switch_t, pieces, nbytes = curves["switch_t"], curves["pieces"], curves["nbytes"]
    alpha, nbeta = curves["alpha"], nbytes * curves["beta"]
    at4 = ps.index(4)
    ring4 = 6 * alpha + 1.5 * nbeta  # 2(p-1) alpha + 2((p-1)/p) n beta at p = 4
    switch_sum = 2 * alpha + (1 + 1 / pieces) * nbeta
    assert abs(ring4 - ring_t[at4]) < 1e-9 and abs(switch_sum - switch_t) < 1e-9
    a, nb = f"{alpha * 1e3:.1f}", f"{nbeta * 1e3:.1f}"
    print(f"Closed forms at {ex.human_bytes(nbytes)}, where n beta = {ms(nbeta)}: ring on 4 "
          f"workers 6 x {a} + 1.5 x {nb} = {ms(ring4)}; switch on any number 2 x {a} + "
          f"(1 + 1/{pieces}) x {nb} = {ms(switch_sum)} ({pieces} pieces).")
    print(f"Ring on {ps[-1]}: {ms(ring_t[-1])}, {ring_lat[-1] / ring_t[-1]:.0%} of it the latency "
          f"term 2(p-1) alpha.")
    switch_bw = (1 + 1 / pieces) * nbeta  # the switch's bandwidth term
    print(f"Bytes saved: at p = {ps[-1]} the ring's bandwidth term is "
          f"{ring_bw[-1] / switch_bw:.2f}x the switch's (1 + 1/{pieces}) n beta; it never "
          f"reaches 2x.")
    assert ring_lat[-1] > 0.5 * ring_t[-1] and ring_bw[-1] < 2 * nbeta
    first = switch_pays_from(ps, ring_t, switch_t)
    if first is not None:
        if ps[0] == 2:  # the ring: 2 alpha + n beta; the switch: 2 alpha + (1 + 1/pieces) n beta
            wait = switch_t - ring_t[0]
            assert abs(wait - nbeta / pieces) < 1e-9
            print(f"At p = 2 the ring is faster ({ms(ring_t[0])} = 2 alpha + n beta): both send "
                  f"n each way, but the switch then waits {ms(wait)} more, the (n/{pieces}) beta "
                  f"of its last piece coming back down.")
        print(f"The switch pays from p = {first}.")


# --- appendix: 4 KiB ------------------------------------------------------------------------

def cannot_order(ring: dict, switch: dict) -> bool:
    """Whether this run cannot order the two: medians within 5 %, or best and median
    disagreeing on which is faster."""
    return medians_close(ring, switch) or (
        (switch["best"] < ring["best"]) != (switch["median"] < ring["median"]))


def explain_small(rq: dict, sq: dict, *, alpha: float) -> None:
    """The 4 KiB runs: the switch's and the ring's best and median beside 2 and 6 latencies,
    and whether this run can order them (`cannot_order`); when it can, which was faster by
    both, and by how much by the best against the closed forms' ratio."""
    tie = cannot_order(rq, sq)
    head = (f"4 KiB ({len(sq['times'])} runs each): switch best {ms(sq['best'])}, median "
            f"{ms(sq['median'])} (2 alpha = {ms(2 * alpha)});\nring best {ms(rq['best'])}, "
            f"median {ms(rq['median'])} (6 alpha = {ms(6 * alpha)})")
    if tie:
        print(head + ": best and median disagree or are close, so this run cannot order them "
              "at 4 KiB.")
        return
    fast, slow = ("switch", "ring") if sq["best"] < rq["best"] else ("ring", "switch")
    by = max(rq["best"], sq["best"]) / min(rq["best"], sq["best"])
    print(head + f".\nThe {fast} was faster than the {slow} by both, {by:.1f}x by the best "
          f"(closed forms: switch {rq['model'] / sq['model']:.1f}x faster).")
