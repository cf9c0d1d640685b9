"""Catch silent synchronisation failures in your own data-parallel (DDP) training loop.

Under correct data parallelism every rank holds a *bitwise identical* copy of the model: the
ranks start from the same weights, all-reduce their gradients into the same average, and
apply the same optimizer update. When something breaks that symmetry, training goes on
without an error, and rank 0's loss log (the only one most people read) looks normal while
the replicas drift apart. `SyncMonitor` watches for exactly that:

    mon = SyncMonitor(ddp_model, every=10)
    for step, (x, y) in enumerate(loader):
        with mon.step(step) as s:          # times the step on every rank
            loss = loss_fn(ddp_model(x), y)
            loss.backward()
            s.after_backward()             # optional: check the synchronised gradients
            opt.step()
            opt.zero_grad()
            s.record_loss(loss)            # optional: loss spikes, non-finite losses
    mon.check()                            # on every rank: the verdict on the last steps
    print(mon.report())                    # mon.alerts: a list of Alert

What it checks, and what each check costs:

* Every step, on each rank, with no communication: the norm of this rank's own gradients
  at the end of backward, before the all-reduce's average replaces them (so a NaN is
  traced to the rank that made it), the step's duration split into "busy" (computing) and
  "waiting for the gradient all-reduce", and the recorded loss against the running median
  of the last `window` losses. This costs one read of the gradients per step.
* Every `every` steps (a "check step"), at the end of the step: a fingerprint of the
  parameters (exact checksums of their bytes), of the synchronised gradients (when
  `after_backward()` was called in that step) and a summary of the window, exchanged with
  ONE all_gather of a few hundred bytes. Only when fingerprints disagree does a second
  all_gather of per-tensor fingerprints name the first tensor that differs. This costs a
  copy of the parameters (and gradients), kept until the verdict, and four reads of it.
  The all_gather is started at the end of the check step and runs while the next step
  computes; its verdict (alerts, a raise, a repair) comes at the end of that next step,
  labelled with the check step. Waiting for it at once would add the collective's latency,
  and the wait for the slowest rank, to every check step. So after the loop, call
  `mon.check()` on every rank: it delivers the last verdict and checks the steps since.

Every rank analyses the same gathered data with the same code, so all ranks reach the same
verdict: every collective the monitor issues is issued by every rank, in the same order, and
`on_alert="raise"` raises on every rank at once, leaving no rank stuck in a collective.

Alert kinds:

    parameter_mismatch  the ranks' parameters are no longer identical (names the odd ranks
                        and the first differing tensor)
    gradient_mismatch   the gradients after the all-reduce differ between ranks
    nan                 a non-finite gradient (before or after the all-reduce), parameter
                        or loss; detail["where"] says which
    straggler           a rank's busy time is more than `straggler_factor` x the median
    loss_spike          a loss above `spike_factor` x the running median of the last losses
    loss_outlier        a rank whose losses are `spike_factor` x the other ranks' (median)
    step_mismatch       the ranks passed different step numbers to the same check
    structure_mismatch  the ranks' models do not even have the same shapes
    repair              on_alert="repair" re-broadcast the parameters from a healthy rank

Limits worth knowing: a corruption made *inside* a DDP communication hook (after this rank's
gradients were handed to the all-reduce) reaches every rank alike, so no rank can be named
for it (the alert says that it entered through the all-reduce); the optimizer state (e.g.
momentum) is not compared or repaired; a step that raises an exception skips its check (the
other ranks are then stuck in DDP's next all-reduce anyway, until the cluster's timeout).
"""

from __future__ import annotations

import functools
import math
import statistics
import struct
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from . import clock

ON_ALERT = ("warn", "raise", "repair")

# On a shared machine, scheduling noise moves a rank's busy time by a few milliseconds; a
# rank is only named a straggler when it is also this much slower than the median rank.
MIN_STRAGGLER_EXCESS_S = 0.005
# A loss spike needs a few earlier losses to compare with.
MIN_LOSS_HISTORY = 3


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class Alert:
    """One detected problem: at which step, what kind, which (global) ranks, and why."""

    step: int
    kind: str
    ranks: list[int]
    message: str
    detail: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return f"step {self.step}: {self.kind} on rank(s) {self.ranks}: {self.message}"


class SyncError(RuntimeError):
    """Raised on every rank at once when on_alert="raise" and a check found a problem."""

    def __init__(self, alerts: list[Alert]) -> None:
        self.alerts = alerts
        lines = [f"synchronisation check failed ({len(alerts)} alert(s)):"]
        lines += [f"  {a}" for a in alerts]
        super().__init__("\n".join(lines))


class SyncWarning(RuntimeWarning):
    """The warning category of on_alert="warn" (filter it with the `warnings` module)."""


# --------------------------------------------------------------------------------------------
# Fingerprints: exact checksums of a tensor's bytes
# --------------------------------------------------------------------------------------------


_ROW = 256  # the checksum lays a tensor's values out in rows of this many


@functools.lru_cache(maxsize=64)
def _weights(n: int, salt: int, device: torch.device) -> torch.Tensor:
    """n fixed pseudo-random weights in 1..255 (int64): the same on every rank."""
    gen = torch.Generator().manual_seed(0x5EED + 7919 * n + salt)
    return torch.randint(1, 256, (n,), generator=gen, dtype=torch.int64).to(device)


