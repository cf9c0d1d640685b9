"""What notebook 10b (tensor, pipeline and expert parallelism) reads from its runs.

The experiments are `clusterlab.experiments.parallelism`; here are the figures, the sentences
computed from their results, the consistency asserts and the measured conclusions. Each
`explain_*` appends its run's secondary numbers to the caller's `details` list, which the
notebook's appendix prints.
"""

from __future__ import annotations

from .. import facts, models
from .. import parallelism as par
from ..experiments import parallelism as exp
from ..experiments.common import conclude
from .show import fold, ms

NAME = {"gpipe": "GPipe", "1f1b": "1F1B"}  # the schedules as the text names them


def kb(nbytes: float) -> str:
    """Bytes as kilobytes with one decimal: 12345 -> '12.3 kB'."""
    return f"{nbytes / 1e3:.1f} kB"


def plot_tp(sweep: list[dict]) -> None:
    """Step time against one-way latency, tensor parallel and data parallel, measured (dots)
    against the measured 1 ms step plus the extra latency rounds (dashed)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for kind, color, label in (("tp", "#C44E52", "tensor parallel"),
                               ("tp_dp", "#4C72B0", "data parallel")):
        ax.plot([r["alpha"] * 1e3 for r in sweep], [r[f"{kind}_s"] * 1e3 for r in sweep], "o",
                color=color, ms=8, mec="black", label=f"{label}, measured")
        ax.plot([r["alpha"] * 1e3 for r in sweep],
                [r[f"{kind}_predicted_s"] * 1e3 for r in sweep],
                "--", color=color, label=f"{label}: measured 1 ms step + the extra latency rounds")
    ax.set_xlabel("one-way latency (ms)")
    ax.set_ylabel("step time (ms)")
    ax.set_title("4 MLP blocks on 2 ranks")
    ax.legend(fontsize=8)
    plt.tight_layout()
    plt.show()


def explain_tp(sweep: list[dict], *, details: list[str]) -> bool:
    """The all-reduces per step and the growth of the TP and DP steps from `delay 1ms` to
    `delay 10ms` against their closed forms, and the conclusion (TP grew over 3x as much as
    DP, within 40% of its closed form; the verdict states the measured ratio and error, the
    thresholds only when they are missed). Asserts the counts, the TP output's match with the
    unsplit blocks and the network's floor. Returns whether the conclusion was shown."""
    by_nic = {r["nic"]: r for r in sweep}
    lo, hi = by_nic["delay 1ms"], by_nic["delay 10ms"]
    tp_grow, dp_grow = hi["tp_s"] - lo["tp_s"], hi["tp_dp_s"] - lo["tp_dp_s"]
    tp_pred, dp_pred = (hi["tp_comm_s"] - lo["tp_comm_s"],
                        hi["tp_dp_comm_s"] - lo["tp_dp_comm_s"])
    assert lo["tp_allreduces"] == 2 * 4 and lo["dp_allreduces"] == 1
    assert lo["tp_max_error"] < 1e-5
    for r in sweep:  # the network's floor: a step cannot beat its own communication
        assert r["tp_s"] > 0.9 * r["tp_comm_s"] and r["tp_dp_s"] > 0.9 * r["tp_dp_comm_s"], \
            r["nic"]
    holds = tp_grow > 3 * dp_grow and abs(tp_grow - tp_pred) < 0.4 * tp_pred
    shown = conclude(holds, f"the tensor-parallel step grew {tp_grow / dp_grow:.1f}x as much as "
                     f"the data-parallel one (closed forms: {tp_pred / dp_pred:.1f}x), TP's "
                     f"growth {abs(tp_grow - tp_pred) / tp_pred:.0%} from its closed form (the "
                     "emulator against its own model)"
                     + ("" if holds else "; expected over 3x and within 40%"))
    print(f"All-reduces per step: TP {lo['tp_allreduces']} ({kb(lo['tp_sent'])} sent per rank), "
          f"DP {lo['dp_allreduces']} ({kb(lo['tp_dp_sent'])}).")
    print(f"From delay 1ms to delay 10ms: TP step +{ms(tp_grow)}, DP step +{ms(dp_grow)} "
          f"(closed forms +{ms(tp_pred)} and +{ms(dp_pred)})"
          + (": DP's two rounds are within this machine's noise on this run (appendix)."
             if abs(dp_grow - dp_pred) > 0.25 * dp_pred else "."))
    err = lo["tp_max_error"]
    details.append(
        "TP: output matched the unsplit blocks' (recomputed with the full fp32 matrices) "
        + ("bit-identical on this run" if err == 0 else f"to {err:.1e}")
        + " (tolerance 1e-5); step times are the "
        f"fastest of {lo['steps']} steps after one warm-up; DP's growth is "
        f"{dp_grow / dp_pred:.0%} "
        f"of its closed form (two rounds, one difference of two fastest steps).")
    return shown


