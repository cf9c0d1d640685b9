"""clusterlab.models: closed-form cost models checked against known values and Monte Carlo."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterlab import models as m
from clusterlab.tables import DIST_SCALE, table

ALPHA, BETA, GAMMA = 5e-6, 1 / 1.25e9, 1 / 5e9  # 5 us, 10 Gbit/s, 5 GB/s of adds
N = 64 * 2**20  # a 64 MiB gradient

TABLES = ["normal", "pareto", "paretonormal"]


def draws(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Jitter draws as netem makes them: a uniform index into the table, in units of sigma."""
    return table(name)[rng.integers(0, len(table(name)), size=shape)] / DIST_SCALE


# --- 1. alpha-beta-gamma collectives ---------------------------------------------------------


def test_ring_allreduce_formula_and_steps():
    p = 8
    expected = 2 * 7 * ALPHA + 2 * (7 / 8) * N * BETA + (7 / 8) * N * GAMMA
    assert m.ring_allreduce(p, N, ALPHA, BETA, GAMMA) == pytest.approx(expected, rel=1e-12)
    assert m.ring_allreduce_steps(8) == 14
    assert m.ring_allreduce_steps(1) == 0


def test_two_ranks_ring_matches_rabenseifner_and_recursive_doubling_bandwidth():
    # With p = 2 the ring is one reduce-scatter step plus one all-gather step: exactly
    # Rabenseifner's algorithm.
    ring = m.ring_allreduce(2, N, ALPHA, BETA, GAMMA)
    assert ring == pytest.approx(m.rabenseifner_allreduce(2, N, ALPHA, BETA, GAMMA), rel=1e-12)
    # Recursive doubling sends the same bytes (nβ) in ONE message instead of two halves, but
    # each rank reduces the whole vector instead of half: same β term, α + nγ vs 2α + nγ/2.
    assert m.ring_allreduce(2, N, 0, BETA) == pytest.approx(
        m.recursive_doubling_allreduce(2, N, 0, BETA), rel=1e-12
    )
    rd = m.recursive_doubling_allreduce(2, N, ALPHA, BETA, GAMMA)
    assert rd - ring == pytest.approx(-ALPHA + N * GAMMA / 2, rel=1e-9)


@pytest.mark.parametrize("p", [2, 4, 8, 64, 1024])
def test_rabenseifner_is_ring_bandwidth_with_fewer_latencies(p):
    # Same bandwidth and reduction terms...
    assert m.rabenseifner_allreduce(p, N, 0, BETA, GAMMA) == pytest.approx(
        m.ring_allreduce(p, N, 0, BETA, GAMMA), rel=1e-12
    )
    # ...but 2 lg p latencies instead of 2(p - 1).
    lg = int(math.log2(p))
    assert m.rabenseifner_allreduce(p, 0, ALPHA, BETA) == pytest.approx(2 * lg * ALPHA)
    assert m.ring_allreduce(p, 0, ALPHA, BETA) == pytest.approx(2 * (p - 1) * ALPHA)
    assert m.rabenseifner_allreduce(p, N, ALPHA, BETA, GAMMA) <= m.ring_allreduce(
        p, N, ALPHA, BETA, GAMMA
    )


@settings(max_examples=50, deadline=None)
@given(
    lg=st.integers(1, 12),
    n=st.floats(0, 1e10),
    alpha=st.floats(0, 1e-3),
    beta=st.floats(0, 1e-6),
)
def test_rabenseifner_never_slower_than_ring_for_powers_of_two(lg, n, alpha, beta):
    p = 2**lg
    assert m.rabenseifner_allreduce(p, n, alpha, beta) <= m.ring_allreduce(p, n, alpha, beta) * (
        1 + 1e-12
    )


def test_recursive_doubling_power_of_two_and_fold():
    assert m.recursive_doubling_allreduce(8, N, ALPHA, BETA, GAMMA) == pytest.approx(
        3 * (ALPHA + N * BETA + N * GAMMA)
    )
    # p = 6: p' = 4, two rounds, plus fold-in (α + nβ + nγ) and fold-out (α + nβ).
    assert m.recursive_doubling_allreduce(6, N, ALPHA, BETA, GAMMA) == pytest.approx(
        2 * (ALPHA + N * BETA + N * GAMMA) + 2 * (ALPHA + N * BETA) + N * GAMMA
    )