def _int_view(flat: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a contiguous 1-D tensor seen as integers (a view, not a copy)."""
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    if flat.dtype == torch.bool:
        return flat.view(torch.uint8)
    size = flat.element_size()
    if size >= 4:
        return flat.view(torch.int32)  # 8-byte values become two int32 halves
    return flat.view(torch.int16 if size == 2 else torch.uint8)


def _digest(bits: torch.Tensor, values: torch.Tensor) -> list[torch.Tensor]:
    """[checksum, weighted checksum, float64 sum, sum of squares] of one flat tensor, as 0-d
    tensors (so that many digests cost one conversion to Python numbers).

    The checksum is the exact integer sum of the values' bit patterns. A single changed bit
    changes a bit pattern by +-2^k, so it always changes this sum: unlike a floating-point
    sum, it cannot round a small change away. It cannot see two values swapped, though, so
    the weighted checksum lays the bit patterns out in rows of 256 and weighs every row sum
    and every column sum by a fixed pseudo-random weight: a swap then changes it unless the
    weights happen to match (about 1 chance in 500). Integer arithmetic keeps it exact:
    |bits| < 2^31, row sums < 2^39, weights < 2^8 (a tensor beyond 2^16 rows wraps around
    in int64, the same way on every rank). The float sums are for people and tolerances."""
    rows_n = bits.numel() // _ROW
    body = bits[: rows_n * _ROW].view(rows_n, _ROW)
    tail = bits[rows_n * _ROW:].to(torch.int64)  # the last, incomplete row
    rows = body.sum(dim=1, dtype=torch.int64)
    cols = body.sum(dim=0, dtype=torch.int64)
    row_w = _weights(rows_n + 1, 1, bits.device)
    col_w = _weights(_ROW, 2, bits.device)
    tail_sum = tail.sum()
    check = rows.sum() + tail_sum
    weighted = (torch.dot(rows, row_w[:rows_n]) + tail_sum * row_w[rows_n]
                + torch.dot(cols, col_w) + torch.dot(tail, col_w[: tail.numel()]))
    if values.is_complex():
        values = torch.view_as_real(values).reshape(-1)
    if not values.is_floating_point() or values.element_size() < 4:
        values = values.float()
    return [check, weighted, values.sum(dtype=torch.float64), torch.dot(values, values).double()]


class _Snapshot:
    """Copies of a list of tensors (parameters, or gradients), concatenated per dtype.

    One concatenation and four reductions fingerprint the whole list, instead of four
    reductions per tensor: far fewer operations for a model of many small tensors. The
    copy is kept until the check's verdict, in case a mismatch asks which tensor differs."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.numels = [t.numel() for t in tensors]
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, t in enumerate(tensors):
            by_dtype.setdefault(t.dtype, []).append(i)
        with torch.no_grad():
            self.groups = [(idx, torch.cat([tensors[i].detach().reshape(-1) for i in idx]))
                           for idx in by_dtype.values()]

    def _parts(self, per_tensor: bool):
        """(indices, bits, values) for each group, or for each tensor of each group."""
        for idx, flat in self.groups:
            bits = _int_view(flat)
            if not per_tensor:
                yield idx, bits, flat
                continue
            ratio = bits.numel() // max(flat.numel(), 1)  # int views per value
            offset = 0
            for i in idx:
                n = self.numels[i]
                yield [i], bits[offset * ratio:(offset + n) * ratio], flat[offset:offset + n]
                offset += n

    def totals(self) -> dict:
        """Everything folded into one line: checksums, sum, norm, first non-finite tensor."""
        with torch.no_grad():
            parts = list(self._parts(per_tensor=False))
            if not parts:
                return {"check": 0, "weighted": 0, "sum": 0.0, "norm": 0.0, "bad": -1}
            digests = [_digest(b, v) for _, b, v in parts]
            ints = torch.stack([torch.stack(d[:2]) for d in digests]).tolist()
            floats = torch.stack([torch.stack(d[2:]) for d in digests]).tolist()
        total_sum, total_sq = sum(f[0] for f in floats), sum(f[1] for f in floats)
        bad = -1
        if not math.isfinite(total_sum):  # rare: which tensor holds a NaN or an infinity?
            bad = self.first_non_finite()
        return {
            "check": _wrap64(sum(c for c, _ in ints)),
            # each dtype group weighted differently, so that groups cannot trade places
            "weighted": _wrap64(sum(w * (2 * g + 1) for g, (_, w) in enumerate(ints))),
            "sum": total_sum,
            "norm": math.sqrt(total_sq),
            "bad": bad,
        }

    def first_non_finite(self) -> int:
        """Index of the first tensor holding a NaN or an infinity, or -1."""
        with torch.no_grad():
            for idx, _, values in self._parts(per_tensor=True):
                if values.is_floating_point() and not bool(torch.isfinite(values).all()):
                    return idx[0]
        return -1

    def table(self) -> tuple[list[list[int]], list[list[float]]]:
        """Per tensor: [checksum, weighted checksum] and [float64 sum, norm]."""
        n = len(self.numels)
        ints: list[list[int]] = [[0, 0] for _ in range(n)]
        floats: list[list[float]] = [[0.0, 0.0] for _ in range(n)]
        with torch.no_grad():
            parts = list(self._parts(per_tensor=True))
            if not parts:
                return ints, floats
            digests = [_digest(b, v) for _, b, v in parts]
            checks = torch.stack([torch.stack(d[:2]) for d in digests]).tolist()
            squares = torch.stack([torch.stack(d[2:]) for d in digests]).tolist()
        for (idx, *_), c, (s, q) in zip(parts, checks, squares):
            ints[idx[0]], floats[idx[0]] = c, [s, math.sqrt(q)]
        return ints, floats


def _wrap64(x: int) -> int:
    """Python int -> the int64 with the same low 64 bits (two's complement wrap-around)."""
    return ((x + (1 << 63)) % (1 << 64)) - (1 << 63)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel wrapper (names without "module.")."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def fingerprint(module: torch.nn.Module, buffers: bool = False) -> torch.Tensor:
    """Two int64 checksums of the module's parameters (and buffers, if asked).

    Bitwise identical modules give identical fingerprints; changing any single value (even
    by one bit) changes the first number. Cheap enough to call every few steps.
    """
    module = _unwrap(module)
    tensors = [p for p in module.parameters()]
    if buffers:
        tensors += [b for b in module.buffers()]
    totals = _Snapshot(tensors).totals()
    return torch.tensor([totals["check"], totals["weighted"]], dtype=torch.int64)


def compare_replicas(module: torch.nn.Module, group=None, buffers: bool = False) -> list[int]:
    """The (global) ranks whose parameters differ from those of the group's first rank.

    A collective: every rank of `group` must call it. [] means all replicas are identical.
    """
    mine = fingerprint(module, buffers)
    if not dist.is_initialized():
        return []
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, mine, group=group)
    ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
    return [ranks[i] for i, p in enumerate(parts) if not torch.equal(p, parts[0])]


