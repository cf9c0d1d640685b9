"""Oversubscription explorer: how a leaf-spine's uplinks decide a data-parallel job's scaling.

Pick an oversubscription ratio (1 = non-blocking: a leaf's uplinks carry all its nodes can
send; 4 = "4:1") and an all-reduce algorithm; the figure shows the scaling efficiency,
throughput(N) / (N x throughput(1)), of the same training step at N = 8 .. 64 nodes, from the
simulator (`sim.scaling_curve`, which replays every message of every round through the
fabric's ports, `clusterlab.fabric`), against the same job with NIC shaping only (the
package's "crossbar" fabric: no switch port, so nothing meets anywhere) and on the
non-blocking fabric. A ring sends one flow per leaf across the spine in each round, so its
curve barely moves; a binomial tree sends every node of a leaf across at once, and its curve
collapses as soon as the fabric spans more than one leaf.

Each (algorithm, oversubscription) curve is simulated once and cached, so moving the slider
back is instant.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets
import numpy as np

from ..fabric import LeafSpine
from ..sim import scaling_curve
from ._common import Explorer, sync_legend

OVERSUBSCRIPTIONS = (1, 2, 4, 8)
ALGORITHMS = ("ring", "tree")
NODES = (8, 16, 32, 64)
NODES_PER_LEAF = 8
SPINES = 2
# The training step every curve simulates: 25 MiB of gradients in one bucket, 50 ms of
# compute, a 100 Gbit/s NIC with 20 us of latency (a datacentre link), 3 steps.
SETUP = {"nic": "delay 20us rate 100gbit", "model_bytes": 25 * 2**20,
         "bucket_bytes": 25 * 2**20, "compute_s": 0.05, "steps": 3}
# Ports deep enough that no round overflows them (8 flows x 400 segments of 64 KiB on one
# uplink): the figure isolates the uplinks' share; the incast section shows what drops cost.
PORT = "rate 100gbit limit 4096"


def efficiency_curve(algorithm: str, oversubscription: float | None, *,
                     nodes=NODES) -> np.ndarray:
    """Scaling efficiency at each node count; oversubscription None: the crossbar."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    fabric = None if oversubscription is None else LeafSpine(
        nodes_per_leaf=NODES_PER_LEAF, spines=SPINES, oversubscription=oversubscription,
        port=PORT)
    rows = scaling_curve(list(nodes), fabric=fabric, algorithm=algorithm, **SETUP)
    return np.array([r["efficiency"] for r in rows])


class OversubscriptionExplorer(Explorer):
    """Scaling efficiency against node count on an oversubscribed leaf-spine."""

    figsize = (8.0, 4.2)

    def __init__(self, oversubscription: float = 4, algorithm: str = "tree", *,
                 debounce_s: float = 0.15) -> None:
        super().__init__(debounce_s)
        if oversubscription not in OVERSUBSCRIPTIONS:
            raise ValueError(f"oversubscription must be one of {OVERSUBSCRIPTIONS}, got "
                             f"{oversubscription!r}")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        self._cache: dict[tuple, np.ndarray] = {}
        self.curves: dict[str, np.ndarray] = {}
        self.o_slider = widgets.SelectionSlider(options=list(OVERSUBSCRIPTIONS),
                                                value=oversubscription,
                                                description="oversub. o")
        self.algo_buttons = widgets.ToggleButtons(options=list(ALGORITHMS), value=algorithm,
                                                  description="all-reduce")
        for w in (self.o_slider, self.algo_buttons):
            w.observe(lambda _c: self.debouncer.trigger(), names="value")
        self.caption = widgets.HTML()
        self.widget = widgets.VBox([widgets.HBox([self.o_slider, self.algo_buttons]),
                                    self.out, self.caption, self.error_box])
        self._build_axes()

    @property
    def oversubscription(self) -> float:
        return self.o_slider.value

    @property
    def algorithm(self) -> str:
        return self.algo_buttons.value

    def curve(self, algorithm: str, o: float | None) -> np.ndarray:
        """The efficiency curve at fabric.NODES for this algorithm and oversubscription
        (None: the crossbar), simulated once and then cached."""
        key = (algorithm, o)
        if key not in self._cache:
            self._cache[key] = efficiency_curve(algorithm, o)
        return self._cache[key]

    def _compute(self) -> None:
        a, o = self.algorithm, self.oversubscription
        self.curves = {"crossbar": self.curve(a, None), "non-blocking": self.curve(a, 1),
                       "chosen": self.curve(a, o)}
        self.caption.value = self.sentence()

    def sentence(self) -> str:
        """What the figure shows at the largest node count, computed from the curves."""
        n, c = NODES[-1], self.curves
        return (f"At {n} nodes ({n // NODES_PER_LEAF} leaves of {NODES_PER_LEAF}), the "
                f"{self.algorithm} keeps {c['chosen'][-1]:.0%} scaling efficiency at "
                f"{self.oversubscription:g}:1 oversubscription, {c['non-blocking'][-1]:.0%} "
                f"on a non-blocking fabric and {c['crossbar'][-1]:.0%} with NIC shaping only "
                f"(no switch ports).")

    def _make_axes(self, fig) -> dict[str, Any]:
        ax = fig.add_subplot(1, 1, 1)
        lines = {
            "crossbar": ax.plot(NODES, np.ones(len(NODES)), "--", color="0.55",
                                label="NIC shaping only, no switch")[0],
            "non-blocking": ax.plot(NODES, np.ones(len(NODES)), "o-", color="C0", alpha=0.5,
                                    label="leaf-spine, non-blocking (1:1)")[0],
            "chosen": ax.plot(NODES, np.ones(len(NODES)), "o-", color="C3", lw=2,
                              label="leaf-spine, oversubscribed")[0],
        }
        ax.set_xscale("log", base=2)
        ax.set_xticks(NODES, [str(n) for n in NODES])
        ax.axvline(NODES_PER_LEAF, color="0.8", lw=1)
        ax.text(NODES_PER_LEAF * 1.03, 1.0, "one leaf", fontsize=8, color="0.45", va="top")
        ax.set(xlabel="nodes", ylabel="scaling efficiency", ylim=(0, 1.05))
        ax.grid(alpha=0.3)
        return {"ax": ax, "lines": lines}

    def _draw(self, fig, scene: dict[str, Any]) -> None:
        for name, line in scene["lines"].items():
            line.set_ydata(self.curves[name])
        scene["lines"]["chosen"].set_label(
            f"leaf-spine, {self.oversubscription:g}:1 oversubscribed")
        sync_legend(scene["ax"], list(scene["lines"].values()), fontsize=8, loc="lower left")
        scene["ax"].set_title(f"{self.algorithm} all-reduce of 25 MiB per step, simulated "
                              f"({NODES_PER_LEAF} nodes per leaf, {SPINES} spines)",
                              fontsize=10)


def oversubscription_explorer(oversubscription: float = 4, algorithm: str = "tree",
                              **kwargs: Any) -> OversubscriptionExplorer:
    """An OversubscriptionExplorer starting at this ratio and algorithm."""
    return OversubscriptionExplorer(oversubscription, algorithm, **kwargs)
