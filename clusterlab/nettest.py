"""`clusterlab nettest`: measure a cluster's network the way the course measures the
emulated one, nccl-tests style, under torchrun.

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m clusterlab nettest -o cluster.json --png cluster.png

(`clusterlab nettest --nproc-per-node 4` alone starts a one-host torchrun for you.) Every
rank takes part; rank 0 prints the table and writes the JSON and the figure. It measures:

- pairwise ping-pong, one pair at a time (so no pair's numbers include another's traffic):
  half round trips of an 8-byte message, p50 / p99 / p99.9 (with their sample count) and
  jitter (their standard deviation); and, where the ranks share one clock (one host, or
  the "netem" backend's common clock across hosts), each direction's one-way delays, which
  leave out the responder's turnaround that a round trip counts;
- per-direction bandwidth: a large message and an 8-byte acknowledgement, minus the pair's
  small-message round trip (p50), so what is left is the bytes' own time on the link; from
  the fastest of `bw_reps` repetitions (the one least disturbed by anything else the hosts
  ran; the median's is recorded too);
- an algbw / busbw sweep of all_reduce, all_gather, reduce_scatter, all_to_all and broadcast
  (`iters` back-to-back operations per size, the slowest rank's average, as nccl-tests
  times them; sizes and bus-bandwidth factors as nccl-tests defines them,
  `clusterlab.models.busbw_factor`), and an α-β fit of each;
- an outlier report: the pairs whose latency, and the directions whose bandwidth, are far
  from the rest (by OUTLIER_FACTOR), named by rank and host; a rank or host all of whose
  links are slow is named itself.

The backend is NCCL where CUDA is present, Gloo otherwise, and the "netem" backend when a
CLUSTERLAB_NIC / CLUSTERLAB_LINKS / CLUSTERLAB_INTRA network is configured: then the JSON
also records the configured network, so measured and configured can be read side by side.

Calibrate from your cluster: `load_calibration(path)` turns the JSON into the `Netem` of its
inter-node links (and the intra-node one), and a `Topology`, which `clusterlab.sim` takes
(`simulate_training(nodes, procs_per_node, nic=cal.nic, intra=cal.intra)`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np

from . import clock, models
from .netem import Netem
from .topology import Topology
from .wire import wire_beta

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
DEFAULT_SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)
# A pair whose latency p50 is this many times the median pair's, or a direction whose
# bandwidth is this many times below the median direction's, is an outlier.
OUTLIER_FACTOR = 1.5
NETWORK_VARIABLES = ("CLUSTERLAB_NIC", "CLUSTERLAB_INTRA", "CLUSTERLAB_LINKS",
                     "CLUSTERLAB_PROCS_PER_NODE")


@dataclass(frozen=True)
class Options:
    """What one nettest run measures (every rank must be given the same)."""

    ping_iters: int = 200
    bw_bytes: int = 4 << 20
    bw_reps: int = 3
    sizes: tuple[int, ...] = DEFAULT_SIZES
    coll_iters: int = 5
    warmup: int = 2
    collectives: tuple[str, ...] = COLLECTIVES

    def __post_init__(self) -> None:
        for name in ("ping_iters", "bw_bytes", "bw_reps", "coll_iters"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup!r}")
        if not self.sizes or any(not isinstance(s, int) or s < 1 for s in self.sizes):
            raise ValueError(f"sizes must be integers >= 1 (bytes), got {self.sizes!r}")
        unknown = [c for c in self.collectives if c not in COLLECTIVES]
        if unknown:
            raise ValueError(f"collectives: unknown {unknown}; choose from {COLLECTIVES}")


# --- measuring (every rank) ------------------------------------------------------------------

def measure(opts: Options | None = None) -> dict | None:
    """Run every measurement on this rank of an initialised process group; rank 0 gets the
    result (a JSON-ready dict), the others None."""
    import torch.distributed as dist

    from .clocksync import clock_key

    opts = opts or Options()
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise ValueError(f"nettest needs at least 2 ranks, got a world of {world}")
    device = _device()
    who: list = [None] * world
    dist.all_gather_object(who, (_host_name(), _netns(), clock_key()))
    hosts = _host_labels(who)
    ppn = _procs_per_node(hosts)
    pairs = [(a, b) for a in range(world) for b in range(a + 1, world)]
    latency, oneway = {}, {}
    for a, b in pairs:
        dist.barrier()
        half, heard = _ping_pong(rank, a, b, opts, device)
        if half is not None:
            latency[(a, b)] = half
        if heard is not None:
            oneway[(b, a) if rank == a else (a, b)] = heard
    bandwidth = {}
    for a, b in pairs:
        for src, dst in ((a, b), (b, a)):
            dist.barrier()
            t = _stream(rank, src, dst, opts, device)
            if t is not None:
                bandwidth[(src, dst)] = t
    collectives = [_sweep_one(kind, size, opts, world, device)
                   for kind in opts.collectives for size in opts.sizes]
    # Rank 0 gathers every rank's pair results (a pair is measured by its lower rank).
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (latency, oneway, bandwidth))
    if rank != 0:
        return None
    for lat, one, bw in gathered:
        latency.update(lat)
        oneway.update(one)
        bandwidth.update(bw)
    backend = dist.get_backend()
    # One-way delays need one clock: one host's, or the "netem" backend's common clock.
    common = backend == "netem" or len({w[2] for w in who}) == 1
    return summarize(latency, bandwidth, collectives, world=world, hosts=hosts,
                     procs_per_node=ppn, backend=backend, opts=opts,
                     oneway=oneway if common else None,
                     configured=_configured() if backend == "netem" else None)


def _host_name() -> str:
    from .clocksync import HOST_VARIABLE

    return os.environ.get(HOST_VARIABLE) or socket.gethostname()


def _netns() -> str:
    try:
        return os.readlink("/proc/self/ns/net")  # e.g. net:[4026531840]
    except OSError:
        return ""


def _host_labels(who) -> list[str]:
    """A name per rank's host: its hostname, and where network namespaces of one machine
    share a hostname (`ip netns`), the namespace too: each is a host to the network."""
    spaces: dict[str, set] = {}
    for name, ns, _ in who:
        spaces.setdefault(name, set()).add(ns)
    return [name if len(spaces[name]) == 1 else f"{name}[{ns.removeprefix('net:')}]"
            for name, ns, _ in who]


def _device():
    import torch

    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _procs_per_node(hosts) -> int:
    """Ranks per node: the emulated topology's under "netem", else ranks per host."""
    if _netem_configured():
        return int(os.environ.get("CLUSTERLAB_PROCS_PER_NODE") or 1)
    counts = {h: hosts.count(h) for h in hosts}
    per = set(counts.values())
    return per.pop() if len(per) == 1 and _contiguous(hosts) else 1