def test_rabenseifner_non_power_of_two_adds_fold_steps():
    fold = 2 * (ALPHA + N * BETA) + N * GAMMA
    assert m.rabenseifner_allreduce(6, N, ALPHA, BETA, GAMMA) == pytest.approx(
        m.rabenseifner_allreduce(4, N, ALPHA, BETA, GAMMA) + fold
    )


def test_binomial_tree_costs():
    # ceil(lg 5) = 3 rounds
    assert m.binomial_broadcast(5, N, ALPHA, BETA) == pytest.approx(3 * (ALPHA + N * BETA))
    assert m.binomial_reduce(5, N, ALPHA, BETA, GAMMA) == pytest.approx(
        3 * (ALPHA + N * BETA + N * GAMMA)
    )
    assert m.binomial_broadcast(8, N, ALPHA, BETA) == pytest.approx(3 * (ALPHA + N * BETA))
    assert m.tree_allreduce(5, N, ALPHA, BETA, GAMMA) == pytest.approx(
        m.binomial_reduce(5, N, ALPHA, BETA, GAMMA) + m.binomial_broadcast(5, N, ALPHA, BETA)
    )


def test_allgather_and_reduce_scatter():
    p = 16
    assert m.ring_allgather(p, N, ALPHA, BETA) == pytest.approx(15 * ALPHA + 15 / 16 * N * BETA)
    assert m.recursive_doubling_allgather(p, N, ALPHA, BETA) == pytest.approx(
        4 * ALPHA + 15 / 16 * N * BETA
    )
    assert m.ring_reduce_scatter(p, N, ALPHA, BETA, GAMMA) == pytest.approx(
        15 * ALPHA + 15 / 16 * N * (BETA + GAMMA)
    )
    assert m.recursive_halving_reduce_scatter(p, N, ALPHA, BETA, GAMMA) == pytest.approx(
        4 * ALPHA + 15 / 16 * N * (BETA + GAMMA)
    )
    # A ring all-reduce is a ring reduce-scatter followed by a ring all-gather.
    assert m.ring_allreduce(p, N, ALPHA, BETA, GAMMA) == pytest.approx(
        m.ring_reduce_scatter(p, N, ALPHA, BETA, GAMMA) + m.ring_allgather(p, N, ALPHA, BETA)
    )
    # So is Rabenseifner's, with the logarithmic variants.
    assert m.rabenseifner_allreduce(p, N, ALPHA, BETA, GAMMA) == pytest.approx(
        m.recursive_halving_reduce_scatter(p, N, ALPHA, BETA, GAMMA)
        + m.recursive_doubling_allgather(p, N, ALPHA, BETA)
    )


def test_parameter_server_incast():
    p, s = 8, 2
    expected = 2 * (ALPHA + p * (N / s) * BETA) + p * (N / s) * GAMMA
    assert m.parameter_server(p, N, ALPHA, BETA, GAMMA, servers=s) == pytest.approx(expected)
    # Incast: the time grows linearly with the number of workers; the ring's barely moves.
    t16, t32 = (m.parameter_server(q, N, 0, BETA) for q in (16, 32))
    assert t32 == pytest.approx(2 * t16)
    assert m.ring_allreduce(32, N, 0, BETA) < 1.05 * m.ring_allreduce(16, N, 0, BETA)
    # More servers than workers: each worker's own NIC (n bytes each way) is the bottleneck.
    assert m.parameter_server(2, N, 0, BETA, servers=8) == pytest.approx(2 * N * BETA)


def test_hierarchical_allreduce_is_reduce_ring_broadcast():
    args = (N, 1e-6, 1 / 50e9, ALPHA, BETA, GAMMA)
    t = m.hierarchical_allreduce(4, 8, *args)
    expected = (
        m.binomial_reduce(8, N, 1e-6, 1 / 50e9, GAMMA)
        + m.ring_allreduce(4, N, ALPHA, BETA, GAMMA)
        + m.binomial_broadcast(8, N, 1e-6, 1 / 50e9)
    )
    assert t == pytest.approx(expected)
    # One process per node: just a ring among the nodes.
    assert m.hierarchical_allreduce(4, 1, *args) == pytest.approx(
        m.ring_allreduce(4, N, ALPHA, BETA, GAMMA)
    )


