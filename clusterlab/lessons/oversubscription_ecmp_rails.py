"""What notebook 13b (oversubscription, ECMP and rails) reads from its runs.

Each function takes the plain rows of `clusterlab.experiments.fabric` (or the closed forms of
`clusterlab.fabric_models`, the simulator's curves of `clusterlab.widgets.fabric`) and
prints the sentences and draws the figures the learner reads, with the consistency checks
that go with them; measured conclusions go through `conclude`, which prints
"Shown on this run: ..." when they hold.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence

import numpy as np

from clusterlab import fabric_models as fm
from clusterlab import facts
from clusterlab.experiments import fabric as ex
from clusterlab.experiments.common import conclude
from clusterlab.fabric import Fabric
from clusterlab.lessons.show import fold, ms, say
from clusterlab.topology import Topology
from clusterlab.wire import HEADER_BYTES, SEGMENT_BYTES

MiB, KiB = ex.MiB, ex.KiB
NBYTES = 512 * KiB  # each node's buffer in the oversubscription section
FAR_ABOVE = 1.15  # an ECMP pairing whose best run exceeds its closed form this much is named
# the measured algorithms, as the case names of the closed-form table
CASE = {"ring": "ring", "tree": "tree, farthest first",
        "tree_neighbours_first": "tree, neighbours first"}
NAMES = {"ring": "ring", "tree": "tree,\nfarthest first",
         "tree_neighbours_first": "tree,\nneighbours first"}  # bar labels


def span(lo: float, hi: float) -> str:
    """Two times in seconds as a millisecond range: (0.0904, 0.0912) -> '90.4-91.2 ms'."""
    return f"{lo * 1e3:.1f}-{hi * 1e3:.1f} ms"


def runs(row: dict) -> str:
    """The spread of a measured row's repetitions: 'runs 90.4-91.2 ms'."""
    return f"runs {span(min(row['times']), max(row['times']))}"


def port_name(q: int, *, nodes: int = 8, leaves: int = 2, spines: int = 2) -> str:
    """A leaf-spine port id as words; ids run [node ports | uplinks | downlinks], the uplinks
    leaf by leaf, the downlinks spine by spine."""
    if q < nodes:
        return f"node {q}'s port"
    q -= nodes
    if q < leaves * spines:
        return f"uplink leaf {q // spines} -> spine {q % spines}"
    q -= leaves * spines
    return f"downlink spine {q // leaves} -> leaf {q % leaves}"


def explain_ports(fabric, topo: Topology, *, rate: float) -> None:
    """Print the ports of a leaf-spine (`fabric`, built into `topo`) with their rates against
    the uplink's closed form (`rate`: the NIC's bit/s), and the path of a message inside a
    leaf and between leaves; checks that the fabric's text form parses back to it."""
    assert Fabric.parse(str(fabric)) == fabric
    uplink = fm.uplink_rate_bps(port_rate_bps=rate, nodes_per_leaf=fabric.nodes_per_leaf,
                                spines=fabric.spines, oversubscription=fabric.oversubscription)
    specs = topo.port_specs()
    nodes = topo.nodes
    print(f"{len(specs)} ports: {nodes} node ports at {specs[0].rate_bps / 1e6:g} Mbit/s;")
    print(f"  {len(specs) - nodes} uplinks and downlinks at {specs[-1].rate_bps / 1e6:g} Mbit/s "
          f"(closed form {uplink / 1e6:g} Mbit/s)")
    assert specs[-1].rate_bps == uplink
    leaves = nodes // fabric.nodes_per_leaf
    for src, dst in ((0, 1), (0, 5)):
        hops = [int(q) for q in topo.paths([src], [dst])[0] if q >= 0]
        print(f"node {src} -> node {dst}: NIC, then "
              + ", ".join(port_name(q, nodes=nodes, leaves=leaves, spines=fabric.spines)
                          for q in hops))


def closed_form(o: float, algorithm: str, order: Sequence[int] | None, *,
                frame: int = SEGMENT_BYTES, nbytes: int = NBYTES) -> float:
    """The closed-form time (s) of `algorithm` ("ring", "tree" or "alltoall"; ranks laid out
    by `order`, None: in rank order) on 8 nodes in leaves of 4 under one spine at
    oversubscription `o`, `nbytes` per node, packets of `frame` bytes."""
    t = Topology.build(8, 1, ex.NIC, fabric=ex.leaf_spine(o))
    if algorithm == "alltoall":
        return fm.alltoall_cost(t, nbytes, segment_bytes=frame).time_s
    return fm.bottleneck_time(t, algorithm, nbytes, ranks=order, segment_bytes=frame)[0]


def print_closed_forms(closed: dict, real: dict, *, cases: Sequence[tuple], mtu: int) -> None:
    """Print the closed form's slowdown from o = 1 to o = 4 per case with real `mtu`-byte
    frames (`real`: case -> that ratio), the lesson; the emulator's segments (`closed`: (case,
    o) -> time), what the runs check, sit beside the runs (`explain_oversubscribed`) and in
    the appendix. Check that only the farthest-first tree and the all-to-all slow with real
    frames."""
    print(f"closed form, {NBYTES // KiB} KiB per node in real {mtu} B frames: "
          f"time at o = 4 / time at o = 1")
    for c, *_ in cases:
        print(f"  {c:<23} {real[c]:.2f}x")
    assert real["ring"] < 1.05 and real["tree, neighbours first"] < 1.05
    assert real["tree, farthest first"] > 1.5 and real["all-to-all"] > 1.5


def replay_ranges(over: Sequence[dict], *, orders: int) -> list[tuple[float, float]]:
    """Per `ex.oversubscribed` row, the fastest and slowest replay of its all-reduce over
    `orders` service orders (`ex.replay_range`), on its fabric and rank layout."""
    return [ex.replay_range(Topology.build(8, 1, ex.NIC,
                                           fabric=ex.leaf_spine(r["oversubscription"])),
                            "ring" if r["algorithm"] == "ring" else "tree", NBYTES,
                            ex.neighbours_first_order(8) if r["algorithm"].endswith("first")
                            else None, orders=orders)
            for r in over]


