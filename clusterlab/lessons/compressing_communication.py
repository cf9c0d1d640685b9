"""What notebook 11 (compressing communication: what it saves) reads from its runs.

The experiments are `clusterlab.experiments.compression`; `st` below is its `SweepStats` of a
step-time sweep (noise band, verdicts, fitted compute). Here are the sentences computed from
it, the measured conclusions, and the break-even figure and box.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math

import numpy as np

from .. import facts
from ..experiments import compression
from ..experiments.common import conclude
from . import show

# A verdict of SweepStats, as the break-even table says it.
WORD = {"faster": "pays", "slower": "loses", "cannot tell": "cannot tell"}


# Seconds as whole milliseconds: 0.0123 -> '12 ms' (this notebook's unit).
ms = functools.partial(show.ms, digits=0)
ms1 = show.ms  # to 0.1 ms: a noise band


def inside_band(st, m: str, rates) -> str | None:
    """The evidence when a verdict cannot be told on this run: `m` against fp32 at `rates`
    is inside this run's noise band (None when there are no such rates)."""
    return (f"{m} against fp32 at {', '.join(map(str, rates))} Mbit/s is inside this run's "
            f"noise band of {ms(st.band(m))}") if rates else None


def ratio_range(st, m: str, rate) -> str:
    """fp32's step over `m`'s at `rate`, with the range its noise band allows: fp32's step
    over `m`'s step plus and minus the band ('8.3x (6.8 to 11)'; '(6.8 or more)' when the
    band exceeds the step)."""
    def num(x: float) -> str:
        return f"{x:.1f}" if x < 10 else f"{x:.0f}"

    base, step, band = st.step("none", rate), st.step(m, rate), st.band(m)
    hi = f" to {num(base / (step - band))}" if step > band else " or more"
    return f"{num(base / step)}x ({num(base / (step + band))}{hi})"


def explain_sweep(st, methods) -> bool:
    """One table: per method its noise band; on the slowest link its step and how many times
    longer fp32's step took (with the range the band allows: one run per rate); on the fastest
    its step, gain over fp32 and verdict. Then the conclusion (every compressed method beat
    fp32 at the slowest rate; a verdict inside the noise band is the evidence of a busy run).
    `methods` starts with the baseline "none". Returns whether it was shown."""
    slow, fast = st.slow, st.fast
    unclear = [m for m in methods[1:] if st.verdict(m, slow) == "cannot tell"]
    claim = f"every compressed method beat fp32 DDP at {slow} Mbit/s"
    shown = conclude(all(st.verdict(m, slow) == "faster" for m in methods[1:]), claim,
                     busy="; ".join(inside_band(st, m, [slow]) for m in unclear) or None)
    n = st.rows[0].get("steps_measured") if getattr(st, "rows", None) else None
    best = {q: min(methods, key=lambda m: st.step(m, q)) for q in (slow, fast)}
    words = {m: verdict_word(st, m, fast) for m in methods[1:]}
    print(f"The smallest step at {slow} Mbit/s: {best[slow]}; at {fast} Mbit/s: {best[fast]}.")
    print(f"Step = the fastest of {n} steps, each the slowest rank's." if n else
          "Step = the fastest step, the slowest rank's.")
    print(f"{'method':>11} | {f'step at {slow}':>11}  fp32 ÷ method | {f'step at {fast}':>12}"
          "  verdict")
    for m in methods:
        base = m == "none"
        print(f"{m:>11} | {ms(st.step(m, slow)):>11}  "
              f"{'-' if base else num_x(st.step('none', slow) / st.step(m, slow)):>13} | "
              f"{ms(st.step(m, fast)):>12}  {'' if base else words[m]}".rstrip())
    if any(w.startswith("borderline") for w in words.values()):
        print("(borderline: beyond the noise band, but within twice it; one run per rate)")
    off = off_line(st, methods)
    if off:
        n_off = sum(len(pts) for pts in off.values())
        print(f"{n_off} of {len(methods) * len(st.rates)} dots sit further from their dashed "
              "line than their method's noise band: "
              + "; ".join(f"{m} at {', '.join(str(q) for q, _ in pts)} Mbit/s"
                          for m, pts in off.items())
              + ". This run does not isolate why (one run per rate); the band, set by the "
              "typical spread, does not cover them, so a verdict near it is borderline.")
    with contextlib.redirect_stdout(io.StringIO()) as full:
        print_sweep_table(st, methods)
    show.fold("The same with each method's noise band, the range it allows, and the gain",
              full.getvalue(), pre=True)
    return shown


