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
from clusterlab.lessons.show import fold, ms

SMALL, MEDIUM, LARGE = ex.SIZES


# --- the switch against the ring ------------------------------------------------------------

def medians_close(ring: dict, switch: dict) -> bool:
    """Whether the two medians are within 5 % of each other: within this machine's noise."""
    return abs(ring["median"] / switch["median"] - 1) < 0.05


def explain_switch(switch: Sequence[dict], ring4: Sequence[dict]) -> None:
    """4 MiB on 4 workers: print both best and median times; when the medians are close
    (`medians_close`) but the switch's best is faster, say that by the median this run cannot
    tell; otherwise conclude that the switch beat the ring by both, and print by how much and
    whether even the switch's slowest run (the figure's black line) beat the ring's best. Then
    fold why the speed-up fell short of the closed forms' (`shortfall`), when it did. Asserts
    that no switch run beat its closed form and that the ring's replay (the figure's green bar)
    is its closed form."""
    rs, ss = ex.one(ring4, nbytes=LARGE), ex.one(switch, nbytes=LARGE)
    k, kr = len(ss["times"]), len(rs["times"])
    size = ex.human_bytes(ss["nbytes"])
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
        print(f"By {rs['best'] / ss['best']:.2f}x (best; closed forms "
              f"{rs['model'] / ss['model']:.2f}x: a consistency check of the emulator's own "
              f"switch model). The switch's slowest run (the black line in the figure), "
              f"{ms(slowest)}, was " + (
                  f"faster than the ring's best, {ms(rs['best'])}: the runs do not overlap."
                  if slowest < rs["best"] else
                  f"not faster than the ring's best, {ms(rs['best'])}: the runs overlap."))
    shortfall(switch, ring4)
    for r in switch:
        assert r["measured"] >= 0.98 * r["model"]  # the emulated network never delivers early
    assert abs(rs["replay"] / rs["model"] - 1) < 0.01  # the green bar: the closed form's links


def shortfall(switch: Sequence[dict], ring4: Sequence[dict]) -> None:
    """When the switch's speed-up over the ring at 4 MiB (by the best: the consistency check)
    fell short of the closed forms', fold why: by how much, the speed-up by the median beside
    how far each one's runs spread from best to median (a cost the closed forms leave out;
    the run does not isolate it), and the 4 KiB rows' best/model, switch against ring."""
    rs, ss = ex.one(ring4, nbytes=LARGE), ex.one(switch, nbytes=LARGE)
    got, model = rs["best"] / ss["best"], rs["model"] / ss["model"]
    if got >= model:
        return
    spread = {n: r["median"] / r["best"] - 1 for n, r in (("switch", ss), ("ring", rs))}
    lines = [f"The speed-up by the best, {got:.2f}x, is the consistency check: it fell short of "
             f"the closed forms' {model:.2f}x. By the median it was "
             f"{rs['median'] / ss['median']:.2f}x: the switch's {len(ss['times'])} runs spread "
             f"{spread['switch']:.0%} from best to median, the ring's {spread['ring']:.0%}.",
             "What the closed forms leave out, this run does not isolate. (The switch is one "
             "more process on this machine's cores, and it adds in Python: a message per piece "
             "and worker each way.)"]
    small = [r for r in (*switch, *ring4) if r["nbytes"] == SMALL]
    if len(small) == 2:
        sq = next(r for r in small if r in switch)
        rq = next(r for r in small if r in ring4)
        lines.append(f"At 4 KiB, where a cost per message shows most, best/model was "
                     f"{sq['measured'] / sq['model']:.2f} for the switch against "
                     f"{rq['measured'] / rq['model']:.2f} for the ring.")
    fold("Why the speed-up fell short of the closed forms'", "\n".join(lines))


def explain_switch_busbw(switch: Sequence[dict], *, link: float) -> None:
    """The switch's busbw at 4 MiB by nccl-tests' factor 2(p-1)/p, worked out from the best
    time (the table's statistic) in MB (10^6 bytes, the link rate's unit) and seconds, as a
    share of the link, and by the median and the closed form (above the link: the factor
    assumes 1.5 n per NIC, the switch's NIC carries n)."""
    ss = ex.one(switch, nbytes=LARGE)
    model_bus = 1.5 * LARGE / ss["model"] / link
    bus = {s: 1.5 * ss["nbytes"] / ss[s] / link for s in ("best", "median")}
    above = model_bus > 1 and bus["median"] > 1
    print(f"The switch's busbw is {bus['best']:.0%} of the link's rate"
          + (": above the link, because the factor assumes 1.5 n per NIC and the switch needs "
             "only n." if above else ".")
          + f"\nWorked out: 2(p-1)/p x n / best = 1.5 x {ss['nbytes'] / 1e6:.2f} MB "
          f"({ex.human_bytes(ss['nbytes'])}) / {ss['best']:.4f} s = "
          f"{bus['best'] * link / 1e6:.1f} MB/s, against the link's {link / 1e6:.2f} MB/s (by "
          f"the median {bus['median']:.0%}; closed form {model_bus:.0%}).")


# --- the two timelines -----------------------------------------------------------------------