def plot_oversubscribed(over: Sequence[dict], ax=None):
    """Per algorithm, its o = 1 and o = 4 runs side by side (bar: the median, whisker: fastest
    to slowest), the closed form with the emulator's segments as a black line across each bar,
    and o = 4 / o = 1 between medians above each pair."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.4))
    row = {(r["algorithm"], r["oversubscription"]): r for r in over}
    med = median_ratios(over)
    w = 0.38
    for k, o in enumerate((1.0, 4.0)):
        rs = [row[a, o] for a in CASE]
        x = np.arange(len(CASE)) + (k - 0.5) * w
        m = np.array([r["median"] for r in rs]) * 1e3
        lo = m - np.array([min(r["times"]) for r in rs]) * 1e3
        hi = np.array([max(r["times"]) for r in rs]) * 1e3 - m
        ax.bar(x, m, w * 0.95, yerr=[lo, hi], capsize=3, color="C0" if k == 0 else "C3",
               label=f"o = {o:g}: measured (median, range)")
        ax.hlines([r["model"] * 1e3 for r in rs], x - w / 2, x + w / 2, colors="k", lw=2,
                  label="closed form, emulator segments" if k else None)
    top = max(max(r["times"] + [r["model"]]) for r in over) * 1e3
    for i, a in enumerate(CASE):
        high = max(max(row[a, o]["times"] + [row[a, o]["model"]]) for o in (1.0, 4.0)) * 1e3
        ax.text(i, high + 0.03 * top, f"{med[a]:.2f}x", ha="center", fontsize=9)
    ax.set_xticks(range(len(CASE)), [NAMES[a] for a in CASE], fontsize=8)
    ax.set(ylabel="time (ms)", ylim=(0, 1.25 * top),
           title=f"{NBYTES // KiB} KiB all-reduce on 8 nodes in 2 leaves "
                 f"(above each pair: o = 4 / o = 1, medians)")
    handles, labels = ax.get_legend_handles_labels()  # the measured bars first
    ax.legend(handles[1:] + handles[:1], labels[1:] + labels[:1], fontsize=8, loc="upper left")
    return ax


def plot_oversubscription_replays(over: Sequence[dict], replays: Sequence[tuple[float, float]]):
    """Appendix: bars per algorithm and oversubscription: measured runs, replay range (over
    service orders), closed form."""
    return ex.plot_bars(over, key=lambda r: f"{NAMES[r['algorithm']]}\n"
                                            f"o = {r['oversubscription']:g}",
                        title=f"{NBYTES // KiB} KiB all-reduce on 8 nodes in 2 leaves: runs, "
                              f"replays, closed form", replays=replays)


def by_setup(over: Sequence[dict], replays: Sequence[tuple[float, float]]) -> dict:
    """(algorithm, oversubscription) -> (the measured row, its replay range)."""
    return {(r["algorithm"], r["oversubscription"]): (r, rep) for r, rep in zip(over, replays)}


def median_ratios(over: Sequence[dict]) -> dict[str, float]:
    """Per algorithm, its median at o = 4 over its median at o = 1."""
    median = {(r["algorithm"], r["oversubscription"]): r["median"] for r in over}
    return {a: median[a, 4.0] / median[a, 1.0] for a in CASE}


def tree_slowed_most(med: dict[str, float]) -> bool:
    """The oversubscription verdict: the farthest-first tree slowed over 1.4x between medians
    and at least 0.2 more than both the ring and the neighbours-first tree."""
    return (med["tree"] > 1.4
            and med["tree"] > max(med["ring"], med["tree_neighbours_first"]) + 0.2)


def explain_oversubscribed(over: Sequence[dict], med: dict[str, float], closed: dict,
                           real: dict, *, mtu: int, repeats: int) -> None:
    """Print each algorithm's medians at o = 1 and o = 4 against the closed form (`over`:
    `ex.oversubscribed` rows, `med`: `median_ratios`, `closed`/`real` as in
    `print_closed_forms`); under the table one line saying the ring's rise is the emulator's
    segments (`real`'s ratio with `mtu` B frames beside it), the verdict, then a pointer to
    the appendix on the farthest-first tree's gap to its closed form (`tree_gap_lines`)."""
    median = {(r["algorithm"], r["oversubscription"]): r["median"] for r in over}
    seg = SEGMENT_BYTES // KiB
    print(f"median of {repeats} runs, o = 1 -> o = 4          | closed form, emulator's {seg} "
          f"KiB segments")
    for a, c in CASE.items():
        print(f"  {c:<23} {ms(median[a, 1.0]):>9} -> {ms(median[a, 4.0]):>9}"
              f"  {med[a]:.2f}x | {closed[c, 4] / closed[c, 1]:.2f}x")
    print(f"The ring's rise in this run is the emulator's {seg} KiB segments (closed form "
          f"{closed['ring', 4] / closed['ring', 1]:.2f}x); with real {mtu} B frames it is "
          f"{real['ring']:.2f}x (appendix).")
    conclude(tree_slowed_most(med),
             f"oversubscription slowed the farthest-first tree (over 1.4x between medians of "
             f"only {repeats} runs on this machine, a rough ratio) more than the ring and the "
             f"neighbours-first tree", busy=ex.slowed(over))
    print(f"In the appendix: where the farthest-first tree's {med['tree']:.2f}x against its "
          f"closed form's "
          f"{closed['tree, farthest first', 4] / closed['tree, farthest first', 1]:.2f}x "
          f"comes from.")


def tree_gap_lines(over: Sequence[dict], replays: Sequence[tuple[float, float]]) -> list[str]:
    """The farthest-first tree's o = 4 / o = 1 between medians against its closed form, split
    by median: each median's distance from its closed form and where it sits against its
    replay range (within 2%, as for the runs): above every replay is not the service order
    the replays cover; inside it and below the closed form is messages served in turn. Then,
    when both medians move the ratio the same way, each one's share of the gap in log terms.
    Only the part inside the replays is put down to service order."""
    setups = by_setup(over, replays)
    (r1, (lo1, hi1)), (r4, (lo4, hi4)) = setups["tree", 1.0], setups["tree", 4.0]
    ratio, model = r4["median"] / r1["median"], r4["model"] / r1["model"]
    lines = [f"farthest-first tree: {ratio:.2f}x between medians, {model:.2f}x in the closed "
             f"form (which stays under 2x as the delays and store and forward grow less than "
             f"the crowded transfers). Per median:"]
    for o, r, lo, hi in ((1, r1, lo1, hi1), (4, r4, lo4, hi4)):
        dev = r["median"] / r["model"] - 1
        if r["median"] > 1.02 * hi:
            why = ("above every replay, so not the service order the replays cover: this "
                   "machine's timing (not measured separately)")
        elif r["median"] < 0.98 * lo:
            why = "below every replay (not explained here)"
        elif dev < 0:
            why = "inside its replay range and below the closed form: messages served in turn"
        else:
            why = "inside its replay range"
        lines.append(f"  o = {o}: median {ms(r['median'])}, {dev:+.1%} from its closed form "
                     f"{ms(r['model'])}, replay {replay_text(lo, hi)}: {why}")
    c1 = -math.log(r1["median"] / r1["model"])  # each median's part of log(ratio / model)
    c4 = math.log(r4["median"] / r4["model"])
    gap = c1 + c4
    if abs(gap) > 0.01 and c1 * gap > 0 and c4 * gap > 0:
        lines.append(f"  of the gap between {ratio:.2f}x and {model:.2f}x, in log terms, the "
                     f"o = 1 median makes {c1 / gap:.0%} and the o = 4 median {c4 / gap:.0%}")
    return lines


def nccl_btree(nranks: int, rank: int) -> tuple[int, int, int]:
    """NCCL's ncclGetBtree (src/graph/trees.cc, v2.30.7-1), transcribed: (parent, child 0,
    child 1) of `rank` in the binary tree over ranks 0..nranks-1 rooted at 0, -1 for none."""
    bit = 1
    while bit < nranks and not bit & rank:  # the lowest set bit of rank
        bit <<= 1
    if rank == 0:
        return -1, -1, (bit >> 1 if nranks > 1 else -1)
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    low = bit >> 1
    down0 = -1 if low == 0 else rank - low
    down1 = -1 if low == 0 else rank + low
    while down1 >= nranks:  # as in trees.cc: halve the step until the child exists
        down1 = -1 if low == 0 else rank + low
        low >>= 1
    return up, down0, down1


def nccl_dtree(nranks: int, rank: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """NCCL's ncclGetDtree, transcribed: `rank`'s (parent, child, child) in both trees. The
    first is `nccl_btree`; the second mirrors it (rank -> nranks - 1 - rank) when nranks is
    even and shifts it by one rank when odd."""
    first = nccl_btree(nranks, rank)
    if nranks % 2:
        second = nccl_btree(nranks, (rank - 1 + nranks) % nranks)
        return first, tuple(-1 if x == -1 else (x + 1) % nranks for x in second)
    second = nccl_btree(nranks, nranks - 1 - rank)
    return first, tuple(-1 if x == -1 else nranks - 1 - x for x in second)


def nccl_dtree_edges(nodes: int) -> list[set[tuple[int, int]]]:
    """The (parent, child) edges of NCCL's two trees over `nodes` nodes, numbered in rank
    order as NCCL numbers them (connectTrees calls ncclGetDtree with nNodes and the node's
    index); checks that every child's parent lists it as a child."""
    edges = []
    for t in (0, 1):
        trees = [nccl_dtree(nodes, n)[t] for n in range(nodes)]
        up = {(u, n) for n, (u, _, _) in enumerate(trees) if u != -1}
        down = {(n, d) for n, (_, *kids) in enumerate(trees) for d in kids if d != -1}
        assert up == down, f"tree {t} on {nodes} nodes is inconsistent"
        edges.append(up)
    return edges


def nccl_tree_loads(nodes: int, nodes_per_leaf: int, *,
                    oversubscription: float) -> dict[str, float]:
    """Bytes per link of NCCL's tree all-reduce, in units of the buffer B, on `nodes` nodes
    numbered leaf by leaf: each tree carries B/2 (NCCL gives each tree half the channels) up
    and down each of its edges, one NIC per node. "nic": the busiest NIC's bytes each way;
    "uplinks": the bytes the busiest leaf sends up (and receives down); "capacity": its
    uplinks' rate in NIC rates at `oversubscription`; "slowdown": the time at that
    oversubscription over the time at 1:1, pipelined (the busiest link decides), with the
    leaf's flows spread evenly over its uplinks."""
    nic = np.zeros(nodes)
    uplinks = np.zeros(nodes // nodes_per_leaf)
    for tree in nccl_dtree_edges(nodes):
        for parent, child in tree:
            nic[[parent, child]] += 0.5  # reduce up, broadcast down: B/2 each way
            leaves = parent // nodes_per_leaf, child // nodes_per_leaf
            if leaves[0] != leaves[1]:
                uplinks[list(leaves)] += 0.5  # up from one leaf, up from the other
    capacity = nodes_per_leaf / oversubscription
    assert uplinks.max() / nodes_per_leaf <= nic.max()  # at 1:1 the NICs decide
    return {"nic": nic.max(), "uplinks": uplinks.max(), "capacity": capacity,
            "slowdown": max(1.0, uplinks.max() / capacity / nic.max())}


NCCL_TREE_SETUPS = ((8, 4), (16, 4), (32, 4), (64, 8))  # (nodes, nodes per leaf)


def nccl_tree_lines(*, far: float, setups: Sequence[tuple[int, int]] = NCCL_TREE_SETUPS,
                    oversubscription: float = 4) -> tuple[str, list[str]]:
    """What oversubscription costs NCCL's double binary tree in `setups` (arithmetic on the
    edges of `nccl_dtree`, `nccl_tree_loads`), against this course's farthest-first tree
    (`far`: its closed-form o = 4 / o = 1 with real frames, 8 nodes in leaves of 4): the
    result in one line, then the assumptions, the worst case's reading, its crossing edges
    and a table of the setups."""
    o = f"{oversubscription:g}:1"
    rows = {(n, per): nccl_tree_loads(n, per, oversubscription=oversubscription)
            for n, per in setups}
    (n_w, per_w), worst = max(rows.items(), key=lambda kv: kv[1]["slowdown"])
    edges = nccl_dtree_edges(n_w)
    inside = sum(p // per_w == c // per_w for tree in edges for p, c in tree)
    total = sum(map(len, edges))
    sizes = f"{min(n for n, _ in rows)} to {max(n for n, _ in rows)} nodes"
    line = (f"In one line: at {o} NCCL's double binary tree would lose about "
            f"{worst['slowdown']:.2f}x in the worst of {len(rows)} setups ({sizes}), "
            f"against {far:.2f}x for this course's farthest-first tree (both arithmetic, not "
            f"runs),\nbecause {inside} of its {total} edges stay inside a leaf (at {n_w} nodes, "
            f"the figure). Assumed: ECMP spreads the crossing flows evenly; a hash collision "
            f"adds to it.")
    crossing = ["tree " + str(i + 1) + ": " + ", ".join(f"{p}-{c}" for p, c in tree
                                                          if p // per_w != c // per_w)
                for i, tree in enumerate(edges)]
    rest = [f"NCCL's double binary tree at {o}: arithmetic on ncclGetDtree's edges, not "
            f"modelled or run.",
            "B = the buffer; each tree carries B/2 up and B/2 down each of its edges; one NIC "
            "per node;",
            "a leaf's flows spread evenly over its uplinks; the busiest link sets the time.",
            f"Reading the {n_w}-node case: each NIC carries at most {worst['nic']:.1f} B each "
            f"way; the busiest leaf sends {worst['uplinks']:.1f} B up",
            f"through uplinks worth {worst['capacity']:g} NIC rate(s), so they need "
            f"{worst['uplinks']:.1f} / {worst['capacity']:g} / {worst['nic']:.1f} = "
            f"{worst['slowdown']:.2f} times the NICs' time.",
            f"The {total - inside} edges that cross leaves at {n_w} nodes (parent-child; leaf = "
            f"node // {per_w}):",
            "  " + "; ".join(crossing),
            "",
            f"nodes  per leaf | busiest NIC | busiest leaf's uplinks, each way | {o} costs"]
    for nodes, per_leaf in setups:
        t = rows[nodes, per_leaf]
        rates = f"{t['capacity']:g} NIC rate" + ("s" if t["capacity"] != 1 else "")
        rest.append(f"{nodes:>5}  {per_leaf:>8} | {t['nic']:>9.1f} B | {t['uplinks']:>5.1f} B "
                    f"over {rates:<19} | {t['slowdown']:.2f}x")
    rest += [f"{o} costs = (uplink bytes / uplink NIC rates) / busiest NIC's bytes, at least 1",
             f"This course's farthest-first tree, 8 nodes in leaves of 4: {far:.2f}x (closed "
             f"form, real frames)."]
    return line, rest


def explain_nccl_trees(*, far: float, setups: Sequence[tuple[int, int]] = NCCL_TREE_SETUPS,
                       oversubscription: float = 4) -> None:
    """Print `nccl_tree_lines`' one line, and show the rest behind a fold (its assumptions,
    edges and table are reference for the expert, not the main path)."""
    line, rest = nccl_tree_lines(far=far, setups=setups, oversubscription=oversubscription)
    print(line)
    fold("How the 1.50x is counted: the assumptions, the crossing edges, four setups",
         "\n".join(rest), pre=True)


def plot_nccl_tree(nodes: int = 16, *, nodes_per_leaf: int = 4, ax=None):
    """NCCL's double binary tree (`nccl_dtree_edges`) on `nodes` nodes in rank order, leaves
    of `nodes_per_leaf` shaded: tree 1's edges as arcs above the row of nodes, tree 2's below,
    an edge that crosses leaves red and thick, one inside a leaf grey. Short arcs are the
    lowest levels: they join neighbours, inside a leaf."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Arc

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.2))
    edges = nccl_dtree_edges(nodes)
    for leaf in range(nodes // nodes_per_leaf):
        lo = leaf * nodes_per_leaf - 0.45
        ax.axvspan(lo, lo + nodes_per_leaf - 0.1, color="0.93" if leaf % 2 else "0.86",
                   zorder=0)
        ax.text(lo + nodes_per_leaf / 2 - 0.05, -4.3, f"leaf {leaf}", ha="center", fontsize=8,
                color="0.3")
    crossing = 0
    for sign, tree in ((1, edges[0]), (-1, edges[1])):
        for p, c in tree:
            across = p // nodes_per_leaf != c // nodes_per_leaf
            crossing += across
            width = abs(p - c)
            ax.add_patch(Arc(((p + c) / 2, 0), width, width * 0.9, theta1=0 if sign > 0 else 180,
                             theta2=180 if sign > 0 else 360, lw=2 if across else 1,
                             color="tab:red" if across else "0.45"))
    ax.plot(range(nodes), [0] * nodes, "o", color="k", ms=5, zorder=3)
    for n in range(nodes):
        ax.text(n, 0.35, str(n), ha="center", fontsize=7)
    ax.text(-0.6, 3.2, "tree 1", fontsize=8, color="0.3")
    ax.text(-0.6, -3.5, "tree 2", fontsize=8, color="0.3")
    total = sum(map(len, edges))
    ax.set(xlim=(-0.8, nodes - 0.2), ylim=(-4.6, 4.2), yticks=[], xticks=[],
           title=f"NCCL's double binary tree on {nodes} nodes in rank order: "
                 f"{total - crossing} of {total} edges inside a leaf, {crossing} across (red)")
    ax.grid(False)
    for side in ("left", "right", "top", "bottom"):
        ax.spines[side].set_visible(False)
    return ax


def describe_step() -> None:
    """Print the data-parallel step the simulator plays (`clusterlab.widgets.fabric.SETUP`):
    gradients and their buckets (with the simulator's default first bucket), compute, the
    NIC, the ports, nodes per leaf and spines."""
    from clusterlab.sim import bucket_sizes, simulate_training
    from clusterlab.widgets import fabric as fw

    first = inspect.signature(simulate_training).parameters["first_bucket_bytes"].default
    buckets = bucket_sizes(fw.SETUP["model_bytes"], fw.SETUP["bucket_bytes"], first)
    print(f"step: {fw.SETUP['model_bytes'] / MiB:g} MiB of gradients in buckets of "
          f"{' + '.join(f'{b / MiB:g}' for b in buckets)} MiB, {fw.SETUP['compute_s'] * 1e3:g} "
          f"ms of compute, NIC '{fw.SETUP['nic']}', ports '{fw.PORT}', {fw.NODES_PER_LEAF} "
          f"nodes per leaf, {fw.SPINES} spines")


LABEL = {"ring": "ring, ordered by leaf", "tree": "tree, farthest first"}


def plot_efficiency(curves: dict, ax=None):
    """The simulated scaling efficiency against nodes (`curves`: (algorithm, o) ->
    efficiency at `fw.NODES`): 4:1 solid, 1:1 dashed with large hollow squares so that a
    4:1 curve on top of it stays visible, its legend saying so where the two coincide; a line
    marks one leaf."""
    import matplotlib.pyplot as plt

    from clusterlab.widgets import fabric as fw

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    for (a, o), eff in curves.items():
        under = o == 1 and np.allclose(eff, curves.get((a, 4), np.nan), atol=0.005)
        ax.plot(fw.NODES, eff, "o-" if o == 4 else "s--", color="C0" if a == "ring" else "C3",
                lw=2 if o == 4 else 1, ms=5 if o == 4 else 10, mfc=None if o == 4 else "none",
                label=f"{LABEL[a]}, {o}:1" + (" (hidden under 4:1: the same)" if under else ""))
    ax.set_xscale("log", base=2)
    ax.set_xticks(fw.NODES, [str(n) for n in fw.NODES])
    ax.axvline(fw.NODES_PER_LEAF, color="0.8", lw=1)
    ax.text(fw.NODES_PER_LEAF * 1.03, 1.02, "one leaf", fontsize=8, color="0.45", va="top")
    ax.set(xlabel="nodes", ylabel="scaling efficiency", ylim=(0, 1.05),
           title="data-parallel step, 25 MiB of gradients, simulated (8 nodes per leaf, 2 spines)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return ax


def explain_efficiency(curves: dict) -> None:
    """Print the efficiency at the largest node count, 4:1 against non-blocking, and check
    that oversubscription cost the farthest-first tree more than the ring."""
    from clusterlab.widgets import fabric as fw

    n = fw.NODES[-1]
    eff = {key: c[-1] for key, c in curves.items()}
    print(f"At {n} nodes (simulated), scaling efficiency at 4:1 against non-blocking:")
    print(f"  ring {eff['ring', 4]:.0%} against {eff['ring', 1]:.0%}; "
          f"farthest-first tree {eff['tree', 4]:.0%} against {eff['tree', 1]:.0%}")
    assert eff["tree", 1] - eff["tree", 4] > eff["ring", 1] - eff["ring", 4]


def hash_agrees(row: dict, *, sigmas: float = 3) -> bool:
    """Whether the fabric's share of seeds with a collision lies within `sigmas` standard
    errors (of a binomial share over `row['seeds']` seeds) of the birthday problem's value."""
    se = np.sqrt(max(row["collision_model"] * (1 - row["collision_model"]), 1e-12)
                 / row["seeds"])
    return abs(row["collisions"] - row["collision_model"]) <= sigmas * se + 1e-9


def print_hashing(hashing: Sequence[dict]) -> None:
    """Print, per flow count, the fabric's hash against the birthday problem and balls in
    bins (`hashing`: `ex.ecmp_hashing` rows), checking each collision share against it."""
    print(f"{hashing[0]['seeds']} hash seeds per row | P(collision): fabric's hash, birthday "
          f"| busiest uplink: fabric's hash, balls in bins")
    for r in hashing:
        print(f"  {r['flows']:>2} flows on {r['spines']} uplinks | {r['collisions']:.3f}, "
              f"{r['collision_model']:.3f} | {r['max_load']:.2f}, {r['max_load_model']:.2f} flows")
        assert hash_agrees(r)


def busiest_of_all_outcomes(*, flows: int, uplinks: int) -> np.ndarray:
    """The busiest uplink's flows in every one of the uplinks^flows equally likely ways to
    hash `flows` flows onto `uplinks` uplinks."""
    outcomes = np.array(np.meshgrid(*[range(uplinks)] * flows)).reshape(flows, -1).T
    return np.array([np.bincount(o, minlength=uplinks).max() for o in outcomes])


def explain_all_outcomes(*, flows: int, uplinks: int) -> None:
    """Print how often the busiest uplink carries 1..`flows` flows, counted over every hash
    outcome, and check it against `fm.max_load_distribution`."""
    busiest = busiest_of_all_outcomes(flows=flows, uplinks=uplinks)
    law = fm.max_load_distribution(flows, uplinks)
    print(f"{flows} flows on {uplinks} uplinks, all {len(busiest)} outcomes; the busiest uplink "
          f"carries")
    print("  " + ", ".join(f"{m} flow(s) in {np.sum(busiest == m)} ({np.mean(busiest == m):.1%})"
                           for m in range(1, flows + 1)))
    print("  (fm.max_load_distribution gives the same law)")
    assert np.allclose([np.mean(busiest == m) for m in range(1, flows + 1)], law[1:flows + 1])


def ecmp_classes(rounds: Sequence[dict]) -> tuple[dict, dict, dict]:
    """The measured rounds grouped by their busiest uplink's flows (`rounds`:
    `ex.ecmp_rounds` rows): peak -> rows, peak -> closed form (checked to be one per class),
    and peak -> the fastest best run of the class.

    Whichever flow an uplink serves first, the round ends when its last is through, so this
    machine's noise only lengthens a round and the fastest pairing of a class is the least
    disturbed one."""
    by_peak, model_of = {}, {}
    for r in rounds:
        by_peak.setdefault(r["peak"], []).append(r)
        model_of[r["peak"]] = r["model"]
    assert all(abs(r["model"] - model_of[r["peak"]]) < 1e-9 for r in rounds)  # one per class
    fastest = {p: min(r["best"] for r in rs) for p, rs in by_peak.items()}
    return by_peak, model_of, fastest


def collisions_as_predicted(check: float, exact: float, ratios: Sequence[float]) -> bool:
    """The ECMP verdict: the measured worst/luckiest ratio `check` within 10% of the closed
    form's `exact`, and the rounds' best/closed-form `ratios` under 1.15 at the median."""
    return abs(check / exact - 1) < 0.1 and np.median(ratios) < 1.15


def explain_ecmp_rounds(rounds: Sequence[dict]) -> None:
    """Print, per class of pairings (the busiest uplink's flows), the closed form against
    the fastest measured round; the unluckiest class against the luckiest, measured and in
    the closed form, and why that is not the flows' ratio; check that no round beat its
    closed form, and state the verdict."""
    by_peak, model_of, fastest = ecmp_classes(rounds)
    repeats = max(len(r["times"]) for r in rounds)
    print(f"busiest uplink | pairings | closed form | fastest of the class (each pairing run "
          f"{repeats}x)")
    for peak, rs in sorted(by_peak.items()):
        print(f"{peak:>6} flow(s) | {len(rs):>8} | {ms(model_of[peak]):>11} | "
              f"{ms(fastest[peak])}")
    lucky, worst = min(by_peak), max(by_peak)
    exact = model_of[worst] / model_of[lucky]
    check = fastest[worst] / fastest[lucky]
    ratios = [r["best"] / r["model"] for r in rounds]
    print(f"Same four senders and bytes, non-blocking fabric: {worst} on one uplink took "
          f"{check:.2f}x the spread round.")
    print(f"Closed form {exact:.2f}x, not {worst}x: each flow also pays the delay and the store "
          f"and forward of a {SEGMENT_BYTES // KiB} KiB segment at every hop, which do not grow.")
    assert lucky == 1 and worst >= 2
    assert min(ratios) > 0.98  # an exact closed form for one round: never early
    off = [fastest[p] / model_of[p] - 1 for p in by_peak]
    # the figure plots every pairing's best run: name the ones far above the closed form,
    # which a class's fastest hides (each pairing's repeats run back to back, in run order)
    far = [(i, r) for i, r in enumerate(rounds) if r["best"] > FAR_ABOVE * r["model"]]
    print(f"Pairings whose best of {repeats} sat over {FAR_ABOVE:.2f}x their closed form: "
          f"{len(far)} of {len(rounds)}.")
    for peak in sorted(by_peak):
        i, r = max(((i, r) for i, r in far if r["peak"] == peak),
                   key=lambda ir: ir[1]["best"] / ir[1]["model"], default=(None, None))
        if r is not None:
            print(f"  slowest with {peak} flow(s): best {ms(r['best'])} = "
                  f"{r['best'] / r['model']:.2f}x its closed form, number {i + 1} of "
                  f"{len(rounds)} in run order, {runs(r)}: slow on every repeat; "
                  f"not explained here")
    conclude(collisions_as_predicted(check, exact, ratios),
             f"the colliding pairings took the closed form's ratio within 10%; each class's "
             f"fastest run sat {min(off):+.1%} to {max(off):+.1%} from its closed form",
             busy=ex.slowed(rounds))


def _rail_excess(rl, rail_rep) -> tuple[dict, str, bool]:
    """Each layout's median over its replay's fastest, in time: (those excesses by layout, the
    layout with more, whether the two are alike: the smaller at least half the larger, or
    neither above its replay). One rule for the main path's verdict and the appendix's."""
    extra = {r["layout"]: r["median"] - lo for r, (lo, _) in zip(rl, rail_rep)}
    big, small = sorted(extra, key=extra.get, reverse=True)
    return extra, big, extra[big] <= 0 or extra[small] > 0.5 * extra[big]


def explain_rails(rl: Sequence[dict], rail_model: dict, *,
                  rail_rep: Sequence[tuple[float, float]], repeats: int) -> None:
    """Print the two layouts' medians (`rl`: `ex.rails` rows, aligned then naive) and their
    ratio beside the replay's (`rail_rep`: each layout's replay range, messages served in
    turn) and the closed form's (`rail_model`: layout -> closed-form time, equal sharing),
    what the naive layout's spine carried, and whether naive took over twice the aligned
    time."""
    aligned, naive = rl
    (a_lo, _), (n_lo, _) = rail_rep
    print(f"Medians of {repeats} runs: rail-aligned {ms(aligned['median'])}, naive "
          f"{ms(naive['median'])}.")
    print(f"Naive took {naive['median'] / aligned['median']:.2f}x; the replay (the emulator's "
          f"schedule without processes) {n_lo / a_lo:.2f}x, the closed form "
          f"{rail_model['naive'] / rail_model['aligned']:.2f}x.")
    print(f"Naive, {naive['crowd']} inter-node flows shared each {naive['bottleneck']} of the "
          f"spine.")
    over = {r["layout"]: r["median"] / lo - 1 for r, (lo, _) in zip(rl, rail_rep)}
    _, big, alike = _rail_excess(rl, rail_rep)
    effect = ("about alike" if alike else
              "which shrinks the ratio" if big == "aligned" else "which grows the ratio")
    print(f"The medians sit {over['aligned']:+.0%} (aligned) and {over['naive']:+.0%} (naive) "
          f"from their replays, {effect} (appendix).")
    conclude(naive["median"] > 2 * aligned["median"],
             "the naive layout took over twice the rail-aligned one", busy=ex.slowed(rl))


def show_takeaways(med: dict[str, float], rounds: Sequence[dict], rl: Sequence[dict], *,
                   real_ring: float) -> None:
    """The key takeaways, one per idea, each with the number this run printed for it (`med`:
    `median_ratios`; `rounds`: `ex.ecmp_rounds` rows; `rl`: `ex.rails` rows; `real_ring`: the
    ring's closed-form o = 4 / o = 1 with real frames)."""
    _, _, fastest = ecmp_classes(rounds)
    lucky, worst = min(fastest), max(fastest)
    spread = fastest[worst] / fastest[lucky]
    aligned, naive = rl
    n = len(naive["times"])  # the runs behind each median
    say(f"""- **Oversubscription hurts traffic without locality:** at 4:1 the farthest-first
  tree took {med['tree']:.2f}x its non-blocking time, the leaf-ordered ring {med['ring']:.2f}x
  (medians of {n} runs; {real_ring:.2f}x with real frames, closed form). *For you:* order
  ranks leaf by leaf, and check per-leaf uplink counters before blaming the model.
- **A round waits for the busiest uplink ECMP's hash gives it:** {worst} flows on one uplink
  took {spread:.2f}x the spread round (the fastest run of each class). *For you:* a step
  time that varies from job to job with the same code can be a hash collision.
- **Rails keep a hierarchical all-reduce off the spine:** the naive layout took
  {naive['median'] / aligned['median']:.2f}x the rail-aligned one at a 4:1 spine (medians of
  {n} runs). *For you:* keep GPU i on NIC i on every node.""")


def store_and_forward(closed: dict, *, rate: float) -> tuple[float, float, int]:
    """The ring's closed-form extra time from o = 1 to o = 4 (`closed` as in
    `print_closed_forms`), one segment's extra store-and-forward time on a slower hop (one
    spine, 4 nodes per leaf, `rate` the NIC's bit/s), and the leaf crossings on the ring's
    longest chain of dependent steps that the two imply (checked to be whole)."""
    up = {o: fm.uplink_rate_bps(port_rate_bps=rate, nodes_per_leaf=4, spines=1,
                                oversubscription=o) for o in (1, 4)}
    per_hop = (SEGMENT_BYTES + HEADER_BYTES) * 8 * (1 / up[4] - 1 / up[1])
    extra = closed["ring", 4] - closed["ring", 1]
    # the longest chain of dependent steps: step k of node n waits for node n - 1's step k - 1,
    # so the chain walks the ring's 2(p - 1) = 14 steps, crossing the leaf boundary at most 4 times
    crossings = round(extra / (2 * per_hop))
    assert abs(extra - crossings * 2 * per_hop) < 1e-6
    return extra, per_hop, crossings


def explain_store_and_forward(over: Sequence[dict], closed: dict, *, rate: float) -> None:
    """Appendix: print the ring's closed-form extra time at 4:1 as leaf crossings times
    store and forward, the measured extra between medians with its margin, and, when the
    margin resolves it, whether the two agree (`conclude`); then each slowdown between
    medians against the closed form with the emulator's segments."""
    store_forward, per_hop, crossings = store_and_forward(closed, rate=rate)
    up = {o: fm.uplink_rate_bps(port_rate_bps=rate, nodes_per_leaf=4, spines=1,
                                oversubscription=o) for o in (1, 4)}
    row = {(r["algorithm"], r["oversubscription"]): r for r in over}
    ring1, ring4 = row["ring", 1.0], row["ring", 4.0]
    extra = ring4["median"] - ring1["median"]
    slack = max(abs(r["median"] - r["model"]) for r in (ring1, ring4))
    print(f"ring, o = 1 -> 4: closed form +{ms(store_forward)} = {crossings} leaf crossings on "
          f"the longest chain x 2 hops x {ms(per_hop)}")
    print(f"  (one segment stored and forwarded at {up[4] / 1e6:g} instead of "
          f"{up[1] / 1e6:g} Mbit/s)")
    print(f"  measured +{ms(extra)} between medians, each median within {ms(slack)} of its "
          f"closed form")
    if slack < store_forward / 3:
        conclude(abs(extra - store_forward) <= slack,
                 "the ring's extra time at 4:1 is consistent with its segments' store and "
                 "forward", busy=ex.slowed(over))
    else:
        print(f"Cannot tell on this run: a margin of {ms(slack)} is too wide to resolve "
              f"{ms(store_forward)}.")
    med = median_ratios(over)
    seg = {a: closed[c, 4] / closed[c, 1] for a, c in CASE.items()}  # emulator segments
    off = {a: med[a] / seg[a] - 1 for a in ("ring", "tree_neighbours_first")}
    print(f"o = 4 / o = 1 between medians against the closed form with the emulator's "
          f"segments: ring {med['ring']:.2f}x vs {seg['ring']:.2f}x ({off['ring']:+.0%}), "
          f"neighbours-first tree {med['tree_neighbours_first']:.2f}x vs "
          f"{seg['tree_neighbours_first']:.2f}x ({off['tree_neighbours_first']:+.0%})")


def replay_text(lo: float, hi: float) -> str:
    """A replay range as text: one time when the orders agree within 0.5%, else the range."""
    return span(lo, hi) if hi > 1.005 * lo else ms(lo)


def gap_outlier(gaps: dict) -> tuple[float, list[float]] | None:
    """The neighbours-first tree at o = 4 when its median sits over 5 points further above
    its fastest replay than any other setup's (`gaps`: (algorithm, o) -> median / fastest
    replay - 1): (its gap, the others'); None when it does not stand out."""
    nf4 = gaps["tree_neighbours_first", 4.0]
    rest = [g for key, g in gaps.items() if key != ("tree_neighbours_first", 4.0)]
    return (nf4, rest) if nf4 > max(rest) + 0.05 else None


def explain_oversubscription_details(over: Sequence[dict],
                                     replays: Sequence[tuple[float, float]], closed: dict,
                                     real: dict, *, cases: Sequence[tuple], orders: int,
                                     mtu: int) -> None:
    """Appendix: print every run against its replay range and closed form; how many of the
    farthest-first tree's runs at o = 4 fall in its replay range; how far each median sits
    from its fastest replay (or that the neighbours-first tree at 4:1 stands out); and the
    closed form's ratios with emulator segments, real `mtu`-byte frames and InfiniBand's
    largest MTU
    (`closed`, `real`, `cases` as in `print_closed_forms`, `orders`: the service orders
    replayed)."""
    for r, (lo, hi) in zip(over, replays):
        print(f"{CASE[r['algorithm']]}, o = {r['oversubscription']:g}: {runs(r)} (median "
              f"{ms(r['median'])}), replay " + replay_text(lo, hi)
              + f", closed form {ms(r['model'])}")
    for line in tree_gap_lines(over, replays):
        print(line)
    (far4, (lo4, hi4)) = by_setup(over, replays)["tree", 4.0]
    inside = sum(0.98 * lo4 <= x <= 1.02 * hi4 for x in far4["times"])
    print(f"farthest-first tree at o = 4: over {orders} service orders the replay spans "
          f"{span(lo4, hi4)}; {inside} of {len(far4['times'])} runs fall in it (within 2%)")
    gaps = {(r["algorithm"], r["oversubscription"]): r["median"] / lo - 1
            for r, (lo, _) in zip(over, replays)}
    outlier = gap_outlier(gaps)
    if outlier:
        nf4, rest = outlier
        print(f"Not explained here: the neighbours-first tree at o = 4 ran {nf4:+.0%} above "
              f"its fastest replay (median), the other setups {min(rest):+.0%} to "
              f"{max(rest):+.0%}. This run does not show that tree unaffected by "
              f"oversubscription.")
    else:
        print(f"every setup's median sits {min(gaps.values()):+.0%} to {max(gaps.values()):+.0%} "
              f"from its fastest replay")
    big = facts.get("infiniband.max_mtu_bytes").value  # InfiniBand's largest MTU
    bigger = {c: closed_form(4, a, r, frame=big) / closed_form(1, a, r, frame=big)
              for c, a, r in cases}
    print("closed form o = 4 / o = 1 with emulator segments: "
          + ", ".join(f"{c} {closed[c, 4] / closed[c, 1]:.2f}x" for c, *_ in cases))
    print(f"with {mtu} B frames (as real packets): "
          + ", ".join(f"{real[c]:.2f}x" for c, *_ in cases))
    print(f"with {big} B frames: " + ", ".join(f"{bigger[c]:.2f}x" for c, *_ in cases)
          + f", within {max(abs(bigger[c] - real[c]) for c, *_ in cases):.2f} of {mtu} B frames")


def explain_rail_details(rl: Sequence[dict], rail_rep: Sequence[tuple[float, float]],
                         rail_model: dict) -> None:
    """Appendix: print each layout's runs against its replay and closed form (`rl`:
    `ex.rails` rows, `rail_rep`: their replay ranges, `rail_model`: layout -> closed form),
    and naive / aligned in the closed form (equal sharing) and in the replay (served in
    turn), with how far the medians sit from their replays."""
    for r, (lo, hi) in zip(rl, rail_rep):
        print(f"{r['layout']}: {runs(r)} (median {ms(r['median'])}), replay "
              + (span(lo, hi) if hi > 1.005 * lo else f"{ms(lo)} (the same in every order tried)")
              + f", closed form {ms(r['model'])}")
    aligned, naive = rl
    (a_lo, _), (n_lo, _) = rail_rep
    print(f"naive / aligned: closed form (equal sharing) "
          f"{rail_model['naive'] / rail_model['aligned']:.2f}x, replay (messages served in "
          f"turn) {n_lo / a_lo:.2f}x. The medians sit {aligned['median'] / a_lo - 1:+.0%} "
          f"(aligned) and {naive['median'] / n_lo - 1:+.0%} (naive) from their replays.")
    extra, big, alike = _rail_excess(rl, rail_rep)
    print(f"In time: {ms(extra['aligned'])} (aligned) and {ms(extra['naive'])} (naive). Both "
          f"layouts send the same messages in the same rounds, so a fixed per-message cost "
          f"would add about the same to both; "
          + ("here it roughly does, though nothing in this run measures that cost."
             if alike else
             f"here {big} gains over twice as much, so that cost alone does not explain it, "
             f"and this "
             f"run cannot tell what does (not measured)."))


# The `facts.show` template beside the NCCL tree's figure: what NCCL's tree is, and why its
# lowest edges stay inside a leaf.
NCCL_TREE = """
**NCCL's own tree** is a [[nccl.double_binary_tree]] (two binary trees, each carrying half
the data) over the nodes in rank order, sent [[nccl.tree_chunk_pipeline]]. Its lowest edges
join neighbouring nodes, the levels above ever farther ones (as MPICH's binomial reduce pairs
[[mpich.binomial_reduce_order]]). Whether a call runs the ring or the tree is the tuner's
choice: [[nccl.tuner_model]].
"""

# The `facts.show` templates of "On a real GPU cluster": where the rank order comes from and
# what bounds traffic without locality; NCCL's channels and where ECMP collisions come from;
# rails in NVIDIA's reference architecture and in NCCL.
RANK_ORDER = """
**Rank order and locality.** NCCL keeps its [[nccl.ring_node_order]] and sees no leaves or
spines: sort hosts by leaf, and under c10d zero-pad hostnames (`node02`, not `node2`).

<details><summary>Where the order comes from (torchrun, Slurm, mpirun); placement by the scheduler; systems that bound traffic without locality</summary>

- **torchrun:** [[pytorch.torchrun_node_order]]. Under c10d, name hosts so that they sort by
  leaf, and pad the numbers: sorted as strings, `node10` comes before `node2`.
- **Slurm's srun or mpirun:** the node list's order. srun [[slurm.srun_block_distribution]];
  mpirun follows its hostfile.

Slurm's topology/tree ([[slurm.topology_tree]]) best-fits a job onto few leaves
(`--switches` caps their number); rank order still follows the launcher's.

Where traffic lacks locality, systems bound it or give it a non-blocking fabric: DeepSeek-V3
limits its all-to-all by sending each token to experts on at most [[deepseek_v3.node_limited_routing]], and Meta's RoCE
training fabric is [[meta.roce_ai_zone]]; the same paper's scheduler places a job's ranks by
a minimum cut across zones, to keep cross-zone traffic low.
</details>
"""  # noqa: E501 (prose shown verbatim)

ECMP_BOX = """
**Flows and collisions.** Routed Ethernet and RoCE fabrics hash each flow onto an uplink.
InfiniBand switches forward by destination along [[infiniband.sm_lft_routing]] (the
fabric's controller), so collisions
follow placement, unless adaptive routing (which NVIDIA's bring-up turns on) picks the port by
load.

<details><summary>Channels and queue pairs; InfiniBand's hashing and adaptive routing; more entropy on RoCE</summary>

NCCL splits a collective over **channels** (at most [[nccl.max_ctas]]). A channel is a
parallel copy of NCCL's ring, moving its own slice of the bytes, and each of its connections
opens one queue pair (a QP, as in [13](13_switches_incast_ecmp_rails.ipynb)) per
NIC, more if [[nccl.ib_qps_per_connection]] is raised. A ring ordered by leaf thus puts about
one flow per channel on a leaf's uplinks, together one NIC's worth with one NIC per node, and
a hash can stack several on one uplink.

Upstream OpenSM, a subnet manager, gives each destination address
one route by default, hence placement (NVIDIA's switches can also hash: [[nvidia.ib_hbf]]);
[[nvidia.ib_ar_sm]], which NVIDIA's bring-up procedure turns on, picks a port by load. On
RoCE, more flows per connection give ECMP more entropy (Meta's enhanced ECMP,
[[meta.roce_qp_entropy]]); spraying spreads one flow's packets over many paths
([[aws.efa_srd]]).
</details>
"""  # noqa: E501 (the fold's one-line summary)

RAILS_BOX = """
**Rails.** Keep each NIC index on its rail: GPU i on NIC i on every node.

<details><summary>Rails in NVIDIA's reference architecture and in NCCL (NCCL_CROSS_NIC, rail ids, PXN)</summary>

NVIDIA's reference architecture has [[nvidia.rail_optimized_ra]], so its spine is not
oversubscribed. [[nccl.cross_nic]] decides whether NCCL keeps a graph (its rings' and trees' paths) on
one rail: by [[nccl.rail_id]], else the same NIC on every node. With [[nccl.pxn]], NCCL
reaches another rail over NVLink.
</details>
"""  # noqa: E501 (the fold's one-line summary)