def _contiguous(hosts) -> bool:
    seen = []
    for h in hosts:
        if not seen or seen[-1] != h:
            if h in seen:
                return False
            seen.append(h)
    return True


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize()


def _ping_pong(rank, a, b, opts, device):
    """(half round trips measured at a, one-way delays of the messages this rank received),
    in ns, of 8-byte messages between a and b; (None, None) on other ranks.

    Each message carries its sender's clock reading at the send call, so the receiver has
    the one-way delay too (meaningful only on one clock); the round trip also counts the
    responder's turnaround, as any ping-pong does. Every receive is posted before its
    message can arrive (as `clusterlab.doctor.one_way_delays` does): a receive posted late
    would count the posting as network time."""
    import torch
    import torch.distributed as dist

    if rank not in (a, b):
        return None, None
    peer = b if rank == a else a
    stamp = torch.zeros(1, dtype=torch.int64)
    clock_view = stamp.numpy()
    half, heard = [], []

    def post():
        buf = torch.zeros(1, dtype=torch.int64, device=device)
        return buf, dist.irecv(buf, peer)

    def send() -> None:
        # Stamped right before the call the backend times the message from: on a GPU the
        # copy to the device counts as the message's own (it is part of sending it).
        clock_view[0] = clock.monotonic_ns()
        dist.isend(stamp if device.type == "cpu" else stamp.to(device), peer).wait()

    def receive(posted, k: int) -> None:
        buf, work = posted
        work.wait()
        _sync(device)
        arrived = clock.monotonic_ns()
        if k >= opts.warmup:
            heard.append(arrived - int(buf.cpu()[0]))

    rounds = opts.warmup + opts.ping_iters
    pending = post()
    for k in range(rounds):
        if rank == a:
            t0 = clock.monotonic_ns()
            send()
            receive(pending, k)
            if k >= opts.warmup:
                half.append((clock.monotonic_ns() - t0) // 2)
        else:  # the reply at once; the next receive is still in time: the next request
            # leaves only once this reply has arrived
            receive(pending, k)
            send()
        pending = post() if k + 1 < rounds else None
    return (half if rank == a else None), heard


def _stream(rank, src, dst, opts, device) -> list[int] | None:
    """Times (ns) from sending bw_bytes from src to dst to src receiving dst's 8-byte ack."""
    import torch
    import torch.distributed as dist

    big = torch.zeros(opts.bw_bytes, dtype=torch.uint8, device=device)
    ack = torch.zeros(1, dtype=torch.int64, device=device)
    out = []
    for k in range(1 + opts.bw_reps):  # one warm-up
        if rank == src:
            t0 = clock.monotonic_ns()
            dist.send(big, dst)
            dist.recv(ack, dst)
            _sync(device)
            if k:
                out.append(clock.monotonic_ns() - t0)
        elif rank == dst:
            dist.recv(big, src)
            dist.send(ack, src)
    return out if rank == src else None


def _sweep_one(kind: str, size: int, opts: Options, world: int, device) -> dict:
    """One (collective, size) row: nccl-tests' size (bytes), time, algbw and busbw."""
    import torch
    import torch.distributed as dist

    count = max(world, size // 4 // world * world)  # float32 elements, a multiple of p
    nbytes = count * 4
    x = torch.ones(count, dtype=torch.float32, device=device)
    part = torch.ones(count // world, dtype=torch.float32, device=device)
    out = torch.empty(count, dtype=torch.float32, device=device)
    ops = {
        "all_reduce": lambda: dist.all_reduce(x),
        "all_gather": lambda: dist.all_gather_into_tensor(out, part),  # size = the output
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, x),  # size = the input
        "all_to_all": lambda: dist.all_to_all_single(out, x),
        "broadcast": lambda: dist.broadcast(x, 0),
    }
    op = ops[kind]
    for _ in range(opts.warmup):
        op()
    _sync(device)
    dist.barrier()
    t0 = clock.monotonic_ns()
    for _ in range(opts.coll_iters):
        op()
    _sync(device)
    mine = torch.tensor([(clock.monotonic_ns() - t0) / opts.coll_iters / 1e9],
                        dtype=torch.float64, device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slowest rank's time
    seconds = float(mine[0])
    return {"collective": kind, "bytes": nbytes, "ranks": world, "time_s": seconds,
            "algbw": models.alg_bandwidth(nbytes, seconds),
            "busbw": models.bus_bandwidth(kind, world, nbytes, seconds)}


def _netem_configured() -> bool:
    return any(os.environ.get(n) for n in ("CLUSTERLAB_NIC", "CLUSTERLAB_INTRA",
                                           "CLUSTERLAB_LINKS"))


def network_error(world_size: int, env=None) -> str | None:
    """None if the CLUSTERLAB_* settings describe a network of `world_size` ranks, else one
    line naming the variable, its value and what it accepts (what the "netem" backend would
    raise in every rank, as a traceback each, once the job had started)."""
    from .backend import NetemConfig

    env = os.environ if env is None else env
    try:
        NetemConfig.from_env(world_size, env)
    except ValueError as exc:
        msg = str(exc)
        for name in sorted(n for n in env if n.startswith("CLUSTERLAB_")):
            if msg.startswith(f"{name}: "):  # e.g. "CLUSTERLAB_NIC: netem: unknown keyword"
                return f"{name}={env[name]!r}: {msg[len(name) + 2:]}"
        return msg
    return None


def _configured() -> dict:
    return {n: os.environ.get(n, "") for n in NETWORK_VARIABLES}


# --- summarising (pure functions over the measurements) --------------------------------------

def _percentiles(values) -> dict:
    a = np.asarray(values, dtype=np.float64) / 1e3
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
            "p999_us": float(np.percentile(a, 99.9)), "jitter_us": float(a.std()),
            "samples": int(a.size)}


def summarize(latency, bandwidth, collectives, *, world, hosts, procs_per_node, backend,
              opts: Options, oneway=None, configured=None) -> dict:
    """The result dict from raw measurements: latency[(a, b)] = half round trips (ns),
    bandwidth[(src, dst)] = ack times (ns), collectives = sweep rows, oneway[(src, dst)] =
    one-way delays (ns; None where the ranks do not share one clock)."""
    pairs = []
    for (a, b), half in sorted(latency.items()):
        pairs.append({"a": a, "b": b, "hosts": [hosts[a], hosts[b]],
                      "intra_node": a // procs_per_node == b // procs_per_node,
                      **_percentiles(half), "min_us": float(np.min(half)) / 1e3})
    fastest = {(p["a"], p["b"]): p["min_us"] for p in pairs}
    links = []
    for (src, dst), times in sorted(bandwidth.items()):
        # The best repetition against the best round trip: both as undisturbed as they come.
        rtt_s = 2 * fastest[(min(src, dst), max(src, dst))] / 1e6
        best, median = (float(np.min(times)) / 1e9, float(np.median(times)) / 1e9)
        links.append({"src": src, "dst": dst, "hosts": [hosts[src], hosts[dst]],
                      "intra_node": src // procs_per_node == dst // procs_per_node,
                      "bytes": opts.bw_bytes, "reps": len(times), "time_s": best,
                      "bandwidth_Bps": opts.bw_bytes / max(best - rtt_s, 1e-12),
                      "bandwidth_median_Bps": opts.bw_bytes / max(median - rtt_s, 1e-12),
                      "one_way": _percentiles(oneway[(src, dst)]) if oneway else None})
    fits = {}
    for kind in sorted({r["collective"] for r in collectives}):
        rows = [r for r in collectives if r["collective"] == kind]
        if len({r["bytes"] for r in rows}) >= 2:
            f = models.fit_alpha_beta([r["bytes"] for r in rows], [r["time_s"] for r in rows])
            fits[kind] = {"alpha_s": f.alpha, "beta_s_per_byte": f.beta, "r2": f.r2}
    inter = [p for p in pairs if not p["intra_node"]] or pairs
    inter_links = [ln for ln in links if not ln["intra_node"]] or links
    link_fit = {"alpha_s": float(np.median([p["p50_us"] for p in inter])) / 1e6,
                "bandwidth_Bps": float(np.median([ln["bandwidth_Bps"] for ln in inter_links]))}
    result = {"world": world, "hosts": hosts, "procs_per_node": procs_per_node,
              "backend": backend, "options": {**opts.__dict__, "sizes": list(opts.sizes),
                                               "collectives": list(opts.collectives)},
              "pairs": pairs, "links": links, "collectives": collectives, "fits": fits,
              "link_fit": link_fit, "configured": configured, "date": _now_text()}
    result["outliers"] = outliers(result)
    return result


def _now_text() -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def outliers(result: dict, factor: float = OUTLIER_FACTOR) -> list[dict]:
    """The slow pairs and directions, and the ranks or hosts all of whose links are slow.

    Pairs and directions are compared with others of their kind (intra-node with
    intra-node, between nodes with between nodes): a machine's own loopback is no yardstick
    for its NIC."""
    found = []
    hosts = result["hosts"]
    for intra in (False, True):
        pairs = [p for p in result["pairs"] if p["intra_node"] == intra]
        if len(pairs) >= 3:
            med = float(np.median([p["p50_us"] for p in pairs]))
            slow = [p for p in pairs if p["p50_us"] > factor * med]
            found += [{"kind": "latency", "what": f"ranks {p['a']}<->{p['b']}",
                       "hosts": p["hosts"], "value_us": p["p50_us"], "median_us": med}
                      for p in slow]
            found += _culprits("latency", [(p["a"], p["b"]) for p in slow],
                               [(p["a"], p["b"]) for p in pairs], hosts)
        links = [ln for ln in result["links"] if ln["intra_node"] == intra]
        if len(links) >= 2:
            med = float(np.median([ln["bandwidth_Bps"] for ln in links]))
            slow = [ln for ln in links if ln["bandwidth_Bps"] < med / factor]
            found += [{"kind": "bandwidth", "what": f"link {ln['src']}->{ln['dst']}",
                       "hosts": ln["hosts"], "value_Bps": ln["bandwidth_Bps"],
                       "median_Bps": med} for ln in slow]
            edges = [(ln["src"], ln["dst"]) for ln in links]
            slow_edges = [(ln["src"], ln["dst"]) for ln in slow]
            found += _culprits("bandwidth", slow_edges, edges, hosts)
    return found


def _culprits(kind, slow, every, hosts) -> list[dict]:
    """A rank (then a host) every one of whose links (>= 2) is slow, when not all are."""
    if not slow or len(slow) == len(every):
        return []
    out = []
    for r in sorted({r for e in every for r in e}):
        mine = [e for e in every if r in e]
        if len(mine) >= 2 and all(e in slow for e in mine):
            out.append({"kind": kind, "what": f"rank {r}", "hosts": [hosts[r]]})
    for h in sorted(set(hosts)):
        mine = [e for e in every if hosts[e[0]] == h or hosts[e[1]] == h]
        others = [e for e in every if e not in mine]
        if mine and others and len(set(hosts)) > 2 and all(e in slow for e in mine):
            out.append({"kind": kind, "what": f"host {h}", "hosts": [h]})
    return out


# --- reading the result ----------------------------------------------------------------------

def table(result: dict) -> str:
    """The result as text: pairs, links, the sweep, the fits, the outliers."""
    lines = [f"clusterlab nettest: {result['world']} ranks on {len(set(result['hosts']))} "
             f"host(s), {result['procs_per_node']} per node, backend {result['backend']}"]
    cfg = result.get("configured")
    if cfg:
        lines.append("configured (emulated timing): " + ", ".join(
            f"{k.removeprefix('CLUSTERLAB_')}={v!r}" for k, v in cfg.items() if v))
    lines.append("")
    lines.append(f"{'pair':>8} {'where':>6} {'p50 us':>9} {'p99 us':>9} {'p99.9 us':>9} "
                 f"{'jitter us':>9} {'n':>5}")
    for p in result["pairs"]:
        lines.append(f"{p['a']:>3}<->{p['b']:<3} {'intra' if p['intra_node'] else 'inter':>6} "
                     f"{p['p50_us']:9.1f} {p['p99_us']:9.1f} {p['p999_us']:9.1f} "
                     f"{p['jitter_us']:9.1f} {p['samples']:5d}")
    lines.append("(latency = half the round trip of an 8-byte message; p99.9 of fewer than "
                 "1000 samples is close to their maximum)")
    lines.append("")
    lines.append(f"{'link':>8} {'where':>6} {'MB/s':>10} {'Gbit/s':>8} {'median MB/s':>12}"
                 f" {'1-way p50 us':>13} {'1-way p99 us':>13}")
    for ln in result["links"]:
        bw = ln["bandwidth_Bps"]
        one = ln.get("one_way")
        lines.append(f"{ln['src']:>3}->{ln['dst']:<4} {'intra' if ln['intra_node'] else 'inter':>6}"
                     f" {bw / 1e6:10.2f} {bw * 8 / 1e9:8.3f} "
                     f"{ln['bandwidth_median_Bps'] / 1e6:12.2f} "
                     + (f"{one['p50_us']:13.1f} {one['p99_us']:13.1f}" if one else
                        f"{'-':>13} {'-':>13}"))
    lines.append(f"(payload bandwidth, best of {result['options']['bw_reps']} messages of "
                 f"{result['options']['bw_bytes']} bytes)")
    lines.append("")
    lines.append(f"{'collective':>15} {'bytes':>10} {'time us':>10} {'algbw MB/s':>11} "
                 f"{'busbw MB/s':>11}")
    for r in result["collectives"]:
        lines.append(f"{r['collective']:>15} {r['bytes']:>10d} {r['time_s'] * 1e6:10.1f} "
                     f"{r['algbw'] / 1e6:11.2f} {r['busbw'] / 1e6:11.2f}")
    for kind, f in result["fits"].items():
        bw = math.inf if f["beta_s_per_byte"] <= 0 else 1 / f["beta_s_per_byte"] / 1e6
        lines.append(f"fit {kind}: t = {f['alpha_s'] * 1e6:.1f} us + n / {bw:.2f} MB/s "
                     f"(R^2 {f['r2']:.3f})")
    lf = result["link_fit"]
    kind = ("between nodes" if any(not p["intra_node"] for p in result["pairs"])
            else "within a node (no pair crosses nodes)")
    lines.append(f"links {kind}: alpha {lf['alpha_s'] * 1e6:.1f} us (median p50), "
                 f"{lf['bandwidth_Bps'] / 1e6:.2f} MB/s (median)")
    lines.append("")
    if result["outliers"]:
        for o in result["outliers"]:
            lines.append(f"OUTLIER ({o['kind']}): {o['what']} on {' / '.join(o['hosts'])}")
    else:
        lines.append(f"no outliers (nothing {OUTLIER_FACTOR}x off its kind's median)")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    """Latency per pair, bandwidth per direction, busbw per collective and size (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    world = result["world"]
    lat = np.full((world, world), np.nan)
    for p in result["pairs"]:
        lat[p["a"], p["b"]] = lat[p["b"], p["a"]] = p["p50_us"]
    bw = np.full((world, world), np.nan)
    for ln in result["links"]:
        bw[ln["src"], ln["dst"]] = ln["bandwidth_Bps"] / 1e6
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, m, title, unit in ((axes[0], lat, "latency p50 (half round trip)", "us"),
                               (axes[1], bw, "bandwidth, row -> column", "MB/s")):
        im = ax.imshow(m, cmap="viridis", vmin=0)
        ax.set_xticks(range(world))
        ax.set_yticks(range(world))
        ax.set_title(title)
        ax.set_xlabel("rank")
        ax.set_ylabel("rank")
        fig.colorbar(im, ax=ax, label=unit)
    ax = axes[2]
    for kind in sorted({r["collective"] for r in result["collectives"]}):
        rows = [r for r in result["collectives"] if r["collective"] == kind]
        ax.plot([r["bytes"] for r in rows], [r["busbw"] / 1e6 for r in rows], "o-", label=kind)
    ax.set_xscale("log")
    ax.set_xlabel("size (bytes, as nccl-tests counts them)")
    ax.set_ylabel("busbw (MB/s)")
    ax.set_title(f"bus bandwidth, {world} ranks")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@dataclass(frozen=True)
class Calibration:
    """A measured cluster as the simulator takes it."""

    nic: Netem
    intra: Netem | None
    nodes: int
    procs_per_node: int
    source: dict = field(default_factory=dict, repr=False)

    def topology(self, nodes: int | None = None) -> Topology:
        """The measured links on `nodes` nodes (default: as many as were measured)."""
        return Topology.build(nodes or self.nodes, self.procs_per_node, self.nic, self.intra)

    def explorer_settings(self) -> dict:
        """The inter-node link in the throughput explorer's units:
        `clusterlab.widgets.throughput_explorer(**cal.explorer_settings())`."""
        return {"latency_us": self.nic.delay_ns / 1e3, "jitter_us": self.nic.jitter_ns / 1e3,
                "distribution": "normal", "bandwidth_gbit": self.nic.rate_bps / 1e9,
                "procs_per_node": self.procs_per_node}


def load_calibration(source) -> Calibration:
    """A nettest JSON (a path or the loaded dict) as netem specs: per kind of link (between
    nodes; within a node), delay = the median one-way p50 (without one clock, the median
    half-round-trip p50), jitter = sqrt(2) x the median
    half-round-trip std as a normal distribution (a half round trip averages two draws),
    rate = the median bandwidth turned into a wire rate (TCP headers included, as netem's
    rate counts them). Approximate by design: one spec per kind of link, no tails. A run in
    which no pair crosses nodes (one host) has only its intra-node link to stand for the NIC."""
    if isinstance(source, (str, os.PathLike)):
        with open(source) as f:
            source = json.load(f)
    if not isinstance(source, dict) or "pairs" not in source or "links" not in source:
        raise ValueError("load_calibration needs a clusterlab nettest result (with 'pairs' "
                         "and 'links')")
    specs = {}
    for intra in (False, True):
        pairs = [p for p in source["pairs"] if p["intra_node"] == intra]
        links = [ln for ln in source["links"] if ln["intra_node"] == intra]
        if not pairs:
            specs[intra] = None
            continue
        ones = [ln["one_way"]["p50_us"] for ln in links if ln.get("one_way")]
        delay = float(np.median(ones or [p["p50_us"] for p in pairs]))
        jitter = float(np.median([p["jitter_us"] for p in pairs])) * math.sqrt(2)
        text = f"delay {delay:.1f}us"
        if jitter >= 0.01 * delay and jitter >= 1:
            text += f" {jitter:.1f}us distribution normal"
        if links:
            payload_bps = float(np.median([ln["bandwidth_Bps"] for ln in links]))
            text += f" rate {int(payload_bps * wire_beta(1.0))}bit"  # wire bit/s
        specs[intra] = Netem.parse(text)
    ppn = int(source["procs_per_node"])
    return Calibration(nic=specs[False] or specs[True], intra=specs[True],
                       nodes=max(1, source["world"] // ppn), procs_per_node=ppn,
                       source=source)


# --- the command -----------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clusterlab nettest", description=__doc__.split("\n\n")[0],
                                epilog="Run it under torchrun on every host, or alone with "
                                "--nproc-per-node for one host.")
    p.add_argument("-o", "--out", default="nettest.json", metavar="PATH",
                   help="where rank 0 writes the result (default nettest.json)")
    p.add_argument("--json", action="store_true",
                   help="rank 0 prints the result as JSON instead of the table")
    p.add_argument("--png", default="nettest.png", help="where rank 0 draws the figure "
                   "('' for none)")
    p.add_argument("--iters", type=int, default=Options.ping_iters,
                   help="ping-pong round trips per pair")
    p.add_argument("--bw-bytes", type=int, default=Options.bw_bytes,
                   help="message size of the bandwidth test (bytes)")
    p.add_argument("--bw-reps", type=int, default=Options.bw_reps,
                   help="messages per direction in the bandwidth test (the best counts)")
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                   help="collective sizes in bytes, comma-separated")
    p.add_argument("--coll-iters", type=int, default=Options.coll_iters,
                   help="back-to-back operations timed per collective and size")
    p.add_argument("--collectives", default=",".join(COLLECTIVES),
                   help="which of them to sweep, comma-separated")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl", "netem"],
                   help="auto: netem if a CLUSTERLAB_* network is set, nccl with CUDA, else "
                   "gloo")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds any one operation may wait for its peers (default 600)")
    p.add_argument("--nproc-per-node", type=int, default=2,
                   help="outside torchrun: ranks of the one-host run started for you")
    return p


def options_from(args) -> Options:
    try:
        sizes = tuple(int(s) for s in args.sizes.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"--sizes must be comma-separated integers, got {args.sizes!r}") from None
    return Options(ping_iters=args.iters, bw_bytes=args.bw_bytes, bw_reps=args.bw_reps,
                   sizes=sizes, coll_iters=args.coll_iters,
                   collectives=tuple(c.strip() for c in args.collectives.split(",") if c))


def _backend(choice: str) -> str:
    if choice != "auto":
        return choice
    if _netem_configured():
        return "netem"
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def main(argv: list[str] | None = None) -> int:
    from .cli import legacy_json

    parser = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    # nettest takes no positional arguments: a word after --json is an old path. The note
    # comes from the command, or under torchrun from rank 0, not from every rank.
    argv = legacy_json(argv, is_path=lambda tok: not tok.startswith("-"),
                       quiet=os.environ.get("RANK", "0") != "0")
    args = parser.parse_args(argv)
    try:
        opts = options_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    if not args.timeout > 0:
        parser.error(f"--timeout must be > 0 seconds, got {args.timeout}")
    launcher = "RANK" not in os.environ or "WORLD_SIZE" not in os.environ
    world = args.nproc_per_node if launcher else int(os.environ["WORLD_SIZE"])
    if _backend(args.backend) == "netem" and (bad := network_error(world)):
        # Checked before any rank starts (or, under the user's torchrun, before this rank
        # joins): one line, from the command or each host's first rank, and no traceback.
        if launcher or os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"clusterlab nettest: error: {bad}", file=sys.stderr, flush=True)
        return 2
    if launcher:
        if args.nproc_per_node < 2:
            parser.error(f"--nproc-per-node must be >= 2, got {args.nproc_per_node}")
        # Not under torchrun: one host, torchrun started for us with these same arguments.
        # --log-dir: without it the agent leaves a /tmp/torchelastic_* directory behind.
        with tempfile.TemporaryDirectory(prefix="clusterlab-nettest-") as logs:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", str(args.nproc_per_node), "--log-dir", logs,
                   "-m", "clusterlab.nettest", *argv]
            return subprocess.call(cmd)
    import torch.distributed as dist

    backend = _backend(args.backend)
    if backend == "netem":
        import clusterlab  # noqa: F401 - registers the backend
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    try:
        result = measure(opts)
    finally:
        dist.destroy_process_group()
    if result is not None:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        if args.png:
            plot(result, args.png)
        print(json.dumps(result, indent=1) if args.json else table(result), flush=True)
        print(f"wrote {args.out}" + (f" and {args.png}" if args.png else ""),
              file=sys.stderr if args.json else sys.stdout, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
