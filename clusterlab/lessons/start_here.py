"""What notebook 00 (start here) reads from its runs: the first all-reduce, the impaired
step against its prediction, the real-cluster constants and the doctor's appendix.

Each function takes the data an experiment returned (`clusterlab.experiments.basics`, the
doctor) and prints the sentences, draws the figure or checks the claims the notebook makes.
"""

from __future__ import annotations

import contextlib
import io

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.distributed as dist
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

import clusterlab
from clusterlab import doctor, wire
from clusterlab.experiments import basics
from clusterlab.experiments.common import beyond_closed_form, conclude
from clusterlab.lessons import show


def explain_dilation(dil: dict, *, delay_us: float) -> None:
    """The doctor's verdict in a line: K = 1 (this machine emulates the delay faithfully) or
    K > 1 (every experiment runs K times slower, times divided by K; capped when even the
    largest K leaves this machine's noise visible), and a warning when the lateness this
    machine adds (p99, with its sample count when `dil` has "samples") is above 0.8 of the
    delay x K."""
    K = dil["k"]
    print(f"dilation K = 1: this machine passed the doctor's check for the {delay_us / 1e3:g} ms "
          "delay (appendix: Check your machine)"
          if K == 1 else f"dilation K = {K}: experiments run {K} times slower and reported times "
          f"are divided by {K}, so compute looks {K}x faster than this CPU (appendix: Check your "
          "machine)"
          + (" (capped: expect this machine's noise to show)" if dil["capped"] else ""))
    edge = dil["tail_us"] / (delay_us * K)
    if edge > 0.8:
        n = f", over 2 x {dil['samples']} messages" if "samples" in dil else ""
        print(f"warning: this machine is busy; the lateness it adds to messages (p99, the lateness "
              f"1 message in 100 exceeds{n}) is "
              f"{edge:.0%} of the delay{' x K' if K > 1 else ''}, so single messages below may "
              "arrive late (appendix)")


def timed_all_reduce(repeats):
    """Runs on every rank: `repeats` all-reduces of 4 MiB of float32 ones with plain
    `torch.distributed` (the network is emulated), each timed from a barrier. Returns the
    rank's times in seconds and the first element of the sum (the number of ranks). One
    untimed all-reduce runs first."""
    x = torch.ones(1 << 20)               # 4 MiB of float32 "gradients"
    # one untimed call first: any one-time cost of a first call stays out of the timed repeats
    dist.all_reduce(x)
    times = []
    for _ in range(repeats):
        x.fill_(1.0)
        dist.barrier()
        t = clusterlab.now()
        dist.all_reduce(x)                 # plain torch.distributed; the network is emulated
        times.append(clusterlab.elapsed(t))
    return times, float(x[0])


def plot_all_reduce(times_ms, *, predicted_ms: float) -> None:
    """The first measurement's figure: every repeat of every rank as a dot, each rank's
    median as a bar, the median over repeats of the slowest rank (the printed "measured") as a
    dotted line, the α-β prediction as a dashed line. `times_ms` is [rank, repeat]."""
    times_ms = np.asarray(times_ms)
    ranks, repeats = times_ms.shape
    fig, ax = plt.subplots(figsize=(6, 2.8))
    for r in range(ranks):  # every repeat is a dot: the spread is part of the measurement
        ax.plot(np.full(repeats, r) + np.linspace(-0.15, 0.15, repeats), times_ms[r], "o",
                color="#4C72B0", ms=4, label="measured, one dot per repeat" if r == 0 else None)
        ax.plot([r - 0.25, r + 0.25], [np.median(times_ms[r])] * 2, color="k", lw=1.5,
                label="median" if r == 0 else None)
    ax.axhline(np.median(times_ms.max(axis=0)), color="k", ls=":", lw=1,
               label="median of the slowest rank per repeat (printed below)")
    ax.axhline(predicted_ms, color="#C44E52", ls="--", label="α-β prediction")
    ax.set_xticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    ax.set_ylabel("all-reduce time (ms)")
    ax.set_ylim(0, max(times_ms.max(), predicted_ms) * 1.15)
    ax.legend(loc="lower right", fontsize=8)
    plt.show()