def verdict_word(st, m: str, q, *, words: dict | None = None) -> str:
    """`st.verdict(m, q)` (named by `words`, e.g. `WORD`, if given), called "borderline" when
    the gain is beyond the noise band but within twice it: the band is set by the typical
    spread, and one run per rate can sit further off (a dot off its line, `off_line`)."""
    v = st.verdict(m, q)
    w = v if words is None else words[v]
    return f"borderline {w}" if v != "cannot tell" and abs(st.gain(m, q)) <= 2 * st.band(m) \
        else w


def off_line(st, methods) -> dict:
    """Per method, the rates whose dot sits further from its dashed line (the closed form
    with the fitted compute) than the method's noise band: [(rate, measured - predicted s)].
    Empty when `st` has no table of predictions."""
    table = getattr(st, "table", None)
    if not table:
        return {}
    out = {}
    for m in methods:
        pts = [(q, st.step(m, q) - table[m, q]["predicted_step_s"]) for q in st.rates]
        pts = [(q, d) for q, d in pts if abs(d) > st.band(m)]
        if pts:
            out[m] = pts
    return out


def num_x(x: float) -> str:
    """A ratio as '3.4x' (under 10) or '12x'."""
    return f"{x:.1f}x" if x < 10 else f"{x:.0f}x"


def print_sweep_table(st, methods) -> None:
    """`explain_sweep`'s full table: per method its noise band; on the slowest link its step
    and fp32's over it with the band's range; on the fastest its step, gain and verdict."""
    slow, fast = st.slow, st.fast
    print(f"{'':20}| {f'at {slow} Mbit/s':27}| at {fast} Mbit/s")
    print(f"{'method':>11}{'band':>8} | {'step':>6}  {'fp32 ÷ method':18} | {'step':>6}"
          f"{'gain':>10}  verdict")
    for m in methods:
        base = m == "none"
        print(f"{m:>11}{'-' if base else ms1(st.band(m)):>8} | {ms(st.step(m, slow)):>6}  "
              f"{'-' if base else ratio_range(st, m, slow):18} | {ms(st.step(m, fast)):>6}"
              + ("" if base else f"{st.gain(m, fast) * 1e3:+7.1f} ms  "
                                 f"{verdict_word(st, m, fast)}"))
    print("(band = this run's noise band; gain = fp32 step − method step; verdict only if "
          "|gain| > band, borderline up to twice it)")


def calls_text(method: str, calls) -> str:
    """`calls` (kind, bytes) as cell 3 prints them, PowerSGD's three all-reduces named in the
    order torch's hook issues them: the uncompressed vectors, then P, then Q."""
    names = (["vectors", "P", "Q"] if method.startswith("powersgd") and len(calls) == 3
             else [""] * len(calls))
    return (", ".join(f"{k} of {n + ' ' if n else ''}{b} B" for (k, b), n in zip(calls, names))
            + f"  (total {sum(b for _, b in calls)} B)")


def breakeven_evidence(st, m: str, lo: float, hi: float) -> tuple[bool, str | None]:
    """Whether `m` paid at the low rates and lost at the high ones up to the fastest, its
    measured crossing overlapping the predicted `lo` to `hi` Mbit/s, and the evidence of a
    busy run when it did not (None: a real failure, for `conclude` to assert)."""
    a, b, mixed = st.crossing(m)
    v_fast = st.verdict(m, st.fast)
    holds = v_fast == "slower" and a is not None and a <= hi and b >= lo
    if holds or v_fast == "faster":
        return holds, None
    if mixed:
        return False, (f"{m}'s gain over fp32 went up and down across the rates, which the "
                       "network alone cannot do")
    if v_fast == "cannot tell" or a is None:
        return False, inside_band(st, m, [q for q in st.rates
                                          if st.verdict(m, q) == "cannot tell"])
    return False, None


