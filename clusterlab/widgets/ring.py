"""Ring all-reduce, one round at a time: who holds which partial sum, and where time goes.

p ranks each hold a vector cut into p chunks. Reduce-scatter: in round s (0-based) rank r
sends chunk (r - s) mod p to rank r + 1, which adds its own copy to it; after p - 1 rounds
rank r holds the complete sum of chunk (r + 1) mod p. All-gather: in round s rank r forwards
chunk (r + 1 - s) mod p, the last complete one it got; after p - 1 more rounds everybody
has every chunk. 2(p - 1) rounds, each moving one 1/p-th of the vector per link.

The left panel is the state after k rounds: a p x p grid (rank x chunk), coloured by how
many ranks' contributions the chunk holds, "✓" when complete. The right panel is the
timeline on an emulated network (`schedule.QueueState.deliver`, the very function the
backend and the simulator use): one row per link, one bar per round from send to arrival.
Every round waits for its slowest link, so one slow link stretches every round: the ring
runs at the pace of its worst link.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets
import numpy as np
from matplotlib.ticker import MaxNLocator

from ..netem import Netem
from ..schedule import QueueState, ring_rounds
from ..topology import Topology
from ._common import Explorer

MIB = 2**20


def chunk_counts(p: int, rounds_done: int) -> np.ndarray:
    """counts[rank, chunk]: how many ranks' contributions rank holds for chunk, after
    `rounds_done` rounds of the ring all-reduce (p means complete)."""
    counts = np.ones((p, p), dtype=np.int64)
    ranks = np.arange(p)
    for s in range(min(rounds_done, p - 1)):  # reduce-scatter: add what arrives
        chunk = (ranks - s) % p
        counts[(ranks + 1) % p, chunk] += counts[ranks, chunk]
    for s in range(max(0, rounds_done - (p - 1))):  # all-gather: overwrite with the sum
        chunk = (ranks + 1 - s) % p
        counts[(ranks + 1) % p, chunk] = p
    return counts


def chunk_sent(p: int, round_index: int) -> np.ndarray:
    """The chunk each rank sends in round `round_index` (0-based)."""
    ranks = np.arange(p)
    if round_index < p - 1:
        return (ranks - round_index) % p
    return (ranks + 1 - (round_index - (p - 1))) % p


@dataclass(frozen=True)
class RingTimeline:
    """Send and arrival times (ns) of every message of one ring all-reduce."""

    send_ns: np.ndarray  # (rounds, p): when rank j sent its chunk to j + 1 in each round
    arrive_ns: np.ndarray  # (rounds, p): when that chunk arrived at rank j + 1
    ready_ns: np.ndarray  # (rounds, p): when each rank was done with each round

    @property
    def rounds(self) -> int:
        return self.send_ns.shape[0]

    @property
    def total_ns(self) -> int:
        """When the last rank finished: the all-reduce's time."""
        return int(self.ready_ns[-1].max()) if self.rounds else 0


def ring_timeline(topology: Topology, nbytes: int, seed: int = 0) -> RingTimeline:
    """Replay a ring all-reduce of `nbytes` on `topology`, round by round.

    The loop of `schedule.play` for the ring, unrolled so that each round's send and arrival
    times are kept: a rank sends when it is ready, `QueueState.deliver` says when the message
    arrives (delay, jitter, rate and queueing of that link), and the receiver is ready for
    the next round once it has arrived. Same seed, same numbers as `play`.
    """
    p = topology.world_size
    fabric = QueueState(topology)
    rng = np.random.default_rng(seed)
    ready = np.zeros(p, dtype=np.int64)
    sends, arrivals, readies = [], [], []
    for senders, receivers, size in ring_rounds(p, nbytes, 2 * (p - 1)):
        send = ready[senders].copy()
        arrive = fabric.deliver(senders, receivers, send, size, rng)
        np.maximum.at(ready, receivers, arrive)
        sends.append(send)
        arrivals.append(arrive)
        readies.append(ready.copy())
    shape = (0, p)
    return RingTimeline(np.array(sends).reshape(-1, p) if sends else np.empty(shape),
                        np.array(arrivals).reshape(-1, p) if arrivals else np.empty(shape),
                        np.array(readies).reshape(-1, p) if readies else np.empty(shape))


