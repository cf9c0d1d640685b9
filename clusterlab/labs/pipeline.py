"""Lab 09: pipeline-parallel schedules, GPipe then 1F1B, with real send/recv of activations and
gradients between stages (follows notebook 10b_tensor_pipeline_expert_parallelism).

The learner writes, on every rank (rank r is pipeline stage r of p):

    gpipe(stage, inputs, targets, loss_fn)        all forwards, then all backwards
    one_f_one_b(stage, inputs, targets, loss_fn)  warm-up, one forward one backward, cool-down

Both run one training step over m micro-batches: rank 0 feeds `inputs` (a list of m tensors,
which every rank may also use for shapes: each stage maps [b, d] to [b, d]), the last rank
applies `loss_fn(output, target)` to each micro-batch, and every stage ends with `.grad` of
its parameters equal to the gradient of the mean micro-batch loss. The last rank returns that
loss as a float.

How the checks see what the code did: every stage is wrapped so that its forward and backward
take a fixed time (a sleep standing for compute: 1 unit forward, 2 backward) and record when
they ran. From that the checks measure the bubble, 1 - busy time / step time, against
(p-1)/(m+p-1), and the largest number of micro-batches whose activations a stage held at
once (forwards done minus backwards done): m for GPipe, at most p for 1F1B. Results are
compared with the same model run in one process on the whole batch.
"""

from __future__ import annotations

import time

import numpy as np

from .. import interview_math
from .core import Fail, Lab

LAB = Lab("09_pipeline_schedule", "Pipeline schedules: GPipe and 1F1B",
          follows="10b_tensor_pipeline_expert_parallelism")

WIDTH, BATCH = 16, 4  # each stage: Linear(WIDTH, WIDTH) + tanh; micro-batches of BATCH rows
FORWARD_S = 0.04  # seconds a stage's forward "computes" per micro-batch (backward: twice)
BUBBLE_TOLERANCE = 0.08  # measured vs (p-1)/(m+p-1), absolute: sends and a loaded machine add
GRAD_RTOL = 1e-4  # float32, summed in another order than the one-process baseline


def predicted_bubble(stages: int, microbatches: int) -> float:
    """(p-1)/(m+p-1): the formula the learner's measurement is held against."""
    return interview_math.pipeline_bubble(stages, microbatches)


# --- rank side ----------------------------------------------------------------------------------


def _stage(rank: int, seed: int):
    import torch

    torch.manual_seed(seed * 1000 + rank)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())


def _data(m: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(BATCH, WIDTH, generator=g) for _ in range(m)]
    ts = [torch.randn(BATCH, WIDTH, generator=g) for _ in range(m)]
    return xs, ts


class _Clock:
    """What a wrapped stage did: busy intervals and activations held."""

    def __init__(self) -> None:
        self.busy = 0.0
        self.held = 0
        self.peak = 0
        self.forwards = 0
        self.backwards = 0
        self.backward_spans: list[tuple[float, float]] = []  # (start, end), time.monotonic()


