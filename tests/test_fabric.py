"""The fabric: descriptions, their string form, the ports' queues, and agreement between the
backend's point-to-point path (real processes), the collective replay and the simulator."""

import itertools
import math
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

import clusterlab
from clusterlab import Cluster, Crossbar, LeafSpine, Netem, RailOptimized, Topology, clock
from clusterlab.fabric import ecmp_hash, parse_fabric, recover_drops
from clusterlab.schedule import QueueState
from clusterlab.sim import simulate_collective
from clusterlab.wire import HEADER_BYTES, RTO_MIN_NS, SEGMENT_BYTES


def wire_ns(nbytes: int, rate_bps: int) -> float:
    """Serialisation of nbytes of payload in full segments, headers included (ns)."""
    segments = math.ceil(nbytes / SEGMENT_BYTES)
    return (nbytes + segments * HEADER_BYTES) * 8 / rate_bps * 1e9


SEG_NS = wire_ns(SEGMENT_BYTES, 10**8)  # one full segment at 100 Mbit/s


# --- descriptions ---------------------------------------------------------------------------


@pytest.mark.parametrize("fabric", [
    Crossbar(),
    LeafSpine(nodes_per_leaf=4),
    LeafSpine(nodes_per_leaf=4, spines=2, oversubscription=2.5, port="delay 5us rate 10gbit "
              "limit 64", ecmp_seed=3),
    RailOptimized(rails=8, spines=4, oversubscription=2, port="rate 100gbit"),
])
def test_string_form_parses_back(fabric):
    assert parse_fabric(str(fabric)) == fabric
    assert clusterlab.Fabric.parse(str(fabric)) == fabric
    topo = Topology.build(8, 8 if isinstance(fabric, RailOptimized) else 1, "rate 1gbit",
                          fabric=str(fabric))
    assert topo.fabric == fabric
    assert Topology.from_env(topo.world_size, topo.to_env()) == topo


@pytest.mark.parametrize("text, words", [
    ("leafspine", "nodes_per_leaf"),
    ("leafspine nodes_per_leaf=0", "nodes_per_leaf"),
    ("leafspine nodes_per_leaf=2 spines=x", "spines"),
    ("leafspine nodes_per_leaf=2 oversubscription=nan", "oversubscription"),
    ("leafspine nodes_per_leaf=2 port=(dleay 1ms)", "dleay"),
    ("leafspine nodes_per_leaf=2 port=rate", "parentheses"),
    ("leafspine nodes_per_leaf=2 colour=red", "colour"),
    ("torus nodes=4", "torus"),
    ("rail rails=2 rails=2", "twice"),
])
def test_bad_strings_name_what_is_wrong(text, words):
    with pytest.raises(ValueError, match=words):
        parse_fabric(text)


def test_bad_arguments_name_what_is_wrong():
    with pytest.raises(ValueError, match="spines"):
        LeafSpine(nodes_per_leaf=2, spines=0)
    with pytest.raises(TypeError, match="port"):
        LeafSpine(nodes_per_leaf=2, port=3)
    with pytest.raises(ValueError, match="procs_per_node=4"):
        Topology.build(2, 2, fabric=RailOptimized(rails=4))
    with pytest.raises(TypeError, match="fabric"):
        Topology.build(2, fabric=4)
    with pytest.raises(ValueError, match="CLUSTERLAB_FABRIC"):
        Topology.from_env(4, {"CLUSTERLAB_FABRIC": "leafspine spines=2"})
    with pytest.raises(TypeError, match="fabric"):
        Cluster(nodes=2, fabric=[1])


def test_crossbar_is_the_default_and_changes_nothing():
    nic = "delay 1ms 300us distribution normal rate 1gbit loss 1%"
    plain, crossbar = Topology.build(8, 1, nic), Topology.build(8, 1, nic, fabric="crossbar")
    assert plain == crossbar and plain.fabric == Crossbar() and not plain.port_specs()
    src, dst = np.arange(8), (np.arange(8) + 3) % 8
    a = QueueState(plain).deliver(src, dst, np.zeros(8), 10**6, np.random.default_rng(1))
    b = QueueState(crossbar).deliver(src, dst, np.zeros(8), 10**6, np.random.default_rng(1))
    assert np.array_equal(a, b)