def tp_at_production_size(*, hidden: int, seq: int, layers: int, t: int,
                          dtype_bytes: int = 2) -> dict:
    """TP "At production size": a dense model of `layers` layers of width `hidden`, one
    `seq`-token sequence per micro-batch, tensor-parallel over `t` H100s. Prints the verdict
    (its all-reduces over NICs against the compute floor), then their time per micro-batch at
    line rate over NVLink and over NICs against that floor; the arithmetic in a fold. Returns
    what the later sections reuse: the activation's bytes, a NIC's bytes/s, one all-reduce's
    seconds over NVLink, the compute floor per micro-batch (s) and `t`."""
    act = seq * hidden * dtype_bytes  # one micro-batch's activation at a layer boundary, bytes
    count = par.tp_allreduces(layers)["total"]
    per_mb = par.tp_traffic(layers=layers, ranks=t, activation_bytes=act)
    nvlink = facts.get("nvidia.h100_nvlink_bw_per_direction").value * 1e9  # bytes/s, one way
    nic = facts.get("nvidia.connectx7_rate_bytes").value * 1e9
    one_nv, one_nic = (models.ring_allreduce(t, act, 0.0, 1 / bw) for bw in (nvlink, nic))
    params = 12 * hidden**2 * layers  # per layer 4h² attention + 8h² MLP weights
    # Yardstick: 6 FLOP per parameter and token (forward + backward), split over t GPUs, at the
    # H100's dense BF16 peak: a floor, real training reaches a fraction of the peak.
    compute = 6 * params * seq / t / (facts.get("nvidia.h100_bf16_dense_tflops").value * 1e12)
    assert count * one_nic > compute > count * one_nv
    print(f"Over NICs TP's all-reduces alone would take {count * one_nic / compute:.1f}x the "
          f"compute floor: tensor parallelism stays inside the NVLink domain.")
    print(f"Per micro-batch, {count} all-reduces of {act / 2**20:.0f} MiB at line rate:")
    rows = {f"  over NVLink ({nvlink / 1e9:.0f} GB/s)": count * one_nv,
            f"  over NICs, if TP crossed {t} nodes ({nic / 1e9:.0f} GB/s each)": count * one_nic,
            "  compute, at least": compute}
    for label, seconds in rows.items():
        print(f"{label:50s}{seconds * 1e3:5.0f} ms")
    fold("How these are computed",
         f"{layers} layers × {count // layers} all-reduces of {act / 2**20:.0f} MiB (one "
         f"{seq}-token sequence × hidden {hidden} in bf16); a ring sends 2(t−1)/t = "
         f"{2 * (t - 1) / t:.2f} of each per GPU, {per_mb / 2**30:.0f} GiB in all.\n"
         f"Compute: a {params / 1e9:.0f}B-parameter model (12 h² weights per layer), 6 FLOP per "
         f"parameter and token, split over {t} GPUs, at the H100's dense BF16 peak. Attention's "
         f"own FLOPs (PaLM, appendix B), {12 * layers * hidden * seq / (6 * params):.0%} more, "
         f"are left out, so the ratios are a little high.")
    return {"act": act, "nic": nic, "one_nv": one_nv, "compute": compute, "t": t}


def pp_wait_at_production_size(tp: dict, *, stages: int) -> None:
    """PP "At production size": 1F1B's round-trip wait per micro-batch, 2(p-1)/p hops of one
    activation through a NIC at line rate, against the compute floor per stage, for the TP
    model of `tp_at_production_size` (its return value) cut into `stages` stages; with
    sequence parallelism each TP rank sends 1/t of the activation. Folded: the numbers, and
    why bytes rather than a hop's fixed latency."""
    p, t, act, nic = stages, tp["t"], tp["act"], tp["nic"]
    hops = 2 * (p - 1) / p
    wait = hops * act / nic  # 1F1B's wait per micro-batch: 2(p-1)/p hops at line rate
    work = tp["compute"] / p  # the compute floor, per stage and micro-batch
    facts.show(f"""
Counting only 1F1B's round trip (line rate, peak compute), for {p} stages of the TP model
above the wait is about {wait / work:.0%} of the compute ({wait / t / work:.0%} with sequence
parallelism). Megatron-Core overlaps these transfers [[megatron.pp_p2p_overlap]], so its
plain 1F1B pays them.

<details><summary>The numbers, and why bytes, not latency</summary>

A hop's fixed latency is of the order of microseconds on a real fabric (NCCL's tuner charges
one network step of a ring [[nccl.tuner_net_ring_step_latency_simple]], plus any latency the
NIC reports, a cost-model constant
for choosing algorithms, not a calibrated latency; measure yours with
[[perftest.ib_write_lat_bw]]), against milliseconds to push one activation through the
link, so what 1F1B waits for is mostly the bytes.

| per micro-batch | plain | with sequence parallelism |
|---|---|---|
| one {act / 2**20:.0f} MiB activation through one {nic / 1e9:.0f} GB/s NIC (a hop) \
| {act / nic * 1e3:.2f} ms | {act / t / nic * 1e3:.2f} ms |
| 1F1B's wait, {hops:.2f} hops (p = {p}) | {wait * 1e3:.2f} ms | {wait / t * 1e3:.2f} ms |
| compute per stage, at least | {work * 1e3:.2f} ms | {work * 1e3:.2f} ms |

A slower network raises the share; slower compute lowers it: at 40% of peak it is
{0.4 * wait / work:.0%}.
</details>
""")


