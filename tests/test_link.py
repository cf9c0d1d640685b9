"""The link model: netem's enqueue semantics plus TCP's recovery, checked statistically.

Every test is seeded, so it is deterministic; the statistical margins (3 sigma or wider) are
there so that a legitimate change of random stream does not break them.
"""

import math

import numpy as np
import pytest
from scipy import stats

from clusterlab.link import (
    LinkModel,
    delay_values_ns,
    packet_time_ns,
    sample_delay_ns,
    tabledist,
)
from clusterlab.netem import LossGemodel, LossRandom, LossState, Netem
from clusterlab.tables import DIST_SCALE, table
from clusterlab.wire import HEADER_BYTES, RTO_MIN_NS, wire_beta, wire_seconds

MS = 1_000_000
US = 1_000
MB16 = 16 << 20  # 256 segments of 64 KB


def lag1(x: np.ndarray) -> float:
    x = x.astype(np.float64) - x.mean()
    return float((x[1:] * x[:-1]).mean() / x.var())


def send_many(link: LinkModel, count: int, nbytes: int, every_ns: int = 1_000 * MS) -> list:
    return [link.transmit(i * every_ns, nbytes) for i in range(count)]


# --- determinism --------------------------------------------------------------------------

BUSY = Netem(
    delay_ns=2 * MS, jitter_ns=500 * US, distribution="normal", rate_bps=10**9,
    loss=LossRandom(2.0), corrupt=1.0,
)  # fmt: skip


def trace_of(link: LinkModel) -> list[tuple]:
    out = []
    for tr in send_many(link, 10, 3_000_000, every_ns=50 * MS):
        out.append((tr.delivered_ns, tuple(tr.trace.send_ns), tuple(tr.trace.lost)))
    return out


def test_same_seed_same_trace_different_seed_different_trace():
    assert trace_of(LinkModel(BUSY, seed=7, trace=True)) == trace_of(
        LinkModel(BUSY, seed=7, trace=True)
    )
    assert trace_of(LinkModel(BUSY, seed=7, trace=True)) != trace_of(
        LinkModel(BUSY, seed=8, trace=True)
    )
    # Each link of a cluster gets its own stream.
    assert trace_of(LinkModel(BUSY, seed=7, link_id=(0, 1), trace=True)) != trace_of(
        LinkModel(BUSY, seed=7, link_id=(1, 0), trace=True)
    )


def test_spec_seed_overrides_the_constructor_seed():
    spec = Netem(delay_ns=MS, jitter_ns=MS, seed=42)
    a = LinkModel(spec, seed=1).one_way_delays(100, interval_ns=MS)
    b = LinkModel(spec, seed=2).one_way_delays(100, interval_ns=MS)
    assert np.array_equal(a, b)


@pytest.mark.parametrize(
    "spec",
    [
        BUSY,
        Netem(delay_ns=MS, jitter_ns=300 * US, distribution="pareto", rate_bps=10**8,
              loss=LossState(5, 30, 10, 20, 2)),
        Netem(jitter_ns=MS, delay_correlation=50, loss=LossGemodel(3, 20, 80, 1), ecn=True),
    ],
)  # fmt: skip
def test_numpy_path_and_per_packet_path_agree_exactly(spec):
    """Big messages take the vectorised path; both paths must consume the same numbers."""
    vector = LinkModel(spec, trace=True)
    loop = LinkModel(spec, trace=True)
    loop._force_loop = True
    for i in range(10):
        a, b = vector.transmit(i * 50 * MS, 3_000_000), loop.transmit(i * 50 * MS, 3_000_000)
        assert a.delivered_ns == b.delivered_ns
        assert (a.lost, a.marked, a.retransmits) == (b.lost, b.marked, b.retransmits)
        assert np.array_equal(a.trace.send_ns, b.trace.send_ns)
    assert vector.tail_ns == loop.tail_ns


# --- delay and its distributions ----------------------------------------------------------


def test_delay_only_is_exact():
    delays = LinkModel(Netem(delay_ns=7 * MS)).one_way_delays(1000, interval_ns=MS)
    assert np.all(delays == 7 * MS)


def test_uniform_jitter_is_uniform_on_delay_plus_minus_jitter():
    d, j = 10 * MS, 2 * MS
    delays = LinkModel(Netem(delay_ns=d, jitter_ns=j)).one_way_delays(20_000, interval_ns=MS)
    assert delays.min() >= d - j and delays.max() < d + j
    assert abs(delays.mean() - d) < 3 * (2 * j / math.sqrt(12)) / math.sqrt(len(delays))
    assert stats.kstest(delays, stats.uniform(d - j, 2 * j).cdf).pvalue > 0.01