def explain_all_reduce(slowest_ms, replay_ms, *, predicted_ms: float, sums,
                       show_details: bool = False) -> None:
    """The first measurement in three lines: the sum every rank got and the measured median
    (slowest rank per repeat) against the α-β prediction; with `show_details`, a fourth: this
    run's gap split roughly into jitter (the emulator's replay over the model; the message
    headers it adds are at most `HEADER_BYTES / SEGMENT_BYTES` of the prediction) and this
    machine (the measurement over the replay), or, when both parts are smaller than the
    range of the repeats, that this run cannot split the gap. Checks that every rank
    got the number of ranks and that the median is not far below the model (jitter can shave
    only 6 x 0.5 ms off it)."""
    slowest_ms, replay_ms = np.asarray(slowest_ms), np.asarray(replay_ms)
    jitter_part = np.median(replay_ms) - predicted_ms
    headers_ms = predicted_ms * wire.HEADER_BYTES / wire.SEGMENT_BYTES  # an upper bound
    machine = np.median(slowest_ms) - np.median(replay_ms)
    print(f"every rank got the sum {sums[0]:.0f} ({len(sums)} ranks x 1.0)")
    print(f"measured:  {np.median(slowest_ms):5.1f} ms  (median of {len(slowest_ms)} repeats, "
          f"slowest rank; range {slowest_ms.min():.1f}-{slowest_ms.max():.1f})")
    print(f"predicted: {predicted_ms:5.1f} ms  (α-β model)")
    spread = slowest_ms.max() - slowest_ms.min()  # the repeats' range
    if show_details and max(abs(jitter_part), abs(machine)) < spread:
        print(f"the gap, {np.median(slowest_ms) - predicted_ms:+.1f} ms, is jitter plus this "
              f"machine (fold below: where the gap comes from); this run cannot split it: "
              f"both parts are smaller than the range of its repeats, {spread:.1f} ms")
    elif show_details:
        print(f"the gap, roughly (fold below: where the gap comes from): jitter "
              f"{jitter_part:+.1f} ms "
              f"(emulator replay, {len(replay_ms)} draws; message headers at most "
              f"{headers_ms:.2f} ms of it), this machine {machine:+.1f} ms (range of the "
              f"repeats {spread:.1f} ms)")
    assert list(sums) == [float(len(sums))] * len(sums)
    assert np.median(slowest_ms) >= 0.8 * predicted_ms, \
        "jitter can shave only 6 x 0.5 ms off the model"


def compute_median(run) -> float:
    """The median compute time of a `basics.compare` run, in seconds: forward + backward +
    optimizer, per step and rank."""
    compute = sum(run["phases"][name] for name in ("forward", "backward", "optimizer"))
    return float(np.median(compute))


def explain_breakdown(plain, solo) -> None:
    """One line under the phase bars: the median all-reduce phase and step of plain Gloo (2
    ranks) against one rank alone, with the step count, so the text's comparison rests on
    printed numbers (medians: the bars are means, which a few slow steps pull up)."""
    print("median all-reduce phase: plain Gloo (2 ranks) "
          f"{plain['median']['all_reduce'] * 1e3:.1f} ms, one rank alone "
          f"{solo['median']['all_reduce'] * 1e3:.1f} ms; median step "
          f"{plain['step_median'] * 1e3:.1f} against {solo['step_median'] * 1e3:.1f} ms "
          f"({plain['steps']} steps each, this run)")


