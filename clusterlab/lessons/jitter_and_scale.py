"""Notebook 04, jitter at scale: what the learner reads from its runs.

Each function takes what `clusterlab.experiments.jitter_at_scale` returned (the collapse's
simulated and real rows, the jitter-growth and tail-at-scale runs) and draws the figure,
prints the sentences computed from it, or states the measured conclusions through
`conclude`. The pure helpers (`message_mean`, `table_clipped`, `collapse_factors`,
`se_diff`, `and_list`, `against_prediction`, `sms`, `draws_match`, `binomial_sd`,
`off_curve`, `steps_without_hiccup`) decide what is said and are tested on synthetic inputs in
`tests/test_lessons_ddp_jitter.py`.
"""

from __future__ import annotations

import inspect

import matplotlib.pyplot as plt
import numpy as np

from .. import facts, models
from ..experiments import jitter_at_scale
from ..experiments.common import conclude
from ..netem import Netem
from ..wire import SEGMENT_BYTES, segment_count
from .show import ms, say

# --- Throughput collapse ----------------------------------------------------------------------


def table_clipped(d: dict) -> bool:
    """Whether a delay's p99 (from `jitter_at_scale.delay_stats`) is the table's clipped
    maximum rather than a tail quantile: a spread distribution whose p99 reaches its max."""
    return d["max_s"] > d["p50_s"] and d["p99_s"] >= d["max_s"] - 1e-6


def message_mean(nic: str, nbytes: int) -> tuple[int, float]:
    """A message's segment count k and its mean delay in seconds on `nic`: it arrives with its
    last segment, so delay + J·E[max of its k segments' draws] (exact; no draw of these
    networks falls below 0, so none is clipped to 0)."""
    spec = Netem.parse(nic)
    k = segment_count(nbytes)
    return k, (spec.delay_ns + spec.jitter_ns * models.expected_max(k, spec.distribution)) / 1e9


def print_delays(nics, *, messages: bool = True) -> None:
    """Print, for each of `nics`, one segment's exact delay statistics from the link model's
    table, then, unless `messages` is False (`print_message_means` alone, where E[max] has been
    taught), the per-message means of `print_message_means`."""
    for nic in nics:
        d = jitter_at_scale.delay_stats(nic)   # exact, from the link model's table (one draw)
        clipped = table_clipped(d)
        print(f"{nic:34s} one {SEGMENT_BYTES >> 10} KiB segment: min {d['min_s'] * 1e3:.2f} ms, "
              f"median {d['p50_s'] * 1e3:.2f} ms, "
              f"mean {d['mean_s'] * 1e3:.2f} ms, p99 {d['p99_s'] * 1e3:.1f} ms"
              + (", pinned at the table's clipped maximum" if clipped else ""))
    if messages:
        print_message_means(nics)


def print_message_means(nics) -> None:
    """Say (folded, as Markdown) the mean delay of one message on the jittery network of
    `nics` (the second) for the ring's chunks at 2, 4, 8 and from 16 nodes on, and for a tree's
    whole 1 MiB message: each segment is its own draw, and a message arrives with its last."""
    spec = Netem.parse(nics[1])
    rows = []
    for label, upto, nbytes in ([(f"ring chunk at {n} nodes", "", (1 << 20) // n)
                                 for n in (2, 4, 8)]
                                + [("ring chunk from 16 nodes on", "≤", (1 << 20) // 16),
                                   ("tree message, any N", "", 1 << 20)]):
        k, mean = message_mean(nics[1], nbytes)
        rows.append(f"{label:28s} {upto:>1s}{nbytes >> 10:5d} KiB, {k:2d} "
                    f"segment{'s' if k > 1 else ' '}: {mean * 1e3:5.2f} ms"
                    + ("  = the mean per segment" if k == 1 else
                       f"  = {spec.delay_ns / 1e6:g} + {spec.jitter_ns / 1e6:g} × "
                       f"{models.expected_max(k, spec.distribution):.2f}"))
    say(f"<details><summary>One message's mean delay on '{nics[1]}'</summary>\n\nEach "
        f"segment is its own draw and the message arrives with its last, so the more segments, "
        f"the later on average: delay + J × E[max of its k draws], in ms.\n\n```\n"
        + "\n".join(rows) + "\n```\n</details>")


def plot_collapse(collapse: dict) -> None:
    """Draw the collapse against the node count: throughput per rank (left) and scaling
    efficiency (middle) of the flat ring on each network, simulated and measured; then
    (right) the flat ring against the binomial tree on the calm network, simulated."""
    colors = dict(zip(collapse["real"], ("#4C72B0", "#C44E52")))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.1), width_ratios=(1, 1, 0.8))
    for nic, color in colors.items():
        sim, real = collapse["sim"][nic], collapse["real"][nic]
        for ax, key in ((axes[0], "throughput_per_rank"), (axes[1], "efficiency")):
            scale = 100 if key == "efficiency" else 1
            ax.plot([r["nodes"] for r in sim], [r[key] * scale for r in sim], "-", color=color,
                    label=f"{nic}, simulated")
            ax.plot([r["nodes"] for r in real], [r[key] * scale for r in real], "o", ms=8,
                    color=color, mec="black", label=f"{nic}, measured")
    calm = next(iter(collapse["real"]))
    for rows, style, label in ((collapse["sim"][calm], "-", "flat ring"),
                               (collapse["sim_alt"][calm]["tree"], "--", "binomial tree")):
        axes[2].plot([r["nodes"] for r in rows], [100 * r["efficiency"] for r in rows], style,
                     color=colors[calm], label=label)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("nodes (one rank each)")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("samples / s per rank (batch 32)")
    axes[1].set_ylabel("scaling efficiency, %")
    axes[2].set_ylabel("scaling efficiency, %")
    axes[0].legend(fontsize=8, title="measured dots: a consistency check", title_fontsize=8)
    axes[0].set_title("1. Throughput per rank, flat ring", fontsize=10)
    axes[1].set_title("2. Scaling efficiency, flat ring", fontsize=10)
    axes[2].set_title(f"3. Ring against tree, {calm} (simulated)", fontsize=10)
    axes[2].legend(fontsize=8)
    fig.suptitle("Throughput collapse: c = 50 ms, 1 MiB all-reduce, no rate limit (latency "
                 "only)")
    fig.tight_layout()
    plt.show()