def explain_breakeven(st, methods, *, ranks: int = 4, delay_s: float = 2e-3) -> bool:
    """For the PowerSGD ranks in `methods`, first one conclusion (each paid at the low rates
    and lost at the high ones up to the fastest, crossing within its predicted interval); then
    the time each saved against fp32 per rate with its verdict (`print_gains`), its predicted
    and measured break-even in one line, the rates where the ranks' verdicts differ
    (`explain_differing`), and whether the extra rounds or all else PowerSGD rank 1 adds
    decide its cost. Returns whether the conclusion was shown."""
    predicted = {m: st.breakeven_mbit(m, ranks, delay_s) for m in methods}
    evidence = [breakeven_evidence(st, m, predicted[m][0], predicted[m][2]) for m in methods]
    holds = all(h for h, _ in evidence)
    busy = (None if holds or any(not h and e is None for h, e in evidence)
            else "; ".join(e for h, e in evidence if not h))
    shown = conclude(holds, f"{' and '.join(methods)} paid at the low rates and lost at the high "
                     "ones up to the fastest, each crossing where predicted (a consistency "
                     "check, not an independent test: t_extra is fitted on this same sweep)",
                     busy=busy)
    parts = []
    for m in methods:
        lo, mid, hi = predicted[m]
        a, b, _ = st.crossing(m)
        parts.append(f"{m} {mid:.0f} ({lo:.0f} to {hi:.0f})"
                     + (f", measured between {a} and {b} Mbit/s" if a else
                        ", no measured crossing"))
    print("Break-even, predicted (± noise band) and measured: " + "; ".join(parts) + ".")
    differ = [q for q in st.rates if len({WORD[st.verdict(m, q)] for m in methods}) > 1]
    if differ:
        with contextlib.redirect_stdout(io.StringIO()) as why:
            for q in differ:
                explain_differing(st, methods, q)
        show.fold(f"Why the two ranks' verdicts differ at {', '.join(map(str, differ))} Mbit/s",
                  why.getvalue())
    delays_s = {m: compression.comm_seconds(compression.predicted_calls(m, ranks), ranks,
                                            delay_s, 0)
                for m in ("none", "powersgd:1")}
    rounds, extra, band = (delays_s["powersgd:1"] - delays_s["none"], st.extra_s("powersgd:1"),
                           st.band("powersgd:1"))
    print(f"PowerSGD rank 1's two extra all-reduces wait {ms(rounds)} of delays per step; all "
          f"else it adds is {extra * 1e3:.1f} ms")
    print(f"(median over {len(st.rates)} rates, noise band {ms(band)}): "
          + ("here, the rounds decide." if extra + band < rounds
             else "this run cannot tell which of the two decides."))
    with contextlib.redirect_stdout(io.StringIO()) as gains:
        print_gains(st, methods)
    show.fold("Per rate: the time each saved against fp32, and its verdict", gains.getvalue(),
              pre=True)
    return shown


def predicted_gain(st, m: str, q) -> float:
    """fp32's predicted step minus `m`'s at `q` (s): the dashed lines' gap."""
    return st.table["none", q]["predicted_step_s"] - st.table[m, q]["predicted_step_s"]


def predicted_verdict(st, m: str, q) -> str:
    """What the closed form (with its fitted compute) predicts for `m` against fp32 at `q`:
    "faster", "slower", or "cannot tell" when the predicted gain is inside the noise band."""
    g = predicted_gain(st, m, q)
    return "cannot tell" if abs(g) <= st.band(m) else "faster" if g > 0 else "slower"


