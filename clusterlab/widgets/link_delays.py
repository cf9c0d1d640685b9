"""Link explorer: what one netem link does to the one-way delay of a packet.

Type a netem string (or move the sliders, which write one). The explorer parses it with
`Netem.parse` (a typo shows netem's own error message), sends 5000 probes through the link
model (`LinkModel.one_way_delays`) and draws their delays next to the distribution the
string configures: netem's 4096-entry table for normal/pareto/paretonormal, a flat density
for uniform. The two differ where netem itself adds something: a rate adds each packet's
serialisation time, a loss adds TCP's retransmission timeout (a tail at >= 200 ms).
"measure for real" ping-pongs between two real ranks through the same spec and overlays
what they saw, software overheads included.
"""

from __future__ import annotations

import textwrap
import time
from typing import Any

import ipywidgets as widgets
import numpy as np
from matplotlib.ticker import MaxNLocator, NullFormatter, NullLocator

from .. import clock, models
from ..link import LinkModel, delay_values_ns, packet_time_ns
from ..netem import Netem, netem_string
from ..wire import HEADER_BYTES
from ._common import BackgroundRun, Explorer, cancel_run, reporting, sync_legend

DELAY_US = (0, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
JITTER_US = (0, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
RATE_MBIT = (0, 1, 10, 100, 1000, 10000)  # 0 = no rate
LOSS_PCT = (0, 0.1, 0.5, 1, 2, 5, 10)
QUANTILES = (50, 90, 99)
MEASURE_SECONDS = 4.0  # the real ping-pong's budget


def configured_law_ns(spec: Netem) -> tuple[str, np.ndarray]:
    """The law the spec configures for one empty probe's delay, in ns, as the figure draws
    it: ("table", the 4096 equally likely delays of `link.delay_values_ns`), ("uniform",
    [low, high]) or ("fixed", [delay]); a rate's serialisation time of the probe's headers
    is included, as the link model includes it."""
    wire = _probe_wire_ns(spec)
    if spec.jitter_ns == 0:
        return "fixed", np.array([spec.delay_ns + wire])
    if spec.distribution == "uniform":
        low = max(0, spec.delay_ns - spec.jitter_ns)
        return "uniform", np.array([low + wire, spec.delay_ns + spec.jitter_ns + wire])
    return "table", delay_values_ns(spec) + wire


def configured_percentile_ns(spec: Netem, q: float) -> float:
    """The q-th percentile (0..100) of the configured delay in ns, from models.jitter_quantile:
    delay + jitter_quantile(q), clipped at 0, plus the probe's serialisation time."""
    wire = _probe_wire_ns(spec)
    if spec.jitter_ns == 0:
        return float(spec.delay_ns + wire)
    x = models.jitter_quantile(q / 100, spec.distribution, spec.jitter_ns)
    return max(0.0, spec.delay_ns + x) + wire


def _probe_wire_ns(spec: Netem) -> int:
    """Serialisation time of an empty probe (its headers alone) at the spec's rate (0 if none)."""
    return int(packet_time_ns(spec, HEADER_BYTES))


def _ping_pong(count: int) -> list[int]:
    """Rank 0 pings rank 1 `count` times and rank 1 answers each ping. Both ranks return the
    one-way delays (ns) of what they received: the shared CLOCK_MONOTONIC makes a send stamp
    in the message enough to time one direction."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    peer = 1 - rank
    stamp = torch.zeros(1, dtype=torch.int64)
    out: list[int] = []
    dist.barrier()
    for _ in range(count):
        if rank == 0:
            stamp[0] = clock.monotonic_ns()
            dist.send(stamp, peer)
        dist.recv(stamp, peer)
        out.append(clock.monotonic_ns() - int(stamp[0]))
        if rank == 1:
            stamp[0] = clock.monotonic_ns()
            dist.send(stamp, peer)
    return out


class LinkExplorer(Explorer):
    """One-way delays of one netem link: link model vs. configured law (vs. real ranks)."""

    figsize = (10.5, 4.2)

    def __init__(self, spec: str = "delay 2ms 500us distribution normal", *,
                 samples: int = 5000, seed: int = 0, interval_ms: float | None = None,
                 debounce_s: float = 0.15) -> None:
        super().__init__(debounce_s)
        self.samples = samples
        self.seed = seed
        self.interval_ms = interval_ms
        self.spec: Netem | None = None
        self.parse_error: str | None = None
        self.delays = np.empty(0, dtype=np.int64)  # link model, ns
        self.percentiles: dict[int, float] = {}  # of the link model's delays, ns
        self.measured: np.ndarray | None = None  # real ranks, ns
        self.measured_spec: str | None = None
        self.runner = BackgroundRun()
        self._syncing = False
        self._build_controls(spec)
        self._build_axes()

    # --- controls ---------------------------------------------------------------------------

    def _build_controls(self, spec: str) -> None:
        style = {"description_width": "90px"}

        def slider(description: str, values: tuple, fmt=lambda v: f"{v:g}"):
            w = widgets.SelectionSlider(options=[(fmt(v), v) for v in values], value=values[0],
                                        description=description, style=style,
                                        layout=widgets.Layout(width="330px"))
            w.observe(self._on_slider, names="value")
            return w

        self.text = widgets.Text(value=spec, description="netem", style=style,
                                 layout=widgets.Layout(width="660px"), continuous_update=True)
        self.text.observe(lambda _c: self.debouncer.trigger(), names="value")
        self.sliders = {
            "latency_us": slider("delay (µs)", DELAY_US),
            "jitter_us": slider("jitter (µs)", JITTER_US),
            "rate_mbit": slider("rate (Mbit/s)", RATE_MBIT, lambda v: "none" if v == 0 else
                                f"{v:g}"),
            "loss_pct": slider("loss (%)", LOSS_PCT),
        }
        self.distribution = widgets.Dropdown(options=list(models.DISTRIBUTIONS),
                                             value="uniform", description="distribution",
                                             style=style, layout=widgets.Layout(width="330px"))
        self.distribution.observe(self._on_slider, names="value")
        self._sync_sliders(spec)
        self.measure_button = widgets.Button(description="measure for real", icon="play")
        self.cancel_button = widgets.Button(description="cancel", icon="stop", disabled=True)
        self.measure_button.on_click(self.on_measure_clicked)
        self.cancel_button.on_click(self.on_cancel)
        self.status = widgets.HTML()
        self.table = widgets.HTML()
        s = self.sliders
        self.widget = widgets.VBox([
            self.text,
            widgets.HBox([widgets.VBox([s["latency_us"], s["jitter_us"], self.distribution]),
                          widgets.VBox([s["rate_mbit"], s["loss_pct"]])]),
            self.error_box, self.out, self.table,
            widgets.HBox([self.measure_button, self.cancel_button, self.status]),
        ])

    def _on_slider(self, _change: dict) -> None:
        """A slider moved: write the netem string they describe into the text box."""
        if self._syncing:
            return
        v = {name: w.value for name, w in self.sliders.items()}
        self.text.value = netem_string(v["latency_us"], v["jitter_us"], self.distribution.value,
                                       v["rate_mbit"] / 1000, v["loss_pct"])

    def _sync_sliders(self, text: str) -> None:
        """Move the sliders to a typed spec's values, where they have such a stop."""
        try:
            spec = Netem.parse(text)
        except ValueError:
            return
        loss = getattr(spec.loss, "percent", 0.0) if spec.loss is not None else 0.0
        wanted = {"latency_us": spec.delay_ns / 1e3, "jitter_us": spec.jitter_ns / 1e3,
                  "rate_mbit": spec.rate_bps / 1e6, "loss_pct": loss}
        self._syncing = True
        try:
            for name, value in wanted.items():
                w = self.sliders[name]
                if value in [v for _, v in w.options]:
                    w.value = value
            self.distribution.value = spec.distribution
        finally:
            self._syncing = False

    @property
    def measured_now(self) -> np.ndarray | None:
        """The real ranks' delays, if they were measured with the spec shown now."""
        if self.spec is None or self.measured_spec != str(self.spec):
            return None
        return self.measured

    def set_spec(self, text: str) -> None:
        """Type `text` into the netem box (a debounced update follows)."""
        self.text.value = text

    # --- computing --------------------------------------------------------------------------

    def _interval_ns(self, spec: Netem) -> int:
        """Probe spacing: apart enough not to queue behind each other, unless asked."""
        if self.interval_ms is not None:
            return int(self.interval_ms * 1e6)
        return max(10_000_000, 4 * (spec.delay_ns + spec.jitter_ns))

    def _compute(self) -> None:
        text = self.text.value
        try:
            spec = Netem.parse(text)
        except ValueError as exc:
            self.spec, self.parse_error = None, str(exc)
            return
        self.parse_error = None
        if spec != self.spec or len(self.delays) != self.samples:
            model = LinkModel(spec, seed=self.seed)
            self.delays = model.one_way_delays(self.samples, interval_ns=self._interval_ns(spec))
            self.percentiles = {q: float(np.percentile(self.delays, q)) for q in QUANTILES}
        self.spec = spec
        if not self._syncing:
            self._sync_sliders(text)

    def _message(self) -> str:
        if self.parse_error is None:
            return ""
        return (f"<span style='color:#b00'><b>ValueError</b>: {_escape(self.parse_error)}"
                "</span>")

    def _render(self) -> None:
        super()._render()
        if self.spec is None:
            self.table.value = ""
            return
        rows = [(f"link model ({self.samples} probes)", self.percentiles),
                ("configured", {q: configured_percentile_ns(self.spec, q) for q in QUANTILES})]
        measured = self.measured_now
        if measured is not None:
            rows.append((f"measured ({len(measured)} pings)",
                         {q: float(np.percentile(measured, q)) for q in QUANTILES}))
        head = "".join(f"<th>p{q}</th>" for q in QUANTILES)
        body = "".join(f"<tr><td>{name}</td>" + "".join(f"<td>{v[q] / 1e6:.4g} ms</td>"
                                                        for q in QUANTILES) + "</tr>"
                       for name, v in rows)
        self.table.value = (f"<code>{_escape(str(self.spec)) or '(no impairment)'}</code>"
                            f"<table><tr><th></th>{head}</tr>{body}</table>")

    # --- drawing ----------------------------------------------------------------------------

    def _make_axes(self, fig) -> dict[str, Any]:
        """Axes and artists, created once; `_draw` moves them (much cheaper than redrawing)."""
        fig.subplots_adjust(left=0.07, right=0.985, top=0.86, bottom=0.13, wspace=0.25)
        dens, tail = fig.subplots(1, 2)
        sc: dict[str, Any] = {"density": dens, "tail": tail,
                              "title": fig.suptitle("", fontsize=11)}
        sc["model"] = dens.stairs([0], [0, 1], fill=True, color="0.7", label="link model")
        sc["table"] = dens.stairs([0], [0, 1], color="C0", lw=1.5,
                                  label="configured (netem table)")
        sc["shape"], = dens.plot([], [], color="C0", lw=1.5, label="configured")
        sc["measured"] = dens.stairs([0], [0, 1], color="C3", lw=1.5,
                                     label="measured, 2 real ranks")
        sc["q"] = {q: dens.axvline(0, color="k", ls=style, lw=1)
                   for q, style in zip(QUANTILES, (":", "--", "-"))}
        sc["error"] = fig.text(0.5, 0.5, "", ha="center", va="center", fontsize=10,
                               color="#b00")
        dens.set(xlabel="one-way delay (ms)", ylabel="density")
        sc["tail_model"], = tail.plot([], [], drawstyle="steps-post", color="0.4",
                                      label="link model")
        sc["tail_table"], = tail.plot([], [], drawstyle="steps-post", color="C0",
                                      label="configured")
        sc["tail_measured"], = tail.plot([], [], drawstyle="steps-post", color="C3",
                                         label="measured")
        tail.set(yscale="log", xlabel="one-way delay (ms)", ylabel="P(delay > x)",
                 title="the tail")
        tail.yaxis.set_minor_locator(NullLocator())
        tail.yaxis.set_minor_formatter(NullFormatter())
        for ax in (dens, tail):
            ax.xaxis.set_major_locator(MaxNLocator(6))
        dens.yaxis.set_major_locator(MaxNLocator(4))
        return sc

    def _draw(self, fig, sc: dict[str, Any]) -> None:
        dens, tail = sc["density"], sc["tail"]
        ok = self.parse_error is None and self.spec is not None
        artists = [sc["model"], sc["table"], sc["shape"], sc["measured"], *sc["q"].values(),
                   sc["tail_model"], sc["tail_table"], sc["tail_measured"]]
        for a in artists:
            a.set_visible(ok)
        dens.set_visible(ok)
        tail.set_visible(ok)
        if not ok:
            sc["title"].set_text("netem string not understood")
            sc["title"].set_color("#b00")
            sc["error"].set_text(textwrap.fill(f"ValueError: {self.parse_error}", 90))
            return
        spec = self.spec
        sc["title"].set_text(f"netem: {spec or '(no impairment)'}")
        sc["title"].set_color("k")
        sc["error"].set_text("")
        ms = self.delays / 1e6
        kind, conf = configured_law_ns(spec)
        # The density shows the body; retransmitted probes (>= 200 ms later) go to the tail.
        conf_max = float(conf.max()) / 1e6
        body = ms[ms <= 1.5 * conf_max + 1.0]
        hi = max(float(np.percentile(body if len(body) else ms, 99.5)), conf_max) * 1.05
        lo = min(float(ms.min()), float(conf.min()) / 1e6)
        if hi - lo < 1e-3:  # no jitter: give the spike some room
            lo, hi = lo - 0.05 * max(hi, 0.01), hi + 0.05 * max(hi, 0.01)
        bins = np.linspace(lo, hi, 61)

        def density(values_ms: np.ndarray) -> np.ndarray:
            counts, _ = np.histogram(values_ms, bins=bins)
            return counts / (len(values_ms) * (bins[1] - bins[0]))  # all values, in range or not

        top = []
        model = density(ms)
        sc["model"].set_data(model, bins)
        top.append(model.max())
        handles = [sc["model"]]
        sc["table"].set_visible(kind == "table")
        sc["shape"].set_visible(kind != "table")
        if kind == "table":
            table = density(conf / 1e6)
            sc["table"].set_data(table, bins)
            top.append(table.max())
            handles.append(sc["table"])
        elif kind == "uniform":
            a, b = conf / 1e6
            sc["shape"].set_data([a, a, b, b], [0, 1 / (b - a), 1 / (b - a), 0])
            sc["shape"].set_label("configured (uniform)")
            top.append(1 / (b - a))
            handles.append(sc["shape"])
        else:
            x = conf[0] / 1e6
            sc["shape"].set_data([x, x], [0, max(top) * 1.1])
            sc["shape"].set_label("configured (fixed)")
            handles.append(sc["shape"])
        real_ns = self.measured_now
        measured = real_ns is not None
        sc["measured"].set_visible(measured)
        sc["tail_measured"].set_visible(measured)
        if measured:
            real = density(real_ns / 1e6)
            sc["measured"].set_data(real, bins)
            top.append(real.max())
            handles.append(sc["measured"])
        for q, line in sc["q"].items():
            v = self.percentiles[q] / 1e6
            line.set_xdata([v, v])
            line.set_label(f"p{q} {v:.4g} ms")
            handles.append(line)
        beyond = int((ms > hi).sum())
        title = "one-way delay of a probe"
        if beyond:
            title += f" ({beyond} beyond {hi:.3g} ms: lost, then retransmitted)"
        dens.set_title(title, fontsize=10)
        dens.set_xlim(lo, hi)
        dens.set_ylim(0, max(top) * 1.15 or 1.0)
        sync_legend(dens, handles, fontsize=8, loc="upper right")

        # The tail: P(delay > x) on a log scale, where p99 and retransmissions show.
        def ccdf(line: Any, values_ns: np.ndarray) -> None:
            x = np.sort(values_ns) / 1e6
            line.set_data(x, 1 - np.arange(len(x)) / len(x))

        ccdf(sc["tail_model"], self.delays)
        tails = [sc["tail_model"]]
        sc["tail_table"].set_visible(kind != "fixed")
        if kind == "table":
            ccdf(sc["tail_table"], conf)
            tails.append(sc["tail_table"])
        elif kind == "uniform":
            a, b = conf / 1e6
            x = np.linspace(a, b, 200)
            sc["tail_table"].set_data(x, np.maximum(1 - (x - a) / (b - a), 1 / len(ms)))
            tails.append(sc["tail_table"])
        if measured:
            ccdf(sc["tail_measured"], real_ns)
            tails.append(sc["tail_measured"])
        right = max(float(ms.max()), float(conf.max()) / 1e6,
                    float(real_ns.max()) / 1e6 if measured else 0.0)
        tail.set_xlim(min(lo, 0.0) if lo <= 0 else lo * 0.95, right * 1.05 or 1.0)
        tail.set_ylim(1 / (2 * len(ms)), 1.5)
        sync_legend(tail, tails, fontsize=8, loc="lower left")

    # --- the real ranks ---------------------------------------------------------------------

    def measure_count(self) -> int:
        """Pings that fit the budget: a ping-pong costs two one-way delays."""
        spec = self.spec or Netem()
        round_trip = 2 * (spec.delay_s + spec.jitter_s) + 200e-6
        return int(np.clip(MEASURE_SECONDS / round_trip, 20, 400))

    def on_measure_clicked(self, _button: Any = None) -> None:
        """Ping-pong between two real ranks through this spec, on a worker thread."""
        if self.runner.running:
            return
        self.update()
        if self.spec is None:
            self.status.value = "fix the netem string first"
            return
        spec, count = self.spec, self.measure_count()
        self.measure_button.disabled, self.cancel_button.disabled = True, False
        self.status.value = f"2 real ranks, {count} ping-pongs…"
        self.runner.start(lambda run: self._measure_job(run, spec, count),
                          name="clusterlab-link-measure")

    def _measure_job(self, run: BackgroundRun, spec: Netem, count: int) -> None:
        t0 = time.perf_counter()
        with reporting(run, self.status, self.measure_button, self.cancel_button):
            timeout = 30 + count * 2 * (spec.delay_s + spec.jitter_s) * 3
            with run.cluster(nodes=2, nic=None if spec.is_noop else spec, seed=self.seed,
                             timeout=timeout) as cl:
                run.check()
                out = cl.run(_ping_pong, count)
            self.measured = np.array(out[0] + out[1], dtype=np.int64)
            self.measured_spec = str(spec)
            self.status.value = (f"measured {len(self.measured)} one-way delays in "
                                 f"{time.perf_counter() - t0:.1f} s")
            self.update()

    def on_cancel(self, _button: Any = None) -> None:
        """Stop the measurement: its cluster is closed (ranks killed), the worker joined."""
        cancel_run(self.runner, self.status, self.measure_button, self.cancel_button)

    def close(self) -> None:
        self.runner.cancel()
        super().close()


def _escape(text: str) -> str:
    import html

    return html.escape(text)


def link_explorer(spec: str = "delay 2ms 500us distribution normal", **kwargs: Any) -> LinkExplorer:
    """A LinkExplorer starting from `spec`."""
    return LinkExplorer(spec, **kwargs)
