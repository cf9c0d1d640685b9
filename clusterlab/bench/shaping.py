"""Shaping bench: the same spec emulated in userspace and shaped by the kernel (netns + tc).

For each spec, a userspace cluster (the "netem" backend holds Gloo's bytes until the link
model says) and a kernel-shaped one (every node in its own namespace, the spec as a qdisc
on its eth0, plain Gloo) run the same measurements, interleaved round by round so that the
machine's load hits both alike:
- goodput: rank 0 sends a message to rank 1, which acknowledges with 4 bytes; payload
  bytes / seconds, against the rate's payload share (`wire.wire_beta` with each path's
  segment size);
- all_reduce: 4 nodes, ring, from the last rank's entry to the last exit
  (`clusterlab.timing`), against the closed form `models.ring_allreduce`;
- delay and jitter (one-way delay from ping-pong round trips) only where the kernel has
  sch_netem; elsewhere their checks say "skipped: no sch_netem" and count as not met.
Needs root; without it every check says why it was skipped.
"""

from __future__ import annotations

import time

import numpy as np

from .. import models, shaping, timing
from ..cluster import Cluster
from ..netem import Netem
from ..wire import SEGMENT_BYTES, wire_beta
from . import bench, check, result, tick

GOODPUT_SECONDS = 0.2  # each transfer lasts about this long at the configured rate
TOLERANCE = 0.10  # goodput: measured vs configured, and kernel vs userspace
ALLREDUCE_TOLERANCE = 0.15  # as the model bench's goal for measured vs closed form


