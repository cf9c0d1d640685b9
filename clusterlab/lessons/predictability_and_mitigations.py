"""What notebook 04b reads from its runs: step-time spread, the stacked levers, the hierarchy.

The experiments are `jitter_at_scale.predictability`, `jitter_at_scale.mitigations` and
`jitter_at_scale.emulated_allreduce`; the functions here turn their plain data into the
figures, the sentences and the verdicts the learner reads.
"""

from __future__ import annotations

import contextlib
import io
import textwrap

import matplotlib.pyplot as plt
import numpy as np

from clusterlab import facts
from clusterlab.experiments import jitter_at_scale
from clusterlab.experiments.common import conclude
from clusterlab.lessons.show import fold, ms, say
from clusterlab.link import delay_values_ns
from clusterlab.netem import Netem
from clusterlab.wire import segment_count

_COLORS = ("#4C72B0", "#C44E52")


# --- predictability ---------------------------------------------------------------------------


def q(r: dict, k: str) -> float:
    """The estimate of quantile `k` ("p50", "p90", "p99") of one run or simulated point."""
    return r["ci"][k][0]


def moved_more(calm_ci: dict, rough_ci: dict, q_tail: str, q_mid: str) -> bool:
    """Whether the tail quantile moved more than the median even at the ends of both 95 %
    intervals: the tail's smallest possible shift beats the median's largest possible one."""
    return (rough_ci[q_tail][1] - calm_ci[q_tail][2]) > (rough_ci[q_mid][2] - calm_ci[q_mid][1])


def ci_text(t) -> str:
    """An estimate with its 95 % interval, in ms: (0.01, 0.009, 0.012) -> '10.0 ms [9.0 ms,
    12.0 ms]'."""
    est, lo, hi = t
    return f"{ms(est)} [{ms(lo)}, {ms(hi)}]"


def nic_label(nic: str) -> str:
    """A network's label on the figures: 'constant 7.7 ms' for a fixed delay, 'Pareto tail,
    mean 7.7 ms' for netem's Pareto distribution (the raw netem string otherwise)."""
    mean = ms(jitter_at_scale.delay_stats(nic)["mean_s"])
    if "pareto" in nic:
        return f"Pareto tail, mean {mean}"
    return f"constant {mean}" if len(nic.split()) == 2 and nic.startswith("delay") else nic


def plot_predictability(pred: dict, *, calm_nic: str, rough_nic: str) -> None:
    """The figure of the predictability section: the measured step-time histograms of the two
    networks (dashed: each p90) and the simulated p50 and p99 with their 95 % bands up to the
    largest simulated node count."""
    calm, rough = pred["real"][calm_nic], pred["real"][rough_nic]
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4))
    bins = np.linspace(min(calm["step_times"].min(), rough["step_times"].min()) * 1e3,
                       max(calm["step_times"].max(), rough["step_times"].max()) * 1e3, 40)
    for (nic, r), color in zip(pred["real"].items(), _COLORS):
        axes[0].hist(r["step_times"] * 1e3, bins=bins, alpha=0.6, color=color,
                     label=f"{nic_label(nic)} ({r['steps']} steps)")
        axes[0].axvline(r["ci"]["p90"][0] * 1e3, color=color, ls="--")
    axes[0].set_xlabel("step time, ms (dashed: p90)")
    axes[0].set_ylabel("steps")
    axes[0].set_title("measured: 4 real ranks", fontsize=9)
    axes[0].legend(fontsize=8)
    for (nic, rows), color in zip(pred["sim"].items(), _COLORS):
        xs = [r["nodes"] for r in rows]
        for qn, style in (("p50", "-"), ("p99", "--")):
            est, lo, hi = (np.array([r["ci"][qn][i] for r in rows]) * 1e3 for i in range(3))
            axes[1].plot(xs, est, style, color=color, label=f"{qn}, {nic_label(nic)}")
            axes[1].fill_between(xs, lo, hi, color=color, alpha=0.2, lw=0)
    for r, color in zip(pred["real"].values(), _COLORS):   # the run, on the same axes
        axes[1].plot([4], [q(r, "p50") * 1e3], "D", mfc="none", color=color, ms=7)
    axes[1].plot([], [], "kD", mfc="none", label="p50 measured, 4 real ranks")
    axes[1].set_xscale("log", base=2)
    axes[1].set_yscale("log")
    axes[1].set_xlabel(f"nodes ({rows[0]['steps']} steps each; band: 95 % interval)")
    axes[1].set_ylabel("step time, ms")
    axes[1].set_title("simulated (constant delay: p99 lies on p50)", fontsize=9)
    axes[1].legend(fontsize=7)
    fig.suptitle("Same mean delay per message. Simulated: the jitter moves p99 more than the "
                 f"median\n(p90 from {calm['steps']} real steps; p99 only from {rows[0]['steps']} "
                 "simulated)")
    fig.tight_layout()
    plt.show()