def plot_control(collapse: dict, same_mean: list, mean_nic: str) -> None:
    """Draw the simulated flat ring's scaling efficiency on the calm and the jittery network
    and on the control `same_mean` (a constant delay `mean_nic`, the tail's mean per
    segment): the gap from calm to the control is the higher mean, the gap beyond it the
    tail itself."""
    calm_nic, rough_nic = collapse["real"]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for rows, style, color, label in (
            (collapse["sim"][calm_nic], "-", "#4C72B0", calm_nic),
            (same_mean, ":", "#C44E52", f"{mean_nic}: the tail's mean, no tail (control)"),
            (collapse["sim"][rough_nic], "-", "#C44E52", rough_nic)):
        ax.plot([r["nodes"] for r in rows], [100 * r["efficiency"] for r in rows], style,
                color=color, lw=2 if style == ":" else 1.5, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")   # the gaps are ratios: they stay visible where the curves near 0
    ax.set_xlabel("nodes (one rank each)")
    ax.set_ylabel("scaling efficiency, % (log)")
    ax.set_title("The flat ring, simulated: the higher mean (calm to dotted), then the tail "
                 "(dotted to red)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.show()


def collapse_factors(calm_step_s: float, same_mean_step_s: float,
                     rough_step_s: float) -> tuple[float, float]:
    """How the tail lengthens a mean step: (the higher mean's factor, constant same-mean
    network over calm; the tail's own factor, rough network over the same-mean control)."""
    return same_mean_step_s / calm_step_s, rough_step_s / same_mean_step_s


def explain_collapse(collapse: dict) -> None:
    """Say how far the simulated flat ring's efficiency falls at 1024 nodes without and with
    the tail, and what a binomial tree keeps; then check the simulated curves' ordering."""
    calm_nic, rough_nic = collapse["real"]
    sim_calm = {r["nodes"]: r for r in collapse["sim"][calm_nic]}
    sim_rough = {r["nodes"]: r for r in collapse["sim"][rough_nic]}
    tree = {nic: rows[-1]["efficiency"] for nic, rows in
            ((nic, c["tree"]) for nic, c in collapse["sim_alt"].items())}
    say(f"**Simulated to 1024 nodes, the flat ring's efficiency falls to "
        f"{sim_calm[1024]['efficiency']:.1%}** without jitter and "
        f"{sim_rough[1024]['efficiency']:.1%} with the Pareto tail (simulator: {_sim_steps()} "
        f"steps per point). On the same networks a binomial tree keeps {tree[calm_nic]:.0%} "
        f"({tree[rough_nic]:.0%} with the tail): on latency alone the ring is the worst case, "
        f"not the law (with a rate limit the ring wins for large messages: fold under the "
        f"control).")
    for n in (2, 8, 64, 1024):
        assert sim_rough[n]["efficiency"] <= sim_calm[n]["efficiency"] + 1e-9
    assert sim_calm[1024]["efficiency"] < 0.05
    assert tree[calm_nic] > 10 * sim_calm[1024]["efficiency"]  # the ring overstates the collapse


def explain_tail_cost(collapse: dict, same_mean: list, mean_nic: str) -> None:
    """Say how the tail lengthens the simulated flat ring's mean step at 1024 nodes: its
    higher mean (the control `same_mean`, a constant `mean_nic`) and the tail itself; then,
    collapsed, the mean steps behind the split and why the tail costs the tree more (it pays
    per 1 MiB message, not per segment)."""
    calm_nic, rough_nic = collapse["real"]
    sim_calm = {r["nodes"]: r for r in collapse["sim"][calm_nic]}
    sim_rough = {r["nodes"]: r for r in collapse["sim"][rough_nic]}
    sim_mean = {r["nodes"]: r for r in same_mean}
    x_mean, x_tail = collapse_factors(sim_calm[1024]["mean_step_s"],
                                      sim_mean[1024]["mean_step_s"],
                                      sim_rough[1024]["mean_step_s"])
    tree_rough = {r["nodes"]: r for r in collapse["sim_alt"][rough_nic]["tree"]}
    rounds = 2 * int(np.log2(1024))            # the binomial tree's rounds at 1024 nodes
    k_tree, tree_msg = message_mean(rough_nic, 1 << 20)      # a tree message: the whole 1 MiB
    k4, ring4_msg = message_mean(rough_nic, (1 << 20) // 4)  # a ring chunk at 4 nodes
    seg_mean = jitter_at_scale.delay_stats(rough_nic)["mean_s"]
    say(f"**At 1024 nodes the tail makes the simulated ring's mean step ×{x_mean * x_tail:.2f} "
        f"as long: ×{x_mean:.2f} from its higher mean (the control, {mean_nic}) and "
        f"×{x_tail:.2f} beyond that mean, from the tail (why: our reading, in the fold).**\n\n"
        f"<details><summary>The mean steps, and why the tail costs beyond its mean</summary>"
        f"\n\n"
        f"The control matches the tail per message here: a ring chunk is "
        f"{(1 << 20) // 1024} bytes, {segment_count((1 << 20) // 1024)} segment. "
        f"Mean step at 1024 nodes: {ms(sim_calm[1024]['mean_step_s'], digits=0)} calm, "
        f"{ms(sim_mean[1024]['mean_step_s'], digits=0)} with the tail's mean as a constant delay, "
        f"{ms(sim_rough[1024]['mean_step_s'], digits=0)} with the tail. In the simulator each "
        f"rank's send waits for the receive before it, so the step ends with the slowest chain "
        f"of messages through the ring, and the slowest of many noisy chains is longer than "
        f"their mean (E[max], above). That is our reading of the ×{x_tail:.2f}: no run here "
        f"removes the chains' dependence to isolate it.\n</details>\n\n"
        f"<details><summary>Why the tail costs the tree more</summary>\n\n"
        f"The tree pays per message, not per segment: each of its {rounds} rounds at 1024 nodes "
        f"waits for a whole 1 MiB message of {k_tree} segments, {ms(tree_msg)} on average "
        f"against {ms(seg_mean)} per segment. At 4 nodes that is {2 * int(np.log2(4))} rounds × "
        f"{ms(tree_msg)} against the ring's {models.ring_allreduce_steps(4)} × {ms(ring4_msg)} "
        f"({k4}-segment chunks): simulated efficiency {tree_rough[4]['efficiency']:.0%} for the "
        f"tree against {sim_rough[4]['efficiency']:.0%} for the ring. Both are latency-only: "
        f"with a rate limit this unpipelined tree resends the whole 1 MiB each round, so for "
        f"large messages the ring wins (NCCL's tree is pipelined in chunks, notebook 02c).\n"
        f"</details>")
    assert x_mean > 1 and x_tail > 1   # both the mean and the tail lengthen the step


def _sim_steps() -> int:
    """The simulator's steps per point in the notebook's call (the default of
    `throughput_collapse`)."""
    return inspect.signature(jitter_at_scale.throughput_collapse).parameters["sim_steps"].default


def measured_over_simulated(steps, sim_mean_s: float) -> tuple[float, float]:
    """The measured mean step over the simulated one, and one standard error of it from the
    measured steps' spread (the simulated mean's own sampling error is not included)."""
    steps = np.asarray(steps, dtype=float)
    return steps.mean() / sim_mean_s, steps.std(ddof=1) / np.sqrt(len(steps)) / sim_mean_s


def explain_measured(collapse: dict) -> None:
    """Say the measured efficiency on 8 real ranks against the simulated, and the measured
    over simulated mean step with one standard error (within two of 1, or above: this host's
    own cost); conclude that the measured efficiency fell from 2 to 8 ranks on both
    networks; check that the emulator was never faster than its network."""
    calm_nic, rough_nic = collapse["real"]
    sim_calm = {r["nodes"]: r for r in collapse["sim"][calm_nic]}
    sim_rough = {r["nodes"]: r for r in collapse["sim"][rough_nic]}
    real_calm = {r["nodes"]: r for r in collapse["real"][calm_nic]}
    real_rough = {r["nodes"]: r for r in collapse["real"][rough_nic]}
    rough_steps = real_rough[8]["run"].step_times
    ratios = {label: measured_over_simulated(real[8]["run"].step_times, sim[8]["mean_step_s"])
              for label, real, sim in (("without jitter", real_calm, sim_calm),
                                       ("with the tail", real_rough, sim_rough))}
    within = [k for k, (x, se) in ratios.items() if abs(x - 1) <= 2 * se]
    above = [k for k, (x, se) in ratios.items() if x - 1 > 2 * se]
    below = [k for k, (x, se) in ratios.items() if 1 - x > 2 * se]
    dev_pct = int(np.ceil(100 * max(abs(x - 1) for x, _ in ratios.values()) - 1e-9))
    verdict = "; ".join(
        ([f"within two standard errors of 1 {and_list(within)}"] if within else [])
        + ([f"more than two above {and_list(above)} (probably this host's own cost of running "
            f"8 ranks on its cores; not measured at this 1 MiB size)"] if above else [])
        + ([f"more than two below {and_list(below)} (probably the simulator's own sampling, "
            f"with the tail)"]
           if below else []))
    say(f"**Measured on 8 real ranks ({len(rough_steps)} steps per point): efficiency "
        f"{real_calm[8]['efficiency']:.0%} against {sim_calm[8]['efficiency']:.0%} simulated "
        f"without jitter, {real_rough[8]['efficiency']:.0%} against "
        f"{sim_rough[8]['efficiency']:.0%} with the tail.** "
        + (f"The measured mean steps are within {dev_pct} % of the simulated: the dots sit on "
           f"the lines, as a consistency check should."
           if dev_pct <= 10 else
           f"The measured mean steps differ from the simulated by up to {dev_pct} %: "
           + and_list((f"{'slower' if x > 1 else 'faster'} {k}" if abs(x - 1) > 2 * se
                       else f"not resolved from the simulated {k} (within two standard errors)")
                      for k, (x, se) in ratios.items())
           + (" (slower probably by this host's own cost; not measured here)"
              if any(x - 1 > 2 * se for x, se in ratios.values()) else "") + ".")
        + "\n\n<details><summary>Measured over simulated, with standard errors</summary>\n\n"
        + "Measured over simulated mean step at 8 ranks: "
        + and_list(f"×{x:.3f} ± {se:.3f} {k}" for k, (x, se) in ratios.items())
        + f" (± one standard error of the {len(rough_steps)} measured steps; the simulator is "
        f"exact without jitter, and with the tail its {_sim_steps()} steps per point add an "
        f"error of their own). "
        + verdict[0].upper() + verdict[1:] + ".\n</details>")
    conclude(all(real[8]["efficiency"] < real[2]["efficiency"] < 1.05
                 for real in (real_calm, real_rough)),
             "the measured efficiency fell from 2 to 8 ranks on both networks")
    for n in (2, 4, 8):   # the emulator never completes an exchange before its network would
        assert real_calm[n]["mean_step_s"] > 0.95 * sim_calm[n]["mean_step_s"]


# --- Order statistics of jitter ---------------------------------------------------------------


def plot_jitter_growth(growth: list, *, jitter_s: float) -> None:
    """Draw the measured extra step time and last arrival against J·E[max of N] for uniform
    jitter (the one run) and, at the same J, the normal and Pareto tables (not run)."""
    J = jitter_s
    ns = np.unique(np.geomspace(1, 1024, 60).astype(int))
    fig, ax = plt.subplots(figsize=(8, 4))
    for dist, style in (("uniform", "-"), ("normal", "--"), ("pareto", ":")):
        ax.plot(ns, [J * 1e3 * models.expected_max(int(n), dist) for n in ns], style, color="k",
                label=f"J·E[max of N], {dist}" + ("" if dist == "uniform" else " (not run)"))
    ax.plot([r["nodes"] for r in growth], [r["extra_s"] * 1e3 for r in growth], "o", ms=9,
            color="#C44E52", label="measured: extra step time (the test)")
    ax.plot([r["nodes"] for r in growth], [r["arrival_extra_s"] * 1e3 for r in growth], "s",
            ms=7, color="#4C72B0", label="last arrival (check of the draws)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks N")
    ax.set_ylabel("extra time per step, ms")
    ax.set_ylim(bottom=0)
    ax.set_title("Compute jitter ±100 ms (uniform): a synchronous step waits for the slowest")
    ax.legend(fontsize=8, title="only uniform jitter was run; the other curves\n"
              "show how other tails would grow at the same J", title_fontsize=8)
    plt.show()


def se_diff(a, b) -> float:
    """Standard error of a difference of two means (samples `a` and `b`)."""
    return np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))


def and_list(xs) -> str:
    """Items as an English list: 'a', 'a and b', 'a, b and c'."""
    xs = [str(x) for x in xs]
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]


