"""The "netem" torch.distributed backend: Gloo, held back by an emulated network.

`import clusterlab` registers it; `dist.init_process_group("netem")` selects it. It wraps a
real ProcessGroupGloo, so every operation moves real bytes between real processes and
returns exactly what Gloo returns. What it adds is time: each operation is held until the
moment the emulated network would have completed it.

Point-to-point (send/recv): the sender runs its egress link model (netem semantics, its
node's shared NIC queue), stamps the message with the absolute delivery time, and the
receiver holds the message until then. Every rank reads one clock, rank 0's
(`clusterlab.clock`; on other hosts corrected by `clusterlab.clocksync`).

Collectives: the calling thread notes the time it entered the collective in the group's
entry table (a file mapped by every rank of the group; without one, as across hosts, a tiny
Gloo all-reduce of the entry times) and starts the Gloo operation at once. A completion
thread (one per group, FIFO, like a communication stream) then replays the collective's
algorithm on the replicated network model (`clusterlab.schedule`) and completes the future
when this rank's emulated completion time has come, but never before Gloo itself finished.
Futures make unmodified DistributedDataParallel keep its compute/communication overlap.

Configuration: a mapping of CLUSTERLAB_* settings (see `clusterlab.topology` for the
topology): CLUSTERLAB_SEED, CLUSTERLAB_DILATION, CLUSTERLAB_ALGORITHM (ring |
recursive_doubling | rabenseifner | tree | hierarchical), CLUSTERLAB_SEGMENT_BYTES,
CLUSTERLAB_CORRELATION, CLUSTERLAB_TRACE. `clusterlab.Cluster` hands its ranks that mapping
(`configure`); any other job (torchrun, a script) is configured by the same names in its
environment, so selecting the backend needs no code change.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import math
import mmap
import os
import queue
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from . import clock, clocksync
from .fabric import SharedPorts
from .link import LinkModel
from .netem import Netem
from .schedule import ALLREDUCE_SCHEDULES, Collective, QueueState, play, rounds_of, segments
from .topology import Topology
from .wire import SEGMENT_BYTES, wire_seconds

BACKEND_NAME = "netem"

# A hook the launcher sets to learn what a rank is doing (for timeout reports).
status_hook = None
# The settings the launcher handed this process (`configure`); None: read the environment.
_settings: Mapping[str, str] | None = None


def configure(settings: Mapping[str, str] | None) -> None:
    """Use `settings` (CLUSTERLAB_* names) for every netem process group created in this
    process from now on, instead of the environment (None: the environment again)."""
    global _settings
    _settings = None if settings is None else dict(settings)


def _status(text: str) -> None:
    if status_hook is not None:
        status_hook(text)


def match_intra_op_threads() -> None:
    """Give the calling thread the process's intra-op thread count (`torch.set_num_threads`);
    every thread that may run tensor arithmetic on a rank's behalf starts with it.

    torch.set_num_threads(n) (the launcher sets it on each rank) records n for the process but
    applies it to MKL only in the calling thread (`mkl_set_num_threads_local`). Another thread
    applies it lazily, when it first runs an op through at::parallel_for; small element-wise
    ops and reductions take a serial path that never gets there, and a matmul goes straight to
    MKL. So a new thread's first matmuls run with MKL's default, every core, and round
    differently: (10x2) @ (2x256) in fp32 differs from the calling thread's in 85 of its 2560
    entries (torch 2.13, MKL 2024.2, 2 cores). A callback chained on a collective's future
    runs on whichever thread completes it (this backend's completion thread, a waiter's, or
    the caller's if the future was done when it chained), so torch's PowerSGD hook
    decompressed a gradient with 1 MKL thread on one rank and 2 on another, and the replicas
    drifted apart by ulps in about 3 runs in 8."""
    torch.set_num_threads(torch.get_num_threads())  # get: the process's count, applied lazily


@dataclass(frozen=True)
class NetemConfig:
    """Everything the backend reads from its settings, validated once."""

    topology: Topology
    seed: int = 0
    dilation: float = 1.0
    algorithm: str = "ring"
    segment_bytes: int = SEGMENT_BYTES
    correlation: str = "netem"
    shm_dir: str = field(default_factory=tempfile.gettempdir)
    trace: bool = False

    @classmethod
    def from_env(cls, world_size: int, env: Mapping[str, str] | None = None) -> NetemConfig:
        """The settings of a `world_size`-rank job from `env` (CLUSTERLAB_* names; default:
        this process's environment)."""
        env = os.environ if env is None else env
        dilation = _number(env, "CLUSTERLAB_DILATION", 1.0, float)
        if not (math.isfinite(dilation) and dilation > 0):
            raise ValueError(f"CLUSTERLAB_DILATION must be a finite number > 0, got {dilation}")
        algorithm = env.get("CLUSTERLAB_ALGORITHM") or "ring"
        if algorithm not in ALLREDUCE_SCHEDULES:
            raise ValueError(
                f"CLUSTERLAB_ALGORITHM={algorithm!r} is unknown; choose from "
                f"{', '.join(ALLREDUCE_SCHEDULES)}"
            )
        correlation = env.get("CLUSTERLAB_CORRELATION") or "netem"
        if correlation not in ("netem", "ar1"):
            raise ValueError(
                f"CLUSTERLAB_CORRELATION must be 'netem' or 'ar1', got {correlation!r}"
            )
        segment = _number(env, "CLUSTERLAB_SEGMENT_BYTES", SEGMENT_BYTES, int)
        if segment < 1:
            raise ValueError(f"CLUSTERLAB_SEGMENT_BYTES must be >= 1, got {segment}")
        seed = _number(env, "CLUSTERLAB_SEED", 0, int)
        if seed < 0:
            raise ValueError(f"CLUSTERLAB_SEED must be >= 0, got {seed}")
        trace = env.get("CLUSTERLAB_TRACE") or "0"
        if trace not in ("0", "1"):
            raise ValueError(f"CLUSTERLAB_TRACE must be 0 or 1, got {trace!r}")
        topology = Topology.from_env(world_size, env).scaled(dilation)
        return cls(
            topology=topology,
            seed=seed,
            dilation=dilation,
            algorithm=algorithm,
            segment_bytes=segment,
            correlation=correlation,
            shm_dir=env.get("CLUSTERLAB_SHM_DIR") or tempfile.gettempdir(),
            trace=trace == "1",
        )


def _number(env, name, default, kind):
    text = env.get(name)
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None


_MAX_TAIL_NS = 2**63 - 1


class SharedTail:
    """A node's NIC queue tail (ns), shared by that node's processes through a mapped file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < 8:
            os.ftruncate(self._fd, 8)
        self._map = mmap.mmap(self._fd, 8)

    def update(self, fn):
        """Run fn(tail) -> (new_tail, result) atomically across processes; return result."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            (tail,) = struct.unpack("q", self._map[:8])
            new_tail, result = fn(tail if tail else None)
            # Clamped: netem allows delays up to 2**63 - 1 ns, which a tail can exceed.
            self._map[:8] = struct.pack("q", min(int(new_tail), _MAX_TAIL_NS))
            return result
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        try:
            self._map.close()
            os.close(self._fd)
        except (OSError, ValueError):
            pass


class EntryTable:
    """When each rank of a group entered each collective, in a file every rank maps.

    A ring of ENTRY_SLOTS rows of (sequence number, entry time ns, bytes sent) per rank: a
    rank writes its own cell before it starts the Gloo operation, and every rank reads the
    whole row.
    This replaces an all-reduce of the entry times per collective (a second Gloo operation
    that doubled the messages of small collectives). A row is reused only after every rank
    has read it (`consumed`), so a rank running ahead by ENTRY_SLOTS collectives waits.
    """

    def __init__(self, path: str, size: int, rank: int, *, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self._fd = os.open(path, flags, 0o600)
        self.path, self.size, self.rank = path, size, rank
        length = 8 * (_ENTRY_HEAD + size + ENTRY_SLOTS * size * 3)
        if create:
            os.ftruncate(self._fd, length)
        self._map = mmap.mmap(self._fd, length)
        words = np.frombuffer(self._map, dtype=np.int64)
        self.head = words[:_ENTRY_HEAD]  # the group's token, to tell one shared file
        self.consumed = words[_ENTRY_HEAD : _ENTRY_HEAD + size]  # last row each rank read
        self.rows = words[_ENTRY_HEAD + size :].reshape(ENTRY_SLOTS, size, 3)

    def write(self, seq: int, now_ns: int, timeout_s: float, nbytes: int = 0) -> None:
        if seq > ENTRY_SLOTS:  # the row's previous use must have been read by every rank
            _poll(lambda: self.consumed.min() >= seq - ENTRY_SLOTS, timeout_s,
                  lambda: f"netem: ranks {self._behind(seq - ENTRY_SLOTS)} are more than "
                          f"{ENTRY_SLOTS} collectives behind rank {self.rank}")
        cell = self.rows[seq % ENTRY_SLOTS, self.rank]
        cell[1], cell[2] = now_ns, nbytes
        cell[0] = seq  # after the time: a reader that sees the number sees the time

    def read(self, seq: int) -> np.ndarray | None:
        """Every rank's (entry time, bytes sent) of collective `seq`, shape (size, 2), or None
        while some rank is missing."""
        row = self.rows[seq % ENTRY_SLOTS]
        if not (row[:, 0] == seq).all():
            return None
        times = row[:, 1:].copy()
        self.consumed[self.rank] = seq
        return times

    def wait(self, seq: int, what: str, timeout_s: float) -> np.ndarray:
        out = []
        _poll(lambda: out.append(self.read(seq)) or out[-1] is not None, timeout_s,
              lambda: f"netem: ranks {self._missing(seq)} did not enter {what} within "
                      f"{timeout_s:g} s")
        return out[-1]

    def _missing(self, seq: int) -> list[int]:
        return np.flatnonzero(self.rows[seq % ENTRY_SLOTS, :, 0] != seq).tolist()

    def _behind(self, seq: int) -> list[int]:
        return np.flatnonzero(self.consumed < seq).tolist()

    def close(self) -> None:
        self.head = self.consumed = self.rows = None  # views into the map: drop them first
        with contextlib.suppress(OSError, ValueError, BufferError):
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)


ENTRY_SLOTS = 512
_ENTRY_HEAD = 2  # words: the group's token (12 hex digits) as an integer, and a spare


def _poll(done, timeout_s: float, message) -> None:
    """Wait until done() with short, growing sleeps; RuntimeError(message()) after timeout_s."""
    deadline = clock.monotonic_ns() + int(timeout_s * 1e9)
    pause = 20e-6
    while not done():
        if clock.monotonic_ns() > deadline:
            raise RuntimeError(message())
        time.sleep(pause)
        pause = min(2 * pause, 500e-6)


SMALL_MESSAGE = 65536  # up to this many bytes, header and payload travel as one Gloo message
_HEADER = 16  # bytes: delivery time (ns), payload size
_HEADER_FORMAT = struct.Struct("qq")
_NO_HOLD = 0
# A receiver spins for the last stretch before a delivery time: sleeping alone wakes up tens
# of microseconds late (more in sandboxes), which would bias every emulated delay upwards.
P2P_SPIN_NS = 200_000


def _bytes_of(tensor: torch.Tensor, writable: bool = False) -> torch.Tensor:
    """The tensor's memory as a flat uint8 view (a copy if it is not contiguous)."""
    if not tensor.is_contiguous():
        if writable:
            raise ValueError("netem: recv into a non-contiguous tensor is not supported")
        tensor = tensor.contiguous()
    return tensor.reshape(-1).view(torch.uint8)


@dataclass
class _Route:
    """What this rank needs to send to one peer, worked out once."""

    spec: Netem
    link: LinkModel
    shared: SharedTail | None
    out_impaired: bool
    in_impaired: bool
    ports: np.ndarray | None = None  # the fabric's ports after the NIC (None: a crossbar)
    back_ns: int = 0  # the reverse path's delay, for TCP's recovery of a port's drop


class _P2PWork(dist._Work):
    """Point-to-point work whose wait() holds until the emulated delivery time."""

    def __init__(self, waits, hold_ns, tensors, source=-1):
        super().__init__()
        self._waits = waits  # callables, run in order by wait(); they may set hold_ns
        self.hold_ns = hold_ns  # absolute CLOCK_MONOTONIC ns before which wait() cannot return
        self._tensors = tensors
        self._source = source
        self._done = False

    def wait(self, timeout=None):
        if not self._done:
            for step in self._waits:
                step()
            if self.hold_ns > clock.monotonic_ns():  # mostly in the past on a fast link
                clock.sleep_until(self.hold_ns, spin_ns=P2P_SPIN_NS)
            self._done = True
        return True

    def is_completed(self):
        return self._done

    def _source_rank(self):
        return self._source

    def source_rank(self):
        return self._source

    def get_future(self):
        fut = torch.futures.Future()

        def finish():
            match_intra_op_threads()  # callbacks chained on `fut` run here
            try:
                self.wait()
                fut.set_result(self._tensors)
            except Exception as exc:  # noqa: BLE001 - handed to the future's owner
                fut.set_exception(exc)

        threading.Thread(target=finish, daemon=True).start()
        return _for_cpp(fut)


def _value(fut: torch.futures.Future):
    return fut.value()


def _for_cpp(fut: torch.futures.Future) -> torch.futures.Future:
    """`fut` as C++ code (DDP's reducer, comm hooks) may consume it.

    Python's `Future.set_exception` stores the exception as the future's *value*; C++ code
    that chains on the future sees no error and reads that value as tensors, which crashed
    a DDP rank whose peer had died (SIGSEGV). A future chained with `then` turns the
    exception its callback re-raises into a real C++ error."""
    return fut.then(_value)


class _FutureWork(dist._Work):
    """Work backed by a Future. torch's `_create_work_from_future` swallows the future's
    exception in wait() (torch 2.13), which would turn a dead peer into silent garbage; this
    one re-raises it (the original exception, in wait(); as a C++ error, in get_future())."""

    def __init__(self, future: torch.futures.Future, run=None) -> None:
        super().__init__()
        self._future = future
        self._cpp_future = None  # made on first get_future(): plain waits need none
        self._run = run  # completes the operation in the caller's thread, if still unclaimed

    def wait(self, timeout=None):
        if self._run is not None:
            self._run()
            self._run = None
        self._future.wait()  # raises the operation's error, if any
        return True

    def is_completed(self):
        return self._future.done()

    def get_future(self):
        if self._cpp_future is None:
            self._cpp_future = _for_cpp(self._future)
        return self._cpp_future


@dataclass
class _Pending:
    coll: Collective
    seq: int
    times: torch.Tensor | None  # entry times exchanged through Gloo (no entry table)
    times_work: object
    data_work: object
    future: torch.futures.Future
    result: object
    finish: object = None  # optional callable run on the result before completion
    claimed: bool = False  # taken by the completion thread or by a caller's wait()


class NetemProcessGroup(dist.ProcessGroup):
    """A ProcessGroup that runs Gloo and holds every operation for the emulated network."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, global_ranks=None):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._timeout = timeout
        self._group_name = self._group_desc = ""
        self.gloo = _gloo_group(dist.PrefixStore("clusterlab-gloo", store), rank, size, timeout)
        # Which ranks share a host (and its files) and a clock; off rank 0's clock, correct it.
        self.placement, self._clock = clocksync.synchronize(
            store, self.gloo, rank, size, timeout, default_group=not dist.is_initialized())
        self.global_ranks = list(global_ranks) if global_ranks else list(range(size))
        world = max(self.global_ranks) + 1 if global_ranks else size
        if dist.is_initialized():
            world = dist.get_world_size()
        self.config = NetemConfig.from_env(world, _settings)
        self.topology = self.config.topology
        self.me = self.global_ranks[rank]
        self.impaired = not self.topology.is_noop
        self._routes: dict[int, _Route] = {}
        self._queues: dict[tuple, LinkModel] = {}
        # Sender-side log of every impaired message (peer, sent_ns, bytes, Transmission),
        # kept when CLUSTERLAB_TRACE=1, for fidelity checks and the link explorer.
        self.trace: list | None = [] if self.config.trace else None
        self._tails: dict[tuple, SharedTail] = {}
        self.placement.check_nodes([self.topology.node_of(g) for g in self.global_ranks])
        self._token = self._agree_on_token(store)
        self._files = f"clusterlab-{self.placement.owner_pid(rank)}-{self._token}"
        self._entries = (self._open_entry_table()
                         if self.impaired and size > 1 and self.placement.one_host else None)
        # Collective completion: one FIFO thread, like a communication stream.
        self.fabric = QueueState(self.topology, segment_bytes=self.config.segment_bytes)
        self._seq = 0  # collectives completed (completion thread)
        self._submitted = 0  # collectives started (calling thread)
        self._done_all = np.zeros(size, dtype=np.int64)
        self._volumes: dict[Collective, tuple[int, int]] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        # Collectives complete in order, each by whoever claims it first: the completion
        # thread, or the caller's wait(). A caller that waits at once (dist.all_reduce without
        # async_op) saves a thread hop: on 2 busy cores, each wake-up can cost a time slice.
        self._turn = threading.Condition()
        self._completed = 0  # the last collective completed
        # The collective whose future this thread is completing: a callback chained on it
        # (`.then`, as PowerSGD's hook does) may start and wait for the next collective,
        # which must then run at once in this thread (the FIFO turn is its).
        self._delivering = threading.local()
        self._thread = threading.Thread(target=self._complete_loop, name="netem-completion",
                                        daemon=True)
        self._thread.start()

    def getBackendName(self) -> str:
        return BACKEND_NAME

    # torch names every group (DeviceMesh, FSDP2 and functional collectives look groups up by
    # name); a ProcessGroup subclass without C++ backends must keep its name itself.
    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def __repr__(self) -> str:
        return f"NetemProcessGroup(rank={self._rank}, size={self._size}, nic='{self.topology.nic}')"

    def _agree_on_token(self, store) -> str:
        """The group's token, from rank 0: its shared files on each host are named
        clusterlab-<pid>-<token>-*, with the pid of that host's lowest rank, so the next
        Cluster's start there removes them once that process is gone (a torchrun job killed
        outright runs no shutdown())."""
        if self._rank == 0:
            token = uuid.uuid4().hex[:12]
            store.set("clusterlab-token", token)
            return token
        return store.get("clusterlab-token").decode()

    def _open_entry_table(self) -> EntryTable | None:
        """Rank 0 creates the group's entry table, the others map it; if any rank cannot
        (another host, another temp dir), the group exchanges entry times through Gloo."""
        path = os.path.join(self.config.shm_dir, f"{self._files}-entries")
        table = None
        if self._rank == 0:
            with contextlib.suppress(OSError):
                table = EntryTable(path, self._size, 0, create=True)
                table.head[0] = int(self._token, 16)
        # The first all-reduce orders rank 0's creation before the others open the file.
        flag = torch.ones(1, dtype=torch.int64)
        self.gloo.allreduce([flag]).wait()
        if self._rank != 0:
            with contextlib.suppress(OSError, ValueError):
                table = EntryTable(path, self._size, self._rank, create=False)
                if table.head[0] != int(self._token, 16):
                    table.close()
                    table = None
        flag[0] = table is not None
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        self.gloo.allreduce([flag], opts).wait()  # every rank has mapped it, or not all can
        if self._rank == 0:
            with contextlib.suppress(OSError):
                os.unlink(path)  # the maps keep it: nothing is left behind, even on SIGKILL
        if not flag[0] and table is not None:
            table.close()
            table = None
        return table

    # --- point to point ----------------------------------------------------------------------
    #
    # Wire format of an impaired message: a 16-byte header (delivery time, payload bytes) and
    # the payload. Up to SMALL_MESSAGE bytes travel as one Gloo message (header + copy of the
    # payload: one send is ~50 us cheaper than two); larger ones as two, header first.

    def _route(self, peer: int) -> _Route:
        route = self._routes.get(peer)
        if route is None:
            spec = self.topology.spec(self.me, peer)
            back = self.topology.spec(peer, self.me)
            # One link model per egress queue, as netem has one qdisc per device: messages
            # to every peer behind this rank's NIC share its queue, random streams and loss
            # state. (Across the processes of a node only the queue tail is shared.)
            queue = self.topology.queue_of(self.me, peer)
            link = self._queues.get(queue)
            if link is None:
                link = self._queues[queue] = LinkModel(
                    spec, seed=self.config.seed, link_id=(self.me, *_queue_id(queue)),
                    segment_bytes=self.config.segment_bytes, correlation=self.config.correlation,
                    reverse_delay_ns=back.delay_ns, trace=self.trace is not None)
            route = self._routes[peer] = _Route(spec, link, self._shared_tail(peer),
                                                out_impaired=not spec.is_noop,
                                                in_impaired=not back.is_noop)
            self._fabric_route(route, peer)
        return route

    def _fabric_route(self, route: _Route, peer: int) -> None:
        """The switch ports a message to `peer` crosses after the NIC, with their shared
        state; a path through impaired ports holds messages even behind a plain NIC."""
        specs = self.topology.port_specs()
        if all(spec.is_noop for spec in specs):  # no ports, or ports that change nothing
            return
        ports = self._tails.get(("ports",))
        if ports is None:
            path = os.path.join(self.config.shm_dir, f"{self._files}-ports")
            ports = self._tails[("ports",)] = SharedPorts(path, specs, seed=self.config.seed,
                                                          rank=self.me)
        out, back = (self.topology.paths([a], [b])[0] for a, b in ((self.me, peer),
                                                                 (peer, self.me)))
        out, back = out[out >= 0], back[back >= 0]
        route.out_impaired |= any(not specs[q].is_noop for q in out.tolist())
        route.in_impaired |= any(not specs[q].is_noop for q in back.tolist())
        if any(not specs[q].is_noop for q in out.tolist()):
            route.ports = out
            route.back_ns = route.link.reverse_delay_ns + ports.back_ns(back)

    def _shared_tail(self, peer: int) -> SharedTail | None:
        """The node-wide NIC queue tail when several processes share a rate-limited NIC."""
        kind, *where = self.topology.queue_of(self.me, peer)
        if kind != "nic" or self.topology.procs_per_node == 1:
            return None
        if not self.topology.spec(self.me, peer).rate_bps:
            return None
        key = (kind, *where)
        tail = self._tails.get(key)
        if tail is None:
            name = f"{self._files}-nic{where[0]}"
            tail = self._tails[key] = SharedTail(os.path.join(self.config.shm_dir, name))
        return tail

    def send(self, tensors, dst_rank, tag):
        # The message is "handed to TCP" when the user called dist.send/isend (stamped by the
        # wrappers below), not ~40 us later when torch's Python layers reach this method.
        now = getattr(_call_time, "ns", 0) or clock.monotonic_ns()
        peer = self.global_ranks[dst_rank]
        route = self._route(peer)
        if not route.out_impaired:
            _count("p2p", _nbytes(tensors), 0)
            work = self.gloo.send(tensors, dst_rank, tag)
            return _P2PWork([work.wait], _NO_HOLD, tensors, self._rank)
        (tensor,) = tensors
        nbytes = tensor.numel() * tensor.element_size()
        link = route.link
        if route.shared is None:
            sent = link.transmit(now, nbytes, flow=peer)
        else:
            def through_nic(tail):
                if tail is not None:
                    link.tail_ns = max(link.tail_ns, tail)
                result = link.transmit(now, nbytes, flow=peer)
                return link.tail_ns, result

            sent = route.shared.update(through_nic)
        delivered = sent.delivered_ns
        if route.ports is not None:
            delivered = self._tails[("ports",)].deliver(
                route.ports, now, sent.segment_ns, segments(nbytes, self.config.segment_bytes),
                nic=route.spec, back_ns=route.back_ns, flow=peer)
        header = (delivered, nbytes)
        tag = _direction_tag(tag, self._rank, dst_rank)
        if nbytes <= SMALL_MESSAGE:
            # Built with struct and memmove: a few torch or numpy ops on small tensors cost
            # more CPU than the message itself (and 4 ranks share 2 cores).
            buf = np.empty(_HEADER + nbytes, dtype=np.uint8)
            _HEADER_FORMAT.pack_into(buf, 0, *header)
            frame = torch.from_numpy(buf)
            if not tensor.is_contiguous():
                tensor = tensor.contiguous()
            ctypes.memmove(frame.data_ptr() + _HEADER, tensor.data_ptr(), nbytes)
            waits = [self.gloo.send([frame], dst_rank, tag).wait]
        else:
            head = torch.from_numpy(np.array(header, dtype=np.int64))
            waits = [self.gloo.send([head], dst_rank, tag).wait,
                     self.gloo.send(tensors, dst_rank, tag).wait]
        # Bookkeeping after the bytes are handed to Gloo, off the message's critical path
        # (posting never blocks; wait() does, and the status names the send by then).
        _count("p2p", nbytes, 0)
        if self.trace is not None:
            self.trace.append((peer, now, nbytes, sent))
        _status(f"send to {peer} ({nbytes} B)")
        # The sender is busy until its bytes are on the wire.
        busy = int(wire_seconds(nbytes, rate_bps=route.spec.rate_bps,
                                segment_bytes=self.config.segment_bytes) * 1e9)
        return _P2PWork(waits, now + busy, tensors, self._rank)

    def recv(self, tensors, src_rank, tag):
        peer = self.global_ranks[src_rank]
        if not self._route(peer).in_impaired:
            _count("p2p", 0, _nbytes(tensors))
            work = self.gloo.recv(tensors, src_rank, tag)
            return _P2PWork([work.wait], _NO_HOLD, tensors, src_rank)
        out = self._receive(tensors, src_rank, tag)
        _status(f"recv from {peer}")  # after posting: the peer's send waits for the post
        return out

    def recv_anysource(self, tensors, tag):
        if not self.impaired:
            _count("p2p", 0, _nbytes(tensors))
            work = self.gloo.recv_anysource(tensors, tag)
            out = _P2PWork([work.wait], _NO_HOLD, tensors)
            out._waits.append(lambda: setattr(out, "_source", work._source_rank()))
            return out
        # Every impaired message starts with its header, so the first Gloo message names the
        # source. (Unimpaired links send no header: on a network where some directions are
        # impaired and others not, any-source receives are not supported.)
        out = self._receive(tensors, None, tag)
        _status("recv from any source")
        return out

    def _receive(self, tensors, src_rank, tag):
        """Post the Gloo receive(s) now; wait() unpacks the header and holds until delivery.

        Posted before any bookkeeping: Gloo's sender writes a message only once the
        receiver's post has reached it, so every microsecond before the post delays it."""
        (tensor,) = tensors
        nbytes = tensor.numel() * tensor.element_size()

        if src_rank is None:
            others = [r for r in range(self._size) if r != self._rank]
            if others and min(others) < self._rank < max(others):
                raise NotImplementedError(
                    f"recv from any source on rank {self._rank}: on an impaired network each "
                    "direction of a pair has its own connection, so a rank with peers both below "
                    "and above it must name the source (the first and last ranks need not)")
            any_tag = _direction_tag(tag, self._size - 1 if self._rank == 0 else 0, self._rank)

        def post(buf):
            if src_rank is None:
                return self.gloo.recv_anysource(buf, any_tag)
            return self.gloo.recv(buf, src_rank, _direction_tag(tag, src_rank, self._rank))

        if nbytes <= SMALL_MESSAGE:
            buf = np.empty(_HEADER + nbytes, dtype=np.uint8)
            frame = torch.from_numpy(buf)
            work = post([frame])

            def unpack():
                work.wait()
                if src_rank is None:
                    out._source = work._source_rank()
                if not tensor.is_contiguous():
                    _bytes_of(tensor, writable=True)  # raises the error that names it
                ctypes.memmove(tensor.data_ptr(), frame.data_ptr() + _HEADER, nbytes)
                out.hold_ns = _HEADER_FORMAT.unpack_from(buf, 0)[0]
        else:
            head = torch.zeros(2, dtype=torch.int64)
            work = post([head])
            data = (None if src_rank is None else
                    self.gloo.recv(tensors, src_rank, _direction_tag(tag, src_rank, self._rank)))

            def unpack():
                work.wait()
                if src_rank is None:
                    out._source = work._source_rank()
                (data or self.gloo.recv(tensors, out._source, any_tag)).wait()
                out.hold_ns = int(head[0])

        _count("p2p", 0, nbytes)
        out = _P2PWork([unpack], _NO_HOLD, tensors, -1 if src_rank is None else src_rank)
        return out

    # --- collectives -------------------------------------------------------------------------

    def _submit(self, coll: Collective, start_native, result, finish=None, volume=None):
        """Start the Gloo op and the entry-time exchange now; complete on the FIFO thread.

        `volume`: (sent, received) bytes of this rank when they are not the replayed
        schedule's (an uneven all-to-all)."""
        future = torch.futures.Future()
        self._submitted += 1
        volume = volume or self._volume(coll)
        _count(coll.kind, *volume)
        # Named at once: a rank that fails with this collective in flight is reported in it.
        _status(f"{coll.kind} #{self._submitted} ({coll.nbytes} B)")
        times = None
        times_work = None
        if self._entries is not None:
            self._entries.write(self._submitted, clock.monotonic_ns(),
                                self._timeout.total_seconds(), volume[0])
        elif self.impaired and self._size > 1:
            times = torch.zeros(self._size, 2, dtype=torch.int64)
            times[self._rank] = torch.tensor([clock.monotonic_ns(), volume[0]])
            times_work = self.gloo.allreduce([times])
        data_work = start_native()
        item = _Pending(coll, self._submitted, times, times_work, data_work, future, result,
                        finish)
        self._queue.put(item)
        if getattr(self._delivering, "seq", None) is not None:  # inside a callback: see above
            self._run(item)
        return _FutureWork(future, functools.partial(self._run, item))

    def _complete_loop(self) -> None:
        clock.lower_timer_slack()
        match_intra_op_threads()  # callbacks chained on the futures run here (see there)
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._run(item)

    def _run(self, item: _Pending) -> None:
        """Complete `item` in this thread unless another one claimed it: after the
        collectives before it (FIFO), like a communication stream."""
        with self._turn:
            if item.claimed:
                return
            item.claimed = True
            deadline = clock.monotonic_ns() + int(self._timeout.total_seconds() * 1e9)
            while not self._my_turn(item.seq):
                left = (deadline - clock.monotonic_ns()) / 1e9
                if left <= 0 or not self._turn.wait(left) and not self._my_turn(item.seq):
                    item.future.set_exception(RuntimeError(
                        f"netem: {item.coll.kind} #{item.seq} waited {self._timeout} for the "
                        f"collective #{self._completed + 1} before it"))
                    return
        try:
            self._complete(item)
        finally:
            if not item.future.done():  # interrupted (a BaseException): waiters must not hang
                item.future.set_exception(RuntimeError(
                    f"netem: {item.coll.kind} #{item.seq} was interrupted"))
            with self._turn:
                self._completed = max(self._completed, item.seq)  # a nested one may be later
                self._turn.notify_all()

    def _my_turn(self, seq: int) -> bool:
        return self._completed == seq - 1 or getattr(self._delivering, "seq", None) == seq - 1

    def _complete(self, item: _Pending) -> None:
        """Hold `item` until its emulated completion time (and Gloo's), then complete it."""
        try:
            self._seq = item.seq
            hold = 0
            data_work = item.data_work
            entered = None
            if self._entries is not None:
                _status(f"{item.coll.kind} #{item.seq} ({item.coll.nbytes} B)")
                entered = self._entries.read(item.seq)
                if entered is None:  # not every rank is in yet: let Gloo finish first
                    if data_work is not None:
                        data_work.wait()
                        data_work = None
                    entered = self._entries.wait(item.seq, f"{item.coll.kind} #{item.seq}",
                                                 self._timeout.total_seconds())
            elif item.times_work is not None:
                _status(f"{item.coll.kind} #{item.seq} ({item.coll.nbytes} B)")
                item.times_work.wait()
                entered = item.times.numpy()
            coll = item.coll
            if entered is not None:
                entered, sent = entered[:, 0], entered[:, 1]
                if coll.kind == "alltoall" and self._size > 1:
                    # Uneven splits: every rank replays the busiest sender's off-rank bytes,
                    # spread evenly over its peers (the replay's all-to-all is uniform).
                    p = self._size
                    coll = replace(coll, nbytes=-(-int(sent.max()) * p // (p - 1)))
                start = np.maximum(entered, self._done_all)
                # A deterministic network draws nothing: skip seeding a generator.
                rng = None if self.fabric.deterministic else np.random.default_rng(
                    [self.config.seed, 0xC011, item.seq])
                done = play(self.fabric, coll, start, rng, self.global_ranks)
                self._done_all = done
                hold = int(done[self._rank])
            if data_work is not None:
                data_work.wait()
            clock.sleep_until(hold)
            if item.finish is not None:
                item.finish()
            _status("idle")
            outer = getattr(self._delivering, "seq", None)
            self._delivering.seq = item.seq
            try:
                item.future.set_result(item.result)  # runs callbacks chained on it, here
            finally:
                self._delivering.seq = outer
        except Exception as exc:  # noqa: BLE001 - the caller's wait() re-raises it
            _status(f"{item.coll.kind} #{item.seq} failed: {exc}")
            item.future.set_exception(exc)

    def _volume(self, coll: Collective) -> tuple[int, int]:
        """(sent, received) bytes of this rank in the schedule the backend replays for
        `coll` (ring all-reduce: 2(p-1) chunks of n/p each way), worked out once per shape."""
        volume = self._volumes.get(coll)
        if volume is None:
            sent = received = 0
            glob = np.asarray(self.global_ranks, dtype=np.int64)
            if self._size > 1:
                for senders, receivers, size in rounds_of(coll, self._size, self.topology,
                                                          glob):
                    sent += size * int(np.count_nonzero(senders == self._rank))
                    received += size * int(np.count_nonzero(receivers == self._rank))
            volume = self._volumes[coll] = (sent, received)
        return volume

    def _coll(self, kind, nbytes=0, root=0):
        return Collective(kind, int(nbytes), int(root), self.config.algorithm)

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        op, finish = _reduce_op(opts.reduceOp, tensors, self._size)
        native = dist.AllreduceOptions()
        native.reduceOp = op
        native.timeout = opts.timeout
        return self._submit(self._coll("allreduce", _nbytes(tensors)),
                            lambda: self.gloo.allreduce(tensors, native), tensors, finish)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        op, finish = _reduce_op(opts.reduceOp, tensors, self._size)
        native = dist.AllreduceCoalescedOptions()
        native.reduceOp = op
        return self._submit(self._coll("allreduce", _nbytes(tensors)),
                            lambda: self.gloo.allreduce_coalesced(tensors, native), tensors,
                            finish)

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        return self._submit(self._coll("broadcast", _nbytes(tensors), opts.rootRank),
                            lambda: self.gloo.broadcast(tensors, opts), tensors)

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        op, finish = _reduce_op(opts.reduceOp, tensors, self._size)
        native = dist.ReduceOptions()
        native.reduceOp, native.rootRank, native.rootTensor = op, opts.rootRank, opts.rootTensor
        if finish is not None and self._rank != opts.rootRank:
            finish = None  # only the root's buffer holds the result
        return self._submit(self._coll("reduce", _nbytes(tensors), opts.rootRank),
                            lambda: self.gloo.reduce(tensors, native), tensors, finish)

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.AllgatherOptions()
        return self._submit(self._coll("allgather", _nbytes(input_tensors)),
                            lambda: self.gloo.allgather(output_tensors, input_tensors, opts),
                            output_tensors)

    def all_gather_single(self, output, input, opts=None):
        opts = opts or dist.AllgatherOptions()
        return self._submit(self._coll("allgather", _nbytes([input])),
                            lambda: self.gloo._allgather_base(output, input, opts), [output])

    _allgather_base = all_gather_single  # the name torch < 2.10 calls

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        opts = opts or dist.AllgatherOptions()
        return self._submit(self._coll("allgather", _nbytes(input_tensors)),
                            lambda: self.gloo.allgather_coalesced(output_lists, input_tensors,
                                                                  opts), output_lists)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.AllgatherOptions()
        return self._submit(self._coll("allgather", _nbytes(inputs)),
                            lambda: _all_works([self.gloo._allgather_base(o, i, opts)
                                                for o, i in zip(outputs, inputs)]), outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.GatherOptions()
        return self._submit(self._coll("gather", _nbytes(input_tensors), opts.rootRank),
                            lambda: self.gloo.gather(output_tensors, input_tensors, opts),
                            output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ScatterOptions()
        return self._submit(self._coll("scatter", _nbytes(output_tensors), opts.rootRank),
                            lambda: self.gloo.scatter(output_tensors, input_tensors, opts),
                            output_tensors)

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        op, finish = _reduce_op(opts.reduceOp, output_tensors, self._size)
        native = dist.ReduceScatterOptions()
        native.reduceOp = op
        return self._submit(self._coll("reduce_scatter", _nbytes(output_tensors)),
                            lambda: self.gloo.reduce_scatter(output_tensors, input_lists, native),
                            output_tensors, finish)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        op, finish = _reduce_op(opts.reduceOp, [output], self._size)
        native = dist.ReduceScatterOptions()
        native.reduceOp = op
        return self._submit(self._coll("reduce_scatter", _nbytes([output])),
                            lambda: self.gloo._reduce_scatter_base(output, input, native),
                            [output], finish)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        op, finish = _reduce_op(opts.reduceOp, outputs, self._size)
        native = dist.ReduceScatterOptions()
        native.reduceOp = op
        return self._submit(self._coll("reduce_scatter", _nbytes(outputs)),
                            lambda: _all_works([self.gloo._reduce_scatter_base(o, i, native)
                                                for o, i in zip(outputs, inputs)]),
                            outputs, finish)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):
        opts = opts or dist.AllToAllOptions()
        volume = (_off_rank_bytes(input, input_split_sizes, self._rank, self._size),
                  _off_rank_bytes(output, output_split_sizes, self._rank, self._size))
        return self._submit(self._coll("alltoall", _nbytes([input])),
                            lambda: self.gloo.alltoall_base(output, input, output_split_sizes,
                                                            input_split_sizes, opts), [output],
                            volume=volume)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.AllToAllOptions()
        me = self._rank
        volume = (_nbytes(input_tensors) - _nbytes(input_tensors[me : me + 1]),
                  _nbytes(output_tensors) - _nbytes(output_tensors[me : me + 1]))
        return self._submit(self._coll("alltoall", _nbytes(input_tensors)),
                            lambda: self.gloo.alltoall(output_tensors, input_tensors, opts),
                            output_tensors, volume=volume)

    def barrier(self, opts=None):
        opts = opts or dist.BarrierOptions()
        return self._submit(self._coll("barrier"), lambda: self.gloo.barrier(opts), [])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        # Gloo's monitored barrier names the ranks that did not arrive; keep it native.
        return self.gloo.monitored_barrier(timeout or self._timeout, wait_all_ranks)

    def shutdown(self) -> None:
        if self._clock is not None:
            self._clock.close()
        self._queue.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=self._timeout.total_seconds())
        self.gloo.shutdown()
        for tail in self._tails.values():
            tail.close()
            with contextlib.suppress(OSError):
                os.unlink(tail.path)
        self._tails.clear()
        if self._entries is not None:
            self._entries.close()
            self._entries = None

    def abort(self) -> None:
        self.shutdown()


class _AllWorks:
    """Several Gloo works that count as one."""

    def __init__(self, works):
        self.works = works

    def wait(self):
        for w in self.works:
            w.wait()
        return True


def _all_works(works) -> _AllWorks:
    return _AllWorks(works)


def _gloo_group(store, rank: int, size: int, timeout: timedelta):
    """The Gloo group underneath, with two TCP connections per pair of ranks.

    An impaired message travels on the connection of its direction (`_direction_tag`). On a
    shared one, a rank's send waited for the pair's lock while Gloo's I/O thread held it to
    read the peer's message, and on 2 busy cores that thread could be preempted holding it:
    when two ranks exchanged at the same instant, the send call took 4-5 ms at p99 (0.7-1.2
    ms with one connection per direction), and the emulated delivery was that late.
    """
    names = [n for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n]
    devices = ([dist.ProcessGroupGloo.create_device(interface=n) for n in names]
               or [dist.ProcessGroupGloo.create_default_device()])
    options = dist.ProcessGroupGloo._Options()
    options._devices = devices * 2  # an even number of contexts: see _direction_tag
    options._timeout = timeout
    options._threads = 2
    return dist.ProcessGroupGloo(store, rank, size, options)


def _direction_tag(tag: int, src: int, dst: int) -> int:
    """The Gloo tag of a message src -> dst: Gloo picks a pair's connection by tag modulo the
    (even) number of contexts, so the two directions of a pair never share one."""
    if not 0 <= tag < _MAX_TAG:
        raise ValueError(f"tag must be in [0, {_MAX_TAG}) on the netem backend, got {tag}")
    return 2 * tag + (src > dst)


_MAX_TAG = 2**30  # 2 * tag + 1 must fit Gloo's 32-bit signed tag


def _queue_id(queue: tuple) -> tuple[int, ...]:
    """A queue key ("nic", 3) as integers, for seeding its random streams."""
    kinds = {"nic": 1, "intra": 2, "link": 3}
    return (kinds[queue[0]], *queue[1:])


def _nbytes(tensors) -> int:
    total = 0
    for t in tensors:
        if isinstance(t, (list, tuple)):
            total += _nbytes(t)
        else:
            total += t.numel() * t.element_size()
    return total


def _off_rank_bytes(tensor, split_sizes, rank: int, size: int) -> int:
    """Bytes of `tensor` (split along dim 0 by `split_sizes`, or evenly) not kept by `rank`."""
    rows = tensor.shape[0] if tensor.dim() else 1
    row_bytes = tensor.numel() * tensor.element_size() // max(rows, 1)
    own = split_sizes[rank] if split_sizes else rows // size
    return (rows - own) * row_bytes


# --- traffic counters ------------------------------------------------------------------------

_traffic: dict[str, list[int]] = {}  # op kind -> [bytes sent, bytes received, operations]
_traffic_lock = threading.Lock()


def _count(kind: str, sent: int, received: int) -> None:
    with _traffic_lock:
        row = _traffic.setdefault(kind, [0, 0, 0])
        row[0] += sent
        row[1] += received
        row[2] += 1


def traffic(*, reset: bool = False) -> dict[str, dict[str, int]]:
    """The bytes this process sent and received through "netem" process groups, by kind of
    operation, since it started or since the last `reset=True` (which also zeroes them).

    Keys: the collectives' kinds ("allreduce", "allgather", "reduce_scatter", "alltoall",
    "broadcast", "reduce", "gather", "scatter", "barrier"), "p2p" for send/recv, and "total";
    each maps to {"sent": bytes, "received": bytes, "ops": count}. A collective counts the
    bytes of the algorithm the backend replays for it (ring all-reduce of n bytes on p ranks:
    2(p-1)/p n each way; ring all-gather and reduce-scatter: (p-1) shards); an all-to-all its
    real off-rank splits; send/recv their payloads. Gloo's own wire protocol may move the same
    data in a different pattern: these are the counts of the network being emulated."""
    with _traffic_lock:
        out = {kind: {"sent": s, "received": r, "ops": n} for kind, (s, r, n) in
               sorted(_traffic.items())}
        if reset:
            _traffic.clear()
    out["total"] = {key: sum(row[key] for row in out.values())
                    for key in ("sent", "received", "ops")}
    return out


def _reduce_op(op, tensors, size):
    """Gloo has no AVG: run SUM and divide afterwards, as NCCL's AVG would have."""
    if op == dist.ReduceOp.AVG:
        def divide():
            for t in tensors:
                if t.is_floating_point() or t.is_complex():
                    t.div_(size)
                else:
                    t.div_(size, rounding_mode="floor")

        return dist.ReduceOp.SUM, divide
    return op, None


def _create(opts, backend_options=None):
    return NetemProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                             list(opts.global_ranks_in_group or []))


_call_time = threading.local()


def _stamped(fn):
    """Wrap dist.send/isend to note when the user called it (see NetemProcessGroup.send)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if getattr(_call_time, "ns", 0):  # torch's send calls the (wrapped) isend: keep the
            return fn(*args, **kwargs)   # stamp of the user's own call
        _call_time.ns = clock.monotonic_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            _call_time.ns = 0

    wrapper.__clusterlab_stamped__ = True
    return wrapper


def register() -> None:
    """Register the "netem" backend with torch.distributed (idempotent)."""
    from torch.distributed import distributed_c10d as c10d

    for name in ("send", "isend"):
        fn = getattr(c10d, name)
        if not getattr(fn, "__clusterlab_stamped__", False):
            fn = _stamped(fn)
        # Both names: P2POp and batch_isend_irecv compare the op with c10d's own `isend`.
        setattr(c10d, name, fn)
        setattr(dist, name, fn)
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])
