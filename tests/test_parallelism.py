"""Closed forms and replays of sharded and model-parallel traffic (`clusterlab.parallelism`):
against first principles, against each other, and against bad input."""

from __future__ import annotations

import numpy as np
import pytest

from clusterlab import models
from clusterlab import parallelism as par


@pytest.mark.parametrize("ranks", [2, 4, 64, 1024])
def test_sharded_traffic_is_ddp_volume_or_one_and_a_half(ranks):
    psi, b = 12_480, 4
    share = (ranks - 1) / ranks * psi * b
    ddp = par.sharded_traffic("ddp", params=psi, ranks=ranks)
    assert ddp["allreduce"] == ddp["total"] == 2 * share
    for stage in ("zero1", "zero2"):
        t = par.sharded_traffic(stage, params=psi, ranks=ranks)
        assert t["reduce_scatter"] == t["allgather"] == share and t["total"] == ddp["total"]
    for stage in ("zero3", "fsdp"):
        assert par.sharded_traffic(stage, params=psi, ranks=ranks)["total"] == 1.5 * ddp["total"]
    keep = par.sharded_traffic("fsdp", params=psi, ranks=ranks, reshard_after_forward=False)
    assert keep["total"] == ddp["total"]
    # zero3 is always resharded: the flag is FSDP's.
    assert par.sharded_traffic("zero3", params=psi, ranks=ranks,
                               reshard_after_forward=False)["total"] == 1.5 * ddp["total"]


def test_sharded_memory_follows_the_zero_paper():
    psi, n = 7_000_000_000, 64
    assert par.sharded_memory("ddp", params=psi, ranks=n) == 16 * psi
    assert par.sharded_memory("zero1", params=psi, ranks=n) == 4 * psi + 12 * psi / n
    assert par.sharded_memory("zero2", params=psi, ranks=n) == 2 * psi + 14 * psi / n
    assert par.sharded_memory("zero3", params=psi, ranks=n) == 16 * psi / n
    assert par.sharded_memory("fsdp", params=psi, ranks=1) == 16 * psi


def test_sharded_comm_seconds_counts_one_collective_per_unit():
    a, b = 1e-3, 1e-9
    ddp = par.sharded_comm_seconds("ddp", params=1000, ranks=4, alpha=a, beta=b)
    assert ddp == pytest.approx(models.ring_allreduce(4, 4000, a, b))
    fsdp = par.sharded_comm_seconds("fsdp", params=1000, ranks=4, alpha=a, beta=b, units=5)
    assert fsdp == pytest.approx(5 * (2 * models.ring_allgather(4, 800, a, b)
                                      + models.ring_reduce_scatter(4, 800, a, b)))
    # Latency-bound: 3 collectives x 3 rounds per unit against the all-reduce's 6 rounds.
    lat = par.sharded_comm_seconds("fsdp", params=0, ranks=4, alpha=a, beta=0, units=5)
    assert lat == pytest.approx(5 * 3 * 3 * a)


def _one_ahead_forward(layers, g, c):
    """Event replay of a forward with one-ahead prefetch: unit i+1's all-gather is issued
    when unit i starts computing, after unit i's own all-gather (one at a time)."""
    gathered = [0.0] * layers
    gathered[0] = g  # the first all-gather overlaps nothing
    end = 0.0
    for i in range(layers):
        start = max(end, gathered[i])
        if i + 1 < layers:
            gathered[i + 1] = max(start, gathered[i]) + g
        end = start + c
    return end


@pytest.mark.parametrize("g, c", [(0.008, 0.008), (0.012, 0.004), (0.004, 0.012),
                                  (0.010, 0.0), (0.0, 0.005)])
@pytest.mark.parametrize("layers", [1, 2, 6])
def test_fsdp_prefetch_closed_form_matches_a_replay_when_gather_and_compute_differ(
        g, c, layers):
    # g != c is the case the notebook's g = c experiment cannot tell apart: the prefetched
    # forward is g + c + (L-1) max(g, c), not g + L max(g, c) (wrong by g - c when g > c).
    plain = par.fsdp_forward_seconds(layers=layers, gather_s=g, compute_s=c, prefetch=False)
    ahead = par.fsdp_forward_seconds(layers=layers, gather_s=g, compute_s=c, prefetch=True)
    assert plain == pytest.approx(layers * (g + c))
    assert ahead == pytest.approx(_one_ahead_forward(layers, g, c))
    assert plain - ahead == pytest.approx((layers - 1) * min(g, c))