# --------------------------------------------------------------------------------------------
# What each rank sends at a check step: a fixed list of numbers, the same layout on all ranks
# --------------------------------------------------------------------------------------------

_FIELDS = (
    "rank",                      # the sender's global rank
    "step",                      # the step number the user passed for this check
    "n_tensors", "numel",        # parameter tensors and elements (the model's structure)
    "n_buffers", "buffer_numel",
    "p_check", "p_weighted",     # exact checksums of all parameters
    "p_sum", "p_norm",           # float64 sum and L2 norm of all parameters
    "p_bad",                     # first parameter tensor with a non-finite value, or -1
    "has_grads",                 # 1 if after_backward() ran in this check step
    "g_check", "g_weighted", "g_sum", "g_norm", "g_bad",  # the same for synced gradients
    "local_bad_step",            # first step in the window with a non-finite local gradient
    "local_bad_param",           # ... and the tensor it was in
    "local_bad_inherited",       # 1 if the parameters were already non-finite then
    "local_norm",                # median norm of this rank's own gradients (before sync)
    "loss_n", "loss_median",     # losses recorded in the window and their median
    "loss_bad_step",             # first step with a non-finite loss, or -1
    "spike_step", "spike_loss", "spike_median",  # first loss spike in the window, or -1
    "steps", "busy", "wait", "step_time",        # window medians, in (emulated) seconds
)
_FLOATS = frozenset({"p_sum", "p_norm", "g_sum", "g_norm", "local_norm", "loss_median",
                     "spike_loss", "spike_median", "busy", "wait", "step_time"})


def _float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _bits_float(i: int) -> float:
    return struct.unpack("<d", struct.pack("<q", i))[0]


_INT_FIELDS = tuple(k for k in _FIELDS if k not in _FLOATS)
_FLOAT_FIELDS = tuple(k for k in _FIELDS if k in _FLOATS)


def _pack(summary: dict) -> torch.Tensor:
    """A summary dict -> one int64 tensor: the integers, then the floats' exact bit patterns
    (an int64 all_gather carries both without rounding anything)."""
    ints = torch.tensor([int(summary[k]) for k in _INT_FIELDS], dtype=torch.int64)
    floats = torch.tensor([float(summary[k]) for k in _FLOAT_FIELDS], dtype=torch.float64)
    return torch.cat([ints, floats.view(torch.int64)])


def _unpack(rows: torch.Tensor) -> list[dict]:
    """The gathered (ranks x fields) int64 tensor -> one summary dict per rank."""
    n = len(_INT_FIELDS)
    ints = rows[:, :n].tolist()
    floats = rows[:, n:].contiguous().view(torch.float64).tolist()
    return [dict(zip(_INT_FIELDS, i)) | dict(zip(_FLOAT_FIELDS, f)) for i, f in zip(ints, floats)]