@pytest.mark.parametrize("algorithm", m.ALLREDUCE_CLOSED_FORMS)
def test_allreduce_time_dispatches(algorithm):
    direct = {
        "ring": m.ring_allreduce,
        "recursive_doubling": m.recursive_doubling_allreduce,
        "rabenseifner": m.rabenseifner_allreduce,
        "tree": m.tree_allreduce,
        "parameter_server": m.parameter_server,
    }[algorithm]
    assert m.allreduce_time(algorithm, 12, N, ALPHA, BETA, GAMMA) == direct(
        12, N, ALPHA, BETA, GAMMA
    )


def test_one_rank_costs_nothing():
    for algorithm in m.ALLREDUCE_CLOSED_FORMS:
        assert m.allreduce_time(algorithm, 1, N, ALPHA, BETA, GAMMA) == 0
    assert m.binomial_broadcast(1, N, ALPHA, BETA) == 0
    assert m.binomial_reduce(1, N, ALPHA, BETA, GAMMA) == 0
    assert m.ring_allgather(1, N, ALPHA, BETA) == 0
    assert m.recursive_doubling_allgather(1, N, ALPHA, BETA) == 0
    assert m.ring_reduce_scatter(1, N, ALPHA, BETA, GAMMA) == 0
    assert m.recursive_halving_reduce_scatter(1, N, ALPHA, BETA, GAMMA) == 0
    assert m.hierarchical_allreduce(1, 1, N, ALPHA, BETA, ALPHA, BETA, GAMMA) == 0


# --- 2. nccl-tests bandwidths ----------------------------------------------------------------


def test_busbw_factors():
    p = 8
    assert m.busbw_factor("all_reduce", p) == pytest.approx(2 * 7 / 8)
    for name in ("all_gather", "reduce_scatter", "all_to_all"):
        assert m.busbw_factor(name, p) == pytest.approx(7 / 8)
    for name in ("broadcast", "reduce"):
        assert m.busbw_factor(name, p) == 1.0
    assert m.alg_bandwidth(1e9, 0.5) == 2e9
    assert m.bus_bandwidth("all_reduce", p, 1e9, 0.5) == pytest.approx(2e9 * 1.75)


def test_busbw_of_a_perfect_ring_is_the_link_bandwidth():
    # A bandwidth-bound ring all-reduce shows busbw = 1/beta whatever the number of ranks.
    for p in (2, 8, 64):
        t = m.ring_allreduce(p, N, 0, BETA)
        assert m.bus_bandwidth("all_reduce", p, N, t) == pytest.approx(1 / BETA)


# --- 3. order statistics of jitter -----------------------------------------------------------


def test_expected_max_of_two_ideal_normals():
    assert round(m.expected_max_ideal(2, "normal"), 4) == 0.5642
    assert m.expected_max_ideal(2, "normal") == pytest.approx(1 / math.sqrt(math.pi), abs=1e-9)
    assert m.expected_max_ideal(3, "normal") == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-9)
    assert m.expected_max_ideal(1, "normal") == pytest.approx(0, abs=1e-9)
    assert m.expected_max_ideal(10, "exponential") == pytest.approx(m.harmonic(10))


def test_netem_normal_table_max_of_two_is_close_to_ideal():
    assert m.expected_max(2, "normal") == pytest.approx(0.5642, abs=0.01)
    assert m.expected_max(2, "normal", jitter=3.0) == pytest.approx(3 * m.expected_max(2, "normal"))


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_uniform_expected_max_against_monte_carlo(n):
    jitter = 2.5
    assert m.expected_max(n, "uniform", jitter) == pytest.approx(jitter * (n - 1) / (n + 1))
    rng = np.random.default_rng(n)
    maxima = rng.uniform(-jitter, jitter, size=(20_000, n)).max(axis=1)
    se = maxima.std() / math.sqrt(len(maxima))
    assert abs(maxima.mean() - m.expected_max(n, "uniform", jitter)) < 5 * se


