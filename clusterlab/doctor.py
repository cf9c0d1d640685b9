"""`clusterlab doctor`: is this machine ready, and how precise can the emulation be here?

It reports versions, cores and memory, the process start method, the timer's overshoot
(how late a sleep wakes up), the native one-way latency of a Gloo message between two ranks,
the smallest delay emulated faithfully (measured through the "netem" backend and judged
exactly as the fidelity bench's delay rows are: `one_way_delays`, `median_delay_met`), the
late tail this machine adds to it, and whether kernel shaping is available (network
namespaces, the netem and tbf qdiscs), checked in a throwaway namespace that is always
removed.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

import numpy as np

from . import clock
from .cores import usable_cores

# A delay is emulated faithfully when the median one-way delay that ranks measure is within
# this fraction of the configured one (`median_delay_met`: the doctor's floor and the fidelity
# bench's delay rows are judged by it).
MEDIAN_DELAY_TOLERANCE = 0.02
FLOOR_CANDIDATES_US = (50, 100, 200, 500, 1000, 2000, 5000, 10000)
# Messages per rank when a constant delay is measured (the floor and the bench's delay rows).
DELAY_PROBE_SAMPLES = 300


def timer_overshoot_us(samples: int = 200, sleep_us: float = 1000) -> dict:
    """How late `sleep_until` wakes up (µs), as p50 / p99 / max."""
    clock.lower_timer_slack()
    late = []
    for _ in range(samples):
        target = clock.monotonic_ns() + int(sleep_us * 1000)
        clock.sleep_until(target)
        late.append((clock.monotonic_ns() - target) / 1000)
    a = np.array(late)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max()), "samples": samples}


# `one_way_delays` starts sending this long after the ranks agreed on a start time: longer
# than a collective's completion skew between ranks on the networks measured here (the
# slowest rank leaves the agreeing all-reduce at most a few jitter draws after the first).
START_MARGIN_S = 0.5
# Receives kept posted ahead of the one being waited for: Gloo sends a message only once its
# receive is posted, which must never be what holds a message back.
RECEIVE_WINDOW = 4


def one_way_delays(n: int, spacing_s: float) -> list[int]:
    """Rank body: one-way delays (ns) of `n` stamped 8-byte messages from rank-1 to this rank.

    Every rank sends message i to rank+1 at start + i * spacing_s, with one start for all
    ranks, then waits for message i from rank-1 (with the next receives already posted). The
    common start is what makes the measurement faithful: with a start of its own (e.g. when
    it left a barrier, which on a jittery network ranks leave milliseconds apart), a rank
    that starts later than its predecessor by more than a message's delay asks for that
    message only after it was delivered, and measures its own lateness instead. That made
    the 4-rank pareto row's median 1 ms too long (KS 0.13-0.2); in the link model alone,
    3 ms of skew per rank gives KS 0.3 and a common start 0.01. A rank whose receive takes
    longer than the spacing sends its next message late, but stamped when it is sent, and it
    then cannot queue behind the previous one (TCP's in-order rule), so no delay is biased.
    Single-threaded on purpose: a receiver thread would fight the sender for the GIL and, on
    a busy machine, measured medians at 1 ms were up to 2x too long. The fidelity bench and
    `faithful_floor` both measure with this.
    """
    from collections import deque

    import torch
    import torch.distributed as dist

    if n < 1 or spacing_s <= 0:
        raise ValueError(f"one_way_delays needs n >= 1 and spacing_s > 0, got {n}, {spacing_s}")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise ValueError(f"one_way_delays needs >= 2 ranks, got {world}")
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    # A first exchange sets up both peers' routes and Gloo pairs outside the measurement.
    buf = torch.zeros(1, dtype=torch.int64)
    work = dist.isend(torch.zeros(1, dtype=torch.int64), nxt)
    dist.recv(buf, prv)
    work.wait()
    start = torch.tensor([clock.monotonic_ns()], dtype=torch.int64)
    dist.all_reduce(start, op=dist.ReduceOp.MAX)
    start_ns = int(start[0]) + int(START_MARGIN_S * 1e9)

    out: list[int] = []
    posted: deque = deque()
    for i in range(n):
        while len(posted) < RECEIVE_WINDOW and i + len(posted) < n:
            stamp = torch.zeros(1, dtype=torch.int64)
            posted.append((stamp, dist.irecv(stamp, prv)))
        sent = torch.empty(1, dtype=torch.int64)
        stamp_view = sent.numpy()
        clock.sleep_until(start_ns + int(i * spacing_s * 1e9))
        # Stamped through numpy right before the call, whose time the link model uses: torch's
        # __setitem__ took ~60 us on a core that had just woken up from a 15 ms sleep, which
        # the measurement counted as network delay (5 ms rows: 72 -> 14 us late at median).
        stamp_view[0] = clock.monotonic_ns()
        work = dist.isend(sent, nxt)
        stamp, received = posted.popleft()
        received.wait()
        out.append(clock.monotonic_ns() - int(stamp[0]))
        work.wait()
    return out


def probe_spacing_s(delay_s: float) -> float:
    """Spacing of `one_way_delays` messages for a constant `delay_s`: a little more than the
    delay (few messages in flight), at least 1 ms (the CPU cost of a message stays small)."""
    return max(1.2 * delay_s, 1e-3)


def median_delay_error(samples_ns, delay_ns: float) -> float:
    """Median measured one-way delay minus the configured one, as a fraction of it."""
    if delay_ns <= 0:
        raise ValueError(f"delay_ns must be > 0, got {delay_ns!r}")
    return float(np.median(np.asarray(samples_ns, dtype=float)) - delay_ns) / delay_ns


def median_delay_met(samples_ns, delay_ns: float) -> bool:
    """Is the median one-way delay within MEDIAN_DELAY_TOLERANCE of the configured one?"""
    return abs(median_delay_error(samples_ns, delay_ns)) <= MEDIAN_DELAY_TOLERANCE


def measure_constant_delay(delay_us: float, *, world: int = 2,
                           samples: int = DELAY_PROBE_SAMPLES) -> np.ndarray:
    """One-way delays (ns) that `world` ranks measure with `one_way_delays` through the netem
    backend on `nic="delay <delay_us>us"`: the doctor's floor and the bench's delay rows."""
    from .cluster import Cluster

    with Cluster(nodes=world, nic=f"delay {delay_us:g}us", timeout=120) as cl:
        per_rank = cl.run(one_way_delays, samples, probe_spacing_s(delay_us * 1e-6))
    return np.concatenate(per_rank).astype(np.int64)


def native_latency_us(iterations: int = 200) -> dict:
    """Native Gloo one-way latency between two plain ranks on loopback (µs), measured as the
    emulated delays are (`one_way_delays`, 1 ms apart)."""
    from .cluster import Cluster

    with Cluster(nodes=2, nic=None, timeout=60) as cl:
        samples = np.concatenate(cl.run(one_way_delays, iterations, 1e-3)) / 1e3
    return {"p50": float(np.percentile(samples, 50)), "p99": float(np.percentile(samples, 99)),
            "samples": iterations}


def faithful_floor(*, samples: int = DELAY_PROBE_SAMPLES, candidates=FLOOR_CANDIDATES_US,
                   measure: Callable[..., np.ndarray] | None = None) -> dict:
    """The smallest configured delay that this machine emulates faithfully, right now.

    For each candidate d (ascending) two ranks measure `samples` one-way delays each through
    the "netem" backend with `nic="delay <d>us"` (`measure_constant_delay`, as the fidelity
    bench measures its delay rows); the first that `median_delay_met` is the floor. Below it
    the machine's own latency and wake-ups show through: dilate (`dilation_needed`). Also
    returns what the machine adds at that delay (p99 of measured - configured: with a busy
    machine it is milliseconds, whatever the delay) and every candidate tried. `measure`
    (delay_us, samples=...) -> delays in ns replaces the measurement (tests).
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples!r}")
    if not candidates or any(d <= 0 for d in candidates) or list(candidates) != sorted(candidates):
        raise ValueError(f"candidates must be ascending delays > 0 (us), got {candidates!r}")
    measure = measure or measure_constant_delay
    tried = []
    for delay_us in candidates:
        d = np.asarray(measure(delay_us, samples=samples), dtype=float)
        late_us = (d - delay_us * 1e3) / 1e3
        row = {"delay_us": float(delay_us), "median_error_us": float(np.median(late_us)),
               "p99_error_us": float(np.percentile(late_us, 99)), "samples": len(d)}
        tried.append(row)
        if median_delay_met(d, delay_us * 1e3):
            return {"smallest_faithful_delay_us": float(delay_us),
                    "added_p99_us": row["p99_error_us"], "samples": samples, "tried": tried}
    return {"smallest_faithful_delay_us": None, "added_p99_us": tried[-1]["p99_error_us"],
            "samples": samples, "tried": tried}