# --------------------------------------------------------------------------------------------
# Pure decision helpers (the same inputs give the same verdict on every rank)
# --------------------------------------------------------------------------------------------


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    """a == b within tolerance; two NaNs count as equal (both are broken the same way)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= atol + rtol * abs(b)


def _majority(items: list, same: Callable[[object, object], bool]) -> tuple[int, list[int]]:
    """(index of the reference item, indices that differ from it).

    The reference is an item that agrees with the most others; on a tie the lowest index
    wins, so with two disagreeing ranks the first rank is the reference."""
    best, best_count = 0, -1
    for i, a in enumerate(items):
        count = sum(same(a, b) for b in items)
        if count > best_count:
            best, best_count = i, count
    return best, [j for j, b in enumerate(items) if not same(items[best], b)]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _names(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


# --------------------------------------------------------------------------------------------
# The monitor
# --------------------------------------------------------------------------------------------


@dataclass
class _Pending:
    """A check whose all_gather has been started but not yet analysed."""

    step: int
    work: object  # the all_gather's Work handle (None in a one-process run)
    parts: list[torch.Tensor]
    params: _Snapshot  # a copy of this rank's parameters at the check step
    grads: _Snapshot | None  # ... and of its gradients, if after_backward() ran


class _Window:
    """What one rank saw since the last check (reset at every check)."""

    def __init__(self) -> None:
        self.steps = 0
        self.local_norms: list[float] = []
        self.losses: list[float] = []
        self.local_bad_step, self.local_bad_param, self.local_bad_inherited = -1, -1, 0
        self.loss_bad_step = -1
        self.spike_step, self.spike_loss, self.spike_median = -1, math.nan, math.nan


class MonitoredStep:
    """One training step under the monitor: the object `with mon.step(n) as s` gives you."""

    def __init__(self, monitor: SyncMonitor, step: int, check: bool) -> None:
        self.monitor, self.step, self.check = monitor, step, check
        self.t_enter = 0.0
        self.t_ready = 0.0        # when this rank's own gradients were all computed
        self.wait = 0.0           # time spent blocked on the gradient all-reduce
        self.backward_seen = False
        self.callback_queued = False
        self.local_norms: list[torch.Tensor] = []  # see SyncMonitor._norms_in_hooks
        self.grads: _Snapshot | None = None
        self.loss: float | None = None

    def __enter__(self) -> MonitoredStep:
        self.monitor._enter(self)
        self.t_enter = self.monitor._now()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.monitor._exit(self, failed=exc_type is not None)
        return False

    def after_backward(self) -> None:
        """Call after loss.backward() (the gradients are synchronised) and before
        optimizer.step(). At a check step this fingerprints the gradients, so that ranks
        whose synchronised gradients differ are named at this step. Cheap otherwise."""
        if self.check:
            params = self.monitor._params
            self.grads = _Snapshot([p.grad if p.grad is not None else torch.zeros(0, dtype=p.dtype)
                                    for p in params])

    def record_loss(self, loss: torch.Tensor | float) -> None:
        """Record this step's loss (the last call in a step counts)."""
        self.loss = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)

    # Called by autograd on this rank, inside loss.backward().

    def _grads_ready(self) -> None:
        """All of this rank's gradients are computed; the all-reduce may still be running.

        DDP copies each gradient into its communication buffer and writes the averaged
        result back only when the all-reduce has finished, so `param.grad` still holds this
        rank's own gradient here (unless DDP was built with gradient_as_bucket_view=True:
        then the norms were taken in the per-parameter hooks instead)."""
        self.t_ready = self.monitor._now()
        self.callback_queued = False
        monitor = self.monitor
        if monitor._norms_in_hooks:
            norms = self.local_norms
            self.local_norms = []
            total = (math.sqrt(sum(n * n for n in torch.stack(norms).double().tolist()))
                     if norms else math.nan)
        else:
            grads = [p.grad for p in monitor._params if p.grad is not None]
            total = _total_norm(grads) if grads else math.nan
        window = monitor._window
        if math.isfinite(total):
            window.local_norms.append(total)
        elif grads_present := [i for i, p in enumerate(monitor._params) if p.grad is not None]:
            # Rare, so a full look is affordable: which tensor is non-finite (a norm can
            # also overflow while every value is finite)? Were the weights already broken
            # (a consequence of an earlier problem), or did this rank start it?
            with torch.no_grad():
                bad = [i for i in grads_present
                       if not bool(torch.isfinite(monitor._params[i].grad).all())]
                if bad and window.local_bad_step < 0:
                    window.local_bad_step, window.local_bad_param = self.step, bad[0]
                    window.local_bad_inherited = int(not all(
                        bool(torch.isfinite(p).all()) for p in monitor._params))
        # Queued from inside the final callbacks, this one runs after DDP's own final
        # callback, which waits for the gradient all-reduce to finish.
        _queue_callback(self._grads_synced)

    def _grads_synced(self) -> None:
        self.wait += self.monitor._now() - self.t_ready


def _total_norm(tensors: list[torch.Tensor]) -> float:
    """The L2 norm of all the tensors together (NaN or inf if any value is)."""
    with torch.no_grad():
        try:  # one fused call, as torch.nn.utils.clip_grad_norm_ makes it
            norms = torch._foreach_norm(tensors)
        except (AttributeError, RuntimeError):
            norms = [torch.linalg.vector_norm(t) for t in tensors]
        if any(n.dtype != norms[0].dtype for n in norms):
            norms = [n.float() for n in norms]
        return float(torch.linalg.vector_norm(torch.stack(norms)))


