"""`clusterlab doctor`: is this machine ready, and how precise can the emulation be here?

It reports versions, cores and memory, the process start method, the timer's overshoot
(how late a sleep wakes up), the native one-way latency of a Gloo message between two ranks,
the smallest delay emulated faithfully (measured through the "netem" backend and judged as
the fidelity bench judges a median delay), the late tail this machine adds to it, and
whether kernel shaping is available (network namespaces, the netem and tbf qdiscs), checked
in a throwaway namespace that is always removed.
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

import numpy as np

from . import clock

# A delay is emulated faithfully when the median one-way delay that ranks measure is within
# this fraction of the configured one (the fidelity bench's target for its delay rows).
MEDIAN_DELAY_TOLERANCE = 0.02
FLOOR_CANDIDATES_US = (50, 100, 200, 500, 1000, 2000, 5000, 10000)


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


def _one_way(iterations: int = 200) -> list[float]:
    """Rank body: one-way latencies (µs) of 4-byte messages, measured on the shared clock."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    stamp = torch.zeros(1, dtype=torch.int64)
    out = []
    for _ in range(iterations):
        if rank == 0:
            stamp[0] = time.monotonic_ns()
            dist.send(stamp, 1)
            dist.recv(stamp, 1)
        else:
            dist.recv(stamp, 0)
            out.append((time.monotonic_ns() - int(stamp[0])) / 1000)
            dist.send(stamp, 0)
    return out


def native_latency_us(iterations: int = 200) -> dict:
    """Native Gloo one-way latency between two plain ranks on loopback (µs)."""
    from .cluster import Cluster

    with Cluster(nodes=2, nic=None, timeout=60) as cl:
        samples = np.array(cl.run(_one_way, iterations)[1])
    return {"p50": float(np.percentile(samples, 50)), "p99": float(np.percentile(samples, 99)),
            "samples": iterations}


def faithful_floor(*, samples: int = 80, candidates=FLOOR_CANDIDATES_US) -> dict:
    """The smallest configured delay that this machine emulates faithfully, right now.

    For each candidate (ascending) two ranks ping-pong `samples` times through the "netem"
    backend with `nic="delay <d>us"`; the first whose median one-way delay is within
    MEDIAN_DELAY_TOLERANCE of d is the floor. Below it the machine's own latency and
    wake-ups show through: dilate (`dilation_needed`). Also returns what the machine adds at
    that delay (p99 of measured - configured, from `samples` pings: with a busy machine it is
    milliseconds, whatever the delay) and every candidate tried.
    """
    from .cluster import Cluster

    tried = []
    for delay_us in candidates:
        with Cluster(nodes=2, nic=f"delay {delay_us}us", timeout=60) as cl:
            late = np.array(cl.run(_one_way, samples)[1]) - delay_us
        row = {"delay_us": float(delay_us), "median_error_us": float(np.median(late)),
               "p99_error_us": float(np.percentile(late, 99)), "samples": samples}
        tried.append(row)
        if abs(row["median_error_us"]) <= MEDIAN_DELAY_TOLERANCE * delay_us:
            return {"smallest_faithful_delay_us": float(delay_us),
                    "added_p99_us": row["p99_error_us"], "samples": samples, "tried": tried}
    return {"smallest_faithful_delay_us": None, "added_p99_us": tried[-1]["p99_error_us"],
            "samples": samples, "tried": tried}


def dilation_needed(delay_us: float, *, floor_us: float | None) -> int:
    """The smallest whole dilation k >= 1 at which `delay_us` x k reaches the faithful floor."""
    if delay_us <= 0:
        raise ValueError(f"delay_us must be > 0, got {delay_us!r}")
    if floor_us is None:
        raise ValueError("no delay was emulated faithfully on this machine: it is too busy")
    return max(1, int(np.ceil(floor_us / delay_us - 1e-9)))


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
            "cores": os.cpu_count(), "memory_gb": _memory_gb(), "platform": platform.platform()}


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
        f"machine: {info['cores']} cores, {info['memory_gb']} GB, {info['platform']}",
        f"start method: {info['start_method']}   Gloo available: {info['gloo']}",
        f"timer overshoot: p50 {t['p50']:.0f} us, p99 {t['p99']:.0f} us",
    ]
    if "native_one_way_us" in info:
        lat = info["native_one_way_us"]
        lines.append(f"native Gloo one-way latency: p50 {lat['p50']:.0f} us, "
                     f"p99 {lat['p99']:.0f} us")
        floor, pct = info["smallest_faithful_delay_us"], round(MEDIAN_DELAY_TOLERANCE * 100)
        samples = info["faithful_floor"]["samples"]
        if floor is None:
            lines.append(f"no delay up to {FLOOR_CANDIDATES_US[-1]} us had its median within "
                         f"{pct}% (the machine is busy): emulate with dilation")
        else:
            lines.append(f"smallest delay emulated faithfully here: {floor:.0f} us (median within "
                         f"{pct}% over {samples} pings; use dilation for less)")
        lines.append(f"late tail this machine adds: p99 {info['added_p99_us']:.0f} us over "
                     f"{samples} pings (load and wake-ups, not the network)")
    k = info["kernel_shaping"]
    shaping = ", ".join(f"{key} {'yes' if k[key] else 'no'}" for key in ("root", "netns", "netem",
                                                                         "tbf"))
    lines.append(f"kernel shaping: {shaping}" + (f" ({k['detail']})" if k["detail"] else ""))
    lines.append("userspace emulation (backend 'netem'): available")
    return "\n".join(lines)
