"""How many CPU cores this process may really use.

`os.cpu_count()` counts the machine's cores. A learner's kernel often gets fewer: `taskset`
or a container's cpuset narrows the affinity mask, and Binder's and Kubernetes' CPU limits are
a CFS quota (a share of each period, e.g. one core's worth of time on a 64-core host). Threads
per rank and "is this machine busy?" must be sized by what this process can get, or a pinned
or limited kernel plans for cores it will never run on.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def _cgroup_quota(root: Path = _CGROUP_ROOT, self_cgroup: Path = Path("/proc/self/cgroup")
                  ) -> float | None:
    """The CPU quota of this process's cgroup, in cores (e.g. 1.5), or None when there is
    none or it cannot be read. cgroup v2 keeps it in `cpu.max` ("max 100000" = no limit,
    "150000 100000" = 1.5 cores); v1 in `cpu.cfs_quota_us` (-1 = no limit) over
    `cpu.cfs_period_us`. The process's own cgroup is looked up first, then the mount's root
    (inside a container the root is the container's cgroup)."""
    v2, v1 = [], []
    try:
        for line in self_cgroup.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            rel = path.lstrip("/")
            if controllers == "":
                v2.append(root / rel)
            elif "cpu" in controllers.split(","):
                v1.append(root / controllers / rel)
    except (OSError, ValueError):
        pass
    v2.append(root)
    v1 += [root / "cpu,cpuacct", root / "cpu"]
    for directory in v2:
        try:
            quota, period = (directory / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        if quota == "max":
            return None
        try:
            return int(quota) / int(period) if int(period) > 0 and int(quota) > 0 else None
        except ValueError:
            return None
    for directory in v1:
        try:
            quota = int((directory / "cpu.cfs_quota_us").read_text())
            period = int((directory / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return quota / period if quota > 0 and period > 0 else None
    return None


def usable_cores() -> int:
    """The cores this process can run on at once: the affinity mask's size, capped by a cgroup
    CPU quota rounded up (a 1.5-core quota runs two threads, each part of the time); at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)
