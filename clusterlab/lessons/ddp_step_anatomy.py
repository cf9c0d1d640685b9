"""Notebook 03, anatomy of a DDP step: what the learner reads from its runs.

Each function takes what `clusterlab.experiments.ddp` returned (a `DDPRun`, a sweep, a grid)
and draws the figure, prints the sentences computed from it, or states the measured
conclusions through `conclude`. The pure helpers (`buckets_done_before_backward`,
`nominal_overlap`, `sweep_effects`, `step_range`, `bucket_verdicts`, `network_share`) decide
what is said and are tested on synthetic runs in `tests/test_lessons_ddp_jitter.py` and
`tests/test_lessons_ddp_step_anatomy.py`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .. import facts, models
from ..experiments import ddp
from ..experiments.common import conclude
from .show import fold, ms

# --- DDP through the emulated network ---------------------------------------------------------


def plot_step_phases(runs: dict) -> None:
    """Draw where a typical (median) step's time goes, one bar per run: forward, backward,
    wait and optimizer, stacked in milliseconds."""
    fig, ax = plt.subplots(figsize=(9, 2.8))
    for y, run in enumerate(runs.values()):
        s, left = run.summary(), 0.0
        for phase in ddp.PHASES:
            ax.barh(y, s[f"{phase}_s"] * 1e3, left=left, color=ddp.PHASE_COLORS[phase],
                    label=phase if y == 0 else None)
            left += s[f"{phase}_s"] * 1e3
    ax.set_yticks(range(len(runs)), list(runs))
    ax.set_xlabel("typical (median) step, ms (4 ranks, one 2.1 MB bucket)")
    ax.legend(ncols=4, loc="upper center", bbox_to_anchor=(0.5, -0.35), fontsize=8)
    ax.set_title("Where a DDP step's time goes")
    fig.tight_layout()
    plt.show()


def explain_floor(plain, netem, *, predicted: float) -> None:
    """Conclude first that the network made the wait and the step longer, then print the wait
    per step on plain Gloo (this host's floor) and on the emulated network against `predicted`
    (one ring all-reduce), check that every replica ended identical to plain Gloo's (same hash
    on every rank, the same parameter sum as plain Gloo's), and print the details line (wait
    against the bound max(floor, network), issue lag)."""
    p = netem.world_size
    a, b = plain.summary(), netem.summary()
    n_steps = netem.phases()["step"].shape[1]
    # the NIC's delay, from the prediction's 2(p-1) rounds of one delay each
    delay_ms = predicted / (2 * (p - 1)) * 1e3
    net = f"{delay_ms:g} ms network"
    assert b["wait_s"] > 0.9 * predicted   # one bucket: nothing overlapped
    # the one-line message first, then the numbers behind it
    conclude(b["wait_s"] > a["wait_s"] and b["step_s"] > a["step_s"],
             f"the {net} made the wait and the step longer than plain Gloo")
    print(f"Wait per step (median of {n_steps}): plain Gloo {ms(a['wait_s'])} (this host's floor), "
          f"{net} {ms(b['wait_s'])}.")
    print(f"Predicted for one ring all-reduce: {2 * (p - 1)} rounds x {delay_ms:g} ms = "
          f"{ms(predicted)}.")
    assert netem.replicas_identical and plain.replicas_identical
    assert np.isclose(netem.ranks[0]["checksum"], plain.ranks[0]["checksum"], rtol=1e-6)
    print(f"All {p} replicas ended with identical parameters, their checksum (the parameters' "
          f"sum) equal to plain Gloo's run's to 6 significant digits.")
    expected, lag = max(a["wait_s"], predicted), netem.issue_lag()
    fold("Details: the steps, and what this host adds",
         f"Step {ms(a['step_s'])} on plain Gloo, {ms(b['step_s'])} on the {net}; "
         f"backward {ms(a['backward_s'])} and {ms(b['backward_s'])}. The emulator ends an "
         f"all-reduce at the later of this host's floor ({ms(a['wait_s'])}) and the network "
         f"({ms(predicted)}), so expect a wait of {ms(expected)}; it was {ms(b['wait_s'])}. It "
         f"also cannot end before the last rank issues it: the other ranks issued the bucket on "
         f"average {ms(lag)} earlier.")


# --- Per-rank timeline ------------------------------------------------------------------------


def plot_toy_timeline(*, buckets: int = 3, interval_s: float = 4e-3,
                      allreduce_s: float = 6e-3) -> None:
    """Draw a synthetic, three-bucket DDP backward (no run): bucket i is ready every
    `interval_s`, the last at the end of backward; the stream all-reduces one bucket at a time
    for `allreduce_s` each, so a bucket that is ready while another is in flight waits in the
    queue. Whatever is still queued or in flight when backward ends is the wait. Then print
    the toy's stream busy time, wait and hidden part, computed by `nominal_overlap`'s rule."""
    backward = buckets * interval_s
    ready = [interval_s * (i + 1) for i in range(buckets)]
    start, done, end = [], [], 0.0
    for r in ready:   # first in, first out: a bucket starts when it is ready and the stream free
        start.append(max(end, r))
        end = start[-1] + allreduce_s
        done.append(end)
    fig, ax = plt.subplots(figsize=(9, 2.4))
    ax.barh(1, backward * 1e3, color=ddp.PHASE_COLORS["backward"], height=0.6)
    ax.barh(1, (end - backward) * 1e3, left=backward * 1e3, color=ddp.PHASE_COLORS["wait"],
            height=0.6)
    ax.text(backward * 1e3 / 2, 1, "backward", ha="center", va="center", color="white")
    ax.text((backward + end) * 1e3 / 2, 1, "wait", ha="center", va="center", color="white")
    for i, (r, a, b) in enumerate(zip(ready, start, done)):
        if a > r:   # ready but queued behind the bucket in flight
            ax.barh(-0.6, (a - r) * 1e3, left=r * 1e3, height=0.3, color="none",
                    edgecolor=ddp.PHASE_COLORS["comm"], hatch="///", linewidth=0.8)
            ax.text((r + a) * 1e3 / 2, -0.6, f"{i + 1}", ha="center", va="center", fontsize=8)
        ax.barh(0, (b - a) * 1e3, left=a * 1e3, height=0.45, color=ddp.PHASE_COLORS["comm"],
                edgecolor="black", linewidth=0.6)
        ax.text((a + b) * 1e3 / 2, 0, f"bucket {i + 1}", ha="center", va="center", fontsize=8)
        ax.axvline(r * 1e3, color="grey", linewidth=0.6, linestyle=":")
        ax.text(r * 1e3, 1.45, f"{i + 1} ready", ha="center", fontsize=8)
    ax.set_yticks([1, 0, -0.6], ["compute", "all_reduce stream", "queued"])
    ax.set_ylim(-1.0, 1.7)
    ax.set_xlabel("ms (a toy: 3 buckets, one ready every 4 ms, 6 ms per all-reduce)")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=ddp.PHASE_COLORS["comm"], ec="black"),
                       plt.Rectangle((0, 0), 1, 1, fc="none", ec=ddp.PHASE_COLORS["comm"],
                                     hatch="///")],
              labels=["in flight", "ready, queued"], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1))
    ax.set_title("A toy DDP backward: ready, queued, in flight")
    fig.tight_layout()
    plt.show()
    busy, wait = buckets * allreduce_s, end - backward
    print(f"Toy: stream busy {ms(busy, digits=0)}, of which {ms(busy - wait, digits=0)} ran "
          f"under backward (hidden) and {ms(wait, digits=0)} after it (the wait).")


def buckets_done_before_backward(run) -> list[int]:
    """For each complete rank-step of `run` (every bucket recorded), how many buckets were
    reduced by the time backward ended."""
    return [sum(b["done"] <= r["backward_end"] for b in r["buckets"])
            for rank in run.ranks for r in rank["records"]
            if len(r["buckets"]) == len(run.bucket_sizes)]


def nominal_overlap(p: int, bucket_sizes, nic: str, *, backward_s: float) -> dict:
    """The overlap an ideal host would give (seconds): the k buckets become ready evenly through
    a backward of `backward_s` (bucket i at (i + 1) / k of it: one per layer here, the last at
    its end) and are all-reduced one at a time, first in, first out, each at its alpha-beta
    ring time on `nic` (`per_bucket`). `busy` is their sum, `exposed` the time the stream runs
    past the end of backward, `hidden` the rest, `interval` the time between two buckets."""
    k = len(bucket_sizes)
    per_bucket = [ddp.predicted_comm(p, [n], nic) for n in bucket_sizes]
    end = 0.0
    for i, cost in enumerate(per_bucket):
        end = max(end, backward_s * (i + 1) / k) + cost
    busy = sum(per_bucket)
    exposed = max(0.0, end - backward_s)
    return {"per_bucket": per_bucket, "busy": busy, "exposed": exposed,
            "hidden": busy - exposed, "interval": backward_s / k}


def explain_overlap(small, small_runs: list, checks: dict, *, baseline=None) -> None:
    """Print the exposed wait of `small` and why (how many buckets were still unfinished when
    backward ended), then the share it hid (1 - wait / stream busy) beside the most an ideal
    host could hide (`nominal_overlap`, a backward of nominal length), saying when this host
    hid more mainly because its backward ran long. Only the first line (the queue mechanism,
    the lesson) stays in sight; a fold holds the share, the ideal host with
    this run's backward, the split of that stretch (when `baseline`, a one-bucket run of the
    same model with no bucket in flight during its backward, is given), the share over
    `small_runs` and their single steps, this host's costs, and checks of the timeline itself
    (phases add up, no all-reduce beats 2(p-1) latencies, buckets complete in issue order)."""
    # Checks of the timeline itself (not the lesson): the run is consistent.
    assert checks["phase_sum_error"] < 1e-6
    assert checks["latency_slack"] >= 0
    assert checks["fifo"]
    counts = buckets_done_before_backward(small)
    s = small.summary()
    assert 0 < s["hidden_fraction"] < 1
    per_run = [r.summary()["hidden_fraction"] for r in small_runs]
    per_step = np.concatenate([r.hidden_fractions() for r in small_runs])
    cfg = small.config   # the emulated accelerator's sleeps, per layer
    nominal = {"forward": cfg["depth"] * cfg["forward_s"],
               "backward": cfg["depth"] * cfg["backward_s"]}
    ideal = nominal_overlap(small.world_size, small.bucket_sizes, cfg["nic"],
                            backward_s=nominal["backward"])
    ideal_share, share = ideal["hidden"] / ideal["busy"], 1 - s["wait_s"] / s["comm_busy_s"]
    ranks, steps = small.phases()["step"].shape
    k = len(small.bucket_sizes)
    stretched = s["backward_s"] > 1.1 * nominal["backward"]
    # the result (the exposed wait) and why stays in sight; the share against the ideal host
    # goes in the fold, so that the learner's first reading is the queue, not "measured differs
    # from predicted", and this host's stretched backward never reads as a property of DDP
    print(f"{ms(s['wait_s'])} of the exchange stayed exposed per step: a median of "
          f"{k - np.median(counts):g} of {k} buckets were still unfinished when backward ended "
          f"(over {ranks} ranks x {steps} steps), because the stream runs one bucket at a time.")
    against = (f"Overlap hid {share:.0%} of the {ms(s['comm_busy_s'])} on the stream; an ideal "
               f"host (the nominal {ms(nominal['backward'])} backward, the alpha-beta model) "
               f"hides at most {ideal_share:.0%}")
    if stretched and share > ideal_share:
        # "mainly", for this run: repeats of the same configuration hide different shares
        against += (f". This host hid more mainly because, for this run, its backward ran "
                    f"{ms(s['backward_s'] - nominal['backward'])} long ({ms(s['backward_s'])}), "
                    f"which left the queue more time under it")
    details = [against + ".", f"Hidden share = 1 - wait / stream busy = 1 - {ms(s['wait_s'])} / "
               f"{ms(s['comm_busy_s'])} = {share:.0%}; the ideal host hides "
               f"{ms(ideal['hidden'])} of {ms(ideal['busy'])}."]
    why = ""
    if stretched:
        slow = nominal_overlap(small.world_size, small.bucket_sizes, cfg["nic"],
                               backward_s=s["backward_s"])
        details.append(f"Backward took {ms(s['backward_s'])}, not {ms(nominal['backward'])}, "
                       f"which leaves more time to hide under: the same model with this "
                       f"{ms(s['backward_s'])} backward hides {slow['hidden'] / slow['busy']:.0%}.")
        if baseline is not None:
            base = baseline.summary()["backward_s"]
            why = (f"Backward {ms(base)} in the one-bucket run of the first section (no bucket "
                   f"in flight: the sleeps run long, the real layers and autograd add time)")
            if s["backward_s"] > base + 1e-3:
                why += (f", {ms(s['backward_s'] - base)} more here, with buckets in flight "
                        f"(likely the hook, Gloo's threads and the emulator competing with the "
                        f"layers for this host's cores and Python's GIL; these runs do not "
                        f"separate the causes)")
            why += "."
    else:
        details.append(f"Backward took {ms(s['backward_s'])}, close to its nominal "
                       f"{ms(nominal['backward'])}.")
    details.append(f"Repeats: {len(small_runs)} runs hid "
                   f"{', '.join(f'{h:.0%}' for h in per_run)}; their {len(per_step)} single "
                   f"steps {per_step.min():.0%}-{per_step.max():.0%}.")
    # this host's costs, apart from the result
    details.append(f"Host cost (this machine's, not a GPU's): forward {ms(s['forward_s'])} "
                   f"(nominal {ms(nominal['forward'])}).{' ' + why if why else ''}")
    details.append(f"Check of the set-up: {checks['collectives']} collectives passed: phases "
                   f"add up to the step (error {checks['phase_sum_error']:.0e} s), no all-reduce "
                   f"faster than 2(p-1) latencies, buckets completed in issue order.")
    if checks["gap"] >= 0.1 * s["step_s"]:  # the timeline missed time between steps
        details.append(f"Note: up to {checks['gap'] * 1e3:.1f} ms passed between two steps on "
                       f"one rank, outside every phase: this machine descheduled the rank (it is "
                       f"busy right now).")
    fold("Details: the ideal host, repeats, this host's costs, checks", "\n".join(details))


# --- Latency-bound or bandwidth-bound ---------------------------------------------------------


def plot_sweep(sweep: dict, *, ranks: int = 4) -> None:
    """Draw the sweep's communication time per step against the delay (left) and the rate
    (right), with the alpha-beta model and its latency and bandwidth terms."""
    p, sizes = ranks, sweep["delay"][0]["bucket_sizes"]
    grids = {"delay": np.linspace(0.5, 4, 50), "rate": np.geomspace(250, 1000, 50)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    for ax, kind, xkey, xlabel in ((axes[0], "delay", "delay_ms", "NIC delay, ms (rate 1 Gbit/s)"),
                                   (axes[1], "rate", "rate_mbit",
                                    "NIC rate, Mbit/s (delay 0.5 ms)")):
        rows, g = sweep[kind], grids[kind]
        nics = [f"delay {v:g}ms rate 1000mbit" if kind == "delay" else
                f"delay 0.5ms rate {v:g}mbit" for v in g]
        lat = [f"delay {v:g}ms" if kind == "delay" else "delay 0.5ms" for v in g]
        bw = ["rate 1000mbit" if kind == "delay" else f"rate {v:g}mbit" for v in g]
        ax.plot([r[xkey] for r in rows], [r["comm_busy_s"] * 1e3 for r in rows], "o", ms=8,
                label=f"measured ({rows[0]['steps']} steps each)")
        ax.plot(g, [ddp.predicted_comm(p, sizes, s) * 1e3 for s in nics], "-", color="k",
                label="α-β model")
        ax.plot(g, [ddp.predicted_comm(p, sizes, s) * 1e3 for s in lat], ":", color="#C44E52",
                label="latency term")
        ax.plot(g, [ddp.predicted_comm(p, sizes, s) * 1e3 for s in bw], "--", color="#4C72B0",
                label="bandwidth term")
        ax.set_xlabel(xlabel)
    axes[1].set_xscale("log")
    axes[1].minorticks_off()
    axes[1].set_xticks([250, 500, 1000], ["250", "500", "1000"])
    axes[0].set_ylabel("all-reduce time per step, ms")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    plt.show()


def sweep_effects(sweep: dict) -> dict:
    """What the sweep shows: `by_delay` and `by_rate`, the communication time the largest
    delay and the lowest rate added per step; `points`, each network by (delay, rate); and
    `close`, the networks whose measured time is within 15 % of the alpha-beta model."""
    d, r = sweep["delay"], sweep["rate"]
    points = {(x["delay_ms"], x["rate_mbit"]): x for x in d + r}
    close = [k for k, x in points.items()
             if abs(x["comm_busy_s"] - x["predicted_comm_s"]) <= 0.15 * x["predicted_comm_s"]]
    return {"by_delay": d[-1]["comm_busy_s"] - d[0]["comm_busy_s"],
            "by_rate": r[0]["comm_busy_s"] - r[-1]["comm_busy_s"],
            "points": points, "close": close}


def explain_sweep(sweep: dict, *, bandwidth_over_latency: float) -> None:
    """Conclude first which knob moved the communication more and say whether the bucket (its
    bandwidth term `bandwidth_over_latency` times its latency term) is bandwidth-bound; then
    print what the delay and the rate each added against the model, how many networks the
    model fits, and the sweep's table (model against measured)."""
    d, r = sweep["delay"], sweep["rate"]
    e = sweep_effects(sweep)
    by_delay, by_rate, points, close = e["by_delay"], e["by_rate"], e["points"], e["close"]
    swept = conclude(by_rate > by_delay > 0, "the rate cut moved the communication time more "
                     "than the delay, and both moved it")
    print(f"The bucket's bandwidth term is {bandwidth_over_latency:.1f}x its latency term: "
          f"bandwidth-bound" + ("; the sweep agrees, as it must: the emulator implements this "
                                 "model." if swept else "."))
    print(f"\nDelay {d[0]['delay_ms']:g} -> {d[-1]['delay_ms']:g} ms added {ms(by_delay)} per step "
          f"(model {ms(d[-1]['predicted_comm_s'] - d[0]['predicted_comm_s'])}); rate "
          f"{r[-1]['rate_mbit']:g} -> {r[0]['rate_mbit']:g} Mbit/s added {ms(by_rate)} (model "
          f"{ms(r[0]['predicted_comm_s'] - r[-1]['predicted_comm_s'])}).")
    print(f"{len(close)} of {len(points)} networks within 15 % of the alpha-beta model the "
          f"emulator implements (a consistency check).")
    table = ["network (delay, rate)   model ms  measured ms  measured/model"]
    for (dl, rt), x in sorted(points.items()):
        table.append(f"{dl:5g} ms {rt:5g} Mbit/s  {x['predicted_comm_s'] * 1e3:8.1f}  "
                     f"{x['comm_busy_s'] * 1e3:11.1f}  "
                     f"{x['comm_busy_s'] / x['predicted_comm_s']:14.2f}")
    fold("Details: each network, model against measured", "\n".join(table), pre=True)
    assert all(x["comm_busy_s"] > 0.9 * x["predicted_comm_s"]
               for x in points.values())  # never faster


