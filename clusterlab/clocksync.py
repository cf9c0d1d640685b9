"""Clock offsets between hosts, so that the "netem" backend runs across machines.

The backend stamps every message with the absolute time at which its receiver may see it,
so all ranks must read one clock (`clusterlab.clock.monotonic_ns`, the common clock: rank
0's CLOCK_MONOTONIC). Processes that share a kernel share CLOCK_MONOTONIC exactly (same boot
id, same time namespace): they need nothing. Every other process estimates its offset to
rank 0 when the default process group is created, NTP-style:

    client t1 --request--> server t2, t3 --reply--> client t4

The true offset (server minus client) lies in [t3 - t4, t2 - t1] for every exchange: the
request arrived after t1 and by t2, the reply left after t3 and arrived by t4. The estimate
is the middle of the intersection of those intervals over EXCHANGES exchanges (the tightest
are those with the smallest round trips, as NTP keeps its minimum-delay samples), and its
uncertainty is half the intersection's width: a bound, not a standard deviation, that holds
whatever the network and the scheduler did (it assumes only that the clocks did not drift
apart within one burst of exchanges, a few milliseconds).

Over a long job the clocks drift apart (a quartz oscillator is off by up to tens of ppm;
NTP slews each host's clock on its own). A thread re-estimates the offset every
CLUSTERLAB_CLOCK_RESYNC_S seconds (default 30; 0: never) and fits the drift rate over the
recent estimates, so the correction follows the drift between estimates too.

The exchanges run over a Gloo process group of their own (created only when the group
spans several clocks), served by one thread on rank 0. Each process on another clock
estimates for itself, so two processes of one host may differ by a few microseconds (their
estimates' errors), far below the delays emulated across hosts.

Test-only variables stand in for a second host on one machine: CLUSTERLAB_TEST_CLOCK_SKEW_S
and CLUSTERLAB_TEST_CLOCK_DRIFT_PPM shift a process's raw clock (`clusterlab.clock`), and
CLUSTERLAB_TEST_HOST_ID gives a process another host's identity (no shared files).

Shared files: the backend shares some state between the processes of a host through files
(the collectives' entry table, the NIC queue tails of emulated nodes with several
processes). `Placement` says which ranks run on which host (hostname and boot id), so that
those files are used only among processes that can share them; across hosts the backend
exchanges that state through Gloo instead (see `clusterlab.backend`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
import warnings
from collections import deque
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from . import clock

EXCHANGES = 32  # four-timestamp exchanges per estimate
RESYNC_VARIABLE = "CLUSTERLAB_CLOCK_RESYNC_S"
DEFAULT_RESYNC_S = 30.0
HOST_VARIABLE = "CLUSTERLAB_TEST_HOST_ID"  # test only: pretend to be another host
WARN_UNCERTAINTY_NS = 100_000  # a first estimate looser than this warns
_RATE_WINDOW = 8  # estimates the drift rate is fitted over
RATE_SIGNIFICANCE = 2.0  # standard errors a fitted drift rate must clear to be used
_BYE = 1  # request flag: this client stops
_TAG = 0


@dataclass(frozen=True)
class Estimate:
    """One offset estimate: rank 0's clock minus this process's raw clock (ns)."""

    offset_ns: int
    uncertainty_ns: int  # the true offset is within +- this (half the intervals' overlap)
    min_rtt_ns: int  # the smallest round trip among the exchanges
    samples: int
    at_raw_ns: int  # when (this process's raw clock)


def estimate(t1, t2, t3, t4) -> Estimate:
    """The offset that exchanges (t1, t2, t3, t4) (ns; t1, t4 on this process's raw clock,
    t2, t3 on the reference's) imply: the middle of the intersection of [t3 - t4, t2 - t1].

    If the intervals do not overlap (a clock stepped within the burst), the middle of the
    minimum-round-trip exchange's own interval, with that exchange's half round trip."""
    t1, t2, t3, t4 = (np.asarray(t, dtype=np.int64) for t in (t1, t2, t3, t4))
    if not (t1.size and t1.size == t2.size == t3.size == t4.size):
        raise ValueError(f"estimate needs equal, non-empty timestamp arrays, got sizes "
                         f"{t1.size}, {t2.size}, {t3.size}, {t4.size}")
    low, high = t3 - t4, t2 - t1
    rtt = (t4 - t1) - (t3 - t2)
    lo, hi = int(low.max()), int(high.min())
    if lo > hi:
        best = int(np.argmin(rtt))
        lo, hi = int(low[best]), int(high[best])
    return Estimate(offset_ns=(lo + hi) // 2, uncertainty_ns=(hi - lo + 1) // 2,
                    min_rtt_ns=int(rtt.min()), samples=int(t1.size), at_raw_ns=int(t4[-1]))


def drift_rate(estimates: list[Estimate]) -> float:
    """The drift rate (ns per ns) that `estimates` show, or 0.0 where they cannot tell it
    from their own errors.

    A weighted least-squares line through the offsets, each weighted by its bound (an error
    uniform within +-u has variance u^2/3). Estimates a second apart, each known to +-80 us
    (two hosts' processes on a busy machine), would otherwise fit a rate of tens of ppm out
    of noise alone and extrapolate it into every delay until the next estimate; a rate is
    used only when it is at least RATE_SIGNIFICANCE standard errors from zero."""
    if len(estimates) < 2:
        return 0.0
    t = np.array([e.at_raw_ns for e in estimates], dtype=np.float64)
    o = np.array([e.offset_ns for e in estimates], dtype=np.float64)
    var = np.array([max(e.uncertainty_ns, 1_000) ** 2 / 3 for e in estimates])
    w = 1.0 / var
    t -= np.sum(w * t) / np.sum(w)
    spread = np.sum(w * t * t)
    if spread <= 0:
        return 0.0
    rate = float(np.sum(w * t * (o - np.sum(w * o) / np.sum(w))) / spread)
    return rate if abs(rate) >= RATE_SIGNIFICANCE / np.sqrt(spread) else 0.0


def host_key() -> str:
    """This host: hostname and boot id (or CLUSTERLAB_TEST_HOST_ID, in tests)."""
    return os.environ.get(HOST_VARIABLE) or f"{socket.gethostname()}/{_boot_id()}"


def clock_key() -> str:
    """Processes with the same key read the same CLOCK_MONOTONIC: one kernel (boot id) and
    one time namespace (which can offset CLOCK_MONOTONIC), and the same test skew."""
    timens = ""
    with contextlib.suppress(OSError), open("/proc/self/timens_offsets") as f:
        timens = " ".join(f.read().split())
    return f"{_boot_id()}/{timens}/{clock.test_skew()}"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:  # not Linux: a host is its hostname
        return socket.gethostname()


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little",
                          signed=True)


@dataclass(frozen=True)
class Placement:
    """Where the ranks of one process group run: per group rank, a host id, a clock id and
    the process id."""

    hosts: tuple[int, ...]
    clocks: tuple[int, ...]
    pids: tuple[int, ...]

    @property
    def one_host(self) -> bool:
        """Do all ranks run on one host (and can share files)?"""
        return len(set(self.hosts)) == 1

    @property
    def host_count(self) -> int:
        return len(set(self.hosts))

    def owner_pid(self, rank: int) -> int:
        """The pid of the lowest rank on `rank`'s host: it names that host's shared files,
        so that a later Cluster start on that host sweeps them once that process is gone."""
        return self.pids[self.hosts.index(self.hosts[rank])]

    def check_nodes(self, node_of) -> None:
        """ValueError unless the ranks of every emulated node (`node_of[rank]`) run on one
        host: an emulated node's NIC queue is shared through a file."""
        where: dict[int, set[int]] = {}
        for rank, node in enumerate(node_of):
            where.setdefault(node, set()).add(self.hosts[rank])
        split = [node for node, hosts in where.items() if len(hosts) > 1]
        if split:
            node = split[0]
            ranks = [r for r, n in enumerate(node_of) if n == node]
            raise ValueError(
                f"CLUSTERLAB_PROCS_PER_NODE puts ranks {ranks} on emulated node {node}, but "
                f"they run on {len(where[node])} hosts; set it to the processes per host "
                f"(torchrun's --nproc-per-node)")


def placement(gloo, rank: int, size: int) -> Placement:
    """Every rank's host, clock and pid (one Gloo all-gather over `gloo`)."""
    import torch

    mine = torch.tensor([_hash(host_key()), _hash(clock_key()), os.getpid()],
                        dtype=torch.int64)
    if size == 1:
        rows = mine.reshape(1, 3)
    else:
        out = [torch.zeros(3, dtype=torch.int64) for _ in range(size)]
        gloo.allgather([out], [mine]).wait()
        rows = torch.stack(out)
    hosts, clocks, pids = (tuple(int(v) for v in rows[:, i]) for i in range(3))
    return Placement(hosts=hosts, clocks=clocks, pids=pids)


class ClockSync:
    """This process's part in keeping the group on rank 0's clock: rank 0 serves the
    exchanges, every rank on another clock estimates its offset (now, then every
    `resync_s`). `close()` stops both."""

    def __init__(self, store, rank: int, size: int, where: Placement, timeout: timedelta,
                 *, resync_s: float | None = None) -> None:
        import torch.distributed as dist

        self.rank, self.where = rank, where
        self.clients = [r for r in range(size) if where.clocks[r] != where.clocks[0]]
        self.estimates: deque[Estimate] = deque(maxlen=_RATE_WINDOW)
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if resync_s is None:
            resync_s = _resync_from_env()
        # Gloo's receives give up after the group's timeout: the server must hear from every
        # client well within it.
        self.resync_s = min(resync_s, timeout.total_seconds() / 3) if resync_s else 0.0
        if not self.clients:
            self.pg = None
            return
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore("clusterlab-clock", store), rank, size,
                                        timeout)
        if rank == 0:
            self._thread = threading.Thread(target=self._serve, name="netem-clock-server",
                                            daemon=True)
            self._thread.start()
        elif rank in self.clients:
            est = self.measure()
            self._apply(est)
            if est.uncertainty_ns > WARN_UNCERTAINTY_NS:
                warnings.warn(
                    f"netem: rank {rank}'s clock offset to rank 0 is known only within "
                    f"+-{est.uncertainty_ns / 1e3:.0f} us (smallest round trip "
                    f"{est.min_rtt_ns / 1e3:.0f} us): emulated delays between hosts may be off "
                    f"by as much", RuntimeWarning, stacklevel=2)
            if self.resync_s:
                self._thread = threading.Thread(target=self._resync_loop,
                                                name="netem-clock-resync", daemon=True)
                self._thread.start()

    # --- rank 0 ------------------------------------------------------------------------------

    def _serve(self) -> None:
        import torch

        clients = set(self.clients)
        request = torch.zeros(2, dtype=torch.int64)
        reply = torch.zeros(2, dtype=torch.int64)
        stamps = reply.numpy()
        try:
            while clients:
                work = self.pg.recv_anysource([request], _TAG)
                work.wait()
                stamps[0] = clock.monotonic_ns()
                source = work._source_rank()
                if int(request[1]) == _BYE:
                    clients.discard(source)
                    continue
                stamps[1] = clock.monotonic_ns()
                self.pg.send([reply], source, _TAG).wait()
        except Exception as exc:  # noqa: BLE001 - a client died or the group went down
            self.last_error = f"clock server stopped: {exc}"

    # --- every rank on another clock ---------------------------------------------------------

    def measure(self, exchanges: int = EXCHANGES) -> Estimate:
        """Run `exchanges` four-timestamp exchanges with rank 0 and estimate the offset."""
        import torch

        stamps = np.zeros((exchanges, 4), dtype=np.int64)
        request = torch.zeros(2, dtype=torch.int64)
        reply = torch.zeros(2, dtype=torch.int64)
        sent = request.numpy()
        for i in range(exchanges):
            answer = self.pg.recv([reply], 0, _TAG)  # posted first: the reply never waits
            t1 = clock.raw_ns()
            sent[0] = t1
            work = self.pg.send([request], 0, _TAG)
            answer.wait()
            t4 = clock.raw_ns()
            work.wait()
            stamps[i] = (t1, int(reply[0]), int(reply[1]), t4)
        return estimate(*stamps.T)

    def _apply(self, est: Estimate) -> None:
        """Correct the clock to `est`, with the drift rate fitted over recent estimates."""
        self.estimates.append(est)
        rate = drift_rate(list(self.estimates))
        clock.set_correction(clock.Correction(offset_ns=est.offset_ns, anchor_ns=est.at_raw_ns,
                                              rate=rate, uncertainty_ns=est.uncertainty_ns))

    def _resync_loop(self) -> None:
        while not self._stop.wait(self.resync_s):
            try:
                est = self.measure()
            except Exception as exc:  # noqa: BLE001 - keep the last correction
                self.last_error = f"clock re-estimate failed: {exc}"
                return
            best = min(e.uncertainty_ns for e in self.estimates)
            # A burst on a busy machine can be much looser than the first: keep extrapolating
            # the current correction rather than take a worse one.
            if est.uncertainty_ns <= max(2 * best, 50_000):
                self._apply(est)

    def status(self) -> dict:
        """What this process knows about its clock: offset, uncertainty, drift rate."""
        corr = clock.correction() if self.rank in self.clients else None
        last = self.estimates[-1] if self.estimates else None
        return {
            "rank": self.rank, "clients": list(self.clients), "reference": self.rank == 0
            or self.rank not in self.clients,
            "offset_ns": corr.at(clock.raw_ns()) if corr else 0,
            "uncertainty_ns": last.uncertainty_ns if last else 0,
            "min_rtt_ns": last.min_rtt_ns if last else 0,
            "rate_ppm": corr.rate * 1e6 if corr else 0.0,
            # Since the applied estimate: its bound grows by |true rate - fitted rate| * age.
            "age_ns": clock.raw_ns() - corr.anchor_ns if corr else 0,
            "estimates": len(self.estimates), "resync_s": self.resync_s,
            "last_error": self.last_error,
        }

    def close(self) -> None:
        """Stop re-estimating; tell rank 0 (whose server then ends); wait a little for it."""
        if self.pg is None:
            return
        self._stop.set()
        if self.rank in self.clients:
            if self._thread is not None:
                self._thread.join(timeout=5.0)
            import torch

            with contextlib.suppress(Exception):
                self.pg.send([torch.tensor([0, _BYE], dtype=torch.int64)], 0, _TAG).wait()
        elif self._thread is not None:
            self._thread.join(timeout=2.0)


def _resync_from_env() -> float:
    text = os.environ.get(RESYNC_VARIABLE)
    if not text:
        return DEFAULT_RESYNC_S
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{RESYNC_VARIABLE} must be seconds (0: never), got {text!r}") from None
    if not value >= 0:
        raise ValueError(f"{RESYNC_VARIABLE} must be >= 0, got {text!r}")
    return value


_current: ClockSync | None = None  # this process's, from its default group


def status() -> dict:
    """This process's clock: its offset to rank 0 (ns, 0 on rank 0's clock), the bound on
    that estimate's error, the fitted drift rate, how many estimates were made."""
    if _current is None:
        return {"reference": True, "offset_ns": 0, "uncertainty_ns": 0, "rate_ppm": 0.0,
                "age_ns": 0, "estimates": 0, "clients": [], "last_error": None}
    return _current.status()


def synchronize(store, gloo, rank: int, size: int, timeout: timedelta, *, default_group: bool
                ) -> tuple[Placement, ClockSync | None]:
    """At process-group creation: where the ranks run, and (for the default group) put this
    process on rank 0's clock. Every rank of the group calls it."""
    global _current
    skew_s, drift_ppm = clock.skew_from_env(rank)
    if default_group:
        clock.apply_test_skew(skew_s, drift_ppm)
    where = placement(gloo, rank, size)
    if not default_group or len(set(where.clocks)) == 1:
        if default_group:
            clock.set_correction(None)  # this process reads rank 0's clock itself
            _current = None
        return where, None
    if where.clocks[rank] == where.clocks[0]:
        clock.set_correction(None)  # rank 0's clock itself (an earlier job's correction goes)
    _current = ClockSync(store, rank, size, where, timeout)
    return where, _current