@pytest.mark.parametrize("dist", ["normal", "pareto", "paretonormal"])
def test_table_distributions_follow_their_table(dist):
    d, j = 10 * MS, 2 * MS  # no clipping at 0: every table stays above -4.1 sigma
    spec = Netem(delay_ns=d, jitter_ns=j, distribution=dist)
    delays = LinkModel(spec).one_way_delays(20_000, interval_ns=MS)
    # Every table entry is equally likely: the entries scaled by jitter are the distribution.
    reference = d + j * table(dist).astype(np.float64) / DIST_SCALE
    assert stats.ks_2samp(delays, reference).statistic < 0.02


def test_tabledist_uses_c_integer_arithmetic():
    t = table("normal").astype(np.int64)
    rnd = np.arange(4096)
    assert np.array_equal(tabledist(0, DIST_SCALE, rnd, table("normal")), t)
    # Below one scale unit the remainder is rounded half away from zero (C truncation of
    # x +/- 4096), not floored: -1.5 gives -2 and +1.5 gives 2.
    sigma = DIST_SCALE // 2
    expected = np.sign(t) * np.floor(np.abs(t) * sigma / DIST_SCALE + 0.5)
    assert np.array_equal(tabledist(0, sigma, rnd, table("normal")), expected.astype(np.int64))
    # Uniform: rnd % (2 sigma) + mu - sigma.
    u32 = np.array([0, 1, 2**32 - 1])
    assert tabledist(100, 10, u32, None).tolist() == [90, 91, 2**32 % 20 - 1 + 90]


def test_sample_delay_ns_matches_the_link_marginal():
    spec = Netem(delay_ns=MS, jitter_ns=2 * MS, distribution="normal")
    draws = sample_delay_ns(spec, np.random.default_rng(0), (50, 400))
    assert draws.shape == (50, 400)
    assert draws.min() >= 0  # jitter > delay: negative delays are clipped, "send now"
    assert np.mean(draws == 0) > 0.25  # P(N(1, 2) < 0) = 31%
    assert np.all(sample_delay_ns(Netem(delay_ns=5), np.random.default_rng(0), 3) == 5)


def test_delay_values_are_every_delay_netem_can_draw():
    rng = np.random.default_rng(1)
    for dist in ("normal", "pareto", "paretonormal"):
        spec = Netem(delay_ns=MS, jitter_ns=700 * US + 3, distribution=dist)
        values = delay_values_ns(spec)
        every = np.maximum(tabledist(MS, 700 * US + 3, np.arange(4096), table(dist)), 0)
        assert np.array_equal(values, np.sort(every)) and np.all(np.diff(values) >= 0)
        assert values.dtype == np.int64 and not values.flags.writeable
        assert np.isin(sample_delay_ns(spec, rng, 2000), values).all()  # drawn from them
    # Uniform: the midpoints of 4096 equal bins of [delay - jitter, delay + jitter), clipped.
    u = delay_values_ns(Netem(delay_ns=MS, jitter_ns=2 * MS))
    assert len(u) == 4096 and u[0] == 0 and u[-1] == pytest.approx(3 * MS - 2 * MS / 4096)
    assert np.mean(u == 0) == pytest.approx(0.25, abs=1 / 4096)
    assert np.all(delay_values_ns(Netem(delay_ns=5 * MS)) == 5 * MS)


def test_wire_time_counts_every_segments_headers():
    rate = 8_000_000  # one byte per microsecond
    assert wire_seconds(0, rate_bps=rate) == pytest.approx(HEADER_BYTES * 1e-6)  # one packet
    assert wire_seconds(65537, rate_bps=rate) == pytest.approx((65537 + 2 * HEADER_BYTES) * 1e-6)
    assert wire_seconds(10, rate_bps=0) == 0.0 and wire_beta(0) == 0.0
    assert wire_beta(10**9) == pytest.approx(8e-9 * (65536 + 66) / 65536, rel=1e-15)
    # The link model serialises exactly that much, segment by segment.
    for nbytes in (0, 100, 3 * 65536 + 5):
        sent = LinkModel(Netem(rate_bps=rate)).transmit(0, nbytes)
        assert sent.delivered_ns == round(wire_seconds(nbytes, rate_bps=rate) * 1e9)


# --- correlation --------------------------------------------------------------------------