# --- Buckets and overlap ----------------------------------------------------------------------


def plot_buckets(grid: dict, networks: dict) -> None:
    """Draw, per network and variant, the exposed and hidden communication, the median step
    and the alpha-beta model's communication per step."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (label, rows) in zip(axes, grid.items()):
        names = [f"{cap:g} MiB\n{mode}" for cap, mode in rows]
        hidden = [max(0.0, r["comm_busy_s"] - r["wait_s"]) * 1e3 for r in rows.values()]
        exposed = [r["wait_s"] * 1e3 for r in rows.values()]
        ax.bar(names, exposed, color=ddp.PHASE_COLORS["wait"], label="exposed (accelerator waits)")
        ax.bar(names, hidden, bottom=exposed, color=ddp.PHASE_COLORS["comm"], alpha=0.6,
               label="hidden (ran under backward)")
        ax.plot(names, [r["step_s"] * 1e3 for r in rows.values()], "k_", ms=28, mew=2.5,
                label="step time (median)")
        ax.plot(names, [ddp.predicted_comm(4, r["run"].bucket_sizes, networks[label]) * 1e3
                        for r in rows.values()], "kx", ms=9, mew=2,
                label="α-β model: communication per step")
        ax.set_title(f"{label}: {networks[label]} (medians of 6 steps)")
        ax.tick_params(axis="x", labelsize=8)
    axes[0].set_ylabel("ms per step")
    fig.legend(*axes[0].get_legend_handles_labels(), ncols=4, fontsize=8, loc="lower center",
               handlelength=4)   # room for the 28-point step marker beside its label
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    plt.show()


def step_range(row: dict) -> tuple[float, float, int]:
    """Each step's time (mean over ranks): the fastest and slowest of the few steps measured,
    and how many steps there were."""
    steps = row["run"].phases()["step"].mean(axis=0)
    return steps.min(), steps.max(), len(steps)


def bucket_verdicts(grid: dict) -> dict:
    """What the buckets-and-overlap grid decides. Latency-bound: `big_median` (the slower
    median step of the two one-bucket variants) against `small_fastest` (the fastest single
    step of either 0.25 MiB variant). Bandwidth-bound: `small_bw` (0.25 MiB with overlap) and
    `big_wait` (the smaller wait of the one-bucket variants); `clear` when small buckets'
    slowest step beat every other variant's fastest, `beaten` when another variant's slowest
    step beat their fastest."""
    lat, bw = grid["latency-bound"], grid["bandwidth-bound"]
    small_bw = bw[(0.25, "overlap")]
    return {
        "big_median": max(lat[(25.0, m)]["step_s"] for m in ("overlap", "fused")),
        "small_fastest": min(step_range(lat[(0.25, m)])[0] for m in ("overlap", "deferred")),
        "small_bw": small_bw,
        "big_wait": min(bw[(25.0, m)]["wait_s"] for m in ("overlap", "fused")),
        "clear": all(step_range(small_bw)[1] < step_range(r)[0] for k, r in bw.items()
                     if k != (0.25, "overlap")),
        "beaten": any(step_range(r)[1] < step_range(small_bw)[0] for k, r in bw.items()
                      if k != (0.25, "overlap")),
    }


def _median_gain(bw: dict) -> str:
    """Bandwidth-bound, when the step ranges overlap: 0.25 MiB overlap's median step against one
    big bucket's, beside the exposure it saved and this host's backward with buckets in flight."""
    small, big = bw[(0.25, "overlap")], bw[(25.0, "overlap")]
    gain, saved = big["step_s"] - small["step_s"], big["wait_s"] - small["wait_s"]
    bwd = bw[(0.25, "deferred")]["backward_s"]
    stretch = (f"buckets in flight stretched this host's backward from {ms(bwd)} (deferred) to "
               f"{ms(small['backward_s'])}" if small["backward_s"] > 1.1 * bwd else
               f"this host's backward took {ms(small['backward_s'])} against {ms(bwd)} deferred")
    if gain <= 0:
        head = (f"But its median step was not shorter than one big bucket's ({ms(small['step_s'])} "
                f"against {ms(big['step_s'])}): ")
    else:
        head = (f"Its median step was {ms(gain)} shorter than one big bucket's "
                f"({ms(small['step_s'])} against {ms(big['step_s'])})"
                + (f", less than the {ms(saved)} of exposure it saved: " if gain < saved else ": "))
    return head + stretch + ". Their step ranges overlap (table in the fold)."


def explain_buckets(grid: dict, networks: dict, *,
                    backward_s: float = ddp.DEFAULTS["depth"] * ddp.DEFAULTS["backward_s"],
                    floor_s: float | None = None) -> None:
    """Conclude, on the latency-bound network, that big buckets beat small ones and, on the
    bandwidth-bound one, that small buckets with overlap exposed the least (each verdict with its
    numbers); print how far the step ranges support the second, the host's stretch of backward
    with what the run hid against an ideal host with a backward of nominal `backward_s`
    (`nominal_overlap`), and the table of every variant (step, range, exposed, hidden,
    backward). With `floor_s` (plain Gloo's wait, this host's own cost of the exchange, from
    a separate run) it also prints that floor beside the latency-bound all-reduce."""
    lat, bw = grid["latency-bound"], grid["bandwidth-bound"]
    n_steps = step_range(lat[(25.0, "overlap")])[2]
    details = [f"{'network':<16}{'variant':<19}{'step':>9}{'step range':>18}{'exposed':>10}"
               f"{'hidden':>10}{'backward':>10}"]
    for label, g in grid.items():
        for (cap, mode), r in g.items():
            lo, hi, _ = step_range(r)
            details.append(f"{label:<16}{f'{cap:g} MiB {mode}':<19}{ms(r['step_s']):>9}"
                           f"{ms(lo) + '-' + ms(hi):>18}{ms(r['wait_s']):>10}"
                           f"{ms(max(0.0, r['comm_busy_s'] - r['wait_s'])):>10}"
                           f"{ms(r['backward_s']):>10}")
    # Latency-bound, the question asked: big buckets against small (each big-bucket variant's
    # median step against the fastest step of either small one).
    v = bucket_verdicts(grid)
    big_median, small_fastest, small_bw, big_wait = (v["big_median"], v["small_fastest"],
                                                     v["small_bw"], v["big_wait"])
    medians = sorted(lat[(25.0, m)]["step_s"] for m in ("overlap", "fused"))
    won = conclude(big_median < small_fastest, f"latency-bound, big buckets win: both 25 MiB "
                   f"medians ({', '.join(ms(m) for m in medians)}) beat even the fastest "
                   f"0.25 MiB step ({ms(small_fastest)})")
    exposed_least = conclude(small_bw["wait_s"] < big_wait, f"bandwidth-bound, 0.25 MiB with "
                             f"overlap exposed the least ({ms(small_bw['wait_s'])} against "
                             f"{ms(big_wait)} for one big bucket)")
    # Said only as far as the step ranges order them.
    clear, beaten = v["clear"], v["beaten"]
    if exposed_least:
        others = {k: step_range(r) for k, r in bw.items() if k != (0.25, "overlap")}
        (cap, mode), (_, best_hi, _) = min(others.items(), key=lambda kv: kv[1][1])
        print("Its step was also the shortest, its range clear of every other." if clear
              else f"But {cap:g} MiB {mode}'s slowest step ({ms(best_hi)}) beat its fastest "
                   f"({ms(step_range(small_bw)[0])})." if beaten
              else _median_gain(bw))
    if not won:   # the weaker claim, said only where the stronger one was not shown
        conclude(lat[(25.0, "overlap")]["step_s"] < lat[(0.25, "overlap")]["step_s"],
                 "on the latency-bound network one big bucket gave a shorter median step than "
                 "eight small ones")
    # the table (with the fused control) is what the chart shows, in numbers: it goes in the
    # fold with this host's costs, so that the verdicts and the takeaway read straight through
    notes = [f"Medians and ranges of {n_steps} steps per variant; exposed = the accelerator's "
             f"wait, hidden = communication that ran under backward (the rest of the stream's "
             f"busy time). 25 MiB fused is the control: the loop you would write by hand, "
             f"expected to tie with 25 MiB overlap.\n\n```text\n" + "\n".join(details)
             + "\n```"]
    if floor_s is not None:
        one = ddp.predicted_comm(4, lat[(25.0, "overlap")]["run"].bucket_sizes,
                                 networks["latency-bound"])
        notes.append(f"Latency-bound: one all-reduce costs {ms(one)} on the network; this "
                     f"host's own cost, plain Gloo's wait in the first section (a separate run, "
                     f"a rough guide), was {ms(floor_s)}" + (
                         ", larger: one big bucket's wait measures this host more than the "
                         "network." if floor_s > 1.5 * one else
                         ", about as large: one big bucket's wait measures the host about as "
                         "much as the network." if floor_s > 0.5 * one else ", well below it."))
    bwd = bw[(0.25, "deferred")]["backward_s"]
    ideal = nominal_overlap(4, small_bw["run"].bucket_sizes, networks["bandwidth-bound"],
                            backward_s=backward_s)
    hidden = max(0.0, small_bw["comm_busy_s"] - small_bw["wait_s"])
    busy, model = small_bw["comm_busy_s"], ideal["busy"]
    stretched = small_bw["backward_s"] > 1.1 * bwd
    notes.append(f"Host cost: on the bandwidth-bound network backward took "
                 f"{ms(small_bw['backward_s'])} with overlap against {ms(bwd)} deferred (same "
                 f"buckets, none in flight during backward)" + (
                     ": buckets in flight stretch this host's backward (as in the per-rank "
                     "timeline)" if stretched else "") + ".")
    if busy > 1.2 * model:
        said = (f"Its stream was busy {ms(busy)} against the model's {ms(model)} of "
                f"communication: {ms(busy - model)} of it buckets in flight beyond the model "
                f"(waiting for a peer or for this host; this run cannot tell which), so its "
                f"{ms(hidden)} \"hidden\" is not all communication. An ideal host "
                f"({ms(backward_s)} backward) hides {ms(ideal['hidden'])}.")
    else:
        said = (f"Its stream was busy {ms(busy)} against the model's {ms(model)} of "
                f"communication; it hid {ms(hidden)}, an ideal host ({ms(backward_s)} "
                f"backward) {ms(ideal['hidden'])}" + (
                    ": more here mainly because the stretched backward left more time under "
                    "it"
                    if stretched and hidden > ideal["hidden"] else "") + ".")
    notes.append(said + " Judge by the step.")
    fold("Details: the table of every variant; this host's own costs beside the network's",
         "\n\n".join(notes), markdown=True)


# --- How long the accelerator waits -----------------------------------------------------------


def plot_idle(idle: list, *, nic: str, delay_s: float, compute_s: float, nbytes: int) -> None:
    """Draw the share of the step spent waiting for the exchange at each rank count: measured,
    simulated, plain Gloo's floor, and the alpha-only prediction for `nbytes` of gradients
    with `compute_s` of nominal compute."""
    fig, ax = plt.subplots(figsize=(10, 3.4))
    x = np.arange(len(idle))
    ax.bar(x - 0.27, [r["idle_fraction"] * 100 for r in idle], 0.27,
           label=f"measured wait / step, {nic}", color=ddp.PHASE_COLORS["wait"])
    ax.bar(x, [r["sim_idle_fraction"] * 100 for r in idle], 0.27,
           label=f"simulated, {nic} (consistency check)", color="#999999")
    ax.bar(x + 0.27, [r["native_wait_s"] / r["step_s"] * 100 for r in idle], 0.27,
           label="plain Gloo's wait (this host's floor) / the emulated step", color="white",
           edgecolor="k", hatch="//")
    predicted = [models.ring_allreduce(r["ranks"], nbytes, delay_s, 0.0) for r in idle]
    ax.plot(x - 0.27, [e / (compute_s + e) * 100 for e in predicted], "k_", ms=22, mew=2.5,
            label="predicted (nominal compute, α only)")
    ax.set_xticks(x, [f"{r['ranks']} ranks" for r in idle])
    ax.set_ylabel("% of the step")
    ax.set_title(f"Waiting for the exchange, % of the step (one bucket, "
                 f"{len(idle[0]['run'].phases()['step'][0])} steps each)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    plt.show()


def network_share(native_wait_s: float, network_s: float) -> tuple[float, bool]:
    """This host's own wait (plain Gloo) as a share of the network's, and whether the network
    set the wait: only with a margin, the host's cost under 40 % of the network's."""
    host_share = native_wait_s / network_s
    return host_share, host_share < 0.4


def explain_idle(idle: list, *, delay_s: float, compute_s: float) -> None:
    """Conclude first that the idle share grew with the rank count (and that the network, not
    this host's floor, set the wait at the most); then print the idle share at the fewest and
    the most ranks, the network's closed form against plain Gloo's floor, the compute per step
    and the simulator's share."""
    DELAY, compute = delay_s, compute_s
    first, last = idle[0], idle[-1]
    closed = {r["ranks"]: models.ring_allreduce(r["ranks"], r["run"].param_bytes, DELAY, 0.0)
              for r in idle}
    computed = {r["ranks"]: r["forward_s"] + r["backward_s"] for r in idle}
    # The backend completes an operation at max(plain Gloo, network): the network sets the
    # wait only where this machine's own cost of the exchange stays well below it. That
    # matters at the largest count (a host-made wait there could fake the growth); at 2 ranks
    # a host-made wait only shrinks it.
    host_share, network_set = network_share(last["native_wait_s"], closed[last["ranks"]])
    n_steps = len(last["run"].phases()["step"][0])
    # the difference of the two shares as printed (both rounded), so that 82% and 82% never
    # read as a point apart
    points = (int(f"{last['idle_fraction'] * 100:.0f}")
              - int(f"{last['sim_idle_fraction'] * 100:.0f}"))
    # the one-line message first, then the numbers behind it
    fractions = [r["idle_fraction"] for r in idle]
    assert all(f > 0 for f in fractions)
    conclude(fractions[-1] > fractions[0] and network_set,
             f"the idle share grew from {first['ranks']} to {last['ranks']} ranks, and at "
             f"{last['ranks']} ranks the wait ({ms(last['wait_s'])}) was "
             + ("close to" if last["wait_s"] < 1.1 * closed[last["ranks"]] else "above")
             + f" the network's closed form ({ms(closed[last['ranks']])}, which is "
             f"{1 / max(host_share, 1e-9):.1f} times plain Gloo's wait, this machine's own), so "
             f"the network, not this host, set it",
             busy=(f"plain Gloo alone waited {ms(last['native_wait_s'])}, {host_share:.0%} of "
                   f"the network's {ms(closed[last['ranks']])}" if not network_set else None))
    print(f"Idle share: {first['idle_fraction']:.0%} at {first['ranks']} ranks, "
          f"{last['idle_fraction']:.0%} at {last['ranks']} ({ms(last['wait_s'])} of "
          f"{ms(last['step_s'])}; medians of {n_steps} steps).")
    print(f"Network alone at {last['ranks']} ranks: 2(p-1) x {DELAY * 1e3:g} ms = "
          f"{ms(closed[last['ranks']])}. Plain Gloo (this host's floor): "
          f"{ms(last['native_wait_s'])}, {host_share:.0%} of the network's"
          + (": the network set the wait." if network_set else
             ": too close to say the network alone set the wait."))
    # What the added ranks bought: samples per second go as ranks / step time (the same batch
    # per rank), measured and by the closed form with the nominal compute (the prediction).
    gain = (last["ranks"] / last["step_s"]) / (first["ranks"] / first["step_s"])
    nominal_gain = ((last["ranks"] / (compute + closed[last["ranks"]]))
                    / (first["ranks"] / (compute + closed[first["ranks"]])))
    print(f"Throughput (ranks / step time): x{gain:.2f} from {first['ranks']} to "
          f"{last['ranks']} ranks, for x{last['ranks'] / first['ranks']:g} the hardware "
          f"(predicted x{nominal_gain:.2f} with the nominal compute).")
    fold("Details: this host's compute, the simulator",
         f"Compute per step {ms(computed[first['ranks']])} at {first['ranks']} ranks, "
         f"{ms(computed[last['ranks']])} at {last['ranks']} (nominal {ms(compute)}: the sleeps "
         f"run long, and the real layers and Python's autograd add time on this host)."
         + (" The longer compute dilutes the wait, which lifts the measured gain above the "
            "predicted one." if gain > nominal_gain and computed[last["ranks"]] > compute
            else "")
         + f" The simulator, fed the measured compute and the same alpha-only model the "
         f"emulator enforces, gives {last['sim_idle_fraction']:.0%} at {last['ranks']} ranks "
         f"({f'{points:+d} points' if points else 'within 1 point'}): a consistency check, not "
         f"a test against a real network.")
    assert last["wait_s"] > 0.9 * closed[last["ranks"]]   # never faster than the network
    assert all(r["native_wait_s"] > 0 for r in idle)


# --- On a real GPU cluster --------------------------------------------------------------------


def real_cluster_notes() -> str:
    """The section's bullets and its optional NCCL deep dive, for `facts.show`: ledger facts
    in [[...]], and numbers computed from them (NCCL's modelled step latency, a ConnectX-7's
    rate) against this notebook's bandwidth-bound networks."""
    step_s = [facts.get(f"nccl.tuner_net_ring_step_latency_{p}").value * 1e-6
              for p in ("ll", "simple")]
    nic_bytes_s = facts.get("nvidia.connectx7_rate_bytes").value * 1e9
    n_star_real = step_s[1] * nic_bytes_s   # Simple: n* = alpha / beta = alpha x bandwidth
    n_star_here = sorted(ddp.crossover_bytes(1, d, r) for d, r in ((0.5e-3, 1e9), (200e-6, 500e6)))
    return f"""
- **Who waits.** With NCCL, [[pytorch.async_op_cuda_semantics]]; a collective call
  [[pytorch.collective_returns_before_cuda_completes]]. So `loss.backward()` returns before
  the exchange is done, and this notebook's wait becomes idle time on the GPU's compute
  stream, which a host timer sees only at the next host sync (`.item()`, logging).
  ProcessGroupNCCL runs a group's collectives in order on
  [[pytorch.pg_nccl_stream_per_device]], like the stream above (point-to-point sends and
  receives can use streams of their own).
- **DDP defaults.** Buckets are capped at [[pytorch.ddp_bucket_cap_mb]], the first at
  [[pytorch.ddp_first_bucket]]. Backward fills them in roughly the
  [[pytorch.ddp_reverse_parameter_order]], so the first layers' gradients, often a language
  model's input embedding, fill the last bucket, the one always exposed in plain DDP.

<details><summary>More: how DDP builds its buckets, streams, the optimizer, fewer bytes, seeing overlap, its cost</summary>

- **How DDP builds its buckets.** In torch 2.13, passing `bucket_cap_mb`, as here, gives
  the first bucket the same cap. DDP [[pytorch.ddp_bucket_whole_params]]. It averages with
  [[pytorch.ddp_predivide]], as the `allreduce_hook` used here does. The first iteration runs
  with one bucket; the buckets are then [[pytorch.ddp_rebuild_once]], in the order backward
  produced the gradients (with the default find_unused_parameters=False). So a large input
  embedding makes the exposed last bucket large (our reading of these rules; not measured
  here).
- **Streams.** Another process group's collectives can overlap this group's; point-to-point
  sends and receives can be keyed per peer pair, with streams of their own. A plain Gloo
  group can run [[pytorch.gloo_threads_default]] collectives at once.
- **The last bucket and the optimizer.** [[pytorch.ddp_set_last_bucket_cap]] moves the small
  cap to the last bucket, the one that is always exposed. The optimizer waits for the last
  bucket unless it updates each bucket's parameters as soon as that bucket is reduced, as
  DDP's private [[pytorch.ddp_register_fused_optim]] API does (a communication hook that runs
  the optimizer after each bucket's all-reduce).
- **Fewer bytes.** [[pytorch.ddp_compress_hooks]] halve the bytes, hence the bandwidth term,
  not the latency term of a small bucket; DDP accepts the bf16 hook only with
  [[pytorch.ddp_bf16_hook_check]].
- **How to see overlap on GPUs.** Time steps with CUDA events
  ([[pytorch.cuda_event_timing]]); look at the NCCL kernels next to the backward kernels with
  [[pytorch.profiler]] or [[nvidia.nsight_systems]]: the same Gantt chart as above, per CUDA
  stream.
- **Overlap is not free.** NCCL runs its collectives as CUDA blocks (CTAs) on the GPU's SMs
  (streaming multiprocessors, its cores),
  one per channel (a block and its slice of the data), up to [[nccl.max_ctas]].
  NCCL_MAX_CTAS (or `ncclConfig_t.maxCTAs`) caps a communicator's channels, DDP's all-reduce
  included. Fewer leave more SMs to the backward kernels, but each channel then carries more
  of the data; this course measures neither side of that trade, so compare step times.
</details>

<details><summary>Optional deep dive: NCCL's α on a fast fabric, as its tuner models it</summary>

With one [[nvidia.connectx7_rate_bytes]] NIC per GPU and the step latency NCCL's tuner
models for its Simple protocol, [[nccl.tuner_net_ring_step_latency_simple]], n\\* = α/β is
about {n_star_real / 1e3:.0f} kB; a ring's p·n\\* at 64 nodes, one GPU each, is about
{64 * n_star_real / 1e6:.0f} MB, more than a 25 MiB bucket. So in the tuner's model a flat
ring's bucket turns latency-bound as the cluster grows, one reason it moves to its tree at
scale.

Terms: **busbw** (bus bandwidth, notebook 02b) is a collective's bandwidth scaled to compare
with a link's rate; a **graph** is the route (ring or tree) NCCL's topology search picked; LL,
LL128 and Simple are its **protocols**, below. The tuner's hardware latency (`hwLatencies`) per ring step across the network is
[[nccl.tuner_net_ring_step_latency_ll]] for LL (protocols, i.e. how a receiver learns that
data has landed: LL pairs each data word with a flag, trading bandwidth for latency), the
value above for Simple, on top of a base latency per call (`baseLatencies`) and each graph's
network latency; with one GPU per node it takes its tree's values instead: model constants,
not a measured α. Against the bandwidth-bound networks above, Simple's step constant is
{200e-6 / step_s[1]:.0f} to {0.5e-3 / step_s[1]:.0f} times smaller, but the bandwidth is
{nic_bytes_s / (1e9 / 8):.0f} to {nic_bytes_s / (500e6 / 8):.0f} times larger, so n\\* is larger
than their {n_star_here[0] / 1e3:g} to {n_star_here[1] / 1e3:g} kB. NCCL moves somewhat less
than the line rate, which lowers n\\* a little; by analogy only (an NVLink figure, not a NIC
one), it reaches about [[nccl.h100_ring_busbw]] of ring busbw on an H100's 450 GB/s NVLink.
Every call, so every bucket, also pays the base latency, which favours fewer buckets. Only
[[nccl.tuner_ring_inter_steps]] cross the network in the tuner's model (count nodes, not
GPUs), and at many nodes its model favours the tree for small and medium messages
([[nccl.tuner_tree_log_latency]]). See also [[paper.li_pytorch_ddp_2020]].
</details>
"""  # noqa: E501
