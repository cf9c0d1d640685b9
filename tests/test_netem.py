"""Tests for the `tc netem` grammar in clusterlab.netem."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterlab.netem import (
    DEFAULT_LIMIT,
    LossGemodel,
    LossRandom,
    LossState,
    Netem,
    as_netem,
)

MS, US = 10**6, 10**3

# iproute2's keyword order, written out again here so the tests do not trust the module's copy.
ORDER = (
    "limit", "latency", "delay", "loss", "drop", "seed", "ecn", "reorder", "corrupt",
    "gap", "duplicate", "distribution", "rate", "slot",
)  # fmt: skip


# --- known parses -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("delay 100", Netem(delay_ns=100)),  # a bare time is nanoseconds
        ("delay 10ms 2ms 25%", Netem(delay_ns=10 * MS, jitter_ns=2 * MS, delay_correlation=25)),
        ("latency 1.5ms", Netem(delay_ns=1500 * US)),
        ("delay 1.1us", Netem(delay_ns=1100)),  # exact, no float fuzz
        ("delay 1E+3MSEC", Netem(delay_ns=10**9)),  # units ignore case
        ("delay 2s 3usecs", Netem(delay_ns=2 * 10**9, jitter_ns=3 * US)),
        ("delay 0.4ns", Netem(delay_ns=0)),
        ("delay 0 0 5", Netem(delay_correlation=5)),
        ("rate 1mbps", Netem(rate_bps=8_000_000)),  # megaBYTES per second, as in tc
        ("rate 100mbit", Netem(rate_bps=100_000_000)),
        ("rate 1GBit", Netem(rate_bps=10**9)),
        ("rate 1.5KiBps", Netem(rate_bps=12288)),
        ("rate 2kibit", Netem(rate_bps=2048)),
        ("rate 12345", Netem(rate_bps=12345)),  # a bare rate is bit/s
        (
            "rate 1gbit 20 100 4",
            Netem(rate_bps=10**9, packet_overhead=20, cell_size=100, cell_overhead=4),
        ),
        ("rate 1mbit -4", Netem(rate_bps=10**6, packet_overhead=-4)),
        # tc's three separate checks: '-4' cannot be a cell size, so it is the cell overhead
        ("rate 1mbit 20 -4", Netem(rate_bps=10**6, packet_overhead=20, cell_overhead=-4)),
        ("loss 0.3% 25%", Netem(loss=LossRandom(0.3, 25.0))),
        ("drop 1", Netem(loss=LossRandom(1.0))),
        ("loss random 5", Netem(loss=LossRandom(5.0))),
        ("loss 0", Netem(loss=LossRandom(0.0))),
        ("loss 0 50 loss 1", Netem(loss=LossRandom(1.0, 50.0))),  # tc keeps the correlation
        ("loss state 1", Netem(loss=LossState(1.0, 99.0, 0.0, 100.0, 0.0))),
        ("loss state 1 2 3", Netem(loss=LossState(1.0, 2.0, 3.0, 100.0, 0.0))),
        ("loss state 1 2 3 4 5", Netem(loss=LossState(1.0, 2.0, 3.0, 4.0, 5.0))),
        ("loss gemodel 1", Netem(loss=LossGemodel(1.0, 99.0, 100.0, 0.0))),
        ("loss gemodel 1% 10% 70% 0.1%", Netem(loss=LossGemodel(1.0, 10.0, 70.0, 0.1))),
        ("d 1ms du 1%", Netem(delay_ns=MS, duplicate=1.0)),
        ("duplicate 1 2", Netem(duplicate=1.0, duplicate_correlation=2.0)),
        ("c 0.1 5", Netem(corrupt=0.1, corrupt_correlation=5.0)),
        (
            "reorder 25% 50% gap 5 delay 10ms",
            Netem(delay_ns=10 * MS, reorder=25.0, reorder_correlation=50.0, gap=5),
        ),
        ("r 10 d 1ms", Netem(delay_ns=MS, reorder=10.0, gap=1)),  # reorder implies gap 1
        ("gap 0x10 reorder 1 delay 1ms", Netem(delay_ns=MS, reorder=1.0, gap=16)),
        ("reorder 1 gap 010 delay 1ms", Netem(delay_ns=MS, reorder=1.0, gap=8)),  # C octal
        ("reorder 0 50", Netem(reorder_correlation=50.0)),
        ("di normal d 1ms 1ms", Netem(delay_ns=MS, jitter_ns=MS, distribution="normal")),
        ("distribution uniform delay 1ms 1ms", Netem(delay_ns=MS, jitter_ns=MS)),
        ("l 5", Netem(limit=5)),
        ("limit 1000", Netem()),
        ("s 7", Netem(seed=7)),
        ("seed 0", Netem(seed=0)),
        ("e lo 1", Netem(loss=LossRandom(1.0), ecn=True)),
        ("ra 1gbit", Netem(rate_bps=10**9)),
        ("delay 1ms 2ms delay 3ms", Netem(delay_ns=3 * MS, jitter_ns=2 * MS)),  # tc overwrites
        ("netem delay 1ms", Netem(delay_ns=MS)),
        ("\tdelay\n1ms  ", Netem(delay_ns=MS)),
        ("", Netem()),
        ("   ", Netem()),
    ],
)
def test_known_parses(text: str, expected: Netem) -> None:
    assert Netem.parse(text) == expected


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        (Netem(), ""),
        (Netem(delay_ns=2 * MS, jitter_ns=500 * US), "delay 2ms 500us"),
        (Netem(delay_ns=1500 * US), "delay 1500us"),
        (Netem(delay_ns=10**9, jitter_ns=7), "delay 1s 7ns"),
        (Netem(loss=LossRandom(1.0)), "loss 1%"),
        (Netem(loss=LossRandom(100 / 3)), "loss 33.333333333333336%"),
        (Netem(loss=LossState(1.0, 99.0)), "loss state 1%"),
        (Netem(loss=LossState(1.0, 99.0, 0.0, 100.0, 2.0)), "loss state 1% 99% 0% 100% 2%"),
        (Netem(loss=LossGemodel(1.0, 99.0)), "loss gemodel 1%"),
        (Netem(delay_ns=MS, reorder=5.0, gap=1), "delay 1ms reorder 5%"),
        (Netem(delay_ns=MS, reorder=5.0, gap=3), "delay 1ms reorder 5% gap 3"),
        (Netem(rate_bps=10**9, packet_overhead=20), "rate 1gbit 20"),
        (Netem(rate_bps=10**9, cell_overhead=-4), "rate 1gbit 0 0 -4"),
        (Netem(rate_bps=1500), "rate 1500bit"),
        (Netem(limit=10, seed=3), "limit 10 seed 3"),
        (
            Netem(delay_ns=MS, jitter_ns=MS, distribution="pareto", duplicate=0.5, ecn=True,
                  loss=LossRandom(1.0), corrupt=0.1, rate_bps=10**7),
            "delay 1ms 1ms distribution pareto loss 1% ecn duplicate 0.5% corrupt 0.1% rate 10mbit",
        ),
    ],
)  # fmt: skip
def test_canonical_text(spec: Netem, text: str) -> None:
    assert str(spec) == text
    assert Netem.parse(text) == spec


def test_repr() -> None:
    assert repr(Netem.parse("delay 2ms 500us")) == "Netem('delay 2ms 500us')"
    assert repr(Netem()) == "Netem('')"


# --- errors: each message quotes the offending token --------------------------------------------


@pytest.mark.parametrize(
    ("text", "token"),
    [
        ("delya 1ms", "delya"),  # unknown keyword
        ("Delay 1ms", "Delay"),  # keywords are case-sensitive
        ("help", "help"),
        ("delay 10ms .5ms", ".5ms"),  # an optional number must start with a digit
        ("delay 10ms 2ms 25% 10", "10"),
        ("delay 5xs", "5xs"),  # bad time unit
        ("delay -5ms", "-5ms"),  # negative delay
        ("delay 1e30s", "1e30s"),
        ("loss 101%", "101%"),  # percent > 100
        ("duplicate -1", "-1"),
        ("delay 1ms 1ms 150%", "150%"),  # correlation > 100
        ("corrupt 5 x", "x"),
        ("duplicate 5pc", "5pc"),
        ("delay 1ms 1ms distribution gamma", "gamma"),  # unknown distribution
        ("delay 1ms distribution normal", "distribution normal"),  # no jitter
        ("distribution uniform", "distribution uniform"),
        ("reorder 5%", "reorder"),  # reorder without delay
        ("delay 1ms gap 5", "gap"),  # gap without reorder
        ("rate 0", "0"),
        ("rate 0.4bit", "0.4bit"),
        ("rate -1mbit", "-1mbit"),
        ("rate 50%", "50%"),  # relative rates need a device
        ("rate 10mbyte", "10mbyte"),
        ("rate 1mbit 20 100 4 5", "5"),
        ("delay", "delay"),  # missing argument at the end
        ("delay 1ms rate", "rate"),
        ("loss random", "loss"),
        ("drop state", "drop"),
        ("loss gemodel", "loss"),
        ("limit 0", "0"),
        ("limit 1k", "1k"),
        ("limit -5", "-5"),
        ("gap 08 reorder 5 delay 1ms", "08"),
        ("slot 10ms", "slot"),
        ("sl 10ms", "sl"),
        ("seed abc", "abc"),  # non-numeric seed
        ("seed -1", "-1"),
        ("seed 0x10", "0x10"),
        ("ecn", "ecn"),  # ecn without a loss model
        ("loss 0 ecn", "ecn"),
        ("loss 1 loss 2", "loss"),  # a second loss model
        ("loss state 1 drop 2", "drop"),
        ("loss .5", ".5"),
        ("loss bogus", "bogus"),
        ("loss state 1 200", "200"),
    ],
)
def test_errors_quote_the_token(text: str, token: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"'{token}'")):
        Netem.parse(text)


def test_type_errors() -> None:
    with pytest.raises(TypeError):
        Netem.parse(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        as_netem(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delay_ns": -1},
        {"duplicate": 101.0},
        {"reorder": float("nan")},
        {"distribution": "gamma"},
        {"limit": 0},
        {"seed": -1},
        {"cell_size": -1},
    ],
)
def test_direct_construction_checks_ranges(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Netem(**kwargs)


def test_loss_models_check_ranges() -> None:
    with pytest.raises(ValueError):
        LossRandom(-1.0)
    with pytest.raises(ValueError):
        LossState(1.0, 101.0)
    with pytest.raises(ValueError):
        LossGemodel(1.0, 2.0, 3.0, 400.0)


# --- helpers ------------------------------------------------------------------------------------


def test_as_netem() -> None:
    spec = Netem(delay_ns=MS)
    assert as_netem(None) is None
    assert as_netem(spec) is spec
    assert as_netem("delay 1ms") == spec


def test_scaled_and_properties() -> None:
    spec = Netem.parse("delay 10ms 2ms distribution normal rate 1gbit 20 loss 1% limit 50")
    slow = spec.scaled(4)
    assert (slow.delay_ns, slow.jitter_ns, slow.rate_bps) == (40 * MS, 8 * MS, 250_000_000)
    assert slow.loss == spec.loss and slow.limit == 50 and slow.packet_overhead == 20
    assert spec.delay_s == pytest.approx(0.01) and spec.jitter_s == pytest.approx(0.002)
    assert spec.rate_Bps == 125_000_000.0 and Netem().rate_Bps == 0.0
    assert Netem().scaled(3) == Netem()
    assert Netem(delay_ns=1, rate_bps=1).scaled(1e-3) == Netem(delay_ns=1, rate_bps=1000)
    assert Netem(delay_ns=1, rate_bps=1).scaled(1e3) == Netem(delay_ns=1000, rate_bps=1)
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            spec.scaled(bad)


def test_is_noop() -> None:
    assert Netem.parse("limit 5 seed 1").is_noop
    assert not Netem.parse("delay 1ms").is_noop


# --- properties ---------------------------------------------------------------------------------

percents = st.one_of(
    st.integers(0, 100).map(float),
    st.sampled_from([0.5, 0.1, 1e-05, 100 / 3, 99.99]),
    st.floats(0, 100, allow_nan=False),
)
times = st.one_of(
    st.integers(0, 10**13),
    st.integers(0, 5000).map(lambda n: n * US),
    st.integers(0, 5000).map(lambda n: n * MS),
    st.integers(0, 100).map(lambda n: n * 10**9),
)
rates = st.one_of(
    st.integers(1, 10**13),
    st.integers(1, 1000).map(lambda n: n * 10**6),
    st.integers(1, 100).map(lambda n: n * 10**9),
    st.integers(1, 10**6).map(lambda n: n * 8 * 1024),
)
losses = st.one_of(
    st.none(),
    st.builds(LossRandom, percents, percents),
    st.builds(LossState, percents, percents, percents, percents, percents),
    st.builds(LossGemodel, percents, percents, percents, percents),
    percents.map(lambda p: LossState(p, 100.0 - p)),
    percents.map(lambda p: LossGemodel(p, 100.0 - p)),
)


def maybe(strategy: st.SearchStrategy, default: object) -> st.SearchStrategy:
    """Often the default, so the printer's omissions get exercised too."""
    return st.one_of(st.just(default), strategy)


