"""Throughput-collapse explorer: how many samples per second do N nodes train, and why not N x?

Three predictions of one data-parallel training step, from cheapest to most real:

1. the closed-form curve over N = 1, 2, 4, ..., 1024 nodes (`clusterlab.step_model`): the
   α-β costs of `clusterlab.models` for each gradient bucket's all-reduce, plus
   order-statistics terms for jitter and loss, fed through the same compute/communication
   overlap recurrence as the simulator. Microseconds per point, plus a few milliseconds
   once per NIC and message size for a jittery ring's time per round.
2. the simulator at the chosen N only (`sim.simulate_training`, a few steps, within the
   time budget of `background_sim`): every message of every round replayed with netem's
   semantics. Its step-time histogram (p50 and the slowest step; a p99 only from
   MIN_P99_STEPS = 100 steps) and its point on the curve show what the closed form leaves out.
3. "run for real" (`real_run`): the largest cluster of this machine (at most 8 processes)
   trains a synthetic model with the same network, DDP-style, and its measured points
   (p10-p90 error bars) land on the same axes.

This module holds only the widget: its controls, its figure and its callbacks.
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ipywidgets as widgets
import numpy as np
from matplotlib.ticker import FixedLocator, LogLocator, MaxNLocator, NullFormatter, NullLocator

from .. import models
from ..sim import SimResult
from ..step_model import (
    NODE_COUNTS,
    STEP_MODEL_ALGORITHMS,
    StepPrediction,
    TrainingSetup,
    predict_step,
    predicted_curve,
)
from ._common import BackgroundRun, Explorer, cancel_run, reporting, sync_legend
from .background_sim import BackgroundSimulator, SimBudget, run_simulation
from .real_run import REAL_MAX_PROCS, MeasuredRun, RealPlan, measure_real_run

# Slider stops: roughly logarithmic, with 0 where "none" makes sense.
LATENCY_US = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
JITTER_US = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
BANDWIDTH_GBIT = (0, 0.1, 1, 10, 25, 40, 100, 200, 400)  # 0 = no rate limit
LOSS_PCT = (0, 0.001, 0.01, 0.1, 0.5, 1, 2)
MODEL_MIB = (1, 10, 25, 50, 100, 250, 500, 1000, 4000)
COMPUTE_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
BUCKET_MIB = (1, 5, 10, 25, 50, 100)
PROCS_PER_NODE = (1, 2, 4, 8)
# A p99 needs samples beyond the 99th percentile: from fewer steps than this it is just the
# slowest one (or an interpolation towards it), so the explorer then names it as such.
MIN_P99_STEPS = 100


def tail_of(step_times) -> tuple[str, float]:
    """The tail statistic a sample of step times supports: (name, seconds) -- the p99 from
    MIN_P99_STEPS steps on, else the slowest step, named with the sample count."""
    times = np.asarray(step_times, dtype=float)
    if len(times) >= MIN_P99_STEPS:
        return "p99", float(np.percentile(times, 99))
    return f"slowest of {len(times)}", float(times.max())


# --- The explorer ----------------------------------------------------------------------------


def _options(values: tuple, value: float, fmt: Callable[[Any], str] = str) -> list[tuple]:
    """SelectionSlider options (label, value), with `value` added if it is not a stop."""
    stops = sorted(set(values) | {value})
    return [(fmt(v), v) for v in stops]


class ThroughputExplorer(Explorer):
    """Throughput and scaling efficiency against node count, for a network you configure.

    Controls change the setup; `update()` recomputes (debounced when driven by the sliders);
    `on_run_clicked` / `on_cancel` start and stop the real cluster. In a terminal or under
    nbval, `show()` returns the static figure for the current settings.
    """

    figsize = (10.5, 7.0)

    def __init__(self, *, seed: int = 0, debounce_s: float = 0.15, real_steps: int = 10,
                 max_real_procs: int = REAL_MAX_PROCS, **defaults: Any) -> None:
        setup = TrainingSetup(**defaults)
        super().__init__(debounce_s)
        self.seed = seed
        self.real_steps = real_steps
        self.max_real_procs = max_real_procs
        self.budget = SimBudget()
        self.curve: tuple[StepPrediction, ...] = ()
        self.prediction: StepPrediction | None = None
        self.sim: SimResult | None = None
        self.sim_kwargs: dict[str, Any] | None = None
        self.sim_state = "none"  # "done", "pending", "skipped", "failed"
        self.sim_note = ""
        self.measured: MeasuredRun | None = None
        self.runner = BackgroundRun()
        self._sim_cache: OrderedDict[tuple, SimResult] = OrderedDict()
        self.simulator = BackgroundSimulator()
        self._wanted: tuple | None = None
        self._build_controls(setup)
        self._build_axes()

    # --- controls ---------------------------------------------------------------------------

    def _build_controls(self, s: TrainingSetup) -> None:
        style = {"description_width": "120px"}
        layout = widgets.Layout(width="360px")

        def slider(description: str, values: tuple, value: Any,
                   fmt: Callable[[Any], str] = lambda v: f"{v:g}") -> widgets.SelectionSlider:
            return widgets.SelectionSlider(options=_options(values, value, fmt), value=value,
                                           description=description, style=style, layout=layout,
                                           continuous_update=True)

        c: dict[str, widgets.ValueWidget] = {
            "nodes": slider("nodes", NODE_COUNTS, s.nodes, str),
            "procs_per_node": slider("procs per node", PROCS_PER_NODE, s.procs_per_node, str),
            "latency_us": slider("latency (µs)", LATENCY_US, s.latency_us),
            "jitter_us": slider("jitter (µs)", JITTER_US, s.jitter_us),
            "distribution": widgets.Dropdown(options=list(models.DISTRIBUTIONS),
                                             value=s.distribution, description="distribution",
                                             style=style, layout=layout),
            "bandwidth_gbit": slider("bandwidth (Gbit/s)", BANDWIDTH_GBIT, s.bandwidth_gbit,
                                     lambda v: "unlimited" if v == 0 else f"{v:g}"),
            "loss_pct": slider("loss (%)", LOSS_PCT, s.loss_pct),
            "model_mib": slider("model (MiB)", MODEL_MIB, s.model_mib),
            "compute_ms": slider("compute/step (ms)", COMPUTE_MS, s.compute_ms),
            "bucket_mib": slider("bucket (MiB)", BUCKET_MIB, s.bucket_mib),
            "overlap": widgets.Checkbox(value=s.overlap, description="overlap comm. with backward",
                                        style=style, layout=layout),
            "algorithm": widgets.Dropdown(options=list(STEP_MODEL_ALGORITHMS), value=s.algorithm,
                                          description="all-reduce", style=style, layout=layout),
        }
        self.controls = c
        self.batch_per_rank = s.batch_per_rank
        for w in c.values():
            w.observe(self._on_change, names="value")
        self.nic_label = widgets.HTML()
        self.summary = widgets.HTML()
        self.run_button = widgets.Button(description="run for real", icon="play",
                                         tooltip="train on real ranks of this machine")
        self.cancel_button = widgets.Button(description="cancel", icon="stop", disabled=True)
        self.run_button.on_click(self.on_run_clicked)
        self.cancel_button.on_click(self.on_cancel)
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="steps")
        self.status = widgets.HTML()
        names = list(c)
        left = widgets.VBox([c[n] for n in names[:6]])
        right = widgets.VBox([c[n] for n in names[6:]])
        self.widget = widgets.VBox([
            widgets.HBox([left, right]), self.nic_label, self.out, self.summary,
            widgets.HBox([self.run_button, self.cancel_button, self.progress, self.status]),
            self.error_box,
        ])

    def _on_change(self, _change: dict) -> None:
        self.debouncer.trigger()

    @property
    def setup(self) -> TrainingSetup:
        """The setup the controls describe right now."""
        values = {name: w.value for name, w in self.controls.items()}
        return TrainingSetup(batch_per_rank=self.batch_per_rank, **values)

    @property
    def measured_now(self) -> MeasuredRun | None:
        """The last real run, if it ran the network and model shown now (any node count)."""
        m = self.measured
        if m is None or replace(self.real_plan().setup, nodes=1) != replace(m.plan.setup,
                                                                             nodes=1):
            return None
        return m

    def set(self, **values: Any) -> None:
        """Set several controls at once (one debounced update follows)."""
        for name, value in values.items():
            w = self.controls[name]
            stops = [v for _, v in w.options] if isinstance(w, widgets.SelectionSlider) \
                else None
            if stops is not None and value not in stops:
                raise ValueError(f"{name}={value!r} is not one of the slider's stops {stops}")
            w.value = value

    # --- computing --------------------------------------------------------------------------

    def _compute(self) -> None:
        """Closed-form curve, and the simulator at N (now, in the background, or not at all)."""
        setup = self.setup
        self.curve = predicted_curve(setup)
        self.prediction = predict_step(setup)
        mode, steps, estimate = self.budget.plan(setup, static=self._static)
        key = (setup, self.seed)
        if (key == self._wanted and self.sim_state == "pending" and self.simulator.busy
                and not self._static):
            return  # the same setup again: its simulation is already running
        self._wanted = key
        self.simulator.cancel()  # whatever runs in the background is stale now
        if key in self._sim_cache:  # seen before: whatever number of steps it had
            self._sim_cache.move_to_end(key)
            res = self._sim_cache[key]
            self._set_sim(res, setup.sim_kwargs(len(res.step_times), self.seed))
            return
        kwargs = setup.sim_kwargs(steps, self.seed)
        if mode == "skip":
            self.sim, self.sim_kwargs, self.sim_state = None, None, "skipped"
            self.sim_note = (f"simulating {setup.ranks} ranks would take ~{estimate:.0f} s; "
                             "showing the closed form only")
        elif mode == "sync":
            t0 = time.perf_counter()
            kind, payload = run_simulation(kwargs)
            self._sim_finished(key, kwargs, payload if kind == "ok" else None,
                               payload if kind == "error" else None, time.perf_counter() - t0)
        else:
            self.sim, self.sim_kwargs, self.sim_state = None, kwargs, "pending"
            self.sim_note = f"simulating {setup.ranks} ranks, {steps} steps (~{estimate:.1f} s)…"
            self.simulator.submit(kwargs, functools.partial(self._sim_finished, key, kwargs,
                                                            redraw=True))

    def _sim_finished(self, key: tuple, kwargs: dict[str, Any], res: SimResult | None,
                      error: str | None, seconds: float, redraw: bool = False) -> None:
        """A simulation ended: cache it, and show it if its setup is still the wanted one."""
        with self._lock:
            if res is not None:
                self.budget.learn(key[0], kwargs["steps"], seconds)
                self._sim_cache[key] = res
                while len(self._sim_cache) > 64:
                    self._sim_cache.popitem(last=False)
            if key != self._wanted:
                return
            if res is not None:
                self._set_sim(res, kwargs)
            else:  # e.g. a segment whose retransmissions were all lost: TCP gives up
                self.sim, self.sim_kwargs, self.sim_state = None, kwargs, "failed"
                self.sim_note = f"simulator: {error}"
            if redraw:
                self._render()

    def _set_sim(self, res: SimResult, kwargs: dict[str, Any]) -> None:
        self.sim, self.sim_kwargs, self.sim_state, self.sim_note = res, kwargs, "done", ""

    def wait_for_simulation(self, timeout: float = 60.0) -> bool:
        """Block until a background simulation is done and drawn (for tests)."""
        return self.simulator.wait(timeout)

    # --- drawing ----------------------------------------------------------------------------

    def _make_axes(self, fig) -> dict[str, Any]:
        """The figure's axes and every artist, created once; `_draw` only moves them."""
        fig.subplots_adjust(left=0.075, right=0.985, top=0.87, bottom=0.075, hspace=0.36,
                            wspace=0.22)
        grid = fig.add_gridspec(2, 2)
        thr = fig.add_subplot(grid[0, 0])
        eff = fig.add_subplot(grid[1, 0], sharex=thr)  # one set of N tick labels for both
        hist, bar = fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, 1])
        xs = np.array(NODE_COUNTS, dtype=float)
        ones = np.ones_like(xs)
        sc: dict[str, Any] = {"throughput": thr, "efficiency": eff, "hist": hist,
                              "breakdown": bar, "title": fig.suptitle("", fontsize=11, y=0.99)}
        sc["ideal"], = thr.plot(xs, ones, ":", color="0.55", label="linear scaling")
        sc["model_thr"], = thr.plot(xs, ones, "o-", color="C0", ms=4,
                                    label="closed form (α-β + jitter + loss)")
        sc["sim_thr"], = thr.plot([], [], "D", color="k", ms=7, label="simulated at N")
        sc["model_eff"], = eff.plot(xs, ones, "o-", color="C0", ms=4, label="closed form")
        sc["sim_eff"], = eff.plot([], [], "D", color="k", ms=7, label="simulated at N")
        sc["n_thr"] = thr.axvline(1, color="0.75", lw=1, zorder=0)
        sc["n_eff"] = eff.axvline(1, color="0.75", lw=1, zorder=0)
        thr.set(xscale="log", yscale="log", ylabel="samples / s", title="throughput")
        eff.set(ylim=(0, 105), xlabel="nodes", ylabel="% of linear",
                title="scaling efficiency")
        thr.tick_params(labelbottom=False)
        thr.set_xlim(0.7, 1500)
        thr.xaxis.set_major_locator(FixedLocator([1, 4, 16, 64, 256, 1024]))
        thr.xaxis.set_major_formatter("{x:g}")
        thr.xaxis.set_minor_locator(NullLocator())
        thr.xaxis.set_minor_formatter(NullFormatter())
        thr.yaxis.set_major_locator(LogLocator(numticks=5))
        thr.yaxis.set_minor_locator(NullLocator())
        thr.yaxis.set_minor_formatter(NullFormatter())
        eff.yaxis.set_major_locator(FixedLocator([0, 25, 50, 75, 100]))

        sc["stairs"] = hist.stairs([0], [0, 1], fill=True, color="0.6")
        sc["p50"] = hist.axvline(0, color="C3", ls="-", label="p50")  # named in the title
        sc["tail"] = hist.axvline(0, color="C3", ls="--", label="tail")
        sc["note"] = hist.text(0.5, 0.5, "", ha="center", va="center", wrap=True,
                               transform=hist.transAxes, fontsize=9)
        hist.set(xlabel="step time (ms)", ylabel="steps")
        hist.yaxis.set_major_locator(MaxNLocator(3, integer=True))
        hist.xaxis.set_major_locator(MaxNLocator(4))

        rows = np.arange(3)[::-1]  # closed form, simulated, real run: top to bottom
        sc["comp_bars"] = bar.barh(rows, [0, 0, 0], color="C0", label="compute")
        sc["comm_bars"] = bar.barh(rows, [0, 0, 0], color="C3", label="exposed communication")
        sc["bar_text"] = [bar.text(0, y, "", va="center", fontsize=8) for y in rows]
        bar.set_yticks(rows, ["closed form", "simulated", "real run"])
        bar.set(xlabel="ms per step", ylim=(-0.6, 3.3))
        bar.xaxis.set_major_locator(MaxNLocator(4))
        sync_legend(bar, [sc["comp_bars"], sc["comm_bars"]], fontsize=8, loc="upper right")
        sc["measured"] = None  # (MeasuredRun, its artists), made when a run has finished
        return sc

    def _draw(self, fig, sc: dict[str, Any]) -> None:
        setup, pred, curve = self.setup, self.prediction, self.curve
        thr, hist, bar = sc["throughput"], sc["hist"], sc["breakdown"]
        n = setup.nodes
        sim = self.sim
        sc["title"].set_text(f"nic: {setup.nic or '(no impairment)'}   ·   {setup.algorithm}, "
                             f"{n} nodes × {setup.procs_per_node} "
                             f"proc{'s' if setup.procs_per_node > 1 else ''} per node")

        # Throughput and efficiency against N.
        model = np.array([c.throughput for c in curve])
        sc["ideal"].set_ydata(curve[0].throughput * np.array(NODE_COUNTS, dtype=float))
        sc["model_thr"].set_ydata(model)
        sc["model_eff"].set_ydata([100 * c.efficiency for c in curve])
        sc["n_thr"].set_xdata([n, n])
        sc["n_eff"].set_xdata([n, n])
        sim_points = ([n], [sim.throughput]) if sim is not None else ([], [])
        sc["sim_thr"].set_data(*sim_points)
        sc["sim_eff"].set_data(*(([n], [100 * setup.compute_s / sim.mean_step])
                                 if sim is not None else ([], [])))
        values = [*model, *sim_points[1], *self._draw_measured(sc),
                  curve[0].throughput * NODE_COUNTS[-1]]
        thr.set_ylim(min(values) / 2, max(values) * 2)
        handles = [sc["ideal"], sc["model_thr"]] + ([sc["sim_thr"]] if sim is not None else [])
        if sc["measured"] is not None:
            handles += sc["measured"][1]
        sync_legend(thr, handles, fontsize=8, loc="upper left")  # efficiency: same markers

        # Step-time histogram of the simulation at N.
        steps = len(sim.step_times) if sim is not None else 0
        title = f"simulated step times at N={n} ({steps} steps)"
        for artist in (sc["stairs"], sc["p50"], sc["tail"], hist.xaxis, hist.yaxis):
            artist.set_visible(sim is not None)
        if sim is not None:
            ms = sim.step_times * 1e3
            counts, edges = np.histogram(ms, bins=min(15, len(ms)))
            sc["stairs"].set_data(counts, edges)
            p50 = sim.percentile(50) * 1e3
            tail_name, tail = tail_of(sim.step_times)
            sc["p50"].set_xdata([p50, p50])
            sc["tail"].set_xdata([tail * 1e3, tail * 1e3])
            title += (f"\np50 (solid) {p50:.4g} ms, "
                      f"{tail_name} (dashed) {tail * 1e3:.4g} ms")
            pad = max(edges[-1] - edges[0], 1e-3 * edges[-1]) * 0.1
            hist.set_xlim(edges[0] - pad, edges[-1] + pad)
            hist.set_ylim(0, counts.max() * 1.2)
            sc["note"].set_text("")
        else:
            sc["note"].set_text(self.sim_note or "no simulation")
        hist.set_title(title, fontsize=10)

        # Where a step's time goes: compute and exposed communication.
        rows = [(pred.compute_s, pred.exposed_s)]
        rows.append((float(sim.compute.mean()), sim.exposed_comm) if sim is not None else None)
        m = self.measured_now
        rows.append((m.plan.setup.compute_s,
                     max(0.0, float(np.median(m.step_times)) - m.plan.setup.compute_s))
                    if m is not None else None)
        widths = []
        for comp_bar, comm_bar, text, row in zip(sc["comp_bars"], sc["comm_bars"],
                                                 sc["bar_text"], rows):
            comp, comm = (0.0, 0.0) if row is None else (row[0] * 1e3, row[1] * 1e3)
            comp_bar.set_width(comp)
            comm_bar.set_x(comp)
            comm_bar.set_width(comm)
            text.set_x(comp + comm)
            text.set_text("" if row is None else f" {comp:.3g} + {comm:.3g} ms")
            widths.append(comp + comm)
        bar.set_xlim(0, max(widths) * 1.9 or 1.0)
        real = f"real {m.plan.setup.nodes}×{m.plan.setup.procs_per_node}" if m else "real run"
        bar.set_yticks(np.arange(3)[::-1], ["closed form", "simulated", real])
        bar.set_title(f"where a step's time goes at N={n}")

    def _draw_measured(self, sc: dict[str, Any]) -> list[float]:
        """Measured points (p10-p90 error bars) and the simulator's prediction of the same run,
        drawn once per finished run; returns the throughputs they span (for the y limits)."""
        m = self.measured_now
        if sc["measured"] is not None and sc["measured"][0] is not m:  # stale: take it away
            for artist in sc["measured"][1] + sc["measured"][2]:
                artist.remove()
            sc["measured"] = None
        if m is None:
            return []
        span = [m.throughput(90), m.throughput(10)]
        if sc["measured"] is not None:
            return span
        s = m.plan.setup
        x = s.nodes
        lo, mid, hi = m.throughput(90), m.throughput(50), m.throughput(10)
        made: tuple[list, list] = ([], [])
        per_rank_alone = s.batch_per_rank / s.compute_s  # samples/s of one rank, no network
        for i, (ax, scale) in enumerate(((sc["throughput"], 1.0),
                                         (sc["efficiency"], 100 / (s.ranks * per_rank_alone)))):
            bars = ax.errorbar([x], [mid * scale],
                               yerr=[[(mid - lo) * scale], [(hi - mid) * scale]], fmt="s",
                               color="C3", ms=6, capsize=4,
                               label=f"measured, {x}×{s.procs_per_node} real ranks (p10-p90)")
            made[i].append(bars)
            if m.predicted is not None:
                (dot,) = ax.plot([x], [m.predicted.throughput * scale], "o", mfc="none",
                                 mec="C3", ms=10, label="simulated, same run (with the Gloo floor)")
                made[i].append(dot)
        sc["measured"] = (m, *made)
        return span + ([m.predicted.throughput] if m.predicted is not None else [])

    def _summary_html(self) -> str:
        setup, pred = self.setup, self.prediction
        parts = [f"<b>N = {setup.nodes}</b> × {setup.procs_per_node} = {setup.ranks} ranks. "
                 f"Closed form: <b>{pred.throughput:,.0f} samples/s</b>, "
                 f"step {pred.step_s * 1e3:.3g} ms, efficiency {100 * pred.efficiency:.1f}%."]
        if self.sim is not None:
            tail_name, tail = tail_of(self.sim.step_times)
            parts.append(f"Simulated ({len(self.sim.step_times)} steps): "
                         f"<b>{self.sim.throughput:,.0f} samples/s</b>, "
                         f"p50 {self.sim.percentile(50) * 1e3:.3g} ms, "
                         f"{tail_name} {tail * 1e3:.3g} ms.")
        elif self.sim_note:
            parts.append(self.sim_note)
        m = self.measured_now
        if m is not None:
            parts.append(f"Measured on {m.plan.setup.nodes}×{m.plan.setup.procs_per_node} real "
                         f"ranks ({len(m.step_times)} steps, model "
                         f"{m.plan.setup.model_mib:g} MiB): {m.throughput(50):,.0f} samples/s "
                         f"(p10-p90 of step time: {m.throughput(90):,.0f}-"
                         f"{m.throughput(10):,.0f}).")
        return " ".join(parts)

    def _render(self) -> None:
        super()._render()
        self.nic_label.value = (f"netem: <code>{self.setup.nic or '(none)'}</code> "
                                "(each node's NIC egress)")
        self.summary.value = self._summary_html()

    # --- the real cluster -------------------------------------------------------------------

    def real_plan(self) -> RealPlan:
        return RealPlan.for_setup(self.setup, self.max_real_procs, self.real_steps)

    def on_run_clicked(self, _button: Any = None) -> None:
        """Start the real run on a worker thread (no-op if one is running)."""
        if self.runner.running:
            return
        plan = self.real_plan()
        self.progress.max, self.progress.value = plan.steps, 0
        self.run_button.disabled, self.cancel_button.disabled = True, False
        s = plan.setup
        self.status.value = (f"starting {s.nodes} nodes × {s.procs_per_node} processes "
                             f"(model {s.model_mib:g} MiB)…")
        self.runner.start(lambda run: self._real_job(run, plan), name="clusterlab-real-run")

    def _real_job(self, run: BackgroundRun, plan: RealPlan) -> None:
        def on_step(done: int, seconds: float) -> None:
            self.progress.value = done
            self.status.value = f"step {done}/{plan.steps}: {seconds * 1e3:.3g} ms"

        def say(text: str) -> None:
            self.status.value = text

        with reporting(run, self.status, self.run_button, self.cancel_button):
            m = measure_real_run(run, plan, seed=self.seed, say=say, on_step=on_step)
            self.measured = m
            self.status.value = (f"measured {len(m.step_times)} steps on {plan.setup.ranks} "
                                 f"real ranks: median {np.median(m.step_times) * 1e3:.3g} ms/step")
            self.update()

    def on_cancel(self, _button: Any = None) -> None:
        """Stop the real run: its cluster is closed (ranks killed), then the worker joined."""
        cancel_run(self.runner, self.status, self.run_button, self.cancel_button,
                   "cancelling… (ranks are being stopped)")

    def close(self) -> None:
        """Stop everything in the background (real run, simulation) and close the widgets."""
        self.runner.cancel()
        self.simulator.cancel()
        self.simulator.wait(10)
        super().close()


def throughput_explorer(**defaults: Any) -> ThroughputExplorer:
    """A ThroughputExplorer with these starting values, e.g. throughput_explorer(nodes=256)."""
    return ThroughputExplorer(**defaults)