def test_fsdp_prefetch_closed_form_g_above_c_exposes_g_minus_c_per_unit():
    # 6 units, g = 12 ms, c = 4 ms: 12 + 4 + 5 x 12 = 76 ms (the old g + L max(g, c) said 84).
    ahead = par.fsdp_forward_seconds(layers=6, gather_s=0.012, compute_s=0.004, prefetch=True)
    assert ahead == pytest.approx(0.076)
    with pytest.raises(ValueError, match="gather_s"):
        par.fsdp_forward_seconds(layers=6, gather_s=-1.0, compute_s=0.004, prefetch=True)


def test_tensor_parallel_counts_and_bytes():
    assert par.tp_allreduces(12) == {"forward": 24, "backward": 24, "total": 48}
    assert par.tp_allreduces(12, blocks_per_layer=1)["total"] == 24
    assert par.tp_traffic(layers=2, ranks=8, activation_bytes=800) == 8 * 2 * 7 / 8 * 800
    t = par.tp_comm_seconds(layers=2, ranks=8, activation_bytes=800, alpha=1e-3, beta=0)
    assert t == pytest.approx(8 * 14e-3)


@pytest.mark.parametrize("schedule", par.PIPELINE_SCHEDULES)
@pytest.mark.parametrize("p,m", [(1, 1), (2, 3), (4, 8), (5, 2)])
def test_pipeline_orders_run_every_microbatch_once_forward_before_backward(schedule, p, m):
    for s in range(p):
        order = par.pipeline_order(schedule, p, m, s)
        assert sorted(order) == sorted([("F", j) for j in range(m)] + [("B", j) for j in range(m)])
        for j in range(m):
            assert order.index(("F", j)) < order.index(("B", j))
        if schedule == "1f1b":  # at most p - s micro-batches in flight on stage s
            live = peak = 0
            for kind, _ in order:
                live += 1 if kind == "F" else -1
                peak = max(peak, live)
            assert peak <= min(m, p - s)


@pytest.mark.parametrize("schedule", par.PIPELINE_SCHEDULES)
def test_pipeline_replay_without_latency_is_the_bubble_formula(schedule):
    run = par.simulate_pipeline(schedule, stages=4, microbatches=8, forward_s=0.01,
                                backward_s=0.02)
    ideal = par.pipeline_step_seconds(stages=4, microbatches=8, forward_s=0.01, backward_s=0.02)
    assert run.step_s == pytest.approx(ideal)
    assert run.bubble == pytest.approx(par.bubble_fraction(4, 8)) == pytest.approx(3 / 11)


def test_pipeline_latency_gpipe_matches_closed_form_and_1f1b_pays_more():
    kw = dict(stages=4, microbatches=8, forward_s=0.015, backward_s=0.03)
    gpipe = par.simulate_pipeline("gpipe", nic="delay 5ms", **kw)
    one = par.simulate_pipeline("1f1b", nic="delay 5ms", **kw)
    assert gpipe.step_s == pytest.approx(par.pipeline_step_seconds(message_s=0.005, **kw))
    assert one.step_s > gpipe.step_s
    jittery = [par.simulate_pipeline("gpipe", nic="delay 5ms 4ms", seed=s, **kw).step_s
               for s in range(3)]
    assert min(jittery) > par.pipeline_step_seconds(**kw)


def test_pipeline_growth_subtracts_the_calm_network_and_replays_the_rough_one():
    from clusterlab.experiments.parallelism import pipeline_growth

    def row(nic, schedule, step, samples):
        return {"nic": nic, "schedule": schedule, "ops": [[None] * 16] * 4,
                "forward_took_s": 0.015, "backward_took_s": 0.03, "activation_bytes": 0,
                "steps_kept_of": len(samples), "step_s": step, "step_samples_s": samples}

    calm, rough = "delay 100us", "delay 5ms"
    rows = [row(calm, s, 0.5, [0.5, 0.51]) for s in par.PIPELINE_SCHEDULES]
    rows += [row(rough, s, 0.56, [0.56, 0.58]) for s in par.PIPELINE_SCHEDULES]
    grown = pipeline_growth(rows, calm, rough, groups=3)
    assert list(grown["gpipe"]["measured"]) == pytest.approx([0.06, 0.08])
    assert len(grown["gpipe"]["replay"]) == 3 * 2
    # Without jitter every draw is GPipe's closed form: 2(p-1) hops of 5 ms less 0.1 ms.
    assert grown["gpipe"]["replay"] == pytest.approx(2 * 3 * (0.005 - 0.0001), abs=1e-4)
    assert grown["1f1b"]["replay"].min() > grown["gpipe"]["replay"].max()