def against_prediction(g: dict, se: dict) -> tuple[list, list, list]:
    """Rank counts whose measured extra step time is more than two standard errors below
    the prediction, more than two above it, and within two: (low, high, ok)."""
    low = [n for n, r in g.items() if r["predicted_s"] - r["extra_s"] > 2 * se[n]]
    high = [n for n, r in g.items() if r["extra_s"] - r["predicted_s"] > 2 * se[n]]
    ok = [n for n in g if n not in low + high]
    return low, high, ok


def explain_jitter_growth(growth: list, *, native: dict) -> None:
    """Say how much jitter lengthened the step at each rank count (± one standard error)
    against J·E[max], where it lies within two standard errors, by how much it falls below
    (with this host's plain Gloo all-reduce, `native`, for scale; the split is
    `explain_gap`'s), and that the points share their draws; check the exact bookkeeping of each
    step and conclude that jitter made the 2-rank step longer."""
    g = {r["nodes"]: r for r in growth}
    se = {n: se_diff(r["jittery"].step_times, r["calm"].step_times) for n, r in g.items()}
    low, high, ok = against_prediction(g, se)
    say("**Jitter lengthened the step by "
        + and_list(f"{ms(r['extra_s'])} ± {ms(se[n])}" for n, r in g.items())
        + f" on {and_list(g)} ranks**, against J·E[max] = "
        + and_list(ms(r['predicted_s']) for r in g.values())
        + f" ({len(g[8]['jittery'].step_times)} steps each, ± one standard error).\n\n"
        + (f"Within two standard errors on {and_list(ok)} ranks" if ok else
           "Within two standard errors nowhere")
        + (f"; below it on {and_list(low)}" if low else "")
        + (f"; above it on {and_list(high)}" if high else "")
        + "."
        + (f" On {and_list(low)} ranks the step grew "
           + and_list(ms(g[n]['predicted_s'] - g[n]['extra_s']) for n in low)
           + " less than predicted; the split below gives this run's sampling and host parts."
           if low else "")
        + f" The ± is wide ({ms(se[min(g)])} on {min(g)} ranks) because jitter this large "
        f"makes single steps vary a lot: {len(g[max(g)]['jittery'].step_times)} steps show the "
        f"trend, they do not pin the value."
        + "\n\n<details><summary>Details: shared draws, this host's own cost</summary>\n\n"
        "Rank r draws the same compute times on every N (one seed per rank), so the points "
        "are not independent tests. For scale, this host's own plain Gloo all-reduce took "
        + and_list(ms(native[n]) for n in g) + f" on {and_list(g)} ranks.\n</details>")
    # exact bookkeeping: extra = arrival extra - calm lateness + (jittery - calm all-reduce after)
    for r in growth:
        assert abs(r["extra_s"] - (r["arrival_extra_s"] - r["calm_lateness_s"]
                                   + r["jittery_after_s"] - r["calm_after_s"])) < 1e-6
    conclude(all(r["extra_s"] > 2 * se[n] for n, r in g.items()),
             f"jitter made the step longer end to end on {and_list(g)} ranks, each by more than "
             f"two standard errors")