def chains_or_coupled(nic: str, nodes: int, *, compute_s: float, nbytes: int = 1 << 16,
                      draws: int = 200, seed: int = 0) -> dict:
    """The median step (s) of a bare model of one synchronous step, compute_s then a ring
    all-reduce of `nbytes` on `nodes` with netem's delays for `nic`, under two rules on the
    SAME draws: "chains", each chunk's 2(N−1) message delays summed independently and the step
    ending with the slowest of the N sums; "coupled", the simulator's rule, in which a rank
    goes on to round s + 1 only once its own round s is done and the chunk from its left has
    arrived, T(j, s+1) = max(T(j, s), T(j−1, s) + D) (docs/models.md, "A ring under jitter").
    A message waits for the last of its segments. A fraction of a second at 256 nodes."""
    table = delay_values_ns(Netem.parse(nic)).astype(float) / 1e9
    k = segment_count(-(-nbytes // nodes))
    rng = np.random.default_rng(seed)
    chains = np.zeros((draws, nodes))
    coupled = np.zeros((draws, nodes))
    for _ in range(2 * (nodes - 1)):
        d = table[rng.integers(0, len(table), size=(draws, nodes, k))].max(axis=2)
        chains = np.roll(chains, 1, axis=1) + d          # chunk from j − 1 moves on to j
        coupled = np.maximum(coupled, np.roll(coupled, 1, axis=1) + d)
    return {"nodes": nodes, "draws": draws,
            "chains_s": compute_s + float(np.median(chains.max(axis=1))),
            "coupled_s": compute_s + float(np.median(coupled.max(axis=1)))}


def predictability_sentence(pred: dict, *, calm_nic: str, rough_nic: str,
                            coupling: dict | None = None) -> str:
    """The measured shift of the median and the p90 on 4 ranks (and whether the p90 moved more
    beyond both intervals), then the simulated p99 / p50 and p99 − p50 on 4 nodes and on the
    largest simulated count."""
    calm, rough = pred["real"][calm_nic], pred["real"][rough_nic]
    sim_r = {r["nodes"]: r for r in pred["sim"][rough_nic]}
    sim_c = {r["nodes"]: r for r in pred["sim"][calm_nic]}
    big, n_real = max(sim_r), rough["steps"]
    # the median's gap, said "at every scale" only where every simulated count from 4 nodes
    # (the counts the sentence compares) shows it
    above = all(q(sim_r[n], "p50") > q(sim_c[n], "p50") for n in sim_r if n in sim_c and n >= 4)
    real_more = moved_more(calm["ci"], rough["ci"], "p90", "p50")
    return (
        f"**Measured on 4 ranks ({n_real} steps per network): the jitter moved the median step "
        f"from {ms(q(calm, 'p50'))} to {ms(q(rough, 'p50'))} and the p90 from {ms(q(calm, 'p90'))} "
        f"to {ms(q(rough, 'p90'))}.** "
        + ("The p90 moved more, by the 95 % intervals (which treat the steps as independent: "
            "appendix)."
           if real_more else f"Whether the p90 moved more, {n_real} steps cannot tell: from the "
           f"95 % intervals the p90's shift is at least "
           f"{ms(rough['ci']['p90'][1] - calm['ci']['p90'][2])} and the median's at most "
           f"{ms(rough['ci']['p50'][2] - calm['ci']['p50'][1])}, and these ranges of the two "
           "shifts overlap (appendix).")
        + f"\n\nSimulated ({sim_r[4]['steps']} steps per point, in this model: independent "
        f"per-message jitter): p99 / p50 = "
        f"{q(sim_r[4], 'p99') / q(sim_r[4], 'p50'):.2f} on 4 nodes and "
        f"{q(sim_r[big], 'p99') / q(sim_r[big], 'p50'):.2f} on {big}, while p99 − p50 grew from "
        f"{ms(q(sim_r[4], 'p99') - q(sim_r[4], 'p50'))} to "
        f"{ms(q(sim_r[big], 'p99') - q(sim_r[big], 'p50'))}: relatively less spread, absolutely "
        "more."
        + (f" The jittery median stays above the calm one at every simulated scale from 4 nodes (×"
        f"{q(sim_r[4], 'p50') / q(sim_c[4], 'p50'):.2f} on 4 nodes, ×"
        f"{q(sim_r[big], 'p50') / q(sim_c[big], 'p50'):.2f} on {big}). "
        + (coupling_sentence(coupling, q(sim_c[big], "p50")) if coupling else
           "No run here separates why (a hypothesis: each rank takes its rounds in order, "
           "which couples the chains).")
           if above else "")
        + " Rare, long events shared by many ranks would not average out like this "
        "(*On a real GPU cluster*).")


def coupling_sentence(coupling: dict, calm_p50_s: float) -> str:
    """Why the jittery median stays up at scale, from `chains_or_coupled` on the same draws,
    each model's median over the simulator's calm median."""
    n = coupling["nodes"]
    return (f"Why: in a bare model of the step ({coupling['draws']} steps, one set of draws "
            f"for both rules), independent chains of {2 * (n - 1)} hops give ×"
            f"{coupling['chains_s'] / calm_p50_s:.2f} on {n} nodes; letting each rank also wait "
            "for its own previous round, as the simulator does, gives ×"
            f"{coupling['coupled_s'] / calm_p50_s:.2f}. That coupling keeps the median up; "
            "only the *relative* spread shrinks.")


def explain_predictability(pred: dict, *, calm_nic: str, rough_nic: str,
                           compute_s: float | None = None, nbytes: int = 1 << 16) -> None:
    """Says what the predictability run showed (`predictability_sentence`), states whether the
    tail moved the measured median beyond both intervals, and checks what the simulator's 400
    steps must resolve: the tail moved p99 more than p50, raised the median at scale, and
    spread the step relatively less but absolutely more on more nodes. Given the run's
    `compute_s` (and `nbytes`), it also runs `chains_or_coupled` at the largest simulated
    count and says which rule reproduces the simulator's median."""
    calm, rough = pred["real"][calm_nic], pred["real"][rough_nic]
    sim_r = {r["nodes"]: r for r in pred["sim"][rough_nic]}
    sim_c = {r["nodes"]: r for r in pred["sim"][calm_nic]}
    big = max(sim_r)
    sim_more = moved_more(sim_c[4]["ci"], sim_r[4]["ci"], "p99", "p50")
    coupling = (None if compute_s is None else
                chains_or_coupled(rough_nic, big, compute_s=compute_s, nbytes=nbytes))
    if coupling is not None:
        # said only if the coupled rule lands near the simulator and the chains do not
        sim_ratio = q(sim_r[big], "p50") / q(sim_c[big], "p50")
        near = abs(coupling["coupled_s"] / q(sim_c[big], "p50") - sim_ratio)
        far = abs(coupling["chains_s"] / q(sim_c[big], "p50") - sim_ratio)
        if not near < 0.1 < far:
            coupling = None
    say(predictability_sentence(pred, calm_nic=calm_nic, rough_nic=rough_nic,
                                coupling=coupling))
    p50c, p50r = calm["ci"]["p50"], rough["ci"]["p50"]
    conclude(p50r[1] > p50c[2],
             "at the same mean delay, the jitter moved the median step (intervals apart)")
    assert sim_more      # the simulator's 400 steps resolve it
    # the slowest path, not the mean, sets the step
    assert q(sim_r[big], "p50") > q(sim_c[big], "p50")
    assert q(sim_r[big], "p99") / q(sim_r[big], "p50") < q(sim_r[4], "p99") / q(sim_r[4], "p50")
    assert q(sim_r[big], "p99") - q(sim_r[big], "p50") > q(sim_r[4], "p99") - q(sim_r[4], "p50")


# --- mitigations ------------------------------------------------------------------------------


def labels(mit: dict) -> dict:
    """Each configuration's label on the figures, with the bucket caps and the accumulation
    factor read from the run."""
    caps = {k: v["bucket_cap_mb"] for k, v in mit["real"].items()}
    k_acc = mit["config"]["accumulate"]
    return {"baseline": f"baseline\n(cap {caps['baseline']:g} MiB)", "overlap": "+ overlap",
            "bigger buckets": f"+ bigger buckets\n(cap {caps['bigger buckets']:g} MiB, no "
                              "overlap left)",
            "fewer syncs": f"+ fewer syncs\n(×{k_acc} batch: not the same training)",
            "hierarchical": "hierarchical, 8/node", "ring, 8 per node": "flat ring, 8/node"}


def plot_mitigations(mit: dict) -> None:
    """The levers' figure: the measured median samples per second per rank of each stacked
    configuration (whiskers: 25th to 75th percentile of the steps) and each one's simulated
    scaling efficiency to 1024 ranks."""
    real, sim = mit["real"], mit["sim"]
    label = labels(mit)
    names = list(real)   # the stacking order: baseline, overlap, bigger buckets, fewer syncs
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [1.2, 1]})
    mid = np.array([real[k]["samples_per_s_per_rank"] for k in names])   # the median step's rate
    per_step = [np.asarray(real[k]["step_samples_per_s_per_rank"], dtype=float) for k in names]
    whisk = [np.maximum(mid - [np.percentile(s, 25) for s in per_step], 0),
             np.maximum([np.percentile(s, 75) for s in per_step] - mid, 0)]
    axes[0].bar([label[k] for k in names], mid, yerr=whisk, capsize=4,
                color=["#999999", "#DD8452", "#55A868", "#8172B2"])
    axes[0].set_ylabel("samples / s per rank")
    axes[0].set_title(f"measured: DDP, 4 ranks, delay 2ms, stacked\n(median of "
                      f"{real['baseline']['steps']} steps; whiskers: 25th to 75th percentile)",
                      fontsize=9)
    axes[0].tick_params(axis="x", labelsize=8, rotation=15)
    measured = measured_efficiency(mit)
    for name in names:
        rows = sim[name]
        dashed = name == "fewer syncs"   # k× the global batch: not the same training
        line, = axes[1].plot([r["nodes"] for r in rows], [100 * r["efficiency"] for r in rows],
                             "o--" if dashed else "o-", ms=3,
                             label=label[name].replace("\n", " "))
        axes[1].plot([mit["config"]["nodes"]], [100 * measured[name]], "D", mfc="none", ms=7,
                     color=line.get_color())
    axes[1].plot([], [], "kD", mfc="none", label=f"measured, {mit['config']['nodes']} ranks "
                 "(also pays this host's optimizer step)")
    axes[1].set_xscale("log", base=2)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("ranks, one per node")
    axes[1].set_ylabel("scaling efficiency, %")
    axes[1].set_title("simulated (diamonds: measured)", fontsize=9)
    axes[1].legend(fontsize=7, loc="lower left")
    fig.suptitle("On this latency-only network at scale, the lever that cuts the most latency "
                 "rounds moves the curve most")
    fig.tight_layout()
    plt.show()


