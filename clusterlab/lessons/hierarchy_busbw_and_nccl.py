"""What notebook 02b (hierarchy and busbw) reads from its runs.

The rows are those of `clusterlab.experiments.allreduce_and_topology.measure`: one dict per
configuration ("config", e.g. "2x2"), algorithm and size, with the best time ("measured"),
its closed form ("model"), the emulator's own replay of the links ("replay"), the repetitions
("times") and the bandwidths nccl-tests would print ("algbw", "busbw"). Each function below
prints the sentences the notebook shows, computed from those rows, and passes each measured
conclusion to `conclude`, which says whether this run showed it.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Sequence

from clusterlab import facts, models
from clusterlab.experiments import allreduce_and_topology as ex
from clusterlab.experiments.common import beyond_closed_form, conclude
from clusterlab.lessons.show import fold, ms

SMALL, MEDIUM, LARGE = ex.SIZES


def describe_links(alpha: float, beta: float, alpha_intra: float, beta_intra: float) -> None:
    """Print the NIC between nodes (alpha, payload rate) and the link inside a node (alpha, how
    many times the NIC's rate)."""
    link = 1 / beta
    print(f"every node's NIC: '{ex.NIC}': alpha = {ms(alpha)}, 1/beta = {link / 1e6:.2f} MB/s "
          "of payload")
    print(f"inside a node: '{ex.INTRA}': alpha = {alpha_intra * 1e6:.0f} us, "
          f"{beta / beta_intra:.0f}x the NIC's rate")


# --- hierarchical all-reduce on 2 x 2 -------------------------------------------------------

# Who sends to whom on 2 nodes x 2 processes (ranks 0, 1 on node 0; 2, 3 on node 1): per
# scheme, a title and its hops (sender, receiver, both ways?, arc bend); a hop between the
# nodes crosses their NICs.
HOPS = {
    "flat ring: every other hop crosses a NIC":
        [(0, 1, False, 0.3), (1, 2, False, 0.3), (2, 3, False, 0.3), (3, 0, False, 0.3)],
    "leader-based: reduce and broadcast inside,\nonly the leaders (0, 2) use the NICs":
        [(0, 1, True, 0.3), (2, 3, True, 0.3), (0, 2, True, 0.3)],
    "rails: reduce-scatter and all-gather inside,\nrank 0 with 2 and 1 with 3 through the NICs":
        [(0, 1, True, 0.3), (2, 3, True, 0.3), (0, 2, True, 0.3), (1, 3, True, -0.3)],
}


def plot_hops(hops: dict = HOPS):
    """Draw, per scheme, the four ranks of 2 x 2 in their two nodes (dashed boxes) and every
    hop: red where it crosses the NICs (between nodes), blue inside a node. Returns the
    figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    x = {0: 0.0, 1: 1.0, 2: 2.6, 3: 3.6}  # rank -> position; nodes: {0, 1} and {2, 3}
    fig, axes = plt.subplots(1, len(hops), figsize=(12, 2.6))
    for ax, (title, edges) in zip(axes, hops.items()):
        for left in (0.0, 2.6):
            ax.add_patch(Rectangle((left - 0.35, -0.35), 1.7, 0.7, fill=False, ls="--", lw=0.8))
        for r, xr in x.items():
            ax.scatter([xr], [0], s=260, color="w", edgecolor="k", zorder=3)
            ax.text(xr, 0, str(r), ha="center", va="center", fontsize=9, zorder=4)
        for a, b, both, bend in edges:
            cross = (a < 2) != (b < 2)
            ax.add_patch(FancyArrowPatch((x[a], 0), (x[b], 0),
                                         arrowstyle="<|-|>" if both else "-|>",
                                         mutation_scale=10, connectionstyle=f"arc3,rad={bend}",
                                         color="C3" if cross else "C0", lw=1.4, shrinkA=9,
                                         shrinkB=9))
        ax.set_title(title, fontsize=9)
        ax.set(xlim=(-0.6, 4.2), ylim=(-1.1, 1.1))
        ax.axis("off")
    fig.suptitle("2 nodes x 2 processes (dashed: a node). Red: between the nodes, through their "
                 "NICs; blue: inside a node", fontsize=9)
    fig.tight_layout()
    return fig


def stagger_order(x: dict, y: dict) -> tuple[int, float, str]:
    """Whether this run orders two rows: 1 when `y` was faster, -1 when `x` was, 0 when it
    cannot tell; the staggered start it used; and, when 0, why ("disagree": the best and the
    median name different winners; "best runs" or "medians": that difference is within the
    staggered start). A run orders them only when the best and the median agree and both
    differences exceed how far apart the ranks entered the best runs (`best_spread`): after
    the emulated barrier a run can start staggered by that much, and two schemes pay it
    differently."""
    stagger = max(x.get("best_spread", 0.0), y.get("best_spread", 0.0))
    d_best, d_median = x["measured"] - y["measured"], x["median"] - y["median"]
    if d_best * d_median <= 0:
        return 0, stagger, "disagree"
    if min(abs(d_best), abs(d_median)) <= stagger:
        return 0, stagger, "best runs" if abs(d_best) <= stagger else "medians"
    return (1 if d_best > 0 else -1), stagger, ""


def hierarchy_order(hl: dict, hr: dict) -> str:
    """The line on leader-based (`hl`) against rails (`hr`) at 4 MiB: the verdict first (who
    won, by how much, against the ranks' staggered start, `stagger_order`), then the
    differences of the best runs and of the medians, and, beside them, how far apart the
    replays (the emulator's own schedules, all ranks starting together) put the two: the part
    of the measured gap that no replay explains."""
    order, stagger, why = stagger_order(hl, hr)
    d_best, d_median = hl["measured"] - hr["measured"], hl["median"] - hr["median"]
    if why == "disagree":
        return ("Leader-based against rails at 4 MiB: the best runs and the medians name "
                "different winners,\nso this run does not order them.")
    if not order:
        return (f"Leader-based against rails at 4 MiB: the best runs differ by "
                f"{ms(abs(d_best))}, the medians by {ms(abs(d_median))}; the {why} differ by "
                f"less than the ranks' staggered start ({ms(stagger)}).\nA run orders two "
                "schemes only when both exceed it, so this run does not order them.")
    faster, slower = ("Rails", "leader-based") if order > 0 else ("Leader-based", "rails")
    d_replay = (hl["replay"] - hr["replay"]) * order  # > 0: the replays agree on the winner
    line = (f"{faster} beat {slower} at 4 MiB by {ms(abs(d_best))} (medians of "
            f"{len(hl['times'])} runs: {ms(abs(d_median))}), more than the ranks' staggered "
            f"start ({ms(stagger)}).")
    if d_replay <= 0:
        return line + (f"\nTheir replays put them the other way round ({ms(-d_replay)}): the "
                       "order is this machine's, not the model's.")
    if d_replay >= abs(d_best):
        return line + f"\nTheir replays differ by {ms(d_replay)}: the model's order and gap."
    rest = round(abs(d_best) * 1e3, 1) - round(d_replay * 1e3, 1)  # ms, as printed
    return line + (f"\nTheir replays differ by {ms(d_replay)}: the order is the model's; the "
                   f"other {rest:.1f} ms of the gap ({rest / 1e3 / abs(d_best):.0%}) is a cost the "
                   "replay leaves out.")


def small_order(small: Sequence[dict]) -> str:
    """The lines on the 4 KiB runs on 2 x 2 (`small`: leader-based, rails, flat ring): each
    hierarchy against the flat ring by the same rule as at 4 MiB (`stagger_order`), then the
    replays."""
    names = ("The leader-based scheme", "Rails")
    verdicts = [stagger_order(h, small[2]) for h in small[:2]]
    if all(order < 0 for order, _, _ in verdicts):
        stagger = max(st for _, st, _ in verdicts)
        lines = ["Both hierarchies beat the flat ring by more than the staggered start "
                 f"({ms(stagger)}),\nby the best and by the median."]
    else:
        lines = []
        for name, (order, stagger, why) in zip(names, verdicts):
            if order < 0:
                lines.append(f"{name} beat the flat ring by more than the staggered start "
                             f"({ms(stagger)}),\n  by the best and by the median.")
            elif order > 0:
                lines.append(f"The flat ring beat {name.lower()} by more than the staggered "
                             f"start ({ms(stagger)}),\n  the opposite of what the replays "
                             "predict.")
            elif why == "disagree":
                lines.append(f"{name} against the flat ring: the best and the median disagree,"
                             "\n  so this run does not order them.")
            else:
                lines.append(f"{name} against the flat ring: the {why} differ by less than the "
                             f"staggered start ({ms(stagger)}),\n  so this run does not order "
                             "them.")
    lines.append(f"Replays: leader-based {ms(small[0]['replay'])}, rails "
                 f"{ms(small[1]['replay'])}, flat ring {ms(small[2]['replay'])} (every run: "
                 "appendix).")
    return "\n".join(lines)


def explain_hierarchy(hier: Sequence[dict], *, alpha: float, beta: float) -> None:
    """On 2 x 2: conclude that both hierarchical schemes beat the flat ring at 4 MiB and print
    whether this run orders leader-based and rails (`hierarchy_order`, beside their replays).
    (The 4 KiB runs: `explain_small_hierarchy`, in the appendix.) Asserts that the flat ring's
    replay is its NIC's bytes plus one latency, that the replays put both hierarchies ahead of
    the flat ring at 4 KiB and that no run beat its replay."""
    h = {(r["algorithm"], r["nbytes"]): r for r in hier}
    hl, hr, rl = (h[a, LARGE] for a in ("hierarchical", "hierarchical_rail", "ring"))
    conclude(hl["measured"] < rl["measured"] and hr["measured"] < rl["measured"],
             "both hierarchical schemes beat the flat ring at 4 MiB on 2 x 2",
             busy=beyond_closed_form((r["measured"], r["replay"]) for r in (hl, hr, rl)))
    head, sep, tail = hierarchy_order(hl, hr).partition("\nTheir replays")
    print(head)
    if sep:  # how much of the gap the replays explain: evidence kept behind a fold
        fold("Against the replays: how much of this gap the model explains", sep.lstrip() + tail)
    # Checks, silent when they hold:
    nic_busy = 1.5 * LARGE * beta  # the flat ring's bytes through each node's NIC
    assert abs(rl["replay"] - (nic_busy + alpha)) < 0.02 * rl["replay"]
    small = [h[a, SMALL] for a in ("hierarchical", "hierarchical_rail", "ring")]
    assert max(small[0]["replay"], small[1]["replay"]) < small[2]["replay"]
    for r in hier:
        assert r["measured"] >= 0.98 * r["replay"]  # the emulated network never delivers early


def explain_small_hierarchy(hier: Sequence[dict]) -> None:
    """The appendix's 4 KiB runs on 2 x 2: whether a cost the replays leave out varies by more
    than the replays differ (then the 4 KiB order is no evidence either way), the best times,
    and each hierarchy against the flat ring (`small_order`)."""
    h = {(r["algorithm"], r["nbytes"]): r for r in hier}
    small = [h[a, SMALL] for a in ("hierarchical", "hierarchical_rail", "ring")]
    replays = [r["replay"] for r in small]
    gaps = [r["measured"] - r["replay"] for r in small]
    if max(gaps) - min(gaps) > max(replays) - min(replays):
        print(f"At 4 KiB the replays differ by at most {ms(max(replays) - min(replays))}, but "
              f"the best runs sat {ms(min(gaps))} to {ms(max(gaps))} above them:\na cost the "
              "model and the replay leave out, varying by more than the replays differ, so "
              "the 4 KiB order\nis not evidence either way.")
    else:
        print("At 4 KiB this run cannot separate the schemes by more than their replays do: "
              "the differences are inside the noise.")
    print(f"4 KiB, best (median) of {len(small[0]['times'])}: leader-based "
          f"{ms(small[0]['measured'])} ({ms(small[0]['median'])}), rails "
          f"{ms(small[1]['measured'])} ({ms(small[1]['median'])}), flat ring "
          f"{ms(small[2]['measured'])} ({ms(small[2]['median'])}).\nAs at 4 MiB, a pair "
          "is ordered only when its best runs and its medians both differ by more than the "
          "staggered start.")
    print(small_order(small).replace(" (every run: appendix)", ""))


# --- nodes and processes per node -----------------------------------------------------------

def _spread_out(four: Sequence[dict], hier: Sequence[dict]) -> list[dict]:
    """The 4 MiB ring and recursive doubling on 4 x 1, and every 4 MiB run on 2 x 2."""
    return (ex.select(four, algorithm="ring", nbytes=LARGE)
            + ex.select(four, algorithm="recursive_doubling", nbytes=LARGE)
            + ex.select(hier, nbytes=LARGE))


def _plot(rows: Sequence[dict], *, title: str):
    import matplotlib.pyplot as plt

    ax = ex.plot_measured_vs_predicted(rows, title=title, log=False)
    return ax, plt


def plot_shared_nic(four: Sequence[dict], hier: Sequence[dict]) -> None:
    """Draw recursive doubling's 4 MiB runs on 4 x 1 and 2 x 2, measured against predicted:
    step (a) of the layout section, the shared NIC."""
    rows = (ex.select(four, algorithm="recursive_doubling", nbytes=LARGE)
            + ex.select(hier, algorithm="recursive_doubling", nbytes=LARGE))
    _, plt = _plot(rows, title="4 MiB: recursive doubling on 4 x 1 and 2 x 2")
    plt.show()


def plot_slow_intra(slow_intra: Sequence[dict]) -> None:
    """Draw the three schemes at 4 MiB on 2 x 2 with an intra-node link as slow as the NIC:
    step (b) of the layout section."""
    _, plt = _plot(slow_intra, title="4 MiB: 2 x 2, intra-node link as slow as the NIC")
    plt.show()


def plot_one_node(four: Sequence[dict], one_node: Sequence[dict]) -> None:
    """The appendix's figure: the 4 MiB ring on 4 x 1 and on 1 x 4, its bar labelled with how
    many times faster than 4 x 1 it was, by the closed forms and measured."""
    ring4 = ex.one(four, algorithm="ring", nbytes=LARGE)
    ring1 = ex.one(one_node, algorithm="ring")
    ax, plt = _plot([ring4, ring1], title="4 MiB: the ring on 4 x 1 and on 1 x 4")
    ax.annotate(f"faster than 4 x 1:\n{ring4['model'] / ring1['model']:.0f}x by closed "
                f"forms,\n{ring4['measured'] / ring1['measured']:.0f}x measured"
                + ("\n(this machine's\ncost set 1 x 4)" if host_set(ring1) else ""),
                xy=(1, max(ring1["measured"], ring1["model"]) * 1e3),
                xytext=(1, 0.35 * ring4["model"] * 1e3), ha="center", fontsize=8,
                arrowprops={"arrowstyle": "->", "lw": 0.8})
    plt.show()


def host_set(floor: dict) -> bool:
    """Whether this machine, not the link, set a run's time: over 1.5x its closed form."""
    return floor["measured"] > 1.5 * floor["model"]


def explain_shared_nic(*, four: Sequence[dict], hier: Sequence[dict], beta: float) -> None:
    """Step (a): recursive doubling on 2 x 2 against 4 x 1 and against the faster hierarchical
    scheme (two vectors through one NIC), and the verdict that on 2 x 2 the faster hierarchy
    beat the flat ring and recursive doubling. Asserts that no run beat its replay and that
    the shared NIC carried two vectors."""
    topo = _spread_out(four, hier)
    m = {(r["config"], r["algorithm"]): r["measured"] for r in topo}
    best_h = min(m["2x2", "hierarchical"], m["2x2", "hierarchical_rail"])
    rd22, rd41 = m["2x2", "recursive_doubling"], m["4x1", "recursive_doubling"]
    print(f"2 x 2: recursive doubling took {rd22 / best_h:.2f}x the faster hierarchical scheme "
          f"({ms(rd22)} on 2 x 2, against {ms(rd41)} on 4 x 1"
          + (": no better, as predicted)." if rd22 >= 0.98 * rd41 else ").")
          + "\nWhy: its second round pushed 2 x 4 MiB through each NIC.")
    busy = beyond_closed_form((r["measured"], r["replay"]) for r in topo)
    conclude(best_h < m["2x2", "ring"] and best_h < m["2x2", "recursive_doubling"],
             "on 2 x 2 the faster hierarchical scheme beat the flat ring and recursive doubling",
             busy=busy)
    for r in topo:
        assert r["measured"] >= 0.98 * r["replay"]  # the emulated network never delivers early
    assert rd22 >= 0.99 * 2 * LARGE * beta  # two vectors, one NIC


def explain_slow_intra(slow_intra: Sequence[dict]) -> None:
    """Step (b): the hierarchies against the flat ring with an intra-node link as slow as the
    NIC, beside their closed forms (a consistency check), and the two verdicts, on one line of
    ticks when both hold. Asserts that no run beat its replay and that the rails' closed form
    is above the flat ring's."""
    slow = {r["algorithm"]: r["measured"] for r in slow_intra}
    model = {r["algorithm"]: r["model"] for r in slow_intra}
    print(f"Consistency check (the emulator against its own closed forms): leader-based "
          f"{slow['hierarchical'] / slow['ring']:.2f}x and rails "
          f"{slow['hierarchical_rail'] / slow['ring']:.2f}x the flat ring's time (closed "
          f"forms {model['hierarchical'] / model['ring']:.2f}x and "
          f"{model['hierarchical_rail'] / model['ring']:.2f}x).")
    busy = beyond_closed_form((r["measured"], r["replay"]) for r in slow_intra)
    claims = (  # (holds, claim, busy evidence, its tick)
        (slow["hierarchical_rail"] > slow["ring"],
         "with an intra-node link as slow as the NIC the rails cost more than the flat ring, as "
         "their closed forms say", None, "flat ring < rails "),
        (slow["ring"] < slow["hierarchical"] and slow["hierarchical_rail"] < slow["hierarchical"],
         "with an intra-node link as slow as the NIC the leader-based scheme was the slowest",
         busy, "leader-based slowest"),
    )
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        shown = [conclude(holds, claim, busy=why) for holds, claim, why, _ in claims]
    if all(shown):
        print("Shown on this run, slow intra: " + " ".join(f"✓ {tick}" for *_, tick in claims))
    else:
        print(said.getvalue(), end="")
    for r in slow_intra:
        assert r["measured"] >= 0.98 * r["replay"]  # the emulated network never delivers early
    assert model["ring"] < model["hierarchical_rail"]


def explain_one_node(*, four: Sequence[dict], one_node: Sequence[dict]) -> None:
    """The appendix's line: the ring on 1 x 4 against 4 x 1, only the direction when this
    machine set the 1 x 4 time (`host_set`), otherwise with the closed forms' factor."""
    floor = ex.one(one_node, algorithm="ring")
    ring4 = ex.one(four, algorithm="ring", nbytes=LARGE)
    factor = ring4["model"] / floor["model"]
    print(f"1 x 4 (no NIC): ring {ms(floor['measured'])} (median {ms(floor['median'])}, "
          f"{len(floor['times'])} runs) against {ms(ring4['measured'])} on 4 x 1"
          + (f";\n{floor['measured'] / floor['model']:.1f}x its closed form: this machine, not "
             "the emulated link, set it, so the row shows only the direction, not the closed "
             f"forms' {factor:.0f}x."
             if host_set(floor) else
             f" ({ring4['measured'] / floor['measured']:.1f}x; closed forms {factor:.0f}x)."))


# --- algbw and busbw ------------------------------------------------------------------------

def print_bandwidths(bw: Sequence[dict], *, link: float) -> None:
    """Print the bandwidth table of the best runs: ranks, algorithm, time, algbw, busbw and
    busbw as a share of the link (1/beta); then, for recursive doubling, what its link really
    carried (lg p whole tensors per rank, more than the factor's 2(p-1)/p n)."""
    print(f"4 MiB, best runs (of `runs`); link 1/beta = {link / 1e6:.1f} MB/s")
    print(f"{'ranks':>5}  {'algorithm':<20}{'runs':>5}{'time':>10}{'algbw MB/s':>12}"
          f"{'busbw MB/s':>12}{'busbw/link':>12}")
    for r in bw:
        print(f"{r['config'][0]:>5}  {ex.LABELS.get(r['algorithm'], r['algorithm']):<20}"
              f"{len(r['times']):>5}{ms(r['measured']):>10}{r['algbw'] / 1e6:>12.1f}"
              f"{r['busbw'] / 1e6:>12.1f}"
              f"{r['busbw'] / link:>12.0%}")
    for r in bw:
        if r["algorithm"] == "recursive_doubling":
            lg = r["p"].bit_length() - 1
            sent = lg * r["nbytes"] / r["measured"]  # each rank sent its whole tensor lg p times
            print(f"Recursive doubling on {r['p']} ranks: each rank sent lg p x n = {lg} x "
                  f"{ex.human_bytes(r['nbytes'])}, so its link carried {sent / 1e6:.1f} MB/s "
                  f"({sent / link:.0%} of the link);\n  its busbw is lower because the factor "
                  "counts only the minimum, 2(p-1)/p n, not because its link idled.")


def closed_form_changes(m4: float, m8: float) -> tuple[float, float]:
    """From 4 to 8 ranks, the relative change of algbw and of busbw by the closed forms m4 and
    m8 of the ring's time: algbw goes as 1/t, busbw as 2(p-1)/p / t (1.5 -> 1.75)."""
    return m4 / m8 - 1, (m4 / m8) * (1.75 / 1.5) - 1


BUSBW_TOLERANCE = 0.03  # measured against closed-form change of busbw, 4 -> 8 ranks


def explain_busbw(r4: dict, r8: dict, *, bw: Sequence[dict], link: float) -> None:
    """The ring from 4 to 8 ranks at 4 MiB: print how much algbw and busbw changed, beside the
    closed forms' changes (`closed_form_changes`) and busbw as a share of the link; conclude
    that algbw fell and that busbw changed as its closed form says (within `BUSBW_TOLERANCE`:
    only through the longer ring's latencies). Asserts that busbw moves less than algbw by the
    closed forms, and that no ring or Rabenseifner run's busbw beat the link (one rank per
    NIC)."""
    da, db = r8["algbw"] / r4["algbw"] - 1, r8["busbw"] / r4["busbw"] - 1
    m4, m8 = r4["model"], r8["model"]
    dam, dbm = closed_form_changes(m4, m8)
    print(f"Ring, 4 -> 8 ranks at 4 MiB: algbw changed by {da:+.0%}, busbw by {db:+.0%}, from "
          f"{r4['busbw'] / link:.0%} to {r8['busbw'] / link:.0%} of the link\n(closed forms: "
          f"{dam:+.0%}, {dbm:+.0%}; by them busbw falls only through the longer ring's "
          f"latencies,\n{2 * (r8['p'] - 1)} steps, not {2 * (r4['p'] - 1)}).")
    # busbw / algbw is 1.75 / 1.5 larger on 8 ranks, so busbw moving less than algbw is close
    # to arithmetic; the finding is that busbw fell by what the latencies predict, no more.
    slowed = beyond_closed_form([(r4["measured"], m4), (r8["measured"], m8)])
    conclude(r8["algbw"] < r4["algbw"], "algbw fell from 4 to 8 ranks", busy=slowed)
    # Each best time carries this machine's noise, up to its own best-to-median spread; a
    # ratio of two bests inherits both. A miss no larger than the tolerance plus that spread is
    # this run's scatter, not a broken emulator (a quiet 2-core CI run missed by 4 %).
    s4, s8 = (r["median"] / r["measured"] - 1 for r in (r4, r8))
    scatter = (None if abs(db - dbm) > BUSBW_TOLERANCE + s4 + s8 else
               f"a miss of {abs(db - dbm):.1%} lies within this run's scatter (best to median: "
               f"{s4:.1%} and {s8:.1%})")
    conclude(abs(db - dbm) <= BUSBW_TOLERANCE,
             f"busbw fell as the emulator's closed form says, within {BUSBW_TOLERANCE:.0%} "
             f"(best of {len(r4['times'])} and {len(r8['times'])}; a consistency check of the "
             "emulator against its own formula)", busy=slowed or scatter)
    assert abs(dbm) < abs(dam)
    for r in bw:
        if r["algorithm"] in ("ring", "rabenseifner"):
            # one rank per NIC: an endpoint algorithm cannot beat it
            assert r["busbw"] <= 1.01 * link


def explain_shared_nic_busbw(hl: dict, hr: dict, *, link: float) -> None:
    """busbw by the same factor on the 2 x 2 hierarchical runs (4 ranks, every sum made at a
    rank): conclude that it exceeded one NIC's rate, and print both as a share of the link,
    with why when above (the factor assumes 2(p-1)/p n crossed each rank's link; each NIC
    carried only 2(N-1)/N n, so by bytes busbw can reach their ratio of the link)."""
    p, nodes = hl["p"], int(hl["config"].split("x")[0])
    factor, nic = 2 * (p - 1) / p, 2 * (nodes - 1) / nodes
    above = conclude(min(hl["busbw"], hr["busbw"]) > link,
                     "the 2 x 2 hierarchical schemes' busbw exceeded one NIC's rate",
                     busy=beyond_closed_form([(hl["measured"], hl["model"]),
                                              (hr["measured"], hr["model"])]))
    print(f"2 x 2 hierarchical schemes, busbw by the same factor: {hl['busbw'] / link:.0%} and "
          f"{hr['busbw'] / link:.0%} of the link\n(one best-of-{len(hl['times'])} run)" + (
              f": above it. The factor assumes {factor:.1f} n crossed each rank's link;\n"
              f"each NIC carried only {nic:.1f} n, so by bytes busbw can reach "
              f"{factor / nic:.0%} of the link." if above else "."))


# --- on a real GPU cluster ------------------------------------------------------------------

def striped_times(nodes: int, per_node: int, intra_over_nic: float) -> tuple[float, float]:
    """With one NIC per GPU (`per_node` P of each per node, N `nodes`, p = N P), the bytes-only
    all-reduce times in units of n beta_NIC: the rails hierarchy with its phases one after
    another (reduce-scatter and all-gather inside the node, 2((P-1)/P) n at `intra_over_nic`
    times the NIC's rate; then each rail's ring over its own NIC, 2((N-1)/N) n / P), and the
    flat ring striped over the node's P NICs (each NIC carries 2((p-1)/p) n / P; a GPU's other
    P-1 slices take the intra-node link at the same time). The hierarchy is the faster only
    while intra_over_nic > p."""
    nodes_f, p = float(nodes), nodes * per_node
    hier = (2 * (per_node - 1) / per_node / intra_over_nic
            + 2 * (nodes_f - 1) / nodes_f / per_node)
    ring = 2 * (p - 1) / p
    flat = max(ring / per_node, (per_node - 1) / per_node * ring / intra_over_nic)
    return hier, flat


def gpu_cluster_template(*, intra_over_nic: float) -> str:
    """The ledger template of "On a real GPU cluster" (render with `facts.show(...,
    one_per_source=True)`): a DGX H100 node's NVLink against its NICs, beside this notebook's
    `intra_over_nic` (the intra-node link's rate over the NIC's); nccl-tests' busbw factor;
    the link that bounds a ring's busbw."""
    nvlink = facts.get("nvidia.h100_nvlink_bw_per_direction").value
    nic = facts.get("nvidia.connectx7_rate_bytes").value
    nics = facts.get("nvidia.dgx_h100_compute_nics").value
    ring_nvlink = facts.get("nccl.h100_ring_busbw").value  # GB/s, NCCL's effective NVLink rate
    hier, flat = striped_times(2, nics, nvlink / nic)
    r = nvlink / nic  # the rails' two phases in units of n beta_NIC, to overlap them
    nvlink_part, nic_part = 2 * (nics - 1) / nics / r, 1 / nics  # the rails' two phases
    overlapped = max(nvlink_part, nic_part)
    nic_flat = 2 * (2 * nics - 1) / (2 * nics) / nics  # the flat ring's bytes per NIC
    assert nvlink_part > nic_flat - nic_part  # NVLink time added > NIC time saved
    assert hier > flat and nvlink / nic < 2 * nics  # NVLink is not over p = 2 P times the NIC
    return f"""
- **A DGX H100 node** has one NIC per GPU, so a flat ring's bytes are already split over
  the node's NICs: on 2 DGX nodes (p = {2 * nics}) each NIC carries {nic_flat:.3f} n. The rails cut
  that to {nic_part:.3f} n but add NVLink time equal to {nvlink_part:.3f} n through a NIC (NVLink
  is about {nvlink / nic:.0f}x a NIC), more than they save. So by bytes alone a hierarchy pays
  only if NVLink is more than p times a NIC or if the phases overlap (fold below). Its gain
  there is latency (self-check 2). Here it won because a node's processes shared one NIC and
  the intra-node link was {intra_over_nic:.0f}x the NIC.
- **busbw**: nccl-tests applies [[nccl.busbw_factor_every_algorithm]] (its n is the rank
  count, this notebook's p). The factor is a ring's traffic per link; NCCL's tree and
  in-network algorithms move other amounts, and their busbw can exceed what the link
  carried, on two nodes for instance ([02c](02c_in_network_reduction_and_nccl.ipynb)'s
  self-check 2 says how to measure the network there).
- **The link that bounds a ring's busbw** is the NIC with one GPU and one NIC per node. With
  several per node NCCL's channels (parallel slices of one collective, each on its own NIC
  path; fold below) spread over all the NICs, and busbw between nodes grows
  [[nccl.busbw_grows_with_node_nics]].

<details><summary>Why a hierarchy needs overlap with a NIC per GPU: the striping algebra</summary>

A DGX H100 has [[nvidia.dgx_h100_compute_nics]] for the compute fabric, one per GPU, each
[[nvidia.connectx7_rate_bytes]]; a GPU's NVLink carries [[nvidia.h100_nvlink_bw_per_direction]]
each way, only about {nvlink / nic:.0f}x a NIC at line rate (NCCL's ring reaches about
[[nccl.h100_ring_busbw]] over NVLink, r ≈ {ring_nvlink / nic:.1f}, which only strengthens what
follows).

NCCL **stripes** a collective over a node's NICs, each carrying a slice: it splits it into
**channels**, parallel slices, each one CUDA block with its own slice of the data and its own
connections (02c). They stripe even a flat ring over a node's P NICs, so each NIC carries
only 2((p-1)/p) n / P. Let r be the intra-node link's
speed over the NIC's (about {nvlink / nic:.0f} on a DGX H100). By bytes alone
(`lesson.striped_times`) the rails add 2((P-1)/P) n / r inside the node and save only
2(P-1)/(pP) n per NIC, so they beat the flat ring only while r > p. On 2 such nodes
(p = {2 * nics}) a hierarchy whose phases run one after another takes {hier / flat:.2f}x the
flat ring's time, *slower*. With its phases overlapped, as a pipelined schedule such as
NCCL's tree overlaps its own, it takes the longer phase alone: max({2 * (nics - 1) / nics / r:.3f},
{1 / nics:.3f}) = {overlapped:.3f} against the flat ring's {flat:.3f} n beta_NIC,
{overlapped / flat:.2f}x the flat ring's time: faster.
</details>
"""


# --- appendix -------------------------------------------------------------------------------

# The 2 x 2 schemes of the appendix's table, with their column names.
REPLAY_ORDER = {"hierarchical": "leader-based", "hierarchical_rail": "rails", "ring": "flat ring",
                "recursive_doubling": "rec. doubling"}


def explain_replay(hier: Sequence[dict], *, alpha: float, beta: float) -> None:
    """The appendix on 2 x 2. The flat ring's closed form on this layout (`ex.flat_on_layout`)
    worked at 4 MiB (the NIC's bytes plus one latency: the latencies hide behind the bytes)
    and 4 KiB (the chain of steps: about one NIC latency in two hops), against the 4 x 1
    formula's 6 latencies; the rails' replay one latency under their closed form (asserted).
    Then every best run minus its replay beside how far apart the ranks entered it
    (`best_spread`): a run is timed from the first entry, so up to about that spread is the
    staggered start the emulated barrier leaves; the rest is a cost the replay leaves out,
    which this run does not isolate. Last, recursive doubling at 4 KiB: one NIC latency on
    2 x 2, against the hierarchies' two."""
    h = {(r["algorithm"], r["nbytes"]): r for r in hier}
    rl, rq22 = h["ring", LARGE], h["ring", SMALL]
    chunk = LARGE / 4 * beta  # one step's chunk through a NIC
    four = {n: models.allreduce_time("ring", 4, n, alpha, beta) for n in (LARGE, SMALL)}
    print(f"Flat ring on 2 x 2: closed form {ms(rl['model'])} at 4 MiB and {ms(rq22['model'])} "
          f"at 4 KiB, below the 4 x 1 formula's {ms(four[LARGE])} and {ms(four[SMALL])}. Why:\n"
          f"- 4 MiB: each NIC sends its 6 chunks back to back; the next chunk reaches it before "
          f"it has\n  sent the current one ({ms(alpha)} latency < {ms(chunk)} per chunk), so the "
          f"latencies hide\n  behind the bytes: 1.5 n beta + alpha, one latency, not 6.\n"
          f"- 4 KiB: the bytes are negligible and the chain of steps sets the time: rank r's "
          f"step s\n  waits for rank r-1's step s-1, and only every other hop crosses a NIC, so "
          f"the chain\n  holds 3 NIC latencies, not 6 (3 alpha = {ms(3 * alpha)}).")
    hr = h.get(("hierarchical_rail", LARGE))
    if hr:
        print(f"- Rails at 4 MiB: replay {ms(hr['replay'])}, closed form {ms(hr['model'])} "
              f"minus one alpha: one rail's second\n  chunk queues in the shared NIC behind the "
              f"other rail's first, so its latency hides too.")
        assert abs(hr["replay"] - (hr["model"] - alpha)) < 0.01 * hr["model"]
    names = [a for a in REPLAY_ORDER if (a, LARGE) in h or (a, SMALL) in h]
    labels = [REPLAY_ORDER[a] for a in names]
    width = max(14, *(len(label) + 2 for label in labels))
    print("\nBest run minus its replay (in parentheses: how far apart the ranks entered it), ms:")
    print(" " * 7 + "".join(f"{label:<{width}}" for label in labels).rstrip())
    sure = []  # gap minus entry spread: what the replay leaves out
    largest = (0.0, "", "")
    for size in (LARGE, SMALL):
        cells = []
        for a in names:
            r = h.get((a, size))
            if r is None:
                cells.append(f"{'-':<{width}}")
                continue
            gap, spread = r["measured"] - r["replay"], r.get("best_spread", 0.0)
            sure.append(max(0.0, gap - spread))
            largest = max(largest, (gap - spread, REPLAY_ORDER[a], ex.human_bytes(size)))
            cells.append(f"{f'{gap * 1e3:.1f} ({spread * 1e3:.1f})':<{width}}")
        print(f"{ex.human_bytes(size):<7}" + "".join(cells).rstrip())
    print("A run is timed from the first rank's entry, and the emulated barrier before it lets "
          "the ranks go\nat different times: up to about the entry spread is that staggered "
          "start. So at least the gap\nminus the spread, "
          f"{ms(min(sure))} to {ms(max(sure))} here, is a cost the replay leaves out; this run "
          f"does not isolate it.\nThe largest, {largest[1]} at {largest[2]}, is not explained by "
          f"this run ({hier[0]['p']} rank processes\non this machine's "
          f"{os.cpu_count()} cores): neither the model nor the replay accounts for it.")
    rd = h.get(("recursive_doubling", SMALL))
    hs = [h[a, SMALL] for a in ("hierarchical", "hierarchical_rail") if (a, SMALL) in h]
    if rd and len(hs) == 2:
        print(f"Recursive doubling at 4 KiB: closed form {ms(rd['model'])} against "
              f"{ms(min(r['model'] for r in hs))} for the hierarchies. On 2 x 2 its first\n"
              "round stays inside the node, so it pays one NIC latency; the hierarchies' "
              "two-node ring\npays two. " + (
                  f"Its best run, {ms(rd['measured'])}, beat both of theirs by more than the "
                  "staggered start."
                  if all(stagger_order(r, rd)[0] > 0 for r in hs) else
                  f"Its best run, {ms(rd['measured'])}, was the fastest, but not past the "
                  "staggered start\nagainst both."
                  if rd["measured"] < min(r["measured"] for r in hs) else
                  "Their best runs do not show it."))
