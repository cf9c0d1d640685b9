"""The `tc netem` grammar: parse real netem option strings into a validated, immutable spec.

`Netem.parse("delay 2ms 500us distribution normal rate 1gbit loss 1%")` follows iproute2's
rules (tc/q_netem.c and tc/tc_util.c): keywords in any order, keyword abbreviations (any
prefix, resolved in iproute2's order, so "d" is delay and "du" duplicate), `drop` as a
synonym of `loss`, a bare time in nanoseconds, a bare rate in bit/s, case-insensitive units,
`Bps` meaning bytes per second (so "mbps" is megaBYTES per second, as in tc), percentages
with or without `%`. `str(spec)` prints canonical netem syntax that parses back to an equal
spec, so the same string can be handed to the real `tc` where the kernel has netem.

Units inside the spec are exact integers where the kernel keeps integers: times in
nanoseconds, rates in bits per second. Percentages stay percentages (0..100) as written.

The file reads top to bottom: the unit tables, how single values are read and printed, the
spec classes, then the keyword parser that walks the tokens the way netem_parse_opt() does.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

DEFAULT_LIMIT = 1000  # netem's default queue limit, in packets

# Netem's built-in delay distribution is uniform; the others are tables tc loads from files.
DISTRIBUTIONS = ("uniform", "normal", "pareto", "paretonormal")

# iproute2 tries the keywords in this order and takes the first one the token is a prefix
# of, so "l" is limit, "d" delay, "r" reorder, "c" corrupt and "s" seed (not slot).
KEYWORDS = (
    "limit", "latency", "delay", "loss", "drop", "seed", "ecn", "reorder", "corrupt",
    "gap", "duplicate", "distribution", "rate", "slot",
)  # fmt: skip
_SYNONYMS = {"latency": "delay", "drop": "loss"}

# What each keyword takes, quoted in "needs an argument" errors (from q_netem.c's explain()).
_USAGE = {
    "limit": "limit PACKETS",
    "delay": "delay TIME [JITTER [CORRELATION]]",
    "loss": "loss [random] PERCENT [CORRELATION] | loss state P13 [P31 [P32 [P23 [P14]]]]"
    " | loss gemodel PERCENT [R [1-H [1-K]]]",
    "seed": "seed NUMBER",
    "reorder": "reorder PERCENT [CORRELATION] [gap DISTANCE]",
    "corrupt": "corrupt PERCENT [CORRELATION]",
    "gap": "gap DISTANCE",
    "duplicate": "duplicate PERCENT [CORRELATION]",
    "distribution": "distribution {uniform|normal|pareto|paretonormal}",
    "rate": "rate RATE [PACKETOVERHEAD [CELLSIZE [CELLOVERHEAD]]]",
}

# ---------------------------------------------------------------------------------------------
# Units (tc_util.c). Unit names are compared case-insensitively (strcasecmp), so the tables
# are keyed in lower case.

_NS_PER_UNIT = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
# get_time64: "ms", "msec" and "msecs" all mean milliseconds; a bare number is nanoseconds.
_TIME_UNITS = {"": 1} | {
    alias: ns
    for unit, ns in _NS_PER_UNIT.items()
    for alias in (unit, unit[:-1] + "sec", unit[:-1] + "secs")
}

# get_rate64: "...bit" units count bits, "...Bps" units count bytes (x8). Because the match
# ignores case, "mbps" is MBps, megabytes per second, eight times "mbit". A bare number is bit/s.
_RATE_UNITS = {
    "": 1, "bit": 1,
    "kibit": 1024, "kbit": 10**3, "mibit": 1024**2, "mbit": 10**6,
    "gibit": 1024**3, "gbit": 10**9, "tibit": 1024**4, "tbit": 10**12,
    "bps": 8,
    "kibps": 8 * 1024, "kbps": 8 * 10**3, "mibps": 8 * 1024**2, "mbps": 8 * 10**6,
    "gibps": 8 * 1024**3, "gbps": 8 * 10**9, "tibps": 8 * 1024**4, "tbps": 8 * 10**12,
}  # fmt: skip

_MAX_NS = 2**63 - 1  # the kernel keeps delays in a signed 64-bit count of nanoseconds
_MAX_BPS = 8 * (2**64 - 1)  # and rates in an unsigned 64-bit count of bytes per second
_U32, _S32_MIN, _S32_MAX, _U64 = 2**32 - 1, -(2**31), 2**31 - 1, 2**64 - 1

# The decimal part of what C's strtod() reads: "2", "2.5", ".5", "5.", "1e-3" (no hex/inf/nan).
# Written so that no two repeats compete for the same digits ("[0-9]+\.?[0-9]*" would): a
# failing fullmatch then backtracks in linear, not quadratic, time ("loss 111...1x").
_NUMBER = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_NUMBER_RE = re.compile(_NUMBER)
_PERCENT_RE = re.compile(f"({_NUMBER})%?")


def _number_and_unit(token: str) -> tuple[Decimal, str] | None:
    """Split '2.5ms' into (Decimal('2.5'), 'ms') like strtod; Decimal keeps '0.1ms' exact.

    The unit is lower-cased for the table lookups, and only if it is ASCII: str.lower() maps
    the Kelvin sign 'K' to 'k', which C's strcasecmp would never match.
    """
    match = _NUMBER_RE.match(token)
    if match is None:
        return None
    unit = token[match.end() :]
    return _decimal(match.group()), unit.lower() if unit.isascii() else unit


def _decimal(number: str) -> Decimal:
    """Decimal(number), where an exponent beyond Decimal's (10**18) range reads as strtod
    reads it: HUGE_VAL (infinity, so "too large") or 0."""
    try:
        return Decimal(number)
    except InvalidOperation:  # only an exponent can be out of range: _NUMBER checked the rest
        mantissa, exponent = re.split("[eE]", number)
        if Decimal(mantissa) == 0 or exponent.startswith("-"):
            return Decimal(0)
        return Decimal("-Infinity" if mantissa.startswith("-") else "Infinity")


def _starts_with_digit(token: str) -> bool:
    # C's isdigit(): only ASCII digits (str.isdigit would also accept '²').
    return bool(token) and token[0] in "0123456789"


def _parse_time(token: str, keyword: str) -> int:
    """A time in integer nanoseconds: '2ms' -> 2_000_000, '100' -> 100 (bare means ns)."""
    split = _number_and_unit(token)
    scale = _TIME_UNITS.get(split[1]) if split else None
    if split is None or scale is None:
        raise ValueError(f"netem: bad time '{token}' after '{keyword}' (units: s, ms, us, ns)")
    if split[0] < 0:
        raise ValueError(f"netem: negative time '{token}' after '{keyword}'")
    if split[0] > _MAX_NS or split[0] * scale > _MAX_NS:  # 1st test stops "1e999999999s"
        raise ValueError(f"netem: time '{token}' after '{keyword}' is too large")
    return round(split[0] * scale)  # nearest nanosecond; Decimal makes '1.1us' exactly 1100


def _parse_rate(token: str, keyword: str) -> int:
    """A rate in integer bits/s: '100mbit' -> 10**8, '1mbps' -> 8 * 10**6 (bytes!)."""
    if "%" in token:
        # tc turns "50%" into a share of the device's link speed; an emulated link has none.
        raise ValueError(
            f"netem: relative rate '{token}' after '{keyword}' needs a device speed; "
            "give an absolute rate such as 10gbit"
        )
    split = _number_and_unit(token)
    scale = _RATE_UNITS.get(split[1]) if split else None
    if split is None or scale is None:
        raise ValueError(
            f"netem: bad rate '{token}' after '{keyword}' (units: bit, kbit, mbit, gbit, tbit, "
            "kibit...; Bps, KBps, MBps... count BYTES per second)"
        )
    if split[0] > _MAX_BPS or split[0] * scale > _MAX_BPS:  # 1st test stops "1e999999999bit"
        raise ValueError(f"netem: rate '{token}' after '{keyword}' is too large")
    bits = round(split[0] * scale)
    if bits <= 0:
        raise ValueError(f"netem: rate '{token}' after '{keyword}' must be positive")
    return bits


def _parse_percent(token: str, keyword: str) -> float:
    """A percentage, with or without '%': '25' and '25%' are both 25.0; '0.5%' is 0.5."""
    match = _PERCENT_RE.fullmatch(token)
    if match is None:
        raise ValueError(f"netem: bad percentage '{token}' after '{keyword}'")
    value = float(match.group(1))
    if not 0 <= value <= 100:
        raise ValueError(f"netem: percentage '{token}' after '{keyword}' is outside 0..100")
    return 0.0 if value == 0 else value  # "-0" must not print back as "-0%"


def _parse_int(token: str, keyword: str, low: int, high: int, c_base: bool = True) -> int:
    """An integer. With c_base, like C's strtol(s, 0): '0x10' is 16 and '010' is octal 8."""
    pattern = r"[+-]?(?:0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)" if c_base else r"[+-]?[0-9]+"
    if re.fullmatch(pattern, token) is None:
        raise ValueError(f"netem: bad integer '{token}' after '{keyword}'")
    digits = token.lstrip("+-")
    # Python refuses to convert more than 4300 digits (with a message naming no token), and
    # no netem integer needs more than 20: longer ones are out of range, leading 0s aside.
    if len(digits.lstrip("0xX").lstrip("0")) > 40:
        raise ValueError(f"netem: integer '{token}' after '{keyword}' is outside {low}..{high}")
    if not c_base:
        value = int(digits)
    elif digits[:2].lower() == "0x":
        value = int(digits[2:], 16)
    else:
        value = int(digits, 8 if digits.startswith("0") else 10)
    value = -value if token.startswith("-") else value
    if not low <= value <= high:
        raise ValueError(f"netem: integer '{token}' after '{keyword}' is outside {low}..{high}")
    return value