@st.composite
def specs(draw: st.DrawFn) -> Netem:
    """Any spec the parser can produce: the cross-keyword rules of iproute2 hold."""
    delay, jitter = draw(maybe(times, 0)), draw(maybe(times, 0))
    loss = draw(losses)
    drops = loss is not None and not (isinstance(loss, LossRandom) and loss.percent == 0)
    reorder = draw(maybe(percents, 0.0)) if delay else 0.0
    rate = draw(maybe(rates, 0))
    overheads = (0, 0, 0)
    if rate:
        overheads = draw(
            st.tuples(
                maybe(st.integers(-(2**31), 2**31 - 1), 0),
                maybe(st.integers(0, 2**32 - 1), 0),
                maybe(st.integers(-(2**31), 2**31 - 1), 0),
            )
        )
    return Netem(
        delay_ns=delay,
        jitter_ns=jitter,
        delay_correlation=draw(maybe(percents, 0.0)),
        distribution=draw(st.sampled_from(["normal", "pareto", "paretonormal", "uniform"]))
        if delay and jitter
        else "uniform",
        loss=loss,
        ecn=draw(st.booleans()) if drops else False,
        duplicate=draw(maybe(percents, 0.0)),
        duplicate_correlation=draw(maybe(percents, 0.0)),
        corrupt=draw(maybe(percents, 0.0)),
        corrupt_correlation=draw(maybe(percents, 0.0)),
        reorder=reorder,
        reorder_correlation=draw(maybe(percents, 0.0)),
        gap=draw(maybe(st.integers(1, 2**32 - 1), 1)) if reorder else 0,
        rate_bps=rate,
        packet_overhead=overheads[0],
        cell_size=overheads[1],
        cell_overhead=overheads[2],
        limit=draw(maybe(st.integers(1, 2**32 - 1), DEFAULT_LIMIT)),
        seed=draw(maybe(st.integers(0, 2**64 - 1), None)),
    )