def _timed(stage, rec: _Clock, unit: float):
    """`stage` whose forward sleeps `unit` and whose backward sleeps 2 `unit` (compute)."""
    import torch

    class Delay(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            t = time.monotonic()
            time.sleep(unit)
            rec.busy += time.monotonic() - t
            rec.forwards += 1
            rec.held += 1
            rec.peak = max(rec.peak, rec.held)
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            t = time.monotonic()
            time.sleep(2 * unit)
            rec.busy += time.monotonic() - t
            rec.backward_spans.append((t, time.monotonic()))
            rec.backwards += 1
            rec.held -= 1
            return grad

    class Timed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = stage

        def forward(self, x):
            return Delay.apply(self.inner(x))

    return Timed()


def _connect(rank: int, p: int) -> None:
    """One small message each way between neighbours: Gloo opens a pair's connection on its
    first message, which on a loaded machine takes longer than the step being timed."""
    import torch
    import torch.distributed as dist

    buf = torch.zeros(1)
    for peer in (rank - 1, rank + 1):
        if 0 <= peer < p:
            works = [dist.isend(torch.zeros(1), peer), dist.irecv(buf, peer)]
            for w in works:
                w.wait()


def _on_rank(fn, name: str, m: int, seed: int, unit: float) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, p = dist.get_rank(), dist.get_world_size()
    rec = _Clock()
    stage = _timed(_stage(rank, seed), rec, unit)
    xs, ts = _data(m, seed)
    _connect(rank, p)
    if unit > 0:  # timed: run it once untimed first (connections, autograd's threads)
        fn(_timed(_stage(rank, seed), _Clock(), 0.0), [x.clone() for x in xs],
           [t.clone() for t in ts], F.mse_loss)
    dist.barrier()
    start = time.monotonic()
    loss = fn(stage, [x.clone() for x in xs], [t.clone() for t in ts], F.mse_loss)
    end = time.monotonic()
    dist.barrier()
    grads = [None if q.grad is None else q.grad.numpy().copy() for q in stage.inner.parameters()]
    if rank == p - 1:
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                raise Fail(f"{name} returned a tensor of shape {tuple(loss.shape)} on the last "
                           "rank: return the mean micro-batch loss, one number")
            loss = loss.item()
        if not isinstance(loss, int | float):
            raise Fail(f"{name} returned {type(loss).__name__} on the last rank: return the "
                       "mean of the m micro-batch losses as a float")
    return {"loss": loss, "grads": grads, "start": start, "end": end, "busy": rec.busy,
            "peak": rec.peak, "forwards": rec.forwards, "backwards": rec.backwards,
            "backward_spans": rec.backward_spans}


# --- what the checks compare with -----------------------------------------------------------------


def _baseline(p: int, m: int, seed: int) -> tuple[float, list[list[np.ndarray]]]:
    """Loss and per-stage gradients of the same p stages in one process, whole batch."""
    import torch
    import torch.nn.functional as F

    stages = [_stage(r, seed) for r in range(p)]
    xs, ts = _data(m, seed)
    out = torch.cat(xs)
    for s in stages:
        out = s(out)
    loss = F.mse_loss(out, torch.cat(ts))  # equal micro-batches: the mean of their means
    loss.backward()
    return loss.item(), [[q.grad.numpy() for q in s.parameters()] for s in stages]


def _run(ctx, name: str, p: int, m: int, seed: int, unit: float = 0.0) -> list[dict]:
    fn = ctx.learner(name)
    with ctx.cluster(nodes=p, nic=None, timeout=20 + 6 * m * unit * p) as cl:
        return ctx.run(cl, _on_rank, fn, name, m, seed, unit)


def _equal(ctx, name: str, p: int, m: int, seed: int) -> str:
    out = _run(ctx, name, p, m, seed)
    loss, grads = _baseline(p, m, seed)
    for r, res in enumerate(out):
        if res["forwards"] != m:
            raise Fail(f"stage {r} ran its forward {res['forwards']} times for {m} micro-batches"
                       ": every stage runs every micro-batch forward once")
        if res["backwards"] != m:
            raise Fail(f"stage {r} ran its backward {res['backwards']} times for {m} "
                       "micro-batches: call backward once per micro-batch on every stage "
                       "(the last on its loss, the others on the received gradient)")
        for got, want in zip(res["grads"], grads[r]):
            if got is None:
                raise Fail(f"stage {r}'s parameters have no .grad: did the gradient reach it? "
                           "A received activation must be made a leaf that requires grad "
                           "(x.requires_grad_()), so that x.grad exists to send back")
            if np.allclose(got, want, rtol=GRAD_RTOL, atol=1e-6):
                continue
            if not got.any() and want.any():
                raise Fail(f"stage {r}'s gradient is zero: no gradient came back from stage "
                           f"{r + 1}. A received activation must be made a leaf that requires "
                           "grad (x.requires_grad_() after recv), so that x.grad exists to "
                           "send back")
            if np.allclose(got * m, want, rtol=GRAD_RTOL, atol=1e-6):
                raise Fail(f"stage {r}'s gradient is 1/{m} of the one-process gradient: "
                           "the loss was divided by m twice")
            if np.allclose(got, want * m, rtol=GRAD_RTOL, atol=1e-6):
                raise Fail(f"stage {r}'s gradient is {m}x the one-process gradient: divide "
                           f"each micro-batch's loss by m = {m} before its backward")
            err = float(np.max(np.abs(got - want)))
            raise Fail(f"stage {r}'s gradient differs from the one-process run by up to "
                           f"{err:.3g}: check which activation and gradient go with which "
                           "micro-batch")
    last = out[-1]["loss"]
    if abs(last - loss) > 1e-5 * max(1.0, abs(loss)):
        raise Fail(f"the last rank returned the loss {last:.6g}, the one-process run gives "
                   f"{loss:.6g}: return the mean of the m micro-batch losses")
    return f"{p} stages x {m} micro-batches: loss and every gradient equal one process"


def _summary(out: list[dict], p: int, m: int) -> dict:
    step = max(r["end"] for r in out) - min(r["start"] for r in out)
    busy = float(np.mean([r["busy"] for r in out]))
    return {"step": step, "bubble": 1 - busy / step, "predicted": predicted_bubble(p, m),
            "peak": [r["peak"] for r in out],
            "backward_spans": [r.get("backward_spans", []) for r in out]}


def _backed_up_at_once(got: dict) -> bool:
    """Did the next-to-last stage start its backwards only after the last stage had run ALL
    of its own (one backward of the summed losses, or every gradient sent at the end)?"""
    spans = got["backward_spans"]
    if len(spans) < 2 or not spans[-1] or not spans[-2] or len(spans[-1]) < 2:
        return False
    return spans[-2][0][0] >= spans[-1][-1][1] - 1e-3


def _each_on_rank(fn, name: str, ms: list[int], seed: int, unit: float) -> list[dict]:
    return [_on_rank(fn, name, m, seed, unit) for m in ms]


def measure(fn, p: int, microbatches: list[int], *, seed: int = 0,
            unit: float = FORWARD_S) -> list[dict]:
    """Time the schedule `fn` on p ranks (one cluster) for each m in `microbatches`, forward
    `unit` s and backward 2 `unit` per micro-batch: per m, the step time, the measured bubble
    (1 - mean busy time / step time), its prediction (p-1)/(m+p-1), and the most
    micro-batches' activations each stage held at once."""
    from ..cluster import Cluster

    ms = list(microbatches)
    with Cluster(nodes=p, nic=None, timeout=30 + 6 * sum(ms) * unit * p) as cl:
        out = cl.run(_each_on_rank, fn, getattr(fn, "__name__", "fn"), ms, seed, unit)
    return [dict(_summary([r[i] for r in out], p, m), m=m) for i, m in enumerate(ms)]


def _timing(ctx, name: str, p: int, m: int) -> dict:
    return _summary(_run(ctx, name, p, m, 0, FORWARD_S), p, m)


def _hidden_case(ctx) -> tuple[int, int, int]:
    return int(ctx.rng.integers(3, 5)), int(ctx.rng.integers(2, 9)), int(ctx.rng.integers(1e6))


# --- exercise 1: GPipe ----------------------------------------------------------------------------

GPIPE = LAB.exercise(
    "gpipe", needs=("gpipe",), title="GPipe: all forwards, then all backwards",
    hints=(
        "The idea: a stage can only work on what it was sent. Forward: receive an activation "
        "from the previous stage, compute, send it on, keep what backward needs. Backward, in "
        "the same order: receive the gradient of your output, backpropagate, send the gradient "
        "of your input back.",
        "Forward, for each micro-batch i: rank 0 takes inputs[i]; the others recv into "
        "torch.empty_like(inputs[i]) from rank - 1 and call .requires_grad_() on it. Compute "
        "y = stage(x); keep (x, y); send y.detach() to rank + 1 unless you are the last rank.",
        "Backward, for each micro-batch i: the last rank calls (loss_fn(y, targets[i]) / m)"
        ".backward(); the others recv the gradient of y from rank + 1 and call y.backward(g). "
        "Then every rank but 0 sends x.grad to rank - 1.",
        "Blocking dist.send waits until the peer posts its recv. In GPipe each rank only sends "
        "to one neighbour while that neighbour receives, so blocking calls are fine here.",
    ))


@GPIPE.check("equal to one process: loss and every gradient, 2 stages x 4 micro-batches",
             points=3)
def _gpipe_equal(ctx):
    return _equal(ctx, "gpipe", 2, 4, 7)


@GPIPE.check("bubble measured against (p-1)/(m+p-1), 4 stages x 4 micro-batches", points=3)
def _gpipe_bubble(ctx):
    got = _timing(ctx, "gpipe", 4, 4)
    if abs(got["bubble"] - got["predicted"]) > BUBBLE_TOLERANCE:
        if _backed_up_at_once(got):
            raise Fail(f"measured bubble {got['bubble']:.2f}, GPipe's (p-1)/(m+p-1) is "
                       f"{got['predicted']:.2f}: the stage before the last started its first "
                       "backward only after the last stage had run all of its backwards, so "
                       "no gradient left the last stage until its whole backward phase was "
                       "over. Backpropagate each micro-batch's loss on its own and send its "
                       "gradient right away (not one backward of the summed losses)")
        raise Fail(f"measured bubble {got['bubble']:.2f}, GPipe's (p-1)/(m+p-1) is "
                   f"{got['predicted']:.2f}: a stage should start micro-batch i+1 as soon as "
                   "it has sent micro-batch i (do not wait for the whole pipeline between "
                   "micro-batches)")
    return (f"bubble {got['bubble']:.2f} measured, {got['predicted']:.2f} predicted; "
            f"step {got['step']:.2f} s")


@GPIPE.check("hidden: 3-4 stages, 2-8 micro-batches, other weights", points=2, hidden=True)
def _gpipe_hidden(ctx):
    return _equal(ctx, "gpipe", *_hidden_case(ctx))


# --- exercise 2: 1F1B -----------------------------------------------------------------------------

ONE_F_ONE_B = LAB.exercise(
    "one_f_one_b", needs=("one_f_one_b",), title="1F1B: the same bubble, p activations",
    hints=(
        "Stage r first runs min(p - 1 - r, m) forwards (the warm-up); then, while forwards "
        "remain, one forward followed by one backward (of the oldest micro-batch it holds); "
        "then the remaining backwards (the cool-down).",
        "Now a stage sends forward while its neighbour sends backward: two blocking sends "
        "facing each other wait for each other forever. Send with dist.isend, keep the "
        "request and the tensor, and wait for all requests at the end.",
        "Keep the (x, y) pairs in a FIFO (collections.deque): backwards run in the order of "
        "the forwards.",
    ))


@ONE_F_ONE_B.check("equal to one process: loss and every gradient, 3 stages x 6 micro-batches",
                   points=3)
def _1f1b_equal(ctx):
    return _equal(ctx, "one_f_one_b", 3, 6, 11)


@ONE_F_ONE_B.check("at most p micro-batches in flight, and the bubble of GPipe, 4 stages x 8",
                   points=3)
def _1f1b_memory(ctx):
    p, m = 4, 8
    got = _timing(ctx, "one_f_one_b", p, m)
    # 1F1B: stage r runs p - 1 - r forwards, then one more before its first backward, so it
    # holds p - r micro-batches at most (stage 0: p; the last stage: 1).
    want = [min(p - r, m) for r in range(p)]
    over = [r for r in range(p) if got["peak"][r] > want[r]]
    if over:
        r = over[0]
        raise Fail(f"stage {r} held the activations of {got['peak'][r]} micro-batches at once; "
                   f"1F1B's stage r holds at most p - r = {want[r]} (GPipe holds all m = {m}): "
                   f"stage {r}'s warm-up is p - 1 - r = {p - 1 - r} forwards, then one "
                   "forward and one backward in turn")
    if abs(got["bubble"] - got["predicted"]) > BUBBLE_TOLERANCE:
        under = [r for r in range(p) if got["peak"][r] < want[r]]
        if under:
            r = under[0]
            raise Fail(f"measured bubble {got['bubble']:.2f}, (p-1)/(m+p-1) is "
                       f"{got['predicted']:.2f}; stage {r} never held more than "
                       f"{got['peak'][r]} micro-batches where 1F1B holds p - r = {want[r]}: "
                       f"its warm-up is too short (p - 1 - r = {p - 1 - r} forwards before "
                       "the first backward), so the stages after it wait for forwards")
        raise Fail(f"measured bubble {got['bubble']:.2f}, (p-1)/(m+p-1) is "
                   f"{got['predicted']:.2f}, and every stage's warm-up is right: does a stage "
                   "wait for something it does not need (e.g. its own sends, before the next "
                   "compute)?")
    return (f"stage 0 held at most {got['peak'][0]} micro-batches, and no stage more than 1F1B "
            f"allows; bubble {got['bubble']:.2f} measured, {got['predicted']:.2f} predicted")


@ONE_F_ONE_B.check("hidden: 3-4 stages, 2-8 micro-batches, other weights", points=2,
                   hidden=True)
def _1f1b_hidden(ctx):
    return _equal(ctx, "one_f_one_b", *_hidden_case(ctx))


# --- predict first: the activations each stage holds ------------------------------------------

PREDICT = LAB.exercise(
    "pipeline_predict",
    needs=("PREDICTED_PEAKS_GPIPE", "PREDICTED_PEAKS_1F1B", "gpipe", "one_f_one_b"),
    title="Predict, then measure: the activations each stage holds (4 stages, 8 micro-batches)",
    hints=(
        "A stage holds a micro-batch's activations from its forward until its backward. "
        "Count, stage by stage, how many forwards it has run when its first backward starts.",
        "GPipe runs every forward before any backward. In 1F1B, stage r's warm-up is "
        "min(p - 1 - r, m) forwards, and the steady phase runs one more forward before each "
        "backward.",
    ))


def _peaks_answer(ctx, name: str, p: int) -> list[int]:
    value = ctx.learner(name)
    try:
        out = [int(v) for v in value]
        if len(out) != p or any(int(v) != v for v in value):
            raise ValueError
    except (TypeError, ValueError):
        raise Fail(f"{name} should be a list of {p} whole numbers, one per stage (0..{p - 1}), "
                   f"got {value!r}") from None
    return out


@PREDICT.check("your predictions of each stage's peak activations match the measurement",
               points=2)
def _predict_peaks(ctx):
    p, m = 4, 8
    predicted = {"GPipe": _peaks_answer(ctx, "PREDICTED_PEAKS_GPIPE", p),
                 "1F1B": _peaks_answer(ctx, "PREDICTED_PEAKS_1F1B", p)}
    rule = {"GPipe": [m] * p, "1F1B": [min(p - r, m) for r in range(p)]}
    measured = {}
    for what, name in (("GPipe", "gpipe"), ("1F1B", "one_f_one_b")):
        measured[what] = [r["peak"] for r in _run(ctx, name, p, m, 0)]
        if measured[what] != rule[what]:
            raise Fail(f"your {name} held {measured[what]} micro-batches per stage, which is not "
                       f"the {what} schedule of this lab: make check(\"{name}\") pass first, "
                       "then compare your prediction with its measurement")
    wrong = [f"{what}: you predicted {predicted[what]}, the measurement gives {measured[what]}"
             for what in ("GPipe", "1F1B") if predicted[what] != measured[what]]
    if wrong:
        raise Fail("; ".join(wrong) + ". Where did the count go wrong? A stage holds a "
                   "micro-batch from its forward until its backward: count the forwards each "
                   "stage has run when its first backward starts")
    return (f"predicted and measured: GPipe {measured['GPipe']}, 1F1B {measured['1F1B']} "
            "(stages 0..3)")
