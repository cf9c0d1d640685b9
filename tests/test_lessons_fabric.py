"""The lesson modules of notebooks 13 and 13b: what they decide and print, from small synthetic
rows (closed forms for the models, made-up measured times), without running a cluster."""

from __future__ import annotations

import numpy as np
import pytest

from clusterlab import fabric_models as fm
from clusterlab import facts
from clusterlab.experiments import fabric as ex
from clusterlab.lessons import oversubscription_ecmp_rails as ob
from clusterlab.lessons import switches_incast_ecmp_rails as sw
from clusterlab.topology import Topology

MiB, KiB = ex.MiB, ex.KiB
RATE = ex.rate_bps(ex.NIC)


def incast_row(n: int, best: float, *, nbytes: int = MiB, limit: int | None = None) -> dict:
    """An `ex.incast` row with a made-up best time and the real closed form."""
    model = fm.incast(n, nbytes, rate_bps=RATE, delay_s=1e-3, buffer_packets=limit or 1000)
    return {"senders": n, "nbytes": nbytes, "model": model, "best": best, "median": best,
            "times": [best], "goodput": n * nbytes / best}


def drop_row(n: int, delivered: list[float], waited: list[float] | None = None) -> dict:
    """A drop-incast row (256 KiB, limit 6) whose one repetition's messages were delivered at
    `delivered` (s after the start, the senders' stamps) and whose in-order waits returned at
    `waited` (default: each no earlier than the one before)."""
    waited = waited or list(np.maximum.accumulate(delivered))
    row = incast_row(n, max(waited), nbytes=256 * KiB, limit=6)
    row["limit"] = 6
    row["delivered"] = {(i, 0): [t] for i, t in enumerate(delivered, 1)}
    row["arrivals"] = {(i, 0): [t] for i, t in enumerate(waited, 1)}
    return row


@pytest.fixture(scope="module")
def replays():
    """The drop incast replayed: all four sends at one instant, then 1 us apart."""
    return (ex.incast_replay(4, 256 * KiB, limit=6),
            ex.incast_replay(4, 256 * KiB, limit=6, stagger_s=1e-6))


def with_queue(rows: list[dict]) -> list[dict]:
    for r in rows:
        r["queue"] = r["best"] - rows[0]["best"]
    return rows


# --- notebook 13 ---------------------------------------------------------------------------


def test_nth_and_the_senders_each_loss_pattern_puts_where():
    lost = [[], [4], [1, 2, 3], [1, 2, 3, 4], [1]]  # k = 4 segments per message
    assert sw.nth(1) == "first" and sw.nth(4) == "fourth"
    assert sw.dropped_senders(lost) == [2, 3, 4, 5]
    # fewer than DUPTHRESH = 3 segments after the last loss: the RTO
    assert sw.rto_senders(lost, 4) == [2, 3, 4]
    assert sw.repaired_senders(lost, 4) == [5]  # segments 2, 3, 4 arrived after segment 1
    assert sw.rack_senders(lost, 4) == [3, 5]  # its segment 4 got through
    assert sw.tail_senders(lost, 4) == [4]  # nothing got through


def test_never_early_and_the_incast_verdict():
    rows = with_queue([incast_row(1, 0.0904), incast_row(4, 0.3423)])
    assert sw.never_early(rows)
    assert not sw.never_early([incast_row(1, 0.9 * rows[0]["model"].time_s)])
    assert sw.four_queued(rows[0], rows[1])
    # four no slower than three times one: not the incast
    slow_lone = with_queue([incast_row(1, 0.12), incast_row(4, 0.3423)])
    assert not sw.four_queued(slow_lone[0], slow_lone[1])


def test_explain_incast_states_the_verdict_once(capsys):
    rows = with_queue([incast_row(1, 0.0904), incast_row(2, 0.175), incast_row(4, 0.3423)])
    sw.explain_incast(rows)
    out = capsys.readouterr().out
    assert "One push 90.4 ms, four pushes 342.3 ms (closed form 342.1 ms)." in out
    assert "waited 251.9 ms behind the others" in out
    assert out.count("Shown on this run: the last of four pushes queued") == 1


def test_explain_incast_says_not_shown_when_this_machine_set_the_time(capsys):
    lone = incast_row(1, 0.3)  # over 1.3x its closed form: the machine was busy
    rows = with_queue([lone, incast_row(4, 0.35)])
    sw.explain_incast(rows)
    out = capsys.readouterr().out
    assert "Not shown on this run" in out and "\nShown on this run" not in "\n" + out