def test_moe_traffic_conserves_tokens_and_names_the_hot_rank():
    t, h, n, hidden = 96, 0.5, 4, 8
    bal = par.moe_traffic(tokens_per_rank=t, hidden=hidden, ranks=n)
    assert bal["sent_other"] == bal["received_hot"] == (n - 1) / n * t * hidden * 4
    hot = par.moe_traffic(tokens_per_rank=t, hidden=hidden, ranks=n, hot_share=h)
    sent = hot["sent_hot"] + (n - 1) * hot["sent_other"]
    received = hot["received_hot"] + (n - 1) * hot["received_other"]
    assert sent == pytest.approx(received)
    assert hot["received_hot"] == pytest.approx(h * (n - 1) * t * hidden * 4)
    capped = par.moe_traffic(tokens_per_rank=t, hidden=hidden, ranks=n, hot_share=h,
                             capacity_factor=1.25)
    assert capped["sent_hot"] == capped["sent_other"] == pytest.approx(3 * 1.25 * 24 * 32)
    assert capped["dropped"] == pytest.approx(h - 1.25 / n)


def test_alltoall_order_statistics_match_the_replay():
    for n, nic, dist in ((16, "delay 10ms 2ms distribution normal", "normal"),
                         (8, "delay 5ms 3ms", "uniform")):
        done = par.simulate_alltoall(ranks=n, nic=nic, repeats=200, seed=1)
        spec_delay, spec_jitter = (0.01, 0.002) if n == 16 else (0.005, 0.003)
        last = par.alltoall_seconds(ranks=n, delay_s=spec_delay, jitter_s=spec_jitter,
                                    distribution=dist, last_rank=True)
        each = par.alltoall_seconds(ranks=n, delay_s=spec_delay, jitter_s=spec_jitter,
                                    distribution=dist)
        assert done.max(axis=1).mean() == pytest.approx(last, rel=0.03)
        assert done.mean() == pytest.approx(each, rel=0.03)
    assert par.alltoall_seconds(ranks=1, delay_s=1.0) == 0.0


def test_step_table_covers_every_parallelism_to_1024_ranks():
    shape = par.ModelShape(params=10**9, layers=32, activation_bytes=2**24, compute_s=1.0)
    table = par.step_table(shape, ranks=(2, 1024), alpha=1e-5, beta=8 / 100e9)
    assert set(table) == set(par.PARALLELISMS)
    assert all(len(v) == 2 and v[0] > 0 for v in table.values())
    assert all(np.isfinite(v[1]) for k, v in table.items() if k in ("dp", "fsdp"))
    assert np.isnan(table["pp"][1])  # 1024 stages for 32 layers: no such pipeline
    assert np.isnan(table["tp"][1])  # 1024-way TP of 16 heads: no such split
    with pytest.raises(ValueError, match="layers=32"):
        par.step_seconds("pp", shape, ranks=64, alpha=0, beta=0)
    with pytest.raises(ValueError, match="heads=16"):
        par.step_seconds("tp", shape, ranks=32, alpha=0, beta=0)
    # More latency hurts TP (many small messages) more than DP (one large one).
    slow = par.step_table(shape, ranks=(8,), alpha=1e-3, beta=8 / 100e9)
    fast = par.step_table(shape, ranks=(8,), alpha=1e-5, beta=8 / 100e9)
    assert slow["tp"][0] - fast["tp"][0] > 10 * (slow["dp"][0] - fast["dp"][0])
    # TP on an intra-node link (NVLink-class bandwidth) up to a node's GPUs, NaN beyond.
    node = par.step_table(shape, ranks=(8, 16), alpha=1e-5, beta=8 / 100e9,
                          node_beta=1 / 450e9, node_ranks=8)
    assert node["tp_node"][0] < node["tp"][0] and np.isnan(node["tp_node"][1])


