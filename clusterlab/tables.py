"""netem's delay distribution tables, generated here exactly as iproute2 generates them.

`tc qdisc ... netem delay 10ms 2ms distribution normal` does not compute a normal random
number in the kernel (no floating point there). iproute2 ships a table of 4096 signed 16-bit
samples of the distribution's inverse CDF, scaled so that one standard deviation is
NETEM_DIST_SCALE = 8192. The kernel picks an entry with a uniform random index and scales it
by the jitter (see `clusterlab.link.tabledist`).

The tables are produced at iproute2's build time by three small C programs in iproute2's
netem/ directory (normal.c, pareto.c, paretonormal.c, inherited from NIST Net). We reproduce
those programs line by line, including their quirks, so that our emulator samples exactly
the same values a real netem would:

* normal.c walks x from -10 to 10.05 in steps of 0.00005 *by repeated addition*, so x carries
  the accumulated rounding error of 400,000 float additions. `numpy.add.accumulate` adds
  strictly left to right, which reproduces that float sequence bit for bit.
* The inverse CDF is tabulated at 16384 points and then every 4th point is kept.
* The lowest normal entry is about -4.01 sigma, which does not fit in int16 after scaling, so it
  is clipped to -32768: the table's left tail is slightly cut.
* paretonormal.c combines the two with C integer division, which truncates toward zero.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

DIST_SCALE = 8192  # NETEM_DIST_SCALE: a table value of 8192 means "one jitter" (sigma)
TABLE_SIZE = 4096  # entries in every iproute2 table

_FINE_SIZE = 16384  # TABLESIZE in the C programs: resolution of the tabulated inverse CDF
_PARETO_A = 3.0  # shape parameter used by pareto.c and paretonormal.c
_SHRT_MIN, _SHRT_MAX = -32768, 32767

NAMES = ("normal", "pareto", "paretonormal")


@lru_cache(maxsize=1)
def _normal_inverse_cdf() -> np.ndarray:
    """The C programs' `table[16385]` of doubles: x such that Phi(x) ~= i / 16384.

    C: for (x = -10.0; x < 10.05; x += .00005) { i = rint(16384 * Phi(x)); table[i] = x; }
    """
    steps = 401_100  # a little more than 20.05 / 0.00005; trimmed by the loop condition below
    increments = np.full(steps, 0.00005)
    increments[0] = -10.0
    x = np.add.accumulate(increments)  # sequential float additions, like the C loop
    x = x[x < 10.05]
    # math.erf is the C library's erf; numpy has no erf and scipy is optional in this package.
    cdf = np.fromiter((0.5 + 0.5 * math.erf(v / math.sqrt(2.0)) for v in x), float, len(x))
    index = np.rint(_FINE_SIZE * cdf).astype(np.int64)
    table = np.full(_FINE_SIZE + 1, np.nan)
    # Later x overwrite earlier ones for the same index, as in C. Since x increases, the
    # winner for each index is its largest x: find the last occurrence of every index.
    last = np.flatnonzero(np.append(index[1:] != index[:-1], True))
    table[index[last]] = x[last]
    return table


def _pareto_value(i: np.ndarray) -> np.ndarray:
    """paretonormal.c's paretovalue(i), vectorised: the Pareto inverse CDF at 1 - 4i/65536."""
    d = (65536 - 4 * i) / 65536.0
    d = 1.0 / np.power(d, 1.0 / _PARETO_A)
    d = (d - 1.5) * ((4.0 / 3.0) * DIST_SCALE)
    d = np.minimum(d, 32767.0)
    return np.rint(d).astype(np.int64)


def _build(name: str) -> np.ndarray:
    if name == "pareto":
        # pareto.c: for (i = 65536; i > 0; i -= 16) -- 4096 values, increasing.
        i = np.arange(65536, 0, -16)
        d = 1.0 / np.power(i / 65536.0, 1.0 / _PARETO_A)
        d = (d - 1.5) * ((4.0 / 3.0) * DIST_SCALE)
        values = np.rint(np.minimum(d, 32767.0)).astype(np.int64)
        return values.astype(np.int16)

    fine = _normal_inverse_cdf()
    i = np.arange(0, _FINE_SIZE, 4)
    if np.isnan(fine[i]).any():  # C would read uninitialised memory here; we never should
        raise AssertionError("normal table has holes")
    normal = np.rint(fine[i] * DIST_SCALE).astype(np.int64)
    if name == "normal":
        return np.clip(normal, _SHRT_MIN, _SHRT_MAX).astype(np.int16)

    # paretonormal.c: value = (normvalue + 3 * parvalue) / 4 in C int arithmetic.
    # Note: normvalue is NOT clipped first; only the final value is.
    total = normal + 3 * _pareto_value(i)
    value = np.sign(total) * (np.abs(total) // 4)  # C division truncates toward zero
    return np.clip(value, _SHRT_MIN, _SHRT_MAX).astype(np.int16)


@lru_cache(maxsize=8)
def table(name: str) -> np.ndarray:
    """The 4096-entry netem table for `name` ("normal", "pareto" or "paretonormal").

    The array is int16, sorted ascending (each is an inverse CDF) and read-only: it is
    cached and shared by every link.
    """
    if name not in NAMES:
        raise ValueError(f"unknown distribution table {name!r}; expected one of {NAMES}")
    values = _build(name)
    assert values.shape == (TABLE_SIZE,)
    values.flags.writeable = False
    return values
