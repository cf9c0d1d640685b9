"""Fabric bench: real ranks behind switches against the closed forms of a switched fabric.

Five families of rows, each measured on real ranks through the "netem" backend with a
`clusterlab.fabric` description, each against `clusterlab.fabric_models`:

1. incast: N senders into one port of a leaf (N = 1..7): the incast's time (goodput) and the
   last message's queueing delay against `fabric_models.incast`; then with a six-packet
   buffer, where the drops cost TCP a retransmission timeout: the collapse of goodput;
2. a parameter server and a ring on one leaf of 8 nodes (the server's port takes an incast)
   against the bottleneck-share form (`fabric_models.bottleneck_time`);
3. the ring and the binomial tree on 8 nodes in two leaves at oversubscription 1, 2 and 4,
   against the bottleneck-share form, and the backend's own replay (`sim.simulate_collective`)
   against the same measurement (emulated p2p and replay agree, or say by how much);
4. ECMP: the fabric's hash over many seeds against balls-in-bins (collision probability,
   the busiest uplink's load, as flows per uplink grow), and rounds of 4 flows over 4 spines,
   one pairing after another, each against its busiest uplink's share;
5. rails: the rail-style hierarchical all-reduce on a rail-optimised fabric with an
   oversubscribed spine, aligned with the rails and naively laid out.

Times are the fastest of a case's repetitions (the emulated network never delivers early);
every figure is a ratio to its closed form measured in the same run. The rows of the course's
isend/irecv collectives (3 and 5) run dilated by DILATION: each of their steps also pays this
machine's cost of a message exchange, which dilation divides.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import fabric_models as fm
from ..experiments import fabric as ex
from ..sim import simulate_collective
from . import bench, check, result, tick

TIME_TOLERANCE = 0.10  # measured / closed form, where the closed form models every queue
SHARE_TOLERANCE = 0.15  # measured / bottleneck-share form (fair shares of whole rounds)
SIGMAS = 3.0  # hash statistics against balls-in-bins: within 3 standard errors
DILATION = 4  # the isend/irecv collectives' rows: divides this machine's cost per step


def _ratio(measured: float, model: float) -> float:
    return measured / model if model > 0 else math.inf


def _within(ratio: float, tolerance: float) -> bool:
    return abs(ratio - 1) <= tolerance


def _plain(row: dict) -> dict:
    """A row as JSON: closed-form records as dicts, tuple keys as 'src->dst'."""
    out = {}
    for key, value in row.items():
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        elif isinstance(value, dict):
            value = {(f"{k[0]}->{k[1]}" if isinstance(k, tuple) else k): v
                     for k, v in value.items()}
        elif key == "messages":
            value = [list(pair) for pair in value]
        out[key] = value
    return out


def _incast(quick: bool, rows: list, checks: list) -> None:
    counts = (1, 2, 4) if quick else (1, 2, 4, 7)
    for r in ex.incast(counts, repeats=2):
        m = r["model"]
        ratio = _ratio(r["best"], m.time_s)
        tick()
        rows.append(_plain({"family": "incast", **r}))
        checks.append(check(f"incast {r['senders']} x 1 MiB into one port: time / closed "
                            "form", f"within {TIME_TOLERANCE:.0%}", round(ratio, 3),
                            _within(ratio, TIME_TOLERANCE)))
        if r["senders"] > 1:
            q = _ratio(r["queue"], m.max_queue_s)
            checks.append(check(f"incast {r['senders']} senders: last message's queueing "
                                "delay / (N-1) k w", f"within {TIME_TOLERANCE:.0%}",
                                round(q, 3), _within(q, TIME_TOLERANCE)))
    # A six-packet buffer: the messages served late lose their tails and wait for the RTO.
    # Four segments per message, so that a sender this machine wakes a few ms late still
    # meets the queue (one-segment messages sometimes missed it, and the fastest repetition
    # was then one without drops).
    drops = ex.incast((1, 2, 4) if quick else (1, 2, 4, 8), nbytes=256 * ex.KiB, limit=6,
                      repeats=2)
    for r in drops:
        m = r["model"]
        tick()
        rows.append(_plain({"family": "incast-drops", **r}))
        label = f"incast {r['senders']} x 256 KiB, buffer 6 packets"
        if m.timeouts:  # the RTO dominates: a figure this machine's noise cannot fake
            ratio = _ratio(r["best"], m.time_s)
            checks.append(check(f"{label} ({m.drops} drops, {m.timeouts} timeouts): time / "
                                "closed form", f"within {TIME_TOLERANCE:.0%}", round(ratio, 3),
                                _within(ratio, TIME_TOLERANCE)))
        else:
            checks.append(check(f"{label} (no timeout): time (ms)", "< 200 ms (no RTO)",
                                round(r["best"] * 1e3, 1), r["best"] < fm.RTO_MIN_S))
    few = next(r for r in drops if r["senders"] == 2)
    worst = max(drops, key=lambda r: r["model"].timeouts)
    collapse = few["goodput"] / worst["goodput"]
    predicted = few["model"].goodput / worst["model"].goodput
    checks.append(check(f"incast goodput collapse: 2 senders / {worst['senders']} senders "
                        f"(closed form {predicted:.1f}x)", "report", round(collapse, 1), True))


def _ps_vs_ring(quick: bool, rows: list, checks: list) -> None:
    out = ex.ps_vs_ring(nodes=8, repeats=1 if quick else 2)
    for r in out:
        tick()
        rows.append(_plain({"family": "ps-vs-ring", **r}))
        ratio = _ratio(r["best"], r["model"])
        checks.append(check(f"{ex.LABELS[r['algorithm']]}, 8 nodes on one leaf, 1 MiB: "
                            "time / bottleneck share", f"within {SHARE_TOLERANCE:.0%}",
                            round(ratio, 3), _within(ratio, SHARE_TOLERANCE)))
    ps, ring = out
    checks.append(check("parameter server / ring on one leaf (measured)",
                        f"report (closed form {ps['model'] / ring['model']:.2f})",
                        round(ps["best"] / ring["best"], 2), True))


def _oversubscribed(quick: bool, rows: list, checks: list) -> None:
    ratios = (1, 4) if quick else (1, 2, 4)
    out = ex.oversubscribed(ratios, ("ring", "tree"), repeats=1 if quick else 2,
                            dilation=DILATION)
    for r in out:
        replay = float(simulate_collective(
            "allreduce", r["nbytes"], nodes=r["nodes"], nic=ex.NIC,
            fabric=ex.leaf_spine(r["oversubscription"]), algorithm=r["algorithm"]).max())
        r["replay"] = replay
        tick()
        rows.append(_plain({"family": "oversubscribed", **r}))
        label = f"{ex.LABELS[r['algorithm']]}, 8 nodes, 2 leaves, o = {r['oversubscription']:g}"
        ratio = _ratio(r["best"], r["model"])
        checks.append(check(f"{label}: time / bottleneck share",
                            f"within {SHARE_TOLERANCE:.0%}", round(ratio, 3),
                            _within(ratio, SHARE_TOLERANCE)))
        rep = _ratio(r["best"], replay)
        checks.append(check(f"{label}: time / the backend's replay",
                            f"within {TIME_TOLERANCE:.0%}", round(rep, 3),
                            _within(rep, TIME_TOLERANCE)))
    for algorithm in ("ring", "tree"):
        mine = [r for r in out if r["algorithm"] == algorithm]
        slow = mine[-1]["best"] / mine[0]["best"]
        model = mine[-1]["model"] / mine[0]["model"]
        checks.append(check(f"{ex.LABELS[algorithm]}: o = {mine[-1]['oversubscription']:g} / "
                            f"o = 1 (closed form {model:.2f})", "report", round(slow, 2), True))


def _ecmp(quick: bool, rows: list, checks: list) -> None:
    seeds = 500 if quick else 2000
    for r in ex.ecmp_hashing(seeds=seeds):
        tick()
        rows.append({"family": "ecmp-hash", **r})
        p = r["collision_model"]
        se = math.sqrt(max(p * (1 - p), 1e-12) / seeds)
        checks.append(check(f"ECMP hash, {r['flows']} flows on {r['spines']} spines, {seeds} "
                            f"seeds: P(collision) (balls in bins {p:.3f})",
                            f"within {SIGMAS:g} s.e. ({SIGMAS * se:.3f})",
                            round(r["collisions"], 4), abs(r["collisions"] - p) <= SIGMAS * se
                            + 1e-9))
        law = np.asarray(r["max_load_law"])
        m = np.arange(len(law))
        sd = math.sqrt(max(float(np.dot((m - r["max_load_model"]) ** 2, law)), 0.0) / seeds)
        checks.append(check(f"ECMP hash, {r['flows']} flows on {r['spines']} spines: busiest "
                            f"uplink's mean load (balls in bins {r['max_load_model']:.3f})",
                            f"within {SIGMAS:g} s.e. ({SIGMAS * sd:.3f})",
                            round(r["max_load"], 4),
                            abs(r["max_load"] - r["max_load_model"]) <= SIGMAS * sd + 1e-9))
    rounds = ex.ecmp_rounds(pairings=4 if quick else 8)
    for r in rounds:
        tick()
        rows.append(_plain({"family": "ecmp-round", **r}))
    ratios = [_ratio(r["best"], r["model"]) for r in rounds]
    worst = max(ratios, key=lambda x: abs(x - 1))
    checks.append(check(f"ECMP rounds, 4 flows on 4 spines, {len(rounds)} pairings: worst "
                        "time / busiest uplink's share", f"within {TIME_TOLERANCE:.0%}",
                        round(worst, 3), _within(worst, TIME_TOLERANCE)))
    collided = float(np.mean([r["peak"] >= 2 for r in rounds]))
    checks.append(check(f"ECMP rounds: share of pairings with a collision ({len(rounds)} "
                        "pairings)", f"report (balls in bins {fm.collision_probability(4, 4):.3f})",
                        round(collided, 3), True))


def _rails(quick: bool, rows: list, checks: list) -> None:
    out = ex.rails(repeats=1 if quick else 2, dilation=DILATION)
    for r in out:
        tick()
        rows.append(_plain({"family": "rails", **r}))
        ratio = _ratio(r["best"], r["model"])
        checks.append(check(f"hierarchical (rails), 2 nodes x 2, spine o = "
                            f"{r['oversubscription']:g}, {r['layout']} layout: time / "
                            "bottleneck share", f"within {SHARE_TOLERANCE:.0%}", round(ratio, 3),
                            _within(ratio, SHARE_TOLERANCE)))
    aligned, naive = out
    gain = naive["best"] / aligned["best"]
    model = naive["model"] / aligned["model"]
    checks.append(check(f"rails: naive layout / aligned (closed form {model:.2f})",
                        ">= 2", round(gain, 2), gain >= 2))


@bench("fabric")
def fabric(quick: bool = False) -> dict:
    rows: list[dict] = []
    checks: list[dict] = []
    for family in (_incast, _ps_vs_ring, _oversubscribed, _ecmp, _rails):
        family(quick, rows, checks)
    return result("fabric", rows, checks)