@pytest.mark.parametrize("dist", ["uniform", "normal"])
def test_netem_delay_correlation_is_nearly_ineffective(dist):
    spec = Netem(delay_ns=10 * MS, jitter_ns=2 * MS, delay_correlation=90, distribution=dist)
    delays = LinkModel(spec).one_way_delays(20_000, interval_ns=MS)
    assert abs(lag1(delays)) < 0.05  # 90% asked, ~0 obtained: tabledist keeps the low bits


@pytest.mark.parametrize("dist", ["uniform", "normal"])
def test_ar1_delay_correlation_works_and_keeps_the_marginal(dist):
    d, j = 10 * MS, 2 * MS
    spec = Netem(delay_ns=d, jitter_ns=j, delay_correlation=90, distribution=dist)
    delays = LinkModel(spec, correlation="ar1").one_way_delays(50_000, interval_ns=MS)
    # Normal: exactly r. Uniform: the Gaussian copula gives (6 / pi) asin(r / 2) = 0.89.
    assert abs(lag1(delays) - 0.9) < 0.05
    independent = LinkModel(Netem(delay_ns=d, jitter_ns=j, distribution=dist))
    reference = independent.one_way_delays(50_000, interval_ns=MS)
    assert abs(delays.mean() - d) < 0.1 * j
    assert abs(delays.std() / reference.std() - 1) < 0.1
    assert stats.ks_2samp(delays, reference).statistic < 0.06  # wide: correlated samples


def test_netem_loss_correlation_distorts_the_loss_rate_ar1_does_not():
    def loss_rate(correlation: str) -> float:
        link = LinkModel(Netem(loss=LossRandom(10, 50)), correlation=correlation)
        results = send_many(link, 100, MB16)
        return sum(t.lost for t in results) / sum(t.packets + t.retransmits for t in results)

    # netem's get_crandom averages uniforms: the result bunches near 2**31 and rarely falls
    # below the 10% threshold. "loss 10% 50%" loses about 0.1% of packets on a real netem.
    assert loss_rate("netem") < 0.01
    assert abs(loss_rate("ar1") - 0.10) < 0.01


# --- rate ---------------------------------------------------------------------------------


def test_rate_serialises_every_packet_exactly():
    spec = Netem(rate_bps=100_000_000)
    link = LinkModel(spec)
    wire = np.array([65536 + HEADER_BYTES] * 16)  # 1 MB in 16 segments
    one_mb = int(packet_time_ns(spec, wire).sum())
    assert one_mb == 16 * (65536 + 66) * 8 * 10  # 10 ns per bit at 100 mbit
    first = link.transmit(0, 1 << 20)
    assert first.delivered_ns == one_mb
    # A second message sent at the same instant queues behind the first one.
    second = link.transmit(0, 1 << 20, flow=1)
    assert second.delivered_ns == 2 * one_mb == link.tail_ns


def test_zero_byte_message_still_sends_one_packet():
    spec = Netem(rate_bps=8_000_000)  # 1 byte per microsecond
    sent = LinkModel(spec).transmit(1000, 0)
    assert sent.packets == 1
    assert sent.delivered_ns == 1000 + HEADER_BYTES * US


def test_packet_time_overheads_and_cells():
    spec = Netem(rate_bps=8_000_000, packet_overhead=14, cell_size=48, cell_overhead=5)
    # 100 + 14 bytes -> 3 cells of 48 -> 3 * 53 bytes on the wire, 1 us per byte.
    assert packet_time_ns(spec, 100) == 159 * US
    assert packet_time_ns(spec, np.array([100, 10])).tolist() == [159 * US, 53 * US]
    assert packet_time_ns(Netem(), 1500) == 0


def test_tail_is_shared_state_that_callers_may_move():
    link = LinkModel(Netem(rate_bps=8_000_000))
    link.tail_ns = 5 * MS  # another process of this node has the NIC busy until 5 ms
    assert link.transmit(0, 0).delivered_ns == 5 * MS + HEADER_BYTES * US


def test_rate_with_jitter_never_reorders():
    spec = Netem(delay_ns=MS, jitter_ns=MS, rate_bps=10**9)
    link = LinkModel(spec, trace=True)
    sends = [link.transmit(i * 10 * US, 200_000).trace.send_ns for i in range(50)]
    assert np.all(np.diff(np.concatenate(sends)) > 0)


def test_jitter_without_rate_reorders():
    start, every = 0, 10 * US
    delays = LinkModel(Netem(delay_ns=5 * MS, jitter_ns=MS)).one_way_delays(2000, start, every)
    arrivals = start + every * np.arange(2000) + delays
    assert np.sum(np.diff(arrivals) < 0) > 100


# --- loss and TCP recovery ----------------------------------------------------------------