@pytest.mark.parametrize("name", TABLES)
def test_table_expected_max_against_monte_carlo(name):
    rng = np.random.default_rng(7)
    maxima = draws(name, (20_000, 16), rng).max(axis=1)
    se = maxima.std() / math.sqrt(len(maxima))
    assert abs(maxima.mean() - m.expected_max(16, name)) < 5 * se
    # One draw: the mean of the table.
    assert m.expected_max(1, name) == pytest.approx(table(name).mean() / DIST_SCALE)


@pytest.mark.parametrize("name", ("uniform",) + tuple(TABLES))
@pytest.mark.parametrize("n", [1, 4, 32])
def test_max_std_against_monte_carlo(name, n):
    rng = np.random.default_rng(n)
    if name == "uniform":
        maxima = rng.uniform(-1.0, 1.0, size=(40_000, n)).max(axis=1)
    else:
        maxima = draws(name, (40_000, n), rng).max(axis=1)
    # The sample std of 40k draws is within ~2% of the true one (4 standard errors).
    assert m.max_std(n, name) == pytest.approx(maxima.std(), rel=0.03)
    assert m.max_std(n, name, jitter=2.0) == pytest.approx(2 * m.max_std(n, name))
    if n == 1:
        assert m.max_std(1, name) == pytest.approx(m.jitter_std(name))


@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize("q", [0.1, 0.5, 0.9, 0.99])
def test_max_quantile_against_monte_carlo_of_tables(name, q):
    n, trials = 16, 20_000
    rng = np.random.default_rng(int(q * 100))
    maxima = draws(name, (trials, n), rng).max(axis=1)
    predicted = m.max_quantile(n, q, name)
    # `predicted` is the q-quantile of a discrete law: P(max <= x) >= q and P(max < x) <= q.
    tol = 4 * math.sqrt(q * (1 - q) / trials)
    assert np.mean(maxima <= predicted) >= q - tol
    assert np.mean(maxima < predicted) <= q + tol


def test_jitter_quantiles():
    assert m.jitter_quantile(0.5, "uniform", 2.0) == 0.0
    assert m.jitter_quantile(0.75, "uniform", 2.0) == 1.0
    values = np.sort(table("normal")) / DIST_SCALE
    assert m.jitter_quantile(0.0, "normal") == values[0]
    assert m.jitter_quantile(1.0, "normal") == values[-1]
    assert m.jitter_quantile(0.5, "normal") == values[2047]  # F(v_2047) = 2048/4096 = 0.5
    assert m.jitter_quantile(0.8413, "normal") == pytest.approx(1.0, abs=0.01)  # Phi(1)
    assert m.max_quantile(1, 0.3, "pareto") == m.jitter_quantile(0.3, "pareto")
    assert m.max_quantile(10, 0.5, "uniform") == pytest.approx(2 * 0.5**0.1 - 1)


def test_harmonic_numbers():
    assert m.harmonic(0) == 0
    assert m.harmonic(1) == 1
    assert m.harmonic(4) == pytest.approx(25 / 12)
    # The asymptotic branch continues the exact sum seamlessly.
    assert m.harmonic(1001) == pytest.approx(m.harmonic(1000) + 1 / 1001, rel=1e-15)
    assert m.harmonic(10**9) == pytest.approx(math.log(1e9) + 0.5772156649, rel=1e-10)


def test_straggler_step_against_monte_carlo():
    c, mean, n = 0.1, 0.02, 32
    assert m.straggler_step(c, mean, n) == pytest.approx(c + mean * m.harmonic(n))
    rng = np.random.default_rng(3)
    steps = c + rng.exponential(mean, size=(20_000, n)).max(axis=1)
    se = steps.std() / math.sqrt(len(steps))
    assert abs(steps.mean() - m.straggler_step(c, mean, n)) < 5 * se


def test_tail_at_scale():
    assert m.tail_at_scale(0.01, 100) == pytest.approx(0.634, abs=5e-4)
    assert m.tail_at_scale(0.01, 0) == 0
    assert m.tail_at_scale(1.0, 5) == 1
    assert m.tail_at_scale(0.0, 5) == 0


