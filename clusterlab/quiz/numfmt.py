"""Numbers in two languages: format them for display, read them back from a learner.

Russian writes a decimal comma (2,5 мс), English a decimal point (2.5 ms); both are accepted
on input whatever the interface language. A learner may type a bare number, which is taken
in the unit the question states, or a number with a unit of the same kind (``0.8 ms`` for a
question asked in µs), which is converted.
"""

from __future__ import annotations

import math
import re

# unit spelling -> (dimension, factor to the dimension's base unit)
_TIME = {
    "s": 1.0, "sec": 1.0, "с": 1.0, "сек": 1.0,
    "ms": 1e-3, "мс": 1e-3,
    "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "мкс": 1e-6,
    "ns": 1e-9, "нс": 1e-9,
    "min": 60.0, "мин": 60.0,
}  # fmt: skip
_RATE = {  # base: bytes per second
    "B/s": 1.0, "Б/с": 1.0,
    "MB/s": 1e6, "МБ/с": 1e6,
    "GB/s": 1e9, "ГБ/с": 1e9,
    "TB/s": 1e12, "ТБ/с": 1e12,
    "Mbit/s": 1e6 / 8, "Мбит/с": 1e6 / 8, "Mbps": 1e6 / 8, "Mb/s": 1e6 / 8,
    "Gbit/s": 1e9 / 8, "Гбит/с": 1e9 / 8, "Gbps": 1e9 / 8, "Gb/s": 1e9 / 8, "Гб/с": 1e9 / 8,
}  # fmt: skip
_RATIO = {"": 1.0, "x": 1.0, "×": 1.0, "times": 1.0, "раз": 1.0, "раза": 1.0, "%": 0.01}
UNITS: dict[str, tuple[str, float]] = {}
for _dim, _table in (("time", _TIME), ("rate", _RATE), ("ratio", _RATIO)):
    for _name, _factor in _table.items():
        UNITS[_name] = (_dim, _factor)

_NUMBER = re.compile(r"^([+-]?(?:\d+(?:[.,]\d*)?|[.,]\d+)(?:[eE][+-]?\d+)?)\s*(.*?)\s*$")
_SPACES_IN_NUMBER = re.compile(r"(?<=\d)[ \u00a0\u202f\u2009](?=\d{3}(?!\d))")
# "1,000": a thousands separator (English) or a decimal comma (Russian 1,000 = 1.0)? Refused
# in an English session, so a learner's thousand is never graded as 1.0; in Russian it is the
# decimal comma `fmt` itself prints ("1,593"). "0,125" is a decimal comma in either language.
_AMBIGUOUS_COMMA = re.compile(r"^[+-]?[1-9]\d{0,2},\d{3}$")


class AnswerFormatError(ValueError):
    """The learner's text is not a number (with an optional known unit)."""

    def __init__(self, reason: str, text: str):
        super().__init__(f"{reason}: {text!r}")
        self.reason = reason  # "empty", "not_a_number", "ambiguous" or "unit"
        self.text = text

    @property
    def message_key(self) -> str:
        """The i18n key of the notice that tells the learner what to type instead."""
        return {"unit": "bad_unit", "ambiguous": "ambiguous_comma"}.get(self.reason,
                                                                          "not_a_number")


def unit_info(unit: str) -> tuple[str, float] | None:
    """(dimension, factor) of a unit spelling, or None if we do not know it."""
    return UNITS.get(unit.strip())


def parse_answer(text: str, unit: str = "", alt_units: tuple[str, ...] = (), *,
                 lang: str | None = None) -> float:
    """The number in `text`, expressed in `unit` (the unit the question states).

    `alt_units` are other spellings of the same unit (the question's unit in the other
    language). Raises AnswerFormatError if `text` is empty, not a number, or carries a unit
    that is not of the same kind as `unit`; with `lang="en"` also for a lone comma before
    three digits ("1,000": a thousand or 1.0?).
    """
    raw = text
    s = text.strip().replace("\u2212", "-").replace("\u2013", "-")
    if not s:
        raise AnswerFormatError("empty", raw)
    s = _SPACES_IN_NUMBER.sub("", s)
    m = _NUMBER.match(s)
    if not m:
        raise AnswerFormatError("not_a_number", raw)
    number, suffix = m.group(1), m.group(2)
    if lang == "en" and _AMBIGUOUS_COMMA.match(number):
        raise AnswerFormatError("ambiguous", raw)
    if "," in number:
        # one comma and no point: a decimal comma (Russian); otherwise grouping commas
        number = (
            number.replace(",", ".")
            if "." not in number and number.count(",") == 1
            else (number.replace(",", ""))
        )
    try:
        value = float(number)
    except ValueError:
        raise AnswerFormatError("not_a_number", raw) from None
    if not math.isfinite(value):
        raise AnswerFormatError("not_a_number", raw)
    if not suffix:
        return value
    spellings = {u.strip().lower() for u in (unit, *alt_units)}
    if suffix.lower() in spellings:
        return value
    given, wanted = unit_info(suffix), unit_info(unit)
    if given is None or wanted is None or given[0] != wanted[0]:
        raise AnswerFormatError("unit", raw)
    return value * given[1] / wanted[1]


def fmt(x: object, lang: str = "en", spec: str | None = None) -> str:
    """`x` for display: `spec` if given (a format spec such as ".2f"), else 4 significant
    digits without an exponent for ordinary magnitudes; a decimal comma in Russian."""
    if isinstance(x, str):
        return x
    if isinstance(x, bool) or not isinstance(x, int | float):
        return str(x)
    if spec:
        out = format(x, spec)
    elif isinstance(x, int) or (math.isfinite(x) and x.is_integer() and abs(x) < 1e15):
        out = str(int(x))
    elif not math.isfinite(x):
        out = str(x)
    else:
        magnitude = math.floor(math.log10(abs(x)))
        if magnitude >= 4:
            out = f"{x:.0f}"
        elif magnitude >= -4:
            decimals = max(0, 3 - magnitude)
            out = f"{x:.{decimals}f}"
            if "." in out:
                out = out.rstrip("0").rstrip(".")
        else:
            out = f"{x:.3e}"
    if lang == "ru":
        out = out.replace(".", ",")
    return out


def within(value: float, expected: float, tolerance: float) -> bool:
    """True if `value` is within the relative `tolerance` of `expected`."""
    if expected == 0:
        return abs(value) <= tolerance
    return abs(value - expected) <= tolerance * abs(expected)
