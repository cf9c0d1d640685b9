"""What notebook 13 (switches: incast and lost packets) reads from its runs.

Each function takes the plain rows of `clusterlab.experiments.fabric` (or the closed forms of
`clusterlab.fabric_models`) and prints the sentences the learner reads, with the consistency
checks that go with them; measured conclusions go through `conclude`, which prints
"Shown on this run: ..." when they hold.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from clusterlab import fabric_models as fm
from clusterlab import facts
from clusterlab.experiments import fabric as ex
from clusterlab.experiments.common import conclude
from clusterlab.lessons.show import ms
from clusterlab.wire import DUPTHRESH, HEADER_BYTES, SEGMENT_BYTES, segment_count

MiB, KiB = ex.MiB, ex.KiB
HZ = (1000, 250)  # Linux's timer ticks per second: a common build, then Kconfig's default
ORDINALS = ("first", "second", "third", "fourth")


def explain_nic(*, rate: float) -> None:
    """Print every node's NIC and what a lone 1 MiB message costs through it and one port
    (`rate`: the NIC's bit/s), with the emulator's segments."""
    print(f"every NIC: netem '{ex.NIC}'. A lone 1 MiB message takes "
          f"{ms(fm.incast(1, MiB, rate_bps=rate).time_s)} through a NIC and one port, plus "
          f"the delay.")
    print(f"(the emulator sends it as {segment_count(MiB)} segments of {SEGMENT_BYTES // KiB} "
          f"KiB, {HEADER_BYTES} header bytes each)")


def explain_leaf(topo) -> None:
    """Print the path from node 1 to node 0 on one leaf (`topo`: `Topology.build` with
    `ex.incast_fabric`) and check that it crosses only node 0's port."""
    specs = topo.port_specs()
    hops = [int(q) for q in topo.paths([1], [0])[0] if q >= 0]
    print(f"{topo.nodes} nodes on one leaf, each with a switch port towards it at "
          f"{specs[0].rate_bps / 1e6:g} Mbit/s. Node 1 -> node 0 crosses node 1's NIC, then "
          f"port {hops[0]}, node 0's port; so does every other node's message to node 0.")
    assert hops == [0]


def never_early(rows: Sequence[dict], *, slack: float = 0.98) -> bool:
    """Whether every row's best run took at least `slack` times its closed form (an exact
    closed form of one round: the emulated network never delivers early)."""
    return all(r["best"] >= slack * r["model"].time_s for r in rows)


def four_queued(lone: dict, four: dict) -> bool:
    """The incast verdict: the last of four pushes waited over 0.7 of the closed form's
    queueing and four pushes took over three times one."""
    return four["queue"] > 0.7 * four["model"].max_queue_s and four["best"] > 3 * lone["best"]


def explain_incast(inc: Sequence[dict]) -> None:
    """Print one push against four (`inc`: `ex.incast` rows, the first one sender, the last
    four), check that no run beat its closed form, and state whether the last push queued
    behind the others (`conclude`)."""
    lone, four = inc[0], inc[-1]
    print(f"One push {ms(lone['best'])}, four pushes {ms(four['best'])} (closed form "
          f"{ms(four['model'].time_s)}).")
    print(f"The last of four waited {ms(four['queue'])} behind the others (best(4) - best(1)); "
          f"the port delivered {four['goodput'] * 8 / 1e6:.1f} Mbit/s of payload.")
    assert never_early(inc)  # an exact closed form: never early
    conclude(four_queued(lone, four),
             "the last of four pushes queued behind the others, and four pushes took "
             "over 3x one", busy=ex.slowed(inc))


def explain_ps_vs_ring(pr: Sequence[dict], *, delay: float, repeats: int) -> None:
    """Print the parameter server against the ring (`pr`: `ex.ps_vs_ring` rows), the ring's
    closed form split into wire, store and forward and delay (`delay`: one hop's, in s) and
    the server's closed form over the ring's wire share (the ideal ratio p), check the
    closed forms, and state whether the server took over twice the ring's time."""
    ps, ring = pr
    nodes = ring["nodes"]
    print(f"{nodes} nodes on one leaf, {ring['nbytes'] // MiB} MiB | measured (best of "
          f"{repeats}) | closed form")
    for name, r in (("parameter server", ps), ("ring", ring)):
        print(f"{name:>25} | {ms(r['best']):>20} | {ms(r['model'])}")
    rounds = 2 * (nodes - 1)
    chunk = segment_count(ring["nbytes"] // nodes)  # segments per round's chunk
    wire = ring["crossbar"] - rounds * delay  # the NICs alone, less the delay
    print(f"The ring's closed form, {rounds} rounds x ({chunk}w on the wire + w store and "
          f"forward at the port + the delay) = {ms(wire)} + "
          f"{ms(ring['model'] - ring['crossbar'])} + {ms(rounds * delay)} = "
          f"{ms(ring['model'])}.")
    print(f"The ideal ratio p = {nodes} counts the wire alone: the parameter server's closed "
          f"form is {ps['model'] / wire:.1f}x the ring's wire share.")
    gap = "; the gap: appendix" if per_message_cost_visible(ps, ring) else ""
    print(f"The parameter server took {ps['best'] / ring['best']:.1f}x the ring's time "
          f"(closed form {ps['model'] / ring['model']:.1f}x{gap}).")
    assert ps["model"] > 2 * ring["model"]  # the closed forms
    # the switch port adds the incast NIC shaping alone hides
    assert ps["model"] > 1.5 * ps["crossbar"]
    conclude(ps["best"] > 2 * ring["best"],
             "the parameter server took over twice the ring's time", busy=ex.slowed(pr))


def nth(s: int) -> str:
    """The s-th sender the port serves, as a word: 1 -> 'first'."""
    return ORDINALS[s - 1]


def dropped_senders(lost: Sequence[Sequence[int]]) -> list[int]:
    """The senders (numbered from 1, in the port's service order) that lost any segment
    (`lost`: `ex.incast_drops`, the lost segments of each sender)."""
    return [s for s, segs in enumerate(lost, 1) if segs]


def rto_senders(lost: Sequence[Sequence[int]], k: int) -> list[int]:
    """The senders that wait for the RTO: a loss with fewer than DUPTHRESH of its message's
    `k` segments after it, so no three duplicate ACKs reveal it."""
    return [s for s, segs in enumerate(lost, 1) if segs and k - max(segs) < DUPTHRESH]


def repaired_senders(lost: Sequence[Sequence[int]], k: int) -> list[int]:
    """The senders whose losses duplicate ACKs repair (DUPTHRESH later segments arrived)."""
    waits = rto_senders(lost, k)
    return [s for s in dropped_senders(lost) if s not in waits]


def rack_senders(lost: Sequence[Sequence[int]], k: int) -> list[int]:
    """The senders that lost segments but whose last segment got through: on Linux its SACK
    lets RACK resend the rest about a round trip later."""
    return [s for s, segs in enumerate(lost, 1) if segs and max(segs) < k]


def tail_senders(lost: Sequence[Sequence[int]], k: int) -> list[int]:
    """The senders that lost all `k` segments: nothing arrived to SACK (a lost tail)."""
    return [s for s, segs in enumerate(lost, 1) if len(segs) == k]


def best_deliveries(row: dict) -> list[float]:
    """Each message's emulated delivery time (s after the agreed start; the sender stamps it
    in the message) in the row's fastest repetition, in order (`row`: an `ex.incast` row).
    Not its `arrivals`: rank 0 waits on its messages in sender order, so those are when each
    wait returned, no earlier than the previous one."""
    k = row["times"].index(row["best"])
    return sorted(times[k] for times in row["delivered"].values())


def kept_after_loss(segs: Sequence[int], k: int) -> list[int]:
    """The segments of a `k`-segment message delivered after its first lost one (`segs`)."""
    return [c for c in range(min(segs) + 1, k + 1) if c not in segs] if segs else []


def explain_drops(drops: Sequence[dict], tie: dict, *, nbytes: int) -> None:
    """Print the incast into a small buffer (`drops`: `ex.incast` rows for 1, 2 and 4 senders
    of `nbytes`; `tie`: `ex.incast_replay` of four, all sent at one instant): the table, which
    senders the replay drops and which of them wait for the RTO or are repaired by duplicate
    ACKs (the run's own deliveries against it: `explain_appendix`); check the closed form's
    timeouts and time against the replay, and state whether two senders kept clear of the
    RTO with over 1.5x the goodput of four. The table gives the best run and the range of
    all runs."""
    every = f"all {len(drops[0]['times'])} runs"
    print(f"senders | best     | {every:<20} | closed form | goodput (best)")
    for r in drops:
        runs = f"{ms(min(r['times']))} to {ms(max(r['times']))}"
        print(f"{r['senders']:>7} | {ms(r['best']):>8} | {runs:>20} | "
              f"{ms(r['model'].time_s):>11} | {r['goodput'] * 8 / 1e6:.1f} Mbit/s")
    two, four = drops[1], drops[2]
    k = segment_count(nbytes)
    lost = tie["lost"]
    dropped, waits, repaired = (dropped_senders(lost), rto_senders(lost, k),
                                repaired_senders(lost, k))
    print(f"Replay (the emulator's own NIC, port and recovery, no cluster; the figure), the "
          f"four sends at one instant: the {' and '.join(map(nth, dropped))} senders served "
          f"lose {sum(map(len, lost))} segments between them.")
    if repaired:
        print(f"The {' and '.join(map(nth, waits))} wait for the RTO ({ms(fm.RTO_MIN_S)}); "
              f"the {' and '.join(map(nth, repaired))} are repaired by duplicate ACKs.")
    else:
        who = {1: "it waits", 2: "both wait"}.get(len(waits), "they wait")
        print(f"No loss has {DUPTHRESH} segments behind it, so no duplicate ACKs repair one: "
              f"{who} for the RTO ({ms(fm.RTO_MIN_S)}).")
    for s in dropped:
        if kept := kept_after_loss(lost[s - 1], k):
            print(f"The {nth(s)} sender's segment {', '.join(map(str, kept))} got in after its "
                  f"losses: by then the port had forwarded enough of the queue to have room.")
    if four["best"] < four["model"].time_s:
        print(f"The best run of four ({ms(four['best'])}) came in under this closed form "
              f"({ms(four['model'].time_s)}): its senders did not start at one instant; the "
              f"appendix shows which replay its deliveries match.")
    print(f"Goodput fell {two['goodput'] / four['goodput']:.1f}x from two senders to four "
          f"(best runs).")
    assert len(waits) > 0 and four["model"].timeouts == len(waits)
    assert abs(tie["time_s"] - four["model"].time_s) < 1e-6  # the closed form is this replay
    assert two["model"].timeouts == 0
    # the RTO really was waited for: a message's emulated delivery came after it
    assert four["best"] >= fm.RTO_MIN_S and max(best_deliveries(four)) >= fm.RTO_MIN_S
    conclude(two["best"] < fm.RTO_MIN_S and two["goodput"] > 1.5 * four["goodput"],
             "two senders finished within the RTO, with over 1.5x the goodput of four",
             busy=ex.slowed(drops))


def plot_drops(lost: Sequence[Sequence[int]], *, nbytes: int, limit: int, ax=None):
    """Draw which segment of which sender the port dropped (`lost`: `ex.incast_replay`'s
    losses with all sends at one instant, the senders in the port's service order; `nbytes`
    per sender, a buffer of `limit` packets): one row per sender, one box per segment,
    delivered or dropped, and per sender how its losses are repaired in the emulator:
    duplicate ACKs if DUPTHRESH later segments arrived, else the RTO; the legend shows only
    the kinds that occur."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    k = segment_count(nbytes)
    waits, fast = rto_senders(lost, k), repaired_senders(lost, k)
    colour = {"delivered": "tab:green", "RTO": "tab:red", "dup": "tab:orange"}
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1 + 0.55 * len(lost)), layout="constrained")
    for s, segs in enumerate(lost, 1):
        kind = "RTO" if s in waits else "dup"
        for c in range(1, k + 1):
            ax.add_patch(plt.Rectangle((c - 0.45, s - 0.4), 0.9, 0.8, ec="black", lw=0.5,
                                       fc=colour[kind] if c in segs else colour["delivered"]))
        after = k - max(segs) if segs else None
        note = ("no loss" if not segs else
                "nothing delivered after its losses: waits for the RTO" if after == 0 else
                f"{after} delivered after its last loss: waits for the RTO" if s in waits else
                f"{after} delivered after it: duplicate ACKs resend it")
        ax.text(k + 0.7, s, note, va="center", fontsize=9)
    ax.set(xlim=(0.4, k + 5.5), ylim=(len(lost) + 0.6, 0.4), xticks=range(1, k + 1),
           yticks=range(1, len(lost) + 1), yticklabels=[nth(s) for s in range(1, len(lost) + 1)],
           xlabel="segment of the sender's message", ylabel="sender (in service order)",
           title=f"{len(lost)} senders x {k} segments into a {limit}-packet buffer: replay, "
                 f"all sends at one instant")
    ax.grid(False)
    labels = {"delivered": "delivered", "RTO": "dropped, resent after the RTO",
              "dup": "dropped, resent on duplicate ACKs"}
    shown = ["delivered"] + ["RTO"] * bool(waits) + ["dup"] * bool(fast)
    ax.legend(handles=[Patch(fc=colour[c], label=labels[c]) for c in shown],
              loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, fontsize=8)
    assert set(fast) | set(waits) == set(dropped_senders(lost))
    return ax


def tcp_payload_bytes(mtu: int) -> int:
    """TCP payload per real Ethernet frame: the MTU less the IPv4 header and a TCP header
    with timestamps (both from the ledger)."""
    return (mtu - facts.get("ipv4.header_bytes").value
            - facts.get("tcp.header_with_timestamps_bytes").value)


LINUX_RECOVERY = """
<details><summary>How Linux TCP finds a loss sooner: SACK, RACK and the tail loss probe, on this incast and at 10 Gbit/s</summary>

- With **SACK** (selective ACK) the receiver also lists the blocks that arrived after a gap.
- A loss with later segments behind it: **RACK** (recent ACK) resends it about a round trip
  later. RACK's rule: [[linux.rack_mark_lost]]. If that settling delay has not yet passed, its
  timer waits the rest plus [[linux.tcp_timeout_min_us]] (`tcp_rack_mark_lost`).
- A lost tail, with nothing behind it: a **TLP** (tail loss probe) sends one segment (new data
  if any is queued, else the last one again) on its own timer, [[linux.tlp_multi_packet]]; with
  one segment out the timer is about the RTO. The probe's ACK lets RACK resend the rest.
- Only if the probe is lost too, or TLP does not apply (no SACK, or already in recovery), does
  the sender wait for the RTO, by default at least [[linux.tcp_rto_min]], far above a
  datacentre round trip. A route's rto_min ([[linux.route_rto_min]]) or
  [[linux.tcp_rto_min_us]] (Linux 6.11 and later) can lower it.

**This incast on Linux.** The emulator's time is its own figure. A message is {k} of its
{seg_kib} KiB segments; Linux TCP sends it as {frames} frames of {mss} B of payload (the
[[ethernet.mtu_bytes]] MTU less a [[ipv4.header_bytes]] IPv4 and a
[[tcp.header_with_timestamps_bytes]] TCP header), so a loss with under {dupthresh} segments
after it is far likelier in the emulator. Mapped onto Linux, to show the mechanism, not to
predict which packets a real port drops (one that interleaves the flows drops others): the
{rack} sender's segment {k} got through, so its SACK lets RACK resend segments {rack_lost}
about a round trip after the loss; the {tail} sender delivered nothing to SACK, so its tail
loss probe fires, and the probe's ACK lets RACK resend the rest.

**At 10 Gbit/s, the timer only:** {estimate}

A real port interleaves the flows' packets, so one overflow can stall many flows on timeouts
(**TCP incast collapse**): [[paper.vasudevan_incast_2009]].

</details>
"""  # noqa: E501 (the fold's one-line summary)


def show_linux_recovery(lost: Sequence[Sequence[int]], *, fast: dict, delay_s: float,
                        nbytes: int, mtu: int) -> None:
    """Show (Markdown, sourced from the ledger) one fold on how Linux TCP finds losses sooner
    than this emulator: SACK, RACK and the tail loss probe; how it would repair the replay's
    losses (`lost`: `ex.incast_replay`'s): the sender whose last segment got through by RACK,
    the one that lost its whole tail by a probe; and `linux_estimate_lines` for the incast at
    a datacentre port (`fast`, `delay_s` as there)."""
    k = segment_count(nbytes)
    mss = tcp_payload_bytes(mtu)  # TCP payload per frame
    rack = rack_senders(lost, k)  # a later one arrived
    tail = tail_senders(lost, k)  # nothing arrived
    facts.show(LINUX_RECOVERY.format(
        k=k, seg_kib=SEGMENT_BYTES // KiB, frames=math.ceil(nbytes / mss), mss=mss,
        dupthresh=DUPTHRESH, rack=nth(rack[0]), rack_lost=", ".join(map(str, lost[rack[0] - 1])),
        tail=nth(tail[0]),
        estimate=" ".join(linux_estimate_lines(fast, delay_s=delay_s, nbytes=nbytes))))


def linux_tlp_estimate(model_s: float, *, rtt_s: float,
                       tlp_min_s: float) -> tuple[float, float]:
    """The Linux estimate of an incast that waited the model's RTO once: the probe timeout
    PTO = 2 SRTT + TCP_TIMEOUT_MIN_US (several packets out, SRTT taken as `rtt_s`) and the
    model's time `model_s` with its RTO, max(RTO_MIN_S, 2 round trips), swapped for it.
    Returns (pto, estimated time) in seconds."""
    pto = 2 * rtt_s + tlp_min_s  # 2 SRTT + TCP_TIMEOUT_MIN_US, several packets out
    return pto, model_s - max(fm.RTO_MIN_S, 2 * rtt_s) + pto


def explain_fast_incast(fast: dict, *, delay_s: float, nbytes: int) -> None:
    """Print the drop incast at a datacentre port in this emulator's closed form (`fast`:
    sender count -> `fm.incast` for 2 and 4 senders at 10 Gbit/s with `delay_s` of delay,
    `nbytes` each) and check that the RTO cost four senders over ten times less goodput; then,
    visibly, Linux's probe timer in place of the RTO (`linux_estimate_lines`' first line), so
    that the model's pessimistic timer is not read as a datacentre's cost."""
    model_x = fast[2].goodput / fast[4].goodput
    print(f"10 Gbit/s, 10 us of delay, this model: two senders take {ms(fast[2].time_s)},")
    print(f"four take {ms(fast[4].time_s)} ({fast[4].timeouts} wait for the RTO): "
          f"{model_x:.0f}x less goodput.")
    assert fast[2].goodput > 10 * fast[4].goodput
    print(f"The {model_x:.0f}x is this model's pessimistic timer. "
          + linux_estimate_lines(fast, delay_s=delay_s, nbytes=nbytes)[0][:-1] + " (fold below).")


def linux_estimate_lines(fast: dict, *, delay_s: float, nbytes: int) -> list[str]:
    """Linux's timer for the same incast's lost tail (`fast` as in `explain_fast_incast`,
    `delay_s` one way; `nbytes` per sender, unused: the timer does not depend on it): the tail
    loss probe's timeout (the fixed term from the ledger), rounded up to whole jiffies as Linux
    arms it (linux.tlp_timer_jiffies), at each HZ, beside the model's RTO; then its assumptions.
    Not the incast's time on Linux: that depends on which packets a real port drops."""
    tlp_min = facts.get("linux.tcp_timeout_min_us")  # the probe timer's fixed term
    assert tlp_min.unit == "ms"
    rtt = 2 * delay_s  # the round trip: the delay each way
    pto, _ = linux_tlp_estimate(fast[4].time_s, rtt_s=rtt, tlp_min_s=tlp_min.value * 1e-3)
    rounded = [math.ceil(pto * hz - 1e-9) / hz for hz in HZ]  # whole jiffies, rounded up
    rto = max(fm.RTO_MIN_S, 2 * rtt)
    return [f"Linux's tail loss probe would fire after about "
            f"{' to '.join(ms(t) for t in sorted(rounded))} (2 SRTT + {tlp_min.text}, on whole "
            f"kernel ticks) in place of its {ms(rto)} RTO.",
            f"(SRTT: the smoothed round-trip time, taken unloaded, though queueing during the "
            f"incast lengthens it. Linux timers fire on whole kernel ticks, HZ = "
            f"{' or '.join(map(str, HZ))}: {' or '.join(f'{1e3 / hz:g} ms' for hz in HZ)}. "
            f"This is the timer, not the incast's time on Linux: that depends on which packets "
            f"a real port drops, which this model does not predict.)"]


def per_message_cost_visible(ps: dict, ring: dict) -> bool:
    """Whether the ring's best run sits over 10% above its closed form while the parameter
    server's does not: what a cost per message exchange on this machine would do."""
    return ring["best"] > 1.1 * ring["model"] and ps["best"] < 1.1 * ps["model"]


def explain_appendix(ps: dict, ring: dict, four: dict, tie: dict, skew: dict, *,
                     stagger_s: float, rate: float) -> None:
    """Print the appendix's checks: each run's range against its closed form (`ps`, `ring`:
    `ex.ps_vs_ring` rows), the ring's gap as a per-message cost when it shows, and the drop
    incast's emulated deliveries in its fastest run (`four`) against two replays of it
    (`tie`: all sent at one instant; `skew`: each sender `stagger_s` after the one before):
    how many segments each drops, which segment the stagger saves, and which replay the
    run's deliveries fit within w/2 (`rate`: the NIC's bit/s, for w)."""
    for name, r in (("parameter server", ps), ("ring", ring)):
        print(f"{name}: runs {ms(min(r['times']))} to {ms(max(r['times']))}, closed form "
              f"{ms(r['model'])} ({r['best'] / r['model'] - 1:+.0%} for the best run)")
    if per_message_cost_visible(ps, ring):
        print(f"the ring's {2 * (ring['nodes'] - 1)} rounds sit above their closed form and the "
              f"parameter server's few large messages do not: consistent with a cost per "
              f"message exchange on this machine (not measured separately)")
    w = (SEGMENT_BYTES + HEADER_BYTES) * 8 / rate  # one segment through the port

    def times(t):
        return ", ".join(f"{x * 1e3:.1f}" for x in sorted(t)) + " ms"

    run, limit = best_deliveries(four), four["limit"]
    n_tie, n_skew = (sum(map(len, r["lost"])) for r in (tie, skew))
    print(f"incast with drops, four senders, best run: its messages were delivered at "
          f"{times(run)} (the emulated delivery times the senders stamped).")
    print(f"replayed (no cluster), all at one instant: {times(tie['done'])}, {n_tie} segments "
          f"dropped (the closed form); each sender {stagger_s * 1e6:g} us after the one before: "
          f"{times(skew['done'])}, {n_skew} dropped.")
    for s, (a, b) in enumerate(zip(tie["lost"], skew["lost"]), 1):
        if saved := sorted(set(a) - set(b)):
            print(f"A stagger of {stagger_s * 1e6:g} us saves one drop, one resend (w = "
                  f"{ms(w)}) fewer: the {nth(s)} sender's segment {', '.join(map(str, saved))}. "
                  f"At one instant it meets a backlog of exactly {limit} segment times, and "
                  f"the port drops a packet that finds {limit} or more times its own work "
                  f"queued (a tie counts as full); {stagger_s * 1e6:g} us later it gets in.")
    fit = {n: max(abs(x - y) for x, y in zip(run, sorted(r["done"])))
           for n, r in ((n_tie, tie), (n_skew, skew))}
    n = min(fit, key=fit.get)
    if fit[n] < w / 2:
        print(f"These fit the replay with {n} drops: each delivery within w/2 ({ms(w / 2)}) "
              f"of it, the largest gap {fit[n] * 1e3:.2f} ms (from the unrounded times).")
    else:
        late = sum(t >= fm.RTO_MIN_S for t in run)
        late_r = sorted({sum(t >= fm.RTO_MIN_S for t in r["done"]) for r in (tie, skew)})
        both = "both replays" if len(late_r) == 1 else "the replays"
        print(f"These fit neither replay within w/2 ({ms(w / 2)}): {late} of them came after "
              f"the RTO, against {' or '.join(map(str, late_r))} in {both}. The replays run "
              f"the same port code, so the sends were timed differently; the run does not "
              f"record its send times.")
    assert n_skew == n_tie - 1 and abs(tie["time_s"] - four["model"].time_s) < 1e-6


# The "On a real GPU cluster" box: how RDMA fabrics avoid or repair the drops above (ledger ids
# in [[...]], rendered with their sources by `facts.show`); the mechanisms sit in a fold.
REAL_CLUSTER = """
- **TCP's timeout-driven incast concerns NCCL only over sockets.** Over InfiniBand or RoCE
  NCCL uses RDMA ([[rdma.kernel_bypass]] between registered buffers, into which NCCL copies
  the user's data) and the NIC retransmits: after a NAK it goes back N,
  about a round trip after the loss ([[paper.mittal_irn_2018]]); a loss no NAK reports waits
  the QP's ACK timeout, nominally [[nccl.ib_timeout_default_time]] at NCCL's default. Without
  RDMA, NCCL falls back to [[nccl.ib_disable_ip_sockets]], TCP as in Gloo, and the incast above
  applies.
- **InfiniBand** uses [[infiniband.credit_flow_control]] (a sender transmits only when the
  next hop has advertised free buffer): switches do not drop for lack of buffer.
- **RoCE** is commonly made lossless with [[ieee.pfc_8021qbb]]. On these fabrics incast is
  back-pressure, not drops.
- **Not every GPU fabric is lossless:** RoCE can run lossy, with switches marking packets so
  that senders slow down ([[nvidia.roce_lossy_mode]]), and AWS's network adapter, EFA, sprays
  packets over many paths and retransmits in the NIC ([[aws.efa_srd]]).

<details><summary>The mechanisms: RC retransmission in the spec and in ConnectX NICs, InfiniBand's packet lifetimes, PFC's side effects and DCQCN</summary>

- **Two more terms.** *PSN* (packet sequence number): every packet on an RC connection
  carries one; a NAK reports a gap in them. *ECN* (explicit congestion notification): a switch
  whose queue passes a threshold marks packets, so that senders slow down before the buffer
  fills.
- **RC retransmission.** Under the InfiniBand spec's RC rules, as in Linux's soft-RoCE:
  [[linux.rxe_nak_seq_retry]]. A loss no NAK reports (a lost tail, last ACK, NAK or resend)
  waits the QP's ACK timeout, [[nccl.ib_timeout_formula]], with NCCL_IB_TIMEOUT =
  [[nccl.ib_timeout_default]]. ConnectX RoCE NICs also have a [[nvidia.roce_selective_repeat]]
  control and [[nvidia.roce_adaptive_retransmission]]; with adaptive retransmission on, the
  timer starts far shorter and grows, its maximum [[nvidia.roce_adp_timeout_cap]]. RDMA does
  not make incast drops irrelevant: on a lossy fabric they happen and cost go-back-N or the
  QP's ACK timeout.
- **For congestion, InfiniBand drops only packets held too long** ([[infiniband.switch_lifetime_discard]]:
  how long a packet may wait at the head of an output queue, or in the switch, before it is
  discarded).
- **Back-pressure spreads.** PFC pauses a whole port priority, stalling flows that never touch
  the full port; [[paper.dcqcn_2015]] (a congestion control for RoCE, built into ConnectX NICs)
  slows senders on ECN marks to need fewer pauses. Meta's 2024 training fabric uses
  [[meta.roce_no_dcqcn]]. InfiniBand's credits can likewise stall upstream links; its
  [[infiniband.congestion_control]] slows the sources.

</details>
"""  # noqa: E501 (the fold's one-line summary)