def sms(s: float) -> str:
    """Signed milliseconds with one decimal, never '-0.0 ms'."""
    return f"{round(s * 1e3, 1) + 0.0:.1f} ms"


def draws_match(growth: list, *, jitter_s: float) -> bool:
    """Whether the seeded sleeps reproduced the drawn maxima: every last arrival within
    0.2 J + 3 ms of the drawn maximum."""
    return all(abs(r["arrival_extra_s"] - r["drawn_max_s"]) < 0.2 * jitter_s + 3e-3
               for r in growth)


def after_sentence(g: dict) -> str:
    """Where the all-reduce after the last arrival was shorter, longer or (to 0.1 ms) the same
    with jitter on this run, by rank count; the run does not measure why."""
    diff = {n: round((r["calm_after_s"] - r["jittery_after_s"]) * 1e3, 1) for n, r in g.items()}
    parts = [f"{word} with jitter on {and_list(ns)} ranks" for word, ns in
             (("shorter", [n for n, d in diff.items() if d > 0]),
              ("longer", [n for n, d in diff.items() if d < 0]),
              ("the same", [n for n, d in diff.items() if d == 0])) if ns]
    return "On this run it was " + and_list(parts) + "; the run does not measure why."


def explain_gap(growth: list, *, jitter_s: float) -> None:
    """Say (collapsed) how the gap between prediction and measurement splits exactly into
    sampling, the host's delay without jitter, and the all-reduce after the last arrival
    (calm minus jittery, worded from its sign on this run); check the draws and conclude on
    them."""
    g = {r["nodes"]: r for r in growth}
    draws_ok = draws_match(growth, jitter_s=jitter_s)
    rows = "".join(
        f"| {n} | {sms(r['predicted_s'] - r['extra_s'])} "
        f"| {sms(r['predicted_s'] - r['arrival_extra_s'])} "
        f"| {sms(r['calm_lateness_s'])} | {sms(r['calm_after_s'] - r['jittery_after_s'])} |\n"
        for n, r in g.items())
    say("<details><summary>Optional: why measured and predicted differ by a few ms</summary>\n\n"
        "A scheduled step is (last arrival − start) + (all-reduce after the last arrival), so "
        "prediction − measured splits exactly into: sampling (E[max] against this run's actual "
        "last arrivals, which also hold its ranks' lateness in waking, the check below), the "
        "host's delay without jitter (paid by the calm run, hidden under the late arrivals "
        "with jitter), and the all-reduce after the last arrival, calm minus jittery (positive: "
        "shorter with jitter). " + after_sentence(g) + "\n\n"
        "| ranks | gap | sampling (+ waking) | host delay without jitter "
        "| all-reduce after, calm − jittery |\n"
        "|---|---|---|---|---|\n" + rows + "\n"
        f"**Check of the set-up (the draws)**, taken before any communication: the last rank "
        f"reached the all-reduce {ms(g[2]['arrival_extra_s'])} and "
        f"{ms(g[8]['arrival_extra_s'])} late per step on 2 and 8 ranks, and this run's drawn "
        f"maxima were {ms(g[2]['drawn_max_s'])} and {ms(g[8]['drawn_max_s'])}: "
        + ("the sleeps matched the drawn values." if draws_ok else
           "some sleeps woke late, so on this run the set-up itself added time.")
        + " This checks the set-up, not the synchronous step.\n</details>")
    conclude(draws_ok, "the seeded sleeps reproduced the drawn maxima (a check of the set-up, "
             "not a second result)")