def explain_impaired_step(plain, impaired, solo, *, replay, compute: float, model_ar: float,
                          spread: float, efficiency: float, dilation: int,
                          show_details: bool = False) -> None:
    """The impaired step: each run's medians (compute, all-reduce, step), then measured,
    predicted (the plain run's compute + the α-β all-reduce, and again with the impaired run's
    own compute, which shared cores can raise) and the efficiency against one rank alone with
    its division (`efficiency` = one rank's median step ÷ the impaired one) - and a fold with
    the bookkeeping: the gap, and the emulator's consistency check that its network (its
    `replay`, seconds) set most of the slowest rank's all-reduce phase, median against median,
    with that phase's range over the steps. The emulator holds each all-reduce until its
    replay ends, so on a quiet machine that check holds by construction: it shows the emulator
    worked, not a finding, and a busy machine's "Not shown" is printed on the main path
    instead. With `show_details` the fold also holds `_impaired_step_details`. Checks that the
    network slowed the step at least by the model's all-reduce."""
    K = dilation
    step = impaired["step_median"]
    own = compute_median(impaired)
    ar_steps = impaired["phases"]["all_reduce"].max(axis=0)  # slowest rank, per step
    ar = float(np.median(ar_steps))
    net_ar = float(np.median(replay))
    # the three runs' medians on the main path: where the time goes is this notebook's question
    print(f"{'median, ms':<16}{'compute':>8}{'all-reduce':>12}{'step':>7}")
    for name, r in (("one rank alone", solo), ("plain Gloo", plain), ("impaired", impaired)):
        print(f"{name:<16}{compute_median(r) * 1e3:8.1f}"
              f"{r['median']['all_reduce'] * 1e3:12.1f}{r['step_median'] * 1e3:7.1f}")
    print()
    print(f"measured:   {step * 1e3:.1f} ms per step (median, {impaired['steps']} steps x 2 "
          "ranks)")
    # the parts are rounded first, so the printed sums add up as printed
    c_ms, ar_ms, step_ms = (round(x * 1e3, 1) for x in (compute, model_ar, step))
    print(f"predicted:  {c_ms + ar_ms:.1f} ms = compute {c_ms:.1f} (the "
          f"plain run's median) + α-β all-reduce {ar_ms:.1f}")
    # the compute is the same work in every run, not the same time: on shared cores (the
    # emulator needs CPU too) it can grow, and that part of the gap is not the network's
    print(f"efficiency: {efficiency:.0%} = one rank alone's {solo['step_median'] * 1e3:.1f} ms / "
          f"{step * 1e3:.1f} ms (median steps"
          + (f"; times divided by K = {K}, which shrinks compute but not the network: "
             "lower than at K = 1)" if K > 1 else ")"))
    lines = [f"measured - predicted = {step_ms - c_ms - ar_ms:+.1f} ms"
             + ("" if show_details else " (show_details=True splits it)"),
             f"With the impaired run's own compute ({own * 1e3:.1f} ms against "
             f"{compute * 1e3:.1f}: same work, shared cores) the model gives "
             f"{round(own * 1e3, 1) + ar_ms:.1f} ms."]
    # conclude(): a claim that fails raises on a quiet machine; on a busy one (this run's
    # compute far above the plain run's, from beyond_closed_form, or a high load average) it
    # says why this run cannot show it - on the main path, where the reader is
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        shown = conclude(net_ar >= 0.5 * ar,
                         f"the emulated network set most of the all-reduce phase (medians: its "
                         f"replay is {net_ar / ar:.0%} of the slowest rank's phase; that phase "
                         f"ranged {ar_steps.min() * 1e3:.1f}-{ar_steps.max() * 1e3:.1f} ms over "
                         f"the {len(ar_steps)} steps)",
                         busy=beyond_closed_form([(own, compute)]))
    verdict = out.getvalue().strip()
    if shown:
        lines.append("Consistency check of the emulator, which holds each all_reduce until its "
                     "replay (its own timing of the ring) ends: "
                     + verdict.removeprefix("Shown on this run: "))
    else:
        print(verdict)
    if show_details:
        lines.append(f"details: all-reduce phase {ar * 1e3:.1f} ms (slowest rank, median over "
                     f"steps); the emulator's replay of the network alone: {net_ar * 1e3:.1f} ms "
                     f"({len(replay)} draws), so this machine added about "
                     f"{(ar - net_ar) * 1e3:+.1f} ms (a difference of medians)")
        lines += _impaired_step_details(impaired, replay=replay, compute=compute,
                                        model_ar=model_ar, spread=spread, own=own)
    show.fold(f"The gap ({step_ms - c_ms - ar_ms:+.1f} ms) and the emulator's own check",
              "\n".join(lines), pre=True)
    assert np.isclose(efficiency, solo["step_median"] / step), \
        "efficiency is one rank's median step over the impaired one"
    assert step > plain["step_median"], "the impaired network must make the step slower"
    assert step >= 0.8 * (compute + model_ar), "the step pays at least the model's all-reduce"
    assert np.all(impaired["phases"]["all_reduce"] >= model_ar - spread), \
        "no round beats delay - jitter"
    assert impaired["median"]["all_reduce"] > plain["median"]["all_reduce"]


