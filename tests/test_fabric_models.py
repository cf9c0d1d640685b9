"""clusterlab.fabric_models: incast, oversubscription, ECMP and rails, against known values,
Monte Carlo and the backend's own replay (`sim.simulate_collective`)."""

import math

import numpy as np
import pytest

from clusterlab import fabric_models as fm
from clusterlab import models
from clusterlab.experiments import fabric as ex
from clusterlab.experiments.allreduce_and_topology import alpha_beta, hierarchical_rail
from clusterlab.fabric import LeafSpine
from clusterlab.sim import simulate_collective
from clusterlab.topology import Topology
from clusterlab.wire import HEADER_BYTES, RTO_MIN_NS, SEGMENT_BYTES, wire_beta

NIC = "delay 1ms rate 100mbit"
MIB = 2**20


# --- ECMP: balls into bins ------------------------------------------------------------------


def test_birthday_and_per_flow_collisions():
    assert fm.collision_probability(23, 365) == pytest.approx(0.5073, abs=1e-4)
    assert fm.collision_probability(1, 8) == 0.0
    assert fm.collision_probability(9, 8) == 1.0
    assert fm.flow_collision_probability(2, 8) == pytest.approx(1 / 8)
    assert fm.flow_collision_probability(5, 1) == 1.0
    with pytest.raises(ValueError, match="uplinks"):
        fm.collision_probability(3, 0)
    with pytest.raises(ValueError, match="flows"):
        fm.expected_max_load(-1, 4)