def moe_at_production_size(*, seq: int, nic: float) -> dict:
    """MoE "At production size": what DeepSeek-V3's node-limited routing lets cross
    InfiniBand per GPU and layer (FP8 dispatch of one `seq`-token sequence per GPU) against
    top-k reaching k nodes, through a `nic`-bytes/s NIC; the sizes in a fold. Returns the
    top-k dispatch's bytes per GPU and layer ({"dispatch": bytes})."""
    k = facts.get("deepseek_v3.routed_experts_per_token").value
    width = facts.get("deepseek_v3.hidden").value
    block = facts.get("deepep.fp8_scale_block").value
    fp8 = 1 + 4 / block  # bytes per value: FP8 plus a 4-byte fp32 scale per block of values
    dispatch = seq * k * width * fp8  # top-k, one sequence per GPU
    nodes = facts.get("deepseek_v3.node_limited_routing").value
    dispatch_ib = seq * nodes * width * fp8  # at most one copy per node crosses the NIC
    h800 = facts.get("deepseek_v3.h800_nvlink_bw").value * 1e9
    facts.show(f"""
A token's top-{k} experts could sit on {k} nodes; DeepSeek caps it at
[[deepseek_v3.node_limited_routing]]. The forward dispatch then sends at most
{dispatch_ib / 1e6:.0f} MB per GPU and layer through the NIC ({dispatch_ib / nic * 1e3:.1f} ms
at {nic / 1e9:.0f} GB/s), against up to {dispatch / 1e6:.0f} MB ({dispatch / nic * 1e3:.1f} ms)
if top-{k} reached {k} nodes.

<details><summary>The sizes, the combine and the backward, and why NVLink forwards</summary>

Top-{k}, hidden {width}, FP8 with one fp32 scale per {block} values ({fp8:.2f} bytes per
value), one {seq}-token sequence per GPU. The BF16 combine sends back {2 / fp8:.1f}x the
dispatch, and the backward pass repeats both. The cap is a ceiling: one of those nodes may
be the sender's own. DeepSeek's H800s have [[deepseek_v3.h800_nvlink_bw]] of NVLink,
{h800 / nic:.1f}x the NIC, so NVLink forwards each token inside the node.
</details>
""")
    return {"dispatch": dispatch}


def plot_pipeline(pipe: list[dict], *, nics=("delay 100us",)) -> None:
    """The two schedules' timelines on each of `nics` (one row per network, one bar per
    forward and backward, per stage, on a shared time axis): on the first, the measured bubble
    and the formula's; on the others, the step and the share of it each stage idled (the
    bubble plus the waits for the network), of the fastest step kept. On the last row's 1F1B
    panel an arrow spans one round trip on stage 0, from the end of B(0) to the end of B(p)
    (when m > p): p forwards and backwards of its own work and at least 2(p-1) hops."""
    import matplotlib.pyplot as plt

    runs = {(r["nic"], r["schedule"]): r for r in pipe}
    fig, axes = plt.subplots(len(nics), 2, figsize=(13, 3.4 * len(nics)), sharex=True,
                             squeeze=False)
    for row, nic in zip(axes, nics):
        for ax, schedule in zip(row, par.PIPELINE_SCHEDULES):
            r = runs[(nic, schedule)]
            for stage, ops in enumerate(r["ops"]):
                for kind, j, start, end in ops:
                    ax.barh(stage, (end - start) * 1e3, left=start * 1e3,
                            color="#4C72B0" if kind == "F" else "#55A868", edgecolor="white")
                    ax.text((start + end) / 2 * 1e3, stage, str(j), ha="center", va="center",
                            fontsize=7, color="white")
            p = len(r["ops"])
            ax.set_ylim(p - 0.5, -1.2)  # stage 0 on top, room above it for the arrow
            ax.set_yticks(range(p), [f"stage {s}" for s in range(p)])
            if nic == nics[0]:
                ax.set_title(f"{NAME[schedule]}, {nic}: bubble {r['bubble']:.0%} measured, "
                             f"{r['bubble_formula']:.0%} by (p−1)/(m+p−1)", fontsize=10)
            else:
                ax.set_title(f"{NAME[schedule]}, {nic}: step {r['step_s'] * 1e3:.0f} ms, idle "
                             f"{r['bubble']:.0%} (fastest of {r['steps_kept_of']} steps)",
                             fontsize=10)
            end = {(kind, j): e for kind, j, _, e in r["ops"][0]}
            if nic == nics[-1] and schedule == "1f1b" and ("B", p) in end:
                a, b = end[("B", 0)] * 1e3, end[("B", p)] * 1e3
                ax.annotate("", xy=(b, -0.65), xytext=(a, -0.65),
                            arrowprops={"arrowstyle": "<->", "color": "black"})
                ax.text((a + b) / 2, -0.8, f"end of B(0) to end of B({p}): F({p}) to stage "
                        f"{p - 1} and back, ≥ {p}(f+b) + {2 * (p - 1)} hops",
                        ha="center", va="bottom", fontsize=8)
    axes[-1][0].set_xlabel("ms since the step began (blue: forward, green: backward; "
                           "numbers: micro-batch)")
    axes[-1][-1].set_xlabel("ms since the step began (idle: bubble + network waits)")
    plt.tight_layout()
    plt.show()


