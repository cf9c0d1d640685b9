"""The fabric: what lies between the NICs — a crossbar, a leaf-spine, or rail switches.

`Topology` says where ranks live and what each NIC's egress does (`nic=`). The fabric says
what a message crosses after it: switch ports, each an output queue with a rate, a buffer
(netem's `limit`, in packets) and netem-style impairment. Three descriptions, immutable and
validated, each with a string form that parses back (`Fabric.parse(str(f)) == f`), used by
`CLUSTERLAB_FABRIC` and `Cluster(..., fabric=...)`:

    Crossbar()                                   "crossbar"   (the default: today's model)
    LeafSpine(nodes_per_leaf=4, spines=2, oversubscription=2.0, port="rate 10gbit limit 64")
        "leafspine nodes_per_leaf=4 spines=2 oversubscription=2.0 port=(rate 10gbit limit 64)"
    RailOptimized(rails=4, spines=2, port="rate 10gbit")
        "rail rails=4 spines=2 port=(rate 10gbit)"

Crossbar: a message crosses its sender's NIC egress and nothing else (a perfect switch).

LeafSpine: node n hangs off leaf n // nodes_per_leaf. A message between two nodes of one leaf
crosses the sender's NIC, then the leaf's port towards the receiver (its *ingress*: N senders
to one receiver queue here, which is incast). Between leaves it crosses the sender's NIC, the
leaf's uplink to one spine (chosen by ECMP), that spine's downlink to the receiver's leaf, then
the receiver's port. Node ports run at the `port` spec's rate; each leaf has `spines`
uplinks whose rate is port rate x nodes_per_leaf / (spines x oversubscription), so at
oversubscription 1 a leaf's uplinks carry as much as its nodes can send, and at 4 a quarter.

RailOptimized: every node has `rails` NICs (one per process, so `rails` must equal the
topology's procs_per_node), and NIC i of every node is on rail switch i. Ranks of the same
local index talk through their rail switch alone (NIC -> receiver's port); across rails a
message goes up to a spine and down the other rail (uplinks sized as in LeafSpine, with
nodes_per_leaf = the nodes on a rail).

A port (`port=`, a netem spec; None: the NIC's rate and nothing else) is an output queue:
a packet waits behind the packets before it for the port's rate, is dropped when `limit`
packets are already waiting (a tail drop, recovered by TCP as any loss: fast retransmit or
RTO), and then takes the port's delay and jitter (the switch's latency, not buffered); `loss`
and `corrupt` drop it at random. ECMP: each flow (source rank, destination rank, connection)
is hashed, with `ecmp_seed`, to one spine; every packet of the flow takes it, so two flows
may collide on one uplink while another idles, as in a real fabric.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import mmap
import os
import re
from dataclasses import dataclass, replace

import numpy as np

from .link import packet_time_ns, sample_delay_ns
from .netem import Netem
from .wire import DUPTHRESH, HEADER_BYTES, MAX_RETRANSMISSIONS, RTO_MAX_NS, RTO_MIN_NS

# Hop kinds, in the order a message crosses them; a port's integer id is laid out as
# [ports | uplinks (leaf, spine) | downlinks (spine, leaf)] (see `Fabric.port_count`).
PORT, UP, DOWN = 0, 1, 2
MAX_HOPS = 3


class Fabric:
    """Base of the fabric descriptions: the switches behind the NICs."""

    kind = ""

    # --- what a topology asks -------------------------------------------------------------

    def nic_per_process(self) -> bool:
        """True when every process has its own NIC (rails); else a node's processes share one."""
        return False

    def check(self, nodes: int, procs_per_node: int) -> None:
        """Raise ValueError if this fabric cannot wire `nodes` x `procs_per_node` ranks."""

    def is_crossbar(self) -> bool:
        return False

    def port_count(self, nodes: int, procs_per_node: int) -> int:
        return 0

    def paths(self, nodes: int, procs_per_node: int, src: np.ndarray, dst: np.ndarray,
              connection: int | np.ndarray = 0) -> np.ndarray:
        """Integer ids of the ports each message src[i] -> dst[i] crosses after the sender's
        NIC, in order: an (m, MAX_HOPS) array, -1 where a path is shorter. Same-node messages
        cross nothing."""
        return np.full((len(src), MAX_HOPS), -1, dtype=np.int64)

    def port_specs(self, nodes: int, procs_per_node: int, nic: Netem) -> list[Netem]:
        """The spec of every port id (`nic` resolves port=None to the NIC's rate)."""
        return []

    def scaled(self, k: float) -> Fabric:
        """The same fabric k times slower (time dilation): port delays x k, rates / k."""
        return self

    @staticmethod
    def parse(text: str) -> Fabric:
        """Read the string form (see the module docstring); the inverse of `str(fabric)`."""
        return parse_fabric(text)