def test_explain_nic_and_the_leaf(capsys):
    sw.explain_nic(rate=RATE)
    sw.explain_leaf(Topology.build(8, 1, ex.NIC, fabric=ex.incast_fabric(8)))
    out = capsys.readouterr().out
    assert "takes 89.2 ms through a NIC and one port" in out
    assert "16 segments of 64 KiB" in out
    assert out.count("8 nodes on one leaf") == 1 and "then port 0, node 0's port" in out


def ps_ring(ps_best: float, ring_best: float) -> list[dict]:
    topo = Topology.build(8, 1, ex.NIC, fabric=ex.incast_fabric(8))
    flat = Topology.build(8, 1, ex.NIC)
    return [{"algorithm": a, "nbytes": MiB, "nodes": 8, "best": b, "median": b,
             "times": [b, b * 1.001], "model": fm.bottleneck_time(topo, a, MiB)[0],
             "crossbar": fm.bottleneck_time(flat, a, MiB)[0]}
            for a, b in (("parameter_server", ps_best), ("ring", ring_best))]


def test_explain_ps_vs_ring_splits_the_rings_closed_form(capsys):
    sw.explain_ps_vs_ring(ps_ring(1.1887, 0.2384), delay=1e-3, repeats=3)
    out = capsys.readouterr().out
    assert "8 nodes on one leaf, 1 MiB | measured (best of 3) | closed form" in out
    # the ring's three shares: 14 x (2w + w + 1 ms), and the server over the wire share ~ p
    assert ("14 rounds x (2w on the wire + w store and forward at the port + the delay) = "
            "146.9 ms + 73.5 ms + 14.0 ms = 234.4 ms.") in out
    assert "the parameter server's closed form is 8.1x the ring's wire share" in out
    assert "took 5.0x the ring's time (closed form 5.1x)." in out  # +2%: no appendix pointer
    assert out.count("Shown on this run: the parameter server took over twice") == 1


def test_the_replay_at_one_instant_is_the_closed_form_and_a_tie_costs_one_drop(replays):
    tie, skew = replays
    model = fm.incast(4, 256 * KiB, rate_bps=RATE, delay_s=1e-3, buffer_packets=6)
    assert tie["lost"] == ex.incast_drops(4, 256 * KiB, limit=6) == [[], [], [1, 2, 3],
                                                                      [1, 2, 3, 4]]
    assert tie["done"] == pytest.approx(model.message_s, abs=1e-6)  # no gap between the clocks
    # 1 us (even 1 ns) later the third sender's segment 3 gets in: a tie at the buffer
    assert skew["lost"] == [[], [], [1, 2], [1, 2, 3, 4]]
    assert ex.incast_replay(4, 256 * KiB, limit=6, stagger_s=1e-9)["lost"] == skew["lost"]
    w = (64 * KiB + 66) * 8 / RATE
    assert skew["time_s"] == pytest.approx(tie["time_s"] - w, abs=5e-6)