def without_jitter(nic: str) -> str:
    """A netem spec with its jitter removed: 'delay 10ms 5ms' -> 'delay 10ms'."""
    from dataclasses import replace

    from ..netem import Netem

    return str(replace(Netem.parse(nic), jitter_ns=0, delay_correlation=0.0))


def hop_growth_s(calm: str, rough: str) -> float:
    """How much one hop's mean delay grew from `calm` to `rough`, in seconds: the unit the
    replay's growth from the delay alone is counted in (0 for specs without a delay)."""
    from ..netem import Netem

    try:
        return (Netem.parse(rough).delay_ns - Netem.parse(calm).delay_ns) / 1e9
    except (ValueError, AttributeError):
        return 0.0


def replay_split(pipe: list[dict], calm: str, rough: str) -> dict[str, dict[str, float]]:
    """Two parts of each schedule's replayed growth from `calm` to `rough` (the replay that
    `exp.pipeline_growth` draws: the rough run's operation times on `rough`, minus the calm
    run's replay, `simulated_step_s`, with the calm run's times): {schedule: {"delay",
    "drift"}}. "delay": the rough network's delay alone, without its jitter, with the same
    (the rough run's) operation times on both networks. "drift": the rough run's operation
    times minus the calm run's, both replayed on `calm` (the sleeps ran a little longer or
    shorter in one run). The replay's mean growth minus both is what the jitter added."""
    runs = {(r["nic"], r["schedule"]): r for r in pipe}
    out = {}
    for schedule in par.PIPELINE_SCHEDULES:
        r = runs[(rough, schedule)]

        def replay(nic, r=r, schedule=schedule):
            return par.simulate_pipeline(
                schedule, stages=len(r["ops"]), microbatches=len(r["ops"][0]) // 2,
                forward_s=r["forward_took_s"], backward_s=r["backward_took_s"],
                nic=nic, activation_bytes=r["activation_bytes"]).step_s

        base = replay(calm)  # the rough run's operation times on the calm network
        out[schedule] = {"delay": replay(without_jitter(rough)) - base,
                         "drift": base - runs[(calm, schedule)]["simulated_step_s"]}
    return out


