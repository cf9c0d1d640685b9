"""Which parallelism where: step time of DP, FSDP, TP and PP, each alone, against the rank count.

`clusterlab.parallelism.step_seconds` for one dense model on a network you set (latency,
bandwidth), from 2 to 1024 ranks: closed forms for DP, FSDP and TP, the GPipe replay for PP;
tensor parallelism stops at one attention head per rank, the pipeline at one layer per
stage. Tensor parallelism is drawn twice: on the network you set, and inside one node on the
ledger's NVLink bandwidth (H100, per direction; up to the ledger's GPUs per node), where real
layouts put it. The points measured on this machine are drawn on top when given. In a terminal or
under nbval, `show()` returns the static figure for the current settings.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullFormatter, StrMethodFormatter

from .. import facts
from ..parallelism import PARALLELISMS, ModelShape, step_table
from ._common import Explorer

RANKS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LATENCY_US = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
BANDWIDTH_GBIT = (0.1, 0.4, 1, 10, 25, 100, 400)
PARAMS_M = (1, 10, 100, 1000, 7000)
COMPUTE_MS = (10, 50, 100, 500, 1000, 5000)
COLORS = {"dp": "#4C72B0", "fsdp": "#55A868", "tp": "#C44E52", "pp": "#8172B2"}
NAMES = {"dp": "data parallel (DDP)", "fsdp": "FSDP / ZeRO-3", "tp": "tensor parallel",
         "pp": "pipeline (GPipe)"}
# The legend says which curves are upper bounds (no overlap) and which is a replay, so that
# the ranking is read knowing it sets bounds against an estimate.
LABELS = {"dp": "data parallel (DDP), upper bound: nothing overlapped",
          "fsdp": "FSDP / ZeRO-3, upper bound: nothing overlapped",
          "tp": "tensor parallel, upper bound: nothing overlapped",
          "pp": "pipeline (GPipe, replayed)"}


def _node_link() -> tuple[float, int]:
    """NVLink's bandwidth per direction (GB/s) and GPUs per node, from the ledger."""
    return (float(facts.get("nvidia.h100_nvlink_bw_per_direction").value),
            int(facts.get("nvidia.hgx_h100_gpus").value))


class ParallelismExplorer(Explorer):
    """Sliders for the network and the model; one line per parallelism.

    `measured`: optional {parallelism: [(ranks, step seconds), ...]} drawn as points."""

    figsize = (9.5, 5.0)

    def __init__(self, *, latency_us: float = 10, bandwidth_gbit: float = 100,
                 params_m: float = 1000, compute_ms: float = 1000, layers: int = 32,
                 activation_mib: float = 16, microbatches: int = 8, heads: int = 16,
                 measured: dict | None = None, debounce_s: float = 0.15) -> None:
        super().__init__(debounce_s)
        self.measured = measured or {}
        self.layers, self.activation_mib, self.microbatches = layers, activation_mib, microbatches
        self.heads = heads
        self.node_gbyte, self.node_ranks = _node_link()
        self.table: dict[str, list[float]] = {}
        style, layout = {"description_width": "140px"}, widgets.Layout(width="380px")

        def slider(description, values, value):
            options = sorted({*values, value})
            return widgets.SelectionSlider(options=options, value=value, style=style,
                                           description=description, layout=layout)

        self.controls = {
            "latency_us": slider("latency (µs)", LATENCY_US, latency_us),
            "bandwidth_gbit": slider("bandwidth (Gbit/s)", BANDWIDTH_GBIT, bandwidth_gbit),
            "params_m": slider("parameters (M)", PARAMS_M, params_m),
            "compute_ms": slider("compute, 1 rank (ms)", COMPUTE_MS, compute_ms),
        }
        for c in self.controls.values():
            c.observe(lambda _: self.debouncer.trigger(), names="value")
        self.widget = widgets.VBox([*self.controls.values(), self.error_box, self.out])
        self._build_axes()

    def shape(self) -> ModelShape:
        v = {k: c.value for k, c in self.controls.items()}
        return ModelShape(params=int(v["params_m"] * 1e6), layers=self.layers,
                          activation_bytes=int(self.activation_mib * 2**20),
                          compute_s=v["compute_ms"] / 1e3, microbatches=self.microbatches,
                          heads=self.heads)

    def _compute(self) -> None:
        v = {k: c.value for k, c in self.controls.items()}
        self.table = step_table(self.shape(), ranks=RANKS, alpha=v["latency_us"] * 1e-6,
                                beta=8 / (v["bandwidth_gbit"] * 1e9),
                                node_beta=1 / (self.node_gbyte * 1e9),
                                node_ranks=self.node_ranks)

    def _make_axes(self, fig: Figure) -> dict[str, Any]:
        ax = fig.add_subplot(1, 1, 1)
        lines = {k: ax.plot([], [], "-", color=COLORS[k], lw=2, label=LABELS[k])[0]
                 for k in PARALLELISMS}
        node_line = ax.plot([], [], "--", color=COLORS["tp"], lw=2,
                            label=f"tensor parallel inside a node: NVLink {self.node_gbyte:g} "
                            f"GB/s per direction (H100), same latency, up to "
                            f"{self.node_ranks} GPUs")[0]
        for kind, points in self.measured.items():
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, "o", color=COLORS[kind], mec="black", ms=8,
                        label=f"{NAMES[kind]}, measured here")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlim(RANKS[0] / 1.2, RANKS[-1] * 1.2)
        ax.set_ylim(1e-3, 1e3)  # until _draw sets them: a log axis cannot start at 0
        # Ticks at 1, 2 and 5 of each decade, labelled as plain numbers: readable over any
        # range the sliders give (a log axis otherwise labels decades only).
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(RANKS, [str(n) for n in RANKS])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("ranks")
        ax.set_ylabel("step time (s)")
        ax.text(0.99, 0.02, f"TP: at most one of {self.heads} heads per rank; pipeline: at most "
                f"one of {self.layers} layers per stage; DP and FSDP not overlapped",
                transform=ax.transAxes, ha="right", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        title = ax.set_title("", fontsize=10)
        fig.subplots_adjust(left=0.1, right=0.98, bottom=0.12, top=0.92)
        return {"ax": ax, "lines": lines, "node_line": node_line, "title": title}

    def _draw(self, fig: Figure, axes: dict[str, Any]) -> None:
        ax = axes["ax"]
        values = [t for ts in self.table.values() for t in ts if t == t]  # no NaN
        for kind, line in axes["lines"].items():
            line.set_data(RANKS, self.table[kind])
        axes["node_line"].set_data(RANKS, self.table["tp_node"])
        for points in self.measured.values():
            values += [y for _, y in points]
        ax.set_xlim(RANKS[0] / 1.2, RANKS[-1] * 1.2)
        ax.set_ylim(min(values) / 1.5, max(values) * 4)  # room for the legend above
        v = {k: c.value for k, c in self.controls.items()}
        # Each strategy alone on one model: the curves show how each bends with N and with
        # the network, not which layout to pick (real layouts combine them).
        axes["title"].set_text(
            f"Each strategy alone, not a layout: {v['params_m']:g}M parameters, "
            f"{v['latency_us']:g} µs, {v['bandwidth_gbit']:g} Gbit/s "
            f"(DP, FSDP, TP: upper bounds, nothing overlapped)")


def parallelism_explorer(**defaults: Any) -> ParallelismExplorer:
    """A ParallelismExplorer; `show()` it."""
    return ParallelismExplorer(**defaults)
