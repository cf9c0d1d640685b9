"""The throughput explorer's simulations: how many steps fit the time an update may take,
and the runs too slow for an update, in the background.

`SimBudget` estimates a simulation's wall time from counts of rounds, messages and delay
draws (`sim_seconds_per_step`), corrected by what the last runs really took, and decides:
simulate inside the update, in the background, or not at all. `BackgroundSimulator` runs
one background simulation at a time, in a forked process that a newer request kills.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import multiprocessing as mp
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..sim import SimResult, simulate_training
from ..step_model import TrainingSetup
from ..wire import segment_count

# How long the simulator may take inside one update, and beyond it (in the background), and
# for a static figure (nbval, a terminal), where nothing can be drawn later.
SYNC_SIM_BUDGET_S = 0.05
MIN_SIM_STEPS, MAX_SIM_STEPS = 5, 20
ASYNC_SIM_TARGET_S, MAX_ASYNC_SIM_S = 3.0, 30.0
STATIC_SIM_TARGET_S, STATIC_SIM_MAX_S = 1.0, 10.0

# Seconds per unit of simulator work, measured on a loaded 2-core machine; the explorer
# rescales them by what it measures (see SimBudget).
_COST_FAST_DRAW = 5e-9  # one delay draw in the compiled ring kernel
_COST_ROUND = 50e-6  # one round through schedule.play (numpy call overheads)
_COST_MESSAGE = 0.2e-6
_COST_RATE_MESSAGE = 1e-6  # a message through a rate-limited NIC queue (tail bookkeeping)
_COST_DRAW = 40e-9  # one segment's delay, loss and serialisation in schedule.play
_COST_BUCKET = 20e-6


def sim_seconds_per_step(setup: TrainingSetup) -> float:
    """Rough wall time of one simulated step: counts of rounds, messages and delay draws."""
    nodes, ppn = setup.nodes, setup.procs_per_node
    p = nodes * ppn
    buckets = setup.buckets
    if p == 1:
        return _COST_BUCKET * (1 + len(buckets))
    spec = setup.spec
    rate = bool(spec.rate_bps)
    total = 0.0
    lg = max(1, (p - 1).bit_length())
    for n in buckets:
        total += _COST_BUCKET
        if setup.algorithm == "ring" and ppn == 1:  # the compiled fast path
            total += 2 * (p - 1) * p * segment_count(n / p) * _COST_FAST_DRAW
            continue
        if setup.algorithm == "ring":
            shapes = [(2 * (p - 1), p, nodes, segment_count(n / p))]
        elif setup.algorithm == "hierarchical":
            lg_ppn = (ppn - 1).bit_length()
            shapes = [(2 * lg_ppn, p, 0, 0),
                      (2 * (nodes - 1), nodes, nodes, segment_count(n / nodes))]
        elif setup.algorithm == "tree":
            shapes = [(2 * lg, p // 2, p // 2, segment_count(n))]
        elif setup.algorithm == "rabenseifner":
            shapes = [(2 * lg, p, p, max(1, segment_count(n) // lg))]
        else:
            shapes = [(lg, p, p, segment_count(n))]
        for rounds, messages, inter, segs in shapes:
            per_round = (_COST_ROUND + messages * _COST_MESSAGE
                         + inter * (_COST_RATE_MESSAGE if rate else 0) + inter * segs * _COST_DRAW)
            total += rounds * per_round
    return total


@dataclass
class SimBudget:
    """Decides how many steps to simulate, and whether inside the update or in the background.

    `scale` corrects the cost estimate by what the last runs really took (this machine, its
    load), so the budget holds on a fast laptop and on a busy 2-core VM alike.
    """

    sync_s: float = SYNC_SIM_BUDGET_S
    scale: float = 1.0

    def plan(self, setup: TrainingSetup, static: bool = False) -> tuple[str, int, float]:
        """("sync" | "async" | "skip", steps, estimated seconds of the whole run).

        static: for a figure without widgets, where nothing can arrive later: simulate
        inside the call unless that would take longer than STATIC_SIM_MAX_S.
        """
        per_step = max(sim_seconds_per_step(setup) * self.scale, 1e-6)
        if static:
            steps = int(min(MAX_SIM_STEPS, max(3, STATIC_SIM_TARGET_S // per_step)))
            if steps * per_step > STATIC_SIM_MAX_S:
                return "skip", 0, 3 * per_step
            return "sync", steps, steps * per_step
        steps = int(self.sync_s / per_step)
        if steps >= MIN_SIM_STEPS:
            steps = min(steps, MAX_SIM_STEPS)
            return "sync", steps, steps * per_step
        if 3 * per_step > MAX_ASYNC_SIM_S:
            return "skip", 0, 3 * per_step
        steps = int(min(10, max(3, ASYNC_SIM_TARGET_S // per_step)))
        return "async", steps, steps * per_step

    def learn(self, setup: TrainingSetup, steps: int, seconds: float) -> None:
        estimate = sim_seconds_per_step(setup) * steps
        if estimate > 0.01:  # tiny runs are all overhead; they would teach noise
            ratio = seconds / estimate
            self.scale = float(np.clip(math.sqrt(self.scale * ratio), 0.1, 10.0))


@functools.cache
def _warm_up() -> None:
    """Load the simulator's compiled ring kernel in this process, once, before forking:
    a child that had to load it from numba's cache would spend ~1 s on it, every time."""
    simulate_training(2, nic="delay 1us 1us", model_bytes=1024, steps=1)