def _queue_callback(fn: Callable[[], None]) -> None:
    """Run fn when the current backward pass ends (the hook DDP itself uses)."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


class SyncMonitor:
    """Detect replicas that drift apart, bad gradients, stragglers and loss spikes.

    model: the DDP-wrapped model (or the plain module, if you synchronise it yourself).
    every: check every `every` steps (one small all_gather each time).
    group: the process group of the replicas (default: all ranks).
    on_alert: "warn" (record and warn), "raise" (SyncError on every rank), or "repair"
      (re-broadcast parameters and buffers from a healthy rank, then go on).
    rtol, atol: 0 means replicas must be bitwise identical, as they are under correct DDP.
      Set them for deliberately non-deterministic setups: the float64 sums and norms of the
      parameters (and gradients) are then compared within atol + rtol * |reference|.
    straggler_factor: a rank whose median busy time exceeds this x the ranks' median is
      named a straggler. Busy = the step's duration minus the time spent waiting for the
      gradient all-reduce: the duration alone is the same on every rank, because under DDP
      the fast ranks wait for the slow one inside the all-reduce.
    spike_factor: a loss above this x the running median of the last `window` losses.
    window: how many recent steps the running medians of losses and step times use.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        every: int = 10,
        group=None,
        on_alert: str = "warn",
        rtol: float = 0.0,
        atol: float = 0.0,
        straggler_factor: float = 2.0,
        spike_factor: float = 5.0,
        window: int = 20,
    ) -> None:
        if on_alert not in ON_ALERT:
            raise ValueError(f"on_alert must be one of {ON_ALERT}, got {on_alert!r}")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        if rtol < 0 or atol < 0:
            raise ValueError(f"rtol and atol must be >= 0, got {rtol!r}, {atol!r}")
        if straggler_factor <= 1 or spike_factor <= 1:
            raise ValueError("straggler_factor and spike_factor must be > 1")
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive integer, got {window!r}")
        self.module = _unwrap(model)
        # Emulated-cluster time, as clusterlab.clock.now() gives it (with the dilation
        # factor read once, not at every call: this runs several times per step).
        self._seconds_per_ns = 1e-9 / clock.dilation()
        # With gradient_as_bucket_view=True, DDP all-reduces the gradients in place while
        # backward goes on: the local norms must then be taken as each gradient appears.
        self._norms_in_hooks = bool(getattr(model, "gradient_as_bucket_view", False))
        self.every, self.group, self.on_alert = every, group, on_alert
        self.rtol, self.atol = float(rtol), float(atol)
        self.straggler_factor, self.spike_factor = float(straggler_factor), float(spike_factor)
        self.window = window
        named = list(self.module.named_parameters())
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        if dist.is_initialized():
            self.world = dist.get_world_size(group)
            self.ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        else:  # one process: every check is local (handy to try the API in a notebook)
            self.world, self.ranks = 1, [0]
        self.alerts: list[Alert] = []
        self.last_check: list[dict] = []  # what every rank reported at the latest check
        self.steps = 0
        self.checks = 0
        self.check_bytes = 0  # what one check's all_gather sends per rank
        self._current: MonitoredStep | None = None
        self._pending: _Pending | None = None
        self._last_label: int | None = None
        self._window = _Window()
        self._loss_history: deque[float] = deque(maxlen=window)
        # (busy, wait, step) seconds of the last `window` steps: a straggler is judged on
        # several steps, as one slow step can be a hiccup of the machine.
        self._times: deque[tuple[float, float, float]] = deque(maxlen=window)
        self._previous_keys: set = set()
        self._hooks = [p.register_post_accumulate_grad_hook(functools.partial(self._on_grad, i))
                       for i, p in enumerate(self._params) if p.requires_grad]

    # --- the training loop's side ------------------------------------------------------------

    def step(self, step: int | None = None) -> MonitoredStep:
        """A context manager around one training step; `step` labels alerts.

        Whether a step is a check step depends on how many steps this monitor has seen,
        not on `step`, so ranks can never disagree about when to communicate."""
        label = self.steps if step is None else int(step)
        return MonitoredStep(self, label, check=(self.steps + 1) % self.every == 0)

    def check(self) -> list[Alert]:
        """Check every step so far and wait for the verdict; returns this call's new alerts.

        A collective: every rank must call it, typically once after the training loop, for
        the last check step's verdict (it normally arrives at the end of the next step) and
        for the steps after it."""
        if self._current is not None:
            raise RuntimeError("check() cannot run inside a monitored step")
        before = len(self.alerts)
        self._finish_check()
        if self._window.steps:  # steps that no check has covered yet
            self._start_check(self.steps - 1 if self._last_label is None else self._last_label,
                              None)
            self._finish_check()
        return self.alerts[before:]

    def _now(self) -> float:
        return time.monotonic_ns() * self._seconds_per_ns

    def close(self) -> None:
        """Remove the gradient hooks from the model's parameters."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _enter(self, s: MonitoredStep) -> None:
        if self._current is not None:
            raise RuntimeError("monitored steps cannot be nested")
        self._current = s

    def _on_grad(self, index: int, param: torch.Tensor) -> None:
        """Autograd hook, called as each gradient is accumulated during backward: the first
        call of a backward pass asks for a callback at its end (`_grads_ready`)."""
        s = self._current
        if s is None:
            return
        if not s.callback_queued:
            s.callback_queued = True
            s.backward_seen = True
            _queue_callback(s._grads_ready)
        grad = param.grad
        if self._norms_in_hooks and grad is not None:
            s.local_norms.append(torch.linalg.vector_norm(grad.detach(), dtype=torch.float32))

    def _exit(self, s: MonitoredStep, failed: bool) -> None:
        t_exit = self._now()
        self._current = None
        if failed:
            # The step raised: do not start a collective that the other ranks may never
            # join. The exception goes on to the caller.
            return
        self.steps += 1
        self._last_label = s.step
        total = t_exit - s.t_enter
        self._times.append((total - s.wait if s.backward_seen else total, s.wait, total))
        self._window.steps += 1
        if s.loss is not None:
            self._note_loss(s.step, s.loss)
        # The previous check's all_gather ran while this step computed: its result is
        # surely there by now. Analysing it may take more collectives (a second all_gather,
        # a repair), which every rank issues here, at the end of the same step.
        self._finish_check()
        if s.check:
            self._start_check(s.step, s.grads)

    def _note_loss(self, step: int, loss: float) -> None:
        w = self._window
        if not math.isfinite(loss):
            if w.loss_bad_step < 0:
                w.loss_bad_step = step
            return
        if len(self._loss_history) >= MIN_LOSS_HISTORY and w.spike_step < 0:
            median = statistics.median(self._loss_history)
            if median > 0 and loss > self.spike_factor * median:
                w.spike_step, w.spike_loss, w.spike_median = step, loss, median
        self._loss_history.append(loss)
        w.losses.append(loss)

    # --- the check: one all_gather, then the same analysis on every rank -----------------------

    def _summary(self, step: int, params: _Snapshot, grads: _Snapshot | None) -> dict:
        p = params.totals()
        buffers = list(self.module.buffers())
        w = self._window
        out = {
            "rank": self.ranks[dist.get_rank(self.group) if dist.is_initialized() else 0],
            "step": step, "n_tensors": len(self._params),
            "numel": sum(t.numel() for t in self._params),
            "n_buffers": len(buffers), "buffer_numel": sum(b.numel() for b in buffers),
            "p_check": p["check"], "p_weighted": p["weighted"], "p_sum": p["sum"],
            "p_norm": p["norm"], "p_bad": p["bad"],
            "has_grads": int(grads is not None),
            "g_check": 0, "g_weighted": 0, "g_sum": 0.0, "g_norm": 0.0, "g_bad": -1,
            "local_bad_step": w.local_bad_step, "local_bad_param": w.local_bad_param,
            "local_bad_inherited": w.local_bad_inherited,
            "local_norm": _median(w.local_norms),
            "loss_n": len(w.losses), "loss_median": _median(w.losses),
            "loss_bad_step": w.loss_bad_step, "spike_step": w.spike_step,
            "spike_loss": w.spike_loss, "spike_median": w.spike_median,
            "steps": len(self._times), "busy": _median([t[0] for t in self._times]),
            "wait": _median([t[1] for t in self._times]),
            "step_time": _median([t[2] for t in self._times]),
        }
        if grads is not None:
            g = grads.totals()
            out.update(g_check=g["check"], g_weighted=g["weighted"], g_sum=g["sum"],
                       g_norm=g["norm"], g_bad=g["bad"])
        return out

    def _gather(self, mine: torch.Tensor, wait: bool = True):
        """all_gather one int64 tensor from every rank of the group.

        Returns (work, parts): wait for `work` (None when there is nothing to wait for),
        then torch.stack(parts) is (world, *mine.shape)."""
        if self.world == 1:
            return None, [mine]
        parts = [torch.empty_like(mine) for _ in range(self.world)]
        work = dist.all_gather(parts, mine, group=self.group, async_op=not wait)
        return work, parts

    def _start_check(self, step: int, grads: _Snapshot | None) -> None:
        """Fingerprint, summarise the window, and start the all_gather (without waiting).

        Waiting here would add the collective's latency, and the time until the slowest
        rank arrives, to the step. Instead the all_gather overlaps the next step's compute."""
        params = _Snapshot(self._params)
        packed = _pack(self._summary(step, params, grads))
        self.check_bytes = packed.numel() * packed.element_size()
        work, parts = self._gather(packed, wait=False)
        self._pending = _Pending(step, work, parts, params, grads)
        self._window = _Window()

    def _finish_check(self) -> None:
        """Wait for the pending check's all_gather, analyse it, and act on the alerts."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if pending.work is not None:
            pending.work.wait()
        rows = _unpack(torch.stack(pending.parts))
        self.checks += 1
        previous, self.last_check = self.last_check, rows
        # Label the alerts with the step most ranks reported: the same label on every rank,
        # even when the ranks disagree about the step number.
        step = rows[_majority(rows, lambda a, b: a["step"] == b["step"])[0]]["step"]
        alerts = self._analyse(step, pending, rows, previous)
        self._act(step, rows, alerts)

    def _same_params(self, a: dict, b: dict, prefix: str = "p") -> bool:
        if self.rtol == 0 and self.atol == 0:
            return (a[f"{prefix}_check"] == b[f"{prefix}_check"]
                    and a[f"{prefix}_weighted"] == b[f"{prefix}_weighted"])
        return (_close(a[f"{prefix}_sum"], b[f"{prefix}_sum"], self.rtol, self.atol)
                and _close(a[f"{prefix}_norm"], b[f"{prefix}_norm"], self.rtol, self.atol))

    def _same_tensor(self, a: list, b: list) -> bool:
        """Compare one table row [check, weighted, sum bits, norm bits] of two ranks."""
        if self.rtol == 0 and self.atol == 0:
            return a[:2] == b[:2]
        return all(_close(_bits_float(x), _bits_float(y), self.rtol, self.atol)
                   for x, y in zip(a[2:], b[2:]))

    def _analyse(self, step: int, pending: _Pending, rows: list[dict],
                 previous: list[dict]) -> list[Alert]:
        """Turn the gathered summaries into alerts. Depends on gathered data only (this
        check's and the previous check's), plus, when a mismatch calls for it, one more
        all_gather that every rank then issues."""
        alerts: list[Alert] = []
        ranks = [r["rank"] for r in rows]

        def add(kind: str, at: int, idx: list[int], message: str, **detail) -> None:
            alerts.append(Alert(at, kind, [ranks[i] for i in idx], message, detail))

        # 0. Do the ranks agree on where they are, and on what the model is?
        ref, odd = _majority(rows, lambda a, b: a["step"] == b["step"])
        if odd:
            add("step_mismatch", step, odd,
                f"{_names([ranks[i] for i in odd])} reported step "
                f"{', '.join(str(rows[i]['step']) for i in odd)} at the check where "
                f"rank {ranks[ref]} reported step {rows[ref]['step']}: the loops are out "
                "of step", steps={ranks[i]: rows[i]["step"] for i in range(len(rows))})
        shape = ("n_tensors", "numel", "n_buffers", "buffer_numel")
        ref, odd = _majority(rows, lambda a, b: all(a[k] == b[k] for k in shape))
        if odd:
            add("structure_mismatch", step, odd,
                f"{_names([ranks[i] for i in odd])} hold(s) a model with a different number "
                f"of tensors or elements than rank {ranks[ref]}: these are not replicas",
                shapes={ranks[i]: [rows[i][k] for k in shape] for i in range(len(rows))})
            return alerts  # nothing else is comparable

        # 1. Replicas: parameters, and the synchronised gradients of this step.
        p_ref, p_odd = _majority(rows, self._same_params)
        all_grads = all(r["has_grads"] for r in rows)
        g_ref, g_odd = (_majority(rows, functools.partial(self._same_params, prefix="g"))
                        if all_grads else (0, []))
        tables = None
        if p_odd or g_odd:  # every rank sees the same p_odd / g_odd: all gather, or none
            tables = self._gather_tables(all_grads, pending)
        if p_odd:
            self._mismatch_alert(add, step, rows, tables, p_ref, p_odd, "p", "parameter")
        if g_odd:
            self._mismatch_alert(add, step, rows, tables, g_ref, g_odd, "g", "gradient")

        # 2. Non-finite values: where did they first appear?
        # A rank whose gradient went non-finite while its parameters were still finite is
        # where the trouble started; ranks whose parameters were already broken only
        # inherited it, and are covered by the "parameter" alert below.
        local = [i for i, r in enumerate(rows)
                 if r["local_bad_step"] >= 0 and not r["local_bad_inherited"]]
        if local:
            first = min(rows[i]["local_bad_step"] for i in local)
            where = {ranks[i]: (rows[i]["local_bad_step"], self._name(rows[i]["local_bad_param"]))
                     for i in local}
            what = "; ".join(f"rank {r} at step {s} in '{n}'" for r, (s, n) in where.items())
            add("nan", first, local,
                f"non-finite gradient computed by {_names([ranks[i] for i in local])} before "
                f"the gradient all-reduce ({what}): it came from that rank's own forward or "
                "backward pass, and the all-reduce then spread it to every rank",
                where="gradient", first=where)
        g_bad = [i for i, r in enumerate(rows) if r["has_grads"] and r["g_bad"] >= 0]
        inherited = any(r["local_bad_step"] >= 0 for r in rows)
        g_bad = g_bad if not inherited else []  # else it is explained by the weights
        if g_bad:
            add("nan", step, g_bad,
                f"non-finite synchronised gradient on {_names([ranks[i] for i in g_bad])} "
                f"(first in '{self._name(rows[g_bad[0]]['g_bad'])}'), although every rank's "
                "own gradients were finite: it entered during the all-reduce (a "
                "communication hook or the network), so no single rank can be named",
                where="gradient_after_sync")
        p_bad = [i for i, r in enumerate(rows) if r["p_bad"] >= 0]
        before = {r["rank"] for r in previous if r["p_bad"] >= 0}
        if p_bad:
            if local or g_bad:
                cause = " (after the non-finite gradient above)"
            elif {ranks[i] for i in p_bad} <= before:
                cause = " (already at the previous check)"
            else:
                cause = ("; no rank computed a non-finite gradient from finite parameters "
                         "since the last check, so it came in through the gradient all-reduce "
                         "(a communication hook, the network) or was written into the weights")
            add("nan", step, p_bad,
                f"non-finite parameters on {_names([ranks[i] for i in p_bad])}, first in "
                f"'{self._name(rows[p_bad[0]]['p_bad'])}'{cause}", where="parameter")
        l_bad = [i for i, r in enumerate(rows) if r["loss_bad_step"] >= 0]
        if l_bad:
            add("nan", min(rows[i]["loss_bad_step"] for i in l_bad), l_bad,
                f"non-finite loss on {_names([ranks[i] for i in l_bad])}",
                where="loss", steps={ranks[i]: rows[i]["loss_bad_step"] for i in l_bad})

        # 3. Losses: spikes in time, outliers between ranks.
        spikes = [i for i, r in enumerate(rows) if r["spike_step"] >= 0]
        if spikes:
            first = min(rows[i]["spike_step"] for i in spikes)
            what = "; ".join(f"rank {ranks[i]}: {rows[i]['spike_loss']:.4g} at step "
                             f"{rows[i]['spike_step']} vs median {rows[i]['spike_median']:.4g}"
                             for i in spikes)
            add("loss_spike", first, spikes,
                f"loss above {self.spike_factor:g} x the running median of the last "
                f"{self.window} losses ({what})",
                losses={ranks[i]: rows[i]["spike_loss"] for i in spikes},
                medians={ranks[i]: rows[i]["spike_median"] for i in spikes})
        medians = [r["loss_median"] for r in rows if r["loss_n"] > 0]
        if len(medians) == len(rows) and len(rows) > 2:
            middle = statistics.median(medians)
            high = [i for i, m in enumerate(medians)
                    if middle > 0 and m > self.spike_factor * middle]
            if high:
                add("loss_outlier", step, high,
                    f"{_names([ranks[i] for i in high])}: median loss "
                    f"{', '.join(f'{medians[i]:.4g}' for i in high)} is more than "
                    f"{self.spike_factor:g} x the ranks' median {middle:.4g} (bad data on that "
                    "rank, or a replica that computes something else)",
                    medians={ranks[i]: medians[i] for i in range(len(rows))})

        # 4. Time: a rank that computes much longer than the others holds every rank back.
        busy = [r["busy"] for r in rows]
        if len(rows) > 1 and all(r["steps"] > 0 and math.isfinite(r["busy"]) for r in rows):
            middle = statistics.median(busy)
            slow = [i for i, b in enumerate(busy)
                    if b > self.straggler_factor * middle and b - middle > MIN_STRAGGLER_EXCESS_S]
            if slow:
                add("straggler", step, slow,
                    f"{_names([ranks[i] for i in slow])} computed for "
                    f"{', '.join(f'{1e3 * busy[i]:.1f}' for i in slow)} ms per step (median "
                    f"over the last {rows[slow[0]]['steps']} steps) while the median rank "
                    f"computed for {1e3 * middle:.1f} ms; every other rank waits for it in "
                    "the gradient all-reduce",
                    busy_s={ranks[i]: busy[i] for i in range(len(rows))},
                    wait_s={ranks[i]: rows[i]["wait"] for i in range(len(rows))})
        return alerts

    def _gather_tables(self, with_grads: bool, pending: _Pending) -> list[list[list[int]]]:
        """Second all_gather (only after a mismatch): per-tensor fingerprints of every rank,
        as they were at the check step."""
        ints, floats = pending.params.table()
        table = [i + [_float_bits(s), _float_bits(n)] for i, (s, n) in zip(ints, floats)]
        if with_grads:
            g_ints, g_floats = pending.grads.table()
            table = [row + g[:] + [_float_bits(s), _float_bits(n)]
                     for row, g, (s, n) in zip(table, g_ints, g_floats)]
        mine = torch.tensor(table, dtype=torch.int64).reshape(len(self._params), -1)
        _, parts = self._gather(mine, wait=True)
        return torch.stack(parts).tolist()

    def _mismatch_alert(self, add, step, rows, tables, ref, odd, prefix, what) -> None:
        ranks = [r["rank"] for r in rows]
        cols = slice(0, 4) if prefix == "p" else slice(4, 8)
        first: dict[int, str] = {}
        diffs: dict[int, float] = {}
        for i in odd:
            for t, (mine, theirs) in enumerate(zip(tables[i], tables[ref])):
                if not self._same_tensor(mine[cols], theirs[cols]):
                    first[ranks[i]] = self._names[t]
                    diffs[ranks[i]] = _bits_float(mine[cols][2]) - _bits_float(theirs[cols][2])
                    break
        agree = len(rows) - len(odd)
        odd_ranks = [ranks[i] for i in odd]
        where = "; ".join(f"rank {r}: first in '{n}' (sum differs by {diffs[r]:+.3g})"
                          for r, n in first.items())
        ties = "; no majority, so the lowest rank is the reference" if agree <= len(odd) else ""
        kind = "parameter_mismatch" if prefix == "p" else "gradient_mismatch"
        why = ("replicas must stay bitwise identical: something changed these weights outside "
               "the synchronised update" if prefix == "p" else
               "after the all-reduce every rank must hold the same gradient: these ranks did "
               "not take part, or their gradient was changed after the all-reduce")
        tolerance = "" if self.rtol == 0 and self.atol == 0 else \
            f" beyond rtol={self.rtol:g}, atol={self.atol:g}"
        add(kind, step, odd,
            f"the {what}s of {_names(odd_ranks)} differ{tolerance} from those of rank "
            f"{ranks[ref]} ({agree} of {len(rows)} ranks agree with it{ties}); {where}; {why}",
            reference_rank=ranks[ref], parameter=next(iter(first.values()), None),
            parameters=first, sum_difference=diffs)

    def _name(self, index: int) -> str:
        return self._names[index] if 0 <= index < len(self._names) else f"#{index}"

    # --- acting on alerts ----------------------------------------------------------------------

    def _act(self, step: int, rows: list[dict], alerts: list[Alert]) -> None:
        """Record, then warn / raise / repair. Every rank holds the same alerts, so every rank
        makes the same decision, and the same collectives if it repairs."""
        self.alerts.extend(alerts)
        # A problem that persists (replicas that stay apart) is recorded at every check,
        # but warned about only when it first appears.
        key = lambda a: (a.kind, tuple(a.ranks), a.detail.get("where"), a.detail.get("parameter"))
        new = [a for a in alerts if key(a) not in self._previous_keys]
        self._previous_keys = {key(a) for a in alerts}
        if not alerts:
            return
        if self.on_alert == "raise":
            raise SyncError(alerts)
        if self.on_alert == "repair" and any(a.kind in ("parameter_mismatch", "nan")
                                             for a in alerts):
            repair = self._repair(step, rows)
            if repair is not None:
                self.alerts.append(repair)
                new.append(repair)
        first_rank = not dist.is_initialized() or dist.get_rank(self.group) == 0
        if first_rank:  # one warning per problem, not one per rank
            for a in new:
                warnings.warn(str(a), SyncWarning, stacklevel=5)

    def _repair(self, step: int, rows: list[dict]) -> Alert | None:
        """Broadcast parameters and buffers from the lowest rank of the largest group of
        agreeing replicas with finite parameters (rank 0 when it is healthy)."""
        healthy = [i for i, r in enumerate(rows) if r["p_bad"] < 0]
        if not healthy:
            return Alert(step, "repair", [], "cannot repair: no rank has finite parameters",
                         {"repaired": False})
        ref, odd_in_healthy = _majority([rows[i] for i in healthy], self._same_params)
        src = healthy[ref]
        broken = [i for i in range(len(rows)) if not self._same_params(rows[src], rows[i])
                  or rows[i]["p_bad"] >= 0]
        if not broken:
            return None
        tensors = self._params + list(self.module.buffers())
        global_src = rows[src]["rank"]
        with torch.no_grad():
            for dtype in dict.fromkeys(t.dtype for t in tensors):  # in first-seen order
                same = [t for t in tensors if t.dtype == dtype]
                flat = torch.cat([t.detach().reshape(-1) for t in same])
                if self.world > 1:
                    dist.broadcast(flat, src=global_src, group=self.group)
                offset = 0
                for t in same:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()
        fixed = [rows[i]["rank"] for i in broken]
        return Alert(step, "repair", fixed,
                     f"re-broadcast parameters and buffers from rank {global_src} to "
                     f"{_names(fixed)} (optimizer state such as momentum was not repaired)",
                     {"repaired": True, "source_rank": global_src})

    # --- for people ------------------------------------------------------------------------------

    def report(self) -> str:
        """A human-readable summary: alerts, then what every rank reported at the last check."""
        lines = [f"SyncMonitor: {self.steps} steps, {self.checks} checks (every {self.every} "
                 f"steps), {self.world} ranks, on_alert={self.on_alert!r}; one check "
                 f"all-gathers {self.check_bytes} bytes per rank"]
        if not self.alerts:
            exact = "bitwise identical" if self.rtol == 0 and self.atol == 0 else "within tolerance"
            lines.append(f"no alerts: the replicas were {exact} at every check"
                         if self.checks else "no check has run yet")
        else:
            counts: dict[str, int] = {}
            for a in self.alerts:
                counts[a.kind] = counts.get(a.kind, 0) + 1
            lines.append(f"{len(self.alerts)} alert(s): "
                         + ", ".join(f"{k} x{n}" for k, n in counts.items()))
            lines += [f"  {a}" for a in self.alerts]
        if self._pending is not None:
            lines.append(f"the check of step {self._pending.step} is still on its way: call "
                         "mon.check() on every rank to see its verdict")
        if self.last_check:
            last = self.last_check[0]["step"]
            lines.append(f"last check (step {last}); times are medians over the last {self.window} "
                         "steps, losses and own |grad| over the steps since the check before:")
            lines.append("  rank  busy ms  wait ms  loss        own |grad|  synced |grad|"
                         "  |params|    fingerprint")
            for r in self.last_check:
                print_fp = f"{(r['p_check'] ^ r['p_weighted']) & 0xFFFFFFFF:08x}"
                synced = f"{r['g_norm']:<13.6g}" if r["has_grads"] else f"{'-':<13}"
                lines.append(
                    f"  {r['rank']:>4}  {1e3 * r['busy']:>7.2f}  {1e3 * r['wait']:>7.2f}  "
                    f"{r['loss_median']:<10.4g}  {r['local_norm']:<10.4g}  {synced}  "
                    f"{r['p_norm']:<10.6g}  {print_fp}")
        return "\n".join(lines)