def plot_timelines(nbytes: int, alpha: float, beta: float, *, p: int = 4):
    """Draw the closed forms as timelines on `p` workers: the ring's 2(p-1) steps, each a chunk
    of n/p on a rank's NIC then one latency (every rank alike); and the switch's, each port
    sending its n up in `ex.in_network_chunks` pieces, the switch sending piece k down once
    every worker's piece k has arrived, one latency after the last. Solid: bytes on the NIC;
    hatched: a latency alpha. Returns the axes."""
    import matplotlib.pyplot as plt

    pieces = ex.in_network_chunks(nbytes)
    chunk, step = nbytes / p * beta, alpha + nbytes / p * beta
    piece = nbytes / pieces * beta
    ring_t = models.allreduce_time("ring", p, nbytes, alpha, beta)
    switch_t = ex.in_network_time(nbytes, alpha, beta, pieces)
    fig, ax = plt.subplots(figsize=(9, 2.4))
    ms_ = 1e3
    for k in range(2 * (p - 1)):  # the ring: reduce-scatter steps, then all-gather steps
        color = "C0" if k < p - 1 else "C2"
        ax.broken_barh([(k * step * ms_, chunk * ms_)], (2.6, 0.8), color=color)
        ax.broken_barh([((k * step + chunk) * ms_, alpha * ms_)], (2.6, 0.8), facecolor="none",
                       edgecolor=color, hatch="///", lw=0.5)
    up = [(j * piece * ms_, piece * ms_) for j in range(pieces)]
    ax.broken_barh(up, (1.3, 0.8), color="C1", edgecolor="w", lw=0.3)
    ax.broken_barh([(nbytes * beta * ms_, alpha * ms_)], (1.3, 0.8), facecolor="none",
                   edgecolor="C1", hatch="///", lw=0.5)
    down = [((alpha + (j + 1) * piece) * ms_, piece * ms_) for j in range(pieces)]
    ax.broken_barh(down, (0.0, 0.8), color="C3", edgecolor="w", lw=0.3)
    ax.broken_barh([((alpha + (pieces + 1) * piece) * ms_, alpha * ms_)], (0.0, 0.8),
                   facecolor="none", edgecolor="C3", hatch="///", lw=0.5)
    for t, y, label in ((ring_t, 3.0, "ring"), (switch_t, 0.4, "switch")):
        ax.axvline(t * ms_, color="k", lw=0.6, ls=":")
        ax.text(t * ms_ + 3, y, f"{label}: {t * ms_:.0f} ms", va="center", fontsize=8)
    ax.set_yticks([3.0, 1.7, 0.4], [f"ring: each rank,\n{2 * (p - 1)} steps of n/{p}",
                                    f"switch: each port up,\n{pieces} pieces",
                                    "switch: each port down"], fontsize=8)
    ax.set(xlabel="ms", xlim=(0, max(ring_t, switch_t) * ms_ * 1.18), ylim=(-0.3, 3.7),
           title=f"Closed forms at {ex.human_bytes(nbytes)} on {p} workers. Solid: bytes on "
                 "the NIC (ring: blue reduce-scatter, green all-gather); hatched: a latency")
    ax.title.set_fontsize(9)
    fig.tight_layout()
    return ax


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


# --- NCCL's protocols and tuner ----------------------------------------------------------------

TUNING_CC = "https://github.com/NVIDIA/nccl/blob/v2.30.7-1/src/graph/tuning.cc"


def protocols_template() -> str:
    """The ledger template (for `facts.show`) of "NCCL's algorithms and protocols": the three
    protocols as a table (line format, data share, what each is for, the tuner's bandwidth
    factor on a ring, and the most data one 400 Gb/s port leaves each, a bound from the line
    format alone), then the tuner, the channels, and how to log and restrict the choice, with
    the log line's format."""
    port = facts.get("nvidia.connectx7_rate_bytes").value  # GB/s
    ll = facts.get("nccl.proto_ll_efficiency").value / 100
    ll128 = facts.get("nccl.proto_ll128_efficiency").value / 100
    rows = [
        ("protocol", "a line: data and flag", "data", "for", "tuner's bandwidth factor, ring",
         "at most, of one [[nvidia.connectx7_rate]] port"),
        ("LL", "one 16-byte store, data and flags interleaved", "[[nccl.proto_ll_efficiency]]",
         "small messages: lowest latency", f"[`busBw * .5`]({TUNING_CC}#L327)",
         f"{port * ll:.1f} GB/s"),
        ("LL128", "128 bytes, the last 8-byte word the flag",
         "[[nccl.proto_ll128_efficiency]]", "medium messages, where supported",
         f"[`busBw * 0.92`]({TUNING_CC}#L328-L329)", f"{port * ll128:.1f} GB/s"),
        ("Simple", "large chunks, a fence, then one ready signal per step", "all",
         "large messages: full bandwidth", "none", f"{port:.1f} GB/s"),
    ]
    table = "\n".join("| " + " | ".join(r) + " |" for r in rows[:1] + [("---",) * 6] + rows[1:])
    return f"""
{table}

- **The tuner** ([[nccl.tuner_model]]) picks algorithm, protocol and channels per call from
  the size, the node count, GPUs per node and the bandwidths. **Channels**: up to
  [[nccl.max_ctas]] per collective.
- **To see the choice**: [[nccl.debug_info]] with [[nccl.debug_subsys_tuning]]; rank 0 then
  logs one line per call, from NCCL 2.24 in the format
  `AllReduce: 4194304 Bytes -> Algo RING proto SIMPLE channel{{Lo..Hi}}={{0..31}}` (the
  numbers an example; 2.20 to 2.23 log numeric codes; INFO alone logs only the set-up). For a
  PyTorch job:
  `NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING torchrun ... train.py`.
- **To restrict it**: [[nccl.algo_env]] and [[nccl.proto_env]], the latter only to rule out a
  suspected bug (NVIDIA: forcing LL128 where it is unsupported can corrupt data).
"""


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
- **Switches that add**: the NVSwitches with [[nvidia.nvswitch_sharp]] (NCCL's NVLS, since
  [[nccl.nvls_since]]); InfiniBand switches with [[nvidia.ib_sharp]] (NCCL's CollNet, or
  NVLS across nodes since 2.18). With SHARP [[nvidia.sharp_sends_once]] and receives the sum
  once, as the emulated switch's ports did here.
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