def explain_pipeline(pipe: list[dict], *, calm: str, rough: str,
                     details: list[str]) -> bool:
    """The conclusion (even the least-grown of 1F1B's steps grew more than GPipe's median
    step), each schedule's growth on the `rough` network (medians of its steps), that growth
    in hops in one sentence (the table, with the prediction, in the appendix) and the
    bubbles on the `calm` one. The appendix gets the replay's growth in ms, each median against its
    replay's range and the replay's mean split into the delay alone, the jitter and this
    run's compute drift (`replay_split`). Asserts the stage
    boundaries' bytes, the bubble formula as a floor and each step against its replay.
    Returns whether the conclusion was shown."""
    import numpy as np

    runs = {(r["nic"], r["schedule"]): r for r in pipe}
    kept = pipe[0]["steps_kept_of"]
    pp_act = pipe[0]["activation_bytes"]
    assert runs[(calm, "gpipe")]["p2p_sent"] == [8 * pp_act, 16 * pp_act, 16 * pp_act,
                                                 8 * pp_act]
    for r in pipe:
        assert r["bubble"] >= r["bubble_formula"] - 0.02
        # Load on this machine only adds time: a step much faster than its replay is a bug.
        assert r["step_s"] > 0.9 * r["simulated_step_s"], (r["schedule"], r["nic"])
    grown = exp.pipeline_growth(pipe, calm, rough)  # {schedule: measured and replayed growth}
    g = {s: float(np.median(v["measured"])) for s, v in grown.items()}
    # 1F1B paid more only if every one of its steps, even the least-grown, grew more than
    # GPipe's median step: a load spike on this machine slows a few steps, not all of them.
    shown = conclude(grown["gpipe"]["measured"].min() > 0 and grown["1f1b"]["measured"].min()
                     > g["gpipe"], f"1F1B lost more time to the rough network than GPipe: even the "
                     f"least-grown of 1F1B's {kept} steps grew more than GPipe's median step")
    print(f"On the rough network the step grew by {ms(g['gpipe'])} (GPipe) and "
          f"{ms(g['1f1b'])} (1F1B), medians of {kept} steps"
          + (": 1F1B paid more." if shown else "."))
    names = {"gpipe": "GPipe", "1f1b": "1F1B"}
    for s, v in grown.items():  # a median the link model cannot reach: say so here, not only below
        if g[s] > v["replay"].max():
            print(f"  {names[s]}'s median is above its replay's range ({ms(v['replay'].min())} to "
                  f"{ms(v['replay'].max())}, {len(v['replay'])} jitter draws): the link model does "
                  f"not explain the excess (this machine's load, most likely; appendix).")
    # The replay splits its growth: the delay alone, the jitter and this run's compute drift.
    split = replay_split(pipe, calm, rough)
    hop = hop_growth_s(calm, rough)  # what one hop's delay grew by
    if hop > 0:  # the growth in hops: predicted, replayed (delay alone) and measured
        p = len(runs[(calm, "gpipe")]["p2p_sent"])  # stages
        m = runs[(calm, "gpipe")]["p2p_sent"][0] // pp_act  # micro-batches
        predicted = {"gpipe": f"{2 * (p - 1)}",
                     "1f1b": f"{2 * (p - 1) * m // p} + fill/drain"}
        # One sentence on the main path; the table with the prediction goes to the appendix.
        print(f"In hops of {ms(hop)} (the rough network's delay minus the calm one's): "
              f"GPipe's step grew by about {g['gpipe'] / hop:.0f} hops' worth (delay and "
              f"jitter), 1F1B's by about {g['1f1b'] / hop:.0f}: 1F1B waits mid-step too, "
              "GPipe only while the pipeline fills and drains (the prediction and a jitter-free "
              "replay: appendix).")
        rows = [f"{'hops of ' + ms(hop):16s}{'predicted':>18s}{'replay, delay alone':>22s}"
                f"{'measured':>10s}"]
        rows += [f"{names[s]:16s}{predicted[s]:>18s}{split[s]['delay'] / hop:>22.0f}"
                 f"{g[s] / hop:>10.0f}" for s in par.PIPELINE_SCHEDULES]
        details.append("PP, the growth in hops (replay: a simulator re-running this run's "
                       "schedule without jitter; measured: median growth / one hop's growth, "
                       "jitter included; the split is below):\n" + "\n".join(rows))
    bub = {s: runs[(calm, s)]["bubble"] for s in par.PIPELINE_SCHEDULES}
    print(f"Bubble on the calm network: GPipe {bub['gpipe']:.0%}, 1F1B {bub['1f1b']:.0%} "
          f"(formula {pipe[0]['bubble_formula']:.0%}).")

    def where(s, v):  # the measured median against the replay's range (pipeline_growth)
        lo, hi = v["replay"].min(), v["replay"].max()
        return ("inside the replay's range (a consistency check)" if lo <= g[s] <= hi else
                "below the replay's range: the run does not measure its size" if g[s] < lo
                else "above the replay's range: load cannot be told from the network")

    # The rest only writes the appendix's secondary numbers.
    sim_bub = runs[(calm, "gpipe")]["simulated_bubble"]
    details.append(
        f"PP: by the replay (the same link model, the same operation times on both networks) "
        f"the delay alone, without its jitter, adds {ms(split['gpipe']['delay'])} (GPipe) and "
        f"{ms(split['1f1b']['delay'])} (1F1B); the measured growth also holds the jitter and "
        f"this machine's load. The prediction counts 1F1B's steady state, 2(p−1)/p hops per "
        f"micro-batch; the replay adds the fill and drain.\n"
        f"Replay bubble {sim_bub:.0%}; the measured bubble's excess is this machine's cost "
        f"between operations (not separated here; on the rough network part of it hides behind "
        f"the waits, so a measured growth can fall below the replay's). "
        f"Growth from {calm} to {rough}:\n"
        + "\n".join(f"  {s:5s} measured median {ms(g[s])} (range {ms(v['measured'].min())} to "
                    f"{ms(v['measured'].max())}, {kept} steps), {where(s, v)}: "
                    f"{ms(v['replay'].min())} to {ms(v['replay'].max())} "
                    f"({len(v['replay'])} jitter draws)" for s, v in grown.items())
        + "\nThe replay's mean growth, split: the delay alone (the same operation times on both "
          "networks), what its jitter adds, and this run's compute drift (the rough run's "
          "operations ran longer or shorter than the calm run's; replayed on the calm network):\n"
        + "\n".join(f"  {s:5s} mean {ms(v['replay'].mean())} = delay {ms(split[s]['delay'])} "
                    f"+ jitter {ms(v['replay'].mean() - split[s]['delay'] - split[s]['drift'])}"
                    f" + drift {ms(split[s]['drift'])}" for s, v in grown.items())
        + "\n" + "\n".join(f"  {r['schedule']:5s} {r['nic']:15s} step {ms(r['step_s'])} "
                           f"(replay {ms(r['simulated_step_s'])}, ideal "
                           f"{ms(r['ideal_step_s'])})"
                           for r in pipe))
    return shown


