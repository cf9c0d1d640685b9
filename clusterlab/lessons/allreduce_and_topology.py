"""What notebook 02 (all-reduce algorithms and topology) reads from its runs.

The rows are those of `clusterlab.experiments.allreduce_and_topology.measure`: one dict per
algorithm and size with the best time ("measured"), its closed form ("model"), the repetitions
("times"). Each function below prints the sentences the notebook shows, computed from those
rows, and passes each measured conclusion to `conclude`, which says whether this run showed it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from clusterlab import facts, models
from clusterlab.experiments import allreduce_and_topology as ex
from clusterlab.experiments.common import BUSY_FACTOR, conclude
from clusterlab.lessons.hierarchy_busbw_and_nccl import stagger_order
from clusterlab.lessons.show import details, fold, ms
from clusterlab.wire import HEADER_BYTES, SEGMENT_BYTES

SMALL, MEDIUM, LARGE = ex.SIZES

# The five algorithms of the cost table: (label, name in `models`).
COST_TABLE_ROWS = [("ring", "ring"), ("recursive doubling", "recursive_doubling"),
                   ("Rabenseifner", "rabenseifner"), ("binomial tree", "tree"),
                   ("parameter server (textbook)", "parameter_server")]

# --- the network and the cost model -------------------------------------------------------

def regime(ratio: float) -> str:
    """Which term dominates a message whose wire time is `ratio` latencies (n beta / alpha):
    'latency-bound' below 0.1, 'bandwidth-bound' above 10, otherwise in between."""
    return ("latency-bound" if ratio < 0.1 else "bandwidth-bound" if ratio > 10
            else "in between: it depends on the algorithm")


def describe_network(alpha: float, beta: float, *, sizes: Sequence[int] = ex.SIZES) -> None:
    """Print the emulated NIC, its alpha and beta, and for each size its wire time n beta in
    latencies and the regime that makes it (`regime`)."""
    link = 1 / beta
    print(f"every node's NIC: netem '{ex.NIC}' (a fixed delay per message plus a rate limit: "
          "notebook 01)")
    print(f"alpha = {ms(alpha)} per message, beta = {beta * 1e9:.2f} ns per byte "
          f"(1/beta = {link / 1e6:.2f} MB/s of payload; beta counts the headers: appendix)")
    for n in sizes:
        ratio = n * beta / alpha
        print(f"{ex.human_bytes(n):>8}: n*beta = {ms(n * beta):>9} = {ratio:6.2f} alpha -> "
              f"{regime(ratio)}")


def partner_plot(ax, p: int, distances: Sequence[int], sizes: Sequence[str], *,
                 title: str) -> None:
    """Draw who swaps with whom on `ax`: rounds left to right, an arc joining the two ranks
    that swap data in each round (partner = rank XOR distance), labelled with the distance and
    the bytes each rank sends."""
    t = np.linspace(0, 1, 30)
    for k, (d, size) in enumerate(zip(distances, sizes)):
        for i in range(p):
            j = i ^ d
            if i < j:  # one arc per pair; pairs that overlap bulge by different amounts
                bulge = 0.12 + 0.25 * (i % d) / d
                ax.plot(k + bulge * np.sin(np.pi * t), i + (j - i) * t, color=f"C{k}", lw=1.5)
        ax.scatter([k] * p, range(p), s=20, color="k", zorder=3)
        ax.text(k + 0.15, -0.9, f"±{d}: {size}", ha="center", fontsize=8)
    ax.set(xticks=range(len(distances)), xlabel="round", ylabel="rank", title=title,
           ylim=(p - 0.5, -1.4), xlim=(-0.4, len(distances) - 0.2))
    ax.set_xticklabels([str(k + 1) for k in range(len(distances))])
    ax.set_yticks(range(p))


def crossover(p: int, alpha: float, beta: float) -> float:
    """Size (bytes) above which the ring beats recursive doubling on p ranks, p a power of
    two: where (2(p-1) - lg p) alpha = (lg p - 2(p-1)/p) n beta."""
    lg = p.bit_length() - 1
    return (2 * (p - 1) - lg) * alpha / ((lg - 2 * (p - 1) / p) * beta)


def compare_networks(specs: dict[str, str], *, ranks: int = 8) -> None:
    """Print each named netem spec's alpha, payload rate, alpha/beta (= alpha x bandwidth) and
    the ring/recursive-doubling crossover on `ranks` ranks; assert that the first two specs
    have the same alpha/beta, and print by how much their times scale. (What beta counts
    besides the payload, and a real link's frames: `header_note`, in the appendix.)"""
    size = {}
    for name, spec in specs.items():
        a, b = ex.alpha_beta(spec)
        size[name] = a / b
        print(f"{name:>10} '{spec}': alpha = {a * 1e6:g} us, 1/beta = {1 / b / 1e6:,.0f} MB/s "
              f"of payload, alpha/beta = alpha x bandwidth = {a / b / 1e3:.1f} kB; "
              f"ring beats recursive doubling on {ranks} ranks above "
              f"{crossover(ranks, a, b) / 2**20:.2f} MiB")
    first, second = list(specs)[:2]
    assert abs(size[first] / size[second] - 1) < 1e-9
    print(f"Times scale by alpha_{first} / alpha_{second} = "
          f"{ex.alpha_beta(specs[first])[0] / ex.alpha_beta(specs[second])[0]:.0f}.")


def header_note() -> str:
    """The appendix's ledger template (for `facts.show`): the headers beta counts per segment
    on this machine, and how much less payload a real Ethernet link carries per frame at the
    standard MTU (IPv4 and TCP headers with timestamps inside it; Ethernet header, checksum,
    preamble and inter-frame gap around it), all sizes from the ledger."""
    mtu = facts.get("ethernet.mtu_bytes").value
    payload = mtu - sum(facts.get(f).value for f in ("ipv4.header_bytes",
                                                     "tcp.header_with_timestamps_bytes"))
    frame = mtu + sum(facts.get(f).value for f in ("ethernet.header_bytes", "ethernet.fcs_bytes",
                                                   "ethernet.preamble_sfd_bytes",
                                                   "ethernet.ifg_bytes"))
    less = 1 - (payload / frame) / (SEGMENT_BYTES / (SEGMENT_BYTES + HEADER_BYTES))
    return (f"(beta includes {HEADER_BYTES} bytes of Ethernet/IP/TCP headers per "
            f"{SEGMENT_BYTES // 1024} KiB segment, the unit this machine's loopback stack hands "
            "over at once. A real Ethernet link pays them per packet of at most "
            "[[ethernet.mtu_bytes]] (the MTU), plus each frame's preamble, checksum and "
            f"inter-frame gap: it carries {less:.0%} less payload than this beta assumes, so its "
            "alpha x bandwidth is that much smaller; less with jumbo frames.)")


def nccl_ring_numbers(nbytes: int, beta: float, *, gpus: int = 1024) -> tuple[float, str, str]:
    """By NCCL's tuner constants for the Simple protocol (from the ledger), a lower bound on the
    latency of a ring all-reduce of `nbytes` over `gpus` GPUs in 8-GPU nodes (2(nodes-1)
    network steps, the other steps NVLink steps; NCCL's base latency and the topology's extra
    network latency left out) and its share of the time, against the ring's bytes through one
    GPU's link of `beta` (the most a GPU's NIC can carry; NCCL's channels spread it over the
    node's NICs, which only raises the share), and the share with the NIC per GPU of the DGX
    H100 nodes these node sizes describe, its bytes spread over the node's NICs. The shares
    are lower bounds, so they are printed rounded down, and hold only for Simple. Returns the
    Simple share at `beta`, a one-line summary and the worked arithmetic as a ledger template
    (its constants cited)."""
    per_node = facts.get("nvidia.hgx_h100_gpus").value
    net = facts.get("nccl.tuner_net_ring_step_latency_simple").value * 1e-6
    nvlink = facts.get("nccl.tuner_nvlink_ring_step_latency_simple").value * 1e-6
    nodes, steps = gpus // per_node, 2 * (gpus - 1)
    inter = 2 * (nodes - 1)
    lat = inter * net + (steps - inter) * nvlink
    wire = models.allreduce_time("ring", gpus, nbytes, 0.0, beta)
    share = lat / (lat + wire)
    dgx = facts.get("nvidia.connectx7_rate").value  # Gb/s, one NIC per GPU in a DGX H100
    wire_dgx = models.allreduce_time("ring", gpus, nbytes, 0.0, 8 / (dgx * 1e9))

    def about(x: float) -> str:
        # Not a bound: the latency is a floor (tuner constants), but so is the bytes' time at
        # line rate; a NIC below line rate lowers the share, the node's other NICs raise it.
        return f"about {round(100 * x)}%"

    lead = (f"Latency is a large share even of NCCL's ring on {gpus} GPUs: by NCCL's own cost "
            f"constants, {about(share)} of this {ex.human_bytes(nbytes)} all-reduce's time is "
            "step latency if the NIC above runs at line rate (in NCCL's large-message mode, "
            "02c). **So NCCL adds a tree**: two binary trees over the nodes, each carrying half "
            f"the data, cross the network in about 2 lg(nodes) = {2 * (nodes.bit_length() - 1)} "
            f"steps instead of 2(nodes−1) = {inter}, at nearly the ring's bytes (folds).")
    detail = (
        f"{gpus} GPUs in {nodes} nodes of {per_node}. Of the ring's 2 x {gpus - 1} = {steps} "
        f"steps, 2 x {nodes - 1} = {inter} cross the network (the tuner counts "
        "[[nccl.tuner_ring_inter_steps]] as network steps), each at least "
        "[[nccl.tuner_net_ring_step_latency_simple]] with Simple; the other "
        f"{steps - inter} stay inside a node, at least "
        "[[nccl.tuner_nvlink_ring_step_latency_simple]] each over NVLink (the GPU-to-GPU link "
        "inside a node; [[nccl.tuner_ring_intra_step_amd]] on AMD hosts). That is at least "
        f"{ms(lat)} of latency against {ms(wire)} of bytes "
        f"through one GPU's {8 / beta / 1e9:.0f} Gbit/s NIC at line rate: {about(share)} of "
        "the ring's time is latency if NCCL runs Simple (its protocol for large messages). "
        "Not a bound: a NIC below line rate makes the bytes longer and the share smaller. "
        "NCCL's **channels** (parallel slices of the collective, each with its own path "
        f"through a NIC) spread the bytes over the node's {per_node} NICs, so the bytes take "
        f"less and the share is larger. With the {dgx} Gb/s NIC per GPU of a DGX H100 at line "
        f"rate the ring's bytes would take {ms(wire_dgx)} through one NIC, "
        f"{ms(wire_dgx / per_node)} spread over {per_node} (headers left out), and the share is "
        f"{about(lat / (lat + wire_dgx / per_node))}. These step latencies "
        "are constants of NCCL's tuner (its cost model for picking an algorithm per call), not "
        "measurements. DDP's first bucket is smaller, [[pytorch.ddp_first_bucket]], so its "
        "share is larger still.")
    return share, lead, detail


def nccl_at_scale(nbytes: int, beta: float, *, gpus: int = 1024) -> str:
    """The ledger template of "On a real GPU cluster" (for `facts.show`): NCCL's ring latency
    share at scale (`nccl_ring_numbers`: its message, the arithmetic folded), the double binary
    tree it adds (its bytes per node folded), what NCCL does not run for all-reduce, and
    parameter servers at scale."""
    _, lead, detail = nccl_ring_numbers(nbytes, beta, gpus=gpus)
    tree = (
        "NCCL's tree is the [[nccl.double_binary_tree]] (since NCCL [[nccl.tree_since]], after "
        "the [[paper.sanders_two_tree]]); the two trees are pipelined. A node is interior in "
        "one tree and a leaf in the other. In the first it "
        "sends n/2 up to its parent and n/2 down to each of its two children; in the second it "
        "sends n/2 up. In all n/2 + n + n/2 = 2n: about the ring's 2((p-1)/p) n.\n\n"
        "For all-reduce NCCL runs no recursive doubling, Rabenseifner or parameter server (its "
        "log-step PAT, since [[nccl.pat_since]], serves only all-gather and reduce-scatter). "
        "NCCL's other algorithms, how it picks one per call and how to log the choice: "
        "[02c](02c_in_network_reduction_and_nccl.ipynb).\n\n"
        "**Parameter servers at scale.** A [[paper.li_parameter_server]] scales where a single "
        "server does not; [[paper.byteps]] adds spare CPU machines as summation servers.")
    return f"""
{lead}

{details("The arithmetic: network and NVLink steps, by NCCL's tuner", detail)}

{details("NCCL's double binary tree, what NCCL does not run, parameter servers at scale", tree)}
"""


def coefficients(algo: str, p: int) -> tuple[float, float, float]:
    """(alpha count, n beta multiple, n gamma multiple) of an algorithm's closed form on p
    ranks; the parameter server is one server that is also a worker (p - 1 others)."""
    if algo == "parameter_server":
        f = lambda a, b, g: models.parameter_server(p - 1, 1.0, a, b, g)
    else:
        f = lambda a, b, g: models.allreduce_time(algo, p, 1.0, a, b, g)
    return f(1.0, 0.0, 0.0), f(0.0, 1.0, 0.0), f(0.0, 0.0, 1.0)


def print_cost_table() -> None:
    """Print the five closed forms' alpha count, n beta and n gamma multiples on 4 and on
    1024 ranks (`coefficients`): the table to remember."""
    print(f"{'algorithm':<28} {'p = 4: α count':>15} {'nβ':>6} {'nγ':>5}   "
          f"{'p = 1024: α count':>18} {'nβ':>8} {'nγ':>8}")
    for label, algo in COST_TABLE_ROWS:
        a4, b4, g4 = coefficients(algo, 4)
        a1k, b1k, g1k = coefficients(algo, 1024)
        print(f"{label:<28} {a4:>15.0f} {b4:>6.2f} {g4:>5.2f}   "
              f"{a1k:>18.0f} {b1k:>8.2f} {g1k:>8.2f}")


def gamma_here(beta: float, beta_dc: float, *, nbytes: int = LARGE,
               repeats: int = 20) -> tuple[str, str]:
    """Time one float32 add of `nbytes` into a buffer on this CPU (NumPy, one thread, as a
    CPU reduction runs; best of `repeats`) and set gamma, the time per byte added, against
    this emulator's `beta` and against `beta_dc` (100 Gbit/s). The same two arrays are added
    every time, so they sit in the CPU's cache: the gamma found is a lower bound (Gloo adds
    freshly received segments). Returns the sentence on this CPU and the ledger template (for
    `facts.render`) that sets an H100's add beside them: an add reads two bytes and writes
    one per byte added, so at the datasheet memory bandwidth gamma = 3 / bandwidth."""
    import time

    x = np.ones(nbytes // 4, np.float32)
    buf = x.copy()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.add(x, buf, out=x)
        best = min(best, time.perf_counter() - t0)
    gamma = best / nbytes
    r = gamma / beta_dc
    kind = ("the same order as" if 0.25 <= r <= 4 else "well below" if r < 0.25 else "above")
    here = (f"gamma on this CPU: one add of {ex.human_bytes(nbytes)} of float32 took "
            f"{ms(best, digits=3)} (best of {repeats}, data in cache: a lower bound), gamma = "
            f"{gamma * 1e9:.3f} ns per byte: "
            f"{gamma / beta:.2%} of this emulator's beta ({beta * 1e9:.2f} ns), so the closed "
            "forms leave it out; "
            f"{r:.2f}x beta at 100 Gbit/s ({beta_dc * 1e9:.3f} ns per byte): {kind} beta there"
            + (" or above." if kind != "above" else "."))
    hbm = facts.get("nvidia.h100_memory_bandwidth")
    g_gpu = 3 / (hbm.value * 1e12)
    return here, (f"On an H100 ([[nvidia.h100_memory_bandwidth]]; 3 bytes moved per byte added) "
                  f"gamma is {g_gpu / beta_dc:.1%} of beta at 100 Gbit/s.")


def show_gamma(beta: float, beta_dc: float) -> None:
    """Fold the gamma detour (`gamma_here`) under one line: what gamma is, this CPU's add
    against beta here and at 100 Gbit/s, and an H100's, with its source."""
    here, template = gamma_here(beta, beta_dc)
    fold("γ, the time to add the bytes (optional): this CPU, and a GPU",
         "**γ** (gamma; Thakur, Rabenseifner & Gropp 2005) is the compute time per byte "
         "added; the table's nγ column counts the adds on the critical path. Gloo adds on the "
         f"CPU.\n{here}\n" + facts.render(template))


# --- each algorithm's run -------------------------------------------------------------------

def beyond_stagger(rows: Sequence[dict], *, factor: float = BUSY_FACTOR) -> str | None:
    """The evidence, as a short phrase for `conclude(busy=...)`, that this machine was busy: the
    rows whose best run, less the ranks' staggered start after the barrier (`best_spread`: a
    run is timed from the first rank's entry, and the closed form starts every rank together),
    still exceeds `factor` times its closed form; None if there is none."""
    slow = [f"{ms(r['measured'])} (staggered start {ms(r.get('best_spread', 0.0))}) against "
            f"{ms(r['model'])}" for r in rows
            if r["measured"] - r.get("best_spread", 0.0) > factor * r["model"]]
    if not slow:
        return None
    return (f"{'runs' if len(slow) > 1 else 'a run'} over {factor:g}x the closed form beyond "
            "the staggered start: " + "; ".join(slow))


def extras(rows: Sequence[dict]) -> tuple[list[tuple[dict, float, float, float | None]], list[str]]:
    """Per row, what its best run paid beyond its closed form: (row, extra, the ranks' staggered
    start in that best run (`best_spread`), the part beyond the staggered start or None when the
    extra is within it by 02b's `stagger_order`); and the sizes where that part is over
    BUSY_FACTOR - 1 of a closed form (busy there, `beyond_stagger`)."""
    out = []
    for r in sorted(rows, key=lambda r: (r["p"], r["nbytes"])):
        spread = r.get("best_spread", 0.0)
        closed_form = {"measured": r["model"], "median": r["model"]}  # starts all together
        beyond = (r["measured"] - r["model"] - spread
                  if stagger_order(r, closed_form)[0] > 0 else None)
        out.append((r, r["measured"] - r["model"], spread, beyond))
    far = list(dict.fromkeys(ex.human_bytes(r["nbytes"]) for r, *_ in out
                             if beyond_stagger([r])))
    return out, far


def explain_extras(rows: Sequence[dict]) -> None:
    """The appendix's table: every run's extra time over its closed form beside the ranks'
    staggered start in that run, and what is left beyond it; then how many extras the
    staggered start covers, the range of the rest (a cost no closed form counts; the run does
    not isolate it) and the sizes where the run was busy."""
    table, far = extras(rows)
    lines = [f"{'ranks':>5}  {'algorithm':<20}{'size':>8}{'extra ms':>10}"
             f"{'staggered start ms':>20}{'beyond it ms':>14}"]
    for r, extra, spread, beyond in table:
        lines.append(f"{r['p']:>5}  {ex.LABELS.get(r['algorithm'], r['algorithm']):<20}"
                     f"{ex.human_bytes(r['nbytes']):>8}{extra * 1e3:>10.1f}"
                     f"{spread * 1e3:>20.1f}"
                     f"{'-' if beyond is None else f'{beyond * 1e3:.1f}':>14}")
    # the table serves the expert; the reader needs the summary lines printed under it
    fold(f"Every run's extra time beside its staggered start ({len(table)} runs)",
         "\n".join(lines), pre=True)
    rest = [b for *_, b in table if b is not None]
    if not rest:
        print("Every extra is within the staggered start after the barrier.")
    else:
        print(f"{len(table) - len(rest)} of {len(table)} extras are within the staggered start; "
              f"the rest exceed it by {ms(min(rest))} to {ms(max(rest))} per call: a cost no "
              "closed form counts, which this run does not isolate.")
    if far:
        print(f"At {', '.join(far)} that left-over cost is over {BUSY_FACTOR - 1:.0%} of some "
              "closed form: the run was busy there (this machine's own load can reorder close "
              "results).")


def check(rows: Sequence[dict]) -> None:
    """Print one line, the consistency check: the range of best/model (the emulator against
    its own closed form) and the sizes where the run was busy (`extras`). Each run's extra time
    beside its staggered start is the appendix's table (`explain_extras`)."""
    ratio = [r["measured"] / r["model"] for r in rows]
    _, far = extras(rows)
    print(f"Consistency check: best/model {min(ratio):.2f} to {max(ratio):.2f}"
          + (f"; busy at {', '.join(far)} (appendix)." if far else "."))


def _by_size(rows: Sequence[dict], key: str) -> dict[int, float]:
    return {r["nbytes"]: r[key] for r in rows}


def explain_ring(ring: Sequence[dict], *, p: int, alpha: float) -> None:
    """Print, per size, which share of the ring's closed form its 2(p-1) latencies are; assert
    that every run took at least those latencies and that the 4 MiB run was not early."""
    latency = 2 * (p - 1) * alpha
    for r in ring:
        print(f"{ex.human_bytes(r['nbytes']):>7}: closed form {ms(r['model'])}, of which the "
              f"2(p-1) latencies are {latency / r['model']:.0%}")
        assert r["measured"] >= 0.99 * latency  # 2(p-1) steps, each at least one delay
    assert _by_size(ring, "measured")[LARGE] >= 0.98 * ex.one(ring, nbytes=LARGE)["model"]


def explain_recursive_doubling(rd: Sequence[dict], *, ring: Sequence[dict]) -> None:
    """Conclude whether recursive doubling beat the ring at 4 KiB and lost to it at 4 MiB and,
    when it did, print both factors beside the closed forms'."""
    t_ring, m_ring = _by_size(ring, "measured"), _by_size(ring, "model")
    t_rd, m_rd = _by_size(rd, "measured"), _by_size(rd, "model")
    shown = conclude(t_rd[SMALL] < t_ring[SMALL] and t_ring[LARGE] < t_rd[LARGE],
                     "recursive doubling beat the ring at 4 KiB and lost to it at 4 MiB")
    if shown:
        print(f"4 KiB: recursive doubling {t_ring[SMALL] / t_rd[SMALL]:.1f}x faster than the ring "
              f"(closed forms {m_ring[SMALL] / m_rd[SMALL]:.1f}x: 2 rounds, not 6).")
        print(f"4 MiB: {t_rd[LARGE] / t_ring[LARGE]:.2f}x slower (closed forms "
              f"{m_rd[LARGE] / m_ring[LARGE]:.2f}x: 2 n beta, not 1.5 n beta).")


def plot_crossover(ring: Sequence[dict], rd: Sequence[dict], near: Sequence[dict], *, p: int,
                   alpha: float, beta: float, x_over: float):
    """Draw the ring's and recursive doubling's closed forms from 256 KiB to 4 MiB, their best
    measured times (dots), the computed crossover (dotted line) and, at the middle size of
    `near`, where the dots overlap, the measured and closed-form ratios. Returns the axes."""
    import matplotlib.pyplot as plt

    sizes = np.geomspace(256 * 2**10, 4 * 2**20, 60)
    fig, ax = plt.subplots(figsize=(8, 3))
    for i, a in enumerate(("ring", "recursive_doubling")):
        runs = sorted(ex.select(list(ring if a == "ring" else rd) + list(near), algorithm=a),
                      key=lambda r: r["nbytes"])[1:]  # 256 KiB to 4 MiB
        ax.plot(sizes / 2**20, [models.allreduce_time(a, p, n, alpha, beta) * 1e3 for n in sizes],
                color=f"C{i}", lw=1, label=f"{ex.LABELS[a]}, closed form")
        ax.plot([r["nbytes"] / 2**20 for r in runs], [r["measured"] * 1e3 for r in runs], "o",
                color=f"C{i}", label=f"{ex.LABELS[a]}, measured (best)")
    ax.axvline(x_over / 2**20, color="k", ls=":", lw=1,
               label=f"computed crossover, {x_over / 2**20:.2f} MiB")
    # The middle size sits next to the crossover, where the two dots overlap: label their ratio.
    c = {(r["algorithm"], r["nbytes"]): r for r in near}
    mid = sorted({r["nbytes"] for r in near})[1]
    ring_mid, rd_mid = c["ring", mid], c["recursive_doubling", mid]
    ax.annotate(f"{ex.human_bytes(mid)}: ring / rec. doubling\n"
                f"= {ring_mid['measured'] / rd_mid['measured']:.2f} measured, "
                f"{ring_mid['model'] / rd_mid['model']:.2f} closed forms",
                xy=(mid / 2**20, ring_mid["measured"] * 1e3),
                xytext=(0.27, 0.7 * max(r["measured"] for r in [*ring, *rd]) * 1e3),
                fontsize=7, arrowprops={"arrowstyle": "->", "lw": 0.6})
    ax.set(xscale="log", xlabel="size (MiB)", ylabel="all-reduce (ms)",
           title=f"{p} ranks: ring against recursive doubling near the crossover")
    ax.minorticks_off()
    ax.set_xticks([0.25, 0.5, 1, 2, 4], ["0.25", "0.5", "1", "2", "4"])
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def explain_crossover(near: Sequence[dict], *, x_over: float) -> None:
    """Conclude whether recursive doubling was faster at the smallest of the three sizes near
    the crossover and the ring at the largest; when it was, print their times and the ratio
    at the middle size (too close to call). Asserts that no run was early."""
    c = {(r["algorithm"], r["nbytes"]): r for r in near}
    lo, mid, hi = sorted({r["nbytes"] for r in near})
    rd_lo, ring_lo = c["recursive_doubling", lo], c["ring", lo]
    rd_mid, ring_mid = c["recursive_doubling", mid], c["ring", mid]
    rd_hi, ring_hi = c["recursive_doubling", hi], c["ring", hi]
    shown = conclude(
        rd_lo["measured"] < ring_lo["measured"] and ring_hi["measured"] < rd_hi["measured"],
        f"recursive doubling was faster at {ex.human_bytes(lo)} and the ring at "
        f"{ex.human_bytes(hi)}, on either side of the computed {x_over / 2**20:.2f} MiB",
        busy=beyond_stagger(near))
    if shown:
        print(f"{ex.human_bytes(lo)}: recursive doubling {ms(rd_lo['measured'])}, ring "
              f"{ms(ring_lo['measured'])}; {ex.human_bytes(hi)}: ring {ms(ring_hi['measured'])}, "
              f"recursive doubling {ms(rd_hi['measured'])} (best of {len(ring_hi['times'])}).")
        print(f"The order flips between them, consistent with the computed "
              f"{x_over / 2**20:.2f} MiB. "
              f"At {ex.human_bytes(mid)} "
              f"ring / recursive doubling = {ring_mid['measured'] / rd_mid['measured']:.2f} "
              f"(closed forms {ring_mid['model'] / rd_mid['model']:.2f}): too close to call.")
    for r in near:
        assert r["measured"] >= 0.98 * r["model"]  # the emulated network never delivers early


def _less_more(t: float, ref: float) -> str:
    """'5.2% less time' or '3.0% more time': t against ref, to one decimal."""
    d = 1 - t / ref
    return f"{abs(d):.1%} {'less' if d >= 0 else 'more'} time"


def explain_rabenseifner(rab: Sequence[dict], *, ring: Sequence[dict],
                         rd: Sequence[dict]) -> None:
    """Conclude whether Rabenseifner beat the ring at 4 KiB and recursive doubling at 4 MiB
    and, when it did, print the factors beside the closed forms'."""
    t_ring, m_ring = _by_size(ring, "measured"), _by_size(ring, "model")
    t_rd, m_rd = _by_size(rd, "measured"), _by_size(rd, "model")
    t_rab, m_rab = _by_size(rab, "measured"), _by_size(rab, "model")
    shown = conclude(t_rab[SMALL] < t_ring[SMALL] and t_rab[LARGE] < t_rd[LARGE],
                     "Rabenseifner beat the ring at 4 KiB and recursive doubling at 4 MiB")
    if shown:
        print(f"4 KiB: Rabenseifner {t_ring[SMALL] / t_rab[SMALL]:.1f}x faster than the ring "
              f"(closed forms {m_ring[SMALL] / m_rab[SMALL]:.1f}x: 4 rounds, not 6).")
        print(f"4 MiB: {t_rd[LARGE] / t_rab[LARGE]:.2f}x faster than recursive doubling (closed "
              f"forms {m_rd[LARGE] / m_rab[LARGE]:.2f}x); against the ring it took "
              f"{_less_more(t_rab[LARGE], t_ring[LARGE])} (closed forms "
              f"{_less_more(m_rab[LARGE], m_ring[LARGE])}).")


def explain_tree(tree: Sequence[dict], *, ring: Sequence[dict], rd: Sequence[dict]) -> None:
    """Conclude whether the binomial tree beat the ring at 4 KiB and was the slowest of tree,
    recursive doubling and ring at 4 MiB and, when so, print the factors beside the closed
    forms'."""
    t_ring, m_ring = _by_size(ring, "measured"), _by_size(ring, "model")
    t_rd, m_rd = _by_size(rd, "measured"), _by_size(rd, "model")
    t_tree, m_tree = _by_size(tree, "measured"), _by_size(tree, "model")
    shown = conclude(
        t_tree[SMALL] < t_ring[SMALL] and t_tree[LARGE] > t_rd[LARGE] > t_ring[LARGE],
        "the tree beat the ring at 4 KiB and was the slowest of the three at 4 MiB")
    if shown:
        print(f"4 KiB: the binomial tree {t_ring[SMALL] / t_tree[SMALL]:.1f}x faster than the ring "
              f"(closed forms {m_ring[SMALL] / m_tree[SMALL]:.1f}x).")
        # two decimals: at one, 2.45 and 2.44 print as 2.5 and 2.4 and look like a disagreement
        print(f"4 MiB: {t_tree[LARGE] / t_rd[LARGE]:.2f}x slower than recursive doubling, "
              f"{t_tree[LARGE] / t_ring[LARGE]:.2f}x slower than the ring (closed forms "
              f"{m_tree[LARGE] / m_rd[LARGE]:.2f}x and {m_tree[LARGE] / m_ring[LARGE]:.2f}x).")


def explain_parameter_server(ps: Sequence[dict], *, p: int, alpha: float, beta: float) -> None:
    """Print the 4 MiB parameter server's time in multiples of n beta beside this egress-only
    emulator's closed form (the server's NIC sent the sum p - 1 times) and the textbook cost;
    assert that it sent the sum p - 1 times, was not early against its replay and stayed below
    the textbook cost, 2(alpha + (p-1) n beta), which also queues the pushes."""
    big, nbeta = ex.one(ps, nbytes=LARGE), LARGE * beta
    textbook = models.parameter_server(p - 1, LARGE, alpha, beta)
    print(f"4 MiB: measured {ms(big['measured'])} = {big['measured'] / nbeta:.2f} n*beta: the "
          f"server's NIC sent the sum {p - 1} times (this emulator's closed form "
          f"{big['model'] / nbeta:.2f}).")
    print(f"On a real switch, which also queues the pushes (the textbook cost): "
          f"{textbook / nbeta:.2f} n*beta.")
    # the server sent the sum out p - 1 times through one NIC (egress only)
    assert big["measured"] > (p - 1) * nbeta
    assert big["measured"] >= 0.98 * big["replay"]
    assert big["measured"] < textbook


# --- all five side by side ------------------------------------------------------------------

def chain(rows: Sequence[dict], key: str) -> str:
    """The rows in their order as one line: 'a 14.9 < b 15.1 ms', with '≈' where two round to
    the same 0.1 ms and, for measured rows (key "measured", with a "median"), where the slower
    one's best is inside the faster one's own noise by the rule of `ex.leaders` (at most the
    faster's median plus its best-to-median spread): an order these repetitions cannot
    resolve is not printed as one."""
    parts = [(r.get("label") or ex.LABELS[r["algorithm"]], f"{r[key] * 1e3:.1f}") for r in rows]

    def tied(a: dict, b: dict) -> bool:  # b, the slower, within a's noise
        return key == "measured" and "median" in a and (
            b["measured"] <= a["median"] + (a["median"] - a["measured"]))

    return " ".join([f"{parts[0][0]} {parts[0][1]}"] + [
        f"{'≈' if v == prev or tied(a, b) else '<'} {name} {v}"
        for (_, prev), (name, v), a, b in zip(parts, parts[1:], rows, rows[1:])]) + " ms"


def same_order(ranked: Sequence[dict]) -> bool:
    """Whether the measured order (`ranked`, fastest first) is the closed forms' order, ties
    (`chain`'s '≈') counting as either order: every row of a later tie group has a larger
    closed form than every row of an earlier one."""
    groups: list[list[dict]] = []
    for prev, r in zip([None, *ranked], ranked):
        tied = prev is not None and (
            f"{r['measured'] * 1e3:.1f}" == f"{prev['measured'] * 1e3:.1f}"
            or r["measured"] <= prev["median"] + (prev["median"] - prev["measured"]))
        if tied:
            groups[-1].append(r)
        else:
            groups.append([r])
    return all(max(a["model"] for a in g) < min(b["model"] for b in h)
               for i, g in enumerate(groups) for h in groups[i + 1:])


def rank_algorithms(flat: Sequence[dict], *, p: int | None = None, alpha: float | None = None,
                    beta: float | None = None) -> tuple[dict[int, list[str]], list[str]]:
    """Per size, print the measured order (`chain`: '≈' where a gap is inside the runs' own
    noise) and a ✓ when it is the closed forms' order (`same_order`; the parameter server's
    closed form is this egress-only emulator's, the one its runs are checked against), after
    a line naming the sizes where some run paid over BUSY_FACTOR - 1 beyond its closed form.
    Then fold the closed forms' order and, given `p`, `alpha` and `beta`, the parameter
    server's place at its textbook cost, `models.parameter_server(p - 1, ...)` (a switch port
    in front of the server queues the pushes too), among the closed forms of the others.
    Asserts that no run was early. Returns (per size: the fastest algorithm and those tied
    with it, by `ex.leaders`; the sizes, as labels, where some run exceeded its closed form by
    over 30% beyond its staggered start, `beyond_stagger`: there this machine's cost can reorder
    close results)."""
    for r in flat:
        assert r["measured"] >= 0.98 * r["model"]  # the emulated network never delivers early
    lead = {}  # per size: the fastest and those tied with it (ex.leaders: within its own noise)
    busy_at = [ex.human_bytes(n) for n in ex.SIZES if beyond_stagger(ex.select(flat, nbytes=n))]
    if busy_at:
        print(f"At {', '.join(busy_at)} the extra per call beyond the staggered start "
              f"(appendix) is over {BUSY_FACTOR - 1:.0%} of some closed forms: busy there.")
    closed = []
    for n in ex.SIZES:
        ranked = sorted(ex.select(flat, nbytes=n), key=lambda r: r["measured"])
        lead[n] = [r["algorithm"] for r in ex.leaders(ranked)]
        print(f"{ex.human_bytes(n):>7}: " + chain(ranked, "measured")
              + ("  ✓" if same_order(ranked) else "  (not the closed forms' order: fold)"))
        closed.append(f"{ex.human_bytes(n)}: "
                      + chain(sorted(ranked, key=lambda r: r["model"]), "model"))
    if p is not None and alpha is not None and beta is not None:
        places = []
        for n in ex.SIZES:
            rows = ex.select(flat, nbytes=n)
            textbook = models.parameter_server(p - 1, n, alpha, beta)
            others = [r["model"] for r in rows if r["algorithm"] != "parameter_server"]
            place = 1 + sum(m < textbook for m in others)
            places.append(f"{'last' if place == len(rows) else _ordinal(place)} at "
                          f"{ex.human_bytes(n)} ({ms(textbook)})")
        closed.append("At its textbook cost (a switch port queues the pushes too) the parameter "
                      "server's closed form would place " + ", ".join(places)
                      + f" of {len(rows)}.")
    fold("The closed forms' order (the parameter server's at this emulator's egress-only cost), "
         "and its textbook place", "\n".join(closed))
    return lead, busy_at


def _ordinal(k: int) -> str:
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(k, "th")
    return f"{k}{suffix}"


def plot_regimes(flat: Sequence[dict], *, p: int, alpha: float, beta: float):
    """`ex.plot_regimes` of all five, with the parameter server's legend entry saying that the
    emulator shapes egress only and how much longer the textbook cost is at 4 MiB. Returns
    the axes."""
    ax = ex.plot_regimes(flat, title=f"{p} ranks: best time relative to the fastest algorithm")
    ps_textbook = (models.parameter_server(p - 1, LARGE, alpha, beta)
                   / ex.one(flat, algorithm="parameter_server", nbytes=LARGE)["model"])
    handles, labels = ax.get_legend_handles_labels()
    labels = [f"{lab}\n(egress-only emulator;\ntextbook {ps_textbook:.1f}x longer at 4 MiB)"
              if lab == ex.LABELS["parameter_server"] else lab for lab in labels]
    ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def explain_leaders(flat: Sequence[dict], lead: dict[int, list[str]]) -> None:
    """Conclude that the fastest at 4 KiB (and any tied) are 2-round algorithms and at 4 MiB
    bandwidth-optimal ones; for each shown, print how much longer the ring (4 KiB) or the
    parameter server (4 MiB) took, beside the closed forms."""
    t = {name: {r["nbytes"]: r["measured"] for r in ex.select(flat, algorithm=name)}
         for name in ex.FLAT_ALGORITHMS}
    for size, group, kind, other in (
            (SMALL, {"recursive_doubling", "parameter_server"}, "2-round", "ring"),
            (LARGE, {"ring", "rabenseifner"}, "bandwidth-optimal", "parameter_server")):
        names, one_ = " and ".join(ex.LABELS[a] for a in lead[size]), len(lead[size]) == 1
        shown = conclude(set(lead[size]) <= group,
                         f"at {ex.human_bytes(size)} the fastest (and any tied with it) "
                         f"are {kind} algorithms")
        if shown:
            first = lead[size][0]
            models_ratio = (ex.one(flat, algorithm=other, nbytes=size)["model"]
                            / ex.one(flat, algorithm=first, nbytes=size)["model"])
            print(f"{ex.human_bytes(size)}: {names} " + (f"fastest, a {kind} algorithm" if one_ else
                  f"tied, the {kind} algorithms") + f"; the {ex.LABELS[other]}"
                  f"{' (egress-only emulator)' if other == 'parameter_server' else ''} took "
                  f"{t[other][size] / t[first][size]:.1f}x as long (closed forms "
                  f"{models_ratio:.1f}x).")


# --- 8 ranks --------------------------------------------------------------------------------

def explain_eight_ranks(wide: Sequence[dict]) -> dict[int, str | None]:
    """On 8 ranks: conclude that recursive doubling beat the ring at 4 KiB and Rabenseifner beat
    recursive doubling at 4 MiB, and print each ratio beside its closed form. Asserts that no
    run was early. Returns, per size, the busy evidence (`beyond_stagger`: runs whose extra
    per call beyond the staggered start is over BUSY_FACTOR - 1 of their closed form) or None."""
    print(f"(8 rank processes on this machine's {os.cpu_count()} cores; each ratio below is "
          "printed beside its closed form)")
    w = {(r["algorithm"], r["nbytes"]): r for r in wide}
    rd8, rab8 = w["recursive_doubling", LARGE], w["rabenseifner", LARGE]
    rd4, ring4 = w["recursive_doubling", SMALL], w["ring", SMALL]
    for r in wide:
        assert r["measured"] >= 0.98 * r["model"]
    # per size: rows whose extra beyond the staggered start is over 30 % of their closed form
    busy = {n: beyond_stagger([r for r in wide if r["nbytes"] == n]) for n in (SMALL, LARGE)}
    conclude(rd4["measured"] < ring4["measured"],
             "on 8 ranks recursive doubling beat the ring at 4 KiB", busy=busy[SMALL])
    conclude(rab8["measured"] < rd8["measured"],
             "on 8 ranks Rabenseifner beat recursive doubling at 4 MiB", busy=busy[LARGE])
    p = ring4["p"]
    coef = {a: coefficients(a, p) for a in ("ring", "recursive_doubling", "rabenseifner")}
    why = {SMALL: f"{coef['ring'][0]:.0f} rounds against {coef['recursive_doubling'][0]:.0f}",
           LARGE: f"{coef['recursive_doubling'][1]:g} nβ against Rabenseifner's "
                  f"{coef['rabenseifner'][1]:g} nβ"}
    for n, (slow, fast) in ((SMALL, (ring4, rd4)), (LARGE, (rd8, rab8))):
        print(f"{ex.human_bytes(n)}, {ex.LABELS[slow['algorithm']]} / "
              f"{ex.LABELS[fast['algorithm']]}: closed forms "
              f"{slow['model'] / fast['model']:.2f} ({why[n]}), "
              f"measured {slow['measured'] / fast['measured']:.2f}"
              + (f" (busy: extra beyond the staggered start over {BUSY_FACTOR - 1:.0%})"
                 if busy[n] else "")
              + ".")
    return busy


# --- the numbers to quote -------------------------------------------------------------------

def tm(row: dict) -> str:
    """A best time and [its closed form]: '11.8 ms [10.3]'."""
    return f"{ms(row['measured'])} [{row['model'] * 1e3:.1f}]"


def print_numbers(flat: Sequence[dict], wide: Sequence[dict], *, lead: dict[int, list[str]],
                  busy_at: Sequence[str], busy: dict[int, str | None], p: int) -> None:
    """The numbers from this run, as bullets to quote: the fastest (or tied) at 4 KiB and 4 MiB
    against the ring and the parameter server, and the three algorithms on 8 ranks at 4 MiB,
    each with its closed form; where the run was busy, that this machine's cost can reorder
    close results and the closed forms are the ones to compare."""
    w = {(r["algorithm"], r["nbytes"]): r for r in wide}
    rd8, ring8, rab8 = (w[a, LARGE] for a in ("recursive_doubling", "ring", "rabenseifner"))
    print(f"- network: '{ex.NIC}' per node; {p} ranks unless stated; best time [closed form]")
    for size, other in ((SMALL, "ring"), (LARGE, "parameter_server")):
        names = " and ".join(ex.LABELS[a] for a in lead[size])  # fastest and tied
        times = " / ".join(tm(ex.one(flat, algorithm=a, nbytes=size)) for a in lead[size])
        them = ex.one(flat, algorithm=other, nbytes=size)
        egress = " (egress-only emulator)" if other == "parameter_server" else ""
        print(f"- {ex.human_bytes(size)}: {names} "
              f"{'fastest' if len(lead[size]) == 1 else 'tied'} ({times}), "
              f"{ex.LABELS[other]}{egress} "
              f"{tm(them)} (best of {len(them['times'])})"
              + ("; busy: compare the closed forms" if ex.human_bytes(size) in busy_at else ""))
    print(f"- 8 ranks, 4 MiB: Rabenseifner {tm(rab8)}, recursive doubling {tm(rd8)}, "
          f"ring {tm(ring8)} (best of {len(rab8['times'])})"
          + ("; busy: compare the closed forms" if busy[LARGE] else ""))


# --- appendix: two emulator paths -----------------------------------------------------------

def explain_two_paths(pairs: Sequence[dict]) -> None:
    """Print each size's isend/irecv ring / dist.all_reduce ratios (best, per-pair median,
    range) and one ring step's share; conclude that at 4 MiB they agree within half a step and
    that at 4 KiB the isend/irecv ring is less than one step from the library's, and print
    that no step is missing or extra when both hold. Asserts that no library run beat its
    replay. `pairs` is (the 4 KiB row, the 4 MiB row)."""
    for r in pairs:
        print(f"{ex.human_bytes(r['nbytes']):>6}, {r['repeats']} pairs: isend/irecv ring / "
              f"dist.all_reduce: best {r['best_ratio']:.3f}, per-pair median "
              f"{r['median_ratio']:.3f} (range {r['min_ratio']:.3f} .. {r['max_ratio']:.3f}); "
              f"one ring step is {r['step_share']:.0%}")
        assert min(r["library"]) >= 0.98 * r["replay"]
    small, large = pairs
    half = large["step_share"] / 2
    # 4 MiB: the bytes dominate; best and median agree within half a step. 4 KiB: the
    # isend/irecv ring also pays this machine's cost of each of its 6 steps, which the replay
    # does not count: it may be slower, but by less than one whole step (none missing). Both
    # are comparisons a busy machine can upset (conclude says so plainly there).
    agree = conclude(abs(large["best_ratio"] - 1) < half and abs(large["median_ratio"] - 1) < half,
                     "at 4 MiB the two rings agree within half a ring step, by the best and by the "
                     "per-pair median")
    close = conclude(1 - half < small["best_ratio"] < 1 + small["step_share"]
                     and 1 - half < small["median_ratio"] < 1 + small["step_share"],
                     "at 4 KiB the isend/irecv ring is less than one ring step from "
                     "dist.all_reduce, by the best and by the per-pair median")
    if agree and close:
        print(f"Both within a ring step by the best and the median: at 4 MiB within {half:.0%} "
              f"(half a step), at 4 KiB the isend/irecv ring {small['best_ratio']:.2f}x and "
              f"{small['median_ratio']:.2f}x: no whole step is missing or extra.")