# --- Tail at scale ----------------------------------------------------------------------------


def steps_without_hiccup(run) -> np.ndarray:
    """The step times of `run` in which no rank drew a hiccup: compute + exchange + this
    host's overhead."""
    return run.step_times[~run.slow[1:].any(axis=1)]


def split_without_hiccup(run) -> tuple[float, float]:
    """The mean step without a hiccup of a free-running `run`, split exactly into (from the
    previous step's end to the last rank's arrival at the all-reduce: compute plus this
    host's lateness; from that arrival to the last rank's end: the exchange)."""
    calm = ~run.slow[1:].any(axis=1)
    return (float(run.wait_for_slowest[calm].mean()),
            float(run.after_last_arrival[1:][calm].mean()))


def plot_tail(tail: list, *, ring_s: float | None = None) -> None:
    """Draw the share of slow steps against 1 − (1 − p)^N (left) and every measured step's
    time per rank count (right). `ring_s` is accepted for the notebook's call and unused: the
    8-rank step without a hiccup, against the compute and the network, is in `explain_tail`'s
    fold, not in the title."""
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4))
    ns = np.unique(np.geomspace(1, 1024, 80).astype(int))
    for p, style in ((0.001, ":"), (0.01, "--"), (0.1, "-")):
        axes[0].plot(ns, [100 * models.tail_at_scale(p, int(n)) for n in ns], style, color="k",
                     label=f"1 − (1 − p)^N, p = {p:g}")
    axes[0].plot([r["nodes"] for r in tail], [100 * r["slow_share"] for r in tail], "o", ms=9,
                 color="#C44E52", mec="black", label="measured, p = 0.1")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("ranks N")
    axes[0].set_ylabel("slow steps, %")
    axes[0].legend(fontsize=8)
    for i, r in enumerate(tail):
        st = r["run"].step_times * 1e3
        axes[1].scatter(np.full(len(st), i) + np.random.default_rng(i).uniform(-0.2, 0.2, len(st)),
                        st, s=12, alpha=0.7)
    axes[1].set_xticks(range(len(tail)), [f"{r['nodes']} ranks" for r in tail])
    axes[1].set_ylabel("step time, ms")
    # the title names what the dots are; the numbers of a calm step are in the verdict's fold
    axes[1].set_title("every step, measured; upper band = some rank hiccuped (+50 ms)",
                      fontsize=10)
    fig.tight_layout()
    plt.show()