def explain_differing(st, methods, q) -> None:
    """At rate `q`, where the measured verdicts of `methods` differ: each method's measured
    and predicted gain and how far its dot sits from its dashed line; then what the model
    says. Predicted gains of opposite signs put the methods on either side of their
    break-evens: the ranks cross at different rates. Gains of one sign with different
    predicted verdicts put them on the same side: the verdicts differ by how each gain
    compares with its own noise band. The same predicted verdict for all: the difference
    rests on one point off its line (one run per rate), which this run cannot tell from a
    different crossing."""
    off = {m: st.step(m, q) - st.table[m, q]["predicted_step_s"] for m in methods}
    gain = {m: predicted_gain(st, m, q) for m in methods}
    verdict = {m: predicted_verdict(st, m, q) for m in methods}
    print(f"At {q} Mbit/s the verdicts differ. " + "; ".join(
        f"{m}: gain {st.gain(m, q) * 1e3:+.1f} ms, predicted "
        f"{gain[m] * 1e3:+.1f} ms, its dot {abs(off[m]) * 1e3:.1f} ms "
        f"{'above' if off[m] > 0 else 'below'} its dashed line" for m in methods) + ".")
    worst = max(methods, key=lambda m: abs(off[m]))
    if len({WORD[v] for v in verdict.values()}) > 1:
        signs = {int(np.sign(g)) for g in gain.values()}
        if len(signs) > 1:
            print("The model predicts different verdicts here too ("
                  + ", ".join(f"{m} {WORD[verdict[m]]}" for m in methods)
                  + f"): its break-evens fall on either side of {q} Mbit/s, so the ranks "
                  "cross at different rates.")
            return
        inside = [m for m in methods if verdict[m] == "cannot tell"]
        outside = [m for m in methods if m not in inside]
        side = {1: "pay: neither has reached its break-even",
                -1: "lose: both are past their break-evens",
                0: "break even"}[signs.pop()]
        by_band = min(abs(gain[m]) for m in inside) >= max(abs(gain[m]) for m in outside)
        why, by = (("only because its noise band is wider", "by the bands, not by where the "
                    "ranks cross") if by_band else
                   ("because its predicted gain is inside its noise band", "by how near each "
                    "is to its break-even, not by which side it is on"))
        print(f"The model predicts that both {side} ("
              + ", ".join(f"{gain[m] * 1e3:+.1f} ms" for m in methods) + "). "
              + f"{' and '.join(inside)} {'reads' if len(inside) == 1 else 'read'} "
              f"'cannot tell' {why} ("
              + ", ".join(f"{m} {st.band(m) * 1e3:.1f} ms" for m in methods) + ")"
              + (f": the verdicts differ {by}."
                 if all(st.verdict(m, q) == verdict[m] for m in methods) else
                 f"; the measured verdicts differ otherwise, by {worst}'s one point off its "
                 "line (one run per rate)."))
        return
    crossings = [st.crossing(m) for m in methods]
    span = ([min(a for a, _, _ in crossings), max(b for _, b, _ in crossings)]
            if all(a is not None for a, _, _ in crossings) else None)
    print(f"The model predicts '{WORD[verdict[methods[0]]]}' for both: the "
          f"difference rests on {worst}'s one point off its line (one run per rate), so this "
          "run cannot tell whether the ranks cross at different rates"
          + (f"; both cross between {span[0]} and {span[1]} Mbit/s." if span else "."))


def breakeven_by_size(hiddens, *, ranks: int, latency_s: float) -> dict:
    """PowerSGD rank 1's break-even rate (Gbit/s) for the notebook's MLP widened to each of
    `hiddens`, on `ranks` ranks at `latency_s` per message with free compute, charging a
    ring's 2(p-1) delays ("ring") or a tree's 2 lg p ("log"); with the fp32 gradient bytes of
    each width ("sizes")."""
    sizes = [4 * sum(math.prod(s) for s in compression.parameter_shapes(hidden=h))
             for h in hiddens]
    be_size = {lat: [compression.breakeven_rate_bps("powersgd:1", ranks, latency_s, hidden=h,
                                                    latency=lat) / 1e9 for h in hiddens]
               for lat in ("ring", "log")}
    return {"hiddens": list(hiddens), "sizes": sizes, "ranks": ranks, "latency_s": latency_s,
            **be_size}


