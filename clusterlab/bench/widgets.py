"""Widgets bench: how fast the explorers answer a move, and how close "run for real" lands.

1. The throughput-collapse explorer's update (closed-form curve over 1..1024 nodes, the
   simulator at N when it fits the budget, and the redraw) after a slider move, at several
   N, each move a new setup so that nothing comes from a cache. Goal: 200 ms. When the
   simulator at N runs in the background, the time until its result is drawn is reported.
2. The link explorer and the ring stepper: one update each (reported).
3. "Run for real" at 2 and 8 ranks: the median measured step time against the simulator's
   prediction of the same run, calibrated with the plain-Gloo floor measured just before
   on the same ranks (reported: the course shows both with error bars).
"""

from __future__ import annotations

import time

import numpy as np

from . import bench, check, result, tick

NODE_COUNTS = (1, 16, 256, 1024)
UPDATE_GOAL_S = 0.2


def _moves(ex, n: int, repeats: int) -> tuple[list[float], float | None]:
    """Update times after `repeats` moves at N=n, and the background simulation's wait."""
    ex.set(nodes=n)
    times = []
    for i in range(repeats):
        # Latency and jitter alternate through new pairs: every move is an unseen setup.
        ex.set(latency_us=(20, 50)[i % 2], jitter_us=(0, 5, 10, 20)[(i + n) % 4])
        ex.debouncer.cancel()  # the bench calls update() itself, as the debouncer would
        ex.update()
        times.append(ex.last_update_s)
    t0 = time.perf_counter()
    if ex.sim_state != "pending":
        return times, None
    ex.wait_for_simulation(120)
    return times, time.perf_counter() - t0


@bench("widgets")
def widgets_bench(quick: bool = False) -> dict:
    from ..widgets import LinkExplorer, RingStepper, ThroughputExplorer

    rows: list[dict] = []
    checks: list[dict] = []
    repeats = 3 if quick else 7
    ex = ThroughputExplorer(nodes=1)
    ex.debouncer.cancel()
    ex.update()  # warm-up: numba's cache, matplotlib's fonts
    worst = 0.0
    for n in NODE_COUNTS:
        times, background = _moves(ex, n, repeats)
        median = float(np.median(times))
        worst = max(worst, median)
        tick()
        rows.append({"kind": "throughput_update", "nodes": n, "update_s": times,
                     "background_sim_s": background})
        checks.append(check(f"throughput explorer: update after a move at N={n} (median)",
                            "report", round(median, 3), True))
        if background is not None:
            checks.append(check(f"throughput explorer: background simulation at N={n} drawn "
                                "after", "report", round(background, 3), True))
    checks.append(check("throughput explorer: update after a move, worst N (median)",
                        f"<= {UPDATE_GOAL_S} s", round(worst, 3), worst <= UPDATE_GOAL_S))
    ex.close()

    for name, make, move in (
        ("link explorer", LinkExplorer, lambda w, i: setattr(w.text, "value", (
            "delay 2ms 500us distribution normal", "delay 5ms 1ms distribution pareto")[i % 2])),
        ("ring stepper", lambda: RingStepper(p=8),
         lambda w, i: setattr(w.step_slider, "value", i % 8)),
    ):
        w = make()
        w.debouncer.cancel()
        w.update()
        times = []
        for i in range(repeats):
            move(w, i)
            w.debouncer.cancel()
            w.update()
            times.append(w.last_update_s)
        w.close()
        tick()
        rows.append({"kind": "update", "widget": name, "update_s": times})
        checks.append(check(f"{name}: update after a move (median)", "report",
                            round(float(np.median(times)), 3), True))

    for latency_us, jitter_us in ((20, 5), (2000, 500)):  # the default; a slow network
        for nodes in (2, 8):
            ex = ThroughputExplorer(nodes=nodes, latency_us=latency_us, jitter_us=jitter_us,
                                    model_mib=10, compute_ms=20, real_steps=5 if quick else 15)
            ex.debouncer.cancel()
            ex.on_run_clicked()
            finished = ex.runner.join(300)
            m = ex.measured
            ex.close()
            if not finished or m is None:
                raise RuntimeError(f"the real run on {nodes} nodes did not finish: "
                                   f"{ex.status.value}")
            measured = float(np.median(m.step_times))
            predicted = m.predicted.percentile(50)
            tick()
            rows.append({"kind": "real_run", "nodes": nodes, "nic": m.plan.setup.nic,
                         "step_times_s": m.step_times.tolist(), "predicted_step_s": predicted,
                         "native_s": {str(k): v for k, v in (m.native_s or {}).items()}})
            checks.append(check(f"run for real, {nodes} nodes, {m.plan.setup.nic}: measured / "
                                "simulated median step", "report",
                                round(measured / predicted, 3), True))
    return result("widgets", rows, checks)