def measured_efficiency(mit: dict) -> dict:
    """Each measured configuration's scaling efficiency as the simulator defines it (compute
    time per sample over step time per sample: the measured forward and backward of the
    baseline, `config["compute_s"]`), from its median samples per second per rank; the
    samples per step come from the baseline, whose rate is samples per step over its step."""
    real = mit["real"]
    batch = real["baseline"]["samples_per_s_per_rank"] * real["baseline"]["step_s"]
    return {k: v["samples_per_s_per_rank"] * mit["config"]["compute_s"] / batch
            for k, v in real.items()}


def factor_at_scale(mit: dict) -> dict:
    """Each lever's simulated efficiency at the largest rank count over the configuration before
    it in the stack; the hierarchy's over the flat ring with the same 8-per-node layout."""
    order, sim = list(mit["real"]), mit["sim"]
    end = {k: rows[-1]["efficiency"] for k, rows in sim.items()}
    factor = {k: end[k] / end[prev] for prev, k in zip(order, order[1:])}
    # the hierarchy against the flat ring with the same 8-per-node layout
    factor["hierarchical"] = end["hierarchical"] / end["ring, 8 per node"]
    return factor


def verdict(g: dict) -> str:
    """How well the steps resolve one lever (a `jitter_at_scale.stacked_gains` row): 'resolved',
    'slower' or 'within noise'."""
    return "resolved" if g["resolved"] else "slower" if g["worse"] else "within noise"


