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

from clusterlab import facts, models
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
    shortfall(switch, ring4)
    bus = {s: 1.5 * ss["nbytes"] / ss[s] / link for s in ("best", "median")}
    above = model_bus > 1 and bus["median"] > 1
    print(f"The switch's busbw is {bus['best']:.0%} of the link's rate"
          + (": above the link, because the factor assumes 1.5 n per NIC and the switch needs "
             "only n." if above else ".")
          + f" Worked out: 2(p-1)/p x n / best = 1.5 x {ss['nbytes'] / 1e6:.2f} MB "
          f"({size}) / {ss['best']:.4f} s = {bus['best'] * link / 1e6:.1f} MB/s, against the "
          f"link's {link / 1e6:.2f} MB/s (by the median {bus['median']:.0%}; closed form "
          f"{model_bus:.0%}).")
    for r in switch:
        assert r["measured"] >= 0.98 * r["model"]  # the emulated network never delivers early
    assert abs(rs["replay"] / rs["model"] - 1) < 0.01  # the green bar: the closed form's links


def shortfall(switch: Sequence[dict], ring4: Sequence[dict]) -> None:
    """When the switch's speed-up over the ring at 4 MiB (by the best) fell short of the closed
    forms', say by how much and what the closed forms leave out (this machine's cost per
    message, likely heavier on the switch's process: inferred, not isolated), and point to the
    4 KiB rows, where that cost shows most: best/model of the switch against the ring's."""
    rs, ss = ex.one(ring4, nbytes=LARGE), ex.one(switch, nbytes=LARGE)
    got, model = rs["best"] / ss["best"], rs["model"] / ss["model"]
    if got >= model:
        return
    small = [r for r in (*switch, *ring4) if r["nbytes"] == SMALL]
    line = (f"The speed-up, {got:.2f}x, fell short of the closed forms' {model:.2f}x. They leave "
            "out this machine's cost per message, likely heavier on the switch's process (a "
            "message per piece and worker each way, adds in Python): inferred, not isolated "
            "by this run.")
    if len(small) == 2:
        sq, rq = (r for r in small if r in switch), (r for r in small if r in ring4)
        sq, rq = next(sq), next(rq)
        s_ratio, r_ratio = sq["measured"] / sq["model"], rq["measured"] / rq["model"]
        line += (f" At 4 KiB, where that cost shows most, best/model was {s_ratio:.2f} for the "
                 f"switch against {r_ratio:.2f} for the ring" + (
                     ": consistent with it." if s_ratio > r_ratio else
                     ": that row does not show it."))
    print(line)


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


# --- On a real GPU cluster ------------------------------------------------------------------

def nvls_template(p: int = 8) -> str:
    """The ledger template (for `facts.show`) of "On a real GPU cluster": the switches that add;
    busbw above the link with NVLS, its plain message first, then, folded, the bytes each way
    per GPU on one `p`-GPU node (ring 2(p-1)/p n, NVLS (1 + 1/p) n) against the maintainer's
    reported NVLS/ring busbw ratio, and the tuner's NVLS efficiency factor."""
    ring, nvls = 2 * (p - 1) / p, 1 + 1 / p
    reported = (facts.get("nccl.h100_nvls_allreduce_busbw").value
                / facts.get("nccl.h100_ring_busbw").value)
    return f"""
- **Switches that add**: the NVSwitches (the switch chips joining the GPUs of an H100 node)
  with [[nvidia.nvswitch_sharp]] (NCCL's NVLS, since [[nccl.nvls_since]]), InfiniBand
  switches with [[nvidia.ib_sharp]], which NCCL reaches through CollNet or, since 2.18, NVLS
  across nodes. With SHARP [[nvidia.sharp_sends_once]] and receives the sum once, as the
  emulated switch's ports did here.
- **busbw above the link**: with NVLS, busbw can exceed the NVLink rate, because nccl-tests'
  factor assumes ring traffic; force the ring to measure the link. nccl-tests applies
  [[nccl.busbw_factor_every_algorithm]] (its n is the rank count, this notebook's p). On 8
  H100s NCCL's NVLS all-reduce reaches, by its maintainer, a peak of about
  [[nccl.h100_nvls_allreduce_busbw]] of busbw, more than a GPU's NVLink carries each way
  ([[nvidia.h100_nvlink_bw_per_direction]]), against [[nccl.h100_ring_busbw]] when forced to
  the ring (arithmetic: fold below).
- **Two nodes**: NCCL usually picks the tree (or NVLSTree); to benchmark the network there,
  set [[nccl.busbw_ring_for_network]].

<details><summary>Why NVLS's busbw is not higher still: the bytes each way</summary>

On {p} GPUs the ring moves 2(p-1)/p n = {ring:g} n over each GPU's NVLink each way, NVLS
[[nccl.nvls_allreduce_traffic]] = {nvls:g} n: a reduce-scatter (send n, receive n/p) plus an
all-gather (send n/p, receive n), so n + n/p each way. By bytes alone NVLS would report
{ring / nvls:.2f}x the ring's busbw; the maintainer's figures give {reported:.2f}x. So NVLS
likely runs below what the bytes alone predict: its NVLink efficiency may be lower, or the
NVSwitch's own reduction and multicast throughput may bind; the figures do not tell which.
NCCL's tuner models the shortfall with a factor of [[nccl.tuner_nvls_efficiency_hopper]] on NVLS's
NVLink bandwidth on Hopper (a cost-model number, not a measured efficiency), none on the
ring's (Simple).
</details>
"""
