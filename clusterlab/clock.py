"""Time: one clock for every rank, precise sleeps, and time dilation.

The common clock. A sender stamps a message with the absolute time at which the receiver
may see it, so every rank must read one clock. Processes on one host share CLOCK_MONOTONIC
and read it as it is. A process on another host reads its own CLOCK_MONOTONIC plus a
correction, its estimated offset to rank 0's clock (`clusterlab.clocksync` estimates it when
the process group is created and re-estimates it over a long job, for drift):

    common = raw + offset + rate * (raw - anchor)

`monotonic_ns()` is that read; every stamp, deadline and sleep of the engine goes through it.

`sleep_until` holds a thread until such a time; with the thread's timer slack lowered to
1 µs its overshoot is a few microseconds on an idle Linux machine instead of the default
50 µs (`clusterlab doctor` measures it).

Time dilation: a cluster can run k times slower than the network it stands for (delays x k,
rates / k). Wall-clock durations measured on such a cluster are divided by k to report them
in emulated-cluster time: use `now()` / `elapsed()` in experiments for that.

Testing without a second host: `CLUSTERLAB_TEST_CLOCK_SKEW_S` (test only) shifts this
process's raw clock by a known number of seconds, as another host's clock would be, so
that the offset estimate and the emulated delays can be checked against a known answer.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from dataclasses import dataclass

_PR_SET_TIMERSLACK = 29
_slack_set = threading.local()

SKEW_VARIABLE = "CLUSTERLAB_TEST_CLOCK_SKEW_S"
DRIFT_VARIABLE = "CLUSTERLAB_TEST_CLOCK_DRIFT_PPM"


@dataclass(frozen=True)
class Correction:
    """common = raw + offset_ns + rate * (raw - anchor_ns), all in nanoseconds."""

    offset_ns: int
    anchor_ns: int = 0
    rate: float = 0.0
    uncertainty_ns: int = 0  # half the round trip of the exchange that measured it

    def at(self, raw_ns: int) -> int:
        """The correction (ns) to add to raw clock reading `raw_ns`."""
        return self.offset_ns + int(self.rate * (raw_ns - self.anchor_ns))


# The test skew of this process's raw clock: (offset ns, drift rate, since raw ns).
_skew: tuple[int, float, int] | None = None
_correction: Correction | None = None


def raw_ns() -> int:
    """This process's own CLOCK_MONOTONIC in ns (shifted by the test skew, if one is set)."""
    t = time.monotonic_ns()
    if _skew is None:
        return t
    offset, drift, since = _skew
    return t + offset + int(drift * (t - since))


def monotonic_ns() -> int:
    """The common clock in nanoseconds: raw CLOCK_MONOTONIC, corrected to rank 0's."""
    if _skew is None and _correction is None:
        return time.monotonic_ns()
    raw = raw_ns()
    return raw if _correction is None else raw + _correction.at(raw)


def correction() -> Correction | None:
    """The correction this process applies (None: it reads rank 0's clock itself)."""
    return _correction


def set_correction(value: Correction | None) -> None:
    """Apply `value` to every later `monotonic_ns()` (None: read the raw clock)."""
    global _correction
    _correction = value


def skew_from_env(rank: int, env=None) -> tuple[float, float]:
    """(skew seconds, drift ppm) that the test variables ask of `rank`.

    CLUSTERLAB_TEST_CLOCK_SKEW_S is seconds for every process that has it ("0.25"), or per
    rank ("1=0.25,3=-0.1"); CLUSTERLAB_TEST_CLOCK_DRIFT_PPM the same, in parts per million.
    """
    env = os.environ if env is None else env
    return (_per_rank(env, SKEW_VARIABLE, rank), _per_rank(env, DRIFT_VARIABLE, rank))


def _per_rank(env, name: str, rank: int) -> float:
    text = (env.get(name) or "").strip()
    if not text:
        return 0.0
    try:
        if "=" not in text:
            return float(text)
        table = {}
        for item in text.split(","):
            key, _, value = item.partition("=")
            table[int(key)] = float(value)
        return table.get(rank, 0.0)
    except ValueError:
        raise ValueError(f"{name} must be seconds or 'rank=value,...', got {text!r}") from None


def apply_test_skew(seconds: float, drift_ppm: float = 0.0) -> None:
    """Shift this process's raw clock by `seconds` (and let it run `drift_ppm` fast): a
    stand-in for another host's clock in tests. Applied once per process; it stays."""
    global _skew
    if _skew is not None or (seconds == 0 and drift_ppm == 0):
        return
    _skew = (int(seconds * 1e9), drift_ppm * 1e-6, time.monotonic_ns())


def test_skew() -> tuple[int, float] | None:
    """The test skew asked of this process: (offset ns, drift rate), or None."""
    return None if _skew is None else _skew[:2]


def test_skew_ns() -> int:
    """The test skew of this process's raw clock right now (ns; 0 without one)."""
    if _skew is None:
        return 0
    return raw_ns() - time.monotonic_ns()


def dilation() -> float:
    """The time-dilation factor k of this process's cluster (1.0 when not dilated)."""
    return float(os.environ.get("CLUSTERLAB_DILATION", "1") or 1)


def now() -> float:
    """Emulated-cluster time in seconds: the common clock divided by the dilation factor."""
    return monotonic_ns() / 1e9 / dilation()


def elapsed(start: float) -> float:
    """Emulated seconds since `start` (a value returned by `now()`)."""
    return now() - start


def lower_timer_slack() -> None:
    """Ask Linux for 1 µs timer slack on the calling thread (no-op elsewhere, or if refused)."""
    if getattr(_slack_set, "done", False):
        return
    _slack_set.done = True
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(1000), 0, 0, 0)
        except (OSError, AttributeError):
            pass


def sleep_until(deadline_ns: int, spin_ns: int = 0) -> None:
    """Block the calling thread until the common clock reaches `deadline_ns`.

    Sleeps until `spin_ns` before the deadline, then spins until it. Sleeping alone
    wakes up late by the timer's overshoot (`clusterlab doctor` measures it); spinning for
    longer than that would steal the CPU that the other ranks need (up to 8 ranks share 2
    cores here), so the spin is short and only used where precision is the point.
    """
    lower_timer_slack()
    while True:
        remaining = deadline_ns - monotonic_ns()
        if remaining <= spin_ns:
            break
        time.sleep((remaining - spin_ns) / 1e9)
    while monotonic_ns() < deadline_ns:
        pass  # a pure spin: yielding here (sleep(0)) costs a scheduler round trip, ~15-60 us