def test_per_message_cost_and_the_appendix(capsys, replays):
    ps, ring = ps_ring(1.1887, 0.2384)
    assert not sw.per_message_cost_visible(ps, ring)  # the ring +2% above its closed form
    ps_far, ring_far = ps_ring(1.1887, 0.27)
    assert sw.per_message_cost_visible(ps_far, ring_far)
    four = drop_row(4, [0.0273, 0.0483, 0.2169, 0.2383])
    sw.explain_appendix(ps_far, ring_far, four, *replays, stagger_s=1e-6, rate=RATE)
    out = capsys.readouterr().out
    assert "the ring's 14 rounds sit above their closed form" in out
    assert "its messages were delivered at 27.3, 48.3, 216.9, 238.3 ms (the emulated " \
           "delivery times the senders stamped)." in out
    assert "all at one instant: 27.2, 48.2, 222.0, 243.0 ms, 7 segments dropped" in out
    assert "1 us after the one before: 27.2, 48.2, 216.7, 237.7 ms, 6 dropped." in out
    assert out.count("A stagger of 1 us saves one drop, one resend (w = 5.2 ms) fewer: the "
                     "third sender's segment 3. At one instant it meets a backlog of exactly "
                     "6 segment times") == 1
    assert ("These fit the replay with 6 drops: each delivery within w/2 (2.6 ms) of it, the "
            "largest gap 0.56 ms (from the unrounded times).") in out
    # a run that met the tie fits the other replay; one far from both fits neither
    sw.explain_appendix(ps, ring, drop_row(4, [0.0273, 0.0483, 0.2221, 0.2431]), *replays,
                        stagger_s=1e-6, rate=RATE)
    sw.explain_appendix(ps, ring, drop_row(4, [0.0273, 0.0483, 0.2169, 0.2450]), *replays,
                        stagger_s=1e-6, rate=RATE)
    out = capsys.readouterr().out
    assert "fit the replay with 7 drops" in out and "fit neither replay within w/2" in out
    assert "2 of them came after the RTO, against 2 in both replays" in out
    assert "the run does not record its send times" in out
    assert "records neither" not in out and "order its processes reach" not in out
    sw.explain_appendix(ps, ring, drop_row(4, [0.0273, 0.2169, 0.2379, 0.2380]), *replays,
                        stagger_s=1e-6, rate=RATE)
    assert "3 of them came after the RTO, against 2" in capsys.readouterr().out
    # the deliveries, not the in-order waits: a message served first but waited on second
    # still counts at its own delivery (waits returned at 48.4, 48.4, 237.1, 237.2 ms)
    four = drop_row(4, [0.0484, 0.0272, 0.2371, 0.2167], [0.0484, 0.0484, 0.2371, 0.2372])
    sw.explain_appendix(ps, ring, four, *replays, stagger_s=1e-6, rate=RATE)
    out = capsys.readouterr().out
    assert "delivered at 27.2, 48.4, 216.7, 237.1 ms" in out
    assert "These fit the replay with 6 drops" in out


def test_round_times_keeps_the_stamped_deliveries_apart_from_the_waits():
    # rank 0 waited on (1, 0) then (2, 0); (2, 0) was delivered first but waited on second
    start = 10**9
    per_rank = [[(start, {(1, 0): start + 48_000_000, (2, 0): start + 48_100_000},
                  {(1, 0): start + 48_000_000, (2, 0): start + 27_000_000})], [(0, {}, {})],
                [(0, {}, {})]]
    row, = ex._round_times(per_rank, [[(1, 0), (2, 0)]], 1)
    assert row["arrivals"][(2, 0)] == [pytest.approx(0.0481)]
    assert row["delivered"][(2, 0)] == [pytest.approx(0.027)]
    assert row["best"] == pytest.approx(0.0481)  # the times still end at the last wait
    # without stamps (the other fabric runs), no `delivered`
    row, = ex._round_times([[(start, {(1, 0): start + 1000})], [(0, {})]], [[(1, 0)]], 1)
    assert "delivered" not in row


def test_explain_drops_names_the_senders_that_wait_for_the_rto(capsys, replays):
    drops = with_queue([drop_row(1, [0.028]), drop_row(2, [0.0273, 0.0484]),
                        drop_row(4, [0.0273, 0.0483, 0.2169, 0.2388])])
    sw.explain_drops(drops, replays[0], nbytes=256 * KiB)
    out = capsys.readouterr().out
    assert "the four sends at one instant: the third and fourth senders served lose 7 " \
           "segments between them." in out
    assert "No loss has 3 segments behind it, so no duplicate ACKs repair one: both wait " \
           "for the RTO (200.0 ms)." in out
    assert "The third sender's segment 4 got in after its losses" in out
    assert "Goodput fell 2.5x from two senders to four (best runs)." in out
    # the best run beside the range of all runs
    assert "      4 | 238.8 ms | 238.8 ms to 238.8 ms |    243.0 ms |" in out
    # the run against the replay is the appendix's (from the deliveries), not here
    assert "This run" not in out and "drops differ" not in out and "arrived" not in out
    assert "can save a segment" not in out and "RTO clock" not in out
    assert ("The best run of four (238.8 ms) came in under this closed form (243.0 ms): its "
            "senders did not start at one instant; the appendix shows which replay") in out
    assert out.count("Shown on this run: two senders finished within the RTO") == 1