def test_delayed_gd_no_delay_is_the_classic_bound():
    assert m.delayed_gd_stable_step(0) == pytest.approx(2.0)
    assert m.delayed_gd_spectral_radius(1.5, 0) == pytest.approx(0.5)  # root 1 - a


@pytest.mark.parametrize("tau", range(1, 11))
def test_delayed_gd_stability_boundary(tau):
    a = m.delayed_gd_stable_step(tau)
    assert m.delayed_gd_spectral_radius(a * (1 - 1e-3), tau) < 1
    assert m.delayed_gd_spectral_radius(a * (1 + 1e-3), tau) > 1
    # And the iteration itself converges below the boundary and blows up above it.
    for factor, converges in ((0.9, True), (1.1, False)):
        x = [1.0] * (tau + 1)
        for _ in range(3000):
            x.append(x[-1] - factor * a * x[-1 - tau])
        assert (abs(x[-1]) < 1e-3) == converges


# --- 4. fitting ------------------------------------------------------------------------------


def test_fit_recovers_alpha_and_beta():
    alpha, beta = 25e-6, 1 / 1.25e9
    sizes = np.logspace(3, 8, 40)
    rng = np.random.default_rng(11)
    times = (alpha + sizes * beta) * rng.normal(1.0, 0.02, size=sizes.shape)
    fit = m.fit_alpha_beta(sizes, times)
    assert fit.r2 > 0.99
    assert fit.beta == pytest.approx(beta, rel=0.02)
    assert fit.bandwidth == pytest.approx(1.25e9, rel=0.02)
    # alpha is the intercept: recover it from small-message data.
    small = np.logspace(1, 4, 40)
    small_fit = m.fit_alpha_beta(small, (alpha + small * beta) + rng.normal(0, 1e-7, 40))
    assert small_fit.alpha == pytest.approx(alpha, rel=0.05)
    exact = m.fit_alpha_beta([0, 1000], [alpha, alpha + 1000 * beta])
    assert exact.alpha == pytest.approx(alpha) and exact.beta == pytest.approx(beta)
    assert exact.r2 == pytest.approx(1.0)
    assert m.AlphaBetaFit(1e-6, 0.0, 1.0).bandwidth == math.inf


