"""Overhead bench: the "netem" backend with no impairment vs plain Gloo, in the same run.

Both clusters run the same all_reduce sweep, interleaved round by round so that the noise of
this shared machine hits both alike; the figure is the ratio of medians per size.
"""

from __future__ import annotations

import time

import numpy as np

from ..cluster import Cluster
from . import bench, check, result

SIZES = [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]


def _sweep(sizes, iterations):
    import torch
    import torch.distributed as dist

    out = {}
    for nbytes in sizes:
        x = torch.ones(nbytes // 4)
        dist.all_reduce(x)  # warm-up
        dist.barrier()
        times = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - t0)
        out[nbytes] = times
    return out


@bench("overhead")
def overhead(quick: bool = False) -> dict:
    rounds = 2 if quick else 3
    iterations = 5 if quick else 20
    samples: dict[str, dict[int, list]] = {"gloo": {}, "netem": {}, "netem-1us": {}}
    rows = []
    # "netem-1us" impairs every link by 1 µs: negligible time, but the whole machinery runs
    # (entry-time exchange, schedule replay, hold), so its ratio is the machinery's cost.
    clusters = {"gloo": Cluster(nodes=4, nic=None, timeout=120),
                "netem": Cluster(nodes=4, nic="", timeout=120),
                "netem-1us": Cluster(nodes=4, nic="delay 1us", timeout=120)}
    try:
        for r in range(rounds):
            for name, cl in clusters.items():
                with cl:
                    per_rank = cl.run(_sweep, SIZES, iterations)
                for nbytes in SIZES:
                    # A collective ends when its slowest rank is done.
                    times = np.max([per_rank[k][nbytes] for k in range(4)], axis=0)
                    samples[name].setdefault(nbytes, []).extend(times.tolist())
                    rows.append({"backend": name, "round": r, "bytes": nbytes,
                                 "times_s": times.tolist()})
    finally:
        for cl in clusters.values():
            cl.close()
    checks = []
    for nbytes in SIZES:
        ratio = float(np.median(samples["netem"][nbytes]) / np.median(samples["gloo"][nbytes]))
        big = nbytes >= 1 << 20
        checks.append(check(f"all_reduce {nbytes // 1024} KiB, 4 ranks: netem / gloo",
                            "<= 1.5" if big else "report", round(ratio, 3),
                            ratio <= 1.5 or not big))
    for nbytes in SIZES:
        ratio = float(np.median(samples["netem-1us"][nbytes]) / np.median(samples["gloo"][nbytes]))
        checks.append(check(f"all_reduce {nbytes // 1024} KiB, 4 ranks: netem 'delay 1us' / gloo",
                            "report", round(ratio, 3), True))
    return result("overhead", rows, checks)
