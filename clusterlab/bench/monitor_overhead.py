"""Monitor bench: what `clusterlab.monitor.SyncMonitor` costs a DDP training loop.

Two identical DDP copies of a small MLP train side by side on 4 ranks ("delay 500us"): one
plain, one under a SyncMonitor at the default check frequency (every=10, with
`after_backward()` and `record_loss()` called every step, as the course recommends). Their
steps alternate one by one, so that the noise of this shared machine (which moves a step's
time by more than the 5 % at stake, from one second to the next) hits both alike.

The run is cut into windows of `every` monitored steps (exactly one check step each) and
the `every` plain steps interleaved with them. The figure is the ratio of the medians of the
windows' mean step times: a window's mean includes its check step, so the check's cost is
spread over the steps, as a training run pays it. The median of the per-window ratios is
reported too, as a cross-check.
"""

from __future__ import annotations

import time

import numpy as np

from ..cluster import Cluster
from . import bench, check, result, tick

EVERY = 10  # SyncMonitor's default
RANKS = 4


def _train(windows: int, width: int, batch: int) -> dict:
    """On every rank: alternate plain and monitored steps; return their wall times."""
    import torch
    import torch.distributed as dist

    from ..monitor import SyncMonitor

    rank = dist.get_rank()

    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, width), torch.nn.ReLU(),
            torch.nn.Linear(width, width), torch.nn.ReLU(),
            torch.nn.Linear(width, 10))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        return ddp, torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)

    plain, plain_opt = make()
    watched, watched_opt = make()
    mon = SyncMonitor(watched, every=EVERY)
    gen = torch.Generator().manual_seed(rank)
    data = [(torch.randn(batch, 64, generator=gen), torch.randint(0, 10, (batch,), generator=gen))
            for _ in range(EVERY)]
    loss_fn = torch.nn.CrossEntropyLoss()

    def plain_step(x, y):
        loss = loss_fn(plain(x), y)
        loss.backward()
        plain_opt.step()
        plain_opt.zero_grad()

    def watched_step(x, y):
        with mon.step() as s:
            loss = loss_fn(watched(x), y)
            loss.backward()
            s.after_backward()
            watched_opt.step()
            watched_opt.zero_grad()
            s.record_loss(loss)

    def timed(step_fn, x, y) -> float:
        t0 = time.perf_counter()
        step_fn(x, y)
        return time.perf_counter() - t0

    # Warm-up: DDP builds its buckets in the first iterations. EVERY monitored steps, so
    # that the check is the last step of every window below.
    for x, y in data:
        plain_step(x, y)
        watched_step(x, y)
    out: dict[str, list] = {"plain": [], "monitor": []}
    for w in range(windows):
        plain_times, watched_times = [], []
        for i, (x, y) in enumerate(data):
            if (w + i) % 2 == 0:  # which of the two goes first alternates, too
                plain_times.append(timed(plain_step, x, y))
                watched_times.append(timed(watched_step, x, y))
            else:
                watched_times.append(timed(watched_step, x, y))
                plain_times.append(timed(plain_step, x, y))
        out["plain"].append(plain_times)
        out["monitor"].append(watched_times)
    mon.check()
    out["alerts"] = [(a.kind, str(a)) for a in mon.alerts]
    mon.close()
    return out


@bench("monitor")
def monitor_overhead(quick: bool = False) -> dict:
    windows = 15 if quick else 80
    width, batch = 256, 64
    with Cluster(nodes=RANKS, nic="delay 500us", timeout=300) as cl:
        per_rank = cl.run(_train, windows, width, batch)
    tick()  # one run of every window (the ranks report only at its end)
    # Steps are synchronous: a step ends for the cluster when its slowest rank is done.
    times = {mode: np.max([per_rank[k][mode] for k in range(RANKS)], axis=0)
             for mode in ("plain", "monitor")}  # (windows, EVERY) each
    rows = [{"window": w, "plain_step_s": times["plain"][w].tolist(),
             "monitor_step_s": times["monitor"][w].tolist()} for w in range(windows)]
    means = {mode: t.mean(axis=1) for mode, t in times.items()}
    plain = float(np.median(means["plain"]))
    ratio = float(np.median(means["monitor"]) / plain)
    paired = float(np.median(means["monitor"] / means["plain"]))
    monitored = times["monitor"]
    check_extra = float(np.median(monitored[:, EVERY - 1] - np.median(monitored[:, 1:EVERY - 1],
                                                                        axis=1)))
    verdict_extra = float(np.median(monitored[:, 0] - np.median(monitored[:, 1:EVERY - 1],
                                                                 axis=1)))
    # Replicas must stay identical on this healthy run. Straggler alerts are not counted: on
    # a shared machine a rank really can be held back by someone else's process.
    alerts = per_rank[0]["alerts"]
    sync = [text for kind, text in alerts if kind != "straggler"]
    stragglers = sum(kind == "straggler" for kind, _ in alerts)
    checks = [
        check(f"step time with / without SyncMonitor (every={EVERY}), {RANKS} ranks, "
              "'delay 500us'", "<= 1.05", round(ratio, 4), ratio <= 1.05),
        check("the same, median of the per-window ratios", "report", round(paired, 4), True),
        check("step time without the monitor (median of window means)", "report",
              f"{1e3 * plain:.2f} ms", True),
        check("extra time of a check step (fingerprints, start of the all_gather)", "report",
              f"{1e3 * check_extra:.2f} ms", True),
        check("extra time of the step after it (wait for the all_gather, analysis)", "report",
              f"{1e3 * verdict_extra:.2f} ms", True),
        check("alerts other than stragglers on this healthy run", "0", len(sync), not sync),
        check("straggler alerts (this machine's load)", "report", stragglers, True),
    ]
    return result("monitor", rows, checks)