def plot_breakeven_by_size(scan: dict) -> None:
    """The break-even rate against the gradient bytes, ring and tree-like, with one NIC's
    rate (from the ledger) for scale."""
    import matplotlib.pyplot as plt

    sizes = scan["sizes"]
    nic_gbit = facts.get("nvidia.connectx7_rate").value
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.plot(np.array(sizes) / 1e6, scan["ring"], "o-", color="C3",
            label="powersgd:1, p=64, 10 us, ring: 2(p-1) delays")
    ax.plot(np.array(sizes) / 1e6, scan["log"], "s--", color="C1", mfc="none",
            label="the same, tree-like: 2 lg p delays")
    ax.axhline(nic_gbit, color="grey", ls="--", label=f"one {nic_gbit:g} Gb/s NIC (ConnectX-7)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("fp32 gradient bytes of the same MLP, widened (MB)")
    ax.set_ylabel("break-even rate (Gb/s)\nestimate, not measured")
    ax.set_title("Break-even grows with the bytes saved (assumed: 64 ranks, 10 us per message, "
                 "free compute)", fontsize=9)
    ax.legend(fontsize=8)
    plt.tight_layout()
    plt.show()


def at_bucket(be, sizes, cap_mib: float) -> float:
    """The break-even at one bucket of `cap_mib` MiB (log-log interpolation of `be` over
    `sizes`: near proportional)."""
    return float(np.exp(np.interp(np.log(cap_mib * 2**20), np.log(sizes), np.log(be))))


def bytes_at_rate(be, sizes, rate_gbit: float) -> float:
    """The bucket bytes whose break-even is `rate_gbit` (log-log interpolation)."""
    return float(np.exp(np.interp(np.log(rate_gbit), np.log(be), np.log(sizes))))


def sig2(x: float) -> str:
    """`x` to two significant figures, without an exponent: 1716 -> '1700', 1.88 -> '1.9' (an
    estimate under an assumed latency supports no more)."""
    return f"{float(f'{x:.2g}'):g}"


def show_breakeven_at_scale(scan: dict, *, n_params: int) -> None:
    """The box after the figure, to two significant figures: the conclusion, then a 2 x 2
    table (flat ring or idealised tree: PowerSGD rank 1's break-even for one DDP bucket at the
    default cap (ledger), and whether it pays on one NIC (ledger)); in a fold, what the
    estimate leaves out, the latency model against NCCL's, this model's own break-even and
    how it grows with the bytes, and buckets up to twice the cap. Asserts that the break-even
    grows about in proportion to the bytes."""
    sizes, ring, tree = scan["sizes"], scan["ring"], scan["log"]
    p = scan["ranks"]
    model_kb = 4 * n_params / 1e3
    nic_gbit = facts.get("nvidia.connectx7_rate").value
    ratio = ring[-1] / ring[0]
    assert ratio > 0.5 * sizes[-1] / sizes[0]  # about proportional to the bytes
    cap_mib = facts.get("pytorch.ddp_bucket_cap_mb").value
    bucket, bucket_log = at_bucket(ring, sizes, cap_mib), at_bucket(tree, sizes, cap_mib)
    twice, twice_log = at_bucket(ring, sizes, 2 * cap_mib), at_bucket(tree, sizes, 2 * cap_mib)
    # NCCL's tree at p ranks, 8 per node: up (ranks per node - 1) + lg(nodes) hops, and down.
    per_node, nodes = 8, p // 8
    up = per_node - 1 + int(math.log2(nodes))
    across, lg_p = 2 * int(math.log2(nodes)), int(math.log2(p))
    # PowerSGD's added delays (two more all-reduces), and the compute it may add per bucket
    # and still pay on one NIC: 8 dB / rate_nic - dL alpha = dL alpha (break-even / rate_nic - 1).
    added = {lat: compression.latency_terms(compression.predicted_calls("powersgd:1", p), p, lat)
             - compression.latency_terms(compression.predicted_calls("none", p), p, lat)
             for lat in ("ring", "log")}

    def budget_ms(rate: float, latency: str) -> float:
        return added[latency] * scan["latency_s"] * (rate / nic_gbit - 1) * 1e3

    lead = ("PowerSGD rank 1 loses to fp32 on one fast NIC whichever way the all-reduce's "
            "message delays are counted" if twice_log < nic_gbit else
            "PowerSGD rank 1 still beats fp32 on one fast NIC whichever way the all-reduce's "
            "message delays are counted" if bucket > nic_gbit else
            "whether PowerSGD rank 1 beats fp32 on one fast NIC depends on how many message "
            "delays an all-reduce pays: counted as a flat ring, no; as an idealised tree, it "
            "can, if its compute per bucket stays under about "
            f"{sig2(budget_ms(bucket_log, 'log'))} ms"
            if bucket_log > nic_gbit else
            "whether PowerSGD rank 1 beats fp32 on one fast NIC depends on how many message "
            "delays an all-reduce pays and on the bucket's size")

    def pays(rate: float, latency: str) -> str:
        return (f"PowerSGD pays while its compute per bucket < {sig2(budget_ms(rate, latency))} "
                "ms" if rate > nic_gbit else "PowerSGD loses")

    head = ("| an all-reduce counted as | delays per all-reduce | break-even, one "
            "[[pytorch.ddp_bucket_cap_mb]] bucket, free compute | on one "
            "[[nvidia.connectx7_rate]] NIC |")
    lat_us = scan["latency_s"] * 1e6
    facts.show(f"""
**In short** (estimates from the formula, not runs, at an assumed {lat_us:.0f} µs per message):

- The bytes saved grow with the bucket, the added rounds do not: bigger buckets favour PowerSGD.
- For one full DDP bucket on {p} ranks, {lead}.

{head}
| --- | --- | --- | --- |
| flat ring | 2(p−1) = {2 * (p - 1)} | {sig2(bucket)} Gb/s | {pays(bucket, 'ring')} |
| idealised tree | 2 lg p = {2 * lg_p} | {sig2(bucket_log)} Gb/s | {pays(bucket_log, 'log')} |

<details><summary>How the estimate is built: what it leaves out, this model, buckets up to
twice the cap</summary>

- **What it leaves out.** The model prices only rounds and bytes: leaving out compute and
  overlap makes its break-even rates too high, and the latency it charges per round moves
  them either way. Agarwal et al. compared gradient compression with optimised data-parallel
  training on GPU clusters and found that, because of the compute compression adds,
  [[paper.agarwal_compression_utility_2022]]. How much of the exchange the backward already
  hides matters too (*On a real GPU cluster*).
- **Why the tree's row differs.** A tree waits {2 * lg_p} delays per all-reduce instead of
  {2 * (p - 1)}, so PowerSGD's two extra all-reduces cost {added['log'] * lat_us:.0f} µs instead
  of {added['ring'] * lat_us / 1e3:.1f} ms and its break-even rises {bucket_log / bucket:.1f}x. The
  {lat_us:.0f} µs per message is unsourced, charged on every hop, NVLink ones too.
- **This model.** On {p} ranks, this {model_kb:.0f} kB model's PowerSGD rank 1 pays below about
  {sig2(ring[0])} Gb/s (ring) to {sig2(tree[0])} Gb/s (tree). The break-even grows
  roughly in proportion to the bytes in one exchange ({sig2(ratio)}x higher for
  {sig2(sizes[-1] / sizes[0])}x the bytes: PowerSGD's own bytes grow only with a matrix's
  rows plus columns, so the bytes it saves grow slightly faster than fp32's).
- **Per bucket.** DDP calls the hook once per bucket, each paying its own rounds, so what
  counts is one bucket's bytes. DDP [[pytorch.ddp_bucket_whole_params]]. A bucket at twice
  the cap breaks even near {sig2(twice)} to {sig2(twice_log)} Gb/s. PowerSGD still pays on
  one such NIC once a bucket holds more than about
  {sig2(bytes_at_rate(ring, sizes, nic_gbit) / 1e6)} MB (ring) or
  {sig2(bytes_at_rate(tree, sizes, nic_gbit) / 1e6)} MB (tree).

</details>

<details><summary>For experts: how NCCL's tuner prices these hops (its latency lies between
the two rows)</summary>

The flat ring charges each of its steps a
  full delay. NCCL's tuner charges a multi-node ring's steps inside a node less than its
  network steps, but each at least a network overhead ([[nccl.tuner_ring_intra_step_amd]] on
  AMD hosts, Simple protocol): the flat ring overcharges, by less than NVLink's latency alone
  suggests. NCCL's tree (since [[nccl.tree_since]]) is a [[nccl.double_binary_tree]] across
  nodes, each tree carrying half the data, with a chain inside each node:
  about [[nccl.tree_depth_estimate]] deep (NCCL's own comment calls
  it an approximation). An all-reduce goes up and down, so at p = {p} with
  {per_node} per node about 2 × {up} = {2 * up} hops, {across} of them across nodes, against
  the idealised tree's {2 * lg_p}. NCCL's tuner prices it (Simple protocol, which carries large
  buckets; LL charges less per hop) at
  [[nccl.tuner_tree_allreduce_latency]]: weighted that way, the {2 * up - across} hops inside
  nodes cost less than the {across} across them, so its latency sits nearer the idealised count
  than its {2 * up} hops suggest.

</details>
""")


def plain_log_ticks(ax, xs=None) -> None:
    """Plain numbers (1, 2, 5 per decade) on both log axes of `ax`: '50', not '5x10^1', so a
    crossing can be read off directly; given `xs` (the rates swept), exactly those on x."""
    from matplotlib import ticker

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))
        axis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        axis.set_minor_formatter(ticker.NullFormatter())
    if xs is not None:
        ax.xaxis.set_major_locator(ticker.FixedLocator(list(xs)))
        ax.xaxis.set_minor_locator(ticker.NullLocator())