def levers_sentence(mit: dict, gains: dict, factor: dict) -> str:
    """Each lever's measured gain over the one before it (with its verdict when not resolved)
    and its simulated factor at 1024 ranks, each configuration's measured over simulated
    efficiency at the measured rank count, then why bigger buckets lead at scale."""
    order = list(mit["real"])
    k_acc = mit["config"]["accumulate"]
    sim_buckets = mit["config"]["sim_buckets"]          # the measured DDP buckets, simulated as is
    n_small, n_big = len(sim_buckets["overlap"]), len(sim_buckets["bigger buckets"])
    n_a, _ = gains["overlap"]["steps"]
    marked = [k for k in order[1:] if not gains[k]["resolved"]]
    resolved = [gains[k]["beats"] for k in order[1:] if gains[k]["resolved"]]
    nodes = mit["config"].get("nodes")
    ratio = measured_over_simulated(mit) if nodes is not None else {}
    return (f"**Each lever over the one before it, measured on 4 ranks ({n_a} steps each):** "
            + ", ".join(f"{k} ×{1 + gains[k]['gain']:.2f}"
                        + ("" if gains[k]["resolved"] else f" ({verdict(gains[k])})")
                        for k in order[1:])
            + ((", each *resolved*" if not marked else "; the unmarked ones *resolved*")
               + (" (faster than the one before on every pair of steps; resolving needs at "
                  "least 90 % of pairs; appendix 2)"
                  if min(resolved) >= 1 else f" (faster than the one before on at least "
                  f"{min(resolved):.0%} of step pairs; appendix 2)") if resolved else "")
            + ". **Simulated at 1024 ranks:** "
            + ", ".join(f"{k} ×{factor[k]:.1f}" for k in order[1:])
            + " (for fewer syncs, samples per second at a ×" + f"{k_acc} global batch, not time "
            "to train: see 04c)."
            + f"\n\nBigger buckets lead at scale because they *are* fewer rounds: {n_small} "
            f"buckets → {n_big}, where fewer syncs cuts the rounds per sample by {k_acc}. On a "
            f"real fabric (µs hops, not `{mit['config']['nic']}`) the exchange takes "
            "milliseconds, not seconds, so there the ranking also depends on the backward's "
            "length and on the bytes: once the exchange is bandwidth-bound, bigger buckets gain "
            "little and give up overlap (notebook 03 measures that trade)."
            # a consistency check of the runs against the simulator: off the main path
            + ("\n\n<details><summary>Consistency check: measured over simulated efficiency"
               "</summary>\n\n"
               f"Measured over simulated efficiency at {nodes} ranks: "
               + ", ".join(f"{k} ×{ratio[k]:.2f}" for k in order)
               + " (the measured steps also pay this host's optimizer step).\n</details>"
               if ratio else ""))


def measured_over_simulated(mit: dict) -> dict:
    """Each configuration's measured scaling efficiency (`measured_efficiency`) over the
    simulated one at the measured rank count."""
    nodes = mit["config"]["nodes"]
    sim = {k: {r["nodes"]: r["efficiency"] for r in rows} for k, rows in mit["sim"].items()}
    return {k: e / sim[k][nodes] for k, e in measured_efficiency(mit).items()}


def explain_levers(mit: dict, gains: dict, factor: dict) -> None:
    """Says what the stacked levers showed (`levers_sentence`), states the two measured
    verdicts (bigger buckets resolved; no lever slower), and checks the simulated ranking:
    bigger buckets lead at scale, by no more than their fewer buckets allow."""
    real = mit["real"]
    order = list(real)
    caps = {k: v["bucket_cap_mb"] for k, v in real.items()}
    sim_buckets = mit["config"]["sim_buckets"]
    n_small, n_big = len(sim_buckets["overlap"]), len(sim_buckets["bigger buckets"])
    say(levers_sentence(mit, gains, factor))
    conclude(gains["bigger buckets"]["resolved"],
             "bigger buckets raised the measured throughput beyond the step-to-step noise")
    conclude(not [k for k in order[1:] if gains[k]["worse"]],
             "no stacked lever measured slower than the configuration before it")
    assert caps["bigger buckets"] == facts.get("pytorch.ddp_bucket_cap_mb").value   # DDP's default
    assert caps["baseline"] < caps["bigger buckets"] and n_small > n_big == 1
    # the ranking by latency rounds
    assert factor["bigger buckets"] == max(factor[k] for k in order[1:])
    assert factor["bigger buckets"] <= n_small / n_big + 1e-9   # fewer rounds, no more than that
    assert [len(sim_buckets[k]) for k in ("baseline", "bigger buckets")] == [
        len(real["baseline"]["bucket_sizes"]), len(real["bigger buckets"]["bucket_sizes"])]
    assert factor["overlap"] < 1.1


# --- hierarchy --------------------------------------------------------------------------------


def network_latencies(hn: int, hp: int) -> tuple[float, int]:
    """The network latencies the replay on `hn` nodes × `hp` processes counts: the flat ring's
    (mean over the chain's start) and the hierarchy's 2(hn − 1)."""
    return 2 * hn * (hn * hp - 1) / (hn * hp), 2 * (hn - 1)