def binomial_sd(r: dict) -> float:
    """Binomial standard deviation of a share over r["steps"] steps at r["predicted"]."""
    return np.sqrt(r["predicted"] * (1 - r["predicted"]) / r["steps"])


def off_curve(t: dict) -> list:
    """Rank counts whose slow share is more than two binomial s.d. off 1 − (1 − p)^N."""
    return [n for n, r in t.items() if abs(r["slow_share"] - r["predicted"]) > 2 * binomial_sd(r)]


def explain_tail(tail: list, *, native: dict, ring_s: float) -> None:
    """Say the share of slow steps at each rank count against 1 − (1 − p)^N (± one binomial
    s.d.), where it is off the curve, why the points are not independent, what an 8-rank step
    without a hiccup is made of (compute and lateness until the last arrival, then the
    exchange: the emulated network's `ring_s` against this host's plain Gloo all-reduce,
    `native`; collapsed), and the share at 1024 ranks; conclude that the step's duration told
    the hiccups (on how many steps) and that the share followed the curve."""
    t = {r["nodes"]: r for r in tail}
    t8 = tail[-1]
    calm8 = steps_without_hiccup(t8["run"])
    to_arrival, exchange = split_without_hiccup(t8["run"])
    sd = binomial_sd
    off = off_curve(t)
    say("**With a 10 % per-rank hiccup, "
        + and_list(f"{r['slow_share']:.0%}" for r in t.values())
        + f" of the steps were slow on {and_list(t)} ranks** ({t[8]['steps']} steps each), "
        f"against 1 − (1 − p)^N = "
        + and_list(f"{r['predicted']:.0%} ± {sd(r):.0%}" for r in t.values())
        + " (± one binomial s.d.).\n\n"
        + (f"Off the curve by more than two s.d. on {and_list(off)} ranks: the draws gave "
           + and_list(f"{t[n]['drawn_share']:.0%}" for n in off)
           + ", and a step counts as slow by its duration, so a host spike also counts."
           if off else "Consistent with the curve at every N (each within two s.d.).")
        + f" Rank r draws the same hiccups in the 2-, 4- and 8-rank runs (one seed per rank), "
        f"so the rise with N is built into these runs: read each point against its own curve "
        f"(each alone is a fair test of 1 − (1 − p)^N), not the trend across N.\n\n"
        f"<details><summary>What a step without a hiccup is made of</summary>\n\n"
        f"Steps without a hiccup on 8 ranks ({len(calm8)} of {t8['steps']}) took a median of "
        f"{ms(np.median(calm8))}, a mean of "
        f"{ms(calm8.mean())}: {ms(to_arrival)} until the last rank reached the all-reduce "
        f"({ms(t8['run'].config['compute_s'])} of compute, the rest this host's lateness in "
        f"starting 8 ranks, which here run back to back, not on a common schedule), then "
        f"{ms(exchange)} of exchange, against the emulated network's {ms(ring_s)}"
        + (": the rest is this host's own work, under which the network is hidden"
           if exchange > 2 * ring_s else "")
        + ".\n</details>\n\n"
        f"At 1024 ranks a 0.1 % hiccup would hit {models.tail_at_scale(0.001, 1024):.0%} of the "
        f"steps.")
    told = [round(r["agree"] * r["steps"]) for r in tail]
    conclude(all(r["agree"] >= 0.85 for r in tail),
             ("every" if all(k == r["steps"] for k, r in zip(told, tail)) else "a")
             + " step's duration told whether a rank drew a hiccup, on "
             + and_list(f"{k} of {r['steps']}" for k, r in zip(told, tail))
             + f" steps on {and_list(t)} ranks")
    if not off:   # when off, the bold line above says where: the draws vary from run to run
        conclude(True, "the share of slow steps was within two s.d. of 1 − (1 − p)^N at every N")