def _goodput(nbytes: int, repeats: int) -> list[float]:
    """On rank 0: seconds per transfer of `nbytes` to rank 1 (until its 4-byte ack)."""
    import torch
    import torch.distributed as dist

    data, ack, out = torch.zeros(nbytes // 4), torch.zeros(1), []
    for _ in range(repeats + 1):  # the first warms the connection up
        dist.barrier()
        if dist.get_rank() == 0:
            t0 = time.perf_counter()
            dist.send(data, 1)
            dist.recv(ack, 1)
            out.append(time.perf_counter() - t0)
        elif dist.get_rank() == 1:
            dist.recv(data, 0)
            dist.send(ack, 0)
    return out[1:]


def _round_trips(repeats: int) -> list[float]:
    """On rank 0: seconds per 4-byte ping-pong with rank 1."""
    return _goodput(4, repeats)


def _segment(cluster: Cluster) -> int:
    net = cluster._network
    return net.segment_bytes if net is not None else SEGMENT_BYTES


def _pair(nodes: int, nic: str) -> dict[str, Cluster]:
    return {mode: Cluster(nodes=nodes, nic=nic, shaping=mode, timeout=120)
            for mode in shaping.MODES}


def _interleaved(clusters: dict[str, Cluster], rounds: int, fn, *args) -> dict[str, list]:
    """fn on every cluster, round after round in turn; rank results per mode and round."""
    out = {mode: [] for mode in clusters}
    for _ in range(rounds):
        for mode, cl in clusters.items():
            out[mode].append(cl.run(fn, *args))
    return out


def _close(clusters) -> None:
    for cl in clusters.values():
        cl.close()


def _skipped(name: str, why: str) -> dict:
    return check(name, "kernel within 10 % of userspace", f"skipped: {why}", False)


@bench("shaping")
def shaping_bench(quick: bool = False) -> dict:
    rows, checks = [], []
    try:
        shaping.check_available()
    except RuntimeError as exc:
        why = "needs root/netns"
        tick()
        rows.append({"skipped": str(exc)})
        for name in ("goodput", "all_reduce", "delay", "jitter"):
            checks.append(_skipped(name, why))
        return result("shaping", rows, checks)
    rounds = 2 if quick else 3
    repeats = 3 if quick else 5

    for nic in ("rate 100mbit", "rate 500mbit"):
        rate = Netem.parse(nic).rate_bps
        nbytes = int(rate / 8 * GOODPUT_SECONDS) // 4 * 4
        clusters = _pair(2, nic)
        try:
            runs = _interleaved(clusters, rounds, _goodput, nbytes, repeats)
            segments = {mode: _segment(cl) for mode, cl in clusters.items()}
        finally:
            _close(clusters)
        med = {}
        for mode, per_round in runs.items():
            seconds = [s for ranks in per_round for s in ranks[0]]
            expected = 1 / wire_beta(rate, segment_bytes=segments[mode])  # payload bytes/s
            med[mode] = nbytes / float(np.median(seconds))
            tick()
            rows.append({"kind": "goodput", "nic": nic, "mode": mode, "bytes": nbytes,
                         "seconds": seconds, "segment_bytes": segments[mode],
                         "expected_Bps": expected, "median_Bps": med[mode]})
            ratio = med[mode] / expected
            checks.append(check(f"goodput {nic}, {mode}: median / configured payload rate "
                                f"({len(seconds)} transfers of {nbytes / 1e6:g} MB)",
                                f"within {TOLERANCE:.0%}", round(ratio, 3),
                                abs(ratio - 1) <= TOLERANCE))
        ratio = med["kernel"] / med["userspace"]
        checks.append(check(f"goodput {nic}: kernel-shaped / userspace-emulated",
                            f"within {TOLERANCE:.0%}", round(ratio, 3),
                            abs(ratio - 1) <= TOLERANCE))

    nodes, nic, nbytes = 4, "rate 200mbit", 4 * 2**20
    rate = Netem.parse(nic).rate_bps
    clusters = _pair(nodes, nic)
    try:
        runs = _interleaved(clusters, rounds, timing.all_reduce_spans, [nbytes], repeats)
        segments = {mode: _segment(cl) for mode, cl in clusters.items()}
    finally:
        _close(clusters)
    med = {}
    for mode, per_round in runs.items():
        seconds = [float(s) for ranks in per_round
                   for s in timing.durations([r[nbytes] for r in ranks])]
        predicted = models.ring_allreduce(nodes, nbytes, 0.0,
                                          wire_beta(rate, segment_bytes=segments[mode]))
        med[mode] = float(np.median(seconds))
        tick()
        rows.append({"kind": "all_reduce", "nic": nic, "mode": mode, "nodes": nodes,
                     "bytes": nbytes, "seconds": seconds, "predicted_s": predicted})
        ratio = med[mode] / predicted
        checks.append(check(f"all_reduce {nbytes >> 20} MiB on {nodes} nodes, {nic}, {mode}: "
                            f"median / ring closed form ({len(seconds)} runs)",
                            f"within {ALLREDUCE_TOLERANCE:.0%}", round(ratio, 3),
                            abs(ratio - 1) <= ALLREDUCE_TOLERANCE))
    ratio = med["kernel"] / med["userspace"]
    checks.append(check(f"all_reduce {nic}: kernel-shaped / userspace-emulated",
                        f"within {ALLREDUCE_TOLERANCE:.0%}", round(ratio, 3),
                        abs(ratio - 1) <= ALLREDUCE_TOLERANCE))

    for name, nic in (("delay", "delay 2ms"), ("jitter", "delay 2ms 1ms")):
        title = f"{name} ({nic}): median round trip, kernel / userspace"
        if not shaping.kernel_has_netem():
            tick()
            rows.append({"kind": name, "nic": nic, "skipped": "no sch_netem"})
            checks.append(_skipped(title, "no sch_netem"))
            continue
        clusters = _pair(2, nic)
        try:
            runs = _interleaved(clusters, rounds, _round_trips, 10 * repeats)
        finally:
            _close(clusters)
        med = {}
        for mode, per_round in runs.items():
            seconds = [s for ranks in per_round for s in ranks[0]]
            med[mode] = float(np.median(seconds))
            tick()
            rows.append({"kind": name, "nic": nic, "mode": mode, "seconds": seconds})
        ratio = med["kernel"] / med["userspace"]
        checks.append(check(title, "kernel within 10 % of userspace", round(ratio, 3),
                            abs(ratio - 1) <= TOLERANCE))
    return result("shaping", rows, checks)
