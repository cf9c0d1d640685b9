"""What notebook 01b (tails: jitter, loss and a shared NIC) reads from its runs: the slowest
of p resampled from one link's pings, the loss tails, the shared NIC and the real-cluster
notes.

Each function takes what `clusterlab.experiments.links` returned and draws the figure,
prints the sentences or checks the claims the notebook makes; the measured conclusions go
through `conclude`, which says when a busy machine keeps a run from showing one.
"""

from __future__ import annotations

import contextlib
import io

import matplotlib.pyplot as plt
import numpy as np

from clusterlab import facts, models
from clusterlab.experiments import links
from clusterlab.experiments.common import conclude
from clusterlab.lessons import show

DISTRIBUTIONS = ("uniform", "normal", "pareto")


def explain_configured(specs: dict) -> None:
    """netem's configured distributions (`specs`: name -> netem spec): pareto's range and the
    share of its draws at the clip on the main path (why its p99 is the clip); each
    distribution's configured median, p99 and mean, and the source for netem's uniform
    default, behind a fold."""
    rows = []
    for name, spec in specs.items():
        d = links.configured_delays(spec)
        rows.append(f"{name:>8}: median {links.configured_quantile(spec, 0.5):.2f} ms, p99 "
                    f"{links.configured_quantile(spec, 0.99):.2f} ms, mean {d.mean():.2f} ms")
    draws = links.configured_delays(specs["pareto"])
    at_clip = np.mean(draws >= draws.max() - 1e-9)
    print(f"pareto (configured): draws from {draws.min():.2f} to {draws.max():.2f} ms; "
          f"{at_clip:.2%} sit at the clip, "
          + ("so its p99 is the clip" if at_clip > 0.01 else "so its p99 lies below the clip"))
    show.fold("Each distribution as configured; netem's default, with its source",
              "```text\n" + "\n".join(rows) + "\n```\n\n"
              + facts.render("Without a table netem draws [[linux.netem_default_uniform]]; its "
                             "man page says '[[iproute2.netem_manpage_normal]]'."),
              markdown=True)


def slowest_of_p(jit: dict, *, ranks, delay_ms: float = 4.0, jitter_ms: float = 1.0):
    """The slowest of p, resampled from each distribution's measured pings and from the
    network's own draws for them (`links.slowest_of`, 2000 draws, seed 0), with netem's exact
    expectation (`models.expected_max`). Returns (curves, step64): per distribution the
    curves over `ranks` (mean, paired, model, n) and the numbers at the largest p (measured,
    network, model, the median ping (measured; network_median: the network's draws), n,
    and the p99 of the network's draws against netem's
    configured p99: network_p99, model_p99, and margin_ci from `tail_margin_ci`)."""
    curves, step64 = {}, {}
    for name in DISTRIBUTIONS:
        r = jit[name]
        s = links.slowest_of(r["one_way_ms"], ranks, draws=2000, seed=0, paired=r["emulated_ms"])
        model = [delay_ms + models.expected_max(k, name, jitter_ms) for k in ranks]
        spec = f"delay {delay_ms:g}ms {jitter_ms:g}ms" + (
            "" if name == "uniform" else f" distribution {name}")
        curves[name] = {"mean": s["mean"], "paired": s["paired"], "model": model, "n": s["n"]}
        step64[name] = {"measured": s["mean"][-1], "network": s["paired"][-1], "model": model[-1],
                        "median": float(np.median(r["one_way_ms"])), "n": s["n"],
                        # printed beside the network's slowest, so both come from one series
                        "network_median": float(np.median(r["emulated_ms"])),
                        "network_p99": float(np.percentile(r["emulated_ms"], 99)),
                        "model_p99": links.configured_quantile(spec, 0.99),
                        "margin_ci": tail_margin_ci(r, delay_ms=delay_ms)}
    return curves, step64