def test_paths_and_port_rates():
    fab = LeafSpine(nodes_per_leaf=4, spines=2, oversubscription=4, port="rate 8gbit")
    topo = Topology.build(8, 2, "rate 8gbit", fabric=fab)
    specs = topo.port_specs()
    assert len(specs) == 8 + 2 * 2 * 2  # node ports, then uplinks and downlinks
    assert specs[0].rate_bps == 8 * 10**9
    assert specs[8].rate_bps == 8 * 10**9 * 4 // (2 * 4)  # 4 ports' worth over 2 spines, / 4
    paths = topo.paths([0, 0, 0], [1, 2, 9])  # same node, same leaf, other leaf
    assert paths[0].tolist() == [-1, -1, -1]
    assert paths[1].tolist() == [1, -1, -1]  # node 1's port on leaf 0
    up, down, port = paths[2].tolist()
    assert 8 <= up < 12 and 12 <= down < 16 and port == 4
    rail = Topology.build(2, 4, "rate 1gbit", fabric=RailOptimized(rails=4))
    assert rail.paths([0], [4])[0].tolist() == [4, -1, -1]  # same rail: the rail switch only
    assert (rail.paths([0], [5])[0] >= 0).sum() == 3  # another rail: through a spine
    assert rail.nic_of(1) == 1 and Topology.build(2, 4).nic_of(1) == 0


def test_ecmp_is_seeded_and_spreads_flows():
    src, dst = np.repeat(np.arange(64), 64), np.tile(np.arange(64), 64)
    a, b = ecmp_hash(0, src, dst) % np.uint64(8), ecmp_hash(1, src, dst) % np.uint64(8)
    assert np.array_equal(a, ecmp_hash(0, src, dst) % np.uint64(8))  # same seed, same spines
    assert (a != b).mean() > 0.8  # another seed rehashes
    counts = np.bincount(a.astype(np.int64), minlength=8)
    assert counts.min() > 0.85 * len(a) / 8  # 4096 flows, about 512 per spine
    fab = LeafSpine(nodes_per_leaf=1, spines=8)
    assert np.array_equal(fab.spine_of(src, dst), a)


# --- the ports' queues, against closed forms --------------------------------------------------


def test_incast_queues_at_the_receivers_port():
    # 7 senders, 1 MiB each, to one receiver on their leaf: the crossbar delivers all in one
    # message time (each NIC is its own), the leaf's port serialises all 7.
    m, nic = 2**20, "delay 100us rate 100mbit"
    cross = simulate_collective("gather", m, nodes=8, nic=nic)
    leaf = simulate_collective("gather", m, nodes=8, nic=nic,
                               fabric="leafspine nodes_per_leaf=8")
    assert cross.max() == pytest.approx((1e5 + wire_ns(m, 10**8)) / 1e9, rel=1e-6)
    # one message's segments pass the NIC and the port pipelined (one segment behind), then
    # the other six queue at the port
    assert leaf.max() == pytest.approx((1e5 + SEG_NS + 7 * wire_ns(m, 10**8)) / 1e9, rel=1e-6)


def test_a_full_buffer_drops_and_tcp_pays_a_timeout():
    m, nic = 2**20, "delay 100us rate 1gbit"
    roomy = simulate_collective("gather", m, nodes=8, nic=nic,
                                fabric="leafspine nodes_per_leaf=8 port=(rate 1gbit)")
    tight = simulate_collective("gather", m, nodes=8, nic=nic,
                                fabric="leafspine nodes_per_leaf=8 port=(rate 1gbit limit 8)")
    assert roomy.max() < 0.1
    # the last segments of late messages find 8 waiting and are lost; with no 3 later
    # segments to SACK them, only the RTO (>= 200 ms) recovers them
    assert tight.max() > 0.2


def test_a_resent_segment_lost_again_waits_for_a_doubled_rto():
    # One message of 5 segments; the ports dropped segment 1 and the tail (3, 4). Fewer than
    # 3 later segments got through after any of them, so each waits for the RTO; the
    # stand-in for the ports loses each segment's first two retransmissions.
    done = np.array([[10, -1, 30, -1, -1]], dtype=np.int64)
    tries: dict[int, int] = {}
    calls = []

    def resend(rows, cols, leave):
        calls.append(leave.tolist())
        out = []
        for c, t in zip(cols.tolist(), leave.tolist()):
            tries[c] = tries.get(c, 0) + 1
            out.append(-1 if tries[c] <= 2 else t + 5)
        return np.array(out, dtype=np.int64)

    send, forward, back = np.array([0]), np.array([1_000]), np.array([1_000])
    got = recover_drops(done, send, forward, back, resend)
    rto = RTO_MIN_NS  # max(RTO_MIN, 2 x RTT) with a 2 us round trip
    assert calls == [[rto] * 3, [3 * rto] * 3, [7 * rto] * 3]  # after rto, then 2 rto, 4 rto
    assert got.tolist() == [7 * rto + 5]
    # fast retransmit: 3 later segments arrived, the SACK of the third returns in back_ns
    fast = recover_drops(np.array([[-1, 10, 20, 30]]), send, forward, back,
                         lambda rows, cols, leave: leave + 7)
    assert fast.tolist() == [30 + 1_000 + 7]