def plot_hierarchy(mit: dict) -> None:
    """The hierarchy's figure: measured all-reduce per step, flat and hierarchical, on the small
    cluster (bars) against the emulator's replay alone (marks), and both schemes' simulated
    scaling efficiency with 8 ranks per node."""
    hier, sim, label = mit["hierarchical"], mit["sim"], labels(mit)
    hn, hp = mit["config"]["hier_nodes"], mit["config"]["hier_ppn"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [0.8, 1.3]})
    axes[0].bar(["flat ring", "hierarchical"], [hier["ring"]["comm_s"] * 1e3,
                                                hier["hierarchical"]["comm_s"] * 1e3],
                color=["#999999", "#4C72B0"], label="measured (Gloo + this host)")
    axes[0].plot(["flat ring", "hierarchical"], [hier["ring"]["emulated_s"] * 1e3,
                                                 hier["hierarchical"]["emulated_s"] * 1e3],
                 "k_", ms=40, mew=2, label="emulator's replay alone")
    axes[0].set_ylabel("all-reduce per step, ms")
    axes[0].set_title(f"{hn} nodes × {hp} processes (consistency check)", fontsize=9)
    axes[0].set_ylim(0, 1.35 * hier["ring"]["comm_s"] * 1e3)
    axes[0].legend(fontsize=7, loc="upper right", markerscale=0.3)
    for name in ("ring, 8 per node", "hierarchical"):
        rows = sim[name]
        axes[1].plot([r["nodes"] for r in rows], [100 * r["efficiency"] for r in rows], "o--",
                     ms=3, label=label[name] + ", big buckets")
    axes[1].set_xscale("log", base=2)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("ranks, 8 per node")
    axes[1].set_ylabel("scaling efficiency, %")
    ranks = max(r["nodes"] for r in sim["hierarchical"])
    _, flat_net, _ = net_hops(ranks // 8, 8)
    axes[1].set_title(f"simulated, 8 ranks per node: only {flat_net} of {2 * (ranks - 1)} hops "
                      f"cross the network\n(not comparable with the levers' figure, where all "
                      f"do)", fontsize=9)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    plt.show()


def one_allreduce_each(mit: dict, *, fast_in: str, near_in: str | None = None) -> dict:
    """One all-reduce of the model's gradients (one big bucket) at the largest simulated rank
    count, 8 ranks per node, in seconds (the emulator's replay alone): flat ring and
    hierarchical, with the course's intra-node link, with `fast_in` and (if given) with
    `near_in`; keyed by (intra-node link, algorithm)."""
    ranks = max(r["nodes"] for r in mit["sim"]["hierarchical"])
    gradients = sum(mit["config"]["sim_buckets"]["bigger buckets"])
    intras = (mit["config"]["hier_intra"], fast_in) + ((near_in,) if near_in else ())
    return {(intra, a): jitter_at_scale.emulated_allreduce(ranks // 8, 8, mit["config"]["nic"],
                                                           intra, a, gradients)
            for intra in intras for a in ("ring", "hierarchical")}


def nccl_ratio_link(mit: dict) -> str:
    """An intra-node link whose delay stands to the network's as NCCL's tuner latency of an
    NVLink ring step to a network one (Simple). Those are selection constants, not measured
    hops; the link shows the case where intra-node hops are not negligible against the
    network's, which `delay 1us` against `delay 2ms` hides."""
    t_net = jitter_at_scale.delay_stats(mit["config"]["nic"])["configured_s"]
    ratio = (facts.get("nccl.tuner_nvlink_ring_step_latency_simple").value
             / facts.get("nccl.tuner_net_ring_step_latency_simple").value)
    return f"delay {round(t_net * ratio * 1e6)}us"


def hierarchy_intra_hops(p: int) -> int:
    """Hops inside a node on the hierarchy's longest chain with `p` ranks per node: a
    binomial reduce to the leader and a binomial broadcast back, ceil(log2 p) rounds each."""
    return 2 * (p - 1).bit_length() if p > 1 else 0


def hierarchy_sentence(mit: dict, one: dict, factor: dict, *, fast_in: str,
                       near_in: str | None = None) -> str:
    """The simulated gain at the largest rank count; a table of one all-reduce there, flat and
    hierarchical (network hops and hops inside nodes on the longest chain, the time with the
    course's intra-node link and with `fast_in`); the latency ratio's estimate against the
    replay; the replay's and Gloo's flat and hierarchical all-reduce on the small cluster;
    then, folded and rendered with its sources, what NCCL's tuner constants would say if they
    were hop latencies (they are not)."""
    hier, sim = mit["hierarchical"], mit["sim"]
    hn, hp = mit["config"]["hier_nodes"], mit["config"]["hier_ppn"]
    slow_in = mit["config"]["hier_intra"]
    ranks = max(r["nodes"] for r in sim["hierarchical"])
    nodes = ranks // 8
    lat = jitter_at_scale.delay_stats(mit["config"]["hier_nic"])["configured_s"]
    ring_lat, hier_lat = network_latencies(hn, hp)
    _, flat_net, hier_net = net_hops(nodes, 8)
    per = {a: np.asarray(hier[a]["comm_per_step_s"]) for a in ("ring", "hierarchical")}
    est = latency_ratio_gain(mit, fast_in=fast_in)
    vanishes = one[fast_in, "ring"] < 1.05 * one[fast_in, "hierarchical"]
    # a third link at NCCL's tuner ratio, so the verdict is not read only at µs against ms
    near = ""
    if near_in:
        near_gain = one[near_in, "ring"] / one[near_in, "hierarchical"] - 1
        near = (f"With `{near_in}` inside (the ratio of NCCL's tuner constants for an NVLink "
                f"and a network ring step, {est['nccl'] / 7:.2f}; selection constants, not "
                f"measured hops), the ratio gives {est['nccl']:.1f} and the replay "
                f"{near_gain:.1f}: in that model the flat ring's hops inside nodes would be most "
                "of its latency. These sources do not give the real ratio of hop latencies.\n\n")
    what_if = facts.render(
        "If the tuner's constants were hop latencies, "
        "[[nccl.tuner_nvlink_ring_step_latency_simple]] per NVLink ring step against "
        "[[nccl.tuner_net_ring_step_latency_simple]] per network step (Simple), "
        f"(p − 1)·t_intra / t_net would be {est['nccl']:.1f}, and a hierarchy would save most "
        "of a large flat ring's latency. They are selection constants: on a multi-node ring the "
        "tuner charges each intra-node step at least a per-step network overhead, "
        "[[nccl.tuner_ring_intra_step_amd]] on AMD hosts (appendix 3), a pacing term rather "
        "than a measured hop. NCCL's own hierarchical algorithms are its Tree, in which "
        "[[nccl.tree_intra_node_chain]], and [[nccl.nvlstree_two_level]]; its tuner may pick "
        "them at latency-bound sizes. For large messages bytes decide instead, and a leader "
        "hierarchy sends a node's bytes through one NIC, so it can lose (*On a real GPU "
        "cluster*).", one_per_source=True)
    return (
        f"**Simulated at {ranks} ranks ({nodes} nodes × 8) the hierarchy gains "
        f"×{factor['hierarchical']:.2f} in training throughput with `{slow_in}` inside a node "
        f"(one all-reduce alone: ×{one[slow_in, 'ring'] / one[slow_in, 'hierarchical']:.2f}, "
        "table)"
        + (f", and almost nothing with `{fast_in}`" if vanishes else "")
        + ": it skips the flat ring's hops inside the nodes and keeps almost all of its network "
        "crossings.**\n\n"
        f"| one all-reduce, {ranks} ranks | network hops | hops inside nodes | `{slow_in}` inside "
        f"| `{fast_in}` inside |\n|---|---|---|---|---|\n"
        f"| flat ring | {flat_net} | {2 * (ranks - 1) - flat_net} | {one[slow_in, 'ring']:.3f} s "
        f"| {one[fast_in, 'ring']:.3f} s |\n"
        f"| hierarchical | {hier_net} | {hierarchy_intra_hops(8)} "
        f"| {one[slow_in, 'hierarchical']:.3f} s | {one[fast_in, 'hierarchical']:.3f} s |\n\n"
        f"(hops on the longest chain, which a synchronous all-reduce waits for: appendix). The "
        f"latency ratio (p − 1)·t_intra / t_net predicts the saving: {est[slow_in]:.3f} of the "
        f"network latency at `{slow_in}` (the replay, arithmetic on the same model: "
        f"{one[slow_in, 'ring'] / one[slow_in, 'hierarchical'] - 1:.3f}), {est[fast_in]:.4f} at "
        f"`{fast_in}`.\n\n"
        f"Measured on {hn} × {hp} (network `{mit['config']['hier_nic']}`): the replay takes "
        f"{ms(hier['ring']['emulated_s'])} flat against {ms(hier['hierarchical']['emulated_s'])} "
        f"hierarchical ({ring_lat:.0f} against {hier_lat} network latencies of {ms(lat)}); "
        f"through Gloo and this host, {ms(hier['ring']['comm_s'])} and "
        f"{ms(hier['hierarchical']['comm_s'])} (means of {hier['ring']['steps']} steps each, "
        f"ranging {ms(per['ring'].min())} to {ms(per['ring'].max())} and "
        f"{ms(per['hierarchical'].min())} to {ms(per['hierarchical'].max())}). This run "
        f"tests the network crossing the hierarchy saves, not the formula (above).\n\n"
        "**The rule:** a hierarchy gains about (p − 1)·t_intra / t_net; here t_net is "
        "milliseconds, so the gain is small. On a real cluster, measure both hop latencies "
        "before deciding; for a bandwidth-bound exchange, prefer NCCL's rings, which use every "
        "NIC, over a leader hierarchy."
        "\n\n<details><summary>In NCCL's cost model: a what-if, and NCCL's own hierarchies"
        "</summary>\n\n" + near + what_if + "\n</details>")


def latency_ratio_gain(mit: dict, *, fast_in: str) -> dict:
    """What a hierarchy saves, as a share of the network's latency, by the latency ratio alone:
    (p − 1)·t_intra / t_net with p = 8 ranks per node, for the course's intra-node link, for
    `fast_in`, and ("nccl") for NCCL's tuner latencies of an NVLink and a network ring step
    (Simple; the tuner charges each intra-node step at least that)."""
    t_net = jitter_at_scale.delay_stats(mit["config"]["nic"])["configured_s"]
    out = {i: 7 * jitter_at_scale.delay_stats(i)["configured_s"] / t_net
           for i in (mit["config"]["hier_intra"], fast_in)}
    out["nccl"] = (7 * facts.get("nccl.tuner_nvlink_ring_step_latency_simple").value
                   / facts.get("nccl.tuner_net_ring_step_latency_simple").value)
    return out


def explain_hierarchy(mit: dict, one: dict, factor: dict, *, fast_in: str,
                      near_in: str | None = None) -> None:
    """Says what the hierarchy showed (`hierarchy_sentence`), checks that the replay counts the
    diagram's network latencies and that a fast intra-node link nearly erases the gain, and
    states whether the replay's fewer latencies showed through Gloo and this host."""
    hier, sim = mit["hierarchical"], mit["sim"]
    hn, hp = mit["config"]["hier_nodes"], mit["config"]["hier_ppn"]
    end = {k: rows[-1]["efficiency"] for k, rows in sim.items()}
    lat = jitter_at_scale.delay_stats(mit["config"]["hier_nic"])["configured_s"]
    ring_lat, hier_lat = network_latencies(hn, hp)
    say(hierarchy_sentence(mit, one, factor, fast_in=fast_in, near_in=near_in))
    assert end["hierarchical"] >= end["ring, 8 per node"]
    assert one[fast_in, "ring"] < 1.05 * one[fast_in, "hierarchical"]   # "nearly vanishes"
    # the latency ratio gives the replay's gain (the flat ring's longest chain also crosses the
    # network twice more than the hierarchy's 2(nodes − 1): 1/(nodes − 1) on top)
    est = latency_ratio_gain(mit, fast_in=fast_in)
    nodes = max(r["nodes"] for r in sim["hierarchical"]) // 8
    for intra in (mit["config"]["hier_intra"], fast_in):
        gain = one[intra, "ring"] / one[intra, "hierarchical"] - 1
        assert abs(gain - est[intra]) < 2 / (nodes - 1)
    if near_in:   # the link at NCCL's ratio: the replay's gain is the ratio's (link rounded to µs)
        gain = one[near_in, "ring"] / one[near_in, "hierarchical"] - 1
        assert abs(gain - est["nccl"]) < 2 / (nodes - 1) + 0.01
    # the replay counts the network latencies of the diagram above
    assert (hier["ring"]["emulated_s"] - hier["hierarchical"]["emulated_s"]
            > 0.9 * (ring_lat - hier_lat) * lat)
    conclude(hier["hierarchical"]["comm_s"] < hier["ring"]["comm_s"],
             "the replay's fewer network latencies showed through Gloo and this host on 2 × 2")


# --- appendix ---------------------------------------------------------------------------------


def net_hops(n: int, p: int) -> tuple[float, int, int]:
    """Network hops of one all-reduce on `n` nodes × `p` ranks: the flat ring's mean over the
    chain's start, the flat ring's longest chain, and the hierarchy's."""
    r = n * p
    longest = 2 * (n - 1) if p == 1 else 2 * n - 1 if p == 2 else 2 * n
    return 2 * n * (r - 1) / r, longest, 2 * (n - 1)


def accumulation_bound(step_s: float, wait_s: float, k: int) -> float:
    """The throughput gain from skipping k − 1 of every k exchanges of `wait_s` in a step of
    `step_s`: k·step / (k·step − (k − 1)·wait) − 1."""
    return k * step_s / (k * step_s - (k - 1) * wait_s) - 1


def accumulation_measured(step_s: float, local_s: float, k: int) -> float:
    """The throughput gain of k micro-batches per exchange when the k − 1 local micro-steps
    take `local_s` in all (as measured) and the synced one `step_s`: k·step / (step + local)
    − 1."""
    return k * step_s / (step_s + local_s) - 1


@contextlib.contextmanager
def _folded(summary: str):
    """Collect what the block prints and show it behind a fold titled `summary`: the appendix
    reads as three one-line summaries, each opened on demand. Long prose lines are wrapped (a
    code block in Markdown does not wrap them) under their own indentation; table rows (runs of
    spaces between columns) are kept whole."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        yield
    lines = []
    for line in buf.getvalue().strip("\n").splitlines():
        indent = line[:len(line) - len(line.lstrip())]
        lines.append(textwrap.fill(line, width=100, subsequent_indent=indent + "  ")
                     if len(line) > 100 and "   " not in line.strip() else line)
    fold(summary, "\n".join(lines), pre=True)


def appendix(pred: dict, mit: dict, gains: dict, factor: dict, one: dict, *, calm_nic: str,
             rough_nic: str, fast_in: str) -> None:
    """Prints the details behind each section: the measured p50 and p90 with their intervals,
    each lever's pairs won and simulated factor, DDP's first bucket, the accumulation gain from
    the exchange alone and with the local micro-steps as measured, and the network hops of one
    all-reduce (with NCCL's tuner count) with the flat and hierarchical times at the largest
    rank count (and checks that these times differ by the flat ring's intra-node hops). Each
    item sits behind its own fold."""
    with _folded("1. Predictability: p50 and p90 with their 95 % intervals"):
        _appendix_predictability(pred, calm_nic=calm_nic, rough_nic=rough_nic)
    with _folded("2. Levers: pairs won, DDP's first bucket, what fewer syncs gains"):
        _appendix_levers(mit, gains, factor)
    with _folded("3. Network hops in one all-reduce, and NCCL's tuner count"):
        _appendix_hops(mit, one, fast_in=fast_in)


def _appendix_predictability(pred: dict, *, calm_nic: str, rough_nic: str) -> None:
    sim_r = {r["nodes"]: r for r in pred["sim"][rough_nic]}
    sim_c = {r["nodes"]: r for r in pred["sim"][calm_nic]}
    n_real = pred["real"][rough_nic]["steps"]
    print(f"1. Predictability, 4 real ranks, {n_real} steps per network (95 % intervals, "
          "treating the steps as independent):")
    for nic, r in pred["real"].items():
        print(f"   {nic:34s} p50 {ci_text(r['ci']['p50'])}   p90 {ci_text(r['ci']['p90'])}")
    print(f"   simulated, 4 nodes ({sim_r[4]['steps']} steps): the tail raised p50 by "
          f"{ms(q(sim_r[4], 'p50') - q(sim_c[4], 'p50'))} and p99 by "
          f"{ms(q(sim_r[4], 'p99') - q(sim_c[4], 'p99'))}")


def _appendix_levers(mit: dict, gains: dict, factor: dict) -> None:
    real = mit["real"]
    order, label, k_acc = list(real), labels(mit), mit["config"]["accumulate"]
    n_a, n_b = gains["overlap"]["steps"]
    caps_big = real["bigger buckets"]["bucket_cap_mb"]
    model_mib = mit["config"]["model_bytes"] / 2**20
    bb = real["bigger buckets"]        # accumulation skips k - 1 of every k exchanges of this step
    acc_bound = accumulation_bound(bb["step_s"], bb["wait_s"], k_acc)
    fs = real["fewer syncs"]
    local_each = fs["local_s"] / (k_acc - 1)       # one local micro-step, as measured
    outside = bb["step_s"] - bb["wait_s"]          # a synced step outside its exchange
    acc_local = accumulation_measured(bb["step_s"], fs["local_s"], k_acc)
    print(f"2. Levers, measured on 4 ranks ({n_a} steps each; 'resolved' = won >= 90 % of the "
          f"{n_a} x {n_b} step pairs, a rough test: it treats consecutive steps as "
          f"independent):")
    for k in order[1:]:
        print(f"   {label[k].replace(chr(10), ' '):48s} ×{1 + gains[k]['gain']:.2f}  pairs won "
              f"{gains[k]['beats']:6.1%} ({verdict(gains[k])})  simulated 1024 ranks "
              f"x{factor[k]:.1f}")
    first = facts.get("pytorch.ddp_first_bucket")
    print(f"   bigger buckets: the cap of {caps_big:g} MiB passed explicitly gives one bucket for "
          f"the whole {model_mib:.2f} MiB model in the installed torch; left unset, DDP would "
          f"split off a {first.text} first bucket (ledger: {first.id}).")
    print(f"   fewer syncs skips {k_acc - 1} in {k_acc} exchanges of {ms(bb['wait_s'])} per "
          f"{ms(bb['step_s'])} step: {acc_bound:+.0%} from the exchange alone. Each local "
          f"micro-step took {ms(local_each)}, {ms(abs(outside - local_each))} "
          f"{'less' if local_each < outside else 'more'} than a synced step outside its "
          f"exchange ({ms(outside)}; the local steps also skip the optimizer step, "
          f"{ms(bb['optimizer_s'])}, and DDP's bucket work): with them as measured, "
          f"{acc_local:+.0%} (measured {gains['fewer syncs']['gain']:+.0%}).")


def _appendix_hops(mit: dict, one: dict, *, fast_in: str) -> None:
    sim = mit["sim"]
    ranks = max(r["nodes"] for r in sim["hierarchical"])
    nodes_h, R = ranks // 8, ranks
    slow_in = mit["config"]["hier_intra"]
    hn, hp = mit["config"]["hier_nodes"], mit["config"]["hier_ppn"]
    intra_hops = 2 * (R - 1) - net_hops(nodes_h, R // nodes_h)[1]   # on the longest chain
    print("3. Network hops in one all-reduce. The flat ring passes each chunk along a chain of "
          "2(R - 1) hops (ranks numbered node by node); a synchronous all-reduce waits for the "
          "longest chain:")
    print(f"   {'nodes x ranks':14s} {'flat, longest':>14s} {'hierarchy':>10s} "
          f"{'NCCL tuner, ring':>17s}")
    for n, p in ((hn, hp), (nodes_h, R // nodes_h)):
        _, long_h, hier_h = net_hops(n, p)
        print(f"   {f'{n} x {p}':14s} {long_h:14d} {hier_h:10d} {2 * (n - 1):17d}")
    # NCCL's tuner (v2.30.7 ncclTopoTuneModel): 2(nodes - 1) network steps; each other step
    # max(intra-node latency, a per-step network overhead), at least the NVLink latency
    steps_all, steps_net = 2 * (R - 1), 2 * (nodes_h - 1)
    nv = facts.get("nccl.tuner_nvlink_ring_step_latency_simple").value * 1e-6
    net = facts.get("nccl.tuner_net_ring_step_latency_simple").value * 1e-6
    print(f"   NCCL's tuner (ledger: nccl.tuner_ring_inter_steps) charges the network latency on "
          f"2(nodes - 1) of the ring's 2(R - 1) steps, the count with one rank per node, and on "
          f"each of the other {steps_all - steps_net} (at {ranks} ranks) the intra-node latency "
          f"or a per-step network overhead, whichever is larger. With Simple that is at least "
          f"{nv * 1e6:g} us a step against {net * 1e6:g} us (plus the topology's inter-node "
          f"latency, zero with NCCL's built-in transports): {ms((steps_all - steps_net) * nv)} "
          f"against {ms(steps_net * net)}, so in NCCL's model too the intra-node steps are most "
          "of a large ring's latency.")
    print(f"   Hierarchy at {ranks} ranks ({nodes_h} nodes x 8): the flat ring's longest chain "
          f"has {intra_hops:.0f} intra-node hops, 2(R - 1) minus its "
          f"{net_hops(nodes_h, R // nodes_h)[1]} network crossings (NCCL's "
          f"{steps_all - steps_net} above subtract 2(nodes - 1), the crossings with one rank per "
          "node). One all-reduce, flat vs hierarchical:")
    for intra in (slow_in, fast_in):
        print(f"   intra-node `{intra}`: {one[intra, 'ring']:.3f} s vs "
              f"{one[intra, 'hierarchical']:.3f} s")
    gap = {i: one[i, "ring"] - one[i, "hierarchical"] for i in (slow_in, fast_in)}
    assert (gap[slow_in] > 10 * gap[fast_in]
            and one[fast_in, "ring"] < 1.05 * one[fast_in, "hierarchical"])
    d_intra = (jitter_at_scale.delay_stats(slow_in)["configured_s"]
               - jitter_at_scale.delay_stats(fast_in)["configured_s"])
    assert (abs((one[slow_in, "ring"] - one[fast_in, "ring"]) - intra_hops * d_intra)
            < 0.1 * intra_hops * d_intra)


# --- on a real GPU cluster --------------------------------------------------------------------

_NVLS_OVER_RING = (facts.get("nccl.h100_nvls_allreduce_busbw").value
                   / facts.get("nccl.h100_ring_busbw").value)

REAL_CLUSTER = f"""
- **Real tails also come from rare long events, slow ranks and shared causes**, which
  independent per-message jitter does not produce. Over TCP (Gloo's transport) a lost packet
  is usually detected without a timeout ([[linux.tcp_recovery_default]] loss detection, on
  by default); a retransmission *timeout* costs at least [[linux.tcp_rto_min]]; over
  InfiniBand, NCCL at its defaults gives up on an unreachable peer NIC or link only after
  about [[nccl.ib_total_wait_default]] (the transport's retry budget, not an application
  timeout).
  In Llama 3's pre-training, [[meta.llama3_stragglers]], and the run saw
  [[meta.llama3_diurnal_throughput]].
  Time each rank and compare ranks (Megatron-LM's [[megatron.straggler_detector]] reports the
  slowest and fastest rank per logging interval) rather than averaging over them.
- **A leader-based hierarchy funnels a node's inter-node bytes through one NIC.** A DGX H100 has
  [[nvidia.dgx_h100_compute_nics]] for its compute fabric, one per GPU, so on a bandwidth-bound
  all-reduce that scheme loses. NCCL's ring algorithm uses every NIC: per its maintainer (NCCL
  2.x on NVLink nodes with several NICs), its rings run as [[nccl.ring_flows_per_nic]].

<details><summary>More: in-network reduction and busbw, fewer syncs beyond accumulation, what bigger buckets cost</summary>

- **In-network reduction cuts bytes as well as rounds.** With [[nvidia.ib_sharp]] in InfiniBand
  switches or [[nvidia.nvswitch_sharp]] (NVLS) in an NVSwitch, [[nvidia.sharp_sends_once]] and
  receives the sum once, instead of about twice its data each way in a ring (notebook 02c).
  **Bus bandwidth** (busbw) is nccl-tests' per-GPU rate normalised to a ring: algbw (message
  size / time) × [[nccl.busbw_factor_every_algorithm]] (notebook 02b). On 8 H100s NCCL's
  NVLS all-reduce peaks at about [[nccl.h100_nvls_allreduce_busbw]] of busbw, against the
  ring's [[nccl.h100_ring_busbw]], both at large sizes:
  there NVLS is about ×{_NVLS_OVER_RING:.1f} as fast. But its busbw is not traffic on the
  wire: it exceeds the ring's, the link's effective rate, because each GPU sends its data
  once.
- **Fewer syncs** beyond accumulation: local SGD runs [[paper.local_sgd_stich2018]]; DiLoCo
  takes [[paper.diloco]] with an outer optimizer.
- **Bigger buckets cost overlap.** They save only per-call latency and launch overhead, never
  bytes; DDP [[pytorch.ddp_buckets_reduced_in_order]] once their gradients are ready, so a
  bigger bucket starts later in backward (notebook 03).
</details>
"""  # noqa: E501
"""What carries over to a real GPU cluster, each constant cited from the ledger: shown with
`facts.show(REAL_CLUSTER)` in the notebook's "On a real GPU cluster" section."""