def _format_time(ns: int) -> str:
    """Exact, in the largest unit that divides: 2_000_000 -> '2ms', 1_500_000 -> '1500us'."""
    if ns == 0:
        return "0"
    unit, scale = next((u, s) for u, s in _NS_PER_UNIT.items() if ns % s == 0)
    return f"{ns // scale}{unit}"


def _format_rate(bps: int) -> str:
    """Exact, in the largest decimal bit unit that divides: 10**9 -> '1gbit'."""
    units = (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3), ("bit", 1))
    unit, scale = next((u, s) for u, s in units if bps % s == 0)
    return f"{bps // scale}{unit}"


def _format_percent(percent: float) -> str:
    """Shortest text that reads back as the same float: 1.0 -> '1%', 0.5 -> '0.5%'."""
    text = "0" if percent == 0 else repr(float(percent))
    return text.removesuffix(".0") + "%"


def _check_percent(owner: str, name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {name} must be a number of percent, got {value!r}")
    if not 0 <= value <= 100:  # also rejects NaN
        raise ValueError(f"{owner}: {name}={value!r} is outside 0..100 percent")


def _check_int(owner: str, name: str, value: int, low: int, high: int) -> None:
    """An exact integer in low..high, as the kernel's field holds it (bool is no integer)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: {name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{owner}: {name}={value!r} is outside {low}..{high}")


def _trim(values: list[float], defaults: list[float]) -> list[float]:
    """Drop trailing values equal to their defaults: positional arguments end where they may."""
    while len(values) > 1 and values[-1] == defaults[len(values) - 1]:
        values = values[:-1]
    return values


# ---------------------------------------------------------------------------------------------
# The spec: loss models, then the whole qdisc.


@dataclass(frozen=True)
class LossRandom:
    """`loss random P [CORR]`: each packet is lost with probability P% (netem's default)."""

    percent: float
    correlation: float = 0.0

    def __post_init__(self) -> None:
        _check_percent("LossRandom", "percent", self.percent)
        _check_percent("LossRandom", "correlation", self.correlation)

    def __str__(self) -> str:
        corr = f" {_format_percent(self.correlation)}" if self.correlation else ""
        return f"loss {_format_percent(self.percent)}{corr}"


@dataclass(frozen=True)
class LossState:
    """`loss state P13 [P31 [P32 [P23 [P14]]]]`: the 4-state Markov model (GI model).

    States: 1 good reception, 2 good reception in a burst, 3 burst loss, 4 isolated loss.
    Defaults follow iproute2: p31 = 100 - p13, p32 = 0, p23 = 100, p14 = 0.
    """

    p13: float
    p31: float
    p32: float = 0.0
    p23: float = 100.0
    p14: float = 0.0

    def __post_init__(self) -> None:
        for name in ("p13", "p31", "p32", "p23", "p14"):
            _check_percent("LossState", name, getattr(self, name))

    def __str__(self) -> str:
        values = [self.p13, self.p31, self.p32, self.p23, self.p14]
        defaults = [self.p13, 100.0 - self.p13, 0.0, 100.0, 0.0]
        return " ".join(["loss state", *map(_format_percent, _trim(values, defaults))])


@dataclass(frozen=True)
class LossGemodel:
    """`loss gemodel P [R [1-H [1-K]]]`: the Gilbert-Elliott model.

    p: good->bad transition, r: bad->good transition, one_minus_h: loss probability in the
    bad state, one_minus_k: loss probability in the good state (all percent). Defaults follow
    iproute2: r = 100 - p, 1-h = 100, 1-k = 0.
    """

    p: float
    r: float
    one_minus_h: float = 100.0
    one_minus_k: float = 0.0

    def __post_init__(self) -> None:
        for name in ("p", "r", "one_minus_h", "one_minus_k"):
            _check_percent("LossGemodel", name, getattr(self, name))

    def __str__(self) -> str:
        values = [self.p, self.r, self.one_minus_h, self.one_minus_k]
        defaults = [self.p, 100.0 - self.p, 100.0, 0.0]
        return " ".join(["loss gemodel", *map(_format_percent, _trim(values, defaults))])


Loss = LossRandom | LossState | LossGemodel

# Netem's integer fields and the ranges the kernel keeps them in (what the parser accepts).
_INT_FIELDS = (
    ("delay_ns", 0, _MAX_NS), ("jitter_ns", 0, _MAX_NS), ("gap", 0, _U32),
    ("rate_bps", 0, _MAX_BPS), ("packet_overhead", _S32_MIN, _S32_MAX), ("cell_size", 0, _U32),
    ("cell_overhead", _S32_MIN, _S32_MAX), ("limit", 1, _U32),
)  # fmt: skip


def _drops_packets(loss: Loss | None) -> bool:
    """True for a loss model netem counts as present (tc: opt.loss > 0 or a state model)."""
    return loss is not None and not (isinstance(loss, LossRandom) and loss.percent == 0)


@dataclass(frozen=True)
class Netem:
    """One netem qdisc configuration. Build it with `Netem.parse(text)`."""

    delay_ns: int = 0
    jitter_ns: int = 0
    delay_correlation: float = 0.0  # percent
    # uniform (netem's default when none is named) | normal | pareto | paretonormal
    distribution: str = "uniform"
    loss: Loss | None = None
    ecn: bool = False
    duplicate: float = 0.0  # percent
    duplicate_correlation: float = 0.0
    corrupt: float = 0.0  # percent
    corrupt_correlation: float = 0.0
    reorder: float = 0.0  # percent
    reorder_correlation: float = 0.0
    gap: int = 0  # 0 = no reordering; iproute2 sets 1 when reorder is given without gap
    rate_bps: int = 0  # bits per second; 0 = unlimited
    packet_overhead: int = 0  # bytes, may be negative
    cell_size: int = 0
    cell_overhead: int = 0
    limit: int = DEFAULT_LIMIT  # packets
    seed: int | None = None

    def __post_init__(self) -> None:
        # Type and range checks only (the ranges the parser and the kernel allow), so that
        # hand-built specs cannot hold values netem could never run; the rules that tie
        # keywords together (reorder needs delay...) live in the parser.
        for name, low, high in _INT_FIELDS:
            _check_int("Netem", name, getattr(self, name), low, high)
            object.__setattr__(self, name, int(getattr(self, name)))  # numpy ints -> int
        for name in ("delay_correlation", "duplicate", "duplicate_correlation", "corrupt",
                     "corrupt_correlation", "reorder", "reorder_correlation"):  # fmt: skip
            _check_percent("Netem", name, getattr(self, name))
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"Netem: unknown distribution {self.distribution!r}")
        if self.loss is not None and not isinstance(self.loss, Loss):
            raise TypeError(f"Netem: loss must be LossRandom, LossState, LossGemodel or None, "
                            f"got {self.loss!r}")
        if not isinstance(self.ecn, bool):
            raise TypeError(f"Netem: ecn must be True or False, got {self.ecn!r}")
        if self.seed is not None:
            _check_int("Netem", "seed", self.seed, 0, _U64)

    @classmethod
    def parse(cls, text: str) -> Netem:
        """Parse netem options as `tc qdisc add dev X root netem ...` takes them.

        Grammar (keywords in any order, each abbreviable to any prefix, first match in
        iproute2's order: limit latency delay loss drop seed ecn reorder corrupt gap
        duplicate distribution rate slot)::

            delay|latency TIME [JITTER [CORRELATION]]
            distribution {uniform|normal|pareto|paretonormal}
            loss|drop [random] PERCENT [CORRELATION]
            loss state P13 [P31 [P32 [P23 [P14]]]]
            loss gemodel PERCENT [R [1-H [1-K]]]
            ecn
            duplicate PERCENT [CORRELATION]
            corrupt PERCENT [CORRELATION]
            reorder PERCENT [CORRELATION] [gap DISTANCE]
            rate RATE [PACKETOVERHEAD [CELLSIZE [CELLOVERHEAD]]]
            limit PACKETS
            seed NUMBER

        An optional number is taken only when the next token starts with a digit (a '-'
        also counts for the two overheads), as iproute2's NEXT_IS_NUMBER does, so
        "delay 10ms .5ms" fails on '.5ms'. A repeated keyword overwrites what it sets.

        Gotchas kept from tc:
        - a bare TIME is nanoseconds ("delay 100" is 100ns, as in tc since its 2024 move to
          64-bit delays; older tc read it as microseconds), a bare RATE is bit/s;
        - units ignore case, so "mbps" is MBps, megaBYTES per second (8x "mbit");
        - PERCENT may omit the '%': "loss 1" is 1%, not 100%;
        - keywords do not ignore case: "Delay" is unknown;
        - `reorder` needs a nonzero delay and sets gap 1 unless gap is given; `gap` alone
          is an error; `distribution` needs a nonzero jitter; `ecn` needs a loss model.

        Deliberately not like tc: `slot` and percent rates ("rate 50%", a share of a real
        device's speed) are refused; times round to the nearest ns (tc truncates); `rate`
        must be positive; `limit` is a plain packet count >= 1 (tc also takes 0 and byte
        suffixes); only the four distribution names exist (tc loads any NAME.dist file and
        has none for uniform, the built-in default). Every error is a ValueError that
        quotes the offending token. Empty text means no impairment: `Netem()`.
        """
        if not isinstance(text, str):
            raise TypeError(f"Netem.parse: text must be a str, not {type(text).__name__}")
        tokens = text.split()
        if tokens[:1] == ["netem"]:  # as copied from "tc qdisc add ... netem delay 1ms"
            tokens = tokens[1:]
        return _Parser(tokens).parse()

    def __str__(self) -> str:
        """Canonical netem syntax without defaults; parses back to an equal spec."""
        parts: list[str] = []
        if self.delay_ns or self.jitter_ns or self.delay_correlation:
            parts += ["delay", _format_time(self.delay_ns)]
            if self.jitter_ns or self.delay_correlation:  # correlation sits after a jitter
                parts.append(_format_time(self.jitter_ns))
                if self.delay_correlation:
                    parts.append(_format_percent(self.delay_correlation))
        if self.distribution != "uniform":
            parts += ["distribution", self.distribution]
        if self.loss is not None:
            parts.append(str(self.loss))
        if self.ecn:
            parts.append("ecn")
        for name in ("duplicate", "corrupt", "reorder"):
            percent, corr = getattr(self, name), getattr(self, f"{name}_correlation")
            if percent or corr:
                parts += [name, _format_percent(percent)]
                parts += [_format_percent(corr)] if corr else []
        if self.gap > 1:  # gap 1 is what reorder implies
            parts += ["gap", str(self.gap)]
        if self.rate_bps:
            parts += ["rate", _format_rate(self.rate_bps)]
            overheads = [self.packet_overhead, self.cell_size, self.cell_overhead]
            while overheads and overheads[-1] == 0:
                overheads.pop()
            parts += map(str, overheads)
        if self.limit != DEFAULT_LIMIT:
            parts += ["limit", str(self.limit)]
        if self.seed is not None:
            parts += ["seed", str(self.seed)]
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"Netem({str(self)!r})"

    @property
    def is_noop(self) -> bool:
        """True when this spec changes nothing: no delay, loss, rate or other impairment."""
        return self == Netem(limit=self.limit, seed=self.seed)

    @property
    def delay_s(self) -> float:
        return self.delay_ns / 1e9

    @property
    def jitter_s(self) -> float:
        return self.jitter_ns / 1e9

    @property
    def rate_Bps(self) -> float:
        """Rate in bytes per second; 0.0 when the rate is unlimited."""
        return self.rate_bps / 8

    def scaled(self, k: float) -> Netem:
        """The same link under time dilation by k: delays and jitter x k, rate / k.

        Everything else (probabilities, overheads, limit) is per packet and stays. A
        nonzero delay, jitter or rate stays nonzero, so the result is still a spec the
        parser accepts (reorder needs a delay, a distribution needs jitter).
        """
        if isinstance(k, bool) or not isinstance(k, numbers.Real):
            raise TypeError(f"Netem.scaled: time dilation k must be a number, got {k!r}")
        if not (k > 0 and math.isfinite(k)):
            raise ValueError(
                f"Netem.scaled: time dilation k={k!r} must be a positive finite number"
            )

        exact = Fraction(float(k))  # k = 1e300 would overflow a float product; a Fraction cannot
        if max(self.delay_ns, self.jitter_ns) * exact > _MAX_NS or self.rate_bps / exact > _MAX_BPS:
            raise ValueError(f"Netem.scaled: time dilation k={k!r} takes '{self}' beyond netem's "
                             "64-bit delays and rates")

        def stretch(ns: int) -> int:
            return max(1, round(ns * exact)) if ns else 0

        rate = max(1, round(self.rate_bps / exact)) if self.rate_bps else 0
        return replace(
            self, delay_ns=stretch(self.delay_ns), jitter_ns=stretch(self.jitter_ns), rate_bps=rate
        )


def as_netem(x: str | Netem | None) -> Netem | None:
    """Accept a spec, its netem text, or None (no netem at all) wherever a link is configured."""
    if x is None or isinstance(x, Netem):
        return x
    if isinstance(x, str):
        return Netem.parse(x)
    raise TypeError(f"expected a netem string, a Netem or None, not {type(x).__name__}")


def netem_string(
    latency_us: float = 0,
    jitter_us: float = 0,
    distribution: str = "uniform",
    rate_gbit: float = 0,
    loss_pct: float = 0,
) -> str:
    """Real `tc netem` syntax for the explorers' slider values; zero parts are left out.

    netem_string(20, 5, "normal", 100) == "delay 20us 5us distribution normal rate 100gbit".
    Uniform is netem's built-in jitter law, so it is not named (the real tc has no "uniform"
    table to load). Whole milliseconds print as ms, rates below 1 Gbit/s as mbit.
    """
    parts = []
    if latency_us or jitter_us:
        delay = f"delay {_slider_time(latency_us)}"
        if jitter_us:
            delay += f" {_slider_time(jitter_us)}"
            if distribution != "uniform":
                delay += f" distribution {distribution}"
        parts.append(delay)
    if rate_gbit:
        mbit = rate_gbit * 1000
        rate = f"{mbit:g}mbit" if rate_gbit < 1 and mbit == round(mbit) else f"{rate_gbit:g}gbit"
        parts.append(f"rate {rate}")
    if loss_pct:
        parts.append(f"loss {loss_pct:g}%")
    return " ".join(parts)


def _slider_time(us: float) -> str:
    return f"{us / 1000:g}ms" if us >= 1000 and us % 1000 == 0 else f"{us:g}us"


def match_keyword(token: str) -> str | None:
    """iproute2's matches(): the first keyword in KEYWORDS that `token` is a prefix of."""
    return next((kw for kw in KEYWORDS if token and kw.startswith(token)), None)


# ---------------------------------------------------------------------------------------------
# The parser: netem_parse_opt() from q_netem.c, one method per keyword.


class _Parser:
    """Walks the tokens like netem_parse_opt() walks argv, filling Netem's fields."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.word = ""  # the keyword being parsed, as written (maybe abbreviated)
        self.keyword = ""  # ... and in full
        self.fields: dict[str, Any] = {}  # keyword arguments for Netem(...)
        self.seen: dict[str, str] = {}  # keyword -> how it was written, for error messages

    # argv helpers, named after iproute2's macros

    def next_arg(self) -> str:
        """NEXT_ARG(): the argument the current keyword requires."""
        if self.pos == len(self.tokens):
            raise ValueError(f"netem: '{self.word}' needs an argument: {_USAGE[self.keyword]}")
        self.pos += 1
        return self.tokens[self.pos - 1]

    def next_is_number(self, signed: bool = False) -> bool:
        """NEXT_IS_NUMBER(): is there a next token, and does it start with a digit?"""
        if self.pos == len(self.tokens):
            return False
        token = self.tokens[self.pos]
        return _starts_with_digit(token) or (signed and token.startswith("-"))

    def optional_percents(self, most: int) -> list[float]:
        """Up to `most` further percentages, taken while the next token is a number."""
        values: list[float] = []
        while len(values) < most and self.next_is_number():
            values.append(_parse_percent(self.next_arg(), self.word))
        return values

    # the walk

    def parse(self) -> Netem:
        while self.pos < len(self.tokens):
            self.word = self.next_arg()
            keyword = match_keyword(self.word)
            if keyword is None:
                raise ValueError(
                    f"netem: unknown keyword '{self.word}' (expected one of: "
                    f"{', '.join(k for k in KEYWORDS if k != 'slot')})"
                )
            self.keyword = _SYNONYMS.get(keyword, keyword)
            self.seen[self.keyword] = self.word
            getattr(self, f"kw_{self.keyword}")()
        return self.finish()

    def finish(self) -> Netem:
        """The checks q_netem.c makes once all keywords are read."""
        spec = Netem(**self.fields)
        if spec.reorder > 0:
            if spec.delay_ns == 0:
                raise ValueError(
                    f"netem: '{self.seen['reorder']}' needs some delay to reorder against "
                    "(reordering not possible without specifying some delay)"
                )
            if spec.gap == 0:
                spec = replace(spec, gap=1)
        elif spec.gap > 0:
            raise ValueError(
                f"netem: '{self.seen['gap']}' given without a reorder probability "
                "(gap specified without reorder probability)"
            )
        if spec.ecn and not _drops_packets(spec.loss):
            raise ValueError(
                f"netem: '{self.seen['ecn']}' marks packets instead of dropping them, so it "
                "needs a loss model (ecn requested without loss model)"
            )
        if "distribution" in self.seen and not (spec.delay_ns and spec.jitter_ns):
            raise ValueError(
                f"netem: '{self.seen['distribution']} {spec.distribution}' needs a delay with "
                "a nonzero jitter, e.g. 'delay 10ms 2ms' "
                "(distribution specified but no latency and jitter values)"
            )
        return spec

    # one method per keyword

    def kw_limit(self) -> None:
        self.fields["limit"] = _parse_int(self.next_arg(), self.word, 1, _U32, c_base=False)

    def kw_delay(self) -> None:
        self.fields["delay_ns"] = _parse_time(self.next_arg(), self.word)
        if self.next_is_number():
            self.fields["jitter_ns"] = _parse_time(self.next_arg(), self.word)
            if self.next_is_number():
                self.fields["delay_correlation"] = _parse_percent(self.next_arg(), self.word)

    def kw_loss(self) -> None:
        previous = self.fields.get("loss")
        if _drops_packets(previous):
            raise ValueError(f"netem: second loss model at '{self.word}' (duplicate loss argument)")
        arg = self.next_arg()
        if arg == "state":
            p13 = _parse_percent(self.next_arg(), self.word)
            defaults = [100.0 - p13, 0.0, 100.0, 0.0]
            given = self.optional_percents(4)
            self.fields["loss"] = LossState(p13, *given, *defaults[len(given) :])
        elif arg == "gemodel":
            p = _parse_percent(self.next_arg(), self.word)
            defaults = [100.0 - p, 100.0, 0.0]
            given = self.optional_percents(3)
            self.fields["loss"] = LossGemodel(p, *given, *defaults[len(given) :])
        elif arg == "random" or _starts_with_digit(arg):  # "loss 1%" is the old random syntax
            percent = _parse_percent(self.next_arg() if arg == "random" else arg, self.word)
            # tc keeps a correlation from an earlier "loss 0 CORR" unless a new one is given
            corr = previous.correlation if isinstance(previous, LossRandom) else 0.0
            if self.next_is_number():
                corr = _parse_percent(self.next_arg(), self.word)
            self.fields["loss"] = LossRandom(percent, corr)
        else:
            raise ValueError(
                f"netem: unknown loss model '{arg}' after '{self.word}' "
                "(expected a percentage starting with a digit, random, state or gemodel)"
            )

    def kw_seed(self) -> None:
        self.fields["seed"] = _parse_int(self.next_arg(), self.word, 0, _U64, c_base=False)

    def kw_ecn(self) -> None:
        self.fields["ecn"] = True

    def probability(self, name: str) -> None:
        """PERCENT [CORRELATION], shared by reorder, corrupt and duplicate."""
        self.fields[name] = _parse_percent(self.next_arg(), self.word)
        if self.next_is_number():
            self.fields[f"{name}_correlation"] = _parse_percent(self.next_arg(), self.word)

    def kw_reorder(self) -> None:
        self.probability("reorder")

    def kw_corrupt(self) -> None:
        self.probability("corrupt")

    def kw_duplicate(self) -> None:
        self.probability("duplicate")

    def kw_gap(self) -> None:
        self.fields["gap"] = _parse_int(self.next_arg(), self.word, 0, _U32)

    def kw_distribution(self) -> None:
        name = self.next_arg()
        if name not in DISTRIBUTIONS:
            raise ValueError(
                f"netem: unknown distribution '{name}' after '{self.word}' "
                f"(expected one of: {', '.join(DISTRIBUTIONS)})"
            )
        self.fields["distribution"] = name

    def kw_rate(self) -> None:
        self.fields["rate_bps"] = _parse_rate(self.next_arg(), self.word)
        # Three independent checks, as in tc: "rate 1mbit 20 -4" skips the cell size (a
        # '-' is no unsigned number) and reads -4 as the cell overhead.
        if self.next_is_number(signed=True):
            self.fields["packet_overhead"] = self._int(_S32_MIN, _S32_MAX)
        if self.next_is_number():
            self.fields["cell_size"] = self._int(0, _U32)
        if self.next_is_number(signed=True):
            self.fields["cell_overhead"] = self._int(_S32_MIN, _S32_MAX)

    def _int(self, low: int, high: int) -> int:
        return _parse_int(self.next_arg(), self.word, low, high)

    def kw_slot(self) -> None:
        raise ValueError(
            f"netem: '{self.word}' (slotted delivery) is not supported by this emulator"
        )