# What `dilation_with_margin` asks of a dilated delay: at least this many times the faithful
# floor (the floor passes on its median only, exactly at the tolerance's edge), and at least
# the late tail this machine adds (its p99: a step that waits for the slowest of many
# messages meets that tail, so it must not exceed the delay it would be read against).
FLOOR_MARGIN = 2.0


def dilation_needed(delay_us: float, *, floor_us: float | None, margin: float = 1.0,
                    tail_us: float | None = None) -> int:
    """The smallest whole dilation k >= 1 at which `delay_us` x k reaches `margin` x the
    faithful floor and, given `tail_us` (the late tail the machine adds, e.g. the doctor's
    `added_p99_us`), is at least that tail too.

    With the defaults (margin 1, no tail) k only brings the delay up to the floor, where the
    median is faithful by definition but the machine's late tail can still exceed the delay;
    an experiment whose conclusions rest on tails asks for a margin and the tail."""
    if delay_us <= 0:
        raise ValueError(f"delay_us must be > 0, got {delay_us!r}")
    if margin < 1:
        raise ValueError(f"margin must be >= 1, got {margin!r}")
    if floor_us is None:
        raise ValueError("no delay was emulated faithfully on this machine: it is too busy")
    if tail_us is not None and tail_us < 0:
        raise ValueError(f"tail_us must be >= 0, got {tail_us!r}")
    need = max(margin * floor_us, tail_us or 0.0)
    return max(1, int(np.ceil(need / delay_us - 1e-9)))


