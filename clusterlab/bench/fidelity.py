"""Fidelity bench: do real processes experience the network that was configured?

Every figure is measured by real ranks exchanging real messages through the "netem"
backend, timestamped on the shared CLOCK_MONOTONIC, and compared with the configuration:
median one-way delay, the jitter distribution (KS distance and standard deviation against
netem's own table), goodput against the configured rate (one sender, and two processes
sharing one NIC), loss fraction against its binomial 3-sigma band, and inversions (a message
sent later but delivered earlier, across flows) with jitter, with a rate, and with reorder.
"""

from __future__ import annotations

import time

import numpy as np

from .. import clock
from ..cluster import Cluster
from ..doctor import MEDIAN_DELAY_TOLERANCE
from ..link import delay_values_ns, sample_delay_ns
from ..netem import Netem
from ..wire import wire_beta
from . import bench, check, result


def _stream(n: int, spacing_s: float):
    """Every rank sends n stamped messages to rank+1, spaced; returns one-way delays (ns)."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out, stamp, buf = [], torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    dist.barrier()
    start = time.monotonic_ns()
    for i in range(n):
        clock.sleep_until(start + int(i * spacing_s * 1e9))
        stamp[0] = time.monotonic_ns()
        w = dist.isend(stamp.clone(), nxt)
        dist.recv(buf, prv)
        out.append(time.monotonic_ns() - int(buf[0]))
        w.wait()
    dist.barrier()
    return out


def _ping_pong(n: int):
    """Rank 0 pings rank 1, which answers; returns rank 1's one-way delays of the pings (ns)."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    stamp, out = torch.zeros(1, dtype=torch.int64), []
    for _ in range(n):
        if rank == 0:
            stamp[0] = time.monotonic_ns()
            dist.send(stamp, 1)
            dist.recv(stamp, 1)
        elif rank == 1:
            dist.recv(stamp, 0)
            out.append(time.monotonic_ns() - int(stamp[0]))
            dist.send(stamp, 0)
    return out


def _goodput(senders: list[int], receivers: list[int], count: int, nbytes: int):
    """Each sender streams `count` messages to its receiver; receivers return delivery times."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    x = torch.zeros(nbytes // 4)
    dist.barrier()
    if rank in senders:
        peer = receivers[senders.index(rank)]
        works = [dist.isend(x, peer) for _ in range(count)]
        for w in works:
            w.wait()
        times = []
    elif rank in receivers:
        peer = senders[receivers.index(rank)]
        times = []
        for _ in range(count):
            dist.recv(x, peer)
            times.append(time.monotonic_ns())
    else:
        times = []
    dist.barrier()
    return times


def _fan_out(n: int, spacing_s: float):
    """Rank 0 sends n stamped messages round-robin to ranks 1..p-1 through its one NIC.

    Rank 0 returns the release times of its packets from its link model's trace, in the
    order they were enqueued; an inversion is a packet released before an earlier one."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    msg = torch.zeros(2, dtype=torch.int64)
    dist.barrier()
    out = []
    if rank == 0:
        start, works = time.monotonic_ns(), []
        for i in range(n):
            clock.sleep_until(start + int(i * spacing_s * 1e9))
            works.append(dist.isend(torch.tensor([i, time.monotonic_ns()]), 1 + i % (world - 1)))
        for w in works:
            w.wait()
        sends = [t.trace for *_, t in dist.group.WORLD.trace]
        enq = np.concatenate([t.enqueue_ns for t in sends])
        rel = np.concatenate([t.send_ns for t in sends])
        out = rel[np.argsort(enq, kind="stable")].tolist()
    else:
        for _ in range(len(range(rank - 1, n, world - 1))):
            dist.recv(msg, 0)
            out.append((int(msg[0]), int(msg[1]), time.monotonic_ns()))
    dist.barrier()
    return out


def reference_delays(spec: Netem) -> np.ndarray | None:
    """The exact values netem's tabledist can produce for `spec` (one per table entry), or
    None for uniform jitter, whose law the KS distance takes as continuous."""
    return None if spec.distribution == "uniform" else delay_values_ns(spec)


def ks_distance(samples: np.ndarray, spec: Netem) -> float:
    """Kolmogorov-Smirnov distance between measured delays and netem's delay distribution."""
    s = np.sort(np.asarray(samples, dtype=float))
    n = len(s)
    ref = reference_delays(spec)
    if ref is None:
        lo, width = spec.delay_ns - spec.jitter_ns, 2 * spec.jitter_ns
        cdf = np.clip((s - lo) / width, 0, 1)
    else:
        cdf = np.searchsorted(ref, s, side="right") / len(ref)
    ecdf_hi = np.arange(1, n + 1) / n
    ecdf_lo = np.arange(0, n) / n
    return float(max(np.max(ecdf_hi - cdf), np.max(cdf - ecdf_lo)))


def reference_std(spec: Netem) -> float:
    ref = reference_delays(spec)
    if ref is None:
        return spec.jitter_ns / np.sqrt(3)
    return float(ref.std())