@given(specs())
def test_str_parses_back_to_an_equal_spec(spec: Netem) -> None:
    assert Netem.parse(str(spec)) == spec
    assert Netem.parse(f"netem {spec}") == spec


# An independent writer: other spellings of the same spec, as a person might type them.


def spell_keyword(draw: st.DrawFn, keyword: str) -> str:
    """Any prefix of keyword that iproute2 would resolve back to it."""
    resolve = lambda prefix: next(k for k in ORDER if k.startswith(prefix))
    return draw(st.sampled_from([keyword[:n] for n in range(1, len(keyword) + 1)
                                 if resolve(keyword[:n]) == keyword]))  # fmt: skip


def spell_time(draw: st.DrawFn, ns: int) -> str:
    options = [str(ns), f"{ns}ns", f"{ns}NSecs"]
    for unit, scale in (("us", US), ("msec", MS), ("S", 10**9)):
        options.append(f"{Decimal(ns) / scale}{unit}")  # exact decimals, maybe like '5E-9'
    return draw(st.sampled_from(options))


def spell_rate(draw: st.DrawFn, bits: int) -> str:
    options = [str(bits), f"{bits}bit", f"{bits}BIT"]
    for unit, scale in (("kbit", 10**3), ("Mbit", 10**6), ("gbit", 10**9), ("Tbit", 10**12)):
        options.append(f"{Decimal(bits) / scale}{unit}")
    for unit, scale in (("kibit", 1024), ("bps", 8), ("KBps", 8000), ("mibps", 8 * 1024**2)):
        if bits % scale == 0:
            options.append(f"{bits // scale}{unit}")
    return draw(st.sampled_from(options))