def test_tcp_payload_and_the_linux_estimate():
    assert sw.tcp_payload_bytes(1500) == 1448  # 1500 - 20 (IPv4) - 32 (TCP with timestamps)
    pto, total = sw.linux_tlp_estimate(0.2004, rtt_s=20e-6, tlp_min_s=2e-3)
    assert pto == pytest.approx(2.04e-3)
    assert total == pytest.approx(0.2004 - fm.RTO_MIN_S + 2.04e-3)
    # a round trip longer than half the minimum RTO: the model's RTO is two round trips
    _, slow = sw.linux_tlp_estimate(1.0, rtt_s=0.2, tlp_min_s=0.0)
    assert slow == pytest.approx(1.0 - 0.4 + 0.4)


def test_explain_fast_incast_prints_the_models_fall(capsys):
    fast = {n: fm.incast(n, 256 * KiB, rate_bps=10e9, delay_s=10e-6, buffer_packets=6)
            for n in (2, 4)}
    sw.explain_fast_incast(fast, delay_s=10e-6, nbytes=256 * KiB)
    out = capsys.readouterr().out
    assert "two senders take 0.5 ms," in out
    assert "four take 200.4 ms (2 wait for the RTO): 208x less goodput." in out
    # Linux's probe timer is visible right under the model's figure (its assumptions: the fold)
    assert out.strip().splitlines()[2] == (
        "The 208x is this model's pessimistic timer. Linux's tail loss probe would fire after "
        "about 3.0 ms to 4.0 ms (2 SRTT + 2 ms, on whole kernel ticks) in place of its 200.0 ms "
        "RTO (fold below).")
    assert "Linux would take" not in out  # no incast time for Linux: the loss pattern differs
    lines = sw.linux_estimate_lines(fast, delay_s=10e-6, nbytes=256 * KiB)
    # the timer rounded up to whole jiffies: 2.04 ms -> 3 ms at HZ = 1000, 4 ms at HZ = 250
    assert "whole kernel ticks, HZ = 1000 or 250: 1 ms or 4 ms" in lines[1]
    assert lines[1].startswith("(SRTT: the smoothed round-trip time, taken unloaded, though "
                               "queueing during the incast lengthens it")
    assert "not the incast's time on Linux" in lines[1]


def test_linux_recovery_is_one_fold_naming_the_rack_and_the_tail_sender(monkeypatch):
    shown = []
    monkeypatch.setattr(facts, "show", lambda text, **_: shown.append(text))
    fast = {n: fm.incast(n, 256 * KiB, rate_bps=10e9, delay_s=10e-6, buffer_packets=6)
            for n in (2, 4)}
    sw.show_linux_recovery([[], [], [1, 2, 3], [1, 2, 3, 4]], fast=fast, delay_s=10e-6,
                           nbytes=256 * KiB, mtu=1500)
    text = " ".join(shown[0].split())
    assert text.startswith("<details><summary>How Linux TCP finds a loss sooner")
    assert text.endswith("</details>")  # all of it behind the fold
    assert "The emulator's time is its own figure. A message is 4 of its 64 KiB" in text
    assert "sends it as 182 frames of 1448 B of payload" in text
    assert "the third sender's segment 4 got through" in text and "segments 1, 2, 3 about" in text
    assert "the fourth sender delivered nothing to SACK" in text
    assert "**At 10 Gbit/s, the timer only:** Linux's tail loss probe would fire" in text


def test_plot_drops_marks_each_senders_repair():
    import matplotlib

    matplotlib.use("Agg")
    ax = sw.plot_drops([[], [3], [1], [1, 2, 3, 4]], nbytes=256 * KiB, limit=6)
    notes = [t.get_text() for t in ax.texts]
    assert notes == ["no loss", "1 delivered after its last loss: waits for the RTO",
                     "3 delivered after it: duplicate ACKs resend it",
                     "nothing delivered after its losses: waits for the RTO"]
    assert len(ax.patches) == 16
    assert "replay, all sends at one instant" in ax.get_title()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["delivered", "dropped, resent after the RTO",
                      "dropped, resent on duplicate ACKs"]
    # only the kinds that occur: no duplicate-ACK repair in the replay at one instant
    ax = sw.plot_drops([[], [], [1, 2, 3], [1, 2, 3, 4]], nbytes=256 * KiB, limit=6)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "delivered", "dropped, resent after the RTO"]


