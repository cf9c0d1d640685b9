"""The launcher: N real processes on this machine, talking torch.distributed over Gloo.

    with clusterlab.Cluster(nodes=4, nic="delay 2ms 500us") as cl:
        out = cl.run(fn, *args, **kwargs)      # fn runs on every rank; results by rank

Processes start once when the `with` block opens and stay up, so later `run()` calls cost
milliseconds, not a process start. Inside `fn` the default process group is initialised
(backend "netem", or plain "gloo" when there is no impairment configured at all), so `fn`
uses ordinary `torch.distributed` calls. `fn` may be defined in a notebook cell: it is sent
to the ranks with cloudpickle, by value.

Failures never hang and never leak: an exception in a rank comes back naming the rank with
its traceback; a rank that dies is named with its exit code or signal; a timeout names the
ranks still running and the operation each was in (with their Python stacks); Ctrl-C or a
kernel interrupt stops every rank within about a second. Every rank dies with its parent
(PR_SET_PDEATHSIG on Linux), so a kernel restart leaves nothing behind. After a failure the
cluster restarts its processes on the next `run()`.

Start method: "fork" on Linux (about 0.1 s per rank, and nothing needs importing again);
"spawn" elsewhere (macOS, Windows), which works too but each rank imports torch again.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import linecache
import multiprocessing as mp
import numbers
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
import weakref
from collections.abc import Mapping
from datetime import timedelta
from multiprocessing.connection import wait as wait_any

import cloudpickle
import psutil

from . import shaping as kernel_shaping
from .backend import BACKEND_NAME, NetemConfig
from .cores import usable_cores
from .fabric import Fabric, port_kernel
from .netem import Netem
from .schedule import ALLREDUCE_SCHEDULES
from .topology import Topology
from .wire import SEGMENT_BYTES

MAX_WORLD_SIZE = 64  # a guard against typos like nodes=1000: this is one machine
MAX_TIMEOUT = 10**6  # seconds (~11 days); more overflows torch's timeouts
MAX_DILATION = 10**6
MAX_THREADS = 1024
CORRELATIONS = ("netem", "ar1")
# Starting the ranks may take longer than a short `timeout` meant for run() (a loaded
# machine, a slow first import): starting waits at least this long.
START_TIMEOUT = 30.0
_STATUS_BYTES = 160


class ClusterError(RuntimeError):
    """Something went wrong in the ranks of a Cluster (base class)."""


class RankError(ClusterError):
    """A rank raised an exception inside `run()`: carries the rank, what it was doing (the
    launcher's step and the rank's last operation) and its traceback."""

    def __init__(self, rank: int, kind: str, message: str, remote_traceback: str,
                 doing: str = "", *, what: str = "", others: str = "") -> None:
        self.rank, self.kind, self.message = rank, kind, message
        self.remote_traceback, self.doing = remote_traceback, doing
        where = f" while {what}" if what else ""
        if doing and doing != what:
            where += f" (in {doing})"
        others = f"\n{others}" if others else ""
        super().__init__(
            f"rank {rank} raised {kind}{where}: {message}{others}\n"
            f"--- traceback from rank {rank} ---\n{remote_traceback.rstrip()}"
        )


class RankDied(ClusterError):
    """A rank's process ended (crashed, was killed) before answering."""


class ClusterTimeout(ClusterError, TimeoutError):
    """Ranks did not finish within the cluster's timeout."""


