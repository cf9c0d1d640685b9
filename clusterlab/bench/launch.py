"""Launch bench: how long a cluster takes to start, and what one `run()` costs once it is up."""

from __future__ import annotations

import time

import numpy as np

from ..cluster import Cluster
from . import bench, check, result, tick


def _noop():
    return None


@bench("launch")
def launch(quick: bool = False) -> dict:
    rows = []
    repeats = 2 if quick else 3
    for world in (2, 4, 8):
        for attempt in range(repeats):
            cl = Cluster(nodes=world, nic="delay 1ms", timeout=60)
            t0 = time.perf_counter()
            cl.start()
            started = time.perf_counter() - t0
            cl.run(_noop)  # warm: the first run imports and pickles
            runs = []
            for _ in range(5 if quick else 20):
                t1 = time.perf_counter()
                cl.run(_noop)
                runs.append(time.perf_counter() - t1)
            t2 = time.perf_counter()
            cl.close()
            closed = time.perf_counter() - t2
            tick()
            rows.append({"ranks": world, "attempt": attempt, "start_s": started,
                         "run_overhead_s": float(np.median(runs)), "close_s": closed})
    checks = []
    for world in (2, 4, 8):
        starts = [r["start_s"] for r in rows if r["ranks"] == world]
        med = float(np.median(starts))
        checks.append(check(f"start {world} ranks (median)", "<= 1.0 s" if world == 8 else "report",
                            round(med, 3), med <= 1.0 or world != 8))
    run_over = float(np.median([r["run_overhead_s"] for r in rows if r["ranks"] == 4]))
    checks.append(check("run() overhead on an open 4-rank cluster", "<= 0.100 s",
                        round(run_over, 4), run_over <= 0.1))
    return result("launch", rows, checks)