def _simulate_in_child(conn: Any, kwargs: dict[str, Any]) -> None:
    """Entry point of a forked simulation process: run, send the result back, exit."""
    if sys.platform.startswith("linux"):  # die with the kernel, like the cluster's ranks
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    try:
        conn.send(run_simulation(kwargs))
    finally:
        conn.close()


def run_simulation(kwargs: dict[str, Any]) -> tuple[str, Any]:
    """("ok", simulate_training(**kwargs)) or ("error", what went wrong), never raising: under
    heavy loss a segment can lose all its `wire.MAX_RETRANSMISSIONS` retransmissions, which
    TCP would not survive either."""
    try:
        return "ok", simulate_training(**kwargs)
    except Exception as exc:  # noqa: BLE001 - reported to the widget
        return "error", f"{type(exc).__name__}: {exc}"


class BackgroundSimulator:
    """Runs the simulations too slow for an update, one at a time; a new one replaces it.

    On Linux each runs in a forked child process, which is killed as soon as the learner
    asks for another setup: a stale simulation costs nothing more, and seconds of numpy
    work in a thread would hold the GIL and make the widget lag. Elsewhere (no cheap fork)
    it runs on a thread and a stale result is simply dropped.
    """

    def __init__(self, use_process: bool | None = None) -> None:
        self.use_process = sys.platform.startswith("linux") if use_process is None \
            else use_process
        self._lock = threading.Lock()
        self._generation = 0
        self._proc: Any = None
        self._watchers: list[threading.Thread] = []

    def submit(self, kwargs: dict[str, Any],
               done: Callable[[SimResult | None, str | None, float], None]) -> None:
        """Start simulate_training(**kwargs); later done(result, error, seconds), unless a
        newer submit() or cancel() came first."""
        with self._lock:
            self._generation += 1
            generation = self._generation
            self._kill()
            if self.use_process:
                _warm_up()
                ctx = mp.get_context("fork")
                receiver, sender = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_simulate_in_child, args=(sender, kwargs),
                                   name="clusterlab-sim", daemon=True)
                proc.start()
                sender.close()
                self._proc = proc
                work = functools.partial(self._watch, proc, receiver)
            else:
                work = functools.partial(run_simulation, kwargs)
            watcher = threading.Thread(target=self._finish, args=(work, generation, done),
                                       name="clusterlab-sim-watch", daemon=True)
            self._watchers = [w for w in self._watchers if w.is_alive()] + [watcher]
            watcher.start()

    def _watch(self, proc: Any, receiver: Any) -> tuple[str, Any] | None:
        try:
            reply = receiver.recv()
        except (EOFError, OSError):  # killed: a newer request replaced it
            reply = None
        finally:
            receiver.close()
            proc.join()
        with self._lock:
            if self._proc is proc:
                self._proc = None
        return reply

    def _finish(self, work: Callable[[], Any], generation: int,
                done: Callable[[SimResult | None, str | None, float], None]) -> None:
        t0 = time.perf_counter()
        reply = work()
        if generation != self._generation:  # superseded (and killed, if it was a process)
            return
        kind, payload = reply or ("error", "the simulation process died without a result")
        seconds = time.perf_counter() - t0
        done(payload if kind == "ok" else None, payload if kind == "error" else None, seconds)

    def _kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()  # its watcher sees the pipe close, then reaps it

    @property
    def busy(self) -> bool:
        return any(w.is_alive() for w in self._watchers)

    def cancel(self) -> None:
        """Forget the running simulation (and kill its process)."""
        with self._lock:
            self._generation += 1
            self._kill()

    def wait(self, timeout: float = 60.0) -> bool:
        """Block until no simulation is running and its result has been handled."""
        deadline = time.monotonic() + timeout
        for watcher in list(self._watchers):
            watcher.join(max(0.0, deadline - time.monotonic()))
        return not any(w.is_alive() for w in self._watchers)