@pytest.mark.parametrize("template", [sw.LINUX_RECOVERY, sw.REAL_CLUSTER])
def test_the_boxes_cite_only_ledger_facts(template):
    ids = facts.placeholders(template)
    assert ids and set(ids) <= set(facts.ledger())


# --- notebook 13b --------------------------------------------------------------------------


def test_span_runs_and_replay_text():
    assert ob.span(0.0904, 0.0912) == "90.4-91.2 ms"
    assert ob.runs({"times": [0.0912, 0.0904, 0.0908]}) == "runs 90.4-91.2 ms"
    assert ob.replay_text(0.1, 0.1004) == "100.0 ms"  # orders within 0.5%: one time
    assert ob.replay_text(0.1, 0.11) == "100.0-110.0 ms"


def test_port_name_counts_node_ports_then_uplinks_then_downlinks():
    names = [ob.port_name(q, nodes=8, leaves=2, spines=2) for q in (0, 7, 8, 11, 12, 15)]
    assert names == ["node 0's port", "node 7's port", "uplink leaf 0 -> spine 0",
                     "uplink leaf 1 -> spine 1", "downlink spine 0 -> leaf 0",
                     "downlink spine 1 -> leaf 1"]


def test_explain_ports_follows_a_message_across_the_spine(capsys):
    fabric = ex.LeafSpine(nodes_per_leaf=4, spines=2, oversubscription=4)
    ob.explain_ports(fabric, Topology.build(8, 1, ex.NIC, fabric=fabric), rate=RATE)
    out = capsys.readouterr().out
    assert "8 uplinks and downlinks at 50 Mbit/s (closed form 50 Mbit/s)" in out
    assert "node 0 -> node 1: NIC, then node 1's port" in out
    assert ("node 0 -> node 5: NIC, then uplink leaf 0 -> spine 1, downlink spine 1 -> leaf 1, "
            "node 5's port") in out


def oversubscribed_rows(medians: dict, *, spread=(1.0, 1.0, 1.0)) -> list[dict]:
    """`ex.oversubscribed` rows with made-up medians and the real closed forms; each row's
    three runs are its median times `spread`."""
    rows = []
    for o in (1.0, 4.0):
        t = Topology.build(8, 1, ex.NIC, fabric=ex.leaf_spine(o))
        for a in ("ring", "tree", "tree_neighbours_first"):
            order = ex.neighbours_first_order(8) if a == "tree_neighbours_first" else None
            model = fm.bottleneck_time(t, "ring" if a == "ring" else "tree", 512 * KiB,
                                       ranks=order)[0]
            m = medians.get((a, o), model)
            rows.append({"oversubscription": o, "algorithm": a, "model": model, "median": m,
                         "best": m, "times": [f * m for f in spread]})
    return rows


CASES = (("ring", "ring", None), ("tree, farthest first", "tree", None),
         ("tree, neighbours first", "tree", ex.neighbours_first_order(8)),
         ("all-to-all", "alltoall", None))


@pytest.fixture(scope="module")
def closed():
    return {(c, o): ob.closed_form(o, a, r) for c, a, r in CASES for o in (1, 4)}


def test_median_ratios_and_the_oversubscription_verdict():
    rows = oversubscribed_rows({("tree", 1.0): 0.3, ("tree", 4.0): 0.54,
                                ("ring", 1.0): 0.174, ("ring", 4.0): 0.2066})
    med = ob.median_ratios(rows)
    assert med["tree"] == pytest.approx(1.8) and med["ring"] == pytest.approx(0.2066 / 0.174)
    assert ob.tree_slowed_most(med)
    assert not ob.tree_slowed_most({"tree": 1.35, "ring": 1.0, "tree_neighbours_first": 1.0})
    # 1.5x, but not 0.2 above the neighbours-first tree
    assert not ob.tree_slowed_most({"tree": 1.5, "ring": 1.0, "tree_neighbours_first": 1.4})


