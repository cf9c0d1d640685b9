"""Lab 01: measure a network. Ping-pong, a message-size sweep, an α-β fit, and a mystery link.

The staircase the learner climbs (solutions/01_measure_a_network.ipynb):

1. `net_naive`: one ping of one size, timed once, called "the latency". It reports a round
   trip (twice the one-way delay), one jittery draw, and for a large message the bandwidth
   too.
2. `net_ping_pong`: many round trips, and one-way = median / 2. The median ignores the rare
   slow round trip (a jitter tail, a retransmission, a stalled process) that pulls a mean.
3. `net_fit`: one-way time against message size, fitted by least squares: t = α + nβ.
4. `net_mystery`: all of it on a network drawn from a seed (`mystery_network`), whose
   spec does not show itself; the check compares α and the bandwidth with the hidden truth,
   and the hidden checks do the same on networks the learner has never seen.

Units throughout: α in seconds (one-way), β in seconds per byte, bandwidth = 1/β in BYTES
per second (netem's `rate` is in bits per second: 100mbit = 12.5e6 bytes/s).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from .. import models
from ..netem import Netem
from ..tables import DIST_SCALE, table
from .core import Fail, Lab, NotDone, earlier_failure, remember_failure

LAB = Lab("01_measure_a_network", "Measure a network: ping-pong, a size sweep and the α-β fit",
          follows="01_nic_latency_jitter")

ALPHA_TOLERANCE = 0.15  # |estimate / truth - 1| the mystery check accepts for α
BANDWIDTH_TOLERANCE = 0.15  # ... and for the bandwidth
PRACTICE_SEED = 1  # the mystery network of the visible check (the notebook shows it)
RUN_TIMEOUT = 3.0  # seconds a ping check may take (x its dilation): a deadlock fails fast
KIB = 1024

# --- the mystery network -----------------------------------------------------------------------


class HiddenNetwork(str):
    """A netem spec that `clusterlab.Cluster(nic=...)` accepts (it is a str, and parses as
    one) but that prints, formats and displays as `<hidden network #seed>`.

    Nothing is secret from someone who wants to look (the value is a string, and a running
    Cluster knows its spec); the point is that measuring must not be spoiled by a glance.
    """

    label: str

    def __new__(cls, spec: str, label: str = "?") -> HiddenNetwork:
        obj = super().__new__(cls, spec)
        obj.label = label
        return obj

    def __repr__(self) -> str:
        return f"<hidden network #{self.label}>"

    __str__ = __repr__

    def __format__(self, format_spec: str) -> str:
        return format(repr(self), format_spec)

    def __reduce__(self):  # pickles (to a rank, say) as itself, label included
        return (HiddenNetwork, (str.__str__(self), self.label))


def mystery_network(seed: int) -> HiddenNetwork:
    """A network drawn from `seed`: delay 1-5 ms, jitter (uniform or normal, its standard
    deviation 3-10% of the delay), rate 100-500 Mbit/s, and netem's own seed for the draws.

    The jitter is symmetric (uniform, or netem's normal table, too narrow to be clipped at
    zero), so the median one-way delay is the configured delay, and the median round trip
    twice that: α's truth is the delay, the bandwidth's the rate in bytes/s.
    """
    if not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    rng = np.random.default_rng([0x6E6574, int(seed)])  # "net": its own stream per seed
    delay_us = int(rng.uniform(1000, 5000))
    distribution = ("uniform", "normal")[int(rng.integers(2))]
    sd_us = rng.uniform(0.03, 0.10) * delay_us
    # uniform on [d - J, d + J) has standard deviation J / sqrt(3); netem's normal table, J
    jitter_us = max(1, round(sd_us * math.sqrt(3) if distribution == "uniform" else sd_us))
    rate_kbit = round(math.exp(rng.uniform(math.log(100_000), math.log(500_000))))
    netem_seed = int(rng.integers(2**31))
    spec = f"delay {delay_us}us {jitter_us}us"
    spec += "" if distribution == "uniform" else f" distribution {distribution}"
    spec += f" rate {rate_kbit}kbit seed {netem_seed}"
    return HiddenNetwork(spec, str(seed))


def reveal(network: str | Netem) -> Netem:
    """The spec behind a hidden network (for after you measured it)."""
    return network if isinstance(network, Netem) else Netem.parse(str.__str__(network))


def truth(network: str | Netem) -> tuple[float, float]:
    """(α in s, bandwidth in bytes/s) of a network: its delay, and its rate / 8.

    The bandwidth is the line rate; the 66 header bytes per 64 KiB segment take 0.1% of it,
    far inside the check's tolerance.
    """
    spec = reveal(network)
    return spec.delay_s, spec.rate_Bps


# --- rank-side helpers (module level, so they pickle by reference) ------------------------------


def _traced(fn, *args):
    """Run the learner's `fn(*args)` on this rank; return its result, the emulated seconds it
    took, and the (peer, bytes) of every point-to-point message this rank sent meanwhile
    (the cluster must be started with trace=True)."""
    import torch.distributed as dist

    from ..clock import now

    trace = getattr(dist.group.WORLD, "trace", None)
    trace = [] if trace is None else trace  # (an empty trace is falsy: test for None)
    start = len(trace)
    dist.barrier()
    t0 = now()
    out = fn(*args)
    seconds = now() - t0
    sent = [(int(peer), int(nbytes)) for peer, _, nbytes, _ in trace[start:]]
    return {"out": out, "seconds": seconds, "sent": sent}


def _run(ctx, cl, fn, *args) -> list:
    """ctx.run(cl, _traced, fn, ...), with a ping-pong's usual deadlock explained (and not
    waited for again by the exercise's later checks)."""
    earlier = earlier_failure(fn)
    if earlier is not None:
        raise Fail(earlier + " (found by an earlier check: not run again)")
    try:
        return ctx.run(cl, _traced, fn, *args)
    except Fail as exc:
        if str(exc).startswith("timed out"):
            message = (f"{exc} In a ping-pong, rank 0 sends and then waits in recv for the "
                       "echo; rank 1 must recv each ping and send it straight back to rank 0, "
                       "as many times as rank 0 pings.")
            remember_failure(fn, message)
            raise Fail(message) from None
        raise


