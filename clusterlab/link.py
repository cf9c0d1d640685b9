"""The link model: one direction of an impaired network link, with Linux netem's semantics.

A `LinkModel` answers one question: "a process hands N bytes to TCP at time `now`; when does
the receiver get them?" It answers it the way a Linux host with a netem qdisc would:

1. TCP cuts the message into segments (`segment_bytes` of payload each, plus 66 bytes of
   Ethernet/IP/TCP headers on the wire). All segments are handed to the qdisc at `now`: we do
   not model TCP's congestion window, so a message is one burst.
2. Every segment goes through netem's enqueue, reproduced from the kernel's
   net/sched/sch_netem.c `netem_enqueue()`, in the kernel's order:
   duplicate? -> loss (random, 4-state or Gilbert-Elliott)? -> corrupt? -> queue full (limit)?
   -> reorder (send now) or delay (`tabledist`) plus rate (serialise behind the queue tail).
   The resulting `time_to_send` is when the packet leaves the qdisc; on loopback or veth that
   is also when it reaches the receiver.
3. TCP recovers what netem destroyed (a lost, limit-dropped or corrupted segment, which the
   receiver's checksum discards): by fast retransmit when 3 later segments of the same message
   got through (their SACKs reach the sender one reverse delay later), otherwise by a
   retransmission timeout (RTO, at least 200 ms, doubling on every further loss). A
   retransmission goes through netem again: new jitter, and it may be lost again.
4. The message is delivered when all its segments are in, and not before the previous
   message of the same flow (TCP delivers in order).

Randomness. netem draws 32-bit uniform numbers and compares them with probabilities scaled to
the same 32-bit range (1% -> 0.01 * (2**32 - 1)). We do the same with numpy generators seeded
from (seed, link id): the same seed gives the same trace. Each purpose (duplicate, loss,
corrupt, delay, reorder) has its own stream, so adding 1% loss to an experiment does not
reshuffle its delays (the kernel uses a single stream; its sequence cannot be reproduced
anyway, since it is a different generator).

Correlation. netem's `delay 10ms 2ms 25%` style correlation (`get_crandom`) mixes each new
uniform number with the previous one. This is `correlation="netem"`, faithful and flawed; see
`_Draws`. `correlation="ar1"` replaces it with a Gaussian AR(1) process that keeps every
marginal distribution intact and really produces the requested lag-1 correlation.

Deliberate deviations from the kernel (all small, listed so nobody has to rediscover them):
* Negative delays (jitter larger than delay) are clipped to 0: "send now". The kernel stamps a
  time in the past, which means the same thing except that with `rate` it would also skip part
  of the packet's serialisation time.
* A packet leaves the qdisc exactly at its time_to_send: no device queue, no timer slack.
* Corrupting a 64 KB GSO segment: the kernel splits it into MTU packets and corrupts only the
  first one; we treat the whole segment as lost (TCP retransmits it whole).
* ECN (`ecn`): a packet that netem would drop is marked CE instead and still delivered,
  assuming an ECN-capable TCP connection (net.ipv4.tcp_ecn=1 on both hosts). Marks are only
  counted: without a congestion-control model, a mark costs no time here.
* Retransmissions are computed eagerly, inside the `transmit()` call that sent the message,
  although they happen later. A retransmission that joins a still-busy queue (typically a fast
  retransmit inside a long burst) is accounted on the link like any packet. One that fires
  after the queue has drained (typically an RTO) uses a private, empty queue, so it cannot
  delay traffic that a later `transmit()` call sends before it.
* TCP is reduced to what matters for timing: no congestion window, no delayed ACKs, no tail
  loss probe or RACK (a lost last segment waits for the RTO), SACK-style recovery looks only at
  segments of the same message, RTO = max(200 ms, 2 * round-trip delay), backoff capped at
  Linux's 120 s, and 15 retransmissions of one segment raise RuntimeError, like Linux's
  net.ipv4.tcp_retries2=15 closes the connection with ETIMEDOUT. (This is not only for 100%
  loss: with `loss gemodel 1% 20%`, whose bad state loses everything, a lone retransmission
  stays in the bad state 15 times in a row with probability 0.8**15 = 3.5%.)
"""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from .netem import LossGemodel, LossRandom, LossState, Netem
from .tables import DIST_SCALE, TABLE_SIZE, table
from .wire import (
    DUPTHRESH,
    HEADER_BYTES,
    MAX_RETRANSMISSIONS,
    RTO_MAX_NS,
    RTO_MIN_NS,
    SEGMENT_BYTES,
    segment_count,
)

U32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1  # the kernel caps jitter to this (tabledist takes an s32 sigma)
CORRELATION_MODES = ("netem", "ar1")

# Below this many packets per batch, a Python loop beats numpy's per-call overhead. Both
# paths consume the random streams identically, so the choice never changes a trace.
_VECTOR_MIN_PACKETS = 16

