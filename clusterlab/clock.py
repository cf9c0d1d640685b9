"""Time: one clock for every rank, precise sleeps, and time dilation.

All processes on one host share CLOCK_MONOTONIC, so a sender can stamp a message with the
absolute time at which the receiver may see it. `sleep_until` holds a thread until such a
time; with the thread's timer slack lowered to 1 µs its overshoot is a few microseconds on
an idle Linux machine instead of the default 50 µs (`clusterlab doctor` measures it).

Time dilation: a cluster can run k times slower than the network it stands for (delays x k,
rates / k). Wall-clock durations measured on such a cluster are divided by k to report them
in emulated-cluster time: use `now()` / `elapsed()` in experiments for that.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

_PR_SET_TIMERSLACK = 29
_slack_set = threading.local()


def monotonic_ns() -> int:
    """The shared wall clock (CLOCK_MONOTONIC), in nanoseconds."""
    return time.monotonic_ns()


def dilation() -> float:
    """The time-dilation factor k of this process's cluster (1.0 when not dilated)."""
    return float(os.environ.get("CLUSTERLAB_DILATION", "1") or 1)


def now() -> float:
    """Emulated-cluster time in seconds: the monotonic clock divided by the dilation factor."""
    return time.monotonic_ns() / 1e9 / dilation()


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
    """Block the calling thread until CLOCK_MONOTONIC reaches `deadline_ns`.

    Sleeps until `spin_ns` before the deadline, then spins until it. Sleeping alone
    wakes up late by the timer's overshoot (`clusterlab doctor` measures it); spinning for
    longer than that would steal the CPU that the other ranks need (up to 8 ranks share 2
    cores here), so the spin is short and only used where precision is the point.
    """
    lower_timer_slack()
    while True:
        remaining = deadline_ns - time.monotonic_ns()
        if remaining <= spin_ns:
            break
        time.sleep((remaining - spin_ns) / 1e9)
    while time.monotonic_ns() < deadline_ns:
        pass  # a pure spin: yielding here (sleep(0)) costs a scheduler round trip, ~15-60 us
