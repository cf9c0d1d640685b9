"""The simulator against the closed forms (exact when there is no jitter or loss), against
the schedule it shares with the engine, and its speed budget as a ratio-free smoke check."""

from __future__ import annotations

import numpy as np
import pytest

from clusterlab import models
from clusterlab.schedule import Collective, QueueState, play
from clusterlab.sim import (
    _ring_rounds_fast,
    bucket_sizes,
    compute_times,
    scaling_curve,
    simulate_training,
)
from clusterlab.topology import Topology
from clusterlab.wire import HEADER_BYTES

SEG = 65536
RATE = 1e9  # bit/s: one 64 KiB segment + headers takes exactly 524816 ns
BETA = (SEG + HEADER_BYTES) / SEG * 8 / RATE  # seconds per payload byte on the wire


def replay(p, nic, coll):
    fabric = QueueState(Topology.build(p, 1, nic))
    return play(fabric, coll, np.zeros(p, dtype=np.int64), np.random.default_rng(0)).max() / 1e9


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_replay_equals_closed_forms_without_jitter(p):
    n = p * SEG * 2  # chunks of whole segments, so headers are exactly accounted in BETA
    alpha = 0.5e-3
    cases = [
        ("ring", models.ring_allreduce),
        ("rabenseifner", models.rabenseifner_allreduce),
        ("recursive_doubling", models.recursive_doubling_allreduce),
    ]
    for algo, model in cases:
        latency = replay(p, "delay 500us", Collective("allreduce", n, algorithm=algo))
        assert latency == pytest.approx(model(p, n, alpha, 0.0), rel=1e-9), algo
    bandwidth = replay(p, "rate 1gbit", Collective("allreduce", n))
    assert bandwidth == pytest.approx(models.ring_allreduce(p, n, 0.0, BETA), rel=1e-9)
    both = replay(p, "delay 500us rate 1gbit", Collective("allreduce", n))
    assert both == pytest.approx(models.ring_allreduce(p, n, alpha, BETA), rel=1e-9)
    gather = replay(p, "delay 500us rate 1gbit", Collective("allgather", n // p))
    assert gather == pytest.approx(models.ring_allgather(p, n, alpha, BETA), rel=1e-9)


def test_training_step_is_compute_plus_all_reduce_without_overlap():
    p, n = 8, 8 * SEG * 4
    res = simulate_training(p, nic="delay 200us rate 1gbit", model_bytes=n, bucket_bytes=n,
                            first_bucket_bytes=n,
                            compute_s=0.05, overlap=False, steps=5)
    want = 0.05 + models.ring_allreduce(p, n, 200e-6, BETA)
    assert res.step_times == pytest.approx(np.full(5, want), rel=1e-6)


def test_overlap_hides_communication_behind_backward():
    kw = dict(nic="delay 100us rate 10gbit", model_bytes=100e6, bucket_bytes=10e6,
              compute_s=0.2, steps=5)
    hidden = simulate_training(8, overlap=True, **kw).mean_step
    exposed = simulate_training(8, overlap=False, **kw).mean_step
    assert hidden < exposed


@pytest.mark.parametrize("nic", ["delay 50us", "delay 50us rate 10gbit", "rate 1gbit"])
def test_fast_ring_equals_the_schedule_exactly_without_jitter(nic):
    topo = Topology.build(16, 1, nic)
    start = np.random.default_rng(1).integers(0, 10**6, 16)
    for n in (10**5, 10**7):
        a = play(QueueState(topo), Collective("allreduce", n), start, np.random.default_rng(0))
        b = _ring_rounds_fast(topo.nic, start, n, np.random.default_rng(0))
        assert (a == b).all()


@pytest.mark.parametrize("nic", ["delay 50us 10us", "delay 50us 20us distribution pareto",
                                 "delay 50us 10us distribution normal rate 10gbit"])
def test_fast_ring_agrees_with_the_schedule_in_distribution(nic):
    topo = Topology.build(16, 1, nic)
    start = np.zeros(16, dtype=np.int64)
    a = [play(QueueState(topo), Collective("allreduce", 10**6), start,
              np.random.default_rng(s)).max() for s in range(60)]
    b = [_ring_rounds_fast(topo.nic, start, 10**6, np.random.default_rng(s)).max()
         for s in range(60)]
    assert np.mean(b) == pytest.approx(np.mean(a), rel=0.01)


def test_jitter_grows_the_step_like_the_expected_maximum():
    # Exponential compute noise: a synchronous step waits for the slowest of N ranks, so the
    # mean step grows like c + m * H_N (Dean & Barroso; the course's straggler model).
    c, m = 0.1, 0.02
    for n in (4, 64):
        res = simulate_training(n, nic=None, model_bytes=1024, compute_s=c, compute_jitter=m / c,
                                compute_distribution="exponential", steps=400, seed=n)
        assert res.mean_step == pytest.approx(models.straggler_step(c, m, n), rel=0.03)


def test_a_straggler_sets_the_pace():
    res = simulate_training(8, nic="delay 50us", compute_s=0.1, straggler=(3, 1.5), steps=4)
    assert res.mean_step >= 0.15


def test_scaling_curve_efficiency_drops_with_jitter():
    kw = dict(nic="delay 50us 40us rate 100gbit", compute_s=0.05, steps=5, model_bytes=50e6)
    rows = scaling_curve([1, 8, 64], **kw)
    assert rows[0]["efficiency"] == pytest.approx(1.0)
    assert rows[2]["efficiency"] < rows[1]["efficiency"] <= 1.0


def test_bad_parameters_are_named():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="zipf"):
        compute_times(rng, (2, 2), 0.1, 0.1, "zipf")
    with pytest.raises(ValueError, match="straggler rank 9"):
        compute_times(rng, (2, 4), 0.1, straggler=(9, 2.0))
    with pytest.raises(ValueError, match="steps"):
        simulate_training(4, steps=0)
    with pytest.raises(ValueError, match="nodes"):
        simulate_training(0)
    with pytest.raises(ValueError, match="bucket_bytes"):
        simulate_training(4, bucket_bytes=0)


@pytest.mark.parametrize("nic", ["delay 2ms 1ms", "delay 2ms 1ms distribution normal",
                                 "delay 5ms 2ms distribution pareto"])
@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("nbytes", [1 << 10, 1 << 20, 16 << 20])
def test_jittery_ring_closed_form_tracks_the_schedule(nic, p, nbytes):
    """The segment-aware Gaussian longest-path form against the exact replayed schedule
    (mean over seeds); without segments the form misses the E[max of segments] shift."""
    from clusterlab.netem import Netem

    spec = Netem.parse(nic)
    topo = Topology.build(p, 1, nic)
    done = [play(QueueState(topo), Collective("allreduce", nbytes), np.zeros(p, dtype=np.int64),
                 np.random.default_rng(seed)).max() / 1e9 for seed in range(60)]
    simulated = float(np.mean(done))
    args = (p, nbytes, spec.delay_s, 0.0, spec.jitter_s, spec.distribution)
    closed = models.ring_allreduce_jitter(*args, segment_bytes=65536)
    assert closed == pytest.approx(simulated, rel=0.07)
    if nbytes // p > 65536:
        assert models.ring_allreduce_jitter(*args) < simulated * 0.93


def _p2p_ring_reference(start, delays):
    """The isend/irecv ring on Gloo written out plainly: delays[s, j] is the delay of the
    message rank j sends in round s; a send completes once its receiver entered the round;
    a connection delivers in order."""
    ready = np.array(start, dtype=float)
    last = np.full(len(ready), -np.inf)
    for d in delays:
        entered = ready.copy()
        arrive = np.maximum(entered + d, last)
        last = arrive
        ready = np.maximum(np.maximum(entered, np.roll(arrive, 1)), np.roll(entered, -1))
    return ready.max()


def test_p2p_ring_models_gloo_rendezvous_and_in_order_delivery():
    from clusterlab.sim import p2p_ring_allreduce

    # Without jitter every round is one delay, from whatever start.
    assert p2p_ring_allreduce("delay 2ms", 8, 4096, seeds=1)[0] == pytest.approx(0.028)
    # Uneven starts: against the plain reference (rank 3 enters 5 ms late, so its left
    # neighbour's first send cannot complete before then - the replay has no such wait).
    start = np.zeros((1, 5))
    start[0, 3] = 0.005
    got = p2p_ring_allreduce("delay 1ms", 5, 4096, seeds=1, start=start)[0]
    want = _p2p_ring_reference(start[0], np.full((8, 5), 0.001))
    assert got == pytest.approx(want, abs=1e-9)
    # Under jitter: the same law as the reference fed with netem's table, and slower than
    # the schedule alone (the rendezvous lets a late right neighbour hold a rank back).
    from clusterlab.link import delay_values_ns
    from clusterlab.netem import Netem

    nic = "delay 2ms 2ms distribution normal"
    values = delay_values_ns(Netem.parse(nic)) / 1e9
    rng = np.random.default_rng(1)
    reference = np.mean([_p2p_ring_reference(np.zeros(8), rng.choice(values, (14, 8)))
                         for _ in range(2000)])
    assert p2p_ring_allreduce(nic, 8, 4096, seeds=2000).mean() == pytest.approx(reference,
                                                                                 rel=0.015)
    p2p = p2p_ring_allreduce(nic, 16, 4096, seeds=300).mean()
    topo = Topology.build(16, 1, nic)
    sched = np.mean([play(QueueState(topo), Collective("allreduce", 4096),
                          np.zeros(16, dtype=np.int64), np.random.default_rng(s)).max() / 1e9
                     for s in range(300)])
    assert 1.02 * sched < p2p < 1.10 * sched
    with pytest.raises(ValueError, match="ranks and seeds"):
        p2p_ring_allreduce(nic, 0, 4096)


def test_compiled_ring_on_a_leaf_spine_and_the_leaders_ring_equal_the_replay():
    from clusterlab.sim import RingPorts

    start = np.random.default_rng(0).integers(0, 10**6, 32)
    for fab in ("leafspine nodes_per_leaf=4 spines=2 oversubscription=4",
                "leafspine nodes_per_leaf=2 spines=3 port=(delay 3us rate 1gbit)"):
        topo = Topology.build(32, 1, "delay 20us rate 1gbit", fabric=fab)
        replay = play(QueueState(topo), Collective("allreduce", 3 * 10**6), start, None)
        fast = _ring_rounds_fast(topo.nic, start, 3 * 10**6, np.random.default_rng(0),
                                 ports=RingPorts(topo))
        assert np.array_equal(replay, fast), fab
        # 8 nodes x 4: the hierarchical all-reduce is the ring of the nodes' last entries
        topo = Topology.build(8, 4, "delay 20us rate 1gbit", fabric=fab)
        replay = play(QueueState(topo), Collective("allreduce", 10**6, algorithm="hierarchical"),
                      start, None)
        nodes = Topology.build(8, 1, "delay 20us rate 1gbit", fabric=fab)
        fast = _ring_rounds_fast(topo.nic, start.reshape(8, 4).max(axis=1), 10**6,
                                 np.random.default_rng(0), ports=RingPorts(nodes))
        assert np.array_equal(replay, np.repeat(fast, 4)), fab
    # and simulate_training takes these paths with the same results as before on a crossbar
    hier = simulate_training(8, 4, nic="delay 20us rate 1gbit", algorithm="hierarchical",
                             model_bytes=4e6, bucket_bytes=2**21, steps=2)
    ring = simulate_training(8, 1, nic="delay 20us rate 1gbit", model_bytes=4e6,
                             bucket_bytes=2**21, steps=2)
    assert np.allclose(hier.step_end, np.repeat(ring.step_end, 4, axis=1))


# DDP's buckets for notebook 03's MLP, 8 x Linear(256, 256) + Linear(256, 10) in float32, with
# bucket_cap_mb=0.25, in the order DDP reduces them (the last layers first): 8 buckets, while
# sim.bucket_sizes(model, 0.25 MiB, 0.25 MiB) cuts the same bytes into 9.
DDP_MLP_BUCKETS = [10 * 257 * 4 + 256 * 257 * 4] + [256 * 257 * 4] * 7


def test_measured_buckets_replace_the_computed_ones():
    model = sum(DDP_MLP_BUCKETS)
    assert len(bucket_sizes(model, 1 << 18, 1 << 18)) == 9 != len(DDP_MLP_BUCKETS)
    kw = dict(nic="delay 1ms", model_bytes=model, bucket_bytes=1 << 18,
              first_bucket_bytes=1 << 18, compute_s=0.01, overlap=False, steps=2)
    measured = simulate_training(4, buckets=DDP_MLP_BUCKETS, **kw)
    computed = simulate_training(4, **kw)
    rounds = models.ring_allreduce(4, 1, 1e-3, 0.0)  # 2(p-1) latency rounds per bucket
    assert measured.config["buckets"] == DDP_MLP_BUCKETS
    assert measured.step_times == pytest.approx(np.full(2, 0.01 + 8 * rounds), rel=1e-6)
    assert computed.step_times == pytest.approx(np.full(2, 0.01 + 9 * rounds), rel=1e-6)
    with pytest.raises(ValueError):
        simulate_training(4, buckets=[0], **kw)


def test_mitigations_simulate_the_buckets_ddp_measured():
    from clusterlab.experiments import jitter_at_scale

    real = {"baseline": {"bucket_sizes": DDP_MLP_BUCKETS},
            "overlap": {"bucket_sizes": DDP_MLP_BUCKETS},
            "bigger buckets": {"bucket_sizes": [sum(DDP_MLP_BUCKETS)]}}
    plans = jitter_at_scale.simulated_plans(real)
    assert [len(plans[k]["buckets"]) for k in real] == [8, 8, 1]
    assert (plans["baseline"]["overlap"], plans["overlap"]["overlap"]) == (False, True)
    kw = dict(nic="delay 1ms", model_bytes=sum(DDP_MLP_BUCKETS), compute_s=0.01, steps=2)
    small, big = (simulate_training(4, **kw, **plans[k]) for k in ("baseline", "bigger buckets"))
    # on a latency-only network, 8 buckets -> 1 shortens the exchange exactly 8-fold
    assert (small.mean_step - 0.01) == pytest.approx(8 * (big.mean_step - 0.01), rel=1e-6)


def test_stacked_gains_rank_only_what_the_steps_resolve():
    from clusterlab.experiments import jitter_at_scale

    rng = np.random.default_rng(0)
    steps = {"baseline": 100 + rng.normal(0, 1, 10), "overlap": 101 + rng.normal(0, 1, 10),
             "bigger buckets": 150 + rng.normal(0, 1, 10)}
    real = {k: {"step_samples_per_s_per_rank": v, "samples_per_s_per_rank": float(np.median(v))}
            for k, v in steps.items()}
    gains = {g["lever"]: g for g in jitter_at_scale.stacked_gains(real)}
    assert not gains["overlap"]["resolved"] and not gains["overlap"]["worse"]
    assert gains["bigger buckets"]["resolved"] and gains["bigger buckets"]["beats"] == 1.0