def test_a_port_that_loses_everything_times_the_connection_out():
    with pytest.raises(RuntimeError, match="15 retransmissions"):
        simulate_collective("gather", 2**20, nodes=2, nic="rate 1gbit",
                            fabric="leafspine nodes_per_leaf=2 port=(rate 1gbit loss 100%)")


def test_oversubscription_divides_the_uplinks():
    # 2 leaves of 2 nodes, one spine: nodes 0, 1 send 1 MiB each to nodes 2, 3. At
    # oversubscription 1 the leaf's uplink carries both at line rate (2 message times at
    # 2 x the rate); at 4 the uplink has half the line rate, so both take 4 message times.
    m, nic = 2**20, "rate 100mbit"
    times = {}
    for over in (1, 4):
        topo = Topology.build(4, 1, nic, fabric=LeafSpine(nodes_per_leaf=2, oversubscription=over))
        done = QueueState(topo).deliver(np.array([0, 1]), np.array([2, 3]), np.zeros(2), m,
                                        np.random.default_rng(0))
        times[over] = done.max()
    w = wire_ns(m, 10**8)
    # (plus the pipeline: a few segments' time through NIC, uplink, downlink and port)
    assert w < times[1] < w + 4 * SEG_NS
    assert times[4] == pytest.approx(4 * w + 4 * SEG_NS, rel=1e-3)  # as in the p2p test below


def test_rails_give_every_process_its_own_nic():
    m = 2**20
    src, dst = np.array([0, 1]), np.array([2, 3])  # node 0's two processes to node 1's
    shared = Topology.build(2, 2, "rate 100mbit", fabric="leafspine nodes_per_leaf=2")
    rails = Topology.build(2, 2, "rate 100mbit", fabric="rail rails=2")
    t_shared = QueueState(shared).deliver(src, dst, np.zeros(2), m, None).max()
    t_rails = QueueState(rails).deliver(src, dst, np.zeros(2), m, None).max()
    assert t_rails == pytest.approx(t_shared / 2, rel=0.05)


def test_a_leaf_spine_ring_is_simulated_with_the_same_replay():
    fab = "leafspine nodes_per_leaf=4 spines=2 oversubscription=4 port=(rate 1gbit)"
    ring = simulate_collective("allreduce", 2**22, nodes=16, nic="rate 1gbit", fabric=fab)
    flat = simulate_collective("allreduce", 2**22, nodes=16, nic="rate 1gbit")
    # each leaf sends one ring flow across per round, alone on the uplink ECMP hashed it to,
    # which has 4 ports' rate / (2 spines x 4) = half the line rate: the ring takes twice as
    # long (the pipeline through the extra hops adds a little)
    assert ring.max() == pytest.approx(2 * flat.max(), rel=0.05)
    res = clusterlab.sim.simulate_training(16, nic="rate 1gbit", fabric=fab, model_bytes=4e6,
                                           bucket_bytes=2**21, steps=2, compute_s=0.01)
    assert res.config["fabric"] == str(parse_fabric(fab))
    assert res.mean_step > 0.01 + ring.max() * 0.9  # the step waits for the slow ring


# --- real processes: p2p emulated vs replay vs simulator ---------------------------------------