def _impaired_step_details(impaired, *, replay, compute: float, model_ar: float,
                           spread: float, own: float) -> list[str]:
    """`explain_impaired_step`'s details, as lines for its fold: the gap split, the range the
    network allows with the all-reduce phases above it, and the single steps above the
    ceiling with their cause."""
    step = impaired["step_median"]
    ceiling = compute + model_ar + spread
    ar_steps = impaired["phases"]["all_reduce"].max(axis=0)  # slowest rank, per step
    gap, shift = step - compute - model_ar, own - compute
    jitter = float(np.median(replay)) - model_ar
    rest = gap - shift - jitter
    lines = [
        f"details: the gap, {gap * 1e3:+.1f} ms = this run's compute {shift * 1e3:+.1f} ms "
        f"against the plain run's (the prediction used the plain run's; shared cores) + "
        f"jitter {jitter * 1e3:+.1f} ms (the emulator's replay of the network over the α-β "
        f"model) + the rest {rest * 1e3:+.1f} ms"
        + (" (this machine: waits for a core, ranks entering late)" if rest >= 0 else
           " (negative, so not this machine's cost, which only adds: medians do not add up "
           "exactly)"),
        f"details: the network allows {(compute + model_ar - spread) * 1e3:.1f}-"
        f"{ceiling * 1e3:.1f} ms (the plain run's compute, every delay at an extreme: a loose "
        f"sanity bound); all-reduce phases above its top, {(model_ar + spread) * 1e3:.1f} ms: "
        f"{int((ar_steps > model_ar + spread).sum())} of {len(ar_steps)}"]
    # single steps (slowest rank, the figure's right panel) above that ceiling: the network's
    # share or this machine's?
    steps = impaired["step"].max(axis=0)
    over = steps > ceiling
    if over.any():
        ar_within = np.all(ar_steps[over] <= model_ar + spread)
        lines.append(
            f"details: {over.sum()} of {len(steps)} single steps (slowest rank, right panel) "
            f"above the top of that range, up to {steps.max() * 1e3:.1f} ms: "
            + ("their all-reduce phases stayed within the jitter's bound, so the excess was "
               "their compute, above the plain run's median (this machine)" if ar_within else
               "some all-reduce phases beyond the jitter's bound (this machine, or a rank "
               "entering the all-reduce late)"))
    return lines


def plot_impaired(runs) -> None:
    """The impaired run's figure: left, its mean time per phase and rank (plain Gloo's bars
    are the figure before, at a scale where they can be read); right, every step's time
    (slowest rank) of the three runs of `basics.compare`, named as the text names them."""
    plain, impaired, solo = runs
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [0.7, 1]})
    basics.plot_breakdown([impaired], ax=ax1)
    ax1.set_title("Impaired network: mean time per phase", fontsize=10)
    ax1.legend(loc="upper center", ncol=2, fontsize=7, frameon=False)  # a narrow panel
    ax1.set_ylim(0, ax1.get_ylim()[1] * 1.15)
    for r, style in ((plain, "o-"), (impaired, "s-"), (solo, "^-")):
        ax2.plot(r["step"].max(axis=0) * 1e3, style, ms=3, label=basics.label(r))
    ax2.set_xlabel("step")
    ax2.set_ylabel("step time, slowest rank (ms)")
    ax2.set_ylim(bottom=0)
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    plt.tight_layout()
    plt.show()


