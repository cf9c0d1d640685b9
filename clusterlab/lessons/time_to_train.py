"""What notebook 04c reads from its runs: steps to the target, time to train, the critical batch.

The experiments are `jitter_at_scale.throughput_collapse` (simulated step times) and
`jitter_at_scale.time_to_train` (real SGD's steps to the target at each global batch); the
functions here turn their plain data into the figure, the sentences and the checks.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from clusterlab import facts, models
from clusterlab.lessons.show import say

STYLES = {"ring": ("-", "#4C72B0"), "tree": ("--", "#4C72B0")}
"""The two simulated all-reduces, with their line style and colour on the figure."""


def span(ns) -> str:
    """A sorted list of node counts as a range: [8] -> '8', [8, 16, 32] -> '8 to 32'."""
    return f"{ns[0]}" if len(ns) == 1 else f"{ns[0]} to {ns[-1]}"


def settled(s: dict, batches: list) -> int:
    """The critical batch estimate from steps to the target `s` per batch: the smallest batch
    from which every larger batch's steps stay within twice the largest batch's (McCandlish:
    S(B_crit) = 2 S_min; the largest batch's steps stand in for S_min)."""
    return min(b for b in batches if all(s[c] <= 2 * s[batches[-1]] for c in batches if c >= b))


def implied_crit(steps: dict, b_crit: int) -> tuple | None:
    """The critical batch that McCandlish's S(B) = S_min(1 + B_crit/B) implies at each batch
    below the estimate `b_crit`, B(S(B)/S_min − 1) (S_min: the largest batch's steps), as
    (lowest, highest); None when no batch lies below the estimate."""
    s_min = steps[max(steps)]
    v = [b * (steps[b] / s_min - 1) for b in steps if b < b_crit]
    return (min(v), max(v)) if v else None


def batch_range(lo: float, hi: float) -> str:
    """A range of critical batches to two significant figures: (801, 2219) -> '800 to 2200',
    (128, 131) -> '130'."""
    lo_, hi_ = (f"{float(f'{x:.2g}'):.0f}" for x in (lo, hi))
    return lo_ if lo_ == hi_ else f"{lo_} to {hi_}"


def crit_range(steps: dict, b_crit: int) -> tuple[int, int]:
    """The critical batch as a range of batches: what McCandlish's model implies at the smaller
    batches (`implied_crit`) together with the estimate `b_crit` (the estimate alone when no
    batch lies below it)."""
    rng = implied_crit(steps, b_crit) or (b_crit, b_crit)
    return min(rng[0], b_crit), max(rng[1], b_crit)


def crit_text(crit: dict) -> str:
    """The critical batch as the first verdict states it, once: its range in batches and in
    nodes, the figure's grey band: 'B_crit ≈ 800 to 2200 samples, 25 to 69 nodes: the grey
    band'. The estimate, and why only a range, are in the appendix."""
    lo, hi = crit["crit_range"]
    per_rank = crit["per_rank"]
    nodes = batch_range(lo / per_rank, hi / per_rank)
    return (f"B_crit ≈ {batch_range(lo, hi)} samples, {nodes} node{'s' if nodes != '1' else ''}"
            ": the grey band")


def placed(batches: list, crit: dict) -> str:
    """Where the global batches `batches` (one curve's best, by seed) lie against the critical
    batch's range: 'below', 'past', 'inside or past' (none below it) or 'around' it."""
    lo, hi = crit["crit_range"]
    return ("below" if max(batches) < lo else "past" if min(batches) > hi else
            "inside or past" if min(batches) >= lo else "around")


def nccl_step_times(nodes: list, *, compute_s: float) -> dict:
    """The ring's step time per node count with NCCL's tuner constant per network step instead
    of the emulated 2 ms: compute plus 2(N − 1) such steps of a 1 MiB all-reduce, no bandwidth
    term (what the figure's NCCL curve and `nccl_best_nodes` use)."""
    alpha = facts.get("nccl.tuner_net_ring_step_latency_simple").value * 1e-6
    return {n: compute_s + models.ring_allreduce(n, 1 << 20, alpha, 0.0) for n in nodes}


def least_rising(ring_t: dict, nodes: list) -> tuple[list, int]:
    """The node counts from the least time to train on, and at how many of their doublings the
    time rose."""
    past = [n for n in nodes if n >= min(ring_t, key=ring_t.get)]
    ups = sum(ring_t[b] > ring_t[a] for a, b in zip(past, past[1:]))
    return past, ups


def plot_time_to_train(ttt: dict, acc_curve: list, *, nodes: list, acc: int,
                       compute_s: float) -> None:
    """The figure: the measured steps to the target against the global batch (range of the
    seeds, each point's tuned rate) and the time to train against the nodes for the ring, the
    tree, the ring with accumulation and the ring with NCCL's tuner constant per network step
    (`nccl_step_times`), each curve's least time marked; on both panels the critical batch's
    range (`crit_range`, shaded) and its estimate (`settled`, dotted; on the right, the nodes
    at which the curves without accumulation reach it: accumulation reaches it on fewer); the
    title says where the ring's time is least."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), gridspec_kw={"width_ratios": [0.9, 1.2]})
    rows = ttt["steps"]["rows"]
    per_rank = ttt["per_rank_batch"]
    steps = {r["batch"]: r["steps"] for r in rows}
    b_crit = settled(steps, sorted(steps))
    lo, hi = crit_range(steps, b_crit)
    for ax, x, at, y in ((axes[0], b_crit, f"critical batch\n≈ {batch_range(lo, hi)}\n"
                          f"(estimate {b_crit})", 1),
                         (axes[1], b_crit // per_rank, "critical batch\n(without accumulation):"
                          f"\n≈ {batch_range(lo / per_rank, hi / per_rank)} nodes", 0)):
        scale = 1 if ax is axes[0] else per_rank
        ax.axvspan(lo / scale, hi / scale, color="grey", alpha=0.12, lw=0)
        ax.axvline(x, ls=":", color="grey")
        ax.annotate(at, (x, y), xycoords=("data", "axes fraction"),
                    fontsize=7, color="grey", textcoords="offset points",
                    xytext=(3, -34) if y else (-3, 4), ha="left" if y else "right")
    axes[0].errorbar([r["batch"] for r in rows], [r["steps"] for r in rows],
                     yerr=[[r["steps"] - min(r["per_seed"]) for r in rows],
                           [max(r["per_seed"]) - r["steps"] for r in rows]],
                     fmt="o-", color="k", capsize=3)
    for r in rows:
        axes[0].annotate(f"lr {r['lr']:g}", (r["batch"], r["steps"]), fontsize=7,
                         textcoords="offset points", xytext=(4, 4))
    axes[0].set_xscale("log", base=2)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("global batch N·b, samples (b = 32)")
    axes[0].set_ylabel(f"steps to the target loss\n(mean and range of "
                       f"{len(ttt['steps']['seeds'])} seeds)")
    axes[0].set_title("measured: real SGD on the toy, best learning rate", fontsize=9)
    curves = [(label, ttt["curves"][label], style, color)
              for label, (style, color) in STYLES.items()]
    curves.append((f"ring, accumulate {acc}: global batch {acc}·N·b (below)",
                   acc_curve, ":", "#55A868"))
    nccl_step = nccl_step_times(nodes, compute_s=compute_s)
    us = facts.get("nccl.tuner_net_ring_step_latency_simple").value
    curves.append((f"ring at NCCL's tuner constant, {us:g} µs per step (below)",
                   [{"nodes": n, "time_s": steps[n * per_rank] * nccl_step[n]} for n in nodes],
                   "-.", "#DD8452"))
    for label, c, style, color in curves:
        axes[1].plot([r["nodes"] for r in c], [r["time_s"] for r in c], style, color=color,
                     lw=2 if style == ":" else 1.5, label=label)
        least = min(c, key=lambda r: r["time_s"])   # each curve's best node count
        axes[1].plot(least["nodes"], least["time_s"], "o", mfc="none", color=color, ms=9)
    axes[1].set_xscale("log", base=2)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("nodes")
    axes[1].set_ylabel("time to the target loss, s")
    axes[1].set_title("steps × simulated step time (mean of the seeds; circle: least)",
                      fontsize=9)
    axes[1].legend(fontsize=7.5, loc="upper center")
    ring_t = {r["nodes"]: r["time_s"] for r in ttt["curves"]["ring"]}
    past, ups = least_rising(ring_t, nodes)
    fig.suptitle(f"The ring's time to train is least at {past[0]} nodes (on a rate grid a "
                 f"factor of 2 apart); past it, it rose at {ups} of {len(past) - 1} doublings of "
                 "the nodes")
    fig.tight_layout()
    plt.show()


def best_node_counts(ttt: dict, step_times: dict, *, nodes: list, per_rank: int) -> dict:
    """Everything the critical-batch section reads from the run: the best node count of each
    curve by the mean and by each seed, the critical batch estimate (overall and per seed) and
    the nodes that reach it, and the learning-rate plateau of the largest batches."""
    rows = ttt["steps"]["rows"]
    curves = ttt["curves"]
    steps = {r["batch"]: r["steps"] for r in rows}
    best = {k: min(curves[k], key=lambda r: r["time_s"]) for k in STYLES}
    t_of = {k: {r["nodes"]: r["time_s"] for r in curves[k]} for k in STYLES}
    lr_top = max(r["lr"] for r in rows)
    top_from = min(r["batch"] for r in rows if r["lr"] == lr_top)
    n_seeds = len(ttt["steps"]["seeds"])
    per_seed = {r["batch"]: np.array(r["per_seed"], dtype=float) for r in rows}
    batches = sorted(per_seed)

    def seed_times(k, n):   # time to the target at n nodes, one value per seed
        return per_seed[n * per_rank] * step_times[k][n]

    b_crit = settled(steps, batches)   # the critical batch estimate, and each seed's
    seed_crit = sorted({settled({b: per_seed[b][i] for b in batches}, batches)
                        for i in range(n_seeds)})
    # each seed's own best node count: how well this run resolves the optimum
    seed_best = {k: sorted({nodes[i] for i in np.argmin([seed_times(k, n) for n in nodes], axis=0)})
                 for k in STYLES}
    return {"rows": rows, "steps": steps, "step_times": step_times, "nodes": nodes,
            "per_rank": per_rank, "best": best, "t_of": t_of,
            "s1": steps[per_rank], "s_big": steps[max(nodes) * per_rank],
            "lr_top": lr_top, "top_from": top_from,
            "plateau": [r for r in rows if r["batch"] >= top_from],
            "n_seeds": n_seeds, "per_seed": per_seed, "batches": batches,
            "b_crit": b_crit, "seed_crit": seed_crit, "n_crit": b_crit // per_rank,
            "seed_best": seed_best, "pool": ttt["steps"].get("task", {}).get("pool"),
            "crit_range": crit_range(steps, b_crit)}


def best_nodes_sentence(crit: dict) -> str:
    """One bold line first: the ring's best node count (by the mean and by seed) against the
    critical batch's range (`crit_text`), and the tree's best by seed. Then why (step time's
    growth against the fall in steps to target, one doubling past the ring's best), how much
    longer 1024 nodes take, an optimum at the edge of the range, and where the estimate's
    arithmetic is (the appendix: `estimate_points`)."""
    best, t_of, seed_best = crit["best"], crit["t_of"], crit["seed_best"]
    steps, step_times, per_rank = crit["steps"], crit["step_times"], crit["per_rank"]
    nodes = crit["nodes"]
    edge = [k for k in STYLES if max(seed_best[k]) == max(nodes)]
    nb_ = best["ring"]["nodes"]
    where = placed([n * per_rank for n in seed_best["ring"]], crit)
    grew = step_times["ring"][2 * nb_] / step_times["ring"][nb_]
    fell = steps[nb_ * per_rank] / steps[2 * nb_ * per_rank]
    return (
        f"**The ring's time to train is least at {nb_} nodes ({span(seed_best['ring'])} by "
        f"seed), {where} the critical batch ({crit_text(crit)}); the tree's best is at "
        f"{span(seed_best['tree'])} nodes by seed.**"
        f"\n\nWhy: from {nb_} to {2 * nb_} nodes the ring's step time grew ×{grew:.2f} while "
        f"the steps to target fell only ×{fell:.2f}"
        + (": a step time that grows faster than the steps to target fall stops paying even "
           "before the critical batch." if grew > fell and where == "below" else ".")
        + f" On {max(nodes)} nodes the ring takes "
        f"{t_of['ring'][max(nodes)] / best['ring']['time_s']:.0f}× longer than at its best."
        + " Why the critical batch is only a range"
        + (f", and why the {' and the '.join(edge)}'s optimum may lie past {max(nodes)} nodes"
           if edge else "")
        + ": appendix.")


def estimate_points(crit: dict) -> list:
    """The critical batch estimate's arithmetic, for the appendix: the ring's best and the next
    node count at one tuned rate (a rate between grid values might cut the steps more), S_min and
    where the mean steps stay below 2 S_min, the steps' fall and the ring's step-time growth past
    it, then `grid_points`."""
    steps, step_times, per_rank = crit["steps"], crit["step_times"], crit["per_rank"]
    nodes, batches, b_crit, n_crit = crit["nodes"], crit["batches"], crit["b_crit"], crit["n_crit"]
    s_big, seed_crit = crit["s_big"], crit["seed_crit"]
    nb_ = crit["best"]["ring"]["nodes"]
    lr_of = {r["batch"]: r["lr"] for r in crit["rows"]}
    same_lr = lr_of[nb_ * per_rank] == lr_of[2 * nb_ * per_rank]
    return (
        ([f"Both {nb_} and {2 * nb_} nodes ran at the same tuned rate "
            f"({lr_of[nb_ * per_rank]:g}): a rate between grid values might cut the steps more, "
            "so the small fall in steps to target between them is partly the grid's."]
         if same_lr else [])
        + [f"Critical batch estimate: S_min ≈ {s_big:.1f} steps (the largest batch's), so "
           f"2 S_min = {2 * s_big:.1f}; from batch {b_crit} on ({n_crit} nodes"
           + (f", {'past' if n_crit > nb_ else 'below'} the ring's best" if n_crit != nb_ else
              ", the ring's best")
           + f") the mean steps stay below that ({span(seed_crit)} by seed)."
           + (f" From there to batch {batches[-1]} the steps fell ×{steps[b_crit] / s_big:.1f} "
              f"in all, while the ring's step time grew "
              f"×{step_times['ring'][max(nodes)] / step_times['ring'][n_crit]:.1f}."
              if b_crit < batches[-1] else " This range of batches is too short to see past it.")]
        + grid_points(crit))


def grid_points(crit: dict) -> list:
    """Why the critical batch estimate is approximate, one short point each: the range of B_crit
    the smaller batches imply in McCandlish's model (`implied_crit`; a lower true S_min would
    raise it and the estimate); when they happened, a fall into it steeper than the model allows
    (for any B_crit, S(B)/S(2B) = (1 + B_crit/B)/(1 + B_crit/2B) < 2; else against its value at
    the estimate, B = B_crit/2: ×1.5), the tuned rate's rise into it and steps that rise past it
    (the model's never do); then the rate grid, not the batch alone, shapes the steps over those
    batches."""
    steps, b_crit, batches = crit["steps"], crit["b_crit"], crit["batches"]
    lr_of = {r["batch"]: r["lr"] for r in crit["rows"]}
    prev = b_crit // 2
    rng = implied_crit(steps, b_crit)
    out = [f"Treat {b_crit} as approximate" + (
        f": in McCandlish's model the smaller batches' steps imply B_crit = B(S/S_min − 1) ≈ "
        f"{batch_range(*rng)}, and a lower true S_min would raise these and the estimate."
        if rng else " (a lower true S_min would move it right).")]
    if prev in steps:
        fall, allowed = steps[prev] / steps[b_crit], (1 + b_crit / prev) / 2
        rate = (f"the tuned rate rose {lr_of[prev]:g} → {lr_of[b_crit]:g} there"
                if lr_of[prev] != lr_of[b_crit] else "")
        head = f"The fall into it, {steps[prev]:.1f} → {steps[b_crit]:.1f} steps (×{fall:.2f}), "
        if fall > 2:
            out.append(head + "is steeper than the model allows for any B_crit (at most ×2 per "
                       "doubling of the batch)" + (f", and {rate}." if rate else "."))
        elif fall > allowed:
            out.append(head + f"is steeper than the model allows at the estimate (×{allowed:.1f})"
                       + (f", and {rate}." if rate else "."))
        elif rate:
            out.append(rate[0].upper() + rate[1:] + ".")
    rises = [(a, b) for a, b in zip(batches, batches[1:]) if a >= b_crit and steps[b] > steps[a]]
    if rises:
        a, b = rises[0]
        out.append(f"Past it the steps even rise ({steps[a]:.1f} → {steps[b]:.1f} at batch {b}), "
                   "which the model's steps never do.")
    if len(out) > 1 and (lr_of.get(prev) != lr_of[b_crit] or rises):
        lo = min(b for b in batches if b <= prev and lr_of[b] == lr_of[prev]) if prev in lr_of \
            else b_crit
        hi = rises[-1][1] if rises else b_crit
        out.append(f"From batch {lo} to {hi} the rate grid (a factor of 2 apart), not the batch "
                   "alone, shapes the steps.")
    return out


def ring_table(crit: dict) -> None:
    """Prints the ring's curve, one row per node count: the global batch, its tuned rate, the
    steps to the target (mean of the seeds), the simulated step and the time to train."""
    lr_of = {r["batch"]: r["lr"] for r in crit["rows"]}
    per_rank, steps = crit["per_rank"], crit["steps"]
    print("Ring: time to train = steps × step time (steps: mean of "
          f"{crit['n_seeds']} seeds; lr: the tuned rate)")
    print(" nodes    batch    lr    steps   step, s   time, s")
    for n in crit["nodes"]:
        b, t = n * per_rank, crit["step_times"]["ring"][n]
        print(f"{n:>6}   {b:>6}   {lr_of[b]:>3g}   {steps[b]:>6.1f}   {t:>7.3f}   "
              f"{steps[b] * t:>7.2f}")
    n = crit["best"]["ring"]["nodes"]   # one row worked: the ring's best
    b, t = n * per_rank, crit["step_times"]["ring"][n]
    print(f"Read a row, e.g. {n} nodes: {steps[b]:.1f} steps × {t:.3f} s = {steps[b] * t:.2f} s "
          "to the target.")


def nccl_best_nodes(crit: dict, *, compute_s: float) -> dict:
    """The ring's time to train with NCCL's tuner constant per network step instead of the
    emulated 2 ms (`nccl_step_times`): the constant `alpha_s`, the compute `compute_s`, the
    step per node count `step`, the best node count by the mean `best` and each seed's best
    `seeds`."""
    steps, per_seed, per_rank, nodes = (crit["steps"], crit["per_seed"], crit["per_rank"],
                                        crit["nodes"])
    alpha_dc = facts.get("nccl.tuner_net_ring_step_latency_simple").value * 1e-6
    step = nccl_step_times(nodes, compute_s=compute_s)
    dc = {n: steps[n * per_rank] * step[n] for n in nodes}
    best_dc = min(dc, key=dc.get)
    seed_dc = sorted({nodes[i] for i in np.argmin([per_seed[n * per_rank] * dc[n]
                                                   / steps[n * per_rank] for n in nodes], axis=0)})
    return {"alpha_s": alpha_dc, "compute_s": compute_s, "step": step, "best": best_dc,
            "seeds": seed_dc}


def nccl_sentence(dc: dict, crit: dict) -> str:
    """Each seed's best node count for the ring with NCCL's tuner constant (`nccl_best_nodes`),
    against the emulated ring's best by the mean and the critical batch's range, with the step
    worked at the new best by the mean; where every seed's best is at or past the range, the
    steps have flattened, so the step's small growth and seed noise pick the exact count. The
    model's caveats are in the notebook's real-cluster bullet."""
    n, per_rank = dc["best"], crit["per_rank"]
    us, c_ms = dc["alpha_s"] * 1e6, dc["compute_s"] * 1e3
    where = placed([m * per_rank for m in dc["seeds"]], crit)
    return (f"**At {us:.0f} µs per network step instead of 2 ms, the ring's best moves from "
            f"{crit['best']['ring']['nodes']} nodes to {span(dc['seeds'])} by seed: "
            + ("every seed's best is " if len(dc["seeds"]) > 1 else "")
            + f"{where} the critical batch's range.** "
            f"The step is then {c_ms:.0f} ms + 2(N−1) × {us:.0f} µs: {n} nodes (the best by the "
            f"mean) take {c_ms:.0f} ms + {2 * (n - 1)} × {us:.0f} µs = "
            f"{dc['step'][n] * 1e3:.0f} ms per step, against {crit['step_times']['ring'][n]:.2f} s "
            "at 2 ms."
            + (" Past the critical batch the steps have flattened, so the step's small growth "
               "and seed noise decide the exact count." if where in ("past", "inside or past")
               else ""))


def explain_best_nodes(crit: dict) -> None:
    """Says where the time to train is least and why (`best_nodes_sentence`), prints the ring's
    table, and checks the shape the section teaches: an interior optimum for the ring, the
    tree's further right and lower, steps that fall then flatten, and a learning-rate plateau
    that was found."""
    best, t_of, seed_best = crit["best"], crit["t_of"], crit["seed_best"]
    steps, per_rank, plateau = crit["steps"], crit["per_rank"], crit["plateau"]
    say(best_nodes_sentence(crit))
    ring_table(crit)
    for k in ("ring",):   # an interior optimum for the ring
        assert best[k]["nodes"] not in (1, 1024) and not {1, 1024} & set(seed_best[k]), k
    assert min(seed_best["tree"]) > max(seed_best["ring"])  # further right
    assert t_of["ring"][1024] > 3 * best["ring"]["time_s"]
    assert best["tree"]["time_s"] < best["ring"]["time_s"]
    assert crit["s_big"] < steps[16 * per_rank] < 0.5 * crit["s1"]   # steps fall, then flatten
    # the rate plateau is found
    assert len(plateau) >= 2 and all(r["lr_above"] is None for r in plateau)


def explain_nccl(crit: dict, *, compute_s: float) -> dict:
    """Says where the ring's best lies at NCCL's tuner constant per network step
    (`nccl_sentence`), checks that it moved to more nodes, and returns `nccl_best_nodes`."""
    dc = nccl_best_nodes(crit, compute_s=compute_s)
    say(nccl_sentence(dc, crit))
    assert dc["best"] > crit["best"]["ring"]["nodes"]
    return dc


def accumulation(step_times: dict, with_acc: dict, steps: dict, *, acc: int, per_rank: int,
                 compute_s: float) -> dict:
    """Per node count of the ring with accumulation: the samples-per-second gain `sps_gain`,
    the steps' cut S(B)/S(kB) `cut`, the step's growth (t + (k−1)c)/t `grew`, the exchange's
    share of the step `share`, the `verdict` on the training: 'shorter' when the cut beats
    the growth, 'longer' when it falls short, else 'same'; and, for a worked row, the steps
    `steps`, the step times `t` (without) and `t_acc` (with accumulation), and the times to
    train `time` with accumulation on n nodes, `time_kn` without it on k·n nodes (the same
    global batch) and `ring_time` without it on each node count."""
    sps_gain = {n: acc * step_times["ring"][n] / t for n, t in with_acc.items()}
    cut = {n: steps[n * per_rank] / steps[acc * n * per_rank] for n in with_acc}   # S(B)/S(kB)
    grew = {n: t / step_times["ring"][n] for n, t in with_acc.items()}           # (t+(k-1)c)/t
    share = {n: 1 - compute_s / step_times["ring"][n] for n in with_acc}         # exchange / step
    verdict = {n: "shorter" if cut[n] > grew[n] else "longer" if cut[n] < grew[n] else "same"
               for n in with_acc}
    time = {n: steps[acc * n * per_rank] * t for n, t in with_acc.items()}
    ring_time = {n: steps[n * per_rank] * t for n, t in step_times["ring"].items()
                 if n * per_rank in steps}
    time_kn = {n: ring_time[acc * n] for n in with_acc if acc * n in ring_time}
    return {"acc": acc, "per_rank": per_rank, "compute_s": compute_s, "sps_gain": sps_gain,
            "cut": cut, "grew": grew, "share": share, "verdict": verdict, "steps": steps,
            "t": {n: step_times["ring"][n] for n in with_acc}, "t_acc": dict(with_acc),
            "time": time, "time_kn": time_kn, "ring_time": ring_time}


def seeded(a: dict, per_seed: dict | None) -> list:
    """The node counts of `a` whose batches B and kB both have per-seed steps."""
    return [n for n in sorted(a["cut"]) if per_seed is not None
            and {n * a["per_rank"], a["acc"] * n * a["per_rank"]} <= set(per_seed)]


def seed_wins(a: dict, ns: list, per_seed: dict) -> dict:
    """Per node count in `ns`: for how many seeds (of how many) S(B)/S(kB), the same seed at both
    batches, beat the step's growth."""
    acc, per_rank = a["acc"], a["per_rank"]
    out = {}
    for n in ns:
        cut = per_seed[n * per_rank] / per_seed[acc * n * per_rank]
        out[n] = (int((cut > a["grew"][n]).sum()), len(cut))
    return out


def worked_row(a: dict, n: int | None = None) -> str:
    """The rule applied to one node count: `n`, else the first multi-node one where
    accumulation shortened the mean time to train (else the first multi-node one)."""
    acc, per_rank, c = a["acc"], a["per_rank"], a["compute_s"]
    multi = [m for m in sorted(a["cut"]) if m > 1]
    if not multi:
        return ""
    if n is None:
        n = next((m for m in multi if a["verdict"][m] == "shorter"), multi[0])
    s_b, s_kb = a["steps"][n * per_rank], a["steps"][acc * n * per_rank]
    t, grew, cut = a["t"][n] * 1e3, a["grew"][n], a["cut"][n]
    return (f"The rule on {n} nodes: the step time of {t:.0f} ms grows to {t:.0f} + "
            f"{(acc - 1) * c * 1e3:.0f} = {a['t_acc'][n] * 1e3:.0f} ms (×{grew:.2f}), and the "
            f"{acc}-fold batch cuts the steps to target {s_b:.1f} → {s_kb:.1f} (×{cut:.2f} "
            f"{'>' if cut > grew else '<' if cut < grew else '='} {grew:.2f}), so the training "
            f"is {a['verdict'][n]} (table).")


def model_says(a: dict, ns: list, b_crit: int) -> str:
    """Whether McCandlish's model, S(B)/S(kB) = (1 + B_crit/B)/(1 + B_crit/kB), cuts the steps
    by more than the step grew at the node counts `ns`, for every B_crit from the lowest to the
    highest this run allows (`implied_crit` and the estimate `b_crit`)."""
    acc, per_rank, steps = a["acc"], a["per_rank"], a["steps"]
    rng = implied_crit(steps, b_crit) or (b_crit, b_crit)
    lo, hi = min(rng[0], b_crit), max(rng[1], b_crit)
    wins = {(1 + bc / (n * per_rank)) / (1 + bc / (acc * n * per_rank)) > a["grew"][n]
            for n in ns for bc in (lo, hi)}   # the model's cut grows with B_crit: ends suffice
    where = f"B_crit anywhere in {batch_range(lo, hi)}"
    if wins == {True}:
        return f" With {where}, McCandlish's model predicts a win there."
    if wins == {False}:
        return f" With {where}, McCandlish's model predicts none there."
    return (" Whether McCandlish's model predicts a win there depends on B_crit, which this run "
            f"pins only to about {batch_range(lo, hi)}.")


def every_seed_longer(a: dict, per_seed: dict | None) -> list:
    """The multi-node counts where accumulation raised samples per second yet lengthened the
    training for every seed (0 of them shorter): the rows beyond seed noise."""
    every = seed_wins(a, seeded(a, per_seed), per_seed) if per_seed is not None else {}
    return [n for n, (k, _) in every.items()
            if n > 1 and k == 0 and a["sps_gain"][n] > 1.01 and a["verdict"][n] == "longer"]


def accumulation_sentence(a: dict, *, b_crit: int, per_seed: dict | None = None) -> str:
    """What accumulation did, led by the rows beyond seed noise: where it raised samples per
    second yet lengthened the training for every seed (`every_seed_longer`; without such rows,
    at how many node counts the mean time to train was longer), the rule worked on one such
    node count (`worked_row`), and, visible, the accumulating curve's best against the ring's
    at the same global batch and the ring's best. A <details> fold keeps the means' count, at
    how many node counts the seeds split, and any win at or past the critical batch estimate
    (per seed first, when given, and then whether McCandlish's model predicts it:
    `model_says`)."""
    acc, per_rank = a["acc"], a["per_rank"]
    sps_gain, grew, share, verdict = a["sps_gain"], a["grew"], a["share"], a["verdict"]
    raised = [n for n, g in sps_gain.items() if g > 1.01]
    slower = [n for n in raised if verdict[n] == "longer"]
    won_past = [n for n in raised if verdict[n] == "shorter" and n * per_rank >= b_crit]
    wins = seed_wins(a, won_past, per_seed) if per_seed is not None else {}
    every = seed_wins(a, seeded(a, per_seed), per_seed) if per_seed is not None else {}
    split = [n for n, (k, m) in every.items() if 0 < k < m]
    robust = every_seed_longer(a, per_seed)
    why = (f"the exchange was at least {min(share[n] for n in won_past):.0%} of the step time, "
           f"so the step time grew at most ×{max(grew[n] for n in won_past):.2f}"
           if won_past else "")
    at = f"At and past the critical batch estimate (batch {b_crit}, {b_crit // per_rank} nodes)"
    if wins and not all(k == m for k, m in wins.values()):
        past = (f" {at} it paid at {' and '.join(map(str, won_past))} nodes by the means but "
                "for only " + " and ".join(f"{k} of {m}" for k, m in wins.values())
                + f" seeds: not shown on this run ({why})." + model_says(a, won_past, b_crit))
    elif won_past:
        past = (f" {at} it still paid at {' and '.join(map(str, won_past))} nodes"
                + (" for every seed" if wins else " (by the means)") + f": {why}.")
    else:
        past = ""
    t_kn, time = a["time_kn"], a["time"]
    n_acc = min(time, key=time.get)   # the accumulating curve's best node count
    n_ring = min(a["ring_time"], key=a["ring_time"].get)
    green = ""
    if n_acc in t_kn and time[n_acc] < t_kn[n_acc]:
        green = (f"The accumulating ring's best, {n_acc} nodes ({time[n_acc]:.2f} s), reaches "
                 f"batch {acc * n_acc * per_rank} faster than {acc * n_acc} nodes without it "
                 f"({t_kn[n_acc]:.2f} s), "
                 + ("but not faster than" if a["ring_time"][n_ring] < time[n_acc] else "and beats")
                 + f" the ring's best ({a['ring_time'][n_ring]:.2f} s on {n_ring} nodes).")
    lo, hi = min(sps_gain[n] for n in raised), max(sps_gain[n] for n in raised)
    gains = f"raised samples per second on every multi-node ring (×{lo:.2f} to ×{hi:.2f})"
    n_seeds = len(next(iter(per_seed.values()))) if per_seed else 0
    if robust:
        head = (f"**Accumulating {acc} micro-batches {gains}, yet at "
                f"{' and '.join(map(str, robust))} nodes it lengthened the training for all "
                f"{n_seeds} seeds**: more samples per second is not a shorter training. ")
        means = (f" By the means the training was longer at {len(slower)} of the {len(raised)} "
                 "multi-node counts." if slower else "")
    else:
        head = (f"**Accumulating {acc} micro-batches {gains}, yet the mean time to train was "
                f"longer at {len(slower)} of those {len(raised)} node counts**"
                + (": more samples per second is not a shorter training. " if slower else ". "))
        means = ""
    splits = (f" The seeds split at {len(split)} of the {len(every)} node counts (table: seeds "
              "shorter): there the mean's verdict is within seed noise." if split else "")
    fold = means + splits + past
    return (head + worked_row(a, robust[0] if robust else None)
            + (f"\n\n{green}" if green else "")
            + ("\n\n<details><summary>How sure is this? Seed noise, and at or past the critical "
               f"batch</summary>\n\n{fold.strip()}\n\n</details>" if fold else ""))


def explain_accumulation(a: dict, *, b_crit: int, per_seed: dict | None = None) -> None:
    """Says what accumulation did (`accumulation_sentence`), prints the table of steps' cut,
    step growth, exchange share, (given `per_seed`) for how many seeds the training got shorter,
    and the verdict by the means per node count, and checks that it raised samples per second
    exactly where it skipped an exchange (not on one rank)."""
    acc, per_rank = a["acc"], a["per_rank"]
    cut, grew, share, verdict = a["cut"], a["grew"], a["share"], a["verdict"]
    raised = [n for n, g in a["sps_gain"].items() if g > 1.01]
    wins = seed_wins(a, seeded(a, per_seed), per_seed)
    say(accumulation_sentence(a, b_crit=b_crit, per_seed=per_seed))
    print(f"nodes   batch B → {acc}B    steps-to-target fell ×   step time grew ×   exchange share"
          + ("   seeds shorter" if wins else "") + "   training (means)")
    for n in sorted(cut):
        print(f"{n:>5}   {n * per_rank:>6} → {acc * n * per_rank:<6}   {cut[n]:>21.2f}   "
              f"{grew[n]:>16.2f}   {share[n]:>14.0%}"
              + (f"   {f'{wins[n][0]} of {wins[n][1]}' if n in wins else '':>13}"
                 if wins else "")
              + f"   {verdict[n]}")
    if 1 in cut:
        print("1 node: no exchange to skip, shown for reference.")
    assert 1 in cut and 1 not in raised          # one rank: nothing to save
    # every exchange it skips raises samples/s
    assert sorted(raised) == sorted(n for n in cut if n > 1)


def recap(crit: dict, dc: dict, a: dict, *, per_seed: dict | None = None) -> None:
    """'What this run showed', one line per idea: where the emulated ring's best lay against
    the critical batch (and why, when below it), where the tree's and the NCCL-constant ring's
    did, and where accumulation lengthened the training for every seed, with the exchange's
    share of the step there."""
    per_rank, seed_best = crit["per_rank"], crit["seed_best"]
    nb_ = crit["best"]["ring"]["nodes"]
    ring_at = placed([n * per_rank for n in seed_best["ring"]], crit)
    tree_at = placed([n * per_rank for n in seed_best["tree"]], crit)
    nccl_at = placed([n * per_rank for n in dc["seeds"]], crit)
    grew = crit["step_times"]["ring"][2 * nb_] / crit["step_times"]["ring"][nb_]
    fell = crit["steps"][nb_ * per_rank] / crit["steps"][2 * nb_ * per_rank]
    lines = [f"The emulated ring's best ({nb_} nodes) lay {ring_at} the critical batch"
             + (": its step time grew faster than the steps to target fell."
                if ring_at == "below" and grew > fell else ".")]
    tree = f"the tree's best ({span(seed_best['tree'])} nodes by seed)"
    nccl = f"the ring's at NCCL's tuner constant ({span(dc['seeds'])})"
    lines.append(f"{tree[0].upper()}{tree[1:]} and {nccl} lay {tree_at} it."
                 if tree_at == nccl_at else
                 f"{tree[0].upper()}{tree[1:]} lay {tree_at} it, {nccl} {nccl_at} it.")
    robust = every_seed_longer(a, per_seed)
    if robust:
        shares = " and ".join(f"{a['share'][n]:.0%}" for n in robust)
        lines.append(f"Accumulation raised samples per second, yet lengthened the training for "
                     f"every seed at {' and '.join(map(str, robust))} nodes, where the exchange "
                     f"was only {shares} of the step.")
    else:
        slower = [n for n, v in a["verdict"].items() if n > 1 and v == "longer"]
        lines.append(f"Accumulation raised samples per second; by the means it lengthened the "
                     f"training at {len(slower)} node counts.")
    say("**What this run showed.**\n\n" + "\n".join(f"- {line}" for line in lines))


def appendix(crit: dict) -> None:
    """Prints the critical batch's range in one plain sentence first, then the steps to the
    target at each global batch with the tuned rate, where the rate plateaus, how much of the
    shared sample pool the seeds read at the largest batch (and any
    batch where a seed drew a sample twice), and each curve's best node count by the mean and
    by seed."""
    rows, plateau = crit["rows"], crit["plateau"]
    best, t_of, seed_best = crit["best"], crit["t_of"], crit["seed_best"]
    lo, hi = crit["crit_range"]
    print(f"The toy's critical batch is fuzzy: anywhere from {batch_range(lo, hi)} "
          f"(estimate {crit['b_crit']}); why, below the table.\n")
    print(f"Steps to the target, mean of {crit['n_seeds']} seeds, and the tuned rate:")
    print("    batch   steps   lr")
    for r in rows:
        print(f"   {r['batch']:>6}   {r['steps']:>5.1f}   {r['lr']:g}")
    print(f"   from batch {crit['top_from']} on the best rate stays {crit['lr_top']:g}: at all "
          f"{len(plateau)} of those batches, at rate {2 * crit['lr_top']:g} some seed had not "
          "reached the target after the best's mean steps (rounded down) + 1: rate "
          f"{2 * crit['lr_top']:g} was tried and did not beat rate {crit['lr_top']:g}")
    if crit.get("pool"):   # every seed reads the same pool from its own offset
        big = rows[-1]
        used = [s * big["batch"] / crit["pool"] for s in big["per_seed"]]
        reused = [r["batch"] for r in rows if r.get("reused")]
        print(f"   at batch {big['batch']} the seeds each read {min(used):.0%} to {max(used):.0%} "
              f"of the one pool of {crit['pool']} samples: they are far from independent there; "
              + (f"some seed drew a sample twice at batch {', '.join(map(str, reused))}"
                 if reused else
                 "no seed drew a sample twice"))
    print("The critical batch estimate, and why it is approximate:")
    for b in estimate_points(crit):
        print(f"   - {b}")
    for k in STYLES:
        print(f"   {k}: best N {best[k]['nodes']} by the mean ({best[k]['time_s']:.2f} s), each "
              f"seed's best N {span(seed_best[k])}, {t_of[k][1024]:.2f} s on 1024 nodes"
              + (f"; some seed's best is {max(crit['nodes'])}, the edge of the range "
                 "simulated: its optimum may lie beyond" if max(seed_best[k]) == max(crit["nodes"])
                 else ""))