def test_random_loss_rate():
    results = send_many(LinkModel(Netem(loss=LossRandom(1.0))), 200, MB16)  # 51,200 packets
    sent = sum(t.packets + t.retransmits for t in results)
    lost = sum(t.lost for t in results)
    assert all(t.lost == t.retransmits for t in results)  # TCP resends every loss
    assert abs(lost / sent - 0.01) < 3 * math.sqrt(0.01 * 0.99 / sent)


def test_a_lost_single_packet_waits_for_the_rto():
    link = LinkModel(Netem(delay_ns=5 * MS, loss=LossRandom(30)))
    results = send_many(link, 100, 1000)
    hit = [t for t in results if t.lost]
    assert hit
    for i, t in enumerate(results):
        # arrival, not delivery: a message also waits for a slow predecessor of its flow
        waited = t.arrival_ns - i * 1_000 * MS - 5 * MS
        assert t.timeouts == t.lost
        # 200 ms, then 400 ms more, ... (exponential backoff)
        assert waited == RTO_MIN_NS * (2**t.lost - 1)


def test_an_early_loss_in_a_long_message_costs_one_round_trip():
    link = LinkModel(Netem(delay_ns=5 * MS, loss=LossRandom(2)), trace=True)
    for i in range(200):
        t = link.transmit(i * 1_000 * MS, 64 * 65536)
        first_pass = t.trace.lost[: t.packets]
        if t.lost == 1 and np.flatnonzero(first_pass)[0] < 60:
            break
    else:
        pytest.fail("no message with exactly one early loss")
    assert t.timeouts == 0  # fast retransmit: 3 later segments arrived
    # Data at 5 ms, SACKs back at 10 ms, retransmission arrives at 15 ms: one RTT extra.
    assert t.delivered_ns - i * 1_000 * MS == 15 * MS


def test_an_rto_retransmission_does_not_block_later_traffic_of_other_flows():
    spec = Netem(rate_bps=10**9, loss=LossRandom(50))
    link = LinkModel(spec)
    for i in range(100):
        start = i * 1_000 * MS
        stalled = link.transmit(start, 100, flow=0)
        later = link.transmit(start + MS, 100, flow=1 + i)
        if stalled.lost and not later.lost:
            break
    else:
        pytest.fail("no lost message followed by a delivered one")
    assert stalled.arrival_ns >= start + RTO_MIN_NS
    # The retransmission, 200 ms ahead, holds no place in the NIC queue at start + 1 ms.
    assert later.delivered_ns == start + MS + packet_time_ns(spec, 100 + HEADER_BYTES)


def test_total_loss_is_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match="gives up"):
        LinkModel(Netem(loss=LossRandom(100))).transmit(0, 10)


def four_state_loss_probability(p13, p31, p32, p23, p14) -> float:
    """Stationary loss of the GI 4-state chain; states 1, 2 receive, 3 (burst), 4 lose."""
    p13, p31, p32, p23, p14 = (p / 100 for p in (p13, p31, p32, p23, p14))
    P = np.array(
        [
            [1 - p13 - p14, 0, p13, p14],
            [0, 1 - p23, p23, 0],
            [p31, p32, 1 - p31 - p32, 0],
            [1, 0, 0, 0],
        ]
    )
    values, vectors = np.linalg.eig(P.T)
    pi = np.real(vectors[:, np.argmin(np.abs(values - 1))])
    pi /= pi.sum()
    return float(pi[2] + pi[3])


def loss_trace(spec: Netem, messages: int = 400) -> np.ndarray:
    """Lost flags of every packet netem saw, in order (retransmissions included)."""
    link = LinkModel(spec, trace=True)
    return np.concatenate([t.trace.lost for t in send_many(link, messages, MB16)])


def burst_lengths(lost: np.ndarray) -> np.ndarray:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], lost.astype(int), [0]])))
    return edges[1::2] - edges[0::2]


def test_four_state_model_matches_its_stationary_loss():
    # p13, p31, p32, p23, p14. Moderate bursts: 15 losses in a row of one retransmitted
    # segment would make TCP give up (see test_total_loss_is_an_error_not_a_hang).
    params = (5, 50, 10, 20, 2)
    lost = loss_trace(Netem(loss=LossState(*params[:2], p32=10, p23=20, p14=2)))
    expected = four_state_loss_probability(*params)
    assert abs(lost.mean() - expected) < 0.1 * expected


def test_gilbert_elliott_default_loses_in_bursts_of_one_over_r():
    lost = loss_trace(Netem(loss=LossGemodel(p=2, r=50)))  # 1-h = 100%, 1-k = 0%
    assert abs(lost.mean() - 2 / 52) < 0.1 * 2 / 52  # time in the bad state: p / (p + r)
    assert abs(burst_lengths(lost).mean() - 1 / 0.50) < 0.2