def _number_in(name: str, value, limit: float, unit: str) -> None:
    """A finite number in (0, limit], else a ValueError/TypeError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number {unit}, got {value!r}")
    if not 0 < value <= limit:  # also refuses nan
        raise ValueError(f"{name} must be > 0 and <= {limit:g} {unit}, got {value!r}")


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; elsewhere
    nothing). For every process the launcher, or a lab, forks."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _listen_on_loopback(host: str = "127.0.0.1") -> tuple[int, int]:
    """A listening TCP socket on 127.0.0.1 (with shaping="kernel": node 0's address in its
    private namespace) and a free port, for the rendezvous store: torch's
    TCPStore server binds the wildcard address (every interface, no authentication) unless
    it is handed a socket. Returns (port, fd); the store owns the fd from then on."""
    sock = socket.create_server((host, 0))
    return sock.getsockname()[1], sock.detach()


def _rank_main(rank, world, backend, env, conn, status, dump_path, timeout, threads, parent):
    """Entry point of every rank process."""
    die_with_parent()
    if os.getppid() != parent:  # the parent died before we could ask to die with it
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt stops
    # The rank's own environment (Gloo, torch and code in `fn` read WORLD_SIZE & co. there);
    # the backend is handed its settings explicitly below.
    os.environ.update(env)
    # Private to the user (0600, in a 0700 directory); lives as long as the process.
    dump = os.fdopen(os.open(dump_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w")
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)

    global _rank_statuses
    _rank_statuses = status
    doing = ["idle"]  # what the launcher last said this rank does (e.g. "running fn")

    # The backend reports every message and collective: a memoryview copies the bytes in
    # ~0.2 us, where slice-assigning into the ctypes array took ~4 us per call.
    status_view = memoryview(status).cast("B")

    def set_status(text: str) -> None:
        data = text.encode()[: _STATUS_BYTES - 1].ljust(_STATUS_BYTES, b"\0")
        status_view[rank * _STATUS_BYTES : (rank + 1) * _STATUS_BYTES] = data

    def set_doing(text: str) -> None:
        doing[0] = text
        set_status(text)

    def backend_status(text: str) -> None:
        # The backend's "idle" says its collectives are done, not that `fn` is: say `fn`.
        set_status(doing[0] if text == "idle" else text)

    def error(exc: BaseException) -> tuple:  # what the parent turns into a RankError
        return ("error", (type(exc).__name__, str(exc), traceback.format_exc(),
                          _read_status(status, rank)))

    import torch
    import torch.distributed as dist

    from . import backend as netem_backend

    if "TORCH_DISTRIBUTED_DEBUG" in env:  # torch read it when it was imported, before this
        dist.set_debug_level_from_env()

    netem_backend.register()
    netem_backend.configure(env)
    netem_backend.status_hook = backend_status
    torch.set_num_threads(threads)
    try:
        if env.get("CLUSTERLAB_NETNS"):  # shaping="kernel": sockets from now on are the node's
            set_doing("entering its node's network namespace")
            kernel_shaping.enter(env["CLUSTERLAB_NETNS"])
        set_doing("joining the process group")
        store_timeout = max(timeout, START_TIMEOUT)  # joining may be slow on a busy machine
        # Rank 0 hosts the rendezvous store on a free loopback port and tells the parent,
        # which passes it on. (Not the parent: a store's server thread in the parent makes
        # forking it unsafe, and a kernel must stay forkable.)
        host = env["MASTER_ADDR"]
        if rank == 0:
            port, fd = _listen_on_loopback(host)
            store = dist.TCPStore(host, port, world, is_master=True,
                                  timeout=timedelta(seconds=store_timeout),
                                  wait_for_workers=False,
                                  master_listen_fd=fd)
            conn.send(("port", store.port))
        else:
            _, port = conn.recv()
            store = dist.TCPStore(host, port, world, is_master=False,
                                  timeout=timedelta(seconds=store_timeout))
        os.environ["MASTER_PORT"] = str(store.port)
        # Gloo's own timeout is a little longer than the launcher's, so that a hang is
        # reported by the launcher (which names every stuck rank), not as one rank's error.
        dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout + 10))
        set_doing("idle")
        # torch's import leaves ~10^5 objects for the cyclic GC to walk: a full collection
        # then stalls a rank for ~100 ms in the middle of an experiment. Freeze them.
        # (No gc.collect() first: with fork it would walk, and so copy, every object inherited
        # from the parent; a kernel that imported more, e.g. torch._dynamo, made that
        # seconds. Freezing is a list splice.)
        gc.freeze()
        conn.send(("ready", None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then exit
        conn.send(error(exc))
        os._exit(1)
    while True:
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            break
        if kind == "close":
            break
        try:
            fn, args, kwargs = cloudpickle.loads(payload)
            set_doing(f"running {getattr(fn, '__name__', 'fn')}")
            result = fn(*args, **kwargs)
            reply = ("ok", cloudpickle.dumps(result))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
            reply = error(exc)
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result
            conn.send(error(exc))
        # Only now: a parent naming where this rank was (it failed because a peer died) must
        # find either its reply or the operation it was in, never a bare "idle".
        set_doing("idle")
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    os._exit(0)


# Inside a rank process: the status array every rank of its cluster writes (None elsewhere).
_rank_statuses = None


def peer_status(rank: int) -> str:
    """Inside a rank started by a Cluster: what rank `rank` of the same cluster says it is
    doing now, as a timeout report would name it (e.g. "allreduce #3 (16 B)")."""
    if _rank_statuses is None:
        raise RuntimeError("peer_status() works only inside a rank started by a Cluster")
    return _read_status(_rank_statuses, rank)


def _read_status(status, rank: int) -> str:
    """What a rank last said it was doing (its slot of the shared status array)."""
    raw = bytes(status[rank * _STATUS_BYTES : (rank + 1) * _STATUS_BYTES])
    return raw.rstrip(b"\0").decode(errors="replace")


def stop_processes(procs) -> None:
    """Stop processes: SIGTERM, a short grace period, then SIGKILL. Never blocks long."""
    for p in procs:
        if p.is_alive():
            with contextlib.suppress(Exception):
                p.terminate()
    deadline = time.monotonic() + 0.5
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            with contextlib.suppress(Exception):
                p.kill()
    for p in procs:
        p.join(1.0)


class Cluster:
    """N nodes x P processes per node on this machine, with an emulated network between them.

    nic: netem spec (string or `Netem`) applied to every node's egress; None = no impairment.
    intra: netem spec between processes of one node; None = unimpaired.
    links: per-direction overrides {(src_node, dst_node): spec}.
    fabric: the switches behind the NICs (`clusterlab.fabric`: a `LeafSpine`, `RailOptimized`
      or its string form); None = the crossbar.
    seed: seeds every random draw of the network (same seed, same impairment trace).
    timeout: seconds that a `run()` (and any collective) may take before it is an error.
    dilation: run k times slower than the network it stands for (delays x k, rates / k);
      `clusterlab.now()` inside the ranks reports emulated-cluster time.
    algorithm: the all-reduce algorithm the network replays (ring, recursive_doubling,
      rabenseifner, tree, hierarchical).
    trace: keep a sender-side log of every impaired point-to-point message
      (`dist.group.WORLD.trace`: peer, send time, bytes, and the link model's Transmission
      with its packet trace).
    environ: more environment variables for the ranks, e.g. {"TORCH_DISTRIBUTED_DEBUG":
      "DETAIL"} (this process's own environment is never changed).
    shaping: "userspace" (the backend emulates the network) or "kernel" (root only: each
      node in its own network namespace, `nic` applied by the real tc, plain Gloo; see
      `clusterlab.shaping`).
    When nic, intra and links are all None the ranks use plain Gloo (the baseline).
    """

    def __init__(
        self,
        nodes: int = 4,
        *,
        procs_per_node: int = 1,
        nic: str | Netem | None = "delay 2ms 500us",
        intra: str | Netem | None = None,
        seed: int = 0,
        timeout: float = 30,
        dilation: float = 1.0,
        links: dict | str | None = None,
        algorithm: str = "ring",
        segment_bytes: int = SEGMENT_BYTES,
        correlation: str = "netem",
        threads: int | None = None,
        start_method: str | None = None,
        trace: bool = False,
        environ: Mapping[str, str] | None = None,
        shaping: str = "userspace",
        fabric: str | Fabric | None = None,
    ) -> None:
        self.topology = Topology.build(nodes, procs_per_node, nic, intra, links, fabric)
        self.world_size = self.topology.world_size
        if self.world_size > MAX_WORLD_SIZE:
            raise ValueError(
                f"nodes x procs_per_node = {self.world_size} processes is more than this "
                f"launcher allows on one machine ({MAX_WORLD_SIZE}); use clusterlab.sim for more"
            )
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        # nan would never time out, inf overflows torch's timedelta: finite, bounded numbers.
        _number_in("timeout", timeout, MAX_TIMEOUT, "seconds")
        _number_in("dilation", dilation, MAX_DILATION, "(a factor)")
        for name, value, choices in (("algorithm", algorithm, ALLREDUCE_SCHEDULES),
                                     ("correlation", correlation, CORRELATIONS)):
            if value not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or not 1 <= threads <= MAX_THREADS):
            raise ValueError(f"threads must be an integer 1..{MAX_THREADS} or None, "
                             f"got {threads!r}")
        if environ is not None and not isinstance(environ, Mapping):
            raise TypeError(f"environ must be a mapping of names to strings, got {environ!r}")
        if environ is not None and not all(isinstance(k, str) and isinstance(v, str)
                                           for k, v in dict(environ).items()):
            raise ValueError(f"environ must map names to strings, got {environ!r}")
        methods = mp.get_all_start_methods()
        if start_method is not None and start_method not in methods:
            raise ValueError(f"start_method must be one of {', '.join(methods)} or None, "
                             f"got {start_method!r}")
        if shaping not in kernel_shaping.MODES:
            raise ValueError(f"shaping must be one of {', '.join(kernel_shaping.MODES)}, "
                             f"got {shaping!r}")
        if shaping == "kernel":  # refuse here what the kernel cannot do, before anything runs
            kernel_shaping.validate(self.topology, dilation=dilation)
        self.shaping = shaping
        self.plain = nic is None and intra is None and not links and self.topology.is_noop
        # In the kernel the qdiscs impair the traffic: plain Gloo, nothing emulated on top.
        self.backend = "gloo" if self.plain or shaping == "kernel" else BACKEND_NAME
        self.seed, self.timeout, self.dilation = seed, float(timeout), float(dilation)
        self.algorithm = algorithm
        # What the ranks are configured with: the backend's CLUSTERLAB_* settings and what
        # torch.distributed reads, a mapping handed to every rank (see _rank_main).
        self.env = {
            **(environ or {}),
            **self.topology.to_env(),
            "CLUSTERLAB_SEED": str(seed),
            "CLUSTERLAB_DILATION": repr(self.dilation),
            "CLUSTERLAB_ALGORITHM": algorithm,
            "CLUSTERLAB_SEGMENT_BYTES": str(segment_bytes),
            "CLUSTERLAB_CORRELATION": correlation,
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(procs_per_node),
            "MASTER_ADDR": "127.0.0.1",
            "CLUSTERLAB_TRACE": "1" if trace else "0",
        }
        loopback = {"linux": "lo", "darwin": "lo0"}.get(sys.platform.rstrip("0123456789"))
        if loopback and "GLOO_SOCKET_IFNAME" not in os.environ:
            # Gloo otherwise resolves the host name to pick an interface: that can stall for
            # seconds where DNS is slow or absent, and listen on a real network interface.
            # Every rank lives on this machine: loopback only.
            self.env["GLOO_SOCKET_IFNAME"] = loopback
        # Validate the backend options here, where the error is readable, not in 8 children.
        # (The ranks get this mapping; this process's environment is left as it is.)
        NetemConfig.from_env(self.world_size, self.env)
        self.threads = threads or max(1, usable_cores() // self.world_size)
        if start_method is None:
            start_method = "fork" if sys.platform.startswith("linux") else "spawn"
        self._ctx = mp.get_context(start_method)
        self._procs: list = []
        self._conns: list = []
        self._tmp: str | None = None
        self._janitor: tuple[int, int] | None = None
        self._network: kernel_shaping.Network | None = None
        self._broken = False
        self._finalizer = None

    @property
    def nic(self) -> Netem:
        return self.topology.nic

    def __repr__(self) -> str:
        state = "running" if self._procs else "stopped"
        return (f"Cluster(nodes={self.topology.nodes}, procs_per_node="
                f"{self.topology.procs_per_node}, nic='{self.topology.nic}', {state})")

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Start the rank processes and wait until their process group is up."""
        if self._procs:
            return
        _sweep_orphaned_dirs()
        self._tmp = tempfile.mkdtemp(prefix=f"clusterlab-{os.getpid()}-")
        env = {**self.env, "CLUSTERLAB_SHM_DIR": self._tmp}
        self._status = self._ctx.Array("c", self.world_size * _STATUS_BYTES, lock=False)
        try:
            if not self.topology.fabric.is_crossbar() and self._ctx.get_start_method() == "fork":
                # Forked ranks inherit the compiled port kernel; loading it in each rank took
                # seconds apiece on a busy 2-core machine.
                port_kernel()
            if self.shaping == "kernel":
                scaled = self.topology.scaled(self.dilation)
                self._network = kernel_shaping.up(scaled.nodes, scaled.nic, links=scaled.links)
            for rank in range(self.world_size):
                rank_env = env if self._network is None else {
                    **env, **self._network.rank_env(self.topology.node_of(rank))}
                ours, theirs = self._ctx.Pipe()
                dump = os.path.join(self._tmp, f"stack-{rank}.txt")
                proc = self._ctx.Process(
                    target=_rank_main,
                    name=f"clusterlab-rank{rank}",
                    args=(rank, self.world_size, self.backend, rank_env, theirs, self._status,
                          dump, self.timeout, self.threads, os.getpid()),
                    daemon=True,
                )
                proc.start()
                theirs.close()
                self._procs.append(proc)
                self._conns.append(ours)
            network = self._network
            self._janitor = _start_janitor(self._tmp, [p.pid for p in self._procs],
                                           also=network.remove if network else None)
            self._finalizer = weakref.finalize(self, _cleanup, list(self._procs), self._tmp,
                                               self._janitor, network)
            wait = max(self.timeout, START_TIMEOUT)
            (port,) = self._collect("starting the rendezvous store", ranks=[0], timeout=wait)
            for conn in self._conns[1:]:
                conn.send(("port", port))
            self._collect("starting the cluster", timeout=wait)
        except BaseException:
            self._teardown()
            raise
        self._broken = False

    def close(self) -> None:
        """Stop every rank (politely, then by force) and remove temporary files."""
        for conn in self._conns:
            with contextlib.suppress(Exception):
                conn.send(("close", None))
        deadline = time.monotonic() + 2.0
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self._teardown()

    def _teardown(self) -> None:
        stop_processes(self._procs)
        for conn in self._conns:
            with contextlib.suppress(Exception):
                conn.close()
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
        if self._network is not None:
            self._network.remove()
        _release_janitor(self._janitor)
        self._procs, self._conns, self._tmp, self._janitor = [], [], None, None
        self._network = None

    # --- running functions -------------------------------------------------------------------

    def run(self, fn, *args, **kwargs) -> list:
        """Run fn(*args, **kwargs) on every rank; return the results ordered by rank."""
        if not callable(fn):
            raise TypeError(f"run() needs a function, got {fn!r}")
        try:  # before starting anything: an unpicklable argument starts no rank
            payload = cloudpickle.dumps((fn, args, kwargs))
        except Exception as exc:
            raise TypeError(f"cannot send {fn!r} and its arguments to the ranks: {exc}") from exc
        if self._broken or not self._procs:
            self._teardown()
            self.start()
        name = getattr(fn, "__name__", "fn")
        for rank, conn in enumerate(self._conns):
            try:
                conn.send(("run", payload))
            except OSError:  # the rank died while idle (killed from outside)
                err = self._death_error(rank, f"starting {name}")
                self._broken = True
                self._teardown()
                raise err from None
        replies = self._collect(f"running {name}")
        return [cloudpickle.loads(r) for r in replies]

    def _collect(self, what: str, ranks: list[int] | None = None,
                 timeout: float | None = None) -> list:
        """Wait for one reply from each rank (default: all); turn any failure into a named
        error and a teardown."""
        ranks = list(range(self.world_size)) if ranks is None else ranks
        replies: dict[int, object] = {}
        pending = set(ranks)
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        sentinel_of = {p.sentinel: r for r, p in enumerate(self._procs)}
        conn_of = {id(c): r for r, c in enumerate(self._conns)}
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._timeout_error(pending, what, done=sorted(replies),
                                              waited=timeout)
                ready = wait_any([self._conns[r] for r in pending]
                                 + [self._procs[r].sentinel for r in pending], min(left, 0.2))
                for obj in ready:
                    if isinstance(obj, int):  # a process ended
                        rank = sentinel_of[obj]
                        if rank in pending and not self._conns[rank].poll():
                            raise self._death_error(self._culprit(rank, pending), what,
                                                    pending)
                        continue
                    rank = conn_of[id(obj)]
                    try:
                        kind, data = obj.recv()
                    except (EOFError, OSError):
                        raise self._death_error(rank, what, pending) from None
                    if kind == "error":
                        # Its reply is consumed here, and the rank then says "idle": keep
                        # the operation it failed in for the report of a peer's death.
                        raise self._first_cause(pending, what, {rank: data}) or RankError(
                            rank, *data, what=what, others=self._others(pending - {rank}))
                    replies[rank] = data
                    pending.discard(rank)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):  # say what was stopped
                exc.add_note(f"clusterlab: interrupted while {what}; stopped "
                             + ", ".join(f"rank {r} (in {_read_status(self._status, r)})"
                                         for r in sorted(pending)))
            self._broken = True
            self._teardown()
            raise
        return [replies[r] for r in ranks]

    def _others(self, ranks, errors=None) -> str:
        """Where the other ranks were when one failed (the operation they waited in).
        `errors`: error replies already received, by rank."""
        if not ranks:
            return ""
        parts = []
        for r in sorted(ranks):
            doing = _read_status(self._status, r)
            reply = ("error", errors[r]) if errors and r in errors else None
            with contextlib.suppress(Exception):
                if reply is None and self._conns[r].poll():  # it answered meanwhile
                    reply = self._conns[r].recv()
            if reply is not None:  # say how it answered (we stop anyway)
                kind, data = reply
                doing = ("returned" if kind != "error" else
                         f"raised {data[0]} (in {data[3]}): {data[1][:200]}")
            parts.append(f"rank {r}: {doing}")
        return "the other ranks were in: " + "; ".join(parts)

    def _first_cause(self, pending: set[int], what: str, errors=None) -> RankDied | None:
        """When a rank reports an error, a dead peer is usually why (a killed rank 0 takes
        the store and its Gloo connections with it): name the death, not the symptom.
        `errors`: the error replies received so far, by rank."""
        deadline = time.monotonic() + 0.2  # the peer's exit and its sockets' reset race
        while True:
            for rank in sorted(pending):
                if not self._procs[rank].is_alive():
                    return self._death_error(self._culprit(rank, pending), what, pending,
                                             errors)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def _culprit(self, rank: int, pending: set[int]) -> int:
        """Of the dead ranks, the one that died first is the cause; the others may have
        crashed on its broken connections (their last operation then says "failed"). The
        kernel does not say who died first: prefer a dead rank whose operation had not
        failed."""
        dead = [r for r in sorted(pending) if not self._procs[r].is_alive()] or [rank]
        clean = [r for r in dead if " failed: " not in _read_status(self._status, r)]
        return rank if rank in clean else (clean or dead)[0]

    def _death_error(self, rank: int, what: str, pending=(), errors=None) -> RankDied:
        proc = self._procs[rank]
        proc.join(0.5)
        code = proc.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                how = f"signal {signal.Signals(-code).name}"
        doing = _read_status(self._status, rank)
        others = self._others(set(pending) - {rank}, errors)
        return RankDied(f"rank {rank} died ({how}) while {what} (its last operation: "
                        f"{doing}); the cluster was stopped" + (f"\n{others}" if others else ""))

    def _timeout_error(self, pending: set[int], what: str, done=(),
                       waited: float = 0.0) -> ClusterTimeout:
        lines = []
        for rank in sorted(pending):
            lines.append(f"  rank {rank}: in {_read_status(self._status, rank)}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._procs[rank].pid, signal.SIGUSR1)
        time.sleep(0.3)  # let faulthandler write the stacks
        stacks = []
        for rank in sorted(pending):
            path = os.path.join(self._tmp or "", f"stack-{rank}.txt")
            with contextlib.suppress(OSError), open(path) as f:
                text = _main_thread_stack(f.read())
                if text:
                    stacks.append(f"--- rank {rank} ---\n{text}")
        returned = ", ".join(f"rank {r}" for r in done)
        msg = (f"timed out after {waited or self.timeout:g} s while {what}; ranks still busy: "
               f"{sorted(pending)}" + (f" (returned already: {returned})" if done else "")
               + "\n" + "\n".join(lines))
        if stacks:
            msg += "\nwhere they were (Python stacks):\n" + "\n".join(stacks)
        return ClusterTimeout(msg)


_FRAME = re.compile(r'\s*File "(.+)", line (\d+) in ')


def _main_thread_stack(dump: str) -> str:
    """The main thread's part of a faulthandler dump (the frame the user's code is in)."""
    blocks = dump.strip().split("\n\n")
    main = next((b for b in blocks if "Current thread" in b), blocks[-1] if blocks else "")
    kept = []
    for line in main.splitlines()[1:]:  # drop the "Current thread 0x..." header
        if line.strip().endswith("in _rank_main"):
            break  # below this: the launcher's own frames, and (with fork) the parent's
        kept.append(line)
        frame = _FRAME.match(line)
        if frame:  # faulthandler prints no source: add it where the file is readable here
            source = linecache.getline(frame[1], int(frame[2])).strip()
            if source:
                kept.append(f"    {source}")
    return "\n".join(kept)


def _sweep_orphaned_dirs() -> None:
    """Remove the scratch directories of clusters whose parent died without cleaning up
    (kill -9, a killed kernel): their names carry the parent's pid."""
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        # clusterlab-<pid>-<anything>: a cluster's scratch dir, and any other scratch entry
        # named after its process this way (e.g. clusterlab-<pid>-quiz-...).
        m = re.fullmatch(r"clusterlab-(\d+)-[\w.-]+", name)
        if m and not psutil.pid_exists(int(m.group(1))):
            path = os.path.join(root, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.remove(path)


def _cleanup(procs, tmp, janitor, network=None) -> None:
    stop_processes(procs)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    if network is not None:
        network.remove()
    _release_janitor(janitor)


def _start_janitor(tmp: str, pids: list[int], also=None) -> tuple[int, int] | None:
    """Fork a small process that cleans up after a parent killed outright (kill -9, a
    kernel restart), which runs no finalizer: it waits on a pipe whose write end only the
    parent holds. End of file (the parent is gone): kill the ranks (where the kernel does
    not already, PR_SET_PDEATHSIG), then remove the scratch directory. A byte (the parent
    cleaned up itself): exit. `also`: more to undo then (a shaped network's namespaces).
    Returns (pid, write end), or None without fork."""
    if not hasattr(os, "fork"):
        return None  # the next start's _sweep_orphaned_dirs removes the directory
    started = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            started[pid] = psutil.Process(pid).create_time()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the janitor
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's business
            # Out of the parent's process group: a kernel restart SIGKILLs that whole group
            # (jupyter_client kills with killpg), the janitor must outlive it.
            os.setsid()
            # Hold none of the parent's files and sockets (a kernel's ports, the ranks' pipes).
            os.closerange(3, r)
            os.closerange(r + 1, 1 << 16)
            if not os.read(r, 1):
                _kill_ranks(started)
                shutil.rmtree(tmp, ignore_errors=True)
                if also is not None:
                    also()
        finally:
            os._exit(0)
    os.close(r)
    return pid, w


def _kill_ranks(started: dict[int, float]) -> None:
    """SIGKILL the ranks that are still the processes we started, then wait (<= 2 s) until
    they are gone, so that none writes into a directory about to be removed."""
    procs = []
    for pid, created in started.items():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if proc.create_time() == created:  # not a new process that reused the pid
                proc.kill()
                procs.append(proc)
    deadline = time.monotonic() + 2.0
    while procs and time.monotonic() < deadline:
        # A dead rank is a zombie until init reaps it (not at once everywhere): that is gone.
        procs = [p for p in procs if _running(p)]
        time.sleep(0.005)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _release_janitor(janitor: tuple[int, int] | None) -> None:
    """Tell the janitor that cleaning up is done, and reap it."""
    if janitor is None:
        return
    pid, w = janitor
    with contextlib.suppress(OSError):
        os.write(w, b"x")
    with contextlib.suppress(OSError):
        os.close(w)
    deadline = time.monotonic() + 1.0
    while True:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
            if time.monotonic() < deadline:
                time.sleep(0.005)
                continue
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        return