def plot_moe(moe: list[dict]) -> None:
    """Left: the closed form's dispatch, expert and combine phases, stacked, and the measured
    layer time per hot share. Right: the bytes the hot rank and another rank sent."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
    hs = [r["hot_share"] for r in moe]
    x = np.arange(len(moe))
    # The closed form's phases, stacked, and the measured layer time (its slowest rank) as a dot.
    phases = (("dispatch", "#4C72B0"), ("expert", "#CCB974"), ("combine", "#DD8452"))
    pred = np.array([[r[f"predicted_{k}_s"] for k, _ in phases] for r in moe]) * 1e3
    for j, (name, color) in enumerate(phases):
        axes[0].bar(x, pred[:, j], 0.5, bottom=pred[:, :j].sum(axis=1), color=color,
                    label=f"{name} (closed form)")
    axes[0].plot(x, [r["step_s"] * 1e3 for r in moe], "ko", ms=8,
                 label=f"layer time, measured (fastest of {moe[0]['repeats_kept_of']} repeats)")
    axes[0].set_xticks(x, [f"hot share {h:.2f}" for h in hs])
    axes[0].set_ylabel("ms")
    axes[0].set_ylim(0, 1.5 * max(r["step_s"] for r in moe) * 1e3)
    axes[0].legend(fontsize=8, loc="upper left")
    axes[0].set_title("one MoE layer on 4 ranks (emulator: senders' links only, no incast)",
                      fontsize=10)
    for r, xi in zip(moe, x):
        axes[1].bar(xi - 0.2, r["sent"][-1] / 1e3, 0.4, color="#C44E52",
                    label="hot rank" if xi == 0 else None)
        axes[1].bar(xi + 0.2, r["sent"][0] / 1e3, 0.4, color="#4C72B0",
                    label="another rank" if xi == 0 else None)
    axes[1].set_xticks(x, [f"{h:.2f}" for h in hs])
    axes[1].set_xlabel("hot expert's share")
    axes[1].set_ylabel("kB sent, dispatch + combine")
    axes[1].legend(fontsize=8)
    plt.tight_layout()
    plt.show()


def incast_step_s(hot: dict) -> float:
    """The hot layer's closed form with the hot rank's receiving link also charged (netem
    shapes egress only): behind a switch it receives h(N-1)T tokens through one link, what its
    combine sends back through its egress, so the dispatch takes at least that long."""
    ingress = hot["predicted_combine_s"]
    return hot["predicted_step_s"] + max(ingress - hot["predicted_dispatch_s"], 0)


def explain_moe(moe: list[dict], *, details: list[str]) -> bool:
    """The balanced and hottest layers' times against their closed forms, the hot rank's
    tokens, what incast would add at least behind a real switch (an ideal one: fair share, no
    loss), and the conclusion (the hottest expert made the layer over 1.5x slower than
    balanced; the verdict states the measured ratio; the machine counts as busy when a layer
    took over 25% more than its closed form). Asserts each rank's bytes and the
    network's floor. Returns whether the conclusion was shown."""
    for r in moe:
        p = r["predicted"]
        assert r["sent"][-1] == p["sent_hot"] + p["received_hot"]  # dispatch + combine, hot
        assert all(s == p["sent_other"] + p["received_other"] for s in r["sent"][:-1])
        # The closed form is the network's floor: load on this machine only adds to it.
        assert r["step_s"] > 0.9 * r["predicted_step_s"], r["hot_share"]
        assert sum(r["hot_phases"].values()) <= r["hot_step_s"] + 1e-6 <= r["best_step_s"] + 2e-6
    busy = [r for r in moe if r["step_s"] > 1.25 * r["predicted_step_s"]]
    bal, hot = moe[0], moe[-1]
    holds = hot["step_s"] > 1.5 * bal["step_s"]
    shown = conclude(holds,
                     f"with the hot expert at {hot['hot_share']:.2f} the layer took "
                     f"{hot['step_s'] / bal['step_s']:.1f}x as long as balanced"
                     + ("" if holds else "; expected over 1.5x"),
                     busy=(f"{len(busy)} of {len(moe)} layers over 25% above the closed form"
                           if busy else None))
    print(f"Layer time, fastest of {hot['repeats_kept_of']} repeats after a warm-up: balanced "
          f"{ms(bal['step_s'])}, hot expert at {hot['hot_share']:.2f} {ms(hot['step_s'])} "
          f"(closed forms {ms(bal['predicted_step_s'])} and {ms(hot['predicted_step_s'])}: a "
          f"consistency check, the emulator against its own model).")
    print(f"The hot rank computed {hot['hot_tokens']} tokens instead of {bal['hot_tokens']}, "
          f"and every rank waited for it.")
    ingress = hot["predicted_combine_s"]
    # Its time on the wire, without the one-way delay: the combine and the dispatch closed
    # forms differ only in bytes, which gives the seconds per byte.
    pred = hot["predicted"]
    per_byte = (ingress - hot["predicted_dispatch_s"]) / (
        pred["received_hot"] - max(pred["sent_hot"], pred["sent_other"]))
    wire = pred["received_hot"] * per_byte
    receives = f"{ms(ingress)} ({ms(wire)} on the wire + {ms(ingress - wire)} delay)"
    real = incast_step_s(hot)
    # two short sentences: what the receiving link takes, then what that does to the layer
    print(f"Behind a real switch the hot rank's receiving link would take {ms(ingress)}, not "
          f"the {ms(hot['predicted_dispatch_s'])} charged to the dispatch (incast).")
    print(f"By the closed form the layer would be at least {real / bal['predicted_step_s']:.1f}x "
          f"the balanced one, not {hot['predicted_step_s'] / bal['predicted_step_s']:.1f}x (an "
          f"ideal switch; a shallow buffer's drops and retransmissions would add more).")
    # The appendix's secondary numbers.
    details.append(
        f"MoE: {len(busy)} of {len(moe)} layers took over 25% more than the closed form. "
        f"Incast, left out: the dispatch is charged at its busiest sender "
        f"({ms(hot['predicted_dispatch_s'])}); through the hot rank's one receiving link "
        f"{kb(hot['predicted']['received_hot'])} take {receives}. An ideal switch (fair "
        f"share, no loss) would add about {ms(real - hot['predicted_step_s'])}.")
    return shown