# Loss model states, named as in the GI model paper (state 1 good reception, 2 good reception
# in a burst, 3 burst loss, 4 isolated loss). The kernel's enum numbers 3 and 4 the other way
# round; only the labels differ, the transitions are identical.
_TX_IN_GAP, _TX_IN_BURST, _LOST_IN_BURST, _LOST_IN_GAP = 1, 2, 3, 4
_GOOD, _BAD = 1, 2
_NO_LOSS, _RANDOM, _FOUR_STATE, _GILBERT_ELLIOTT = "none", "random", "4state", "gemodel"


def percent_to_u32(percent: float) -> int:
    """A percentage on netem's 32-bit scale, as iproute2 sends it: rint(p / 100 * UINT32_MAX)."""
    return min(max(round(percent / 100.0 * U32_MAX), 0), U32_MAX)


# --- Serialisation time ------------------------------------------------------------------


def _packet_time(length: int, rate_bps: int, overhead: int, cell_size: int, cell_ovh: int) -> int:
    length += overhead
    if cell_size:
        cells = -(-length // cell_size)  # the kernel adds a cell for a remainder: ceiling
        length = cells * (cell_size + cell_ovh)
    # max(): the kernel's u64 would wrap around on a negative length
    return max(length, 0) * 8 * 1_000_000_000 // rate_bps  # truncating, as the kernel


def packet_time_ns(spec: Netem, nbytes: int | np.ndarray) -> int | np.ndarray:
    """Time to serialise packet(s) of `nbytes` wire bytes at `spec.rate_bps` (0 if no rate).

    netem's packet_time_ns(): add `packet_overhead`, round up to whole cells of `cell_size`
    bytes each carrying `cell_overhead` extra bytes (ATM-like links), then len * 8 / rate.
    """
    rate = spec.rate_bps
    if isinstance(nbytes, np.ndarray):
        if not rate:
            return np.zeros(nbytes.shape, np.int64)
        length = nbytes.astype(np.int64) + spec.packet_overhead
        if spec.cell_size:
            cells = -(-length // spec.cell_size)
            length = cells * (spec.cell_size + spec.cell_overhead)
        return np.maximum(length, 0) * (8 * 1_000_000_000) // rate
    if not rate:
        return 0
    return _packet_time(int(nbytes), rate, spec.packet_overhead, spec.cell_size, spec.cell_overhead)


# --- Delay distribution --------------------------------------------------------------------


def _c_div(x: np.ndarray, d: int) -> np.ndarray:
    """C integer division (truncates toward zero), unlike Python's // (floors)."""
    return np.where(x >= 0, x // d, -((-x) // d))


def tabledist(
    mu: int, sigma: int, rnd: np.ndarray, dist: np.ndarray | None, *, scaled: bool = False
) -> np.ndarray:
    """netem's tabledist(): a delay of mean `mu` and spread `sigma` from uniform u32 `rnd`.

    Without a table the delay is uniform on [mu - sigma, mu + sigma), taken as
    `rnd % (2 * sigma)`. With a table (values in units of sigma / 8192) the kernel computes
    `table[rnd % 4096] * sigma / 8192` in integers, splitting sigma into a quotient and a
    remainder to avoid overflow and rounding the remainder half away from zero.

    `scaled=True` is our addition for the ar1 correlation mode: it picks the entry from the
    number's high bits (`rnd * n >> 32`) instead of its low bits (`rnd % n`), so that numbers
    close together give delays close together.
    """
    rnd = np.asarray(rnd, dtype=np.int64)
    if sigma == 0:
        return np.full(rnd.shape, mu, dtype=np.int64)
    if dist is None:
        if scaled:  # product < 2**64: fits in uint64, not int64
            offset = (rnd.astype(np.uint64) * np.uint64(2 * sigma)) >> np.uint64(32)
            return offset.astype(np.int64) + (mu - sigma)
        return rnd % (2 * sigma) + (mu - sigma)
    index = (rnd * len(dist)) >> 32 if scaled else rnd % len(dist)
    t = dist[index].astype(np.int64)
    x = (sigma % DIST_SCALE) * t
    x += np.where(x >= 0, DIST_SCALE // 2, -(DIST_SCALE // 2))
    return _c_div(x, DIST_SCALE) + (sigma // DIST_SCALE) * t + mu


def _tabledist1(mu: int, sigma: int, rnd: int, dist: list[int] | None, scaled: bool) -> int:
    """`tabledist` for one number, in plain Python ints (the per-packet path's hot spot)."""
    if dist is None:
        return ((rnd * 2 * sigma) >> 32 if scaled else rnd % (2 * sigma)) + mu - sigma
    t = dist[(rnd * len(dist)) >> 32 if scaled else rnd % len(dist)]
    x = (sigma % DIST_SCALE) * t
    x += DIST_SCALE // 2 if x >= 0 else -(DIST_SCALE // 2)
    q = x // DIST_SCALE if x >= 0 else -((-x) // DIST_SCALE)
    return q + (sigma // DIST_SCALE) * t + mu


def _delay_table(spec: Netem) -> np.ndarray | None:
    return None if spec.distribution == "uniform" else table(spec.distribution)


def sample_delay_ns(
    spec: Netem, rng: np.random.Generator, shape: int | tuple[int, ...]
) -> np.ndarray:
    """Independent netem delays (`tabledist`, uncorrelated, clipped at 0) for many links at once.

    For simulators that need one delay per link per step without a `LinkModel` per link. The
    same distribution as `tabledist` on uniform 32-bit numbers, drawn faster: a table delay is
    one of 4096 values (`rnd % 4096` is exactly uniform), so we draw the index directly; a
    uniform delay is drawn on [mu - sigma, mu + sigma) directly (`rnd % 2sigma` differs from
    that by less than 2sigma / 2**32).
    """
    jitter = min(abs(spec.jitter_ns), INT32_MAX)
    if jitter == 0:
        return np.full(shape, max(spec.delay_ns, 0), dtype=np.int64)
    if spec.distribution == "uniform":
        # Draw the offset in 32 bits (twice as fast as 64), then shift to the mean.
        draws = rng.integers(0, 2 * jitter, size=shape, dtype=np.int32 if 2 * jitter < 2**31
                             else np.int64).astype(np.int64)
        draws += spec.delay_ns - jitter
        return np.maximum(draws, 0, out=draws)
    values = _table_delays(spec.delay_ns, jitter, spec.distribution)
    return values[rng.integers(0, len(values), size=shape, dtype=np.int16 if len(values) <= 32767
                               else np.int64)]


def delay_values_ns(spec: Netem) -> np.ndarray:
    """The one-way delays (ns) netem draws for `spec`, as 4096 equally likely values, sorted
    ascending and read-only: the one source of netem delay tables for every consumer.

    * A table distribution (normal, pareto, paretonormal): exactly the values `tabledist` can
      return, one per table entry, clipped at 0 (int64). These are what `sample_delay_ns`
      and the simulator's ring kernel draw from.
    * Uniform jitter: the midpoints of 4096 equal bins of [delay - jitter, delay + jitter),
      clipped at 0 (float64: the kernel's `rnd % (2 jitter)` has 2 x jitter integer values,
      of which these are the quantiles).
    * No jitter: the delay, 4096 times (int64).

    Only the delay: a rate's serialisation time, loss and the rest come on top.
    """
    jitter = min(abs(spec.jitter_ns), INT32_MAX)
    if jitter == 0:
        values = np.full(TABLE_SIZE, max(spec.delay_ns, 0), dtype=np.int64)
    elif spec.distribution == "uniform":
        k = (np.arange(TABLE_SIZE) + 0.5) / TABLE_SIZE
        values = np.maximum(spec.delay_ns - jitter + 2 * jitter * k, 0)
    else:
        return _table_delays(spec.delay_ns, jitter, spec.distribution)
    values.setflags(write=False)
    return values


@functools.lru_cache(maxsize=64)
def _table_delays(mu: int, sigma: int, distribution: str) -> np.ndarray:
    """The 4096 delays tabledist can give for this mean and spread (clipped at 0; sorted,
    since the tables are), cached: the samplers look them up for every batch of draws."""
    dist = table(distribution)
    values = np.maximum(tabledist(mu, sigma, np.arange(len(dist)), dist), 0)
    values.setflags(write=False)
    return values


# --- Random streams ------------------------------------------------------------------------


class _Draws:
    """One purpose's stream of uniform 32-bit numbers, optionally correlated.

    mode "netem" is the kernel's get_crandom(): with correlation rho (on the u32 scale),
        answer = (fresh * (2**32 - (rho+1)) + last * (rho+1)) >> 32.
    This weighted average of uniforms is not uniform: it bunches around 2**31, so a correlated
    probability no longer means what it says (`loss 10% 50%` loses about 0.1%). And for
    delays it barely correlates anything: tabledist keeps `rnd % table_size` (or
    `rnd % 2*jitter`), the low bits, where two nearby numbers look unrelated. Measured lag-1
    autocorrelation of delays stays ~0 even at 90%.

    mode "ar1" is a Gaussian copula: z_t = r z_(t-1) + sqrt(1 - r^2) e_t with e_t ~ N(0, 1),
    and the stream yields floor(Phi(z_t) * 2**32). Each number is exactly uniform (so every
    probability keeps its meaning), consecutive numbers have correlation ~r, and with
    tabledist's `scaled` indexing a normal delay's lag-1 correlation is r. For a uniform delay
    it is (6 / pi) asin(r / 2), e.g. 0.89 for r = 0.9.
    """

    _CHUNK = 4096  # numbers drawn from numpy per call: amortises its per-call overhead

    def __init__(self, seed: np.random.SeedSequence, correlation_percent: float, mode: str):
        self._rng = np.random.default_rng(seed)
        self._buffer = np.empty(0, dtype=np.int64)
        self._pos = 0
        self._mode = mode
        if mode == "netem":
            self._rho = percent_to_u32(correlation_percent)
            self.correlated = self._rho > 0
            if self.correlated:
                self._last = self.next_raw()  # init_crandom() starts from a random value
        else:
            self._r = min(max(correlation_percent / 100.0, 0.0), 1.0)
            self.correlated = self._r > 0
            self._innovation_scale = math.sqrt(1.0 - self._r**2)
            self._z = float(self._rng.standard_normal())  # start in the stationary law

    def _refill(self, n: int) -> None:
        fresh = self._rng.integers(0, 1 << 32, size=max(self._CHUNK, n), dtype=np.int64)
        self._buffer = np.concatenate([self._buffer[self._pos :], fresh])
        self._pos = 0

    def next_raw(self) -> int:
        if self._pos >= len(self._buffer):
            self._refill(1)
        self._pos += 1
        return int(self._buffer[self._pos - 1])

    def take_raw(self, n: int) -> np.ndarray:
        if self._pos + n > len(self._buffer):
            self._refill(n)
        self._pos += n
        return self._buffer[self._pos - n : self._pos]

    def take(self, n: int) -> np.ndarray:
        """The next `n` numbers as an int64 array of values in [0, 2**32)."""
        if not self.correlated:
            return self.take_raw(n)
        return np.array([self.next() for _ in range(n)], dtype=np.int64)

    def next(self) -> int:
        """The next number (netem's get_crandom())."""
        if not self.correlated:
            return self.next_raw()
        if self._mode == "netem":
            rho = self._rho + 1
            self._last = (self.next_raw() * ((1 << 32) - rho) + self._last * rho) >> 32
            return self._last
        self._z = self._r * self._z + self._innovation_scale * float(self._rng.standard_normal())
        u = 0.5 * (1.0 + math.erf(self._z / math.sqrt(2.0)))  # Phi(z): uniform on (0, 1)
        return min(int(u * 2**32), U32_MAX)


# --- Results -------------------------------------------------------------------------------


@dataclass
class PacketTrace:
    """Every packet copy that entered netem for one message, in enqueue order.

    A copy is an original segment, a retransmission, or a netem duplicate. `send_ns` is the
    copy's time_to_send (-1 when it was dropped before the queue: loss or limit). `lost` means
    the copy delivered no data: dropped, or corrupted (then it has a send time, since it did
    cross the link, but the receiver's checksum discards it).
    """

    seq: np.ndarray  # segment number within the message
    enqueue_ns: np.ndarray
    send_ns: np.ndarray
    lost: np.ndarray
    duplicate: np.ndarray  # a copy made by netem's `duplicate`
    reordered: np.ndarray  # sent at once by netem's `reorder`, jumping the queue


@dataclass
class Transmission:
    """What happened to one message."""

    delivered_ns: int  # when the receiver gets it: all packets in, and in order with its flow
    arrival_ns: int  # when its last packet arrived (before the in-order constraint)
    packets: int  # segments in the message
    lost: int  # packet transmissions lost (incl. corrupt and limit drops); each is retransmitted
    retransmits: int  # so this equals `lost` once the message is through
    duplicates: int  # extra copies made by netem (they use bandwidth; the receiver drops them)
    timeouts: int = 0  # retransmissions triggered by an RTO rather than by fast retransmit
    marked: int = 0  # packets ECN-marked instead of dropped (spec.ecn)
    trace: PacketTrace | None = None  # filled only when LinkModel(trace=True)
    segment_ns: list[int] | None = None  # when each segment's data arrived (the fabric's input)


class _Record:
    """Counters and (optionally) trace rows collected while one message is being sent."""

    def __init__(self, trace: bool):
        self.duplicates = 0
        self.marked = 0
        self.rows: list[list] | None = [[], [], [], [], [], []] if trace else None

    def add(self, seq: int, enq: int, send: int, lost: bool, dup: bool, reord: bool) -> None:
        if self.rows is not None:
            for column, value in zip(self.rows, (seq, enq, send, lost, dup, reord), strict=True):
                column.append(value)

    def add_many(self, seq: list[int], enq: int, send: np.ndarray, lost: np.ndarray) -> None:
        if self.rows is not None:
            n = len(seq)
            columns = (seq, [enq] * n, send, lost, [False] * n, [False] * n)
            for column, values in zip(self.rows, columns, strict=True):
                column.extend(np.asarray(values).tolist())

    def packet_trace(self) -> PacketTrace | None:
        if self.rows is None:
            return None
        seq, enq, send, lost, dup, reord = self.rows
        return PacketTrace(
            np.array(seq, np.int64), np.array(enq, np.int64), np.array(send, np.int64),
            np.array(lost, bool), np.array(dup, bool), np.array(reord, bool),
        )  # fmt: skip


@dataclass
class _Queue:
    """The time-dependent state of netem's queue.

    `tail_ns` is the latest time_to_send handed out (with `rate`, new packets serialise
    behind it). `pending` holds the time_to_send of packets that may still be queued; it is
    pruned lazily, only when the `limit` could be reached or the list grows.
    """

    tail_ns: int = 0
    pending: list[int] = field(default_factory=list)
    prune_at: int = 1024

    def queued(self, now: int) -> int:
        """Packets still in the queue at `now` (netem's qlen): time_to_send > now."""
        self.pending = [t for t in self.pending if t > now]
        self.prune_at = 2 * len(self.pending) + 1024  # keeps pruning amortised O(1)
        return len(self.pending)


# --- The link ------------------------------------------------------------------------------


class LinkModel:
    """One direction of a link impaired by a netem spec. See the module docstring.

    `tail_ns` (the queue tail's time_to_send) may be read and written from outside: processes
    sharing one NIC keep it in shared memory so that their packets queue behind each other.
    The `limit` is counted per LinkModel.
    """

    def __init__(
        self,
        spec: Netem,
        *,
        seed: int = 0,
        link_id: tuple[int, ...] = (),
        segment_bytes: int = SEGMENT_BYTES,
        correlation: str = "netem",
        reverse_delay_ns: int | None = None,
        trace: bool = False,
    ) -> None:
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes must be >= 1, got {segment_bytes}")
        if correlation not in CORRELATION_MODES:
            raise ValueError(f"correlation must be one of {CORRELATION_MODES}, got {correlation!r}")
        if reverse_delay_ns is not None and reverse_delay_ns < 0:
            raise ValueError(f"reverse_delay_ns must be >= 0, got {reverse_delay_ns}")
        seed = spec.seed if spec.seed is not None else seed  # netem's `seed` option wins
        if seed < 0 or any(i < 0 for i in link_id):
            raise ValueError(f"seed and link_id must be >= 0, got {seed} and {link_id}")
        if spec.delay_ns < 0:
            raise ValueError(f"spec.delay_ns must be >= 0, got {spec.delay_ns}")

        self.spec = spec
        self.segment_bytes = segment_bytes
        self.correlation = correlation
        self.trace = trace
        self.reverse_delay_ns = spec.delay_ns if reverse_delay_ns is None else reverse_delay_ns
        self.rto_ns = max(RTO_MIN_NS, 2 * (spec.delay_ns + self.reverse_delay_ns))

        # The spec in the kernel's integer terms.
        self._latency = spec.delay_ns
        self._jitter = min(abs(spec.jitter_ns), INT32_MAX)
        dist = _delay_table(spec)
        self._table = dist
        self._table_list = None if dist is None else dist.tolist()
        self._scaled = correlation == "ar1"
        self._rate = spec.rate_bps
        self._limit = spec.limit
        self._gap = spec.gap
        self._ecn = spec.ecn
        self._dup_u32 = percent_to_u32(spec.duplicate)
        self._corrupt_u32 = percent_to_u32(spec.corrupt)
        self._reorder_u32 = percent_to_u32(spec.reorder)
        self._configure_loss(spec.loss)

        streams = np.random.SeedSequence([seed, *link_id]).spawn(5)
        loss_corr = spec.loss.correlation if isinstance(spec.loss, LossRandom) else 0.0
        self._dup_draws = _Draws(streams[0], spec.duplicate_correlation, correlation)
        self._loss_draws = _Draws(streams[1], loss_corr, correlation)
        self._corrupt_draws = _Draws(streams[2], spec.corrupt_correlation, correlation)
        self._delay_draws = _Draws(streams[3], spec.delay_correlation, correlation)
        self._reorder_draws = _Draws(streams[4], spec.reorder_correlation, correlation)

        self._counter = 0  # netem's reorder counter: packets delayed since the last reorder
        self._queue = _Queue()
        self._last_delivered: dict[int, int] = {}
        # Duplicates re-enter netem and reordering depends on the counter: with either, how many
        # random numbers a packet consumes depends on earlier packets, so go one at a time.
        self._one_at_a_time = self._dup_u32 > 0 or self._gap > 0
        self._force_loop = False  # tests set this to check that both paths agree

    def _configure_loss(self, loss: LossRandom | LossState | LossGemodel | None) -> None:
        self._loss_u32 = 0
        self._clg = (0, 0, 0, 0, 0)  # a1..a5 as in the kernel's struct clgstate
        self._clg_state = 0  # the Markov chain's state (4-state and Gilbert-Elliott models)
        if isinstance(loss, LossRandom):
            self._loss_u32 = percent_to_u32(loss.percent)
            self._loss_model = _RANDOM if self._loss_u32 else _NO_LOSS
        elif isinstance(loss, LossState):
            self._loss_model = _FOUR_STATE
            self._clg = tuple(
                percent_to_u32(p) for p in (loss.p13, loss.p31, loss.p32, loss.p14, loss.p23)
            )
            self._clg_state = _TX_IN_GAP
        elif isinstance(loss, LossGemodel):
            self._loss_model = _GILBERT_ELLIOTT
            # iproute2 sends h = 1 - (1-h) and the kernel loses when rnd > h, i.e. with
            # probability 1-h in the bad state. 1-k is sent as is and lost when rnd < 1-k.
            h = U32_MAX - percent_to_u32(loss.one_minus_h)
            p, r, k1 = (percent_to_u32(v) for v in (loss.p, loss.r, loss.one_minus_k))
            self._clg = (p, r, h, k1, 0)
            self._clg_state = _GOOD
        else:
            self._loss_model = _NO_LOSS

    @property
    def tail_ns(self) -> int:
        """time_to_send of the last packet queued on this link (the NIC's queue tail)."""
        return self._queue.tail_ns

    @tail_ns.setter
    def tail_ns(self, value: int) -> None:
        self._queue.tail_ns = int(value)

    # --- public API --------------------------------------------------------------------------

    def transmit(self, now_ns: int, nbytes: int, flow: int = 0) -> Transmission:
        """Send an `nbytes` message at `now_ns` on TCP connection `flow`; see the module doc."""
        return self._send(int(now_ns), nbytes, flow)

    def one_way_delays(
        self, n: int, start_ns: int = 0, interval_ns: int = 0, *, nbytes: int = 0
    ) -> np.ndarray:
        """Delays (delivered - sent, ns) of `n` probes sent every `interval_ns` from `start_ns`.

        A probe is an `nbytes` message, by default one empty packet. Probes are independent
        (no in-order wait between them), as with ping, but they do share the link's queue:
        probes sent faster than they drain queue up and beyond `limit` are dropped.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        out = np.empty(n, dtype=np.int64)
        for i in range(n):
            sent = start_ns + i * interval_ns
            out[i] = self._send(sent, nbytes, None).delivered_ns - sent
        return out

    # --- one message: segments, recovery, in-order delivery ----------------------------------

    def _segments(self, nbytes: int) -> list[int]:
        """Wire lengths of the message's packets (a 0-byte message still sends one packet)."""
        n = segment_count(nbytes, segment_bytes=self.segment_bytes)
        last = nbytes - (n - 1) * self.segment_bytes
        return [self.segment_bytes + HEADER_BYTES] * (n - 1) + [last + HEADER_BYTES]

    def _send(self, now: int, nbytes: int, flow: int | None) -> Transmission:
        # Plain lists here: most messages are a single packet, where numpy's per-call
        # overhead would cost more than the work itself.
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        wire = self._segments(nbytes)
        record = _Record(self.trace)
        arrival = self._enqueue(now, wire, list(range(len(wire))), self._queue, record)
        lost = arrival.count(-1)
        retransmits = timeouts = 0
        if lost:
            retransmits, timeouts, lost_again = self._recover(now, wire, arrival, record)
            lost += lost_again
        last_arrival = max(arrival)
        delivered = last_arrival
        if flow is not None:
            delivered = max(delivered, self._last_delivered.get(flow, delivered))
            self._last_delivered[flow] = delivered
        return Transmission(
            delivered_ns=delivered, arrival_ns=last_arrival, packets=len(wire), lost=lost,
            retransmits=retransmits, duplicates=record.duplicates, timeouts=timeouts,
            marked=record.marked, trace=record.packet_trace(), segment_ns=arrival,
        )  # fmt: skip

    def _recover(
        self, now: int, wire: list[int], arrival: list[int], record: _Record
    ) -> tuple[int, int, int]:
        """TCP retransmits every lost segment until it arrives; fills `arrival` in place.

        Returns (retransmissions, of which by timeout, losses of retransmissions).
        """
        events: list[tuple[int, int]] = []  # (retransmission time, segment), a min-heap
        backoff: dict[int, int] = {}  # RTOs so far per segment: the timer doubles each time
        timeouts = 0

        def schedule_rto(seq: int, sent: int) -> None:
            nonlocal timeouts
            rto = min(self.rto_ns << backoff.get(seq, 0), RTO_MAX_NS)
            backoff[seq] = backoff.get(seq, 0) + 1
            timeouts += 1
            heapq.heappush(events, (sent + rto, seq))

        first = np.array(arrival, dtype=np.int64)
        for seq in np.flatnonzero(first < 0).tolist():
            later = first[seq + 1 :]
            later = later[later >= 0]
            if len(later) >= DUPTHRESH:
                # The 3rd later segment to arrive completes the evidence; its SACK needs one
                # reverse delay to reach the sender, which then retransmits at once.
                third = int(np.partition(later, DUPTHRESH - 1)[DUPTHRESH - 1])
                heapq.heappush(events, (third + self.reverse_delay_ns, seq))
            else:
                schedule_rto(seq, now)

        private = _Queue()  # for retransmissions after the shared queue has drained
        attempts: dict[int, int] = {}
        retransmits = lost_again = 0
        while events:
            when, seq = heapq.heappop(events)
            batch = [seq]
            while events and events[0][0] == when:  # same instant: one burst, like a message
                batch.append(heapq.heappop(events)[1])
            batch.sort()
            for s in batch:
                attempts[s] = attempts.get(s, 0) + 1
                if attempts[s] > MAX_RETRANSMISSIONS:
                    raise RuntimeError(
                        f"segment {s} was lost {attempts[s]} times in a row: Linux TCP gives up "
                        f"after {MAX_RETRANSMISSIONS} retransmissions and the connection times "
                        f"out. Is the loss rate 100%, or does a bursty loss model stay in a "
                        f"lossy state for long (each retransmission is one step of its chain)?"
                    )
            retransmits += len(batch)
            queue = self._queue if when < self._queue.tail_ns else private
            got = self._enqueue(when, [wire[s] for s in batch], batch, queue, record)
            for s, a in zip(batch, got, strict=True):
                if a >= 0:
                    arrival[s] = a
                else:
                    lost_again += 1
                    schedule_rto(s, when)
        return retransmits, timeouts, lost_again

    # --- netem_enqueue for a burst of packets at the same instant ----------------------------

    def _enqueue(
        self, now: int, wire: list[int], seqs: list[int], queue: _Queue, record: _Record
    ) -> list[int]:
        """Enqueue packets in order at `now`; per packet, when its data arrives (-1: never)."""
        n = len(wire)
        if len(queue.pending) >= queue.prune_at:
            queue.queued(now)  # bounds memory when the limit is large
        vector = n >= _VECTOR_MIN_PACKETS and not self._one_at_a_time and not self._force_loop
        # With no duplicates, the queue grows by at most n: if that stays within the limit no
        # packet can be tail-dropped, and the drop test can be skipped for the whole burst.
        if vector and len(queue.pending) + n > self._limit:
            vector = queue.queued(now) + n <= self._limit
        if vector:
            wire_array = np.array(wire, dtype=np.int64)
            return self._enqueue_vector(now, wire_array, seqs, queue, record).tolist()
        return [
            self._enqueue_packet(now, length, seq, queue, record, True)
            for length, seq in zip(wire, seqs, strict=True)
        ]

    def _enqueue_packet(
        self, now: int, length: int, seq: int, queue: _Queue, record: _Record, may_dup: bool
    ) -> int:
        """netem_enqueue() for one packet, line by line; returns its data's arrival or -1."""
        copies = 1
        if may_dup and self._dup_u32 and self._dup_u32 >= self._dup_draws.next():
            copies += 1
        if self._loss_event():
            if self._ecn:
                record.marked += 1
            else:
                copies -= 1  # a duplicated packet that is "lost" still goes out once
        if copies == 0:
            record.add(seq, now, -1, True, not may_dup, False)
            return -1
        corrupted = bool(self._corrupt_u32) and self._corrupt_u32 >= self._corrupt_draws.next()
        if len(queue.pending) >= self._limit and queue.queued(now) >= self._limit:
            record.add(seq, now, -1, True, not may_dup, False)  # tail drop, with its duplicate
            return -1
        arrival = -1
        if copies > 1:
            # The duplicate re-enters netem (it may be lost, corrupted...) before the original
            # is queued, so it takes the queue tail first.
            record.duplicates += 1
            arrival = self._enqueue_packet(now, length, seq, queue, record, False)
        if (
            self._gap == 0
            or self._counter < self._gap - 1
            or self._reorder_u32 < self._reorder_draws.next()
        ):
            delay = self._latency
            if self._jitter:
                delay = _tabledist1(
                    self._latency, self._jitter, self._delay_draws.next(), self._table_list,
                    self._scaled,
                )  # fmt: skip
                delay = max(delay, 0)
            if self._rate:
                # Serialise behind the queue tail: the jitter overlapping the wait is absorbed.
                send = max(queue.tail_ns, now + delay) + self._packet_time(length)
                queue.tail_ns = send
            else:
                send = now + delay
                queue.tail_ns = max(queue.tail_ns, send)
            self._counter += 1
            if send > now:
                queue.pending.append(send)
            reordered = False
        else:
            send = now  # reordered: to the head of the queue, out at once
            self._counter = 0
            reordered = True
        record.add(seq, now, send, corrupted, not may_dup, reordered)
        if not corrupted and (arrival < 0 or send < arrival):
            arrival = send
        return arrival

    def _enqueue_vector(
        self, now: int, wire: np.ndarray, seqs: list[int], queue: _Queue, record: _Record
    ) -> np.ndarray:
        """`_enqueue_packet` for a whole burst with numpy: same draws, same results.

        Valid without duplicates, reordering or limit pressure (see `_enqueue`).
        """
        n = len(wire)
        lost = self._loss_events(n)
        if self._ecn:
            record.marked += int(lost.sum())
            lost[:] = False
        keep = ~lost
        kept = int(keep.sum())
        corrupted = np.zeros(n, dtype=bool)
        if self._corrupt_u32 and kept:
            corrupted[keep] = self._corrupt_u32 >= self._corrupt_draws.take(kept)
        if self._jitter:
            rnd = self._delay_draws.take(kept)
            delay = tabledist(self._latency, self._jitter, rnd, self._table, scaled=self._scaled)
            earliest = now + np.maximum(delay, 0)
        else:
            earliest = np.full(kept, now + self._latency, dtype=np.int64)
        if self._rate and kept:
            # The recurrence send_i = max(send_(i-1), earliest_i) + ptime_i, with S the running
            # sum of packet times, is send_i = S_i + max(tail, max_(k<=i) (earliest_k - S_(k-1))).
            p = packet_time_ns(self.spec, wire[keep])
            s = np.cumsum(p)
            start = np.maximum.accumulate(earliest - (s - p))
            send_kept = np.maximum(start, queue.tail_ns) + s
        else:
            send_kept = earliest
        if kept:
            queue.tail_ns = max(queue.tail_ns, int(send_kept.max()))
            queue.pending.extend(send_kept[send_kept > now].tolist())
        self._counter += kept
        send = np.full(n, -1, dtype=np.int64)
        send[keep] = send_kept
        record.add_many(seqs, now, send, lost | corrupted)
        return np.where(lost | corrupted, -1, send)

    def _packet_time(self, length: int) -> int:
        s = self.spec
        return _packet_time(length, self._rate, s.packet_overhead, s.cell_size, s.cell_overhead)

    # --- loss models ---------------------------------------------------------------------------

    def _loss_event(self) -> bool:
        """netem's loss_event() for one packet."""
        model = self._loss_model
        if model == _NO_LOSS:
            return False
        if model == _RANDOM:
            return self._loss_u32 >= self._loss_draws.next()
        if model == _FOUR_STATE:
            return self._four_state(self._loss_draws.next())
        return self._gilbert_elliott(self._loss_draws.next(), self._loss_draws.next())

    def _loss_events(self, n: int) -> np.ndarray:
        """`_loss_event` for n packets in a row, consuming the same random numbers."""
        model = self._loss_model
        if model == _NO_LOSS:
            return np.zeros(n, dtype=bool)
        if model == _RANDOM:
            return self._loss_u32 >= self._loss_draws.take(n)
        if model == _FOUR_STATE:  # a Markov chain is sequential by nature
            rnd = self._loss_draws.take(n).tolist()
            return np.fromiter(map(self._four_state, rnd), dtype=bool, count=n)
        rnd = self._loss_draws.take(2 * n).tolist()
        return np.fromiter(map(self._gilbert_elliott, rnd[0::2], rnd[1::2]), dtype=bool, count=n)

    def _four_state(self, rnd: int) -> bool:
        """The kernel's loss_4state(): one transition, True if it enters a loss state."""
        p13, p31, p32, p14, p23 = self._clg
        state = self._clg_state
        if state == _TX_IN_GAP:
            if rnd < p14:
                self._clg_state = _LOST_IN_GAP
                return True
            if rnd < p13 + p14:
                self._clg_state = _LOST_IN_BURST
                return True
        elif state == _TX_IN_BURST:
            if rnd < p23:
                self._clg_state = _LOST_IN_BURST
                return True
        elif state == _LOST_IN_BURST:
            if rnd < p32:
                self._clg_state = _TX_IN_BURST
            elif rnd < p31 + p32:
                self._clg_state = _TX_IN_GAP
            else:
                return True
        else:  # an isolated loss is always followed by a reception
            self._clg_state = _TX_IN_GAP
        return False

    def _gilbert_elliott(self, rnd_transition: int, rnd_loss: int) -> bool:
        """The kernel's loss_gilb_ell(): move, then lose with the *previous* state's odds."""
        p, r, h, one_minus_k, _ = self._clg
        if self._clg_state == _GOOD:
            if rnd_transition < p:
                self._clg_state = _BAD
            return rnd_loss < one_minus_k
        if rnd_transition < r:
            self._clg_state = _GOOD
        return rnd_loss > h