@bench("fidelity")
def fidelity(quick: bool = False) -> dict:
    rows: list[dict] = []
    checks: list[dict] = []
    scale = 0.25 if quick else 1.0

    # 1. Median one-way delay.
    for world in (2, 4):
        for delay_ms in (1, 5):
            spec = f"delay {delay_ms}ms"
            with Cluster(nodes=world, nic=spec, timeout=120) as cl:
                per_rank = cl.run(_stream, int(300 * scale), delay_ms * 1.2e-3)
            d = np.concatenate(per_rank) / 1e6
            med = float(np.median(d))
            err = abs(med - delay_ms)
            tol = max(MEDIAN_DELAY_TOLERANCE * delay_ms, 0.1)
            rows.append({"kind": "delay", "ranks": world, "nic": spec, "samples_ms": d.tolist()})
            checks.append(check(f"median one-way delay, {world} ranks, {spec}",
                                f"within {tol:.2f} ms of {delay_ms} ms", round(med, 4),
                                err <= tol))

    # 2. Jitter: the distribution itself. Messages of one connection are spaced so that
    #    TCP's in-order delivery rarely holds one behind its predecessor. Pareto gets a wider
    #    jitter: its density jumps to 2.25/sigma at its lower edge, so at sigma = 2 ms this
    #    machine's ~40 us software path alone would move the KS distance by ~0.045.
    for world in (2, 4):
        for dist_name, jitter_ms, spacing in (("uniform", 2, 6e-3), ("normal", 2, 6e-3),
                                              ("pareto", 5, 15e-3)):
            spec_text = f"delay 5ms {jitter_ms}ms" + ("" if dist_name == "uniform"
                                                      else f" distribution {dist_name}")
            spec = Netem.parse(spec_text)
            n = int((2500 if world == 2 else 1250) * scale)  # 5000 delays either way
            with Cluster(nodes=world, nic=spec, timeout=180) as cl:
                per_rank = cl.run(_stream, n, spacing)
            d = np.concatenate(per_rank)
            ks = ks_distance(d, spec)
            std_ratio = float(d.std() / reference_std(spec))
            rows.append({"kind": "jitter", "ranks": world, "nic": spec_text,
                         "samples_ms": (d / 1e6).tolist()})
            checks.append(check(f"jitter KS distance, {world} ranks, {dist_name}", "< 0.05",
                                round(ks, 4), ks < 0.05))
            checks.append(check(f"jitter std / configured std, {world} ranks, {dist_name}",
                                "within 0.93..1.07", round(std_ratio, 4),
                                0.93 <= std_ratio <= 1.07))

    # 3. Rate: one sender, then two processes sharing one NIC.
    for rate, count, size in (("100mbit", 4, 4 << 20), ("1gbit", 8, 4 << 20)):
        spec = Netem.parse(f"rate {rate}")
        payload_rate = 8 / wire_beta(spec.rate_bps)  # bit/s of payload: headers ride along
        for world, ppn, senders, receivers in ((2, 1, [0], [1]), (4, 2, [0, 1], [2, 3])):
            with Cluster(nodes=world // ppn, procs_per_node=ppn, nic=spec, timeout=120) as cl:
                per_rank = cl.run(_goodput, senders, receivers, int(max(3, count * scale)), size)
            first = min(per_rank[r][0] for r in receivers)
            last = max(per_rank[r][-1] for r in receivers)
            msgs = sum(len(per_rank[r]) for r in receivers) - 1  # bytes after the first delivery
            goodput = msgs * size * 8 / ((last - first) / 1e9)
            ratio = goodput / payload_rate
            rows.append({"kind": "rate", "ranks": world, "procs_per_node": ppn,
                         "nic": str(spec), "bytes": size, "delivered_ns": per_rank})
            who = "1 sender" if len(senders) == 1 else "2 processes sharing one NIC"
            checks.append(check(f"goodput / rate, {rate}, {who}", "within 0.95..1.05",
                                round(ratio, 4), 0.95 <= ratio <= 1.05))

    # 4. Loss: the fraction of pings that needed a retransmission.
    n = int(1000 * scale)
    with Cluster(nodes=2, nic="delay 1ms loss 1%", timeout=300) as cl:
        d = np.array(cl.run(_ping_pong, n)[1]) / 1e6
    lost = int((d > 100).sum())
    p = 0.01
    sigma = np.sqrt(p * (1 - p) / n)
    rows.append({"kind": "loss", "ranks": 2, "nic": "delay 1ms loss 1%", "samples_ms": d.tolist()})
    checks.append(check("loss fraction (pings delayed by an RTO), loss 1%",
                        f"within 3 sigma: {p - 3 * sigma:.4f}..{p + 3 * sigma:.4f}",
                        round(lost / n, 4), abs(lost / n - p) <= 3 * sigma))

    # 5. Inversions across flows: jitter reorders, a rate keeps the queue in order.
    for spec_text, want in (("delay 5ms 1ms", "> 0"), ("delay 5ms 1ms rate 100mbit", "== 0"),
                            ("delay 10ms reorder 25% gap 5", "> 0")):
        with Cluster(nodes=4, nic=spec_text, timeout=120, trace=True) as cl:
            per_rank = cl.run(_fan_out, int(600 * scale), 2e-4)
        released = np.array(per_rank[0])
        inversions = int(np.sum(released[1:] < released[:-1]))
        rows.append({"kind": "inversions", "ranks": 4, "nic": spec_text,
                     "released_ns": per_rank[0], "received": per_rank[1:]})
        ok = inversions > 0 if want == "> 0" else inversions == 0
        checks.append(check(f"packet inversions at rank 0's NIC, {spec_text}", want,
                            inversions, ok))

    # The link model alone, over many packets, as a cross-check of the sampler.
    spec = Netem.parse("delay 5ms 2ms distribution normal")
    draws = sample_delay_ns(spec, np.random.default_rng(0), 50_000)
    rows.append({"kind": "sampler", "nic": str(spec), "ks": ks_distance(draws, spec)})
    return result("fidelity", rows, checks)