# --- Bad input: every error names the parameter ----------------------------------------------


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: m.ring_allreduce(0, N, ALPHA, BETA), "p"),
        (lambda: m.ring_allreduce(2.0, N, ALPHA, BETA), "p"),
        (lambda: m.ring_allreduce(True, N, ALPHA, BETA), "p"),
        (lambda: m.ring_allreduce(2, -1, ALPHA, BETA), "n"),
        (lambda: m.ring_allreduce(2, N, -ALPHA, BETA), "alpha"),
        (lambda: m.ring_allreduce(2, N, ALPHA, -BETA), "beta"),
        (lambda: m.ring_allreduce(2, N, ALPHA, BETA, -GAMMA), "gamma"),
        (lambda: m.ring_allreduce(2, N, ALPHA, math.nan), "beta"),
        (lambda: m.recursive_doubling_allreduce(0, N, ALPHA, BETA), "p"),
        (lambda: m.rabenseifner_allreduce(4, N, ALPHA, BETA, -1), "gamma"),
        (lambda: m.binomial_broadcast(4, -N, ALPHA, BETA), "n"),
        (lambda: m.binomial_reduce(4, N, -1, BETA), "alpha"),
        (lambda: m.tree_allreduce(-3, N, ALPHA, BETA), "p"),
        (lambda: m.ring_allgather(4, N, ALPHA, -1), "beta"),
        (lambda: m.recursive_doubling_allgather(0, N, ALPHA, BETA), "p"),
        (lambda: m.ring_reduce_scatter(4, N, ALPHA, BETA, -1), "gamma"),
        (lambda: m.recursive_halving_reduce_scatter(4, -1, ALPHA, BETA), "n"),
        (lambda: m.parameter_server(4, N, ALPHA, BETA, servers=0), "servers"),
        (lambda: m.parameter_server(0, N, ALPHA, BETA), "p"),
        (lambda: m.hierarchical_allreduce(0, 2, N, ALPHA, BETA, ALPHA, BETA), "nodes"),
        (lambda: m.hierarchical_allreduce(2, 0, N, ALPHA, BETA, ALPHA, BETA), "procs_per_node"),
        (lambda: m.hierarchical_allreduce(2, 2, N, ALPHA, BETA, -1, BETA), "alpha_inter"),
        (lambda: m.hierarchical_allreduce(2, 2, N, ALPHA, -1, ALPHA, BETA), "beta_intra"),
        (lambda: m.allreduce_time("butterfly", 4, N, ALPHA, BETA), "algorithm"),
        (lambda: m.allreduce_time("ring", 0, N, ALPHA, BETA), "p"),
        (lambda: m.ring_allreduce_steps(0), "p"),
        (lambda: m.alg_bandwidth(N, 0), "seconds"),
        (lambda: m.alg_bandwidth(-1, 1), "n"),
        (lambda: m.busbw_factor("allreduce", 4), "collective"),
        (lambda: m.busbw_factor("all_reduce", 0), "p"),
        (lambda: m.bus_bandwidth("all_reduce", 4, N, -1), "seconds"),
        (lambda: m.jitter_quantile(1.5), "q"),
        (lambda: m.jitter_quantile(0.5, "gaussian"), "distribution"),
        (lambda: m.jitter_quantile(0.5, "normal", -1), "jitter"),
        (lambda: m.expected_max(0), "n"),
        (lambda: m.expected_max(2, "lognormal"), "distribution"),
        (lambda: m.expected_max(2, "uniform", -1.0), "jitter"),
        (lambda: m.max_quantile(0, 0.5, "normal"), "n"),
        (lambda: m.max_quantile(4, -0.1, "normal"), "q"),
        (lambda: m.max_quantile(4, 0.5, "cauchy"), "distribution"),
        (lambda: m.expected_max_ideal(0, "normal"), "n"),
        (lambda: m.expected_max_ideal(2, "pareto"), "distribution"),
        (lambda: m.harmonic(-1), "n"),
        (lambda: m.straggler_step(-1, 0.1, 4), "c"),
        (lambda: m.straggler_step(1, -0.1, 4), "m"),
        (lambda: m.straggler_step(1, 0.1, 0), "n"),
        (lambda: m.tail_at_scale(1.5, 10), "p"),
        (lambda: m.tail_at_scale(0.1, -1), "n"),
        (lambda: m.delayed_gd_stable_step(-1), "tau"),
        (lambda: m.delayed_gd_spectral_radius(-0.1, 2), "a"),
        (lambda: m.delayed_gd_spectral_radius(0.1, -2), "tau"),
        (lambda: m.fit_alpha_beta([1.0], [1.0]), "sizes"),
        (lambda: m.fit_alpha_beta([1.0, 2.0], [1.0]), "sizes and times"),
        (lambda: m.fit_alpha_beta([5.0, 5.0, 5.0], [1.0, 2.0, 3.0]), "sizes"),
        (lambda: m.fit_alpha_beta([1.0, 2.0], [1.0, math.inf]), "sizes and times"),
    ],
)
def test_bad_input_raises_value_error_naming_the_parameter(call, name):
    with pytest.raises(ValueError, match=rf"^(unknown )?{name}\b"):
        call()


def test_quantile_ci_covers_the_true_quantile_at_its_confidence():
    rng = np.random.default_rng(1)
    true_p90 = math.log(10)  # the 0.9-quantile of Exp(1)
    covered = [lo <= true_p90 <= hi
               for _, lo, hi in (m.quantile_ci(rng.exponential(size=80), 0.9)
                                 for _ in range(1000))]
    assert 0.93 <= np.mean(covered) <= 0.995  # distribution-free: at least 95 %, a bit more


def test_quantile_ci_says_when_a_tail_is_not_estimable():
    x = np.arange(40.0)
    est, lo, hi = m.quantile_ci(x, 0.99)
    assert hi == math.inf and lo <= est <= x.max()  # p99 of 40 samples: about the maximum
    est, lo, hi = m.quantile_ci(np.arange(1000.0), 0.99)
    assert lo < est < hi < math.inf
    with pytest.raises(ValueError):
        m.quantile_ci([], 0.5)