@pytest.mark.parametrize("flows,uplinks", [(2, 2), (4, 4), (8, 4), (16, 8), (3, 10)])
def test_max_load_law_is_exact(flows, uplinks):
    law = fm.max_load_distribution(flows, uplinks)
    assert law.sum() == pytest.approx(1.0, abs=1e-12)
    assert law[: -(-flows // uplinks)].sum() == 0  # the busiest holds at least ceil(F / S)
    assert 1 - law[:2].sum() == pytest.approx(fm.collision_probability(flows, uplinks))
    rng = np.random.default_rng(0)
    draws = rng.integers(0, uplinks, size=(40_000, flows))
    peaks = (draws[:, :, None] == np.arange(uplinks)).sum(axis=1).max(axis=1)
    empirical = np.bincount(peaks, minlength=flows + 1) / len(peaks)
    assert np.abs(empirical - law).max() < 0.012


def test_expected_max_load_grows_beyond_perfect_spreading():
    assert fm.expected_max_load(2, 2) == pytest.approx(1.5)
    loads = [fm.expected_max_load(f, 8) for f in (1, 2, 4, 8, 16, 64)]
    assert loads == sorted(loads)
    assert all(load > max(1, f / 8) for load, f in zip(loads[1:], (2, 4, 8, 16, 64)))
    assert fm.expected_max_load(1024, 64) < 1024 / 64 * 2  # concentrates for many flows


def test_the_fabrics_ecmp_hash_is_balls_into_bins():
    row = ex.ecmp_hashing((4,), spines=4, seeds=1000)[0]
    p = fm.collision_probability(4, 4)
    assert abs(row["collisions"] - p) < 3 * math.sqrt(p * (1 - p) / 1000)
    assert row["max_load"] == pytest.approx(fm.expected_max_load(4, 4), abs=0.08)


def test_ecmp_round_time_waits_for_the_busiest_uplink():
    alpha, beta = 1e-3, wire_beta(100e6)
    one = fm.ecmp_round_time(1, 4, MIB, alpha=alpha, beta=beta)
    assert one == pytest.approx(alpha + MIB * beta)
    four = fm.ecmp_round_time(4, 4, MIB, alpha=alpha, beta=beta)
    assert four == pytest.approx(alpha + fm.expected_max_load(4, 4) * MIB * beta)


# --- incast ---------------------------------------------------------------------------------


def test_incast_without_drops_is_the_ports_drain():
    rate, n, k = 100e6, MIB, MIB // SEGMENT_BYTES
    w = (SEGMENT_BYTES + HEADER_BYTES) * 8 / rate
    for senders in (1, 2, 4, 8):
        r = fm.incast(senders, n, rate_bps=rate, delay_s=1e-3)
        assert r.time_s == pytest.approx(1e-3 + w + senders * k * w, rel=1e-9)
        assert r.mean_queue_s == pytest.approx((senders - 1) * k * w / 2, rel=1e-9)
        assert r.max_queue_s == pytest.approx((senders - 1) * k * w, rel=1e-9)
        assert r.drops == r.timeouts == 0
        assert r.link_share <= 1
    assert fm.incast(8, n, rate_bps=rate).link_share > 0.99  # the port never idles


def test_incast_drops_cost_a_timeout_and_goodput_collapses():
    small = 256 * 1024
    calm = fm.incast(2, small, rate_bps=1e9, delay_s=50e-6, buffer_packets=8)
    storm = fm.incast(8, small, rate_bps=1e9, delay_s=50e-6, buffer_packets=8)
    assert calm.drops == 0 and storm.drops > 0 and storm.timeouts > 0
    assert storm.time_s >= RTO_MIN_NS / 1e9
    assert calm.goodput / storm.goodput > 5
    for senders in (1, 2, 4, 8, 16):  # resent packets queue too: never beyond the port's rate
        assert fm.incast(senders, MIB, rate_bps=100e6, buffer_packets=16).link_share <= 1
    with pytest.raises(ValueError, match="buffer_packets"):
        fm.incast(2, MIB, rate_bps=1e9, buffer_packets=0)
    with pytest.raises(ValueError, match="rate_bps"):
        fm.incast(2, MIB, rate_bps=0)


def test_incast_matches_the_replay_without_drops():
    for senders in (2, 4):
        fabric = ex.incast_fabric(senders + 1, nic=NIC)
        replay = simulate_collective("gather", MIB, nodes=senders + 1, nic=NIC,
                                     fabric=fabric).max()
        model = fm.incast(senders, MIB, rate_bps=100e6, delay_s=1e-3).time_s
        assert replay == pytest.approx(model, rel=0.01)


@pytest.mark.parametrize("senders", [4, 8])
def test_incast_with_drops_matches_the_replay(senders):
    # A six-packet buffer: the late senders lose segments, TCP resends them after the RTO
    # and the resent segments queue at the port again (23 of them at 8 senders, ~5 ms each
    # at 100 Mbit/s: without that queue the replay ended 0.6x the closed form's time).
    fabric = ex.incast_fabric(senders + 1, limit=6, nic=NIC)
    replay = simulate_collective("gather", 256 * 1024, nodes=senders + 1, nic=NIC,
                                 fabric=fabric).max()
    model = fm.incast(senders, 256 * 1024, rate_bps=100e6, delay_s=1e-3, buffer_packets=6)
    assert model.timeouts > 0 and model.drops >= senders
    assert replay == pytest.approx(model.time_s, rel=0.02)
    # the RTO, then every resent segment through the port, one after another
    assert replay > RTO_MIN_NS / 1e9 + model.drops * SEGMENT_BYTES * 8 / 100e6


# --- oversubscription and rails -------------------------------------------------------------


def test_uplink_rate_and_factor():
    assert fm.uplink_rate_bps(port_rate_bps=1e9, nodes_per_leaf=4, spines=2,
                              oversubscription=2) == pytest.approx(1e9)
    assert fm.oversubscription_factor(4, nodes_per_leaf=4, spines=1, oversubscription=4) == 4
    assert fm.oversubscription_factor(1, nodes_per_leaf=4, spines=1, oversubscription=4) == 1
    with pytest.raises(ValueError, match="oversubscription"):
        fm.uplink_rate_bps(port_rate_bps=1e9, nodes_per_leaf=4, spines=1, oversubscription=0)


@pytest.mark.parametrize("algorithm", ["ring", "tree", "recursive_doubling", "rabenseifner"])
def test_bottleneck_form_on_a_crossbar_is_the_alpha_beta_form(algorithm):
    alpha, beta = alpha_beta(NIC)
    time, _ = fm.bottleneck_time(Topology.build(8, 1, NIC), algorithm, 4 * MIB)
    assert time == pytest.approx(models.allreduce_time(algorithm, 8, 4 * MIB, alpha, beta),
                                 rel=1e-9)


@pytest.mark.parametrize("o", [1, 4])
def test_bottleneck_form_agrees_with_the_replay_on_a_leaf_spine(o):
    fabric = LeafSpine(nodes_per_leaf=4, oversubscription=o)
    topo = Topology.build(8, 1, NIC, fabric=fabric)
    for algorithm in ("ring", "tree"):
        model, costs = fm.bottleneck_time(topo, algorithm, MIB)
        replay = simulate_collective("allreduce", MIB, nodes=8, nic=NIC, fabric=fabric,
                                     algorithm=algorithm).max()
        assert model == pytest.approx(replay, rel=0.05), (algorithm, o)
    tree = fm.bottleneck_time(topo, "tree", MIB)[1]
    assert max(c.flows_on_bottleneck for c in tree) == (4 if o > 1 else 1)  # 4 flows, 1 uplink


def test_rails_aligned_avoid_the_spine_and_naive_layouts_pay_its_share():
    intra = ex.INTRA
    topo = Topology.build(2, 2, NIC, intra, fabric="rail rails=2 oversubscription=4")
    aligned, costs = fm.bottleneck_time(topo, "hierarchical_rail", 4 * MIB)
    naive, naive_costs = fm.bottleneck_time(topo, "hierarchical_rail", 4 * MIB,
                                            ranks=ex.naive_rail_order(2, 2))
    assert {c.bottleneck for c in costs} <= {"intra", "nic", "port"}
    assert {c.bottleneck for c in naive_costs} & {"uplink", "downlink"}
    ai, bi = alpha_beta(intra)
    a, b = alpha_beta(NIC)
    formula = hierarchical_rail(2, 2, 4 * MIB, ai, bi, a, b, nics_per_node=2)
    assert aligned == pytest.approx(formula, rel=0.10)  # + store-and-forward at the port
    assert naive > 3 * aligned
    with pytest.raises(ValueError, match="permutation"):
        fm.bottleneck_time(topo, "ring", MIB, ranks=[0, 0, 1, 2])


# --- the oversubscription explorer ----------------------------------------------------------


def test_explorer_refuses_bad_settings_and_shows_the_tree_losing_more():
    from clusterlab.widgets import fabric as fw

    with pytest.raises(ValueError, match="oversubscription"):
        fw.OversubscriptionExplorer(oversubscription=3)
    with pytest.raises(ValueError, match="algorithm"):
        fw.efficiency_curve("butterfly", 4)
    nodes = [8, 16]  # one leaf, then two: the tree's top round crosses the spine
    tree = [fw.efficiency_curve("tree", o, nodes=nodes) for o in (1, 8)]
    assert tree[0][0] == pytest.approx(tree[1][0])  # inside one leaf the uplinks are idle
    assert tree[1][1] < tree[0][1] - 0.02


def test_replay_is_the_emulators_queue_model():
    """`ex.replay` equals the closed form where no port is shared unequally (the ring on a
    leaf-spine), and differs from it where whole messages queue (the tree at 4:1)."""
    topo = Topology.build(8, 1, ex.NIC, fabric=ex.leaf_spine(4))
    ring = ex.replay(topo, "ring", 512 * 1024)
    assert ring == pytest.approx(fm.bottleneck_time(topo, "ring", 512 * 1024)[0], rel=1e-6)
    tree = ex.replay(topo, "tree", 512 * 1024)
    assert tree < fm.bottleneck_time(topo, "tree", 512 * 1024)[0]


def test_replay_range_is_the_race_of_simultaneous_senders():
    """Where messages reach a port together (the farthest-first tree at 4:1), the order the
    port serves them changes the end: start offsets of a microsecond spread the replay; the
    ring, one flow per port, has no race, and its replay is its closed form."""
    topo = Topology.build(8, 1, ex.NIC, fabric=ex.leaf_spine(4))
    lo, hi = ex.replay_range(topo, "tree", 512 * 1024, orders=8)
    assert lo <= ex.replay(topo, "tree", 512 * 1024) <= hi and hi - lo > 0.01
    ring = ex.replay_range(topo, "ring", 512 * 1024, orders=4)
    assert ring[0] == pytest.approx(ring[1], rel=1e-4)
    assert ring[0] == pytest.approx(fm.bottleneck_time(topo, "ring", 512 * 1024)[0], rel=1e-3)


def test_incast_drops_are_the_emulators_and_the_closed_forms():
    """The emulator's port drops the heads of the late senders: the third of four loses
    segments 1-3 and delivers its 4th, the fourth loses all; the closed form counts the same."""
    drops = ex.incast_drops(4, 256 * 1024, limit=6)
    assert drops == [[], [], [1, 2, 3], [1, 2, 3, 4]]
    model = fm.incast(4, 256 * 1024, rate_bps=100e6, delay_s=1e-3, buffer_packets=6)
    assert model.drops == sum(map(len, drops)) and model.timeouts == 2
    assert ex.incast_drops(2, 256 * 1024, limit=6) == [[], []]


@pytest.mark.parametrize("o", [1, 4])
def test_alltoall_cost_is_the_uplink_or_the_nic_share(o):
    topo = Topology.build(8, 1, ex.NIC, fabric=ex.leaf_spine(o))
    cost = fm.alltoall_cost(topo, 512 * 1024)
    uplink = fm.uplink_rate_bps(port_rate_bps=100e6, nodes_per_leaf=4, spines=1,
                                oversubscription=o)
    assert cost.share_bps == pytest.approx(min(100e6 / 7, uplink / 16))  # 7 per NIC, 16 cross
    assert cost.messages == 56 and cost.nbytes == 64 * 1024