def tail_margin_ci(r: dict, *, p: int = 64, delay_ms: float = 4.0, boots: int = 200,
                   draws: int = 500, seed: int = 0) -> tuple[float, float]:
    """The run's own noise on the verdict of `explain_slowest_of_64`: a 95% bootstrap
    interval of the margin (the network's tail on the slowest of p minus this machine's
    share of it), resampling the run's pings (measured and network draw together)."""
    rng = np.random.default_rng(seed)
    measured, network = np.asarray(r["one_way_ms"]), np.asarray(r["emulated_ms"])
    n, margins = len(measured), np.empty(boots)
    for b in range(boots):
        idx = rng.integers(0, n, n)[rng.integers(0, n, (draws, p))]
        net = network[idx].max(axis=1).mean()
        margins[b] = (net - delay_ms) - (measured[idx].max(axis=1).mean() - net)
    lo, hi = np.percentile(margins, [2.5, 97.5])
    return float(lo), float(hi)


def plot_slowest_of_p(curves: dict, *, ranks) -> None:
    """The figure of the slowest of p: per distribution, the resample of the network's own
    draws (rings) and the model (line). The resample of the measured pings, which adds this
    machine's noise, is in the appendix's numbers, not here."""
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for name, color in zip(DISTRIBUTIONS, ("C0", "C1", "C2")):
        c = curves[name]
        ax.plot(ranks, c["paired"], "o", color=color, mfc="none", ms=9,
                label=f"{name}: network alone")
        ax.plot(ranks, c["model"], "-", color=color, alpha=0.6, label=f"{name}: model")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks p (resampled from one link's pings, not run)")
    ax.set_ylabel("slowest one-way delay (ms),\nmean of 2000 resamples")
    ax.set_title(f"The slowest of p, resampled from {curves['pareto']['n']} pings per "
                 "distribution", fontsize=10)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    plt.show()


def noise_dominated(step64: dict, *, delay_ms: float = 4.0) -> list[str]:
    """The distributions whose slowest of 64 this machine moved more (measured - network)
    than the network's own tail did (network - the delay)."""
    return [n for n, v in step64.items() if v["measured"] - v["network"] > v["network"] - delay_ms]


def explain_slowest_of_64(step64: dict, parts: dict, *, busy: str | None,
                          delay_ms: float = 4.0) -> tuple[dict, list[str]]:
    """Prints the figure's numbers, one line per distribution: the slowest of 64 of the
    network's own draws against the model's, and the median ping. Checks the figure's claims
    and keeps for the appendix (the returned lines) the measured slowest of 64 as the
    network's plus what this machine added, and the verdict that for every distribution the
    network's tail moved it more than this machine's noise did (`noise_dominated`); `busy` is
    the run's evidence of a busy machine (or pings later than any network draw, from `parts`,
    counts as such). A verdict not shown, and a distribution where the network's tail wins on
    the point estimates but the run's bootstrap interval of the margin (`margin_ci`, when
    given) reaches 0 ("not resolved"), are printed here, where the reader is. Returns, per
    distribution, whether the network's tail clearly moved it most (the numbers to quote), and
    the appendix's lines."""
    details = []
    for name, v in step64.items():
        assert v["measured"] >= v["network"] - 1e-9, \
            "the same resample of delays that noise only lengthened"
        assert abs(v["network"] / v["model"] - 1) < 0.1, \
            "the network's own draws follow netem's law"
        assert v["measured"] > v["median"]
        med = v.get("network_median", v["median"])
        print(f"{name:>8}: network alone, median ping {med:.2f} ms, "
              f"slowest of 64 {v['network']:.2f} ms (mean of 2000 draws; model {v['model']:.2f})")
        details.append(f"{name:>8}: slowest of 64 measured {v['measured']:.2f} ms = network alone "
                       f"{v['network']:.2f} + this machine {v['measured'] - v['network']:+.2f}")
    # The network's tail, not this machine's noise, must move the slowest of 64 most, per
    # distribution.
    dominated = noise_dominated(step64, delay_ms=delay_ms)
    unresolved = [n for n, v in step64.items() if n not in dominated
                  and v.get("margin_ci") is not None and v["margin_ci"][0] <= 0]
    late = sum(parts[n]["beyond_network"] for n in step64)
    rest = [n for n in step64 if n not in unresolved]
    if rest:
        _verdict(not dominated,
                 ("for every distribution" if not unresolved else f"for {' and '.join(rest)}")
                 + " the network's tail (network alone - the "
                 f"{delay_ms:g} ms delay) moved the slowest of 64 more than this machine did"
                 + (" (this machine moved it more for "
                    f"{', '.join(dominated)})" if dominated else ""), details,
                 busy=busy or (f"{late} pings later than any network draw" if late else None))
    for n in unresolved:
        lo, hi = step64[n]["margin_ci"]
        print(f"Not resolved on this run for {n}: the network's tail minus this machine's "
              f"share is {lo:+.2f} to {hi:+.2f} ms (95% bootstrap over the pings), which "
              "includes 0: quote the network's numbers")
    return {n: n not in dominated and n not in unresolved for n in step64}, details


def explain_model_gap(step64: dict, *, delay_ms: float = 4.0, details=()) -> None:
    """For the appendix: first `details`, the lines `explain_slowest_of_64` kept (the
    measured slowest of 64 split into the network's and this machine's, and its verdict);
    then the distribution whose network-alone slowest of 64 (the figure's hollow markers)
    lies farthest from the model's (its line), that gap beside the gap between its draws' own
    p99 and netem's configured p99 (the other distributions' gaps are in
    `explain_slowest_of_64`'s lines): a slowest of 64 resampled from a few hundred draws
    stands or falls with their own largest few."""
    for line in details:
        print(line)
    far = max(step64, key=lambda n: abs((step64[n]["network"] - delay_ms)
                                        / (step64[n]["model"] - delay_ms) - 1))
    v = step64[far]
    print(f"network alone against the model (hollow markers against the line), "
          f"farthest for {far}: slowest of 64 {v['network']:.2f} vs {v['model']:.2f} ms; these "
          f"{v['n']} draws' own p99 is {v['network_p99']:.2f} vs netem's configured "
          f"{v['model_p99']:.2f} ms")


def p99_text(r: dict) -> str:
    """A loss run's p99 as a sentence part: its value, or the gap it falls in when it lies
    between the delay and a timeout (`p99_gap`)."""
    return (f"p99 {r['percentiles']['p99']:.2f} ms" if r["p99_gap"] is None else
            "p99 falls between two pings, {:.1f} and {:.0f} ms".format(*r["p99_gap"]))


GLOO_TCP_REASONING = (
    "Each neighbour pair shares one TCP connection, and a lost message is cheap if the next "
    "one follows it on that connection before a timer fires. Gloo sends data only once the "
    "receiver has sent a \"ready to receive\" note: a send waits until "
    "[[gloo.tcp_send_waits_for_recv_ready]]. If every lost message is followed in time, only "
    "the final data message and the final note on each of the p connections are lone: about "
    "2p. If the receiver sends its next note only after the lost data arrives, every data "
    "message can be lone. The source shows the note, not when Gloo's ring posts its next "
    "receive: reasoned, not measured.")


def explain_loss_at_scale(p: int, losses=(0.0001, 0.001, 0.01), *, lead: float = 0.001,
                          rto_ms: float = links.RTO_MIN_MS) -> None:
    """A loss rate per message at the scale of one all-reduce: a ring on `p` ranks sends
    p x 2(p - 1) single-segment messages in the ring this emulator replays, which charges
    every lost one a timeout. Prints first, in one line, the share of all-reduces that stall
    at the `lead` loss rate (this emulator). Behind a fold: per loss rate the emulator's share
    beside the lower estimate for Gloo on Linux TCP (reasoned, not measured: a loss among the
    2p messages sent last on their connections, each rank's last data message and the last
    "ready" note to it), why, and its source. Checks that the lower estimate stays below the
    emulator's."""
    messages = p * models.ring_allreduce_steps(p)
    last = 2 * p
    share = models.tail_at_scale(lead, messages)
    print(f"at {lead:.1%} loss per message, about 1 all-reduce in {1 / share:.0f} on {p} ranks "
          f"stalls for >= {rto_ms:.0f} ms (this emulator: a loss among the {messages} messages "
          "of its ring, each one lone here)")
    gloo = []
    for loss in losses:
        any_loss, tail_loss = (models.tail_at_scale(loss, messages),
                               models.tail_at_scale(loss, last))
        gloo.append(f"loss {loss:.2%}: from about {tail_loss:.1%} of all-reduces (emulator "
                    f"{any_loss:.1%})")
        assert tail_loss < any_loss
    # only the lead rate stays on the main path; the others sit beside Gloo's estimate
    show.fold("Other loss rates; Gloo on Linux TCP stalls less often (reasoned, not measured)",
              f"A lower estimate: a loss among the {last} messages sent last on their "
              "connections, if each lost message is followed in time (more if not).\n\n"
              + "\n".join(f"- {line}" for line in gloo) + "\n\n"
              + facts.render(GLOO_TCP_REASONING), markdown=True)


def explain_loss(tails: dict) -> None:
    """Per loss rate: the median, the p99 (`p99_text`) and how many pings waited for a
    timeout; then how many pings at 0% loss this machine delayed. Checks that the network
    draws nothing between the delay and a timeout, that at 5% loss the network's median
    barely moves while the p99 pays a 200 ms timeout, and that the timeouts match the
    configured loss within 3 standard deviations."""
    none, five = tails[0], tails[5]
    for p_, r in tails.items():
        n, (a, b) = len(r["one_way_ms"]), r["late_ms"]
        assert not np.any((r["emulated_ms"] > a) & (r["emulated_ms"] < b)), \
            "the network draws nothing there"
        print(f"loss {p_}%: median {r['percentiles']['p50']:.2f} ms, {p99_text(r)}; "
              f"{r['emulated_rto']} of {n} waited for a timeout")
    if none["late"]:
        print(f"({none['late']} of {len(none['one_way_ms'])} pings at 0% loss were delayed by "
              "this machine: appendix)")
    assert five["emulated"]["p50"] < 2 * 1.0, "the network's median barely moves"
    assert five["percentiles"]["p99"] >= 1.0 + links.RTO_MIN_MS, "the p99 pays a 200 ms timeout"
    assert five["rto_delayed"] >= five["emulated_rto"] >= 1
    assert abs(five["emulated_rto"] - five["expected_rto"]) <= 3 * np.sqrt(200 * 0.05 * 0.95), \
        "loss as configured"
    assert five["emulated"]["mean"] > 3 * none["emulated"]["mean"]


def plot_contention(cont: dict, load: dict) -> None:
    """Two panels: each process's goodput behind one NIC (`links.plot_contention`), and an
    8-byte ping's one-way delay with the NIC idle and with another process streaming
    (clipped at 30 ms)."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.4))
    links.plot_contention(cont, ax=ax1)
    ax1.set_title("bandwidth: each process's goodput (dots)")
    bins = np.linspace(0, 30, 61)
    ax2.hist(np.clip(load["idle_ms"], 0, 30), bins=bins, alpha=0.7, label="NIC idle")
    ax2.hist(np.clip(load["loaded_ms"], 0, 30), bins=bins, alpha=0.7,
             label="another process streaming")
    ax2.axvline(1 + load["message_ms"], color="k", ls=":", lw=1, label="delay + one bulk message")
    ax2.set_xlabel("one-way delay of an 8-byte ping (ms, clipped at 30)")
    ax2.set_title("latency: the same NIC under load")
    ax2.legend(fontsize=8)
    plt.tight_layout()
    plt.show()


def _verdict(holds: bool, claim: str, details: list[str], *, busy: str | None = None) -> bool:
    """`conclude` (with the caller's evidence of a busy machine, `busy`), its "Shown on this
    run" line kept in `details` for the appendix; a "Not shown on this run" line is printed
    where it was reached (a failure on a quiet machine raises, as always)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        shown = conclude(holds, claim, busy=busy)
    (details.append if shown else print)(out.getvalue().strip())
    return shown


def explain_sharing(cont: dict) -> tuple[bool, list[str]]:
    """The shared NIC's bandwidth, one line per P: the lone stream's rate, then each
    process's goodput behind one NIC against rate / P and with a NIC each. Concludes, in
    turn, that a lone stream reached the NIC's rate (else the CPUs, not the NIC, set the
    pace and nothing more is concluded), that a NIC of its own gave each process the full
    rate, and that each process behind one NIC got rate / P within 15% (`_verdict`: the
    verdicts shown go to the appendix). Returns whether the lone stream saturated the NIC,
    and the details the appendix prints."""
    rate = cont["rate_Bps"]
    details = []
    # A lone stream must reach the NIC's rate: on a starved machine the senders, not the NIC,
    # set the pace, and sharing cannot show.
    alone = cont["rows"][1]["own"]["per_process"]
    saturated = _verdict(abs(alone / rate - 1) <= 0.15,
                         f"a lone stream reached the NIC's rate (it reached {alone * 8 / 1e6:.0f} "
                         f"of {rate * 8 / 1e6:.0f} Mbit/s), so that the NIC, not this machine's "
                         f"CPUs, sets the pace and the sharing can show", details)
    for p_, row in cont["rows"].items():
        own = row["own"]["per_process"]
        if p_ == 1:
            print(f"P = 1: {own * 8 / 1e6:.0f} Mbit/s alone (the NIC's rate: "
                  f"{rate * 8 / 1e6:.0f} Mbit/s)")
            continue
        share = row["shared"]["share"]
        got = ", ".join(f"{x * 8 / 1e6:.1f}" for x in share)
        details.append(
            f"P = {p_}: shares from {row['shared']['window_messages']} messages (all {p_} "
            f"receiving); own node each {own * 8 / 1e6:.1f} Mbit/s")
        if np.isnan(share).any():
            print(f"P = {p_}: cannot tell each process's share (the streams overlapped too "
                  "briefly on this run)")
            continue
        print(f"P = {p_} behind one NIC: {got} Mbit/s each (rate / P = {rate * 8 / 1e6 / p_:.1f}); "
              f"with a NIC each: {own * 8 / 1e6:.0f} Mbit/s each")
        # Each comparison needs NIC-bound streams: with 2P processes on a busy machine the
        # CPUs, not the NICs, can set the pace (then it says so instead of concluding).
        if (saturated
                and _verdict(abs(own / rate - 1) <= 0.15,
                             f"with P = {p_}, a NIC of its own gave each process the full rate "
                             f"(it gave {own * 8 / 1e6:.0f} Mbit/s)", details)):
            _verdict(np.all(np.abs(share / (rate / p_) - 1) <= 0.15),
                     f"with P = {p_}, each process behind one NIC got rate / P within 15% (they "
                     f"got {got} Mbit/s)", details)
    return bool(saturated), details


def explain_queueing(load: dict, *, saturated: bool) -> list[str]:
    """An 8-byte ping's median with the NIC idle and behind bulk traffic. When the lone
    stream saturated the NIC, checks that the median wait is above a quarter of one bulk
    message and that most loaded pings were slower than the idle p90. Returns the details
    the appendix prints: how busy the stream kept the NIC, the share of slowed pings, the
    median wait in bulk messages and how many waited longer than a whole one."""
    idle, loaded = load["idle"], load["loaded"]
    n_pings, msg = len(load["loaded_ms"]), load["message_ms"]
    wait = loaded["p50"] - idle["p50"]
    # waited more than one whole message
    longer = int((load["loaded_ms"] > idle["p50"] + msg).sum())
    clipped = int((load["loaded_ms"] > 30).sum())
    slowed = float(np.mean(load["loaded_ms"] > idle["p90"]))
    print(f"an 8-byte ping: median {idle['p50']:.2f} ms idle, {loaded['p50']:.2f} ms behind bulk "
          f"traffic (n = {n_pings} each)")
    details = [
        f"the stream kept the NIC busy {load['offered']:.0%} of the time; {slowed:.0%} of loaded "
        f"pings were slower than the idle p90",
        f"median wait {wait / msg:.2f} of one bulk message ({msg:.1f} ms); {longer} waited longer "
        f"than a whole message, {clipped} beyond the 30 ms clip"]
    if saturated:
        assert wait > msg / 4, "queueing behind bulk data is latency"
        assert slowed > 0.5, \
            f"the NIC is busy {load['offered']:.0%} of the time, so most pings meet a queue"
    return details


# Linux's loss recovery, behind a fold under the loss figure (a `facts.show` template).
LOSS_RECOVERY = """
SRTT is TCP's smoothed round-trip time; with SACK the receiver reports which later segments
arrived. Loss detection: [[linux.tcp_recovery_default]]. **RACK** counts a segment lost once
one sent later is acknowledged: [[linux.rack_mark_lost]]. **TLP** (tail loss probe) resends
the last segment early to provoke an acknowledgement; **PTO** (probe timeout) is how long it
waits: [[linux.tlp_single_packet]]. Datacentres lower the RTO floor per destination
([[linux.route_rto_min]]).
"""


def show_loss_recovery() -> None:
    """Linux's loss recovery, with its sources, behind a fold (`LOSS_RECOVERY`)."""
    show.fold("Linux's loss recovery (RACK, TLP), with sources", facts.render(LOSS_RECOVERY),
              markdown=True)


# "On a real GPU cluster": four one-line points on the main path (loss on InfiniBand and on
# RoCE, the cost of a lost last packet, one NIC per GPU); how the NIC repairs a loss, NCCL's
# timeout by version, loss on TCP, fabric contention and jitter under load behind the fold (a
# `facts.show` template: [[id]] renders a ledger fact with its source).
ON_A_REAL_GPU_CLUSTER = '''
- **InfiniBand does not drop for lack of buffer:** a sender transmits only when the next hop
  has granted buffer space ([[infiniband.credit_flow_control]]).
- **RoCE (RDMA over Ethernet) is usually kept nearly lossless by PFC, at a cost** (some
  fabrics run it lossy: fold): a switch whose
  ingress queue for one traffic class passes a threshold pauses that class upstream
  ([[ieee.pfc_8021qbb]]); at scale that brings failures of its own ([[paper.guo_rdma_2016]]).
- **A lost last packet on InfiniBand (rare, see above) nominally costs seconds, not TCP's
  200 ms:** it waits for the NIC connection's ACK timeout (how long the sender's NIC waits for
  an acknowledgement before resending), [[nccl.ib_timeout_default_time]] at NCCL's default
  since 2.23.
- **One NIC per GPU removes most host-side sharing** (reasoned; limits in the fold): a DGX H100 has
  [[nvidia.dgx_h100_compute_nics]] for its compute fabric, one per GPU, at
  [[nvidia.connectx7_rate]]; sharing appears where GPUs outnumber NICs or use another GPU's NIC.

<details><summary>NIC loss repair, NCCL timeouts, loss on TCP, fabric contention, jitter</summary>

**How the NIC repairs a loss.** NCCL over InfiniBand or RoCE bypasses the kernel's TCP
([[rdma.kernel_bypass]]). The NIC resends a lost packet itself, classically with
[[paper.mittal_irn_2018]]: the receiver reports a gap (a NAK, negative acknowledgement) and
the sender resends everything from the lost packet on. Credits stop drops for lack of buffer,
not every drop: a switch still discards a packet held too long
([[infiniband.switch_lifetime_discard]]). Some fabrics run RoCE lossy instead
([[nvidia.roce_lossy_mode]]; ECN: switches mark packets as their queues grow, and senders slow
down). NVIDIA's RoCE NICs with adaptive retransmission enabled may retry far sooner than the
ACK timeout
([NVIDIA: Adaptive Retransmission](https://docs.nvidia.com/networking/display/adaptiveretransmissionparameterscontrol/enablement+and+capabilities)).

**NCCL's timeout by version.** The ACK timeout belongs to the queue pair (QP, the NIC's
connection): [[nccl.ib_timeout_formula]] (NCCL 2.14 to 2.22 defaulted to a timeout a quarter
as long).
After [[nccl.ib_retry_cnt_default]] retries, nominally about [[nccl.ib_total_wait_default]] in
all, the NIC fails the send and NCCL reports a network error.

**Loss on TCP: the floor is for lone segments.** Where NCCL or Gloo use sockets, a lost
segment that was alone in flight (like each small message measured here) waits at least
[[linux.tcp_rto_min]] by default (lowered per route, or with [[linux.tcp_rto_min_us]] since
Linux 6.11; [[paper.vasudevan_incast_2009]]; incast: many senders converging on one
receiver's port at once). With more segments in flight, as in bulk transfers, a lost tail is
probed after about 2 round trips plus [[linux.tcp_timeout_min_us]]; only a lost probe then
waits for the RTO.

**Contention in the fabric remains** with one NIC per GPU: switch queues, incast, flows
colliding on one path (notebooks 13 and 13b). Inside a host, PCIe-switch uplinks and
transfers staged through CPU memory can still share.

**Jitter: measure under load, over long runs.** Real tails come from shared resources (switch
queues, background work, power limits) and come in bursts a short benchmark misses (Dean &
Barroso, [The Tail at Scale](https://doi.org/10.1145/2408776.2408794), CACM 2013).
</details>
'''


def explain_jitter(jit: dict, parts: dict, dilated: dict, *, delay_ms: float = 4.0,
                   jitter_ms: float = 1.0) -> None:
    """Per distribution the network's own median and p99 (its seeded draws for the pings,
    from `links.tail_split`, with the sample count) against the model's p99 (netem's
    configured distribution); then in one line how far this machine moved the measured p99s
    at most (measured - network; the measured values are the appendix's) and, when `dilated`
    (`links.jitter_dilated`'s result) says the machine was busy, that its noise missed the
    plan (its largest p99 against the planned one) and may move other statistics more."""
    for name in DISTRIBUTIONS:
        t = parts[name]
        spec = f"delay {delay_ms:g}ms {jitter_ms:g}ms" + (
            "" if name == "uniform" else f" distribution {name}")
        print(f"{name:>8}: median {np.median(jit[name]['emulated_ms']):.2f} ms, p99 "
              f"{t['network']:.2f} ms (network alone, n = {t['n']}); model p99 "
              f"{links.configured_quantile(spec, 0.99):.2f} ms")
    moved = max(parts[name]["machine_extra"] for name in DISTRIBUTIONS)
    print(f"This machine moved every measured p99 by at most {moved:.2f} ms"
          + (" (appendix)." if dilated["busy"] is None else
             f", but it was busier than planned during the runs (noise p99 up to "
             f"{dilated['noise_p99_dilated_ms']:.2f} ms, not {dilated['target_ms']:.2f}; "
             "appendix), so it may move the slowest of 64 more."))


def explain_noise_appendix(jit: dict, parts: dict, dilated: dict, *, delay_ms: float = 4.0) -> None:
    """The appendix on this machine's noise: first whether the plan held during the runs (if
    not, why: K was capped, or the noise rose after the probe), then the K it chose; per spec the
    measured p99 against the network's and the noise alone, with the pings beyond any
    network draw; per distribution the p99's 95% interval ("open" when 200 pings cannot
    bound it) and the pings before the delay. Checks that noise only adds,
    that netem's jitter is two-sided and raises the network's p99, and that most pareto
    draws lie below the delay."""
    n = min(t["n"] for t in parts.values())
    print(f"during the runs: largest noise p99 of any spec (divided by K; {n} pings each) "
          f"{dilated['noise_p99_dilated_ms']:.2f} ms, planned {dilated['target_ms']:.2f} ms "
          "(J/2): plan " + ("met" if dilated["busy"] is None else
                            f"missed (K capped at {dilated['k']})" if dilated["capped"] else
                            "missed (the noise rose after the probe had chosen K)"))
    print(f"machine noise: p99 {dilated['noise_p99_ms']:.2f} ms over 200 jitter-free pings, so "
          f"K = {dilated['k']}" + (f" ({dilated['wanted']} wanted, capped)" if dilated["capped"]
                                  else ""))
    for name, t in parts.items():
        # the difference printed as computed (before rounding), as the main path's "at most"
        print(f"{name:>8}: p99 {t['measured']:.2f} ms, network {t['network']:.2f} ms "
              f"({t['machine_extra']:+.2f}), noise alone {t['noise']:.2f} ms"
              + ("" if name == "none" else
                 f"; {t['beyond_network']}/{t['n']} beyond any network draw"))
    for name in DISTRIBUTIONS:
        r, t = jit[name], parts[name]
        lo, hi = t["measured_ci"]
        early = int((r["one_way_ms"] < delay_ms).sum())
        print(f"{name:>8}: p99 95% interval {lo:.2f} .. {'open' if np.isinf(hi) else f'{hi:.2f}'} "
              f"ms; {early}/{t['n']} before the {delay_ms:g} ms delay")
        assert np.all(r["one_way_ms"] >= r["emulated_ms"] - 1e-3), "noise only adds"
        assert r["emulated"]["p1"] < delay_ms, \
            "netem's jitter is two-sided: some draws are below 4 ms"
        assert r["emulated"]["p99"] > jit["none"]["emulated"]["p99"], \
            "jitter raises the network's p99"
        assert t["machine_extra"] >= -1e-3, "the measured p99 is at least the network's"
    pareto = jit["pareto"]
    assert pareto["emulated"]["p50"] < delay_ms < pareto["emulated"]["p99"] - 3.0
    assert np.percentile(pareto["emulated_ms"], 10) < delay_ms, \
        "most pareto draws are below the delay"


def more_late_pings(tails: dict) -> list[str]:
    """The loss rates (1% and 5%) at which pings between the delay and a timeout were more
    frequent than at 0% loss: their 95% intervals (`late_ci`) do not overlap."""
    return [f"{p_}%" for p_ in (1, 5) if tails[p_]["late_ci"][0] > tails[0]["late_ci"][1]]


def explain_loss_and_contention_appendix(tails: dict, contention_details: list[str]) -> None:
    """The appendix on loss and contention: first whether loss brought more pings held up
    between the two levels than 0% loss did (`more_late_pings`); per loss rate the timeouts
    counted and expected, the loss rate's 95% interval and those held-up pings; then the
    contention runs' details."""
    more = more_late_pings(tails)
    print("late pings with loss: " + (f"more at {' and '.join(more)} (95% intervals do not "
                                      "overlap);\n  loss or this machine's load, this run cannot "
                                      "tell which" if more else
                                      "about as many as at 0% loss (95% intervals overlap)"))
    for p_, r in tails.items():
        n, (lo, hi), (a, b) = len(r["one_way_ms"]), r["loss_ci"], r["late_ms"]
        print(f"loss {p_}%: {r['emulated_rto']} timeouts (expected {r['expected_rto']:.0f}; rate "
              f"{lo:.1%} .. {hi:.1%}); {r['late']}/{n} pings between {a:.1f} and {b:.0f} ms")
    print("contention:")
    for line in contention_details:
        print("  " + line)