def test_explain_oversubscribed_says_why_the_tree_stays_under_2x(capsys, closed):
    rows = oversubscribed_rows({("tree", 1.0): 0.2996, ("tree", 4.0): 0.538})
    real = {c: 1.0 for c, *_ in CASES}
    ob.explain_oversubscribed(rows, ob.median_ratios(rows), closed, real, mtu=1500, repeats=3)
    out = capsys.readouterr().out
    assert "tree, farthest first     299.6 ms ->  538.0 ms  1.80x | 1.91x" in out
    # under the table: the ring's rise is the segments', then the verdict; the tree's reasons
    # are the appendix's (tree_gap_lines)
    lines = out.splitlines()
    assert lines[4] == ("The ring's rise in this run is the emulator's 64 KiB segments (closed "
                        "form 1.18x); with real 1500 B frames it is 1.00x (appendix).")
    assert lines[5].startswith("Shown on this run: oversubscription slowed the farthest-first")
    assert out.count("Shown on this run: oversubscription slowed the farthest-first tree") == 1
    assert ("In the appendix: where the farthest-first tree's 1.80x against its closed "
            "form's 1.91x") in out
    assert "(over 1.4x between medians of only 3 runs on this machine, a rough ratio)" in out


def test_print_closed_forms_says_which_column_to_carry_forward(capsys, closed):
    real = {c: 2.0 if c in ("tree, farthest first", "all-to-all") else 1.0 for c, *_ in CASES}
    ob.print_closed_forms(closed, real, cases=CASES, mtu=1500)
    out = capsys.readouterr().out
    # the main path shows only the real frames' ratios; the segments' sit beside the runs
    assert out.splitlines()[0] == ("closed form, 512 KiB per node in real 1500 B frames: time "
                                   "at o = 4 / time at o = 1")
    assert "  tree, farthest first    2.00x" in out and "segments" not in out


def test_nccl_tree_line_says_both_numbers_are_arithmetic(capsys):
    ob.explain_nccl_trees(far=1.98)
    out = capsys.readouterr().out
    assert ("would lose about 1.50x in the worst of 4 setups (8 to 64 nodes), against "
            "1.98x for this course's farthest-first tree (both arithmetic, not runs)") in out
    assert "Assumed: ECMP spreads the crossing flows evenly" in out
    assert "Below the closed form" not in out and "probably" not in out


def test_tree_gap_lines_put_only_what_the_replays_cover_down_to_service_order(closed):
    # r17's run: o = 1 median +12.8% and above every replay, o = 4 median -4.4% inside it
    rows = oversubscribed_rows({("tree", 1.0): 0.3323, ("tree", 4.0): 0.5377})
    replays = [(r["median"], r["median"]) for r in rows]
    replays[1], replays[4] = (0.2966, 0.3005), (0.5016, 0.5498)
    lines = ob.tree_gap_lines(rows, replays)
    assert lines[0].startswith("farthest-first tree: 1.62x between medians, 1.91x in the closed")
    assert "o = 1: median 332.3 ms, +12.8% from its closed form 294.6 ms" in lines[1]
    assert "above every replay, so not the service order" in lines[1]
    assert "o = 4: median 537.7 ms, -4.4% from its closed form 562.3 ms" in lines[2]
    assert lines[2].endswith("below the closed form: messages served in turn")
    assert "the o = 1 median makes 73% and the o = 4 median 27%" in lines[3]
    # both medians inside their replays: no machine timing named
    rows = oversubscribed_rows({("tree", 1.0): 0.2990, ("tree", 4.0): 0.5377})
    lines = ob.tree_gap_lines(rows, replays)
    assert "inside its replay range" in lines[1] and "machine" not in " ".join(lines)


def test_store_and_forward_counts_four_leaf_crossings(closed):
    extra, per_hop, crossings = ob.store_and_forward(closed, rate=RATE)
    assert crossings == 4
    assert extra == pytest.approx(4 * 2 * per_hop)


def test_explain_store_and_forward_resolves_only_a_narrow_margin(capsys, closed):
    ob.explain_store_and_forward(oversubscribed_rows({}), closed, rate=RATE)  # on the model
    out = capsys.readouterr().out
    assert "= 4 leaf crossings on the longest chain x 2 hops x 3.9 ms" in out
    assert out.count("Shown on this run: the ring's extra time at 4:1 is consistent") == 1
    assert "On this run (" not in out  # the claim is said once
    wide = oversubscribed_rows({("ring", 4.0): closed["ring", 4] + 0.03})
    ob.explain_store_and_forward(wide, closed, rate=RATE)
    out = capsys.readouterr().out
    assert "Cannot tell on this run: a margin of 30.0 ms is too wide" in out
    assert "Shown on this run" not in out


