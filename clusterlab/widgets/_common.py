"""What every explorer shares: front-end detection, debouncing, figures in an Output widget,
and background runs of real clusters that can be cancelled.

Kept small on purpose: each explorer reads top to bottom in its own file; this one holds
only the plumbing that would otherwise be written three times.
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..cluster import Cluster

STATIC_ENV = "CLUSTERLAB_STATIC"  # set to 1 to force static figures (nbval, nbconvert, CI)


def frontend_available() -> bool:
    """True when widgets can be shown: an IPython kernel that talks to a front-end over comms.

    A terminal, a plain script or pytest has no kernel; `CLUSTERLAB_STATIC=1` forces the
    static path even inside a kernel (nbval and nbconvert run a kernel with no one to look at
    the widgets).
    """
    if os.environ.get(STATIC_ENV, "").strip() not in ("", "0"):
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    kernel = getattr(shell, "kernel", None) if shell is not None else None
    return kernel is not None and hasattr(kernel, "comm_manager")


def new_figure(width: float, height: float, dpi: int = 100) -> Figure:
    """A Figure outside pyplot's registry, with an Agg canvas.

    Outside pyplot so that the inline backend does not show it a second time at the end of
    the cell, and so that it can be redrawn from a timer thread.
    """
    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def figure_png(fig: Figure) -> bytes:
    """Render the figure once and encode it as PNG (fast, lightly compressed).

    `savefig` would render a second time; encoding the canvas buffer with Pillow directly
    costs ~10 ms, the rendering itself is what the explorers keep cheap.
    """
    from PIL import Image

    fig.canvas.draw()
    width, height = fig.canvas.get_width_height(physical=True)
    image = Image.frombuffer("RGBA", (width, height), fig.canvas.buffer_rgba(), "raw", "RGBA",
                             0, 1)
    out = io.BytesIO()
    image.save(out, format="png", compress_level=1)
    return out.getvalue()


def show_png(output: Any, png: bytes, alt: str) -> None:
    """Replace what an ipywidgets Output shows by one PNG image, in a single state update.

    Setting `outputs` (instead of clear_output + display) does not flicker and is safe from
    the debounce timer's thread, where the Output context manager would capture nothing.
    """
    output.outputs = (
        {
            "output_type": "display_data",
            "data": {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": alt},
            "metadata": {},
        },
    )


class Debouncer:
    """Run `fn` once, `delay_s` after the last call to `trigger()` in a burst of calls.

    Why: a dragged slider fires dozens of change events per second; recomputing for each
    would queue seconds of work behind the mouse. If `fn` is still running when the timer
    fires again, one more run follows it (never more than one waits).
    """

    def __init__(self, fn: Callable[[], None], delay_s: float = 0.15) -> None:
        self._fn = fn
        self.delay_s = delay_s
        self.runs = 0  # how many times fn ran (the tests count them)
        self._lock = threading.Lock()
        self._generation = 0
        self._timer: threading.Timer | None = None
        self._running = False
        self._again = False
        self._idle = threading.Event()
        self._idle.set()

    def trigger(self) -> None:
        """(Re)start the countdown; only the last trigger of a burst leads to a run."""
        with self._lock:
            self._generation += 1
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self.delay_s, self._fire, args=(self._generation,))
            self._timer.daemon = True
            self._idle.clear()
            self._timer.start()

    def _fire(self, generation: int) -> None:
        with self._lock:
            if generation != self._generation:  # a later trigger superseded this timer
                return
            self._timer = None
            if self._running:
                self._again = True
                return
            self._running = True
        while True:
            try:
                self._fn()
            finally:
                self.runs += 1
                with self._lock:
                    again, self._again = self._again, False
                    if not again:
                        self._running = False
                        if self._timer is None:
                            self._idle.set()
            if not again:
                return

    def wait(self, timeout: float = 10.0) -> bool:
        """Block until no run is pending or running; False on timeout."""
        return self._idle.wait(timeout)

    def cancel(self) -> None:
        """Forget a pending run (a running one finishes)."""
        with self._lock:
            self._generation += 1
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if not self._running:
                self._idle.set()


class Cancelled(Exception):
    """Raised inside a background job when the user pressed Cancel."""


class BackgroundRun:
    """A real-cluster job on a worker thread, which the widget thread can cancel.

    The job opens its cluster with `with run.cluster(...) as cl:` so that `cancel()` can
    reach it: closing a Cluster stops its ranks (politely, then SIGTERM and SIGKILL), which
    also ends a collective in progress. `cancel()` then waits for the worker, so when it
    returns, no rank process is left. Between steps the job calls `run.check()`, which
    raises `Cancelled` once cancel was asked for.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._cluster: Cluster | None = None
        self.error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def start(self, job: Callable[[BackgroundRun], None], name: str = "clusterlab-run") -> None:
        """Run job(self) on a new daemon thread (one job at a time)."""
        if self.running:
            raise RuntimeError("a run is already in progress; cancel it first")
        self._cancel.clear()
        self.error = None

        def main() -> None:
            try:
                job(self)
            except Cancelled:
                pass
            except BaseException as exc:  # noqa: BLE001 - kept for the widget to show
                if not self._cancel.is_set():  # errors caused by our own close() are noise
                    self.error = exc

        self._thread = threading.Thread(target=main, name=name, daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raise Cancelled if cancel() was called; jobs call this between steps."""
        if self._cancel.is_set():
            raise Cancelled()

    @contextlib.contextmanager
    def cluster(self, **kwargs: Any) -> Iterator[Cluster]:
        """Start a Cluster that cancel() can close; it is always closed on the way out."""
        self.check()
        cl = Cluster(**kwargs)
        with self._lock:
            self._cluster = cl
        try:
            self.check()  # cancel() may have come while the Cluster was being built
            cl.start()
            yield cl
        finally:
            with self._lock:
                self._cluster = None
            cl.close()

    def cancel(self, timeout: float = 20.0) -> bool:
        """Ask the job to stop, kill its cluster's ranks, wait for the worker; True if done."""
        self._cancel.set()
        with self._lock:
            cl = self._cluster
        if cl is not None:
            with contextlib.suppress(Exception):
                cl.close()  # from this thread: the worker's blocked run() then fails fast
        return self.join(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the worker thread; True when it has finished (or never started)."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running


class Explorer:
    """Base of the explorers: widgets when a front-end is there, a static figure otherwise.

    A subclass builds `self.widget` (its controls around `self.out`) and implements
    `_compute()` (the numbers for the current settings), `_make_axes(fig)` (the axes and
    every artist, created once: a dict called the scene) and `_draw(fig, scene)` (moves the
    artists to the current numbers). Updating artists instead of redrawing axes from scratch
    is what keeps a slider under 200 ms: most of matplotlib's time goes into creating ticks
    and text. Then:

    * `update()`: compute and redraw now (what the debounced sliders call);
    * `show()`: display the widgets, or, without a front-end, return the static Figure;
    * `figure()`: a fresh pyplot Figure for the current settings, widgets or not.
    """

    figsize: tuple[float, float] = (10.0, 6.5)

    def __init__(self, debounce_s: float = 0.15) -> None:
        import ipywidgets as widgets

        self._lock = threading.RLock()  # one compute/draw at a time (timer vs. worker)
        self._static = False  # True while figure() computes: no background work then
        self.debouncer = Debouncer(self.update, debounce_s)
        self.out = widgets.Output()
        self.error_box = widgets.HTML()
        self.fig = new_figure(*self.figsize)
        self._axes: dict[str, Any] = {}
        self.widget: Any = None
        self.last_update_s: float | None = None  # wall time of the last update()
        self.last_error: BaseException | None = None
        self.png = b""  # what the Output shows now

    def _build_axes(self) -> None:
        self._axes = self._make_axes(self.fig)  # the widget figure's scene

    # --- what subclasses implement ------------------------------------------------------------

    def _compute(self) -> None:
        raise NotImplementedError

    def _make_axes(self, fig: Figure) -> dict[str, Any]:
        raise NotImplementedError

    def _draw(self, fig: Figure, axes: dict[str, Any]) -> None:
        raise NotImplementedError

    def _message(self) -> str:
        """HTML for the error box after a successful update (e.g. a named input error)."""
        return ""

    # --- the common cycle ---------------------------------------------------------------------

    def update(self) -> None:
        """Recompute for the current settings and redraw; errors are shown, not raised."""
        import html

        t0 = time.perf_counter()
        with self._lock:
            try:
                self._compute()
                self._render()
                self.error_box.value = self._message()
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - a callback must not kill the widget
                self.last_error = exc
                self.error_box.value = (f"<span style='color:#b00'><b>{type(exc).__name__}"
                                        f"</b>: {html.escape(str(exc))}</span>")
        self.last_update_s = time.perf_counter() - t0

    def _render(self) -> None:
        """Draw into the widget's figure and put it in the Output (caller holds the lock)."""
        self._draw(self.fig, self._axes)
        self.png = figure_png(self.fig)
        show_png(self.out, self.png, f"<{type(self).__name__} figure>")

    def figure(self) -> Figure:
        """The figure for the current settings, drawn with pyplot (then closed in pyplot, so
        that the inline backend does not show it twice when a cell returns it)."""
        import matplotlib.pyplot as plt

        with self._lock:
            self._static = True
            try:
                self._compute()
            finally:
                self._static = False
            fig = plt.figure(figsize=self.figsize)
            self._draw(fig, self._make_axes(fig))
        plt.close(fig)
        return fig

    def show(self) -> Figure | None:
        """Display the widgets, or return the static Figure where no front-end can show them
        (a terminal, nbval, nbconvert, CLUSTERLAB_STATIC=1)."""
        if not frontend_available():
            return self.figure()
        from IPython.display import display

        if self.last_update_s is None:
            self.update()
        display(self.widget)
        return None

    def _ipython_display_(self) -> None:
        fig = self.show()
        if fig is not None:
            from IPython.display import display

            display(fig)

    def close(self) -> None:
        """Stop pending updates and close the widgets."""
        self.debouncer.cancel()
        if self.widget is not None:
            self.widget.close()


def sync_legend(ax: Any, handles: list[Any], **kwargs: Any) -> None:
    """Show a legend for `handles`, rebuilding it only when the handles change.

    Redrawing is what makes a slider feel slow, and most of it is creating text objects:
    when only a label changed (p50 = 12.3 ms -> 12.5 ms), its text is edited in place.
    """
    labels = [h.get_label() for h in handles]
    key = [id(h) for h in handles]
    legend = ax.get_legend()
    if legend is not None and getattr(legend, "_clusterlab_key", None) == key:
        for text, label in zip(legend.texts, labels):
            if text.get_text() != label:
                text.set_text(label)
        return
    if legend is not None:
        legend.remove()
    if handles:
        legend = ax.legend(handles=handles, labels=labels, **kwargs)
        legend._clusterlab_key = key


def failure_status(exc: BaseException, run: BackgroundRun) -> str:
    """The status line for a real run that ended in `exc`: "cancelled" if the user cancelled
    it (closing its cluster makes the ranks fail), else the error's first line."""
    if run.cancelled:
        return "cancelled"
    return f"<b>{type(exc).__name__}</b>: {html.escape(str(exc).splitlines()[0])}"


@contextlib.contextmanager
def reporting(run: BackgroundRun, status: Any, start_button: Any, cancel_button: Any):
    """Around a real-run job's body: show in `status` how it ended (cancelled, or the
    error's first line; a success sets its own message), then re-enable starting."""
    try:
        yield
    except Cancelled:
        status.value = "cancelled"
    except Exception as exc:  # noqa: BLE001 - shown next to the button
        status.value = failure_status(exc, run)
    finally:
        start_button.disabled, cancel_button.disabled = False, True


def cancel_run(run: BackgroundRun, status: Any, start_button: Any, cancel_button: Any,
               pending: str = "cancelling…") -> None:
    """Stop a real run: its cluster is closed (ranks killed), then the worker joined."""
    done = run.cancel()
    status.value = "cancelled" if done else pending
    start_button.disabled, cancel_button.disabled = not done, done