# --- Explore ---------------------------------------------------------------------------------


def explain_explorer(explorer) -> None:
    """Print the explorer's node count with its closed-form step against the simulator's mean
    step, each split into compute and the rest (exposed communication), and which way and by
    how much the closed form errs on the exposed part; or that the simulator did not run."""
    pred, sim = explorer.prediction, explorer.sim
    n, compute = pred.nodes, pred.compute_s
    line = (f"At {n} nodes the closed form gives a step of {ms(pred.step_s)} "
            f"({ms(compute, digits=0)} compute + {ms(pred.exposed_s)} exposed)")
    if sim is None:
        print(line + "; the simulator did not run in this kernel.")
        return
    exposed = sim.mean_step - compute
    off = pred.exposed_s / exposed - 1
    print(line + f", the simulator {ms(sim.mean_step)} (mean of {len(sim.step_times)} steps: "
          f"{ms(compute, digits=0)} + {ms(exposed)}): the closed form's exposed part is "
          f"{abs(off):.0%} {'high' if off > 0 else 'low'} here.")


# --- On a real GPU cluster --------------------------------------------------------------------


def real_cluster_notes() -> str:
    """The section's bullets for `facts.show`: ledger facts in [[...]], and the flat ring's
    cost at NCCL's modelled step latency against this notebook's 2 ms."""
    alpha_dc = facts.get("nccl.tuner_net_ring_step_latency_simple").value * 1e-6
    ring_dc = models.ring_allreduce(1024, 1 << 20, alpha_dc, 0.0)
    return f"""
- **α is microseconds, not milliseconds.** NCCL's cost model charges about
  [[nccl.tuner_net_ring_step_latency_simple]] per network step for its Simple protocol (a
  tuning constant, not a measurement; its LL protocols are charged less), so a flat ring over
  1024 one-GPU nodes costs about 2 × 1023 steps = {ring_dc * 1e3:.1f} ms of latency against
  {2 * 1023 * 2:.0f} ms at this notebook's 2 ms: with the same 50 ms of compute, the same
  collapse, {2e-3 / alpha_dc:.0f} times further to the right.
- **Real tails can be rare, long and correlated**, not independent per segment and per rank
  as here. In Llama 3's pre-training [[meta.llama3_stragglers]], and the run saw
  [[meta.llama3_diurnal_throughput]], which Meta attributes to mid-day temperatures.
  The fan-out rule [[paper.tail_at_scale]] assumes independent ranks. A cause shared by many
  ranks at once hits fewer steps at the same rate, but each hit step is still slow for
  every rank: a rack-wide thermal event slows all its ranks in the same steps. Events staggered
  across ranks hit more, up to min(1, N·p).

<details><summary>More: NCCL's choice of algorithm and its model, how long real events last, GPU clocks, netem's clipped tail, what is not modelled</summary>

- **The ring is not the only choice.** NCCL picks an algorithm per call
  ([[nccl.tuner_model]]); for latency-bound sizes typically its
  [[nccl.double_binary_tree]], modelled as [[nccl.tuner_tree_log_latency]].
- **NCCL's model in detail.** A per-call base latency and the topology's inter-node latency
  come on top of the step constant. CollNet and NVLS are candidates too where the switches
  can reduce; otherwise an inter-node all-reduce typically runs as tree or ring. Even the
  ring, which spans every GPU, is charged network latency on only
  [[nccl.tuner_ring_inter_steps]]: a DGX or HGX H100 node holds [[nvidia.hgx_h100_gpus]] on
  NVLink.
- **How long real events last.** Linux's TCP retransmission timeout floor is
  [[linux.tcp_rto_min]]; an unresponsive InfiniBand peer is retried for about
  [[nccl.ib_total_wait_default]] before NCCL reports an error, at the defaults of NCCL 2.23
  and later (NCCL_IB_TIMEOUT = [[nccl.ib_timeout_default]]; 2.14 to 2.22 used 18, a quarter
  of that wait).
- **GPU clocks.** GPUs slow their clocks for [[nvidia.nvml_clock_event_reasons]]: the power
  cap and thermal slowdowns are per GPU (shared only when their cause is, such as a rack's
  cooling); the power brake is asserted from outside the GPU (NVML: e.g. by the system power
  supply), so it can slow many at once.
- **netem's tail is clipped.** Its tables store values in units of jitter /
  [[linux.netem_dist_scale]] as 16-bit integers, hence the 4 J ceiling of the table above.
  The jittery network here delays a segment by 4 ms + 3 ms × X, X from the Pareto table
  (3 ms is netem's jitter J, not a standard deviation): X ≥ −2/3 gives the floor,
  4 − 3 × 2/3 = 2 ms, and X up to about 4 the clip, 4 + 3 × 4 ≈ 16 ms.
- **Not modelled here.** The step from NVLink to the NIC between one node and two (notebook
  02b), and congestion at scale (notebook 13).
</details>
"""  # noqa: E501