@pytest.mark.parametrize("call, name", [
    (lambda: par.sharded_traffic("zero4", params=1, ranks=2), "strategy"),
    (lambda: par.sharded_traffic("ddp", params=-1, ranks=2), "params"),
    (lambda: par.sharded_memory("ddp", params=1, ranks=0), "ranks"),
    (lambda: par.bubble_fraction(0, 4), "stages"),
    (lambda: par.pipeline_order("zb", 2, 2, 0), "schedule"),
    (lambda: par.pipeline_order("gpipe", 2, 2, 2), "stage"),
    (lambda: par.simulate_pipeline("gpipe", stages=2, microbatches=2, forward_s=-1,
                                   backward_s=0), "forward_s"),
    (lambda: par.moe_traffic(tokens_per_rank=4, hidden=2, ranks=4, hot_share=0.1), "hot_share"),
    (lambda: par.step_seconds("zero", par.ModelShape(1, 1, 1, 1.0), ranks=2, alpha=0, beta=0),
     "parallelism"),
    (lambda: par.tp_allreduces(0), "layers"),
])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_explorer_redraws_headless_and_follows_its_sliders():
    from clusterlab.widgets.parallelism import RANKS, ParallelismExplorer

    explorer = ParallelismExplorer(latency_us=10, bandwidth_gbit=100, measured={
        "dp": [(2, 0.5)]})
    explorer.update()
    assert explorer.last_error is None and explorer.png.startswith(b"\x89PNG")
    lines = explorer._axes["lines"]
    assert set(lines) == set(par.PARALLELISMS)
    node = list(explorer._axes["node_line"].get_ydata())
    assert node[RANKS.index(8)] < list(lines["tp"].get_ydata())[RANKS.index(8)]
    fast = {k: list(line.get_ydata()) for k, line in lines.items()}
    explorer.controls["latency_us"].value = 1000
    explorer.update()
    slow = {k: list(line.get_ydata()) for k, line in lines.items()}
    i = RANKS.index(8)
    assert slow["tp"][i] - fast["tp"][i] > 10 * (slow["dp"][i] - fast["dp"][i]) > 0
    assert "1000 µs" in explorer._axes["title"].get_text()
    explorer.close()


def test_explorer_tp_charges_megatrons_four_all_reduces_per_layer():
    shape = par.ModelShape(params=10**9, layers=32, activation_bytes=2**24, compute_s=1.0)
    a, b = 1e-5, 8 / 100e9
    comm = par.step_seconds("tp", shape, ranks=8, alpha=a, beta=b) - 1.0 / 8
    per_allreduce = models.ring_allreduce(8, shape.activation_bytes * shape.microbatches, a, b)
    assert par.tp_allreduces(32)["total"] == 4 * 32
    assert comm == pytest.approx(4 * 32 * per_allreduce)


@pytest.mark.parametrize("stages", [8, 32])
def test_explorer_pipeline_is_the_replay_on_a_slow_network(stages):
    """On 1 ms, 1 Gbit/s a 16 MiB activation takes ~135 ms on the wire, far more than a
    stage's compute per micro-batch: the closed form is out of its domain (and refuses), and
    the explorer must give what the replay gives, which is much slower."""
    shape = par.ModelShape(params=10**9, layers=32, activation_bytes=16 * 2**20, compute_s=1.0)
    a, b = 1e-3, 8 / 1e9
    explorer = par.step_seconds("pp", shape, ranks=stages, alpha=a, beta=b)
    per_mb = 1.0 / (stages * 8)
    replay = par.simulate_pipeline("gpipe", stages=stages, microbatches=8,
                                   forward_s=per_mb / 3, backward_s=2 * per_mb / 3,
                                   nic="delay 1ms rate 1gbit",
                                   activation_bytes=shape.activation_bytes).step_s
    assert explorer == pytest.approx(replay, rel=1e-6)
    wire = shape.activation_bytes * b
    naive = (8 + stages - 1) * per_mb + 2 * (stages - 1) * (a + wire)
    assert replay > 1.1 * naive  # the closed form would have been optimistic
    with pytest.raises(ValueError, match="simulate_pipeline"):
        par.pipeline_step_seconds(stages=stages, microbatches=8, forward_s=per_mb / 3,
                                  backward_s=2 * per_mb / 3, message_s=a + wire,
                                  serialise_s=wire)


def test_explorer_pipeline_agrees_with_the_closed_form_inside_its_domain():
    shape = par.ModelShape(params=10**9, layers=32, activation_bytes=2**20, compute_s=1.0)
    a, b = 1e-5, 8 / 100e9
    per_mb = 1.0 / (8 * 8)
    closed = par.pipeline_step_seconds(stages=8, microbatches=8, forward_s=per_mb / 3,
                                       backward_s=2 * per_mb / 3,
                                       message_s=a + shape.activation_bytes * b,
                                       serialise_s=shape.activation_bytes * b)
    assert par.step_seconds("pp", shape, ranks=8, alpha=a, beta=b) == pytest.approx(
        closed, rel=0.01)