def real_cluster_text(*, one_nv: float, hot_share: float, capacity_factor: float) -> str:
    """The "On a real GPU cluster" box: TP, PP, MoE (the share of all tokens the toy's
    hottest expert, at `hot_share`, would drop at `capacity_factor`), further reading, and,
    folded in a <details> block, NCCL inside the node (with the time of the 64 MiB
    all-reduce that took `one_nv` seconds over NVLink at line rate, at NVLS and ring busbw)
    and small messages: a template for `facts.show`, whose [[...]] placeholders cite the
    ledger."""
    ar_nv = one_nv * facts.get("nvidia.h100_nvlink_bw_per_direction").value  # s x GB/s
    cf = capacity_factor  # applied to the toy's hottest expert
    dropped = par.moe_traffic(tokens_per_rank=96, hidden=256, ranks=4, hot_share=hot_share,
                              capacity_factor=cf)["dropped"]
    return f"""
* **TP.** Megatron-LM issues [[megatron.tp_allreduces_per_layer]] per layer and micro-batch,
  part of it hidden behind compute (fold below). An H100 SXM sends
  [[nvidia.h100_nvlink_bw_per_direction]] over NVLink, [[nvidia.connectx7_rate_bytes]] through
  its NIC, and computes at most [[nvidia.h100_bf16_dense_tflops]] in dense BF16.
* **PP.** Megatron's bubble is [[megatron.bubble_definition]] of the ideal compute;
  interleaving v model chunks per rank reaches [[megatron.interleaved_bubble]], at v times the
  messages.
* **MoE.** The Switch Transformer sets [[gshard.capacity_factor]] (GShard similarly caps each
  expert's load); at a capacity
  factor of {cf} the hot
  expert above would drop {dropped:.0%} of all tokens. DeepSeek-V3 routes each token to
  [[deepseek_v3.routed_experts_per_token]] (plus one shared expert that needs no dispatch)
  on at most [[deepseek_v3.node_limited_routing]]: a
  token crosses InfiniBand once per node and NVLink forwards it inside.

<details><summary>More: overlap in Megatron and PyTorch, DeepEP, further reading</summary>

* **TP.** With sequence parallelism [[megatron.sequence_parallel]]. Megatron-Core:
  [[megatron.tp_comm_overlap]]. PyTorch: [[pytorch.async_tp]].
* **PP.** Megatron-Core sends [[megatron.pp_scatter_gather]], and overlaps those transfers
  [[megatron.pp_p2p_overlap]].
* **MoE.** DeepEP sends [[deepep.fp8_dispatch]], with one fp32 scale per
  [[deepep.fp8_scale_block]] (hidden [[deepseek_v3.hidden]]).
* **Further reading.** Context parallelism for long sequences: ring attention
  ([[cp.ring_attention]]) or Ulysses ([[cp.ulysses]]). DeepSeek-V3's pipeline schedule:
  [[deepseek_v3.dualpipe]].
</details>

<details><summary>NCCL inside the node, and small messages</summary>

* **NCCL inside the node.** Since NCCL [[nccl.nvls_since]], on NVSwitches with NVLink SHARP,
  NCCL's tuner may choose NVLS for the all-reduce of large messages (NVLink SHARP: the
  NVSwitch adds the data); without them NCCL runs rings or trees. nccl-tests reports bus
  bandwidth (busbw), comparable to a link's rate for a ring; with NVLS it is not the
  bandwidth on the wire, so it can exceed the line rate. Peak busbw:
  [[nccl.h100_ring_busbw]] for a ring, [[nccl.h100_nvls_allreduce_busbw]] with NVLS.
  At these peak rates the 64 MiB all-reduce above takes at least
  {ar_nv / facts.get("nccl.h100_nvls_allreduce_busbw").value * 1e3:.2f} ms (NVLS) or
  {ar_nv / facts.get("nccl.h100_ring_busbw").value * 1e3:.2f} ms (ring).
* **Small messages.** NCCL's tuner charges a ring step over NVLink
  [[nccl.tuner_nvlink_ring_step_latency_simple]] with its Simple protocol (less with LL, its
  small-message protocol), so for small micro-batches the rounds weigh
  again.
</details>
"""


