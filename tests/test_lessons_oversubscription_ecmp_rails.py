"""Notebook 13b's lesson module, the parts added in review r13: NCCL's double binary tree
transcribed from src/graph/trees.cc and its edge counts, the regrouped oversubscription
figure, and what the closed-form and ECMP tables say about their statistics. (The rest of the
module is tested in test_lessons_fabric.py.)"""

from __future__ import annotations

import matplotlib
import pytest
from test_lessons_fabric import oversubscribed_rows as fabric_rows

from clusterlab.experiments import fabric as ex
from clusterlab.lessons import oversubscription_ecmp_rails as ob

KiB = ex.KiB


def edges(pairs: str) -> set[tuple[int, int]]:
    """'0-8 8-4' -> {(0, 8), (8, 4)}: (parent, child) edges written as in trees.cc's drawings."""
    return {tuple(int(x) for x in e.split("-")) for e in pairs.split()}


def test_btree_matches_the_drawing_in_trees_cc():
    # the first drawing of src/graph/trees.cc: 14 ranks, 0..13
    assert ob.nccl_dtree_edges(14)[0] == edges(
        "0-8 8-4 8-12 4-2 4-6 12-10 12-13 2-1 2-3 6-5 6-7 10-9 10-11")
    assert ob.nccl_btree(14, 0) == (-1, -1, 8)
    assert ob.nccl_btree(14, 13) == (12, -1, -1)
    assert ob.nccl_btree(1, 0) == (-1, -1, -1)


def test_dtree_mirrors_for_even_and_shifts_for_odd_node_counts():
    first, second = ob.nccl_dtree_edges(12)  # the mirror drawing: 12 ranks
    assert first == edges("0-8 8-4 8-10 4-2 4-6 10-9 10-11 2-1 2-3 6-5 6-7")
    assert second == edges("11-3 3-1 3-7 1-0 1-2 7-5 7-9 5-4 5-6 9-8 9-10")
    first, second = ob.nccl_dtree_edges(13)  # the shift drawing: 13 ranks
    assert first == edges("0-8 8-4 8-12 4-2 4-6 12-10 2-1 2-3 6-5 6-7 10-9 10-11")
    assert second == edges("1-9 9-5 9-0 5-3 5-7 0-11 3-2 3-4 7-6 7-8 11-10 11-12")
    for n in range(2, 70):  # every node in both trees, each tree a tree
        for tree in ob.nccl_dtree_edges(n):
            assert len(tree) == n - 1
            assert {c for _, c in tree} | {p for p, _ in tree} == set(range(n))


def test_tree_loads_count_the_edges_that_cross_leaves():
    eight = ob.nccl_tree_loads(8, 4, oversubscription=4)
    assert eight == {"nic": 2.0, "uplinks": 2.0, "capacity": 1.0, "slowdown": 1.0}
    sixteen = ob.nccl_tree_loads(16, 4, oversubscription=4)
    assert sixteen["uplinks"] == 3.0 and sixteen["slowdown"] == pytest.approx(1.5)
    assert ob.nccl_tree_loads(64, 8, oversubscription=4)["slowdown"] == 1.0
    assert ob.nccl_tree_loads(64, 8, oversubscription=8)["slowdown"] == pytest.approx(1.5)
    assert ob.nccl_tree_loads(16, 4, oversubscription=1)["slowdown"] == 1.0


def test_explain_nccl_trees_prints_each_setup_against_the_farthest_first_tree(capsys):
    line, rest = ob.nccl_tree_lines(far=1.98)
    assert line.startswith("In one line: at 4:1 NCCL's double binary tree would lose about 1.50x "
                           "in the worst of 4 setups (8 to 64 nodes), against 1.98x for this "
                           "course's farthest-first tree (both arithmetic, not runs)")
    assert line.endswith("Assumed: ECMP spreads the crossing flows evenly; a hash collision "
                         "adds to it.")
    assert "because 20 of its 30 edges stay inside a leaf (at 16 nodes, the figure)" in line
    assert "arithmetic on ncclGetDtree's edges" not in line  # the arithmetic sits in a fold
    ob.explain_nccl_trees(far=1.98)  # outside a notebook the fold prints its text as it is
    out = capsys.readouterr().out
    assert out.startswith(line)
    assert "arithmetic on ncclGetDtree's edges, not modelled or run" in out
    assert "   16         4 |       2.0 B |   3.0 B over 1 NIC rate" in out
    assert out.count("| 1.50x") == 2 and out.count("| 1.00x") == 2
    assert "3.0 B over 2 NIC rates" in out
    assert "farthest-first tree, 8 nodes in leaves of 4: 1.98x (closed form, real frames)" in out