def _slow_pair(p: int, slow_link: int | tuple[int, int] | None) -> tuple[int, int] | None:
    """slow_link as a (src, dst) ring direction: an int i means i -> i + 1."""
    if slow_link is None:
        return None
    if isinstance(slow_link, int):
        src, dst = slow_link % p, (slow_link + 1) % p
    else:
        src, dst = (int(x) for x in slow_link)
    if dst != (src + 1) % p:
        raise ValueError(f"slow_link {src}->{dst} is not a ring link (the ring sends r -> r+1)")
    return src, dst


class RingStepper(Explorer):
    """Step through a ring all-reduce; optionally make one link slow (`slow_link=i`: i->i+1).

    `on_step` / `on_back` move one round, `on_reset` goes back to the start; the Play widget
    steps on its own in a front-end. `update()` redraws for the current round. `step=k`
    starts after k rounds (the static figure shows that state).
    """

    figsize = (11.0, 4.6)

    def __init__(self, p: int = 4, slow_link: int | tuple[int, int] | None = None, *,
                 nbytes: int = 64 * MIB, nic: str = "delay 100us rate 10gbit",
                 slow: str = "delay 100us rate 1gbit", seed: int = 0, interval_ms: int = 800,
                 debounce_s: float = 0.05, step: int = 0) -> None:
        super().__init__(debounce_s)
        if not 2 <= p <= 16:
            raise ValueError(f"p must be in 2..16 for a readable grid, got {p}")
        self.nbytes, self.seed = int(nbytes), seed
        self.nic, self.slow = Netem.parse(nic), Netem.parse(slow)
        self.timeline: RingTimeline | None = None
        self.baseline: RingTimeline | None = None  # the same ring without the slow link
        self.counts = chunk_counts(p, 0)
        self._config: tuple | None = None
        self._build_controls(p, _slow_pair(p, slow_link), interval_ms)
        if not 0 <= step <= 2 * (p - 1):
            raise ValueError(f"step must be in 0..{2 * (p - 1)} (rounds done), got {step}")
        self.step_slider.value = step  # where the static figure and the widget start
        self._build_axes()

    # --- controls ---------------------------------------------------------------------------

    def _build_controls(self, p: int, slow: tuple[int, int] | None, interval_ms: int) -> None:
        rounds = 2 * (p - 1)
        self.p_slider = widgets.IntSlider(value=p, min=2, max=max(8, p), description="ranks p")
        self.slow_dropdown = widgets.Dropdown(options=self._slow_options(p),
                                              value=slow[0] if slow else None,
                                              description="slow link")
        self.step_slider = widgets.IntSlider(value=0, min=0, max=rounds, description="round")
        self.play = widgets.Play(value=0, min=0, max=rounds, step=1, interval=interval_ms)
        self._link = widgets.jslink((self.play, "value"), (self.step_slider, "value"))
        self.step_button = widgets.Button(description="step", icon="step-forward")
        self.back_button = widgets.Button(description="back", icon="step-backward")
        self.reset_button = widgets.Button(description="reset", icon="undo")
        self.step_button.on_click(self.on_step)
        self.back_button.on_click(self.on_back)
        self.reset_button.on_click(self.on_reset)
        self.caption = widgets.HTML()
        self.p_slider.observe(self._on_p, names="value")
        for w in (self.slow_dropdown, self.step_slider):
            w.observe(lambda _c: self.debouncer.trigger(), names="value")
        self.widget = widgets.VBox([
            widgets.HBox([self.p_slider, self.slow_dropdown]),
            widgets.HBox([self.play, self.back_button, self.step_button, self.reset_button,
                          self.step_slider]),
            self.out, self.caption, self.error_box,
        ])

    @staticmethod
    def _slow_options(p: int) -> list[tuple[str, int | None]]:
        return [("none", None)] + [(f"{i} → {(i + 1) % p}", i) for i in range(p)]

    def _on_p(self, change: dict) -> None:
        p = change["new"]
        rounds = 2 * (p - 1)
        slow = self.slow_dropdown.value
        self.slow_dropdown.options = self._slow_options(p)
        self.slow_dropdown.value = slow if slow is not None and slow < p else None
        self.step_slider.value = min(self.step_slider.value, rounds)
        self.play.max = self.step_slider.max = rounds
        self.debouncer.trigger()

    @property
    def p(self) -> int:
        return self.p_slider.value

    @property
    def step(self) -> int:
        """Rounds done so far (0 .. 2(p-1))."""
        return self.step_slider.value

    @property
    def slow_link(self) -> tuple[int, int] | None:
        return _slow_pair(self.p, self.slow_dropdown.value)

    def on_step(self, _button: Any = None) -> None:
        """One round forward (stays at the end)."""
        self.step_slider.value = min(self.step + 1, self.step_slider.max)

    def on_back(self, _button: Any = None) -> None:
        self.step_slider.value = max(self.step - 1, 0)

    def on_reset(self, _button: Any = None) -> None:
        self.step_slider.value = 0

    # --- computing --------------------------------------------------------------------------

    def topology(self, with_slow_link: bool = True) -> Topology:
        """p nodes, one rank each; the slow link overrides one direction of the ring."""
        links = {self.slow_link: self.slow} if with_slow_link and self.slow_link else None
        return Topology.build(self.p, 1, self.nic, links=links)

    def _compute(self) -> None:
        config = (self.p, self.slow_link)
        if config != self._config:  # the timeline only depends on the ring, not the round
            self.timeline = ring_timeline(self.topology(), self.nbytes, self.seed)
            self.baseline = (ring_timeline(self.topology(False), self.nbytes, self.seed)
                             if self.slow_link else self.timeline)
            self._config = config
        self.counts = chunk_counts(self.p, self.step)

    def _phase(self, k: int) -> str:
        return "reduce-scatter" if k < self.p - 1 else "all-gather"

    def _render(self) -> None:
        super()._render()
        self.caption.value = self._caption()

    def _caption(self) -> str:
        p, k, tl = self.p, self.step, self.timeline
        total = tl.total_ns / 1e6
        text = (f"Ring all-reduce of {self.nbytes / MIB:g} MiB on {p} ranks: {2 * (p - 1)} "
                f"rounds of {self.nbytes / p / MIB:.3g} MiB per link, {total:.3g} ms in all")
        if self.slow_link:
            text += (f" (without the slow link {self.baseline.total_ns / 1e6:.3g} ms: every "
                     f"round waits for link {self.slow_link[0]} → {self.slow_link[1]})")
        text += ". "
        if k == 0:
            text += "Every rank holds only its own contribution to each chunk."
        elif k < p - 1:
            text += f"After {k} reduce-scatter round(s), partial sums hold {k + 1} contributions."
        elif k == p - 1:
            text += "Reduce-scatter done: each rank holds one complete chunk."
        elif k < 2 * (p - 1):
            text += "All-gather: complete chunks travel round the ring."
        else:
            text += "Done: every rank holds every complete chunk."
        return text

    # --- drawing ----------------------------------------------------------------------------

    def _make_axes(self, fig) -> dict[str, Any]:
        fig.subplots_adjust(left=0.06, right=0.985, top=0.86, bottom=0.12, wspace=0.22)
        grid, timeline = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.6]})
        return {"grid": grid, "timeline": timeline, "title": fig.suptitle("", fontsize=11),
                "config": None}

    def _build_scene(self, sc: dict[str, Any]) -> None:
        """(Re)create the artists of this ring (p, slow link); stepping only restyles them."""
        p, tl = self.p, self.timeline
        grid, line = sc["grid"], sc["timeline"]
        grid.clear()
        line.clear()
        rounds = 2 * (p - 1)
        sc["image"] = grid.imshow(np.zeros((p, p, 4)), aspect="equal")
        sc["cells"] = [[grid.text(c, r, "", ha="center", va="center",
                                  fontsize=9 if p <= 6 else 7) for c in range(p)]
                       for r in range(p)]
        sc["outlines"] = [grid.add_patch(_rect(0, r, "C1")) for r in range(p)]
        grid.set_xticks(range(p), [str(c) for c in range(p)])
        grid.set_yticks(range(p), [f"rank {r}" for r in range(p)])
        grid.set_xlabel("chunk")

        scale = 1e6  # ns -> ms
        slow = self.slow_link
        sc["bars"] = []
        waits = []  # (y, from, to): a message queued behind the previous one on its link
        for j in range(p):
            start = tl.send_ns[:, j].copy()
            start[1:] = np.maximum(start[1:], tl.arrive_ns[:-1, j])
            waits += [(j + 0.44, tl.send_ns[s, j] / scale, start[s] / scale)  # under the row
                      for s in range(rounds) if start[s] > tl.send_ns[s, j]]
            bars = [(start[s] / scale, (tl.arrive_ns[s, j] - start[s]) / scale)
                    for s in range(rounds)]
            # A white edge between messages and the round's number on each: a link's rounds
            # follow each other without a gap, and would otherwise merge into one bar.
            edge = "C3" if slow and slow[0] == j else "white"
            sc["bars"].append(line.broken_barh(bars, (j - 0.38, 0.76), edgecolors=edge,
                                               linewidth=1.5))
            for s, (x0, width) in enumerate(bars):
                line.text(x0 + width / 2, j, str(s + 1), ha="center", va="center",
                          fontsize=7 if rounds <= 14 else 5, color="0.1")
        sc["now"] = line.axvline(0, color="k", lw=1)
        sc["now_text"] = line.text(0, -0.68, "", fontsize=8, va="top")
        handles = [line.plot([], [], "s", color="C0", label="reduce-scatter")[0],
                   line.plot([], [], "s", color="C2", label="all-gather")[0]]
        if waits:
            y, x0, x1 = zip(*waits)
            handles.append(line.hlines(y, x0, x1, color="0.45", lw=1.5,
                                       label="queued behind the previous message"))
        if slow:
            end = self.baseline.total_ns / scale
            handles.append(line.axvline(end, color="0.5", ls="--", lw=1,
                                        label=f"end without the slow link ({end:.3g} ms)"))
            handles.append(line.plot([], [], "s", mfc="none", mec="C3",
                                     label=f"slow link {slow[0]} → {slow[1]}")[0])
        line.set_yticks(range(p), [f"{j} → {(j + 1) % p}" for j in range(p)])
        line.set(ylim=(p + 0.1 + 0.3 * len(handles), -0.7), xlim=(0, tl.total_ns / scale * 1.02),
                 xlabel="time (ms)", ylabel="link",
                 title="when each message is on its way (numbers: rounds)")
        line.xaxis.set_major_locator(MaxNLocator(6))
        line.legend(handles=handles, fontsize=8, loc="lower right")
        sc["config"] = self._config

    def _draw(self, fig, sc: dict[str, Any]) -> None:
        if sc["config"] != self._config:
            self._build_scene(sc)
        p, k, tl = self.p, self.step, self.timeline
        rounds = 2 * (p - 1)
        phase = "start" if k == 0 else f"after round {k}/{rounds} ({self._phase(k - 1)})"
        sc["title"].set_text(f"ring all-reduce on {p} ranks: {phase}")

        # Left: who holds what. Blue = partial sums (darker = more contributions), green =
        # complete; orange outlines = the chunks the next round sends.
        from matplotlib import colormaps

        blues = colormaps["Blues"]
        rgb = np.array([[blues(0.15 + 0.6 * (c - 1) / max(1, p - 1)) if c < p else
                         (0.55, 0.8, 0.55, 1.0) for c in row] for row in self.counts])
        sc["image"].set_data(rgb)
        for r in range(p):
            for c in range(p):
                n = self.counts[r, c]
                sc["cells"][r][c].set_text("✓" if n == p else f"{n}/{p}")
        sent = chunk_sent(p, k) if k < rounds else None
        for r, outline in enumerate(sc["outlines"]):
            outline.set_visible(sent is not None)
            if sent is not None:
                outline.set_x(sent[r] - 0.5)
        sc["grid"].set_title(f"next: rank r sends the outlined chunk to rank r+1 "
                             f"({self._phase(k)})" if sent is not None else "complete",
                             fontsize=9)

        # Right: one bar per message, while its link carries it (a grey line before it: the
        # message waited behind the previous one); rounds already played are solid.
        colors = [(("C0" if s < p - 1 else "C2"), 1.0 if s < k else 0.22) for s in range(rounds)]
        for bars in sc["bars"]:
            bars.set_facecolor(colors)
        now = tl.ready_ns[k - 1].max() / 1e6 if k > 0 else 0.0
        sc["now"].set_xdata([now, now])
        sc["now"].set_visible(k > 0)
        sc["now_text"].set_x(now)
        sc["now_text"].set_text(f" {now:.3g} ms" if k > 0 else "")

def _rect(x: int, y: int, color: str):
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor=color, linewidth=2.5)


def ring_stepper(p: int = 4, slow_link: int | tuple[int, int] | None = None,
                 **kwargs: Any) -> RingStepper:
    """A RingStepper on p ranks, link slow_link -> slow_link + 1 slowed down."""
    return RingStepper(p, slow_link, **kwargs)