def least_compression_rate(rank: int = 4) -> float:
    """How many times this model's least compressible matrix (n x m) shrinks under PowerSGD
    at `rank`: nm / (rank (n + m))."""
    return min(n * m / (rank * (n + m)) for n, m in
               (s for s in compression.parameter_shapes() if len(s) == 2))


DDP_SOURCE_2_13 = ("https://github.com/pytorch/pytorch/blob/v2.13.0/torch/nn/parallel/"
                   "distributed.py")


def real_cluster_text() -> str:
    """The "On a real GPU cluster" box for compression: four headline bullets (exposed
    communication, PowerSGD's late start, FSDP2's lack of a DDP hook, slow links), then a
    fold with DDP's bucket sizes, the bf16 hook's conditions, PowerSGD's minimum compression
    rate (with this model's least compression rate at rank 4), FSDP1 and FP8 in expert
    parallelism: a template for `facts.show`, whose [[...]] placeholders cite the ledger."""
    min_rate = least_compression_rate(4)
    return f"""
- **Only exposed communication can shrink.** DDP's design ([[paper.li_pytorch_ddp_2020]])
  all-reduces each bucket while the backward pass still runs: a compressor saves only what
  the backward does not hide (here all of it: one bucket), and its own GPU work can compete
  with the backward's kernels.
- **PowerSGD starts late by default.** torch's hook runs plain all-reduce for its first
  [[pytorch.powersgd_start_iter]] (the runs above compressed from step
  {compression.POWERSGD_START}).
- **FSDP2 has no DDP-style hook.** FSDP2 (`fully_shard`) has
  [[pytorch.fsdp2_no_comm_hook]]: a compressor goes in a custom reduce-scatter or
  all-gather; its reduce dtype is in [11b](11b_error_feedback_and_accuracy.ipynb).
- **Slow links: exchange less often, not fewer bits.** DiLoCo lets each worker train on its
  own for hundreds of steps, then averages the change and applies it with an outer
  optimizer: [[diloco.paper]].

<details><summary>More: DDP's bucket sizes, when DDP accepts the bf16 hook, PowerSGD's
minimum compression rate, FSDP1, FP8 in expert parallelism</summary>

- **DDP's buckets.** From the bucket rebuild after the first step on, the bucket reduced
  first (the last layers' gradients) is capped at [[pytorch.ddp_first_bucket]], the others
  at [[pytorch.ddp_bucket_cap_mb]], each holding whole gradients. The first step puts every
  gradient in one bucket (with the default `find_unused_parameters=False`:
  [torch 2.13's `_BucketCapacityConfig.compute_bucket_size_limits`]({DDP_SOURCE_2_13})).
- **The bf16 hook.** DDP accepts torch's bf16 hook only if the installed torch has
  [[pytorch.ddp_bf16_hook_check]] (XPU: Intel GPUs; XCCL: their collectives library),
  checked when the hook is registered: on the torch build and the libraries present, not
  on the backend the job uses.
- **PowerSGD's minimum compression rate.** It compresses a matrix only if its compression
  rate exceeds [[pytorch.powersgd_min_compression_rate]] (here 1, which changes nothing:
  this model's least compressible matrix still shrinks {min_rate:.1f}x at rank 4).
- **FSDP1** has [[pytorch.fsdp1_comm_hook]].
- **FP8 where bytes dominate, in expert parallelism** (an all-to-all of tokens, not gradient
  compression). DeepEP, DeepSeek's all-to-all library for mixture-of-experts layers,
  supports FP8; in the DeepSeek-V3 pretraining setting its README benchmarks, it sends
  [[deepep.fp8_dispatch]] ("dispatch" sends tokens to their experts, "combine" brings the
  results back).
</details>
"""


