"""What notebook 01 (a link: latency, bandwidth and the α-β model) reads from its runs: the
ping-pong, the message-size sweep, the real-cluster notes and the noise-floor appendix.

Each function takes what `clusterlab.experiments.links` returned and draws the figure,
prints the sentences or checks the claims the notebook makes.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter

from clusterlab import facts
from clusterlab.experiments import links
from clusterlab.experiments.common import load_per_core
from clusterlab.lessons import show


def plot_ping_pong(pp: dict, *, delay_ms: float, top: float = 9.5) -> None:
    """The ping-pong's histogram: one-way delays (shared clock) and round trips (sender's
    clock) against the configured delay per NIC; pings slower than `top` ms are drawn at
    the right edge."""
    fig, ax1 = plt.subplots(figsize=(6, 3))
    bins = np.linspace(delay_ms - 0.1, top, 60)
    ax1.hist(np.clip(pp["one_way_ms"], 0, top), bins=bins, color="#4C72B0",
             label="one-way (shared clock)")
    ax1.hist(np.clip(pp["rtt_ms"], 0, top), bins=bins, color="#DD8452",
             label="round trip (sender's clock)")
    ax1.axvline(delay_ms, color="#C44E52", ls="--", lw=1,
                label=f"configured {delay_ms:g} ms per NIC")
    ax1.set_xlabel(f"ms (anything slower is drawn at {top:.1f})")
    ax1.set_ylabel("pings")
    ax1.set_title(f"delay {delay_ms:g}ms on every NIC", fontsize=10)
    ax1.legend(fontsize=8)
    plt.tight_layout()
    plt.show()


def late_round_trips(rtt_ms, *, delay_ms: float):
    """The late tail of a ping-pong: which round trips took 1 ms or more over 2 x the delay
    (a boolean array), and that threshold in ms."""
    late_ms = 2 * delay_ms + 1
    return np.asarray(rtt_ms) >= late_ms, late_ms


def explain_ping_pong(pp: dict, *, delay_ms: float) -> None:
    """The ping-pong in three lines: one-way median and fastest against the configured
    delay (and how far the median is off), the round trip's, and the late tail (round trips
    1 ms or more over 2 x the delay). Checks that no message beats the delay, that the
    fastest round trip is two fastest one-way trips and that the median stays near the
    delay."""
    ow, rtt, pings = pp["percentiles"], pp["rtt_percentiles"], len(pp["rtt_ms"])
    off = ow["p50"] / delay_ms - 1
    late, late_ms = late_round_trips(pp["rtt_ms"], delay_ms=delay_ms)
    print(f"one-way: median {ow['p50']:.3f} ms, fastest {ow['min']:.3f} ms   (configured "
          f"{delay_ms:g} ms; median {off:+.1%} off)")
    print(f"RTT:     median {rtt['p50']:.3f} ms, fastest {rtt['min']:.3f} ms   (configured 2 x "
          f"{delay_ms:g} ms)")
    print(f"late tail: {late.sum()} of {pings} round trips ({late.mean():.1%}) took {late_ms:g} ms "
          f"or more; the slowest took {np.max(pp['rtt_ms']):.3f} ms")
    assert ow["min"] >= delay_ms, "no message can beat the configured delay"
    assert rtt["min"] >= 2 * delay_ms, "a round trip crosses both NICs"
    assert abs(rtt["min"] / ow["min"] - 2) < 0.2, \
        "the fastest round trip is two fastest one-way trips"
    assert np.all(np.asarray(pp["one_way_ms"]) >= np.asarray(pp["emulated_ms"]) - 1e-3), \
        "measured = emulated + noise >= emulated"
    assert ow["p50"] < 1.5 * delay_ms, "the median is the delay, plus a little"


def plot_sweep(sweep: dict) -> None:
    """The size sweep's figure (`links.plot_sweep`): measured times against the α-β fit, and
    the effective bandwidth."""
    links.plot_sweep(sweep)
    plt.tight_layout()
    plt.show()


def plot_tcp_after_idle(idle: dict, *, alpha: float, beta: float) -> None:
    """The sketch of Linux TCP starting from its initial window (`links.tcp_after_idle`: a
    new connection, or one idle for many RTOs) in its own figure: the emulator's α + nβ
    against the sketch (dash-dotted), with the size it slows most marked in KiB and kB."""
    n = idle["sizes"]
    w = int(np.argmax(idle["seconds"] / (alpha + n * beta)))
    fig, ax = plt.subplots(figsize=(6, 2.8))
    ax.plot(n, (alpha + n * beta) * 1e3, "-", color="#C44E52", label="α + nβ (the emulator)")
    ax.plot(n, idle["seconds"] * 1e3, "-.", color="#8172B2",
            label="Linux TCP from the initial window (sketch, not measured)")
    ax.plot([n[w]] * 2, [(alpha + n[w] * beta) * 1e3, idle["seconds"][w] * 1e3], "o:",
            color="k", ms=4, label=f"{n[w] / 1024:.0f} KiB ({n[w] / 1e3:.0f} kB): worked below")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("one-way time (ms)")
    ax.set_title("What slow start from the initial window would add (a sketch)", fontsize=10)
    ax.legend(fontsize=7)
    plt.tight_layout()
    plt.show()


def explain_tcp_after_idle(idle: dict, *, alpha: float, beta: float, first_window: float) -> None:
    """The size the sketch slows most, in one line (its time with and without the extra round
    trips), worked through behind a fold: the congestion windows it sends, one per round trip,
    doubling from the initial window (`first_window` bytes), and how many more round trips
    that is than the emulator's one burst. Checks that the smallest size needs no extra round
    trip and the largest does."""
    n, extra = idle["sizes"], idle["extra_rounds"]
    w = int(np.argmax(idle["seconds"] / (alpha + n * beta)))
    windows = first_window * 2.0 ** np.arange(int(extra[w]) + 1) / 1e3
    k = int(extra[w])
    print(f"slowed most (a rough sketch, not measured): {n[w] / 1024:.0f} KiB takes "
          f"{idle['seconds'][w] * 1e3:.1f} ms from TCP's initial window instead of "
          f"{(alpha + n[w] * beta) * 1e3:.1f} ms: {k} round trips more")
    show.fold("Window by window",
              f"The window starts at {windows[0]:.1f} kB and doubles every round trip: "
              f"{', '.join(f'{x:.1f}' for x in windows[:-1])} kB, {windows[:-1].sum():.0f} kB "
              f"sent in {k} round trips; the rest of the {n[w] / 1e3:.0f} kB goes in round trip "
              f"{k + 1}. So {k} round trips more than the emulator's one burst, "
              f"{2 * alpha * 1e3:g} ms each.")
    assert extra[0] == 0 and extra[-1] > 0
    assert windows[:-1].sum() < n[w] / 1e3 <= windows.sum(), "the last window completes it"


def frame_layout() -> dict:
    """One Ethernet frame at MTU 1500 B on the wire, in bytes and in order, from the ledger:
    preamble and SFD, Ethernet header, IPv4 header, TCP header with the timestamps option,
    the TCP payload left (the MSS Linux advertises, MTU - IPv4 - 20 B of TCP header, minus
    the 12 B timestamp option), FCS and the inter-frame gap."""
    def v(key):
        return facts.get(key).value
    ip, tcp = v("ipv4.header_bytes"), v("tcp.header_with_timestamps_bytes")
    return {"preamble+SFD": v("ethernet.preamble_sfd_bytes"),
            "Ethernet header": v("ethernet.header_bytes"), "IPv4": ip, "TCP": tcp,
            "payload": v("ethernet.mtu_bytes") - ip - tcp, "FCS": v("ethernet.fcs_bytes"),
            "gap": v("ethernet.ifg_bytes")}


def effective_mbit(sizes, best_ms):
    """Effective bandwidth of each message, in Mbit/s: its bits over its fastest time."""
    return np.asarray(sizes) * 8 / (np.asarray(best_ms) / 1e3) / 1e6


def explain_sweep(sweep: dict, *, show_details: bool = False) -> None:
    """The α-β fit against the configured link (how far α lies off, in µs, and the worst
    residual), n* fitted and configured, the effective bandwidth at 1 KiB, 64 KiB and 8 MiB,
    and, with `show_details`, how late the smallest message was against the configured α + nβ
    (this machine's excess read directly) and why the fitted α differs: it comes from every
    size's excess (their range is printed), since what all sizes share moves a line's
    intercept. Checks that the fitted α's excess is exactly the least-squares weights
    (summing to 1) times the sizes' excesses,
    that the fit recovers α, β and n* within 30% and that small messages are latency-bound,
    large ones bandwidth-bound."""
    fit = sweep["fit"]
    sizes, share = sweep["sizes"], sweep["latency_share"]
    eff = effective_mbit(sizes, sweep["best_ms"])
    extra_us = (fit.alpha - sweep["configured_alpha"]) * 1e6
    resid = np.max(np.abs(sweep["best_ms"] / ((fit.alpha + sizes * fit.beta) * 1e3) - 1))
    print(f"fit: α = {fit.alpha * 1e3:.3f} ms (configured {sweep['configured_alpha'] * 1e3:.1f}, "
          f"{extra_us:+.0f} µs), β = {fit.beta * 1e9:.3f} ns/byte (configured "
          f"{sweep['configured_beta'] * 1e9:.3f}); worst residual {resid:.1%} (the largest "
          "|fastest time / fitted line - 1| over the sizes)")
    print(f"n* = {sweep['crossover_bytes'] / 1e3:.0f} kB (configured "
          f"{sweep['configured_crossover_bytes'] / 1e3:.0f}); effective bandwidth {eff[0]:.1f} "
          f"Mbit/s at {sizes[0] // 1024} KiB, {eff[6]:.0f} at {sizes[6] // 1024} KiB, "
          f"{eff[-1]:.0f} at {sizes[-1] // 2**20} MiB")
    x = np.asarray(sizes, dtype=float)
    excess_us = (sweep["best_ms"] / 1e3 - sweep["configured_alpha"]
                 - x * sweep["configured_beta"]) * 1e6
    # the intercept of a least-squares line is sum(w * y) with these weights (sum 1, and
    # sum(w * x) = 0), so the fitted α's excess is sum(w * excess) exactly
    weights = 1 / len(x) - x.mean() * (x - x.mean()) / np.sum((x - x.mean()) ** 2)
    if show_details:
        print(f"details: the {sizes[0] // 1024} KiB message: {excess_us[0]:+.0f} µs against the "
              "configured α + nβ: what this machine added, read directly")
        print(f"details: the fitted α's {extra_us:+.0f} µs comes from every size's excess (here "
              f"{round(excess_us.min()) + 0:+d} to {round(excess_us.max()) + 0:+d} µs): what all "
              "sizes share moves a line's intercept, not its slope")
    assert abs(np.sum(weights * excess_us) - extra_us) < 0.01, "the intercept is sum(w * excess)"
    assert abs(fit.alpha - sweep["configured_alpha"]) <= 0.3 * sweep["configured_alpha"]
    assert abs(fit.beta - sweep["configured_beta"]) <= 0.3 * sweep["configured_beta"]
    assert abs(sweep["crossover_bytes"] / sweep["configured_crossover_bytes"] - 1) <= 0.3
    assert share[0] > 0.5 > share[-1], "small messages latency-bound, large ones bandwidth-bound"


# "On a real GPU cluster": the line rate, NCCL's α in its cost model, and RDMA, with NCCL's
# protocols, chunking, RoCE framing and congestion control behind a fold for notebook 02c (a
# `facts.show` template: [[id]] renders a ledger fact with its source). n* per µs of α on one
# ConnectX-7 port, and the n* that NCCL's tuner α with the line rate gives for a network
# ring round with
# Simple and, at most, with LL (its lower α comes with at most half the bandwidth: half of
# each LL line is flags, and NCCL's tuner caps ring LL at half the bus bandwidth, tuning.cc
# in v2.30.7-1). These are a model's constants, not measured latencies.
assert facts.get("nvidia.connectx7_rate_bytes").unit == "GB/s"
assert facts.get("nccl.proto_ll_efficiency").unit == "%"
_KB_PER_US = facts.get("nvidia.connectx7_rate_bytes").value * 1e9 * 1e-6 / 1e3
_SIMPLE_NSTAR_KB = facts.get("nccl.tuner_net_ring_step_latency_simple").value * _KB_PER_US
_LL_US = facts.get("nccl.tuner_net_ring_step_latency_ll").value
_LL_GBPS = (facts.get("nvidia.connectx7_rate_bytes").value
            * facts.get("nccl.proto_ll_efficiency").value / 100)  # LL's data rate, GB/s
_LL_NSTAR_KB = _LL_US * _LL_GBPS  # µs × GB/s = kB
TRANSPORT_AND_CONGESTION = f'''
**Transport and α**

- **Line rate.** A DGX H100 has [[nvidia.dgx_h100_compute_nics]] for its compute fabric, one per
  GPU, at [[nvidia.connectx7_rate]] ([[nvidia.connectx7_rate_bytes]]) each: n* = α/β is about
  {_KB_PER_US:.0f} kB per µs of α.
- **NCCL's α.** On a real cluster NCCL's cost model charges about
  [[nccl.tuner_net_ring_step_latency_ll]] (several GPUs per node; with one, it charges its
  tree's round, [[nccl.tuner_net_tree_step_latency_ll]]) to
  [[nccl.tuner_net_ring_step_latency_simple]] per network round (its constants, not measured
  latencies), so n* is tens to hundreds of kB, against 250 kB here: the same rule holds, a
  bucket split p ways must stay well above n*.
- **α without the kernel.** RDMA skips the kernel's system calls and socket copies
  ([[rdma.kernel_bypass]] between registered buffers; NCCL copies the user's data into its own
  unless that buffer is registered too). The round trips measured above cannot show that
  software cost:
  they are almost all emulated delay.

<details><summary>For later (notebook 02c): NCCL's tuner and protocols, chunking, RoCE framing,
congestion</summary>

**The tuner.** NCCL's tuner is the cost model that picks an algorithm and a *protocol*
(NCCL's way of moving data: LL and LL128 for low latency, Simple for bandwidth). It charges a
ring round across the network, on nodes with several GPUs,
[[nccl.tuner_net_ring_step_latency_ll]] with LL to [[nccl.tuner_net_ring_step_latency_simple]]
with Simple. The tuner's α with the line rate gives n* from at most
≈ {_LL_NSTAR_KB:.0f} kB with LL to ≈ {_SIMPLE_NSTAR_KB:.0f} kB with Simple (the tuner's own
bandwidth figure is per channel, with further caps).

**Protocols.** LL and LL128 send a flag with the data, so the receiver needs no separate
synchronisation: a lower per-round latency. LL pays for it with at most half the bandwidth
([[nccl.proto_ll_efficiency]] of each LL line is data), so its n* is at most about
{_LL_US:g} µs × {_LL_GBPS:g} GB/s ≈ {_LL_NSTAR_KB:.0f} kB. LL128 keeps low latency at nearly
full bandwidth ([[nccl.proto_ll128_efficiency]] of each LL128 line is data). Simple moves large
chunks at full bandwidth. The tuner also adds a fixed latency per call, and to each network
round the latency the network plugin reports ([[nccl.tuner_net_latency_inter]]). With one GPU
per node it charges the tree's network round instead ([[nccl.tuner_net_tree_step_latency_ll]]
for LL).

**Chunking.** A ring all-reduce (notebook 02) sends 1/p of the buffer per round. NCCL splits
that further over its channels (the parallel slices of notebook 02c) and into fixed-size
buffers ([[nccl.buffsize_env]]).

**Framing.** RoCE runs on Ethernet and pays the same per-frame preamble, FCS and gap
([[ethernet.preamble_sfd_bytes]], [[ethernet.fcs_bytes]], [[ethernet.ifg_bytes]]), plus its own
IP, UDP and InfiniBand transport headers, and its RDMA path MTU is at most
[[infiniband.max_mtu_bytes]]: its goodput is not the TCP figure above.

**Congestion and flow control** (the emulator models none of them; notebook 01b): TCP's slow
start and its window cut after a loss; on RoCE, ConnectX NICs' rate control
[[paper.dcqcn_2015]], usually on a fabric kept lossless by [[ieee.pfc_8021qbb]]; on
InfiniBand, [[infiniband.credit_flow_control]].
</details>
'''


def slow_messages_text(us) -> str:
    """What the loopback messages of 1 ms or more (`us`: every message, µs) say: a "slow
    mode" when there are 5 or more, each outlier's time when fewer, or none."""
    us = np.asarray(us)
    slow = us[us >= 1000]
    if len(slow) >= 5:  # enough to call them a mode
        return (f"slow mode: {len(slow)} of {len(us)} ({len(slow) / len(us):.1%}) took 1 ms or "
                f"more (median {np.median(slow) / 1e3:.1f} ms)")
    if len(slow):
        return (f"{len(slow)} outlier{'s' if len(slow) > 1 else ''} of {len(us)} took 1 ms or "
                "more (" + ", ".join(f"{v / 1e3:.1f}" for v in np.sort(slow)) + " ms)")
    return f"none of {len(us)} took 1 ms or more"


def explain_noise_floor(floor: dict):
    """Plain Gloo's loopback messages split into the fast path (under 1 ms: its median) and
    waits of a millisecond or more (`slow_messages_text`), with the load average. Checks
    that the percentiles are ordered and the fast path costs well below 1 ms. Returns the
    fast path's one-way times in µs, which the next cell compares with the emulator's
    excess."""
    us, f = floor["one_way_ms"] * 1e3, floor["percentiles"]
    fast = us[us < 1000]  # the message path, without waits of a millisecond or more
    print(f"fast path: median {np.median(fast):.0f} µs ({len(fast)} of {len(us)} messages under "
          "1 ms)" if len(fast) else f"no message of {len(us)} took under 1 ms")
    print(f"{slow_messages_text(us)}; load average {load_per_core():.1f} per core")
    assert 0 < f["p1"] <= f["p50"] <= f["p99"]
    assert f["p1"] < 0.5, \
        "the machine's own message path, without scheduling waits, costs well below 1 ms"
    return fast


def plot_excess(pp: dict, floor: dict) -> None:
    """Two cumulative distributions on a log axis, in µs: what the emulator's ping-pong
    added over its configured delay (measured - emulated), and plain Gloo's native latency
    on its fast path (messages under 1 ms, for scale), each with its median as a dotted
    line."""
    fig, ax = plt.subplots(figsize=(6, 3))
    native = floor["one_way_ms"][floor["one_way_ms"] < 1.0]
    for data, label, color in (
            (pp["noise_ms"], "emulated ping-pong: measured - configured delay", "C0"),
            (native, f"plain Gloo, fast path (nic=None, {len(native)} of "
                     f"{len(floor['one_way_ms'])} under 1 ms)", "C1")):
        if not len(data):
            continue
        d = np.sort(data) * 1e3
        ax.plot(d, (np.arange(len(d)) + 1) / len(d), label=label, color=color)
        ax.axvline(np.median(d), color=color, ls=":", lw=1)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    lo, hi = ax.get_xlim()
    ticks = [t for t in (10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000) if lo <= t <= hi]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_xlabel("µs")
    ax.set_ylabel("fraction of messages")
    ax.set_title("what a message costs beyond the configured delay", fontsize=10)
    ax.legend(fontsize=8)
    plt.tight_layout()
    plt.show()


def explain_excess(pp: dict, fast, *, delay_ms: float = 4.0) -> None:
    """The takeaway first: how late the emulator's ping-pong arrived after its configured
    delay (the median excess with its 95% interval and its share of `delay_ms`), then that
    excess's p99 (with its interval, or said to have no upper bound when the sample cannot
    give one), then plain Gloo's native fast path (`fast`, µs) for scale: a different path
    (its own transfer included), not the same cost."""
    noise = pp["noise_ms"] * 1e3
    ci = links.quantile_ci(noise, 0.5)  # 95% interval of the median, from order statistics
    p99 = links.quantile_ci(noise, 0.99)
    bound = (f"95% interval {p99['lower']:.0f}-{p99['upper']:.0f}" if np.isfinite(p99["upper"])
             else f"one run; {len(noise)} samples cannot bound a p99 from above")
    median = float(np.median(noise))
    share = median / 1e3 / delay_ms
    # a tenth of the delay: the lessons' millisecond delays would still be read correctly
    print(f"the emulator and this machine add a median {median:.0f} µs per message (95% "
          f"interval {ci['lower']:.0f}-{ci['upper']:.0f}, {len(noise)} pings): {share:.1%} of "
          f"the {delay_ms:g} ms delay, "
          + ("small against the delays of the lessons" if share <= 0.1 else
             "not small: this machine was busy, so the lessons' single messages may be late "
             "too"))
    print(f"its p99: {np.percentile(noise, 99):.0f} µs over {len(noise)} pings ({bound})")
    if len(fast):
        native = links.quantile_ci(fast, 0.5)
        print(f"for scale, plain Gloo's fast path (another path, its transfer included): median "
              f"{native['estimate']:.0f} µs (95% interval {native['lower']:.0f}-"
              f"{native['upper']:.0f})")