def _seconds(value, what: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise Fail(f"{what} should be a number of seconds (a float), got {value!r}") from None
    if not math.isfinite(x):
        raise Fail(f"{what} is {x}: it should be a finite number of seconds")
    return x


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


# --- step 1: the naive ping ----------------------------------------------------------------------

NAIVE = LAB.exercise(
    "net_naive", needs=("naive_latency",),
    title="Step 1: one ping, timed once",
    hints=(
        "The idea: a round trip is ping + echo. Rank 0 sends, rank 1 receives and sends the "
        "same bytes back, rank 0 receives. Only rank 0 times, on the cluster's clock "
        "(clusterlab.now / clusterlab.elapsed), and dist.send returns as soon as Gloo has "
        "taken the bytes, long before they arrive: stop the clock after the echo is in.",
        "The message: nbytes bytes of float32 are nbytes // 4 elements; send at least one "
        "(max(1, nbytes // 4)) so that tiny sizes still send something.",
        "A sketch. Rank 0: t0 = clusterlab.now(); dist.send(x, 1); dist.recv(x, 1); return "
        "clusterlab.elapsed(t0). Rank 1: dist.recv(x, 0); dist.send(x, 0); return None.",
    ))


def _naive_round_trip(ctx, nic: str, nbytes: int, tries: int = 3) -> float:
    """Run naive_latency(nbytes) `tries` times through `nic`; check the messages of each; return
    rank 0's fastest answer (this machine's noise only ever adds, so the fastest is the one to
    compare with the network)."""
    fn = ctx.learner("naive_latency")
    answers = []
    # dilated: a single ping is all noise-prone, and this machine's noise counts 1/4 here
    with ctx.cluster(nodes=2, nic=nic, trace=True, timeout=RUN_TIMEOUT, dilation=4) as cl:
        for _ in range(tries):
            r0, r1 = _run(ctx, cl, fn, nbytes)
            answers.append(_seconds(r0["out"], "rank 0's naive_latency"))
            for rank, r, peer in ((0, r0, 1), (1, r1, 0)):
                sizes = [n for p, n in r["sent"] if p == peer]
                if len(sizes) != 1:
                    what = "ping" if rank == 0 else "echo"
                    raise Fail(f"rank {rank} sent {len(sizes)} messages to rank {peer}; the "
                               f"naive measurement is ONE {what} (send once, receive once)")
                if not nbytes <= sizes[0] <= nbytes + 8:
                    whose = "rank 0's ping" if rank == 0 else "rank 1's echo"
                    raise Fail(f"{whose} carried {sizes[0]} bytes, not nbytes = {nbytes}: send "
                               "a tensor of nbytes bytes (torch.zeros(max(1, nbytes // 4)) is "
                               "float32, 4 bytes each), and echo the same tensor back")
            if r0["seconds"] > 0 and answers[-1] > 50 * r0["seconds"]:
                raise Fail(f"rank 0 returned {answers[-1]:g}, but the call took "
                           f"{_ms(r0['seconds'])}: return seconds (clusterlab.elapsed gives "
                           "seconds), not milliseconds")
    return min(answers)


@NAIVE.check("one ping comes back; rank 0 returns its round trip", points=1)
def _naive_small(ctx):
    nic, delay = "delay 2ms", 2e-3
    t = _naive_round_trip(ctx, nic, 8)
    if t < 0.5 * delay:
        raise Fail(f"rank 0 returned {_ms(t)} through '{nic}': you stopped the clock before "
                   "the ping arrived (dist.send returns once Gloo has the bytes). Stop it after "
                   "dist.recv has the echo")
    if t < 1.5 * delay:
        raise Fail(f"rank 0 returned {_ms(t)} through '{nic}', one crossing: in this step "
                   "return the raw round trip, from rank 0's send until its recv of the echo "
                   "(halving it is step 2's idea)")
    if t > 10 * delay:
        raise Fail(f"the fastest of 3 answers was {_ms(t)} through '{nic}', where a round trip "
                   f"takes {_ms(2 * delay)}: start the clock just before dist.send and stop it "
                   "as soon as the echo is in")
    return f"{_ms(t)} for a round trip through '{nic}' (the fastest of 3)"


@NAIVE.check("the ping and its echo carry nbytes bytes", points=1)
def _naive_size(ctx):
    nic, nbytes = "delay 1ms rate 200mbit", 64 * KIB
    expected = 2 * (1e-3 + nbytes / 25e6)
    t = _naive_round_trip(ctx, nic, nbytes)
    if not 0.8 * expected <= t <= 3 * expected:
        raise Fail(f"a {nbytes // KIB} KiB round trip through '{nic}' takes about "
                   f"{_ms(expected)} (2 x (1 ms + n / rate)); the fastest of rank 0's 3 answers "
                   f"was {_ms(t)}")
    return f"{_ms(t)} for {nbytes // KIB} KiB there and back (α-β predicts {_ms(expected)})"


@NAIVE.check("other delays and sizes", points=1, hidden=True)
def _naive_hidden(ctx):
    delay_us = int(ctx.rng.integers(800, 4000))
    nbytes = int(ctx.rng.choice([4, 16, 32, 128])) * KIB
    nic = f"delay {delay_us}us rate 400mbit"
    expected = 2 * (delay_us * 1e-6 + nbytes / 50e6)
    t = _naive_round_trip(ctx, nic, nbytes)
    if not 0.85 * expected <= t <= 3 * expected:
        raise Fail(f"through '{nic}', a {nbytes // KIB} KiB round trip takes about "
                   f"{_ms(expected)}; the fastest of rank 0's 3 answers was {_ms(t)}")
    return f"'{nic}', {nbytes // KIB} KiB: {_ms(t)}"


# --- step 2: ping-pong, many times, and the median ------------------------------------------------

PING = LAB.exercise(
    "net_ping_pong", needs=("ping_pong", "one_way_latency"),
    title="Step 2: many round trips, one-way = median / 2",
    hints=(
        "ping_pong is naive_latency in a loop: rank 0 appends one round trip per repeat and "
        "returns the list; rank 1 echoes `repeats` times and returns [].",
        "one_way_latency(rtts) = the median of the round trips, divided by 2: "
        "float(np.median(rtts)) / 2. A round trip crosses the network twice.",
        "Why not the mean? One slow round trip (a retransmission costs >= 200 ms, a jitter "
        "tail, a descheduled process) moves a mean of 30 samples by milliseconds; it moves "
        "the median by one rank.",
    ))


def _ping_pong_rtts(ctx, nic: str, nbytes: int, repeats: int,
                    dilation: float = 1.0) -> list[float]:
    """Run the learner's ping_pong through `nic`; check its messages; return rank 0's RTTs."""
    fn = ctx.learner("ping_pong")
    with ctx.cluster(nodes=2, nic=nic, trace=True, timeout=RUN_TIMEOUT * dilation,
                     dilation=dilation) as cl:
        r0, r1 = _run(ctx, cl, fn, nbytes, repeats)
    out = r0["out"]
    if hasattr(out, "tolist"):  # a numpy array or a torch tensor of round trips
        out = out.tolist()
    if not isinstance(out, list | tuple):
        raise Fail(f"rank 0's ping_pong returned {type(out).__name__}: return the list of "
                   "round trips (one float of seconds per repeat)")
    rtts = [_seconds(x, "a round trip") for x in out]
    if len(rtts) != repeats:
        raise Fail(f"ping_pong({nbytes}, {repeats}) returned {len(rtts)} round trips on rank "
                   f"0: one per repeat, {repeats} in all")
    for rank, r, peer in ((0, r0, 1), (1, r1, 0)):
        sizes = [n for p, n in r["sent"] if p == peer]
        wrong = [n for n in sizes if not nbytes <= n <= nbytes + 8]
        if wrong:
            raise Fail(f"rank {rank} sent a {wrong[0]}-byte message, not nbytes = {nbytes}: ping "
                       "with a tensor of nbytes bytes and echo the same tensor")
        if len(sizes) != repeats:
            raise Fail(f"rank {rank} sent {len(sizes)} messages to rank {peer} for {repeats} "
                       "repeats: one ping and one echo per repeat")
    return rtts


_PING_MISTAKES = (
    ("median", "your times are twice the one-way delay: you returned the median round trip; "
               "divide the round trip by 2 (it crosses the network twice)"),
    ("mean/2", "that is half the MEAN round trip: a few slow round trips (the heavy pareto "
               "tail, a 200 ms retransmission) pull a mean far from what a typical message "
               "sees; use the median"),
    ("mean", "that is the mean round trip: it is twice the one-way delay (divide by 2), and "
             "under heavy-tailed jitter the mean is pulled by the rare slow trips (use the "
             "median)"),
    ("min/2", "that is half the FASTEST round trip: the luckiest jitter draw, below what a "
              "typical message sees; use the median"),
    ("min", "that is the fastest round trip: twice the one-way time (divide by 2), and the "
            "luckiest draw (use the median)"),
    ("max/2", "that is half the slowest round trip: one unlucky message; use the median"),
)


def _one_way_verdict(ctx, rtts) -> float:
    """Call the learner's one_way_latency on `rtts`; fail with the likely mistake unless it
    is half their median."""
    fn = ctx.learner("one_way_latency")
    got = _seconds(ctx.call(fn, list(rtts)), "one_way_latency(rtts)")
    a = np.asarray(rtts, dtype=float)
    want = float(np.median(a)) / 2
    ordered = np.sort(a)  # of an even count, any value between the middle two is a median
    low, high = ordered[(len(a) - 1) // 2] / 2, ordered[len(a) // 2] / 2
    if low * (1 - 1e-6) <= got <= high * (1 + 1e-6):
        return got
    candidates = {"median": 2 * want, "mean/2": a.mean() / 2, "mean": a.mean(),
                  "min/2": a.min() / 2, "min": a.min(), "max/2": a.max() / 2}
    for name, why in _PING_MISTAKES:
        if abs(got - candidates[name]) <= 1e-6 * abs(candidates[name]):
            raise Fail(f"one_way_latency returned {_ms(got)} for {len(a)} round trips whose "
                       f"median is {_ms(2 * want)}: {why}")
    raise Fail(f"one_way_latency returned {_ms(got)} for {len(a)} round trips whose median is "
               f"{_ms(2 * want)}; the one-way latency is half the median: {_ms(want)}")


def _pareto_rtts(rng: np.random.Generator, n: int, delay: float, jitter: float) -> np.ndarray:
    """n round trips through two links of `delay` with netem's pareto jitter, as the table
    draws them, plus a retransmission timeout on about 1 in 15 (seconds)."""
    values = table("pareto").astype(float) / DIST_SCALE
    one_way = delay + jitter * rng.choice(values, size=(n, 2))
    rtts = one_way.sum(axis=1)
    lost = rng.choice(n, size=max(1, n // 15), replace=False)
    rtts[lost] += 0.2
    return rtts


@PING.check("ping_pong: `repeats` round trips on rank 0, each a real echo", points=1)
def _ping_shape(ctx):
    nic, delay, jitter = "delay 2ms 500us", 2e-3, 0.5e-3
    rtts = _ping_pong_rtts(ctx, nic, 8, 15, dilation=3)
    low = 2 * (delay - jitter)
    if min(rtts) < 0.95 * low:
        halves = min(rtts) >= 0.95 * (delay - jitter)  # at least one crossing, not two
        raise Fail(f"the fastest round trip you returned is {_ms(min(rtts))}, but through "
                   f"'{nic}' none can take less than {_ms(low)} (two crossings of at least "
                   f"{_ms(delay - jitter)})" + (": these look like one-way times; return the "
                                                "raw round trips (halving is one_way_latency's "
                                                "job)" if halves else ""))
    if np.all(np.diff(rtts) > 0) and rtts[-1] > 0.8 * len(rtts) * low:
        raise Fail(f"your round trips only grow ({_ms(rtts[0])}, {_ms(rtts[1])}, ... "
                   f"{_ms(rtts[-1])}): each is the time since the FIRST ping; restart the clock "
                   "(t0 = clusterlab.now()) before every ping")
    if max(rtts) - min(rtts) < 1e-4:
        raise Fail(f"all 15 round trips are within 0.1 ms of each other through '{nic}', whose "
                   "jitter spreads them over 2 ms: time each repeat separately (restart the "
                   "clock for every ping)")
    return f"15 round trips, {_ms(min(rtts))} .. {_ms(max(rtts))}"


@PING.check("one_way_latency is half the median round trip (heavy-tailed samples)", points=2)
def _ping_estimator(ctx):
    rng = np.random.default_rng(11)
    rtts = _pareto_rtts(rng, 31, 2e-3, 1e-3)
    got = _one_way_verdict(ctx, rtts)
    return (f"{_ms(got)} from {len(rtts)} round trips ({int((rtts > 0.1).sum())} of them with a "
            "retransmission)")


@PING.check("close to the delay on a jittery network (-10% .. +25%)", points=1)
def _ping_accuracy(ctx):
    nic, delay = "delay 2ms 500us seed 5", 2e-3
    low, high = 0.9, 1.25  # this machine's noise only ever adds: the margin above is wider

    def measure() -> float:  # dilated 3x, so that this machine's noise counts a third
        return _one_way_verdict(ctx, _ping_pong_rtts(ctx, nic, 8, 41, dilation=3))

    got = measure()
    if not low <= got / delay <= high and 0.7 < got / delay < 1.6:
        got = measure()  # a burst of load on this machine? a near miss is measured again
    if not low <= got / delay <= high:
        dilated = 2.6 < got / delay < 3.6
        raise Fail(f"through '{nic}' your one-way latency is {_ms(got)}, {got / delay:.2f}x the "
                   f"{_ms(delay)} delay (the median of a symmetric jitter is the delay)"
                   + (": about 3x, and this check runs the cluster dilated 3x. Time with "
                      "clusterlab.now() / clusterlab.elapsed() (the cluster's clock, which "
                      "undoes the dilation), not time.time() or time.perf_counter()"
                      if dilated else
                      ": are the round trips timed from the send to the echo's arrival?"))
    return f"{_ms(got)} through '{nic}' (41 pings; configured {_ms(delay)})"


@PING.check("a heavy-tailed lossy network, other sizes and repeats", points=2, hidden=True)
def _ping_hidden(ctx):
    delay_us = int(ctx.rng.integers(1000, 3000))
    jitter_us = int(delay_us * ctx.rng.uniform(0.2, 0.5))
    nbytes = int(ctx.rng.choice([1, 4, 16])) * KIB
    repeats = int(ctx.rng.integers(20, 36))
    nic = (f"delay {delay_us}us {jitter_us}us distribution pareto loss 1% "
           f"seed {int(ctx.rng.integers(2**31))}")
    rtts = _ping_pong_rtts(ctx, nic, nbytes, repeats, dilation=2)
    low = 2 * (delay_us - 0.67 * jitter_us) * 1e-6  # the pareto table's smallest value is -2σ/3
    if min(rtts) < 0.95 * low:
        raise Fail(f"a round trip of {_ms(min(rtts))} through '{nic}' is faster than the "
                   f"network allows ({_ms(low)}): return raw round trips")
    got = _one_way_verdict(ctx, rtts)
    if not 0.7 < got / (delay_us * 1e-6) < 1.3:
        raise Fail(f"through '{nic}' your one-way latency is {_ms(got)}, far from the "
                   f"{_ms(delay_us * 1e-6)} delay")
    return f"'{nic}', {nbytes} B x {repeats}: {_ms(got)}"


# --- step 3: the α-β fit --------------------------------------------------------------------------

FIT = LAB.exercise(
    "net_fit", needs=("fit_alpha_beta",),
    title="Step 3: least squares for t = α + nβ",
    hints=(
        "The idea: least squares picks the line with the smallest sum of squared vertical "
        "distances to the points. α is its intercept (s, a zero-byte message), β its slope "
        "(s per byte); return them in that order. With every point at one size, no line is "
        "determined: raise ValueError.",
        "The formula: β = Σ(n - n̄)(t - t̄) / Σ(n - n̄)², α = t̄ - β n̄ (n̄, t̄ the means). "
        "Compute it in float64: t - t̄ cancels most of the digits when the times differ by "
        "microseconds on top of milliseconds, and float32 keeps only about 7.",
        "A sketch: n, t = np.asarray(sizes, float), np.asarray(times, float); if "
        "len(np.unique(n)) < 2: raise ValueError(...); then the formula (or np.linalg.lstsq on "
        "the columns [1, n]).",
    ))

_FIT_SIZES = (8, 1 * KIB, 16 * KIB, 64 * KIB, 256 * KIB)


def _fit_call(ctx, sizes, times) -> tuple[float, float]:
    fn = ctx.learner("fit_alpha_beta")
    out = ctx.call(fn, sizes, times)
    if isinstance(out, models.AlphaBetaFit):
        out = (out.alpha, out.beta)
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise Fail(f"fit_alpha_beta returned {out!r}: return a pair (alpha, beta)")
    return _seconds(out[0], "alpha"), _seconds(out[1], "beta (seconds per byte)")


def _close(x: float, y: float, rel: float = 1e-6) -> bool:
    return abs(x - y) <= rel * max(abs(x), abs(y), 1e-300)


def _fit_verdict(got, sizes, times, alpha, beta) -> None:
    """Fail with the likely mistake unless `got` is (alpha, beta)."""
    a, b = got
    if _close(a, alpha) and _close(b, beta):
        return
    n, t = np.asarray(sizes, float), np.asarray(times, float)
    if _close(a, beta) and _close(b, alpha):
        raise Fail("you swapped intercept and slope: α is the intercept (the time of a "
                   "zero-byte message, in s) and β the slope (s per byte); return (alpha, beta)")
    if _close(b, 1 / beta, 1e-4):
        raise Fail(f"your β is {b:.4g}, which is the bandwidth 1/β in bytes/s: return β itself, "
                   "the slope, in seconds per byte")
    origin = float(n @ t / (n @ n))
    if abs(a) <= 1e-9 and _close(b, origin, 1e-4):
        raise Fail("your line goes through the origin (α = 0): fit an intercept too; the "
                   "intercept IS the latency")
    if _close(a, 1e3 * alpha, 1e-4):
        raise Fail(f"your α is {a:g}: that is milliseconds; the sizes are bytes and the times "
                   "seconds, so α is in seconds")
    ends = (t[-1] - t[0]) / (n[-1] - n[0])
    if _close(b, ends, 1e-4):
        raise Fail("your slope is the line through the first and the last point only: least "
                   "squares uses every point (β = Σ(n - n̄)(t - t̄) / Σ(n - n̄)²)")
    if _close(b, t[-1] / n[-1], 1e-4):
        raise Fail("your β is the largest message's time over its size, which still contains "
                   "α: one size cannot separate latency from bandwidth; fit all the sizes")
    if _close(a, alpha, 1e-2) and _close(b, beta, 1e-2):
        digits = int(-math.log10(max(abs(a / alpha - 1), abs(b / beta - 1), 1e-12)))
        raise Fail(f"fit_alpha_beta returned α = {a:.9g} s, β = {b:.9g} s/byte; least squares "
                   f"gives α = {alpha:.9g} s, β = {beta:.9g} s/byte: equal to {digits} digits "
                   "only, a rounding error. In t - t̄ most digits cancel (here the times differ "
                   "by microseconds on top of tens of ms), and float32 keeps about 7 (a "
                   "torch.tensor of Python floats is float32): compute in float64")
    raise Fail(f"fit_alpha_beta returned α = {a:.6g} s, β = {b:.6g} s/byte; least squares "
               f"gives α = {alpha:.6g} s, β = {beta:.6g} s/byte")


@FIT.check("an exact line: α is the intercept, β the slope", points=1)
def _fit_exact(ctx):
    alpha, beta = 2e-3, 1 / 25e6
    sizes = list(_FIT_SIZES)
    times = [alpha + n * beta for n in sizes]
    _fit_verdict(_fit_call(ctx, sizes, times), sizes, times, alpha, beta)
    return "α = 2 ms and β = 40 ns/byte recovered from points on the line"


@FIT.check("least squares over every point of a noisy sweep", points=1)
def _fit_noisy(ctx):
    rng = np.random.default_rng(3)
    sizes = np.array(_FIT_SIZES)
    times = 1.5e-3 + sizes / 40e6 + rng.normal(0, 1e-4, len(sizes))
    ref = models.fit_alpha_beta(sizes, times)
    _fit_verdict(_fit_call(ctx, sizes, times), sizes, times, ref.alpha, ref.beta)
    # A long, fast link (α = 50 ms, 100 Gbit/s): the times differ by microseconds on top of
    # 50 ms, which float32 cannot resolve (its fit is off by 1e-5 .. 3e-4 in β, every time).
    far = [8, 1 * KIB, 4 * KIB, 16 * KIB, 64 * KIB]
    far_times = [float(v) for v in 50e-3 + np.array(far) / 12.5e9
                 + np.random.default_rng(0).normal(0, 2e-8, len(far))]
    far_ref = models.fit_alpha_beta(far, far_times)
    _fit_verdict(_fit_call(ctx, list(far), list(far_times)), far, far_times, far_ref.alpha,
                 far_ref.beta)
    return (f"α = {_ms(ref.alpha)}, β = {ref.beta * 1e9:.3f} ns/byte, as least squares; and "
            "a 50 ms, 100 Gbit/s link to float64 precision")


@FIT.check("a sweep of one size is refused (ValueError)", points=1)
def _fit_one_size(ctx):
    fn = ctx.learner("fit_alpha_beta")
    sizes = [64 * KIB] * 5
    times = [4.6e-3, 4.7e-3, 4.6e-3, 4.8e-3, 4.7e-3]
    try:
        out = fn(sizes, times)
    except NotImplementedError as exc:
        raise NotDone(str(exc)) from None
    except ValueError:
        return "five points at 64 KiB: ValueError, as no line is determined"
    except Exception as exc:  # noqa: BLE001 - the learner's code: any error is a message
        raise Fail(f"five points all at 64 KiB made fit_alpha_beta raise "
                   f"{type(exc).__name__}: check for fewer than two different sizes first and "
                   "raise ValueError saying so") from None
    raise Fail(f"five points all at 64 KiB gave {out!r}: one size cannot tell the latency from "
               "the bandwidth (every line through that point fits), so this is a broken sweep; "
               "raise ValueError when fewer than two different sizes are given")


@FIT.check("other sizes, latencies, bandwidths and noise", points=1, hidden=True)
def _fit_hidden(ctx):
    rng = ctx.rng
    count = int(rng.integers(4, 10))
    sizes = np.unique(np.round(np.exp(rng.uniform(np.log(8), np.log(4 << 20), count))))
    if len(sizes) < 3:
        sizes = np.array([8.0, 4096.0, 1 << 20])
    alpha = float(np.exp(rng.uniform(np.log(1e-5), np.log(1e-2))))
    beta = 1 / float(np.exp(rng.uniform(np.log(1e7), np.log(1e10))))
    clean = alpha + sizes * beta
    times = clean * (1 + rng.normal(0, 0.02, len(sizes)))
    ref = models.fit_alpha_beta(sizes, times)
    a, b = _fit_call(ctx, sizes.astype(np.int64), times)
    scale = float(np.mean(clean))  # compare α on the scale of the times themselves
    if abs(a - ref.alpha) <= 1e-6 * scale and _close(b, ref.beta, 1e-6):
        return f"{len(sizes)} sizes: α = {ref.alpha:.4g} s, β = {ref.beta:.4g} s/byte"
    _fit_verdict((a, b), sizes, times, ref.alpha, ref.beta)


# --- step 4: the mystery network ------------------------------------------------------------------

MYSTERY = LAB.exercise(
    "net_mystery", needs=("measure_network",),
    title="Step 4: measure a network you cannot see",
    hints=(
        "The idea: everything is built already. For each message size, ping-pong through the "
        "network, turn the round trips into a one-way time, then fit the line through the "
        "(size, time) points: α is its intercept, the bandwidth 1/slope.",
        "Units: the bandwidth is in BYTES per second, 1/β with β in seconds per byte (netem's "
        "100mbit is 12.5e6 bytes/s). Start the cluster once, outside the loop over sizes; "
        "rank 0's result of a run is cl.run(...)[0].",
        "A sketch: with clusterlab.Cluster(nodes=2, nic=nic, dilation=DILATION) as cl: one-way "
        "time per n in SIZES = one_way_latency(cl.run(ping_pong, n, REPEATS)[0]); then alpha, "
        "beta = fit_alpha_beta(SIZES, those); return alpha, 1 / beta.",
    ))


def _counted(fn, *args, **kwargs) -> dict:
    """On a rank: the learner's fn(*args, **kwargs), and the sizes of the point-to-point
    messages this rank sent meanwhile (the cluster runs with trace=True)."""
    import torch.distributed as dist

    trace = getattr(dist.group.WORLD, "trace", None)
    trace = [] if trace is None else trace
    start = len(trace)
    out = fn(*args, **kwargs)
    return {"out": out, "sent": [int(nbytes) for _, _, nbytes, _ in trace[start:]]}


def _same_network(nic, network: HiddenNetwork) -> bool:
    if isinstance(nic, str):
        return str.__str__(nic) == str.__str__(network)
    try:
        return isinstance(nic, Netem) and nic == reveal(network)
    except Exception:  # noqa: BLE001 - anything else is not this network
        return False


@contextlib.contextmanager
def _traffic(network: HiddenNetwork):
    """While active, every Cluster built on `network` (in this process: measure_network runs
    here) traces its messages; yields {"messages": n, "sizes": set of byte counts} that the
    ranks sent through it. Estimates that pass must have measured."""
    from ..cluster import Cluster

    seen = {"messages": 0, "sizes": set()}
    init, run = Cluster.__init__, Cluster.run

    def watched_init(self, *args, **kwargs):
        mine = _same_network(kwargs.get("nic"), network)
        if mine:
            kwargs["trace"] = True
        init(self, *args, **kwargs)
        self._lab_counts = mine

    def watched_run(self, fn, *args, **kwargs):
        if not getattr(self, "_lab_counts", False):
            return run(self, fn, *args, **kwargs)
        outs = run(self, _counted, fn, *args, **kwargs)
        for o in outs:
            seen["messages"] += len(o["sent"])
            seen["sizes"].update(o["sent"])
        return [o["out"] for o in outs]

    Cluster.__init__, Cluster.run = watched_init, watched_run
    try:
        yield seen
    finally:
        Cluster.__init__, Cluster.run = init, run


def _estimate(ctx, network: HiddenNetwork, seen: dict | None = None) -> tuple[float, float]:
    fn = ctx.learner("measure_network")
    with _traffic(network) as traffic:
        out = ctx.call(fn, network)
    if seen is not None:
        seen.update(traffic)
    if isinstance(out, models.AlphaBetaFit):
        raise Fail("measure_network returned the fit itself: return (alpha, bandwidth), the "
                   "bandwidth being 1/β in bytes/s")
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise Fail(f"measure_network returned {out!r}: return a pair (alpha in s, bandwidth "
                   "in bytes/s)")
    try:
        a, bw = (float(x) for x in out)
    except (TypeError, ValueError):
        raise Fail(f"measure_network returned {out!r}: return two numbers, (alpha in s, "
                   "bandwidth in bytes/s)") from None
    if not (math.isfinite(a) and math.isfinite(bw)):
        raise Fail(f"measure_network returned ({a}, {bw}) for {network!r}: not finite numbers. "
                   "A fit needs at least two sizes, far apart (a tiny one for α, a large one "
                   "for the bandwidth)")
    return a, bw


class _Miss(Fail):
    """An estimate off by a little more than the tolerance, and by no known mistake: on a
    busy machine a burst of load can do that to a median, so the check measures once more."""


def _judge(network: HiddenNetwork, a: float, bw: float, seen: dict | None = None) -> str:
    """Pass (a detail string) or fail with what the estimate's error suggests. `seen`: the
    traffic measure_network sent through the network (None: not counted)."""
    alpha, bandwidth = truth(network)
    ra, rb = a / alpha, bw / bandwidth
    if abs(ra - 1) < 1e-9 and abs(rb - 1) < 1e-9:  # no measurement is exact to 9 digits
        raise Fail(f"on {network!r} your estimate equals the configured spec to 9 digits: it was "
                   "read, not measured. Measure it with ping_pong and the fit (reveal and "
                   "truth are for afterwards)")
    if abs(ra - 1) <= ALPHA_TOLERANCE and abs(rb - 1) <= BANDWIDTH_TOLERANCE:
        if seen is not None and len(seen["sizes"]) < 2:
            raise Fail(f"on {network!r} your estimate is close to the truth, but "
                       f"measure_network sent {seen['messages']} message(s) of "
                       f"{len(seen['sizes'])} size(s) through that network: it was read, not "
                       "measured (a fit needs ping-pongs of at least two sizes). Measure it "
                       "with ping_pong and the fit; reveal and truth are for afterwards")
        return (f"{network!r}: α within {abs(ra - 1):.1%}, bandwidth within {abs(rb - 1):.1%} "
                "of the truth")
    where = f"on {network!r} "
    if 1.7 < ra < 2.3 and 0.4 < rb < 0.6:
        raise Fail(where + f"your α is {ra:.2f}x and your bandwidth {rb:.2f}x the truth: your "
                   "times are twice the one-way delay: divide the round trip by 2")
    if abs(rb / 8 - 1) <= BANDWIDTH_TOLERANCE:
        raise Fail(where + f"your bandwidth is {rb:.2f}x the truth, 8x: that is bits per second; "
                   "return BYTES per second (1/β, with β in s/byte)")
    if abs(rb * 8 - 1) <= BANDWIDTH_TOLERANCE:
        raise Fail(where + f"your bandwidth is {rb:.3f}x the truth, 1/8: you divided by 8 once "
                   "too often; 1/β is already in bytes per second")
    if abs(a * bandwidth - 1) <= 0.3 and abs(bw * alpha - 1) <= 0.3:
        raise Fail(where + f"your α is {a:.3g} s and your bandwidth {bw:.3g} bytes/s: you swapped "
                   "intercept and slope (α is the fit's intercept, the bandwidth 1/slope)")
    if 0 < bw < 1e-3:
        raise Fail(where + f"your bandwidth is {bw:.3g}: that is β in seconds per byte; "
                   "return its inverse, 1/β, in bytes per second")
    if abs(ra / 1000 - 1) <= ALPHA_TOLERANCE:
        raise Fail(where + f"your α is {a:g}: milliseconds; return seconds")
    parts = []
    if abs(ra - 1) > ALPHA_TOLERANCE:
        parts.append(f"α is {ra:.2f}x the truth (accepted: within {ALPHA_TOLERANCE:.0%})")
    if abs(rb - 1) > BANDWIDTH_TOLERANCE:
        parts.append(f"bandwidth is {rb:.2f}x the truth (accepted: within "
                     f"{BANDWIDTH_TOLERANCE:.0%})")
    near = abs(ra - 1) <= 3 * ALPHA_TOLERANCE and abs(rb - 1) <= 3 * BANDWIDTH_TOLERANCE
    raise (_Miss if near else Fail)(
        where + "your " + " and ".join(parts) + ". Is α the one-way median (round trip / 2), "
        "and do your sizes reach a few hundred KiB so that the slope is measured?")


def _mystery_verdict(ctx, network: HiddenNetwork) -> str:
    seen: dict = {}
    try:
        return _judge(network, *_estimate(ctx, network, seen), seen)
    except _Miss:
        detail = _judge(network, *_estimate(ctx, network, seen), seen)
        return detail + " (on a second measurement: the first was hit by this machine's noise)"


@MYSTERY.check(f"the practice network #{PRACTICE_SEED}: α and bandwidth within 15% of the truth",
               points=2)
def _mystery_practice(ctx):
    return _mystery_verdict(ctx, mystery_network(PRACTICE_SEED))


@MYSTERY.check("two networks you have not seen", points=3, hidden=True)
def _mystery_hidden(ctx):
    details = []
    for seed in ctx.rng.integers(100, 10**6, size=2):
        details.append(_mystery_verdict(ctx, mystery_network(int(seed))))
    return "; ".join(details)