def explain_meter_overhead(st, *, starts: int = 200) -> float:
    """How much the course's meter adds: it relays each collective's future through a thread
    it starts (`compression._Meter`), so PowerSGD (three all-reduces) starts two more per step
    than fp32. Times `starts` thread starts and joins in this process and prints the median
    against PowerSGD rank 1's fitted extra time. Returns the median (s)."""
    import threading
    import time

    times = []
    for _ in range(starts):
        t0 = time.perf_counter()
        th = threading.Thread(target=lambda: None, daemon=True)
        th.start()
        th.join()
        times.append(time.perf_counter() - t0)
    median = float(np.median(times))
    extra = st.extra_s("powersgd:1")
    print(f"The meter's relay thread: a start and join took a median {median * 1e6:.0f} us here "
          f"({starts} tries, this process); PowerSGD's two extra ones per step are "
          + (f"{2 * median / extra:.1%} of its fitted t_extra ({extra * 1e3:.1f} ms)."
             if extra > 0 else f"{2 * median * 1e3:.2f} ms (its fitted t_extra is 0)."))
    return median


def explain_prediction_errors(st) -> bool:
    """How close the closed form came to the measured steps (median and largest relative
    error), why the worst point may sit below the model, and the conclusion (the median error,
    checked to be under 30%; fp32's own noise band above 30% of its fastest step is the
    evidence of a busy run). Returns whether it was shown."""
    err = st.prediction_errors()
    worst = st.rows[int(np.argmax(err))]
    print(f"The closed form is within a median {np.median(err):.0%} of the {len(err)} (method, "
          f"rate) points (largest {err.max():.0%}, {worst['method']} at "
          f"{worst['rate_mbit']} Mbit/s).")
    w_row = st.table[worst["method"], worst["rate_mbit"]]
    if worst["step_s"] < worst["predicted_step_s"]:
        print(f"That point is {ms(worst['predicted_step_s'] - worst['step_s'])} *below* the "
              f"model: its fitted compute ({ms(w_row['compute_s'])}) is a median over all "
              f"rates.")
        comm = w_row["predicted_comm_s"]
        print("The step is " + ("still above" if worst["step_s"] > comm else "within 10% of"
                                 if worst["step_s"] > 0.9 * comm else "below")
              + f" its exchange's closed form ({ms(comm)}).")
    return conclude(np.median(err) < 0.3, f"the closed form follows the measured steps, with "
                    f"a median error of {np.median(err):.0%} (the check: under 30%)",
                    busy=(f"fp32's noise band alone is {ms(st.band('none'))}"
                          if st.band("none") > 0.3 * st.step("none", st.fast) else None))


def print_gains(st, methods) -> None:
    """The noise bands the verdicts use, then per rate the time each of `methods` saved
    against fp32 and its verdict."""
    print("Time saved against fp32 per step (fp32's step minus the method's); it counts only "
          "beyond the method's noise band: "
          + ", ".join(f"{m} {st.band(m) * 1e3:.1f} ms" for m in methods) + ".")
    print(f"{'Mbit/s':>7}" + "".join(f"{m:>30}" for m in methods))
    for q in st.rates:
        print(f"{q:>7}" + "".join(f"{st.gain(m, q) * 1e3:>10.1f} ms "
                                  f"{verdict_word(st, m, q, words=WORD):>17}"
                                  for m in methods))
    print("(borderline: beyond the noise band, but within twice it)")