@dataclass(frozen=True)
class Crossbar(Fabric):
    """A perfect switch behind every NIC: messages cross their sender's egress only."""

    kind = "crossbar"

    def is_crossbar(self) -> bool:
        return True

    def __str__(self) -> str:
        return "crossbar"


def _check_int(name: str, value, low: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _port_spec(port) -> Netem | None:
    if port is None:
        return None
    if isinstance(port, str):
        try:
            return Netem.parse(port)
        except ValueError as exc:
            raise ValueError(f"port: {exc}") from None
    if not isinstance(port, Netem):
        raise TypeError(f"port must be a netem spec string, a Netem or None, got {port!r}")
    return port


@dataclass(frozen=True, kw_only=True)
class _Switched(Fabric):
    """What LeafSpine and RailOptimized share: spines, oversubscription, port spec, ECMP."""

    spines: int = 1
    oversubscription: float = 1.0
    port: Netem | None = None
    ecmp_seed: int = 0

    def __post_init__(self) -> None:
        _check_int("spines", self.spines)
        _check_int("ecmp_seed", self.ecmp_seed, 0)
        if self.ecmp_seed >= 2**63:
            raise ValueError(f"ecmp_seed must be < 2**63, got {self.ecmp_seed}")
        o = self.oversubscription
        if isinstance(o, bool) or not isinstance(o, (int, float)) or not (
                math.isfinite(o) and o > 0):
            raise ValueError(f"oversubscription must be a finite number > 0, got {o!r}")
        object.__setattr__(self, "oversubscription", float(o))
        object.__setattr__(self, "port", _port_spec(self.port))

    def _group(self, nodes: int, procs_per_node: int) -> int:
        """Nodes per lower switch (a leaf, or a rail's nodes)."""
        raise NotImplementedError

    def _switches(self, nodes: int, procs_per_node: int) -> int:
        raise NotImplementedError

    def _endpoints(self, nodes: int, procs_per_node: int) -> int:
        raise NotImplementedError

    def port_count(self, nodes: int, procs_per_node: int) -> int:
        leaves = self._switches(nodes, procs_per_node)
        return self._endpoints(nodes, procs_per_node) + 2 * leaves * self.spines

    def port_specs(self, nodes: int, procs_per_node: int, nic: Netem) -> list[Netem]:
        port = self.port if self.port is not None else Netem(rate_bps=nic.rate_bps)
        group = self._group(nodes, procs_per_node)
        uplink = port
        if port.rate_bps:
            rate = port.rate_bps * group / (self.spines * self.oversubscription)
            uplink = replace(port, rate_bps=max(1, round(rate)))
        leaves = self._switches(nodes, procs_per_node)
        return ([port] * self._endpoints(nodes, procs_per_node)
                + [uplink] * (2 * leaves * self.spines))

    def spine_of(self, src, dst, connection=0) -> np.ndarray:
        """ECMP: the spine each flow (src rank, dst rank, connection) is hashed to."""
        return ecmp_hash(self.ecmp_seed, src, dst, connection) % np.uint64(self.spines)

    def _route(self, nodes, procs_per_node, src, dst, connection, end, low) -> np.ndarray:
        """Paths given each message's endpoint port id (`end`) and lower switch (`low`)."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        out = np.full((len(src), MAX_HOPS), -1, dtype=np.int64)
        crosses = (src // procs_per_node) != (dst // procs_per_node)
        lo_s, lo_d = low(src), low(dst)
        local = crosses & (lo_s == lo_d)
        out[local, 0] = end(dst[local])
        far = crosses & (lo_s != lo_d)
        if far.any():
            spine = self.spine_of(src[far], dst[far],
                                  np.broadcast_to(connection, src.shape)[far]).astype(np.int64)
            base = self._endpoints(nodes, procs_per_node)
            leaves = self._switches(nodes, procs_per_node)
            out[far, 0] = base + lo_s[far] * self.spines + spine
            out[far, 1] = base + leaves * self.spines + spine * leaves + lo_d[far]
            out[far, 2] = end(dst[far])
        return out

    def _options(self) -> list[str]:
        parts = []
        if self.spines != 1 or self.kind == "leafspine":
            parts.append(f"spines={self.spines}")
        if self.oversubscription != 1.0:
            parts.append(f"oversubscription={self.oversubscription!r}")  # round-trips
        if self.port is not None:
            parts.append(f"port=({self.port})")
        if self.ecmp_seed:
            parts.append(f"ecmp_seed={self.ecmp_seed}")
        return parts

    def scaled(self, k: float) -> Fabric:
        if k == 1 or self.port is None:  # port=None follows the NIC, which is scaled itself
            return self
        return replace(self, port=self.port.scaled(k))


@dataclass(frozen=True, kw_only=True)
class LeafSpine(_Switched):
    """Leaf-spine: `nodes_per_leaf` nodes per leaf, `spines` spines, each leaf's uplinks
    oversubscribed by `oversubscription` (see the module docstring).

    >>> LeafSpine(nodes_per_leaf=4, spines=2, oversubscription=2, port="rate 10gbit limit 64")
    """

    kind = "leafspine"
    nodes_per_leaf: int

    def __post_init__(self) -> None:
        _check_int("nodes_per_leaf", self.nodes_per_leaf)
        super().__post_init__()

    def _group(self, nodes, procs_per_node):
        return self.nodes_per_leaf

    def _switches(self, nodes, procs_per_node):
        return -(-nodes // self.nodes_per_leaf)

    def _endpoints(self, nodes, procs_per_node):
        return nodes  # one port per node: its processes share the NIC and its port

    def leaf_of(self, node):
        return np.asarray(node) // self.nodes_per_leaf

    def paths(self, nodes, procs_per_node, src, dst, connection=0):
        return self._route(nodes, procs_per_node, src, dst, connection,
                           end=lambda r: r // procs_per_node,
                           low=lambda r: (r // procs_per_node) // self.nodes_per_leaf)

    def __str__(self) -> str:
        return " ".join(["leafspine", f"nodes_per_leaf={self.nodes_per_leaf}", *self._options()])


@dataclass(frozen=True, kw_only=True)
class RailOptimized(_Switched):
    """Rail-optimised: `rails` NICs per node (one per process), NIC i of every node on rail
    switch i; cross-rail traffic goes through `spines` spines (see the module docstring).

    >>> RailOptimized(rails=4, port="rate 10gbit")
    """

    kind = "rail"
    rails: int

    def __post_init__(self) -> None:
        _check_int("rails", self.rails)
        super().__post_init__()

    def nic_per_process(self) -> bool:
        return True

    def check(self, nodes: int, procs_per_node: int) -> None:
        if procs_per_node != self.rails:
            raise ValueError(
                f"fabric: a rail-optimised fabric with rails={self.rails} needs "
                f"procs_per_node={self.rails} (one NIC per process), got {procs_per_node}")

    def _group(self, nodes, procs_per_node):
        return nodes

    def _switches(self, nodes, procs_per_node):
        return self.rails

    def _endpoints(self, nodes, procs_per_node):
        return nodes * procs_per_node  # one port per NIC, i.e. per process

    def paths(self, nodes, procs_per_node, src, dst, connection=0):
        return self._route(nodes, procs_per_node, src, dst, connection,
                           end=lambda r: r, low=lambda r: r % procs_per_node)

    def __str__(self) -> str:
        return " ".join(["rail", f"rails={self.rails}", *self._options()])


CROSSBAR = Crossbar()


# --- Ports: what a packet experiences in one switch port --------------------------------------
#
# One implementation, two consumers: the backend's point-to-point path (one message at a time,
# the state in a file the ranks share) and the collective replay (a batch of messages, the
# state in the replay's QueueState), so emulated runs and simulations see the same queues.
#
# A port is a calendar of when its wire is busy: a packet takes the first idle slot, as long
# as its serialisation, at or after its arrival. Messages are placed one after another (in
# the order they were sent, as the p2p path must: a sender cannot know later senders), and a
# later message's packets fill the gaps an earlier one left, so two flows that each arrive at
# half the port's rate share it as a switch interleaving their packets would (a single queue
# tail would make the second wait for all of the first). The buffer: a packet is tail-dropped
# when the port's backlog at its arrival is `limit` packets of its size or more.
# A port's state is one int64 row: [busy intervals, start_0, end_0, start_1, end_1, ...],
# sorted, merged where they touch; when full, the oldest gap is filled in (counted busy).

INTERVALS = 16


def state_width(specs: list[Netem]) -> int:
    """Columns of a port-state row."""
    return 1 + 2 * INTERVALS


def _port_kernel(state, ports, arrive, ptime, delay, lost, limits):
    """Packets of message i (row i, its segments in order) through port ports[i], messages in
    the order given; returns when each leaves the port (-1: dropped, by the buffer or a
    loss)."""
    m, k = arrive.shape
    out = np.empty((m, k), dtype=np.int64)
    for i in range(m):
        q = ports[i]
        row = state[q]
        for s in range(k):
            a = arrive[i, s]
            length = ptime[i, s]
            if a < 0:  # dropped upstream
                out[i, s] = -1
                continue
            if length <= 0:
                out[i, s] = -1 if lost[i, s] else a + delay[i, s]
                continue
            n = row[0]
            if limits[q] > 0:
                backlog = 0
                for j in range(n):
                    end = row[2 + 2 * j]
                    if end > a:
                        start = row[1 + 2 * j]
                        backlog += end - (start if start > a else a)
                if backlog >= limits[q] * length:
                    out[i, s] = -1  # the buffer is full: a tail drop
                    continue
            # first idle slot of `length` at or after a: before interval j, or after all
            t = a
            j = 0
            while j < n:
                start, end = row[1 + 2 * j], row[2 + 2 * j]
                if end <= t:
                    j += 1
                    continue
                if start >= t + length:
                    break
                t = end
                j += 1
            # insert [t, t + length) before interval j, merging with neighbours that touch
            joins_prev = j > 0 and row[2 + 2 * (j - 1)] == t
            joins_next = j < n and row[1 + 2 * j] == t + length
            if joins_prev and joins_next:
                row[2 + 2 * (j - 1)] = row[2 + 2 * j]
                for r in range(j, n - 1):
                    row[1 + 2 * r] = row[3 + 2 * r]
                    row[2 + 2 * r] = row[4 + 2 * r]
                row[0] = n - 1
            elif joins_prev:
                row[2 + 2 * (j - 1)] = t + length
            elif joins_next:
                row[1 + 2 * j] = t
            else:
                if n == INTERVALS:  # full: fill in the oldest gap (counted busy from now on)
                    row[2] = row[4]
                    for r in range(1, n - 1):
                        row[1 + 2 * r] = row[3 + 2 * r]
                        row[2 + 2 * r] = row[4 + 2 * r]
                    n -= 1
                    row[0] = n
                    if j == 1:  # the slot was in that gap: it is inside interval 0 now
                        out[i, s] = -1 if lost[i, s] else t + length + delay[i, s]
                        continue
                    if j > 1:
                        j -= 1
                for r in range(n, j, -1):
                    row[1 + 2 * r] = row[2 * r - 1]
                    row[2 + 2 * r] = row[2 * r]
                row[1 + 2 * j] = t
                row[2 + 2 * j] = t + length
                row[0] = n + 1
            out[i, s] = -1 if lost[i, s] else t + length + delay[i, s]
    return out


_compiled = None


def port_kernel():
    """`_port_kernel` compiled by numba (the replay pushes millions of packets through ports
    at 1024 nodes), on first use: a crossbar never pays for importing numba."""
    global _compiled
    if _compiled is None:
        try:
            from numba import njit
        except ImportError:  # pragma: no cover - numba is in requirements.txt
            _compiled = _port_kernel
        else:
            _compiled = njit(cache=True, nogil=True)(_port_kernel)
            one = np.zeros((1, 1), dtype=np.int64)  # load it now, not in the first message
            _compiled(np.zeros((1, 1 + 2 * INTERVALS), dtype=np.int64), np.zeros(1, np.int64),
                      one, one, one, np.zeros((1, 1), dtype=np.bool_), np.zeros(1, np.int64))
    return _compiled


def cross_ports(state: np.ndarray, specs: list[Netem], ports: np.ndarray, arrive: np.ndarray,
                payload: np.ndarray, rng: np.random.Generator | None, *,
                tail_drop: bool = True) -> np.ndarray:
    """Messages (rows of `arrive`: when each segment reaches the port) through the ports
    `ports[i]`, in row order (FIFO); `payload` the segments' payload bytes (the shape of
    `arrive`). Returns the segments' departure times, -1 for a dropped one. `rng` draws
    jitter and loss (None: the ports have neither); tail_drop=False admits every packet
    however full the buffer (TCP's retransmissions, see `recover_drops`)."""
    from .schedule import loss_probability  # schedule imports this module

    m, k = arrive.shape
    ptime = np.zeros((m, k), dtype=np.int64)
    delay = np.zeros((m, k), dtype=np.int64)
    lost = np.zeros((m, k), dtype=np.bool_)
    for q in np.unique(ports).tolist():
        spec = specs[q]
        rows = ports == q if m > 1 else slice(None)
        n = int(np.count_nonzero(rows)) if m > 1 else 1
        if spec.rate_bps:
            ptime[rows] = packet_time_ns(spec, payload[rows] + HEADER_BYTES)
        if spec.jitter_ns:
            delay[rows] = sample_delay_ns(spec, rng, (n, k))
        elif spec.delay_ns:
            delay[rows] = spec.delay_ns
        p = loss_probability(spec)
        if p > 0:
            lost[rows] = rng.random((n, k)) < p
    limits = np.array([s.limit if s.rate_bps and tail_drop else 0 for s in specs],
                      dtype=np.int64)
    return port_kernel()(state, np.asarray(ports, dtype=np.int64), arrive, ptime, delay, lost,
                         limits)


def cross_path(state: np.ndarray, specs: list[Netem], paths: np.ndarray, arrive: np.ndarray,
               payload: np.ndarray, order: np.ndarray, rng: np.random.Generator | None, *,
               tail_drop: bool = True) -> np.ndarray:
    """Messages whose segments reach their first port at `arrive` (rows) along `paths` (a row
    of port ids per message, -1 past its last hop), hop by hop; at each port the messages are
    queued in the order of `order` (their send times: FIFO, as the p2p path queues them).
    Returns when each segment leaves its last port (-1: dropped somewhere); `tail_drop` as
    in `cross_ports`."""
    arrive = arrive.copy()
    payload = np.broadcast_to(payload, arrive.shape)
    for hop in range(paths.shape[1]):
        rows = np.flatnonzero(paths[:, hop] >= 0)
        if not len(rows):
            break
        rows = rows[np.argsort(order[rows], kind="stable")]
        arrive[rows] = cross_ports(state, specs, paths[rows, hop], arrive[rows], payload[rows],
                                   rng, tail_drop=tail_drop)
    return arrive


def resender(state: np.ndarray, specs: list[Netem], paths: np.ndarray, nics: list[Netem],
             payload: np.ndarray, rng: np.random.Generator | None):
    """The `resend` of `recover_drops` for messages along `paths` (a row per message) sent by
    the NICs `nics` (one per message), `payload` bytes per segment: each resent segment is a
    message of its own, through its sender's NIC (its delay and serialisation, not its queue:
    by the time TCP resends, the burst queued there has long left), then the ports, admitted
    however full their buffers are (see `recover_drops`)."""

    def at_port(r: int, c: int, leave: int) -> int:
        nic = nics[r]
        return leave + nic.delay_ns + int(packet_time_ns(nic, int(payload[c]) + HEADER_BYTES))

    def resend(rows, cols, leave_ns):
        arrive = np.array([at_port(r, c, t) for r, c, t in
                           zip(rows.tolist(), cols.tolist(), leave_ns.tolist())], dtype=np.int64)
        return cross_path(state, specs, paths[rows], arrive.reshape(-1, 1),
                          payload[cols].reshape(-1, 1), leave_ns, rng, tail_drop=False)[:, 0]

    return resend


def recover_drops(done: np.ndarray, send_ns: np.ndarray, forward_ns: np.ndarray,
                  back_ns: np.ndarray, resend) -> np.ndarray:
    """Each message's delivery once TCP has recovered the segments the ports dropped (-1).

    As the link model recovers a loss: a fast retransmit when DUPTHRESH later segments of the
    message arrived (their SACKs take `back_ns` to the sender, which resends at once), else a
    retransmission timeout of max(RTO_MIN, 2 x RTT) after the send; `forward_ns` is the
    path's unloaded one-way time. A resent segment crosses the ports again and queues there
    behind whatever they hold by then: `resend(rows, cols, leave_ns)` sends segment cols[i]
    of message rows[i] at leave_ns[i] (in that order) and returns when it leaves the last
    port, or -1 when it is lost again. The callers admit a retransmission into a full buffer
    (after an RTO TCP restarts from one segment per round trip, a trickle next to the burst
    that overflowed the buffer; modelling that slow start is left out), so only a port's
    random loss loses one again: it then waits for an RTO, doubled after each loss (up to
    RTO_MAX), and after MAX_RETRANSMISSIONS the connection times out (RuntimeError).
    """
    rows, cols = np.nonzero(done < 0)
    if not len(rows):
        return done.max(axis=1)
    out = done.copy()
    rto = np.maximum(RTO_MIN_NS, 2 * (forward_ns + back_ns)).astype(np.int64)
    leave = np.empty(len(rows), dtype=np.int64)
    backoff = np.zeros(len(rows), dtype=np.int64)  # RTOs waited so far per segment
    for i, (r, c) in enumerate(zip(rows.tolist(), cols.tolist())):
        later = done[r, c + 1 :]
        later = later[later >= 0]
        if len(later) >= DUPTHRESH:
            leave[i] = int(np.partition(later, DUPTHRESH - 1)[DUPTHRESH - 1]) + back_ns[r]
        else:
            leave[i] = send_ns[r] + rto[r]
            backoff[i] = 1
    for _ in range(MAX_RETRANSMISSIONS):
        order = np.lexsort((cols, rows, leave))  # in time; a message's segments in order
        rows, cols, leave, backoff = rows[order], cols[order], leave[order], backoff[order]
        got = resend(rows, cols, leave)
        out[rows, cols] = got
        lost = got < 0
        if not lost.any():
            return out.max(axis=1)
        rows, cols, leave, backoff = rows[lost], cols[lost], leave[lost], backoff[lost]
        leave = leave + np.minimum(rto[rows] << backoff, RTO_MAX_NS)
        backoff = backoff + 1
    raise RuntimeError(
        f"a segment of a message through the fabric was dropped {MAX_RETRANSMISSIONS + 1} "
        f"times in a row: Linux TCP gives up after {MAX_RETRANSMISSIONS} retransmissions and "
        "the connection times out. Does a port lose 100% of its packets, or is its buffer "
        "(limit) smaller than the traffic that keeps arriving?")


def ecmp_hash(seed: int, src, dst, connection=0) -> np.ndarray:
    """A flow's 64-bit ECMP hash (splitmix64 of seed, src, dst, connection), vectorised."""
    with np.errstate(over="ignore"):
        s = np.asarray(src, dtype=np.uint64)
        d = np.asarray(dst, dtype=np.uint64)
        c = np.asarray(connection, dtype=np.uint64)
        z = (np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
             ^ s * np.uint64(0xBF58476D1CE4E5B9)
             ^ d * np.uint64(0x94D049BB133111EB) ^ c)
        for _ in range(2):  # two rounds: neighbouring ranks land on unrelated spines
            z = z + np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
    return z


_OPTION = re.compile(r"(\w+)\s*=\s*(\([^()]*\)|\S+)")
_KINDS = {"crossbar": Crossbar, "leafspine": LeafSpine, "rail": RailOptimized}
_INT_OPTIONS = ("nodes_per_leaf", "spines", "rails", "ecmp_seed")


def parse_fabric(text: str) -> Fabric:
    """"crossbar" | "leafspine nodes_per_leaf=N [spines=S] [oversubscription=X]
    [port=(NETEM)] [ecmp_seed=K]" | "rail rails=R [spines=S] [oversubscription=X]
    [port=(NETEM)] [ecmp_seed=K]"; an empty string is the crossbar."""
    if not isinstance(text, str):
        raise TypeError(f"fabric must be a string, got {text!r}")
    head, _, rest = text.strip().partition(" ")
    head = head.lower() or "crossbar"
    if head not in _KINDS:
        raise ValueError(f"fabric: unknown kind {head!r}; choose from {', '.join(_KINDS)}")
    options: dict = {}
    pos = 0
    rest = rest.strip()
    while pos < len(rest):
        match = _OPTION.match(rest, pos)
        if not match:
            raise ValueError(f"fabric: cannot read {rest[pos:]!r} (expected NAME=VALUE, and "
                             "port=(netem spec) in parentheses)")
        name, value = match[1].lower(), match[2]
        if name in options:
            raise ValueError(f"fabric: {name} given twice")
        if name == "port":
            if not value.startswith("("):
                raise ValueError(f"fabric: port must be in parentheses, port=(...), got {value!r}")
            options[name] = value[1:-1]
        elif name in _INT_OPTIONS:
            try:
                options[name] = int(value)
            except ValueError:
                raise ValueError(f"fabric: {name} must be an integer, got {value!r}") from None
        elif name == "oversubscription":
            try:
                options[name] = float(value)
            except ValueError:
                raise ValueError(f"fabric: oversubscription must be a number, got {value!r}"
                                 ) from None
        else:
            raise ValueError(f"fabric: unknown option {name!r} for {head}")
        pos = match.end()
        while pos < len(rest) and rest[pos].isspace():
            pos += 1
    try:
        return _KINDS[head](**options)
    except TypeError as exc:  # a missing or foreign option
        raise ValueError(f"fabric: {head}: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"fabric: {exc}" if not str(exc).startswith("fabric") else str(exc)
                         ) from None


def as_fabric(value: str | Fabric | None) -> Fabric:
    """A Fabric from a string, a Fabric, or None (the crossbar)."""
    if value is None:
        return CROSSBAR
    if isinstance(value, Fabric):
        return value
    if isinstance(value, str):
        return parse_fabric(value)
    raise TypeError(f"fabric must be a Fabric, a string or None, got {value!r}")


__all__ = ["CROSSBAR", "Crossbar", "Fabric", "LeafSpine", "RailOptimized", "as_fabric",
           "ecmp_hash", "parse_fabric"]


class SharedPorts:
    """The fabric's port states in a file every rank of one host maps: the point-to-point
    path's queues, shared so that messages of different senders queue behind each other at a
    receiver's port (incast) or an uplink, in the order the senders sent them."""

    def __init__(self, path: str, specs: list[Netem], *, seed: int = 0, rank: int = 0) -> None:
        self.path, self.specs = path, specs
        width = state_width(specs)
        size = 8 * len(specs) * width
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < size:
            os.ftruncate(self._fd, size)
        self._map = mmap.mmap(self._fd, size)
        self.state = np.frombuffer(self._map, dtype=np.int64).reshape(len(specs), width)
        self.delay = np.array([s.delay_ns for s in specs], dtype=np.int64)
        self._rng = np.random.default_rng([seed, rank, 0xFAB])
        self._last: dict[int, int] = {}  # last delivery per flow: TCP delivers in order

    def deliver(self, path: np.ndarray, send_ns: int, segment_ns, payload: np.ndarray, *,
                nic: Netem, back_ns: int, flow: int) -> int:
        """When a message that left the sender's NIC at `segment_ns` (per segment) is
        delivered across the ports `path`; `nic` the sender's NIC and `back_ns` the reverse
        path's delay (for the TCP recovery of a dropped segment)."""
        arrive = np.asarray(segment_ns, dtype=np.int64).reshape(1, -1)
        paths = path.reshape(1, -1)
        payload = np.asarray(payload, dtype=np.int64)
        resend = resender(self.state, self.specs, paths, [nic], payload, self._rng)
        forward = np.array([nic.delay_ns + int(self.delay[path].sum())])
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:  # the resends too: they queue behind what the ports hold by then
            arrive = cross_path(self.state, self.specs, paths, arrive, payload, np.zeros(1),
                                self._rng)
            done = int(recover_drops(arrive, np.array([send_ns]), forward, np.array([back_ns]),
                                     resend)[0])
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        done = max(done, self._last.get(flow, done))
        self._last[flow] = done
        return done

    def back_ns(self, path: np.ndarray) -> int:
        return int(self.delay[path].sum())

    def close(self) -> None:
        self.state = None
        with contextlib.suppress(OSError, ValueError, BufferError):
            self._map.close()
            os.close(self._fd)