def spell_percent(draw: st.DrawFn, percent: float) -> str:
    return repr(percent) + draw(st.sampled_from(["", "%"]))


@st.composite
def spellings(draw: st.DrawFn) -> tuple[Netem, str]:
    spec = draw(specs())
    pct = lambda p: spell_percent(draw, p)
    clauses: list[list[str]] = []
    if spec.delay_ns or spec.jitter_ns or spec.delay_correlation:
        clause = [spell_keyword(draw, draw(st.sampled_from(["delay", "latency"])))]
        clause.append(spell_time(draw, spec.delay_ns))
        if spec.jitter_ns or spec.delay_correlation or draw(st.booleans()):
            clause.append(spell_time(draw, spec.jitter_ns))
            if spec.delay_correlation or draw(st.booleans()):
                clause.append(pct(spec.delay_correlation))
        clauses.append(clause)
    if spec.distribution != "uniform" or (spec.delay_ns and spec.jitter_ns and draw(st.booleans())):
        clauses.append([spell_keyword(draw, "distribution"), spec.distribution])
    loss_kw = spell_keyword(draw, draw(st.sampled_from(["loss", "drop"])))
    if isinstance(spec.loss, LossRandom):
        clause = [loss_kw, *draw(st.sampled_from([[], ["random"]])), pct(spec.loss.percent)]
        if spec.loss.correlation or draw(st.booleans()):
            clause.append(pct(spec.loss.correlation))
        clauses.append(clause)
    elif isinstance(spec.loss, LossState | LossGemodel):
        name = "state" if isinstance(spec.loss, LossState) else "gemodel"
        values = [float(v) for v in vars(spec.loss).values()]
        given_values = len(str(spec.loss).split()) - 2  # what the canonical form needs
        count = draw(st.integers(given_values, len(values)))
        clauses.append([loss_kw, name, *map(pct, values[:count])])
    if spec.ecn:
        clauses.append([spell_keyword(draw, "ecn")])
    for name in ("duplicate", "corrupt", "reorder"):
        percent, corr = getattr(spec, name), getattr(spec, f"{name}_correlation")
        if percent or corr:
            clause = [spell_keyword(draw, name), pct(percent)]
            if corr or draw(st.booleans()):
                clause.append(pct(corr))
            clauses.append(clause)
    if spec.gap > 1 or (spec.gap == 1 and draw(st.booleans())):
        gap = draw(st.sampled_from([str(spec.gap), hex(spec.gap), "0" + oct(spec.gap)[2:]]))
        clauses.append([spell_keyword(draw, "gap"), gap])
    if spec.rate_bps:
        overheads = [spec.packet_overhead, spec.cell_size, spec.cell_overhead]
        needed = max((i + 1 for i, v in enumerate(overheads) if v), default=0)
        count = draw(st.integers(needed, 3))
        rate = spell_rate(draw, spec.rate_bps)
        clauses.append([spell_keyword(draw, "rate"), rate, *map(str, overheads[:count])])
    if spec.limit != DEFAULT_LIMIT or draw(st.booleans()):
        clauses.append([spell_keyword(draw, "limit"), str(spec.limit)])
    if spec.seed is not None:
        clauses.append([spell_keyword(draw, "seed"), str(spec.seed)])
    clauses = draw(st.permutations(clauses))
    prefix = draw(st.sampled_from(["", "netem "]))
    sep = draw(st.sampled_from([" ", "  ", "\t"]))
    return spec, prefix + sep.join(" ".join(clause) for clause in clauses)


@given(spellings())
def test_any_spelling_parses_to_the_canonical_spec(case: tuple[Netem, str]) -> None:
    spec, text = case
    parsed = Netem.parse(text)
    assert parsed == spec
    assert str(parsed) == str(spec)


VOCABULARY = [
    *ORDER, "d", "l", "r", "du", "di", "s", "random", "state", "gemodel", "normal", "uniform",
    "gamma", "1", "0", "10ms", "5%", "-3", "1mbit", "1mbps", "x", "101", ".5", "0x10", "1e3",
]  # fmt: skip


@given(st.lists(st.sampled_from(VOCABULARY), max_size=8))
def test_errors_always_quote_a_token_of_the_input(tokens: list[str]) -> None:
    try:
        Netem.parse(" ".join(tokens))
    except ValueError as error:
        quoted = re.findall(r"'([^']+)'", str(error))
        assert quoted, str(error)
        assert set(quoted[0].split()) <= set(tokens), str(error)