def inter_node_share(n: int, gpus: int) -> float:
    """The share of a GPU's n - 1 peers on other nodes, in nodes of `gpus` GPUs."""
    return (n - gpus) / (n - 1)


def bytes_per_peer(n: int, dispatch: float) -> float:
    """Bytes to one peer of a balanced top-k dispatch of `dispatch` bytes over n - 1 peers."""
    return dispatch / (n - 1)


def rdma_peers(n: int, gpus: int) -> int:
    """RDMA peers with DeepEP-style forwarding: one GPU per other node."""
    return n // gpus - 1


def show_moe_scaling_answer(*, dispatch: float, nic: float) -> None:
    """Self-check 2 and its answer: why an MoE layer on 256 GPUs can run twice as slowly as
    on 32, with the bytes per peer of a `dispatch`-byte top-k dispatch and its time through a
    `nic`-bytes/s NIC at both sizes."""
    gpus = facts.get("nvidia.hgx_h100_gpus").value

    def inter(n):
        return inter_node_share(n, gpus)

    def peer(n):
        return bytes_per_peer(n, dispatch)

    def rdma(n):
        return rdma_peers(n, gpus)

    facts.show(f"""
2. A mixture-of-experts layer on 256 GPUs runs twice as slowly as on 32, with the same tokens
   per GPU and routing balanced on average. Name two causes.

<details><summary>Answer</summary>

Two causes, with the DeepSeek-V3 sizes above:

1. **The slowest of more.** The layer waits for the last of N(N−1) messages and the busiest
   of N experts, a maximum that grows with N ([notebook 04](04_jitter_and_scale.ipynb)).
2. **The fabric** (later notebooks): traffic spreads over more leaves and uplinks, with ECMP
   collisions (flows hashed onto the same uplink while others idle), oversubscription
   ([13b](13b_oversubscription_ecmp_rails.ipynb)) and incast
   ([13](13_switches_incast_ecmp_rails.ipynb)).

<details><summary>Details: why not the bytes or the message size, DeepEP's peers</summary>

The bytes per GPU stay the same, and with [[nvidia.hgx_h100_gpus]] per node the share of
them leaving the node grows only from {inter(32):.0%} to {inter(256):.0%}
({inter(256) / inter(32):.2f}×). With plain top-k routing each GPU splits them over N−1
peers, about {peer(32) / 1e6:.1f} MB per peer at 32 GPUs and {peer(256) / 1e6:.2f} MB at 256,
which still take {peer(256) / nic * 1e6:.0f} µs each on the wire at {nic / 1e9:.0f} GB/s:
smaller messages become a cause only with fewer tokens per GPU, where each message's fixed
cost is not small against that. Node-limited routing with forwarding inside the node (DeepEP)
keeps the messages larger, but each GPU still connects over RDMA to its counterpart on every
other node: {rdma(256)} peers instead of {rdma(32)}.
</details>
</details>
""")
