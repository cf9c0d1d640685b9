"""Notebook 01: one link, measured. NIC bandwidth, latency, jitter, loss and contention.

Every function starts real clusters (`clusterlab.Cluster`), has real ranks exchange real
messages through Gloo, stamps them on the shared clock (`clusterlab.now()`), and returns
plain data (numpy arrays in milliseconds or seconds, dicts) for the notebook to plot and
assert on:

* `noise_floor`: this machine's own one-way latency (plain Gloo, no impairment) and how late
  a timer wakes up: the floor below which no configured delay can be honoured;
* `ping_pong`: one-way delays and round trips through `nic`, with the distribution netem
  would draw for that spec (`configured_delays`) to overlay on the histogram;
* `jitter_distributions`: the same for uniform, normal and pareto jitter, and
  `jitter_dilated`: at a dilation at which the network's jitter, not this machine, sets the tail;
* `size_sweep`: one-way time against message size under `delay D rate R`, fitted with the
  alpha-beta model (`models.fit_alpha_beta`), and the crossover size n* = alpha / beta;
* `loss_tails`: random loss turning into TCP retransmission timeouts (>= 200 ms);
* `nic_contention`: P processes of one node sharing its rate-limited NIC, and
  `latency_under_load`: small messages queueing behind bulk traffic on that NIC.

Measured delays can only be longer than configured ones, never shorter: a message is held
until its emulated delivery time, and this machine's scheduling noise can only add to it.
Every random draw of the emulator is seeded, so `emulated_one_way` replays the delay the
network gave each ping: measured = emulated + this machine's noise, message by message. So
the notebooks assert lower bounds, the network's own draws and central quantiles, which
noise cannot fake.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from .. import doctor, models
from ..cluster import Cluster
from ..link import LinkModel, delay_values_ns
from ..netem import Netem
from ..wire import RTO_MIN_NS, wire_beta, wire_seconds

KIB, MIB = 1024, 1024 * 1024
PERCENTILES = (1, 50, 90, 99)
RTO_MIN_MS = RTO_MIN_NS / 1e6


def _spec(nic: str | Netem | None) -> Netem:
    if nic is None:
        return Netem()
    return nic if isinstance(nic, Netem) else Netem.parse(nic)


def percentiles(samples_ms, qs=PERCENTILES) -> dict:
    """{"p1": ..., "p50": ..., "mean": ..., "std": ..., "max": ...} of a sample (same units)."""
    a = np.asarray(samples_ms, dtype=float)
    out = {f"p{q:g}": float(np.percentile(a, q)) for q in qs}
    out.update(mean=float(a.mean()), std=float(a.std()), min=float(a.min()), max=float(a.max()))
    return out


def quantile_ci(samples, q: float, confidence: float = 0.95) -> dict:
    """`models.quantile_ci` (a distribution-free, order-statistic confidence interval for the
    q-quantile) as a dict: {"n", "estimate", "lower", "upper"}. `upper` is inf when the sample
    cannot bound the quantile from above: for n = 200 that is the case for the p99, since all
    200 draws fall below the true p99 with probability 0.99^200 = 13 %."""
    estimate, lower, upper = models.quantile_ci(samples, q, confidence)
    return {"n": int(np.size(samples)), "estimate": estimate, "lower": lower, "upper": upper}


def tail_split(result: dict, q: float = 0.99, confidence: float = 0.95) -> dict:
    """Which part of a `ping_pong` result's q-tail is the network's and which this machine's.

    Every ping's delay is the network's own draw (`emulated_ms`, replayed from the seed) plus
    what this machine added (`noise_ms` >= 0), so the measured q-quantile can only be at or
    above the network's. Returns (ms) n, measured (the q-quantile with `quantile_ci`'s
    interval: measured_ci), network (the q-quantile of the network's draws for these pings),
    network_tail (network - the configured delay: what the jitter puts on top of the
    delay), machine_extra (measured - network: how far this machine moved that quantile;
    quantiles do not add, so it is not `noise`), noise (the q-quantile of the machine's noise
    alone), and beyond_network:
    how many pings were later than the largest delay the configured distribution can draw
    (only this machine can have made them that late).
    """
    spec = _spec(result["nic"])
    measured = quantile_ci(result["one_way_ms"], q, confidence)
    network = float(np.percentile(result["emulated_ms"], 100 * q))
    reach = float(configured_delays(spec).max())
    return {"n": measured["n"], "measured": measured["estimate"],
            "measured_ci": (measured["lower"], measured["upper"]), "network": network,
            "network_tail": network - spec.delay_ns / 1e6,
            "machine_extra": measured["estimate"] - network,
            "noise": float(np.percentile(result["noise_ms"], 100 * q)),
            "reach": reach, "beyond_network": int((result["one_way_ms"] > reach + 1e-6).sum())}


def slowest_of(samples_ms, ranks, draws: int = 2000, seed: int = 0, paired=None) -> dict:
    """Resampled "slowest of p": for every p in `ranks`, the mean over `draws` of the largest
    of p values drawn with replacement from `samples_ms`.

    This plays p ranks that each draw one delay independently from the measured
    distribution; it is not a measurement of p ranks (a shared cause, one congested switch or
    one slow host, would correlate real ranks' delays). With `paired` (an array of the same
    length, e.g. the network's own draws for the same pings), the same indices are used for
    it, so the two resamples differ only by what differs ping by ping.
    Returns {"ranks", "mean" [p], and "paired" [p] when given}.
    """
    a = np.asarray(samples_ms, dtype=float)
    rng = np.random.default_rng(seed)
    ranks = [int(k) for k in ranks]
    idx = [rng.integers(0, len(a), (draws, k)) for k in ranks]
    out = {"ranks": np.array(ranks), "n": len(a),
           "mean": np.array([a[i].max(axis=1).mean() for i in idx])}
    if paired is not None:
        b = np.asarray(paired, dtype=float)
        out["paired"] = np.array([b[i].max(axis=1).mean() for i in idx])
    return out


# --- what netem would draw ---------------------------------------------------------------------


def configured_delays(nic: str | Netem) -> np.ndarray:
    """The one-way delays (ms) netem draws for `nic`, as 4096 equally likely values, sorted.

    For a table distribution these are exactly the values `tabledist` can return (one per
    table entry, clipped at 0); for uniform jitter, 4096 evenly spaced quantiles of
    [delay - jitter, delay + jitter). Without jitter: the delay itself.
    """
    return delay_values_ns(_spec(nic)) / 1e6


def configured_quantile(nic: str | Netem, q: float) -> float:
    """The q-quantile (ms) of the one-way delay netem draws for `nic` (models.jitter_quantile)."""
    spec = _spec(nic)
    jitter_ms = spec.jitter_ns / 1e6
    value = spec.delay_ns / 1e6 + models.jitter_quantile(q, spec.distribution, jitter_ms)
    return max(value, 0.0)


def emulated_one_way(nic: str | Netem | None, n: int, seed: int = 0, nbytes: int = 8) -> np.ndarray:
    """The one-way delays (ms) the emulated network itself gives the first `n` pings of
    `ping_pong` (rank 0 -> rank 1 of a 2-node cluster with this seed): the draws of rank 0's
    egress link model, replayed here with the backend's seed and link id.

    Everything random in the emulator is seeded, so these are exactly the delays the pings
    were held for; a measured delay is this plus the machine's own noise, never less.
    """
    spec = _spec(nic)
    if spec.is_noop:
        return np.zeros(n)
    link = LinkModel(spec, seed=seed, link_id=(0, 1, 0), reverse_delay_ns=spec.delay_ns)
    return link.one_way_delays(n, 0, 10**10, nbytes=nbytes) / 1e6


# --- rank bodies -------------------------------------------------------------------------------


def _ping_pong(n: int) -> dict:
    """Rank 0 pings rank 1, which answers at once. Rank 1 returns the one-way delays of the
    pings (receive time minus the send stamp carried in the message, on the shared clock),
    rank 0 the round-trip times; in seconds."""
    import torch
    import torch.distributed as dist

    from ..clock import now

    rank = dist.get_rank()
    stamp = torch.zeros(1, dtype=torch.float64)
    one_way, rtt = [], []
    dist.barrier()
    for _ in range(n):
        if rank == 0:
            t = now()
            stamp[0] = t
            dist.send(stamp, 1)
            dist.recv(stamp, 1)
            rtt.append(now() - t)
        elif rank == 1:
            dist.recv(stamp, 0)
            one_way.append(now() - float(stamp[0]))
            dist.send(stamp, 0)
    return {"one_way": one_way, "rtt": rtt}


def _sweep(sizes: list[int], repeats: int) -> list:
    """Rank 0 sends one message of every size (repeated, sizes interleaved) to rank 1, which
    stamps its arrival and acknowledges with 8 bytes, so that every message finds an empty
    queue. Rank 1 returns [size index, one-way seconds] pairs."""
    import torch
    import torch.distributed as dist

    from ..clock import now

    rank = dist.get_rank()
    buffers = [torch.zeros(max(1, n // 8), dtype=torch.float64) for n in sizes]
    ack = torch.zeros(1, dtype=torch.float64)
    out = []
    dist.barrier()
    for _ in range(repeats):
        for i, x in enumerate(buffers):
            if rank == 0:
                x[0] = now()
                dist.send(x, 1)
                dist.recv(ack, 1)
            elif rank == 1:
                dist.recv(x, 0)
                out.append((i, now() - float(x[0])))
                dist.send(ack, 0)
    return out


def _stream(senders: list[int], receivers: list[int], count: int, nbytes: int,
            pace_s: float) -> list[float]:
    """Every sender hands `count` messages of `nbytes` to TCP on a fixed schedule, one every
    `pace_s` (catching up at once if this machine held it back), to its receiver; the
    receivers return the arrival time of each message, the senders [their start] (seconds).

    The schedule is absolute, so a sender that the operating system delays for a moment
    does not lose its share of the NIC: its long-run offered rate is exactly nbytes/pace_s.
    """
    import torch
    import torch.distributed as dist

    from ..clock import monotonic_ns, now, sleep_until

    rank = dist.get_rank()
    x = torch.zeros(max(1, nbytes // 4))
    arrivals: list[float] = []
    dist.barrier()
    start = monotonic_ns()
    if rank in senders:
        peer = receivers[senders.index(rank)]
        works = []
        arrivals.append(now())  # a sender returns the time its first message left
        for k in range(count):
            sleep_until(start + int(k * pace_s * 1e9))
            works.append(dist.isend(x, peer))
        for w in works:
            w.wait()
    elif rank in receivers:
        peer = senders[receivers.index(rank)]
        for _ in range(count):
            dist.recv(x, peer)
            arrivals.append(now())
    dist.barrier()
    return arrivals


def tcp_after_idle(sizes, alpha: float, beta: float, mss: int, initial_window: int) -> dict:
    """A sketch of what a Linux TCP connection adds when its window starts at the initial
    window: a new connection, or one idle for many RTOs (net.ipv4.tcp_slow_start_after_idle=1
    halves the window once per RTO of idle time, tcp_cwnd_restart, down to the initial
    window; a shorter idle leaves more). The window doubles every round trip (2 alpha), until
    it holds the bandwidth-delay product; beyond
    that the sender is rate-limited and the extra round trips stop growing. No loss, receiver
    window not limiting. Returns sizes, extra_rounds (round trips beyond the emulator's one
    burst) and seconds (alpha + n beta + extra_rounds x 2 alpha), next to the emulator's
    alpha + n beta."""
    n = np.asarray(sizes, dtype=float)
    rtt = 2 * alpha
    bdp = rtt / beta  # bytes in flight at line rate
    rounds = np.maximum(0, np.ceil(np.log2(np.minimum(n, bdp) / (initial_window * mss) + 1)) - 1)
    return {"sizes": n, "extra_rounds": rounds, "seconds": alpha + n * beta + rounds * rtt}


# --- (a) the noise floor ---------------------------------------------------------------------


def noise_floor(samples: int = 300, timer_samples: int = 200, seed: int = 0) -> dict:
    """This machine's own one-way latency (plain Gloo, nic=None) and its timer overshoot.

    Returns one_way_ms (array), rtt_ms, percentiles {p1, p50, p90, p99, ...} of the one-way
    latency in ms, timer_overshoot_us (clusterlab.doctor: how late a 1 ms sleep wakes up,
    p50 / p99 / max), smallest_faithful_delay_ms and added_p99_ms (`doctor.faithful_floor`,
    measured as `clusterlab doctor` measures them; the floor is None when no candidate
    passed).
    """
    with Cluster(nodes=2, nic=None, seed=seed) as cl:
        out = cl.run(_ping_pong, samples)
    one_way = np.array(out[1]["one_way"]) * 1e3
    overshoot = doctor.timer_overshoot_us(timer_samples)
    pct = percentiles(one_way)
    floor = doctor.faithful_floor()
    floor_us = floor["smallest_faithful_delay_us"]
    return {"one_way_ms": one_way, "rtt_ms": np.array(out[0]["rtt"]) * 1e3, "percentiles": pct,
            "timer_overshoot_us": overshoot,
            "smallest_faithful_delay_ms": None if floor_us is None else floor_us / 1e3,
            "added_p99_ms": floor["added_p99_us"] / 1e3}


# --- (b) ping-pong and jitter ----------------------------------------------------------------


def ping_pong(nic: str | None = "delay 4ms", samples: int = 300, seed: int = 0,
              timeout: float = 60) -> dict:
    """Ping-pong between two nodes whose NICs both apply `nic` (so a round trip crosses it
    twice). Returns nic, one_way_ms and rtt_ms (arrays), percentiles of both (ms),
    configured_ms (the 4096 delays netem draws for this spec, for an overlay), configured
    {p1, p50, p90, p99}: the spec's own quantiles, emulated_ms (`emulated_one_way`: the delay
    the network drew for each ping) with its percentiles "emulated", and noise_ms =
    one_way_ms - emulated_ms, what this machine added (>= 0)."""
    with Cluster(nodes=2, nic=nic, seed=seed, timeout=timeout) as cl:
        out = cl.run(_ping_pong, samples)
    one_way = np.array(out[1]["one_way"]) * 1e3
    rtt = np.array(out[0]["rtt"]) * 1e3
    configured = {f"p{q:g}": configured_quantile(nic, q / 100) if nic else 0.0
                  for q in PERCENTILES}
    emulated = emulated_one_way(nic, samples, seed)
    return {"nic": nic, "one_way_ms": one_way, "rtt_ms": rtt,
            "percentiles": percentiles(one_way), "rtt_percentiles": percentiles(rtt),
            "configured_ms": configured_delays(nic) if nic else np.zeros(4096),
            "configured": configured, "emulated_ms": emulated,
            "emulated": percentiles(emulated), "noise_ms": one_way - emulated}


def jitter_distributions(delay: str = "4ms", jitter: str = "1ms",
                         distributions=("uniform", "normal", "pareto"), samples: int = 300,
                         seed: int = 0, include_none: bool = True) -> dict:
    """`ping_pong` without jitter ("none", unless include_none is False), then with `jitter`
    drawn from each distribution.

    Returns {name: ping_pong result}; the spec of each is in result["nic"]."""
    out = {"none": ping_pong(f"delay {delay}", samples, seed)} if include_none else {}
    for name in distributions:
        spec = f"delay {delay} {jitter}" + ("" if name == "uniform" else f" distribution {name}")
        out[name] = ping_pong(spec, samples, seed)
    return out


def _dilated(result: dict, nic: str, k: int) -> dict:
    """A `ping_pong` result run at k times `nic`'s delay and jitter, put back on `nic`'s time
    scale: every time divided by k (the network's draws scale with the spec; what this
    machine adds does not, so it shrinks k-fold), the configured distribution that of `nic`."""
    if k == 1:
        return result
    one_way, rtt = result["one_way_ms"] / k, result["rtt_ms"] / k
    emulated = result["emulated_ms"] / k
    return {**result, "nic": nic, "dilation": k, "one_way_ms": one_way, "rtt_ms": rtt,
            "percentiles": percentiles(one_way), "rtt_percentiles": percentiles(rtt),
            "configured_ms": configured_delays(nic),
            "configured": {f"p{q:g}": configured_quantile(nic, q / 100) for q in PERCENTILES},
            "emulated_ms": emulated, "emulated": percentiles(emulated),
            "noise_ms": one_way - emulated}


def jitter_dilated(delay_ms: float = 4.0, jitter_ms: float = 1.0,
                   distributions=("uniform", "normal", "pareto"), samples: int = 200,
                   seed: int = 0, share: float = 0.5, limit: int = 8) -> dict:
    """`jitter_distributions` at a dilation this machine's noise does not dominate.

    First a jitter-free ping-pong measures what this machine adds (the p99 of its noise);
    then every spec runs at k times its delay and jitter, with k the smallest integer at which
    that p99 divided by k is at most `share` x the jitter (capped at `limit`: a busier
    machine would make the run too slow), and its times are divided by k (`_dilated`).
    Returns {"runs": {name: ping_pong result on the undilated time scale, "none" first},
    "k", "wanted" (k before the cap), "capped", "noise_p99_ms" (the first measurement, at
    k = 1), "noise_p99_dilated_ms" (the largest p99 of the machine's additions over the
    dilated runs, jitter-free and jittered, divided by k),
    "target_ms" (share x the jitter: the plan for that p99) and "busy" (None when the plan
    held, else a phrase for `conclude(busy=...)` saying how it was missed)}."""
    base = f"delay {delay_ms:g}ms"
    probe = ping_pong(base, samples, seed)
    noise = float(np.percentile(probe["noise_ms"], 99))
    wanted = max(1, int(np.ceil(noise / (share * jitter_ms))))
    k = min(wanted, limit)
    specs = {"none": base}
    for name in distributions:
        table = "" if name == "uniform" else f" distribution {name}"
        specs[name] = f"{base} {jitter_ms:g}ms{table}"
    runs = {}
    for name, spec in specs.items():
        if name == "none" and k == 1:
            runs[name] = probe
            continue
        dilated = f"delay {delay_ms * k:g}ms" + spec[len(base):].replace(
            f" {jitter_ms:g}ms", f" {jitter_ms * k:g}ms", 1)
        runs[name] = _dilated(ping_pong(dilated, samples, seed), spec, k)
    target = share * jitter_ms
    dilated_noise = max(float(np.percentile(r["noise_ms"], 99)) for r in runs.values())
    busy = (f"this machine's noise p99 {noise:.1f} ms needed K = {wanted}, capped at {k}"
            if wanted > limit else
            f"this machine's noise exceeded the plan (p99 up to {dilated_noise:.2f} ms after "
            f"dilation, against {target:.2f} ms planned)" if dilated_noise > target else None)
    return {"runs": runs, "k": k, "wanted": wanted, "capped": wanted > limit,
            "noise_p99_ms": noise, "noise_p99_dilated_ms": dilated_noise, "target_ms": target,
            "busy": busy}


# --- (c) message size and the alpha-beta model ----------------------------------------------


DEFAULT_SIZES = tuple(KIB << k for k in range(14))  # 1 KiB .. 8 MiB


def size_sweep(nic: str = "delay 2ms rate 1gbit", sizes=DEFAULT_SIZES, repeats: int = 5,
               seed: int = 0, timeout: float = 60) -> dict:
    """One-way time of messages of every size through `nic`, and the alpha-beta fit.

    Returns nic, sizes (bytes), times_ms [repeat, size], median_ms and best_ms [size] (the
    median and the minimum over repeats), fit (AlphaBetaFit on best_ms: alpha s, beta s/byte,
    r2), configured_alpha (the delay, s),
    configured_beta (1/rate in s/byte, with TCP/IP headers per 64 KiB segment),
    crossover_bytes (fitted n* = alpha/beta), configured_crossover_bytes, and
    latency_share [size]: the fitted alpha's share of each size's predicted time.

    Why the minimum: with no jitter configured every repeat of a size is held for the same
    emulated time, and this machine's noise only adds to it, so the fastest repeat is the
    best estimate of the network's time (the usual practice for latency benchmarks).
    """
    sizes = [int(n) for n in sizes]
    spec = _spec(nic)
    with Cluster(nodes=2, nic=nic, seed=seed, timeout=timeout) as cl:
        pairs = cl.run(_sweep, sizes, repeats)[1]
    times = np.zeros((repeats, len(sizes)))
    filled = np.zeros(len(sizes), dtype=int)
    for i, seconds in pairs:
        times[filled[i], i] = seconds * 1e3
        filled[i] += 1
    median = np.median(times, axis=0)
    best = times.min(axis=0)
    fit = models.fit_alpha_beta(sizes, best / 1e3)
    beta = wire_beta(spec.rate_bps)
    n = np.array(sizes, dtype=float)
    return {
        "nic": nic,
        "sizes": np.array(sizes),
        "times_ms": times,
        "median_ms": median,
        "best_ms": best,
        "fit": fit,
        "configured_alpha": spec.delay_s,
        "configured_beta": beta,
        "crossover_bytes": fit.alpha / fit.beta if fit.beta > 0 else float("inf"),
        "configured_crossover_bytes": spec.delay_s / beta if beta else float("inf"),
        "latency_share": fit.alpha / (fit.alpha + n * fit.beta),
    }


# --- (d) loss and retransmission tails ----------------------------------------------------------


def rate_interval(k: int, n: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a rate from k events in n trials (scipy's binomtest)."""
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def loss_tails(delay: str = "1ms", losses=(0, 1, 5), samples: int = 300, seed: int = 0) -> dict:
    """Ping-pong through `delay D loss P%` for every P in `losses` (percent).

    Returns {P: ping_pong result plus rto_delayed (pings whose one-way delay exceeds the
    delay by more than half the minimum RTO, i.e. that waited for a retransmission timeout),
    emulated_rto (how many of the network's own draws, `emulated_one_way`, did: the
    measured count can only be higher, when this machine stalls for > 100 ms),
    rto_delayed_rtt (the same for round trips, which cross two lossy links),
    expected_rto (samples x P/100: a single-segment message has no later segments to trigger
    a fast retransmit, so every loss costs a timeout), loss_ci (`rate_interval` of the
    emulated timeouts: the loss rate they imply), p99_gap (None, or the two sorted delays
    numpy's p99 would interpolate between when one is a timeout and the other not),
    late_ms (D + 0.5 ms, D + RTO/2): the band where the network draws nothing, late (how
    many measured pings fell in it: this machine held them up, since the backend releases a
    ping at its draw and one ping is in flight at a time, so none waits behind a lost one),
    late_ci (`rate_interval` of late) and late_max (ms, NaN if none)}.
    """
    out = {}
    d_ms = _spec(f"delay {delay}").delay_ns / 1e6
    threshold = d_ms + RTO_MIN_MS / 2
    for p in losses:
        r = ping_pong(f"delay {delay} loss {p:g}%", samples, seed, timeout=120)
        one_way, n = r["one_way_ms"], len(r["one_way_ms"])
        r["loss_percent"] = p
        r["rto_delayed"] = int((one_way > threshold).sum())
        r["emulated_rto"] = int((r["emulated_ms"] > threshold).sum())
        r["rto_delayed_rtt"] = int((r["rtt_ms"] > 2 * d_ms + RTO_MIN_MS / 2).sum())
        r["expected_rto"] = samples * p / 100
        r["loss_ci"] = rate_interval(r["emulated_rto"], n)
        d = np.sort(one_way)
        below, above = d[int(np.floor(0.99 * (n - 1)))], d[int(np.ceil(0.99 * (n - 1)))]
        r["p99_gap"] = (float(below), float(above)) if (below > threshold) != (above > threshold) \
            else None
        r["late_ms"] = (d_ms + 0.5, threshold)
        late = (one_way > d_ms + 0.5) & (one_way < threshold)
        r["late"] = int(late.sum())
        r["late_ci"] = rate_interval(r["late"], n)
        r["late_max"] = float(one_way[late].max()) if late.any() else float("nan")
        out[p] = r
    return out


# --- (e) NIC contention ------------------------------------------------------------------------


def _goodputs(out: list[list[float]], senders: list[int], receivers: list[int], count: int,
              nbytes: int, shared_nic: bool) -> dict:
    """Goodputs of parallel streams (bytes/s), from `_stream`'s results.

    share: per stream, what it received while every stream was receiving: its messages that
      arrived in the window (the latest first arrival, the earliest last arrival], times
      nbytes, over the window's length. Each stream's figure comes from its own arrivals;
      a sender that this machine started late does not inflate it, and the shares add up to
      what the NIC carried in the window. NaN (for every stream) when the window holds fewer
      than 4 messages per stream: too short to tell the streams' shares apart.
    completion: per stream, count x nbytes / (its last arrival - its sender's start).
    per_process: the mean of `share` when the streams share one NIC (`shared_nic`), otherwise
      the mean of `completion` (a stream alone on its NIC).
    nic: the bytes of all streams over the time from the first send to the last arrival (for
      a shared NIC, its aggregate goodput: a check that it stayed busy, not a share).
    window_messages: how many messages arrived in the window.
    """
    times = [np.asarray(out[r]) for r in receivers]
    starts = [out[s][0] for s in senders]
    first, last = max(t[0] for t in times), min(t[-1] for t in times)
    counts = np.array([int(((t > first) & (t <= last)).sum()) for t in times])
    if last > first and counts.sum() >= 4 * len(times):
        share = counts * nbytes / (last - first)
    else:
        share = np.full(len(times), np.nan)
    total = count * nbytes
    completion = np.array([total / (t[-1] - s) for s, t in zip(starts, times)])
    nic = len(times) * total / (max(t[-1] for t in times) - min(starts))
    per_process = float(np.mean(share)) if shared_nic else float(np.mean(completion))
    return {"per_process": per_process, "share": share, "completion": completion,
            "nic": float(nic), "window_messages": int(counts.sum())}


def nic_contention(rate: str = "100mbit", procs=(1, 2, 4), nbytes: int = 256 * KIB,
                   count: int = 24, seed: int = 0, timeout: float = 60) -> dict:
    """P processes on one node stream to P processes on another through one NIC of `rate`.

    For every P in `procs`: P senders and P receivers with every process on its own node, so
    each sender has a NIC of its own ("own": one Cluster(nodes=2 max(P)) serves every P),
    and, for P > 1, Cluster(nodes=2, procs_per_node=P, nic="rate R") with process i of node 0
    sending to process i of node 1 through node 0's single NIC queue ("shared"; for P = 1
    the two layouts are the same thing, and "shared" is the "own" measurement).
    Every NIC is offered four times its rate (`_stream` on a fixed schedule: a sender alone
    on its NIC offers 4x the rate, each of P senders sharing one NIC 4/P x), so every NIC stays
    busy and the shared NIC's FIFO queue interleaves the senders' messages for most of the
    run, whichever sender this machine started first.
    Returns rate_Bps (payload bytes/s the NIC can carry, after TCP/IP headers) and rows
    {P: {"shared": goodputs, "own": goodputs}}, goodputs as `_goodputs` (bytes/s: share,
    completion, per_process, nic).
    """
    spec = _spec(f"rate {rate}")
    payload_rate = 1 / wire_beta(spec.rate_bps)
    # every sender offers 4x what a NIC carries
    pace = wire_seconds(nbytes, rate_bps=spec.rate_bps) / 4
    procs = list(procs)
    widest = max(procs)
    rows: dict = {p: {} for p in procs}
    with Cluster(nodes=2 * widest, nic=spec, seed=seed, timeout=timeout) as cl:
        for p in procs:  # sender i on node i, receiver i on node widest + i
            senders, receivers = list(range(p)), list(range(widest, widest + p))
            out = cl.run(_stream, senders, receivers, count, nbytes, pace)
            rows[p]["own"] = _goodputs(out, senders, receivers, count, nbytes, False)
    for p in procs:
        if p == 1:
            rows[p]["shared"] = rows[p]["own"]
            continue
        senders, receivers = list(range(p)), list(range(p, 2 * p))
        with Cluster(nodes=2, procs_per_node=p, nic=spec, seed=seed, timeout=timeout) as cl:
            out = cl.run(_stream, senders, receivers, count, nbytes, p * pace)
        rows[p]["shared"] = _goodputs(out, senders, receivers, count, nbytes, True)
    return {"rate": rate, "rate_Bps": payload_rate, "nbytes": nbytes, "count": count,
            "rows": rows}


def _loaded_pings(bulk: tuple[int, int], ping: tuple[int, int], bulk_count: int, nbytes: int,
                  bulk_pace_s: float, pings: int, spacing_s: float) -> list[float]:
    """`bulk[0]` streams `bulk_count` messages of `nbytes` to `bulk[1]`, one every
    `bulk_pace_s`, while `ping[0]` pings `ping[1]` every `spacing_s`; the ping's receiver
    returns their one-way delays (s)."""
    import torch
    import torch.distributed as dist

    from ..clock import monotonic_ns, now, sleep_until

    rank = dist.get_rank()
    x = torch.zeros(max(1, nbytes // 4))
    stamp = torch.zeros(1, dtype=torch.float64)
    one_way: list[float] = []
    dist.barrier()
    start = monotonic_ns()
    if rank == bulk[0]:  # offers a little less than the NIC's rate, on a fixed schedule
        works = []
        for k in range(bulk_count):
            sleep_until(start + int(k * bulk_pace_s * 1e9))
            works.append(dist.isend(x, bulk[1]))
        for w in works:
            w.wait()
    elif rank == bulk[1]:
        for _ in range(bulk_count):
            dist.recv(x, bulk[0])
    elif rank == ping[0]:
        for i in range(pings):
            sleep_until(start + int(i * spacing_s * 1e9))
            stamp[0] = now()
            dist.send(stamp, ping[1])
            dist.recv(stamp, ping[1])
    elif rank == ping[1]:
        for _ in range(pings):
            dist.recv(stamp, ping[0])
            one_way.append(now() - float(stamp[0]))
            dist.send(stamp, ping[0])
    dist.barrier()
    return one_way


def latency_under_load(nic: str = "delay 1ms rate 100mbit", nbytes: int = 256 * KIB,
                       pings: int = 40, spacing_s: float = 0.03, seed: int = 0,
                       timeout: float = 60) -> dict:
    """Small pings from one process of a node while another process of the same node keeps
    its NIC busy with bulk transfers (Cluster(nodes=2, procs_per_node=2, nic=nic)).

    Rank 0 streams to rank 2 (node 0 -> node 1), rank 1 pings rank 3 through the same NIC
    queue. Returns idle_ms and loaded_ms (the pings' one-way delays without and with the
    bulk stream), their percentiles, and message_ms: the time one bulk message occupies the
    NIC (its serialisation time), the scale of the queueing delay a ping can meet, and
    offered: the share of the NIC's rate the bulk sender offers (its busy fraction).
    Pings leave on a fixed schedule (every `spacing_s`, longer than a loaded round trip), so
    they sample the bulk stream at every phase; the bulk sender offers 1/1.1 of the NIC's
    rate on a fixed schedule too (so a moment's delay of this machine does not leave a
    backlog that never drains), for longer than the pings last.
    """
    spec = _spec(nic)
    message_s = wire_seconds(nbytes, rate_bps=spec.rate_bps)
    bulk_count = int(pings * spacing_s / (1.1 * message_s)) + 3 if message_s else 0
    args = (nbytes, 1.1 * message_s, pings, spacing_s)  # the NIC is busy ~90% of the time
    with Cluster(nodes=2, procs_per_node=2, nic=spec, seed=seed, timeout=timeout) as cl:
        idle = cl.run(_loaded_pings, (0, 2), (1, 3), 0, *args)[3]
        loaded = cl.run(_loaded_pings, (0, 2), (1, 3), bulk_count, *args)[3]
    idle_ms, loaded_ms = np.array(idle) * 1e3, np.array(loaded) * 1e3
    return {"nic": nic, "idle_ms": idle_ms, "loaded_ms": loaded_ms,
            "idle": percentiles(idle_ms), "loaded": percentiles(loaded_ms),
            "message_ms": message_s * 1e3, "bulk_count": bulk_count, "offered": 1 / 1.1}


# --- figures ------------------------------------------------------------------------------------


def plot_noise_floor(floor: dict, ax=None):
    """Histogram of this machine's native one-way latency (µs, log x axis)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    us = floor["one_way_ms"] * 1e3
    bins = np.logspace(np.log10(max(us.min(), 1)), np.log10(us.max() * 1.01), 40)
    ax.hist(us, bins=bins, color="#4C72B0")
    ax.set_xscale("log")
    for q, style in (("p50", "-"), ("p99", "--")):
        ax.axvline(floor["percentiles"][q] * 1e3, color="k", ls=style, lw=1, label=q)
    ax.set_xlabel("native one-way latency, plain Gloo on loopback (µs)")
    ax.set_ylabel("messages")
    ax.legend()
    return ax


def plot_jitter(results: dict, axes=None):
    """One histogram per result (density) with netem's configured distribution overlaid."""
    import matplotlib.pyplot as plt

    names = list(results)
    if axes is None:
        _, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3), sharey=False)
    axes = np.atleast_1d(axes)
    # the configured range plus a margin; slower (noisy) messages pile up in the last bin
    hi_all = max(float(r["configured_ms"].max()) for r in results.values()) * 1.25
    for ax, name in zip(axes, names):
        r = results[name]
        lo, hi = 0.0, hi_all
        if np.ptp(r["configured_ms"]) == 0:  # no jitter: zoom in, or it is one spike at D
            d = float(r["configured_ms"][0])
            lo, hi = 0.98 * d, max(float(r["percentiles"]["p99"]) * 1.02, 1.05 * d)
        bins = np.linspace(lo, hi, 60)
        ax.hist(np.clip(r["one_way_ms"], lo, hi), bins=bins, density=True, color="#4C72B0",
                alpha=0.7, label="measured")
        ax.hist(r["configured_ms"], bins=bins, density=True, histtype="step", color="#C44E52",
                lw=1.5, label="model (netem's configured)")
        ax.axvline(min(r["percentiles"]["p99"], hi), color="k", ls="--", lw=1,
                   label="measured p99")
        ax.set_title(name + (" (zoomed in)" if lo else ""), fontsize=10)
        ax.set_xlabel(f"one-way delay (ms, clipped at {hi:.3g})")
    axes[0].set_ylabel("density")
    axes[0].legend(fontsize=7)
    return axes


def plot_tail_split(results: dict, ax=None, q: float = 0.99):
    """Per result, its measured q-quantile split into the network's part (the quantile of the
    delays the network drew, replayed from the seed) and how far this machine moved it (a
    difference of quantiles, not the quantile of what it added), with the quantile's
    distribution-free 95 % interval (an arrow where it is open above)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 2.8))
    names = list(results)
    for i, name in enumerate(names):
        t = tail_split(results[name], q)
        ax.barh(i, t["network"], color="#4C72B0", label="the network's draws" if i == 0 else None)
        ax.barh(i, max(t["machine_extra"], 0), left=t["network"], color="#DD8452",
                label="how far this machine moved it" if i == 0 else None)
        lo, hi = t["measured_ci"]
        top = hi if np.isfinite(hi) else t["measured"] * 1.08
        ax.plot([lo, top], [i, i], color="k", lw=1, label="95% interval" if i == 0 else None)
        if not np.isfinite(hi):
            ax.annotate("", xy=(top, i), xytext=(lo, i),
                        arrowprops={"arrowstyle": "->", "color": "k", "lw": 1})
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel(f"p{100 * q:g} of the one-way delay (ms)")
    ax.legend(fontsize=7, loc="lower right")
    return ax


def plot_sweep(sweep: dict, axes=None):
    """Left: one-way time vs size (log-log) with the alpha-beta fit and n*. Right: effective
    bandwidth n / t vs size, which reaches half the fitted bandwidth at n*."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    n = sweep["sizes"].astype(float)
    fit = sweep["fit"]
    grid = np.logspace(np.log10(n.min()), np.log10(n.max()), 200)
    star = sweep["crossover_bytes"]
    ax = axes[0]
    for i, row in enumerate(sweep["times_ms"]):
        ax.plot(n, row, ".", color="#4C72B0", alpha=0.4, label="each repeat" if i == 0 else None)
    ax.plot(n, sweep["best_ms"], "o", color="#4C72B0", label="measured (best of repeats)")
    ax.plot(grid, (fit.alpha + grid * fit.beta) * 1e3, "-", color="#C44E52",
            label=f"fit: α={fit.alpha * 1e3:.2f} ms, 1/β={fit.bandwidth * 8 / 1e9:.2f} Gbit/s")
    ax.plot(grid, np.full_like(grid, fit.alpha * 1e3), ":", color="gray", label="α alone")
    ax.plot(grid, grid * fit.beta * 1e3, "--", color="gray", label="nβ alone")
    ax.axvline(star, color="k", lw=1)
    ax.text(star, 0.04, " n* = α/β", fontsize=8, transform=ax.get_xaxis_transform())
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title("one-way time against message size", fontsize=10)
    ax.set_ylim(bottom=0.3 * float(sweep["best_ms"].min()))
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("one-way time (ms)")
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot(n, n / (sweep["best_ms"] / 1e3) * 8 / 1e6, "o", color="#4C72B0", label="measured")
    ax.plot(grid, grid / (fit.alpha + grid * fit.beta) * 8 / 1e6, "-", color="#C44E52",
            label="α-β model")
    ax.axhline(fit.bandwidth * 8 / 1e6, color="gray", ls="--", label="1/β")
    ax.axvline(star, color="k", lw=1)
    ax.set_title("effective bandwidth: half of 1/β at n*", fontsize=10)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("effective bandwidth (Mbit/s)")
    ax.legend(fontsize=7)
    return axes


def plot_loss(tails: dict, ax=None):
    """Sorted one-way delays (a quantile plot, log y) for every loss rate: the network's own
    draws for the pings (`emulated_ms`, coloured) and the measured delays (thin grey), so
    that what lies between them is this machine's addition."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.4))
    for i, (p, r) in enumerate(tails.items()):
        q = (np.arange(len(r["one_way_ms"])) + 0.5) / len(r["one_way_ms"]) * 100
        if "emulated_ms" in r:
            ax.plot(q, np.sort(r["emulated_ms"]), color=f"C{i}", lw=2,
                    label=f"loss {p:g}%: network alone")
        ax.plot(q, np.sort(r["one_way_ms"]), color="0.55", lw=1, ls=("-", "--", ":")[i % 3],
                label=f"loss {p:g}%: measured")
    ax.axhline(RTO_MIN_MS, color="k", ls="-.", lw=0.8, label="minimum RTO (200 ms)")
    ax.set_yscale("log")
    ax.set_xlim(50, 100)
    ax.set_xlabel("percentile (from the median up)")
    ax.set_ylabel("one-way delay (ms)")
    ax.legend(fontsize=7, ncol=2)
    return ax


def plot_contention(result: dict, ax=None):
    """Goodput of each process (Mbit/s, dots; bars: their mean) for P processes sharing one
    NIC (`share`: from each stream's own arrivals) and with each on its own NIC."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.4))
    rate = result["rate_Bps"] * 8 / 1e6
    ps = list(result["rows"])
    x = np.arange(len(ps))
    for dx, key, field, color, label in (
            (-0.2, "own", "completion", "#55A868", "each process on its own node"),
            (0.2, "shared", "share", "#C44E52", "P processes share one NIC")):
        per = [np.asarray(result["rows"][p][key][field if p > 1 else "completion"]) * 8 / 1e6
               for p in ps]
        ax.bar(x + dx, [float(np.mean(v)) for v in per], 0.4, color=color, alpha=0.6,
               label=label + " (mean)")
        for xi, v in zip(x, per):  # one dot per process, spread across its bar
            ax.plot(xi + dx + np.linspace(-0.12, 0.12, len(v)) * (len(v) > 1), v, "o",
                    color="k", ms=3.5, zorder=3,
                    label="each process" if (xi, key) == (x[-1], "shared") else None)
    ax.hlines([rate / p for p in ps], x + 0.02, x + 0.38, colors="#1f3b73", linestyles="--",
              lw=1.2, label="rate / P")
    ax.set_xticks(x, [f"P = {p}" for p in ps])
    ax.set_ylabel("goodput per process (Mbit/s)")
    ax.axhline(rate, color="gray", ls=":", lw=1)
    ax.set_ylim(0, rate * 1.45)
    ax.legend(fontsize=7, ncol=2, loc="upper center", frameon=False)
    return ax


__all__ = [
    "configured_delays",
    "configured_quantile",
    "emulated_one_way",
    "jitter_dilated",
    "jitter_distributions",
    "latency_under_load",
    "loss_tails",
    "nic_contention",
    "noise_floor",
    "percentiles",
    "ping_pong",
    "quantile_ci",
    "slowest_of",
    "tail_split",
    "plot_contention",
    "plot_jitter",
    "plot_loss",
    "plot_noise_floor",
    "plot_sweep",
    "size_sweep",
]