def dilation_with_margin(delay_us: float, info: dict, *, margin: float = FLOOR_MARGIN,
                         limit: int = 32) -> dict:
    """The dilation an experiment with delays of `delay_us` should run at on this machine,
    from a `collect()` record: `dilation_needed` with `margin` x the faithful floor and the
    late tail the machine adds (`added_p99_us`). A machine on which no candidate delay was
    faithful is treated as if its floor were the largest candidate. The result is capped at
    `limit` (a busier machine would make the run too slow; the cap is reported).

    Returns {"k", "reason": "floor" | "tail" | "none", "capped", "floor_us", "tail_us",
    "samples"} where reason says which requirement set k ("none": k = 1 met both)."""
    floor_us = info["smallest_faithful_delay_us"]
    floor_us = FLOOR_CANDIDATES_US[-1] if floor_us is None else floor_us
    tail_us = float(info["added_p99_us"])
    by_floor = dilation_needed(delay_us, floor_us=floor_us, margin=margin)
    by_tail = dilation_needed(delay_us, floor_us=floor_us, margin=1.0, tail_us=tail_us)
    k = max(by_floor, by_tail)
    reason = "none" if k == 1 else ("tail" if by_tail > by_floor else "floor")
    samples = info.get("faithful_floor", {}).get("samples")
    return {"k": min(k, limit), "reason": reason, "capped": k > limit, "floor_us": floor_us,
            "tail_us": tail_us, "samples": samples}


def kernel_shaping() -> dict:
    """Can this machine shape traffic in the kernel? Tries it in a throwaway namespace."""
    out = {"root": os.geteuid() == 0 if hasattr(os, "geteuid") else False,
           "ip": shutil.which("ip") is not None, "tc": shutil.which("tc") is not None,
           "netns": False, "netem": False, "tbf": False, "detail": ""}
    if not (out["root"] and out["ip"] and out["tc"]):
        out["detail"] = "needs root and the iproute2 tools (ip, tc)"
        return out
    name = f"clusterlab-doctor-{uuid.uuid4().hex[:8]}"

    def sh(*cmd):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10)

    try:
        if sh("ip", "netns", "add", name).returncode != 0:
            out["detail"] = "cannot create a network namespace"
            return out
        out["netns"] = True
        sh("ip", "-n", name, "link", "set", "lo", "up")
        netem = sh("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root",
                   "netem", "delay", "1ms")
        out["netem"] = netem.returncode == 0
        sh("ip", "netns", "exec", name, "tc", "qdisc", "del", "dev", "lo", "root")
        tbf = sh("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "tbf",
                 "rate", "100mbit", "burst", "32kbit", "latency", "10ms")
        out["tbf"] = tbf.returncode == 0
        if not out["netem"]:
            out["detail"] = "no netem qdisc in this kernel: " + netem.stderr.strip()[:120]
    except (OSError, subprocess.SubprocessError) as exc:
        out["detail"] = str(exc)
    finally:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            sh("ip", "netns", "del", name)
    return out