def test_gilbert_elliott_loss_probabilities_mean_what_they_say():
    lost = loss_trace(Netem(loss=LossGemodel(p=5, r=50, one_minus_h=40, one_minus_k=2)))
    good, bad = 50 / 55, 5 / 55
    expected = good * 0.02 + bad * 0.40
    assert abs(lost.mean() - expected) < 0.1 * expected


def test_corruption_is_a_loss_that_still_crosses_the_link():
    link = LinkModel(Netem(delay_ns=MS, corrupt=10), trace=True)
    traces = [t.trace for t in send_many(link, 50, MB16)]
    lost = np.concatenate([t.lost for t in traces])
    send = np.concatenate([t.send_ns for t in traces])
    assert abs(lost.mean() - 0.10) < 0.02
    assert np.all(send[lost] >= 0)  # corrupted packets were sent; the receiver drops them


def test_ecn_marks_instead_of_dropping():
    results = send_many(LinkModel(Netem(loss=LossRandom(10), ecn=True)), 50, MB16)
    assert sum(t.lost for t in results) == 0
    assert abs(sum(t.marked for t in results) / (50 * 256) - 0.10) < 0.02


# --- duplicate, reorder, limit ------------------------------------------------------------


def test_duplicate_copies_about_half_the_packets():
    link = LinkModel(Netem(delay_ns=MS, duplicate=50), trace=True)
    results = send_many(link, 40, MB16)
    packets = sum(t.packets for t in results)
    duplicates = sum(t.duplicates for t in results)
    assert abs(duplicates / packets - 0.5) < 3 * math.sqrt(0.25 / packets)
    assert sum(t.trace.duplicate.sum() for t in results) == duplicates
    assert all(t.delivered_ns == i * 1_000 * MS + MS for i, t in enumerate(results))


def test_reorder_sends_one_packet_at_once_after_at_least_gap_minus_one_delayed():
    gap = 5
    link = LinkModel(Netem(delay_ns=10 * MS, reorder=25, gap=gap), trace=True)
    traces = [t.trace for t in send_many(link, 20, MB16)]
    reordered = np.concatenate([t.reordered for t in traces])
    waited = np.concatenate([t.send_ns - t.enqueue_ns for t in traces])
    assert np.all(waited[reordered] == 0)
    assert np.all(waited[~reordered] == 10 * MS)
    # Replay netem's counter: a packet may be reordered once gap - 1 packets were delayed.
    counter, eligible = 0, np.zeros(len(reordered), dtype=bool)
    for i, r in enumerate(reordered):
        eligible[i] = counter >= gap - 1
        counter = 0 if r else counter + 1
    assert np.all(eligible[reordered])
    share = reordered.sum() / eligible.sum()
    assert abs(share - 0.25) < 3 * math.sqrt(0.25 * 0.75 / eligible.sum())


def test_a_full_queue_drops_and_tcp_still_delivers():
    spec = Netem(rate_bps=10_000_000, limit=8)  # 52 ms per 64 KB segment, room for 8
    sent = LinkModel(spec).transmit(0, 32 * 65536)
    assert sent.lost > 0 and sent.timeouts > 0
    assert sent.retransmits == sent.lost
    assert sent.delivered_ns > 32 * packet_time_ns(spec, 65536 + HEADER_BYTES)


def test_in_order_delivery_per_flow():
    link = LinkModel(Netem(delay_ns=MS, loss=LossRandom(30)))
    for i in range(100):
        first = link.transmit(i * 1_000 * MS, 100, flow=0)
        if first.lost:
            break
    behind = link.transmit(i * 1_000 * MS + 1, 100, flow=0)
    assert behind.delivered_ns >= first.delivered_ns  # TCP delivers in order
    assert behind.delivered_ns >= behind.arrival_ns


# --- arguments ----------------------------------------------------------------------------


def test_bad_arguments_are_value_errors_naming_the_argument():
    with pytest.raises(ValueError, match="nbytes"):
        LinkModel(Netem()).transmit(0, -1)
    with pytest.raises(ValueError, match="segment_bytes"):
        LinkModel(Netem(), segment_bytes=0)
    with pytest.raises(ValueError, match="correlation"):
        LinkModel(Netem(), correlation="pearson")
    with pytest.raises(ValueError, match="reverse_delay_ns"):
        LinkModel(Netem(), reverse_delay_ns=-1)
    with pytest.raises(ValueError, match="lognormal"):
        LinkModel(Netem(distribution="lognormal"))