def explain_runs(runs, *, show_details: bool, dilation: int) -> None:
    """The three runs of the loop (`basics.compare`: plain, impaired, one rank alone): whether
    the plain and impaired runs computed bit-for-bit the same losses and weights; with
    `show_details`, their median steps, the mean time per phase and the parameter checksums
    (the steps are printed later, after the prediction, by `explain_impaired_step`). Checks
    that the replicas stayed identical and that the network changed the time, never the
    numbers."""
    plain, impaired, solo = runs
    same = plain["checksums"] == impaired["checksums"] and plain["loss"] == impaired["loss"]
    print(f"plain and impaired runs: losses and weights bit-for-bit identical: {same}")
    if show_details:
        print(f"details: median step ({impaired['steps']} steps): one rank alone "
              f"{solo['step_median'] * 1e3:.1f} ms, plain Gloo "
              f"{plain['step_median'] * 1e3:.1f} ms, impaired "
              f"{impaired['step_median'] * 1e3:.1f} ms")
        print()
        print(f"details: MEAN time per phase (the line above gives medians; a few slow steps "
              f"pull a mean up), dilation K = {dilation}, emulated-cluster time")
        print(basics.format_breakdown(runs))
        print(f"parameter checksums, plain: {plain['checksums']}, impaired: "
              f"{impaired['checksums']}")
    assert len(set(plain["checksums"])) == 1, "the replicas must stay identical"
    assert plain["checksums"] == impaired["checksums"], \
        "the network changes time, never the numbers"
    assert plain["loss"] == impaired["loss"]


# NCCL's network plugin API: how networks other than InfiniBand/RoCE verbs and sockets plug in
NET_PLUGINS = "https://github.com/NVIDIA/nccl/blob/v2.30.7-1/plugins/net/README.md"