def collect(with_latency: bool = True) -> dict:
    """Everything the doctor knows, as a dict (also the machine record of benchmarks)."""
    import torch

    import clusterlab

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "clusterlab": clusterlab.__version__,
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        # what this kernel may run on (taskset, a cpuset, a CPU quota): threads are sized by it
        "usable_cores": usable_cores(),
        "memory_gb": _memory_gb(),
        "start_method": "fork" if sys.platform.startswith("linux") else "spawn",
        "gloo": torch.distributed.is_gloo_available(),
        "timer_overshoot_us": timer_overshoot_us(),
    }
    if with_latency:
        info["native_one_way_us"] = native_latency_us()
        floor = faithful_floor()
        info["smallest_faithful_delay_us"] = floor["smallest_faithful_delay_us"]
        info["added_p99_us"] = floor["added_p99_us"]
        info["faithful_floor"] = floor
    info["kernel_shaping"] = kernel_shaping()
    return info


def machine() -> dict:
    """A short description of this machine for benchmark records."""
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__,
            "cores": os.cpu_count(), "usable_cores": usable_cores(), "memory_gb": _memory_gb(),
            "platform": platform.platform(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": _commit()}


def _commit() -> str | None:
    """The checkout's commit, so a result says which code it measured (None outside git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, cwd=os.path.dirname(__file__))
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _memory_gb() -> float | None:
    try:
        import psutil

        return round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        return None


def report(info: dict) -> str:
    """Human-readable doctor report."""
    t = info["timer_overshoot_us"]
    lines = [
        f"clusterlab {info['clusterlab']}  python {info['python']}  torch {info['torch']}  "
        f"numpy {info['numpy']}",
        f"machine: {info['cores']} cores ({info['usable_cores']} usable here), "
        f"{info['memory_gb']} GB, {info['platform']}",
        f"start method: {info['start_method']}   Gloo available: {info['gloo']}",
        f"timer overshoot: p50 {t['p50']:.0f} us, p99 {t['p99']:.0f} us"
        + (f" over {t['samples']} sleeps" if "samples" in t else ""),
    ]
    if "native_one_way_us" in info:
        lat = info["native_one_way_us"]
        count = f" over 2 x {lat['samples']} messages" if "samples" in lat else ""
        lines.append(f"native Gloo one-way latency: p50 {lat['p50']:.0f} us, "
                     f"p99 {lat['p99']:.0f} us{count}")
        floor, pct = info["smallest_faithful_delay_us"], round(MEDIAN_DELAY_TOLERANCE * 100)
        samples = info["faithful_floor"]["samples"]
        if floor is None:
            lines.append(f"no delay up to {FLOOR_CANDIDATES_US[-1]} us had its median within "
                         f"{pct}% (the machine is busy): emulate with dilation")
        else:
            lines.append(f"smallest delay emulated faithfully here: {floor:.0f} us (median within "
                         f"{pct}% over 2 x {samples} messages; use dilation for less)")
        lines.append(f"late tail this machine adds: p99 {info['added_p99_us']:.0f} us over "
                     f"2 x {samples} messages (load and wake-ups, not the network)")
    k = info["kernel_shaping"]
    shaping = ", ".join(f"{key} {'yes' if k[key] else 'no'}" for key in ("root", "netns", "netem",
                                                                         "tbf"))
    lines.append(f"kernel shaping: {shaping}" + (f" ({k['detail']})" if k["detail"] else ""))
    lines.append("user-space emulator (needs no kernel netem): available")
    return "\n".join(lines)
