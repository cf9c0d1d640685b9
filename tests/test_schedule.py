"""Collective schedules against hand-computed times, and the topology they run on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterlab.link import LinkModel
from clusterlab.netem import LossGemodel, LossRandom, Netem
from clusterlab.schedule import (
    Collective,
    QueueState,
    _release,
    loss_probability,
    play,
)
from clusterlab.topology import Topology, parse_links
from clusterlab.wire import HEADER_BYTES, MAX_RETRANSMISSIONS

MS = 1_000_000


def finish(nodes, nic, coll, start=None, ppn=1, intra=None, seed=0, segment=65536):
    topo = Topology.build(nodes, ppn, nic, intra)
    fabric = QueueState(topo, segment_bytes=segment)
    start = np.zeros(topo.world_size, dtype=np.int64) if start is None else np.asarray(start)
    return play(fabric, coll, start, np.random.default_rng(seed))


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_ring_all_reduce_is_2_p_minus_1_delays(p):
    done = finish(p, "delay 3ms", Collective("allreduce", 4096))
    assert (done == 2 * (p - 1) * 3 * MS).all()


@pytest.mark.parametrize("p,rounds", [(2, 1), (4, 2), (8, 3), (3, 2), (6, 3)])
def test_recursive_doubling_rounds(p, rounds):
    # Non-powers of two fold the extra ranks in first and send the result back at the end.
    # The closed form counts lg(p') + 2 synchronous rounds; in the replay the ranks outside
    # the fold send their first exchange at once, which saves one round on the critical path.
    done = finish(p, "delay 1ms", Collective("allreduce", 4096, algorithm="recursive_doubling"))
    assert done.max() == rounds * MS


def test_rabenseifner_is_twice_lg_p_rounds():
    done = finish(8, "delay 1ms", Collective("allreduce", 1 << 20, algorithm="rabenseifner"))
    assert (done == 6 * MS).all()


def test_binomial_broadcast_reaches_depth_k_after_k_hops():
    done = finish(8, "delay 1ms", Collective("broadcast", 100, root=0))
    # netem's delay is pure latency: a parent's sends to its children leave together, so
    # rank r is reached after popcount(r) hops (not after its round number, as the
    # alpha-beta model counts when alpha occupies the sender).
    assert done.tolist() == [bin(r).count("1") * MS for r in range(8)]
    # With a rate the parent's NIC serialises its sends: later children wait their turn.
    timed = finish(8, "rate 8mbit", Collective("broadcast", 1000 - HEADER_BYTES, root=0))
    assert timed[4] == 3 * timed[1]  # the root's 3rd message, after two others (1 ms each)


def test_rate_serialises_each_round():
    n, p = 4 << 20, 4
    chunk = n // p
    wire = chunk + HEADER_BYTES * (-(-chunk // 65536))
    per_round = wire * 8 * 1e9 / 100e6
    done = finish(p, "rate 100mbit", Collective("allreduce", n))
    assert done.max() == pytest.approx(2 * (p - 1) * per_round, rel=1e-6)


def test_processes_of_a_node_share_its_nic():
    # Scatter from rank 0 of node 0 to 3 ranks on node 1: all three messages queue at NIC 0.
    n = 1 << 20
    one = (n + HEADER_BYTES * 16) * 8 * 1e9 / 1e9
    done = finish(2, "rate 1gbit", Collective("scatter", n, root=0), ppn=4)
    on_node1 = sorted(done[4:].tolist())
    assert on_node1 == pytest.approx([0, 0, 0, 0][:0] + [one, 2 * one, 3 * one, 4 * one], rel=1e-6)


def test_a_late_rank_delays_everyone():
    start = np.array([0, 0, 50 * MS, 0])
    done = finish(4, "delay 1ms", Collective("allreduce", 4096), start=start)
    assert done.min() >= 50 * MS  # nobody can finish an all-reduce before the last arrival


def test_jitter_only_adds_time_and_is_seeded():
    plain = finish(4, "delay 5ms", Collective("allreduce", 1 << 20))
    a = finish(4, "delay 5ms 1ms", Collective("allreduce", 1 << 20), seed=1)
    b = finish(4, "delay 5ms 1ms", Collective("allreduce", 1 << 20), seed=1)
    c = finish(4, "delay 5ms 1ms", Collective("allreduce", 1 << 20), seed=2)
    assert (a == b).all() and not (a == c).all()
    assert abs(a.max() - plain.max()) <= 6 * MS  # 6 rounds, each at most 1 ms off


def test_barrier_and_alltoall_and_gather():
    assert finish(8, "delay 1ms", Collective("barrier")).max() == 3 * MS
    assert finish(4, "delay 2ms", Collective("alltoall", 4096)).max() == 2 * MS
    done = finish(4, "delay 2ms", Collective("gather", 10, root=3))
    assert done[3] == 2 * MS and done[:3].tolist() == [0, 0, 0]


def test_hierarchical_uses_fast_intra_links():
    coll = Collective("allreduce", 1 << 20, algorithm="hierarchical")
    flat = Collective("allreduce", 1 << 20)
    slow_nic = dict(nodes=2, ppn=4, nic="delay 10ms", intra="delay 100us")
    assert finish(coll=coll, **slow_nic).max() < finish(coll=flat, **slow_nic).max()


@pytest.mark.parametrize("nodes,ppn", [(2, 2), (3, 2), (2, 4), (4, 1), (1, 4), (3, 3)])
def test_rail_hierarchical_is_2_p_minus_1_intra_and_2_n_minus_1_inter_delays(nodes, ppn):
    # Pure latency: every round is one delay. Reduce-scatter and all-gather inside the node
    # (P-1 rounds each, 100 us), then the rails' rings of N ranks (2(N-1) rounds, 1 ms).
    coll = Collective("allreduce", 1 << 20, algorithm="hierarchical_rail")
    done = finish(nodes, "delay 1ms", coll, ppn=ppn, intra="delay 100us")
    assert (done == 2 * (ppn - 1) * MS // 10 + 2 * (nodes - 1) * MS).all()


@pytest.mark.parametrize("nodes,ppn", [(2, 2), (4, 2), (2, 4), (3, 2)])
@pytest.mark.parametrize("intra", ["delay 100us rate 10gbit", "delay 5ms rate 200mbit"])
def test_rail_hierarchical_replay_matches_its_closed_form(nodes, ppn, intra):
    from clusterlab.experiments import allreduce_and_topology as ex

    n = 4 << 20
    coll = Collective("allreduce", n, algorithm="hierarchical_rail")
    replay = finish(nodes, ex.NIC, coll, ppn=ppn, intra=intra).max() / 1e9
    model = ex.predict("hierarchical_rail", n, nodes, ppn, ex.NIC, intra)
    # The replay pipelines: a rail whose message is served first starts its next round
    # before the node's last rail, so it may beat the synchronous closed form a little.
    assert 0.9 < replay / model <= 1.0 + 1e-6


def test_rail_hierarchical_beats_the_leader_when_intra_links_are_slow():
    # Same NIC bytes for both; inside the node the leader moves the whole tensor twice,
    # the rails' ring stages (P-1)/P of it twice.
    n, slow = 4 << 20, "delay 5ms rate 200mbit"
    rail = finish(2, slow, Collective("allreduce", n, algorithm="hierarchical_rail"), ppn=2,
                  intra=slow).max()
    leader = finish(2, slow, Collective("allreduce", n, algorithm="hierarchical"), ppn=2,
                    intra=slow).max()
    assert rail < 0.75 * leader


def test_rail_hierarchical_on_uneven_groups_replays_as_the_leader_scheme():
    topo = Topology.build(2, 2, "delay 1ms", "delay 100us")
    glob = np.array([0, 1, 2])  # node 0 holds two of the group's ranks, node 1 one
    times = []
    for algo in ("hierarchical_rail", "hierarchical"):
        fabric = QueueState(topo)
        times.append(play(fabric, Collective("allreduce", 4096, algorithm=algo),
                          np.zeros(3, dtype=np.int64), np.random.default_rng(0), ranks=glob))
    assert (times[0] == times[1]).all()


def test_unknown_names_are_errors():
    with pytest.raises(ValueError, match="butterfly"):
        finish(4, "delay 1ms", Collective("allreduce", 1, algorithm="butterfly"))
    with pytest.raises(ValueError, match="allsum"):
        finish(4, "delay 1ms", Collective("allsum", 1))


def test_stationary_loss_of_gilbert_elliott():
    spec = Netem(loss=LossGemodel(p=1.0, r=9.0, one_minus_h=50.0, one_minus_k=0.0))
    assert loss_probability(spec) == pytest.approx(0.1 * 0.5)


def test_loss_costs_retransmissions():
    clean = finish(2, "delay 1ms", Collective("allreduce", 1 << 20))
    lossy = [finish(2, "delay 1ms loss 20%", Collective("allreduce", 1 << 20), seed=s).max()
             for s in range(20)]
    assert min(lossy) >= clean.max() and max(lossy) >= 200 * MS  # some RTO somewhere


def test_total_loss_gives_up_where_the_link_model_and_linux_do():
    # One retransmission limit for the replay and the sequential link model: tcp_retries2.
    with pytest.raises(RuntimeError, match=f"its {MAX_RETRANSMISSIONS} retransmissions.*gives"):
        finish(2, "delay 1ms loss 100%", Collective("allreduce", 4096))
    with pytest.raises(RuntimeError, match=f"after {MAX_RETRANSMISSIONS} retransmissions"):
        LinkModel(Netem(loss=LossRandom(100))).transmit(0, 10)
    assert MAX_RETRANSMISSIONS == 15


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**5)), min_size=1,
                max_size=30), st.integers(-(10**6), 10**6))
def test_vectorised_release_equals_the_kernel_loop(packets, tail):
    ready = np.array([[r for r, _ in packets]], dtype=np.int64)
    wire = np.array([[s for _, s in packets]], dtype=np.int64)
    got = _release(ready, wire, np.array([tail]))[0]
    t, want = tail, []
    for r, s in packets:
        t = max(r, t) + s
        want.append(t)
    assert got.tolist() == want


# --- topology -----------------------------------------------------------------------------


def test_topology_queues_and_specs():
    topo = Topology.build(3, 2, "delay 1ms", "delay 10us", {(0, 2): "rate 1mbit"})
    assert topo.node_of(5) == 2
    assert topo.queue_of(0, 1) == ("intra", 0)
    assert topo.queue_of(1, 2) == ("nic", 0)
    assert topo.queue_of(1, 4) == ("link", 0, 2)
    assert str(topo.spec(1, 4)) == "rate 1mbit"
    assert str(topo.spec(4, 1)) == "delay 1ms"  # overrides are one direction only
    assert str(topo.spec(2, 3)) == "delay 10us"


def test_topology_round_trips_through_the_environment():
    topo = Topology.build(4, 2, "delay 2ms 500us rate 1gbit", None, "0->3=delay 9ms; 3->0=loss 1%")
    again = Topology.from_env(8, topo.to_env())
    assert again == topo


def test_topology_scaling_for_dilation():
    topo = Topology.build(2, 1, "delay 2ms rate 1gbit").scaled(4)
    assert topo.nic.delay_ns == 8 * MS and topo.nic.rate_bps == 250_000_000


@pytest.mark.parametrize("text,match", [("0-1=delay 1ms", "0-1"), ("0->x=delay 1ms", "0->x"),
                                        ("0->1=delya 1ms", "delya")])
def test_bad_links_are_named(text, match):
    with pytest.raises(ValueError, match=match):
        parse_links(text)


def test_bad_environment_is_named():
    with pytest.raises(ValueError, match="does not divide"):
        Topology.from_env(6, {"CLUSTERLAB_PROCS_PER_NODE": "4"})
    with pytest.raises(ValueError, match="node 5"):
        Topology.build(2, 1, None, None, {(0, 5): "delay 1ms"})


KINDS = [Collective("allreduce", 3 << 20, algorithm=a) for a in
         ("ring", "recursive_doubling", "rabenseifner", "tree", "hierarchical",
          "hierarchical_rail")] + [
    Collective("broadcast", 5000, root=2), Collective("reduce", 5000, root=1),
    Collective("allgather", 70000), Collective("reduce_scatter", 70000),
    Collective("gather", 100, root=3), Collective("scatter", 100, root=0),
    Collective("alltoall", 1 << 20), Collective("barrier")]


@pytest.mark.parametrize("coll", KINDS, ids=lambda c: f"{c.kind}-{c.algorithm}")
def test_cached_max_plus_replay_equals_the_round_by_round_replay(coll):
    # A deterministic fabric replays from a cached matrix; it must give the very same times
    # as the rounds do, for any start times, subgroups and links that differ per node pair.
    links = parse_links("0->2=delay 7ms; 2->1=delay 20us")
    topo = Topology.build(3, 2, "delay 1us", "delay 300ns", links)
    cached, rounds = QueueState(topo), QueueState(topo)
    assert cached.deterministic
    rounds.deterministic = False
    rng = np.random.default_rng(1)
    for ranks in (None, [0, 2, 3, 5]):
        p = topo.world_size if ranks is None else len(ranks)
        for _ in range(3):
            start = rng.integers(10**12, 10**12 + 10 * MS, size=p)
            expect = play(rounds, coll, start, np.random.default_rng(0), ranks)
            assert play(cached, coll, start, None, ranks).tolist() == expect.tolist()


def test_only_drawless_stateless_links_are_deterministic():
    for nic in ("delay 1ms", "", "delay 1ms duplicate 5%"):  # a duplicate costs only a rate
        assert QueueState(Topology.build(2, 1, nic)).deterministic, nic
    for nic in ("delay 1ms 1us", "rate 1gbit", "loss 0.1%", "corrupt 1%",
                "delay 1ms reorder 10%"):
        assert not QueueState(Topology.build(2, 1, nic)).deterministic, nic