def test_gap_outlier_picks_out_only_a_standing_out_neighbours_first_tree():
    gaps = {("ring", 1.0): 0.01, ("tree", 4.0): 0.07, ("tree_neighbours_first", 4.0): 0.02}
    assert ob.gap_outlier(gaps) is None
    gaps["tree_neighbours_first", 4.0] = 0.13
    nf4, rest = ob.gap_outlier(gaps)
    assert nf4 == 0.13 and sorted(rest) == [0.01, 0.07]


def test_oversubscription_details_count_runs_inside_the_replay(capsys, closed):
    rows = oversubscribed_rows({("tree", 4.0): 0.53})
    rows[4]["times"] = [0.50, 0.53, 0.60]  # the farthest-first tree at o = 4
    replays = [(r["median"], r["median"]) for r in rows]
    replays[4] = (0.5016, 0.5498)
    real = {c: ob.closed_form(4, a, r, frame=1500) / ob.closed_form(1, a, r, frame=1500)
            for c, a, r in CASES}
    ob.explain_oversubscription_details(rows, replays, closed, real, cases=CASES, orders=20,
                                        mtu=1500)
    out = capsys.readouterr().out
    assert "over 20 service orders the replay spans 501.6-549.8 ms; 2 of 3 runs fall in it" in out
    assert "every setup's median sits +0% to +6% from its fastest replay" in out
    assert "with 4096 B frames: " in out and "of 1500 B frames" in out


def test_hash_agrees_within_three_standard_errors():
    row = {"collision_model": 0.5, "collisions": 0.5, "seeds": 1000}
    assert ob.hash_agrees(row)
    se = np.sqrt(0.25 / 1000)
    assert ob.hash_agrees({**row, "collisions": 0.5 + 2.9 * se})
    assert not ob.hash_agrees({**row, "collisions": 0.5 + 3.1 * se})
    assert ob.hash_agrees({"collision_model": 0.0, "collisions": 0.0, "seeds": 10})


def test_busiest_of_all_outcomes_is_the_balls_in_bins_law(capsys):
    busiest = ob.busiest_of_all_outcomes(flows=4, uplinks=4)
    assert len(busiest) == 256
    assert [int(np.sum(busiest == m)) for m in range(1, 5)] == [24, 180, 48, 4]
    assert sorted(ob.busiest_of_all_outcomes(flows=2, uplinks=2)) == [1, 1, 2, 2]
    ob.explain_all_outcomes(flows=4, uplinks=4)
    assert "1 flow(s) in 24 (9.4%), 2 flow(s) in 180 (70.3%)" in capsys.readouterr().out


def ecmp_row(peak: int, best: float, model: float) -> dict:
    return {"peak": peak, "best": best, "median": best, "times": [best], "model": model}


def test_ecmp_classes_and_the_collision_verdict(capsys):
    rounds = [ecmp_row(1, 0.0596, 0.0587), ecmp_row(1, 0.0600, 0.0587),
              ecmp_row(2, 0.1008, 0.1007), ecmp_row(3, 0.1428, 0.1427)]
    by_peak, model_of, fastest = ob.ecmp_classes(rounds)
    assert sorted(by_peak) == [1, 2, 3] and len(by_peak[1]) == 2
    assert fastest[1] == 0.0596 and model_of[3] == 0.1427
    with pytest.raises(AssertionError):  # two closed forms in one class
        ob.ecmp_classes(rounds + [ecmp_row(2, 0.11, 0.2)])
    assert ob.collisions_as_predicted(2.40, 2.43, [1.0, 1.01])
    assert not ob.collisions_as_predicted(2.0, 2.43, [1.0, 1.01])  # 18% off the ratio
    assert not ob.collisions_as_predicted(2.43, 2.43, [1.2, 1.2, 1.0])  # rounds typically slow
    ob.explain_ecmp_rounds(rounds)
    out = capsys.readouterr().out
    assert "3 on one uplink took 2.40x the spread round" in out
    assert "Closed form 2.43x, not 3x" in out
    assert out.count("Shown on this run: the colliding pairings") == 1


def rail_rows(aligned: float, naive: float) -> list[dict]:
    return [{"layout": "aligned", "model": 0.0983, "median": aligned, "best": aligned,
             "times": [aligned], "bottleneck": "nic", "crowd": 1},
            {"layout": "naive", "model": 0.3817, "median": naive, "best": naive,
             "times": [naive], "bottleneck": "downlink", "crowd": 2}]