def send_at_once(pairs, nbytes):
    """Every (src, dst) pair sends `nbytes` at one agreed instant; receivers return the
    delivery stamps and wall times, senders their send times (CLOCK_MONOTONIC ns, from the
    backend's trace)."""
    rank = dist.get_rank()
    x = torch.zeros(nbytes // 4)
    dist.all_reduce(torch.zeros(1))  # warm: the first collective pays for loading kernels
    now = torch.tensor([time.monotonic_ns() + 100_000_000])
    dist.all_reduce(now, op=dist.ReduceOp.MAX)
    t0 = int(now)
    out = {"sent": {}, "got": {}}
    works = [(s, dist.irecv(torch.zeros_like(x), s)) for s, d in pairs if d == rank]
    clock.sleep_until(t0)
    for s, d in pairs:
        if s == rank:
            dist.isend(x, d).wait()
            out["sent"][d] = dist.group.WORLD.trace[-1][1]  # the backend's send time
    for s, w in works:
        w.wait()
        out["got"][s] = (w.hold_ns, time.monotonic_ns())
    dist.barrier()
    return out


@pytest.mark.parametrize("fabric, pairs, bottleneck", [
    # incast: 3 senders to one receiver's port on their leaf: 3 message times there, one
    # segment behind the first message's NIC
    ("leafspine nodes_per_leaf=4", [(1, 0), (2, 0), (3, 0)], lambda w, seg: 3 * w + seg),
    # oversubscribed: leaf 0's two nodes send across one uplink of half the line rate:
    # 2 messages at 2 x the time, behind one segment at the NIC, and one segment each
    # through the spine's downlink (2 x) and the receiver's port
    ("leafspine nodes_per_leaf=2 oversubscription=4", [(0, 2), (1, 3)],
     lambda w, seg: 4 * w + 4 * seg),
])
def test_p2p_replay_and_simulator_agree(fabric, pairs, bottleneck):
    nbytes, nic = 256 * 1024, "delay 1ms rate 100mbit"
    with Cluster(nodes=4, nic=nic, fabric=fabric, timeout=60, trace=True) as cl:
        runs = cl.run(send_at_once, pairs, nbytes)
    sent = {(s, d): runs[s]["sent"][d] for s, d in pairs}
    stamp = {(s, d): runs[d]["got"][s][0] for s, d in pairs}
    wall = {(s, d): runs[d]["got"][s][1] for s, d in pairs}
    t0 = min(sent.values())
    # The replay fed the senders' real send times, message after message in the order the
    # senders took the ports' lock (unknown here: we try every order), gives the same
    # delivery times to the nanosecond.
    topo = Topology.build(4, 1, nic, fabric=fabric)
    src, dst = np.array([s for s, _ in pairs]), np.array([d for _, d in pairs])
    last = max(stamp.values()) - t0
    replays = []
    for order in itertools.permutations(pairs):
        queues = QueueState(topo)
        replays.append({p: int(queues.deliver([p[0]], [p[1]], [sent[p] - t0], nbytes, None)[0])
                        for p in order})
    assert any(all(abs(r[p] - (stamp[p] - t0)) <= 1 for p in pairs) for r in replays), (
        stamp, replays)
    # The simulator (everyone sending at 0) predicts it within the senders' spread.
    spread = max(sent.values()) - t0
    sim = QueueState(topo).deliver(src, dst, np.zeros(len(pairs)), nbytes, None).max()
    assert sim <= last + 1e3 and last <= sim + spread + 1e3
    if len(set(dst.tolist())) == 1:  # an incast is the simulator's gather
        gather = simulate_collective("gather", nbytes, nodes=4, nic=nic, fabric=fabric)
        assert gather.max() * 1e9 == pytest.approx(sim, abs=1)
    # The closed form of the bottleneck.
    expected = 1e6 + bottleneck(wire_ns(nbytes, 10**8), SEG_NS)
    assert sim == pytest.approx(expected, rel=1e-3)
    assert last == pytest.approx(expected, rel=0.05)
    # Real processes were held until those stamps (and not much longer, on 2 busy cores).
    for p in pairs:
        assert wall[p] >= stamp[p] - 50_000
    assert max(wall.values()) - t0 < 1.25 * last + 10e6


def test_netem_spec_of_a_port_is_a_netem():
    fab = LeafSpine(nodes_per_leaf=2, port=Netem.parse("delay 10us rate 1gbit"))
    assert isinstance(fab.port, Netem) and fab.port.delay_ns == 10_000
    assert Topology.build(4, fabric=fab).scaled(2).fabric.port.delay_ns == 20_000


def test_collectives_in_real_processes_cross_the_fabric():
    from clusterlab.timing import all_reduce_spans, durations

    fab, nic, n = "leafspine nodes_per_leaf=2 oversubscription=4", "delay 1ms rate 100mbit", 2**20
    with Cluster(nodes=4, nic=nic, fabric=fab, timeout=60) as cl:
        per_rank = cl.run(all_reduce_spans, [n], 3)
    measured = float(np.median(durations([r[n] for r in per_rank])))
    predicted = simulate_collective("allreduce", n, nodes=4, nic=nic, fabric=fab).max()
    crossbar = simulate_collective("allreduce", n, nodes=4, nic=nic).max()
    assert predicted > 1.8 * crossbar  # each of the ring's two leaf crossings: a half-rate uplink
    assert measured == pytest.approx(predicted, rel=0.1)


def test_slowed_names_rows_far_above_their_closed_form():
    from clusterlab.experiments import fabric as ex

    class Model:
        time_s = 0.1

    fine = [{"best": 0.11, "model": 0.1}, {"best": 0.12, "model": Model()}]
    assert ex.slowed(fine) is None
    slow = fine + [{"best": 0.2, "model": Model()}]
    assert "200 ms against 100 ms" in ex.slowed(slow)
    assert ex.slowed(slow, factor=2.5) is None