def real_cluster_text(*, alpha: float, rate_Bps: float, alpha_nccl: float, nic_Bps: float,
                      first_bucket: float) -> str:
    """The "On a real GPU cluster" bullets as a `facts.show` template: bandwidth and transport
    on the main path; behind a fold (it needs notebook 01's n*), n* = α × bandwidth here
    (`alpha` s, `rate_Bps`) against the n* that NCCL's per-round α for ring/Simple gives
    (`alpha_nccl` s per network round, a ConnectX-7's `nic_Bps`), and the ring size from
    which DDP's `first_bucket` (bytes), cut into p chunks, falls below it in that model (one
    GPU per node). It is a model's heuristic, not a measurement: at that size the tuner also
    weighs LL and LL128, whose network round it charges less."""
    n_star_here, n_star_nccl = alpha * rate_Bps, alpha_nccl * nic_Bps

    def p_first(n_star: float) -> int:  # smallest ring whose chunks of the bucket are below n*
        return max(2, int(first_bucket // n_star) + 1)
    return f'''
- **Bandwidth.** A DGX H100 node has [[nvidia.dgx_h100_compute_nics]] for the compute fabric, one
  per GPU, at [[nvidia.connectx7_rate]] each: the 1.6 MB gradient crosses one in tens of µs, not
  this notebook's 12.8 ms. Inside the node GPUs use NVLink, NVIDIA's GPU-to-GPU link
  ([[nvidia.h100_nvlink_bw_per_direction]] per direction). So there the bandwidth term of this
  step would be small; the per-round latency remains, and it matters for small buckets
  (notebook 01).
- **Transport.** NCCL over InfiniBand or RoCE uses RDMA, remote direct memory access: the NIC
  runs the transport ([[rdma.kernel_bypass]] between registered buffers, into which NCCL
  copies the user's data unless that buffer is registered too), without the system calls and
  socket copies of Gloo over TCP. The NIC reads and writes GPU memory directly only with
  GPUDirect RDMA (NCCL's log shows it: [[nccl.gdrdma_channel_log]]); otherwise NCCL's
  network buffers are in host memory. That is NCCL's built-in InfiniBand-verbs transport; other
  networks use its TCP socket transport or a [network plugin]({NET_PLUGINS}), and with
  `NCCL_DEBUG=INFO` each rank logs which it set up: [[nccl.net_transport_log]].

<details><summary>How small is too small on a real cluster? (needs notebook 01)</summary>

n* = α × bandwidth is the message size whose latency and bandwidth terms are equal (notebook
01): here {alpha * 1e3:g} ms × {rate_Bps / 1e6:g} MB/s = {n_star_here / 1e3:.0f} kB. NCCL's
tuner, [[nccl.tuner_model]], charges [[nccl.tuner_net_ring_step_latency_simple]] per ring
round across the network (NCCL calls a round a step; plus, twice for Simple, the latency
the network plugin reports, 0 for NCCL's own InfiniBand and socket transports) with its
Simple protocol, the one for
large messages. The tuner's per-round α × a ConnectX-7's line rate
([[nvidia.connectx7_rate_bytes]]) gives n* ≈ {n_star_nccl / 1e6:.1f} MB (a simplification:
the tuner also charges a fixed latency per call). So, in NCCL's cost model and if it ran
ring/Simple, DDP's
first bucket ([[pytorch.ddp_first_bucket]]), cut into p chunks, would be latency-bound from
{p_first(n_star_nccl)} nodes (one GPU per node). At that size the tuner also weighs its
low-latency protocols, LL and LL128, whose network round it charges less
([[nccl.tuner_net_tree_step_latency_ll]] and [[nccl.tuner_net_tree_step_latency_ll128]] with
one GPU per node; notebook 01). These are the model's constants, not measured latencies.
</details>
'''


def plot_doctor(info: dict, dil: dict, *, delay_us: float, dilation: int) -> None:
    """The appendix's figure: plain Gloo's one-way p50 and p99, the doctor's faithful floor
    and the late tail through the emulator, on a log axis against the notebook's delay (and
    the delay x K when the doctor chose K > 1)."""
    K = dilation
    native = info["native_one_way_us"]
    floor_us, tail_us = dil["floor_us"], dil["tail_us"]
    floor_label = ("faithful floor" if info["smallest_faithful_delay_us"]
                   else "largest candidate (none passed)")
    points = {"plain Gloo one-way p50": native["p50"],
              "plain Gloo one-way p99 (for scale)": native["p99"],
              floor_label: floor_us,
              "late tail through the emulator (p99)": tail_us}
    fig, ax = plt.subplots(figsize=(7.5, 2.8))
    ax.plot(np.array(list(points.values())) / 1e3, list(points), "o", color="#4C72B0", ms=7)
    ax.axvline(delay_us / 1e3, color="#C44E52", ls=":", lw=1.5,
               label=f"the notebook's delay, {delay_us / 1e3:g} ms")
    if K > 1:
        ax.axvline(delay_us * K / 1e3, color="#55A868", ls="--", lw=1.5,
                   label=f"x K = {K}: {delay_us * K / 1e3:g} ms")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(axis="x", alpha=0.3)
    ax.set_ylim(-0.6, len(points) - 0.4)
    ax.set_xlabel("ms (log scale)")
    ax.legend(fontsize=8, loc="best", framealpha=0.9)
    ax.set_title(f"This machine against the delay it emulates (K = {K})")
    plt.tight_layout()
    plt.show()


def native_tail_case(info: dict, dil: dict, *, delay_us: float, dilation: int) -> str:
    """Where plain Gloo's one-way p99 lies: "fits" (below the delay x K), "connection" (above
    it, but through the emulator the late tail stays below that p99 minus the floor: a
    threshold rule only; possibly plain Gloo's shared TCP connection, possibly the cores being
    busier while plain Gloo ran) or "busy" (the late tail through the emulator is high too)."""
    native = info["native_one_way_us"]
    if native["p99"] <= delay_us * dilation:
        return "fits"
    if dil["tail_us"] < native["p99"] - dil["floor_us"]:
        return "connection"
    return "busy"


def explain_doctor(info: dict, dil: dict, *, delay_us: float, dilation: int,
                   jitter_us: float | None = None) -> None:
    """How K was chosen, in sentences: the verdict first (K, and the floor x margin and the
    late tail the delay x K must cover), then what plain Gloo's p99 says (`native_tail_case`;
    "just below" within 10% of the delay x K), a warning when the late tail is above 0.8 of
    the dilated delay, and, given the emulated `jitter_us`, a note when the late tail in
    reported time (÷ K) is above it.
    Checks that K meets the doctor's criterion unless capped."""
    K = dilation
    native = info["native_one_way_us"]
    floor_us, tail_us = dil["floor_us"], dil["tail_us"]
    tail = f"late tail {tail_us / 1e3:.2f} ms (p99 over 2 x {dil['samples']} messages)"
    floor = (f"floor {floor_us / 1e3:g} ms x {doctor.FLOOR_MARGIN:g} = "
             f"{doctor.FLOOR_MARGIN * floor_us / 1e3:g} ms")
    if K > 1:
        print(f"K = {K}: the {delay_us / 1e3:g} ms delay does not cover both this machine's "
              f"{floor} and its {tail}, so the experiments above ran at "
              f"{delay_us * K / 1e3:g} ms"
              + (" (capped: that does not cover them either)" if dil["capped"] else "")
              + f" and reported times divided by {K}, this machine's compute and overheads "
              "included")
    else:
        print(f"K = 1: the {delay_us / 1e3:g} ms delay covers this machine's {floor} and its "
              f"{tail}, so the experiments above ran at {delay_us / 1e3:g} ms")
    # how many messages a p99 of 2 x samples rests on
    slowest = max(1, round(0.01 * 2 * native["samples"]))
    dk = "delay" + (" x K" if K > 1 else "")
    case = native_tail_case(info, dil, delay_us=delay_us, dilation=K)
    if case == "fits":
        just = "just " if native["p99"] > 0.9 * delay_us * K else ""
        print(f"plain Gloo's one-way p99, {native['p99'] / 1e3:.2f} ms, is {just}below the {dk}: "
              "99% of its messages fit inside it")
    elif case == "connection":
        print(f"plain Gloo's one-way p99, {native['p99'] / 1e3:.2f} ms (about its {slowest} "
              f"slowest of 2 x {native['samples']} messages), lies above the {dk}: shown for "
              f"scale, it is not the criterion (the late tail through the emulator, "
              f"{tail_us / 1e3:.2f} ms, is)")
    else:
        print(f"plain Gloo's one-way p99, {native['p99'] / 1e3:.2f} ms, lies above the {dk}, and "
              f"through the emulator the late tail is {tail_us / 1e3:.2f} ms: this machine was "
              "busy, and that late tail is what K is set against")
    edge = tail_us / (delay_us * K)
    if edge > 0.8:
        print(f"this machine's late tail is {edge:.0%} of the dilated delay: the experiments ran "
              "at the edge of the doctor's criterion, so a busier moment during a run could push "
              "single messages past it")
    if jitter_us is not None and tail_us / K > jitter_us:
        print(f"the late tail in reported time, {tail_us / K / 1e3:.2f} ms (p99 over 2 x "
              f"{dil['samples']} messages, ÷ K), is above the "
              f"±{jitter_us / 1e3:g} ms jitter: K makes the delay faithful, not a single "
              "message's jitter that small; the all-reduces above end at the emulator's replay "
              "unless Gloo finishes later (fold under the first measurement)")
    assert K >= 1 and (dil["capped"]
                       or delay_us * K >= max(doctor.FLOOR_MARGIN * floor_us, tail_us) - 1e-6)