def oversubscribed_rows() -> list[dict]:
    """`ex.oversubscribed` rows on their closed forms, with a spread of runs."""
    return fabric_rows({}, spread=(1.0, 1.01, 1.02))


def test_plot_oversubscribed_puts_each_algorithms_o1_and_o4_side_by_side():
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = oversubscribed_rows()
    ax = ob.plot_oversubscribed(rows)
    bars = sorted(ax.patches, key=lambda b: b.get_x())
    assert len(bars) == 6
    colours = [b.get_facecolor() for b in bars]
    assert colours[0] == colours[2] == colours[4] != colours[1]  # o = 1, o = 4, o = 1, ...
    med = ob.median_ratios(rows)
    assert sorted(t.get_text() for t in ax.texts) == sorted(f"{med[a]:.2f}x" for a in ob.CASE)
    assert [t.get_text() for t in ax.get_xticklabels()] == list(ob.NAMES.values())
    plt.close("all")
    ax = ob.plot_oversubscription_replays(rows, [(r["model"], r["model"]) for r in rows])
    assert len(ax.get_xticklabels()) == 6
    plt.close("all")


def test_the_one_leaf_label_sits_at_the_top():
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from clusterlab.widgets import fabric as fw

    n = len(fw.NODES)
    curves = {(a, o): np.linspace(0.9, 0.5, n) for a in ("ring", "tree") for o in (1, 4)}
    ax = ob.plot_efficiency(curves)
    (label,) = [t for t in ax.texts if t.get_text() == "one leaf"]
    assert label.get_position()[1] > 0.9
    plt.close("all")


def test_the_legend_says_when_a_1_to_1_curve_hides_under_its_4_to_1_curve():
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from clusterlab.widgets import fabric as fw

    n = len(fw.NODES)
    curves = {("ring", 1): np.linspace(0.9, 0.87, n), ("ring", 4): np.linspace(0.9, 0.87, n),
              ("tree", 1): np.linspace(0.8, 0.6, n), ("tree", 4): np.linspace(0.8, 0.45, n)}
    labels = ob.plot_efficiency(curves).get_legend_handles_labels()[1]
    assert "ring, ordered by leaf, 1:1 (hidden under 4:1: the same)" in labels
    assert "tree, farthest first, 1:1" in labels  # apart from its 4:1 curve: no note
    plt.close("all")


def test_the_tables_name_their_statistics(capsys):
    closed = {(c, o): 1.0 for c in ("ring", "tree, farthest first", "tree, neighbours first",
                                     "all-to-all") for o in (1, 4)}
    real = {"ring": 1.01, "tree, farthest first": 1.98, "tree, neighbours first": 1.0,
            "all-to-all": 2.25}
    ob.print_closed_forms(closed, real, cases=[(c,) for c in real], mtu=1500)
    out = capsys.readouterr().out
    # only the real frames' ratios (the lesson); the emulator's segments sit beside the runs
    assert "in real 1500 B frames: time at o = 4 / time at o = 1" in out
    assert "  ring                    1.01x" in out and "segments" not in out
    rounds = [{"peak": p, "best": m, "median": m, "times": [m, m, m], "model": m}
              for p, m in ((1, 0.0587), (2, 0.1007), (3, 0.1427))]
    ob.explain_ecmp_rounds(rounds)
    out = capsys.readouterr().out
    assert "fastest of the class (each pairing run 3x)" in out
    assert "each class's fastest run sat +0.0% to +0.0% from its closed form" in out


def test_plot_nccl_tree_draws_both_trees_and_marks_the_edges_across_leaves():
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = ob.plot_nccl_tree(16, nodes_per_leaf=4)
    arcs = [a for a in ax.patches if type(a).__name__ == "Arc"]
    assert len(arcs) == 30  # 15 edges per tree
    red = [a for a in arcs if a.get_linewidth() == 2]
    assert len(red) == 10  # the edges that cross leaves, as explain_nccl_trees counts them
    assert "20 of 30 edges inside a leaf, 10 across" in ax.get_title()
    plt.close("all")