def test_explain_rails_and_its_details(capsys):
    model = {"aligned": 0.0983, "naive": 0.3817}
    rep = [(0.0983, 0.0983), (0.3598, 0.3598)]
    ob.explain_rails(rail_rows(0.1006, 0.3611), model, rail_rep=rep, repeats=3)
    ob.explain_rail_details(rail_rows(0.1006, 0.3611), rep, model)
    out = capsys.readouterr().out
    # the replay's ratio beside the measured one: the runs' own overhead is not in the ratio
    assert ("Naive took 3.59x; the replay (the emulator's schedule without processes) 3.66x, "
            "the closed form 3.88x.") in out
    assert "The medians sit +2% (aligned) and +0% (naive) from their replays, about alike" in out
    assert "Naive, 2 inter-node flows shared each downlink of the spine." in out
    assert out.count("Shown on this run: the naive layout took over twice") == 1
    assert "replay 98.3 ms (the same in every order tried)" in out
    assert "replay (messages served in turn) 3.66x. The medians sit +2% (aligned)" in out


def test_explain_rails_not_shown_when_busy(capsys):
    ob.explain_rails(rail_rows(0.2, 0.39), {"aligned": 0.0983, "naive": 0.3817},
                     rail_rep=[(0.0983, 0.0983), (0.3598, 0.3598)], repeats=3)
    assert "Not shown on this run: the naive layout" in capsys.readouterr().out


def test_explain_efficiency_checks_the_tree_lost_more(capsys, monkeypatch):
    from clusterlab.widgets import fabric as fw

    monkeypatch.setattr(fw, "NODES", (8, 64))
    curves = {("ring", 1): np.array([1.0, 0.87]), ("ring", 4): np.array([1.0, 0.87]),
              ("tree", 1): np.array([0.9, 0.59]), ("tree", 4): np.array([0.9, 0.46])}
    ob.explain_efficiency(curves)
    out = capsys.readouterr().out
    assert "ring 87% against 87%; farthest-first tree 46% against 59%" in out
    curves["tree", 4] = np.array([0.9, 0.59])
    with pytest.raises(AssertionError):
        ob.explain_efficiency(curves)


def test_explain_oversubscribed_is_not_shown_when_the_run_was_slowed(capsys, closed):
    rows = oversubscribed_rows({("tree", 4.0): 0.35})
    rows[0]["best"] = 2 * rows[0]["model"]  # one run at twice its closed form: a busy machine
    ob.explain_oversubscribed(rows, ob.median_ratios(rows), closed,
                              {c: 1.0 for c, *_ in CASES}, mtu=1500, repeats=3)
    assert "Not shown on this run: oversubscription slowed" in capsys.readouterr().out


def test_describe_step_prints_the_simulated_buckets(capsys):
    ob.describe_step()
    out = capsys.readouterr().out
    assert out.startswith("step: 25 MiB of gradients in buckets of 1 + 24 MiB")


def test_show_takeaways_give_one_number_per_idea_with_its_sample_count(monkeypatch):
    said = []
    monkeypatch.setattr(ob, "say", said.append)
    med = {"ring": 1.15, "tree": 1.71, "tree_neighbours_first": 1.05}
    rounds = [{"peak": p, "best": m, "median": m, "times": [m, m, m], "model": m}
              for p, m in ((1, 0.0587), (2, 0.1007), (3, 0.1427))]
    ob.show_takeaways(med, rounds, rail_rows(0.1039, 0.3641), real_ring=1.01)
    (text,) = said
    assert "farthest-first\n  tree took 1.71x" in text and "ring 1.15x" in text
    assert "(medians of 1 runs; 1.01x with real frames, closed form)" in text
    assert "3 flows on one uplink\n  took 2.43x the spread round" in text
    assert "the naive layout took\n  3.50x the rail-aligned one" in text


def test_real_cluster_main_path_names_no_undefined_congestion_control():
    main, fold = sw.REAL_CLUSTER.split("<details>")
    assert "DCQCN" not in main and "meta.roce_no_dcqcn" in fold
    assert "[[infiniband.congestion_control]] slows the sources" in fold
    # InfiniBand's routes are static only without adaptive routing (NVIDIA's bring-up turns it on)
    assert "follow placement, unless adaptive routing" in ob.ECMP_BOX.split("<details>")[0]
