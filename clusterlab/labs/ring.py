"""Lab 02: ring all-reduce from point-to-point messages, then recursive doubling, then the
crossover between them (follows notebook 02_allreduce_and_topology).

The learner writes, on torch.distributed point-to-point calls only:

    naive_allreduce(tensor, op="sum")   everyone sends to rank 0, which reduces and sends back
    ring_allreduce(tensor, op="sum")    reduce-scatter, then all-gather, around a ring
    rd_allreduce(tensor, op="sum")      recursive doubling (partner = rank ^ step), any p
    ring_time_model(p, nbytes, alpha, beta)
    predicted_crossover(p, alpha, beta), measured_crossover(sizes, ring_times, rd_times)

Each all-reduce reduces a 1-D `tensor` IN PLACE over all ranks of the default group and
returns it; op is "sum" or "avg" (avg only for floating-point tensors).

How the checks see what the code did: on every rank the learner's call runs inside `_Spy`,
which makes torch.distributed's collectives raise (the point of the lab is to build them),
records every send and receive (peer, elements), and names the operation a rank is blocked
in, so that a deadlock's timeout says who waits for whom. Wrong results are explained from a
second run on "tagged" inputs: rank j's element i is 16^j (i + 1), so every element of a
result spells, in base 16, how many times it counted each rank's input (`_coeffs`). From
those counts `_explain` names the known mistakes: a missing all-gather, an off-by-one chunk
index, chunks that assume p divides n, an average not divided by p (or divided twice).
"""

from __future__ import annotations

import math
import re
import statistics

import numpy as np

from .. import models
from .core import Fail, Lab, earlier_failure, remember_failure, shorten

LAB = Lab("02_ring_allreduce", "Ring all-reduce from point-to-point",
          follows="02_allreduce_and_topology")

NIC = "delay 2ms rate 1gbit"  # the timing checks' network (alpha = 2 ms, 1 Gbit/s per node)
TOLERANCE = 0.15  # measured vs alpha-beta prediction
RUN_TIMEOUT = 6.0  # s per run (not start): a correct answer needs milliseconds; a deadlock
START_TIMEOUT = 60.0  # fails in 6 s. Starting 8 ranks on a busy 2-core machine takes longer
REPEATS = 3  # timed repetitions per configuration (the median is compared)
MiB = 1 << 20

# Collectives a learner must not call: everything that would do the lab's work for it.
FORBIDDEN = ("all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter",
             "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor", "broadcast",
             "gather", "scatter", "all_to_all", "all_to_all_single", "all_gather_object",
             "broadcast_object_list", "gather_object", "scatter_object_list")


# --- rank side: run the learner's function and watch what it does ------------------------------


def _status(text: str) -> None:
    """Name what this rank is doing (a timeout's message quotes it)."""
    from .. import backend

    if backend.status_hook is not None:
        backend.status_hook(text)


class _Work:
    """A send/recv request whose wait() tells the launcher what this rank waits for."""

    def __init__(self, work, what: str) -> None:
        self._work, self._what = work, what

    def wait(self, *args, **kwargs):
        _status(f"wait() on {self._what}")
        out = self._work.wait(*args, **kwargs)
        _status("running the all-reduce")
        return out

    def __getattr__(self, name):
        return getattr(self._work, name)


class _Spy:
    """While active (on one rank): collectives raise, point-to-point calls are recorded."""

    def __init__(self, fn, name: str, dtype) -> None:
        self.fn, self.name, self.dtype = fn, name, dtype
        self.sends: list[tuple[int, int]] = []  # (peer, elements) of every send, in order
        self.recvs: list[tuple[int, int]] = []

    def _peer(self, peer, verb: str) -> None:
        import torch.distributed as dist

        p = dist.get_world_size()
        if not isinstance(peer, int) or not 0 <= peer < p:
            raise Fail(f"{self.name} tried to {verb} rank {peer!r}, which does not exist "
                       f"(world size {p}, ranks 0..{p - 1}); compute peers modulo p, or with "
                       "rank ^ step for recursive doubling")

    def _wrap(self, orig, kind: str, blocking: bool):
        spy = self

        def call(tensor, *args, **kwargs):
            key = "dst" if kind == "send" else "src"
            peer = args[0] if args else kwargs.get(key, kwargs.get(f"group_{key}"))
            to = "to" if kind == "send" else "from"
            verb = "send to" if kind == "send" else "receive from"
            if peer is not None or kind == "send":  # recv(src=None): from any source
                spy._peer(peer, verb)
            if getattr(tensor, "dtype", spy.dtype) != spy.dtype:  # Gloo would abort
                raise Fail(f"{spy.name} tried to {verb} rank {peer} a {tensor.dtype} buffer, "
                           f"but the tensor is {spy.dtype}: make buffers like the data, "
                           "torch.empty_like(chunk) (torch.empty(k) is float32)")
            (spy.sends if kind == "send" else spy.recvs).append((peer, tensor.numel()))
            if blocking:
                _status(f"dist.{kind} {to} rank {peer} (blocking)")
                out = orig(tensor, *args, **kwargs)
                _status("running the all-reduce")
                return out
            return _Work(orig(tensor, *args, **kwargs), f"i{kind} {to} rank {peer}")

        return call

    def _forbid(self, attr: str):
        def call(*args, **kwargs):
            raise Fail(f"{self.name} called dist.{attr}: build the all-reduce from "
                       "dist.isend / dist.irecv (or send / recv), not from torch.distributed's "
                       "collectives")

        return call

    def __enter__(self) -> _Spy:
        import torch.distributed as dist

        new = {attr: self._forbid(attr) for attr in FORBIDDEN if hasattr(dist, attr)}
        for attr, kind, blocking in (("isend", "send", False), ("irecv", "recv", False),
                                     ("send", "send", True), ("recv", "recv", True)):
            new[attr] = self._wrap(getattr(dist, attr), kind, blocking)
        self._saved = [(dist, attr, getattr(dist, attr)) for attr in new]
        originals = {id(getattr(dist, attr)): attr for attr in new}
        for attr, fn in new.items():
            setattr(dist, attr, fn)
        # Names imported straight into the notebook (`from torch.distributed import isend`)
        # live in the function's globals, shared by its notebook helpers.
        g = getattr(self.fn, "__globals__", None)
        if isinstance(g, dict):
            for key, value in list(g.items()):
                attr = originals.get(id(value))
                if attr is not None:
                    self._saved.append((g, key, value))
                    g[key] = new[attr]
        return self

    def __exit__(self, *exc) -> None:
        for where, key, value in reversed(self._saved):
            if isinstance(where, dict):
                where[key] = value
            else:
                setattr(where, key, value)


def _cases_on_rank(fn, name: str, cases: list[dict]) -> list[dict]:
    """Run fn(tensor, op=...) on this rank for each case; report its result and messages.
    A case gives every rank's input (x: p x n) and the op; this rank takes row `rank`."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    out = []
    for case in cases:
        x = torch.from_numpy(np.ascontiguousarray(case["x"][rank]).copy())
        before = x.clone()
        with _Spy(fn, name, x.dtype) as spy:
            returned = fn(x, op=case["op"])
        if not (returned is None or returned is x or isinstance(returned, torch.Tensor)):
            raise Fail(f"{name} returned {type(returned).__name__}, not the tensor: reduce "
                       "`tensor` in place and return it")
        result = x
        if (returned is not None and returned is not x and torch.equal(x, before)
                and not torch.equal(returned, x)):
            raise Fail(f"{name} returned a new tensor and left `tensor` unchanged: reduce "
                       "in place (e.g. tensor.copy_(result)) and return tensor")
        if result.dtype != x.dtype or result.shape != x.shape:
            raise Fail(f"{name} returned a {result.dtype} tensor of shape {tuple(result.shape)}"
                       f" for a {x.dtype} input of shape {tuple(x.shape)}")
        out.append({"y": result.numpy().copy(), "sends": spy.sends, "recvs": spy.recvs})
    return out


def _timed_on_rank(fn, name: str, nelem: int, repeats: int) -> list[tuple[float, float]]:
    """(entry, exit) emulated times of `repeats` calls, each after a barrier, after one
    untimed call on a small tensor (which opens the connections)."""
    import torch
    import torch.distributed as dist

    from .. import clock

    p = dist.get_world_size()
    spans = []
    with _Spy(fn, name, torch.float32):
        fn(torch.ones(min(nelem, 1024)), op="sum")
        for _ in range(repeats):
            x = torch.ones(nelem)
            dist.barrier()
            t0 = clock.now()
            fn(x, op="sum")
            spans.append((t0, clock.now()))
            if not bool((x == p).all()):
                raise Fail(f"{name} gave a wrong sum on the emulated network ({nelem} "
                           f"elements of ones on {p} ranks)")
    return spans


# --- parent side: inputs, the tags, and what a wrong result means ------------------------------

_TAG = 16  # base of the tags: an element's digits count how often each rank's input is in it


def _tags(p: int, n: int) -> np.ndarray:
    """Rank j's element i = 16^j (i + 1) (float64: exact for p <= 8 and n in the hundreds)."""
    return (float(_TAG) ** np.arange(p))[:, None] * np.arange(1, n + 1)[None, :]


def _random(rng, p: int, n: int, dtype: str) -> np.ndarray:
    if dtype.startswith("int"):
        return rng.integers(-1000, 1000, size=(p, n)).astype(dtype)
    return rng.standard_normal((p, n)).astype(dtype)


def _coeffs(y: np.ndarray, p: int, scale: float) -> np.ndarray:
    """Per element of one rank's tagged result: how many times it counts each rank's input
    (n x p ints), or -1 where the value is no such combination of the element's inputs."""
    n = y.size
    v = np.asarray(y, dtype=np.float64) * scale / np.arange(1, n + 1)
    c = np.rint(v)
    ok = (np.abs(v - c) <= 1e-6 * np.maximum(1.0, np.abs(v))) & (c >= 0) & (c < _TAG ** p)
    c = np.where(ok, c, 0).astype(np.int64)
    digits = (c[:, None] // (_TAG ** np.arange(p))[None, :]) % _TAG
    digits[~ok] = -1
    return digits


def _ranks(c: np.ndarray) -> str:
    """[1, 1, 0, 2] -> 'ranks 0, 1 and rank 3 twice (rank 2 missing)'."""
    once = [str(j) for j, k in enumerate(c) if k == 1]
    more = [f"rank {j} {'twice' if k == 2 else f'{k} times'}" for j, k in enumerate(c) if k > 1]
    missing = [str(j) for j, k in enumerate(c) if k == 0]
    parts = ([("rank " if len(once) == 1 else "ranks ") + ", ".join(once)] if once else []) + more
    text = " and ".join(parts) if parts else "nothing"
    if missing:
        text += f" ({'rank' if len(missing) == 1 else 'ranks'} {', '.join(missing)} missing)"
    return text


def _runs(ok: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs [a, b] (inclusive) where ok is True."""
    runs, start = [], None
    for i, v in enumerate(list(ok) + [False]):
        if v and start is None:
            start = i
        elif not v and start is not None:
            runs.append((start, i - 1))
            start = None
    return runs


def _span(a: int, b: int, p: int, n: int) -> str:
    """'chunk 2 (elements 6-8)' when [a, b] is one chunk of an even split, else 'elements'."""
    where = f"element {a}" if a == b else f"elements {a}-{b}"
    for bounds in ([n * i // p for i in range(p + 1)],  # floor split (sizes 2, 3, 2, 3 ...)
                   list(np.cumsum([0] + [len(c) for c in np.array_split(np.arange(n), p)]))):
        for k in range(p):
            if (bounds[k], bounds[k + 1] - 1) == (a, b):
                return f"chunk {k} ({where})"
    return where


def _num(v) -> str:
    """A number as the learner would print it (no numpy repr)."""
    v = v.item() if hasattr(v, "item") else v
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _shown(v) -> str:
    """What a learner's function returned: floats to 7 digits, anything else as its repr."""
    v = v.item() if hasattr(v, "item") and getattr(v, "ndim", 1) == 0 else v
    return f"{v:.7g}" if isinstance(v, float) else repr(v)


def _explain(kind: str, p: int, n: int, op: str, ys: list[np.ndarray]) -> str | None:
    """What a wrong tagged result looks like, naming the rank and the chunk; None if right."""
    scale = p if op == "avg" else 1
    coeffs = [_coeffs(y, p, scale) for y in ys]
    full = [(c == 1).all(axis=1) for c in coeffs]
    wrong_ranks = [r for r in range(p) if not full[r].all()]
    if not wrong_ranks:
        return None
    bad = wrong_ranks[0]
    many = len(wrong_ranks) > 1
    others = ("every rank holds" if len(wrong_ranks) == p else
              f"rank{'s' if many else ''} {', '.join(map(str, wrong_ranks))} "
              f"hold{'' if many else 's'}")
    if op == "avg":
        if all((_coeffs(ys[r], p, 1) == 1).all() for r in wrong_ranks):
            return (f"{others} the SUM, not the average: for op='avg' divide the "
                    f"result by p = {p} once, at the end")
        if all((_coeffs(ys[r], p, p * p) == 1).all() for r in wrong_ranks):
            return (f"{others} the sum divided by p^2 = {p * p}: the average is "
                    "divided twice (divide once, on one side, at the end - not per step, per "
                    "chunk, or on both the root and the receivers)")
    c = coeffs[bad]
    first = int(np.flatnonzero(~full[bad])[0])
    own = np.eye(p, dtype=np.int64)
    untouched = [r for r in range(p) if any(
        (_coeffs(ys[r], p, k) == own[r]).all() for k in {scale, 1})]
    if kind == "naive" and untouched and len(untouched) < p:
        return (f"rank {untouched[0]} still holds only its own input: the root must "
                "send the reduced tensor back to every other rank")
    if kind == "rd" and untouched and len(untouched) < p:
        q = 1 << (p.bit_length() - 1)
        return (f"rank {untouched[0]} still holds only its own input"
                + (f": with p = {p} (not a power of two) the {p - q} extra rank(s) fold their "
                   "tensor into a partner and must get the result back from it at the end"
                   if q != p else ": it never received (or never added) its partners' tensors"))
    if (c[first] < 0).any() or (c[first] > 2).any():
        return (f"rank {bad}, element {first}: the value {_num(ys[bad][first])} is no sum of "
                f"the ranks' element {first} - data was written at the wrong offset, or read "
                "from a buffer (torch.empty) that never received anything")
    if kind == "ring" and n >= p:
        # Missing all-gather: each rank is fully reduced in one chunk only, partial elsewhere.
        one_chunk = all(len(_runs(f)) == 1 and (n // p) <= f.sum() <= -(-n // p)
                        for f in full)
        partial = all(((cr >= 0) & (cr <= 1)).all() for cr in coeffs)
        if one_chunk and partial:
            a, b = _runs(full[bad])[0]
            other = next(i for i in range(n) if not full[bad][i])
            return (f"rank {bad} holds the full sum only in {_span(a, b, p, n)}; elsewhere "
                    f"partial sums (element {other}: {_ranks(c[other])}): the all-gather phase "
                    "is missing - after the reduce-scatter, pass the reduced chunks p-1 more "
                    "steps around the ring, COPYING each received chunk into place")
        tail = p * (n // p)
        if n % p and all(full[r][:tail].all() and (coeffs[r][tail:] == own[r]).all()
                         for r in range(p)):
            return (f"the last {n - tail} element(s) ({tail}-{n - 1} of {n}) are never "
                    f"reduced (rank {bad} element {first}: {_ranks(c[first])}): your chunks "
                    f"assume p divides n. Cut n = {n} into p = {p} chunks that cover every "
                    "element, e.g. chunk i = tensor[n*i//p : n*(i+1)//p]")
    if kind == "ring" and n < p and all((coeffs[r] == own[r]).all() for r in range(p)):
        return (f"no element was reduced with n = {n} < p = {p}: your chunks are all empty "
                "(n // p = 0); with chunk i = tensor[n*i//p : n*(i+1)//p] some chunks hold one "
                "element and the others are empty (send nothing for those)")
    b = first
    while b + 1 < n and not full[bad][b + 1] and (c[b + 1] == c[first]).all():
        b += 1
    text = (f"rank {bad}, {_span(first, b, p, n)}: holds {_ranks(c[first])} instead of the "
            f"sum of all {p} ranks")
    if (kind == "ring" and n >= p and all((cr >= 1).all() for cr in coeffs)
            and all(f.any() for f in full)):
        return text + (" - every rank's input is in every element, some of them twice, and "
                       "each rank holds one chunk exactly: the reduce-scatter is right, but "
                       "the all-gather ADDS each received chunk to the one in place. In the "
                       "all-gather, receive straight into the chunk (a copy, no addition)")
    if (c[first] > 1).any():
        return text + (" - an input counted twice: an off-by-one chunk index (in step s "
                       "of the reduce-scatter, add the incoming chunk to the one your left "
                       "neighbour sent, index (rank - s - 1) mod p when you send (rank - s) "
                       "mod p, and forward exactly that chunk next step)")
    if kind == "ring":
        return text + (" - a chunk index is off by one, or a step is missing: the "
                       "reduce-scatter runs p-1 steps, each adding the received chunk into "
                       "the chunk with the same index, and the all-gather p-1 more")
    if kind == "rd":
        return text + (" - recursive doubling exchanges the whole tensor with partner rank ^ "
                       "step for step = 1, 2, 4, ... < q (q the largest power of two <= p), "
                       "after the extra ranks folded their tensor into a partner; at the end "
                       "the partners send the result back")
    return text


# --- checks' building blocks -------------------------------------------------------------------

def _earlier_failure(fn, name: str, timing: bool) -> None:
    """Later checks of a function whose correctness failed say so at once instead of timing
    a wrong answer (or waiting for the same deadlock again)."""
    msg = earlier_failure(fn)
    if msg is None:
        return
    if timing:
        raise Fail(f"{name} is not correct yet - timing a wrong all-reduce tells nothing: fix "
                   f"what the check above says first ({shorten(msg, 160)})")
    if "timed out" in msg:
        raise Fail(f"not run again: it deadlocked in an earlier check ({shorten(msg, 400)})")


_STUCK = re.compile(r"rank (\d+) in (?:wait\(\) on i(send|recv) (?:to|from) rank (\d+)|"
                    r"dist\.(send|recv) (?:to|from) rank (\d+) \(blocking\))")


def _deadlock(message: str, kind: str, p: int) -> str:
    """Add what the stuck ranks' operations say about the cause to a timeout's message."""
    stuck = [(int(m[0]), m[1] or m[3], int(m[2] or m[4])) for m in _STUCK.findall(message)]
    if not stuck:
        return message
    if all(k == "send" for _, k, _ in stuck) and len(stuck) >= 2 and any(
            m[3] for m in _STUCK.findall(message)):
        return message + (" Here every stuck rank is inside a blocking dist.send, waiting "
                          "for its peer's recv, which the peer only posts after its own send "
                          "completes: a cycle. Post the receive with dist.irecv and the send "
                          "with dist.isend, then wait for both (or let even ranks send first "
                          "and odd ranks receive first).")
    if kind == "rd":
        for r, _, q in stuck:
            d = (q - r) % p
            if d and d & (d - 1) == 0 and q != r ^ d:
                return message + (f" Rank {r} waits on rank {q} = rank + {d}, but rank {q}'s "
                                  f"partner in that round is not {r}: recursive doubling "
                                  "pairs each rank with rank ^ step (XOR), which is "
                                  "symmetric - if a's partner is b, b's partner is a.")
    return message


def _run_cases(ctx, fn, name: str, kind: str, p: int, cases: list[dict]) -> list[list[dict]]:
    """Run the cases on a fresh p-rank cluster (plain Gloo); failures become sentences."""
    _earlier_failure(fn, name, timing=False)
    with ctx.cluster(nodes=p, timeout=START_TIMEOUT) as cl:
        cl.start()
        cl.timeout = RUN_TIMEOUT  # read by each run's wait (Cluster._collect)
        try:
            return ctx.run(cl, _cases_on_rank, fn, name, cases)
        except Fail as exc:
            msg = _deadlock(str(exc), kind, p) if "timed out" in str(exc) else str(exc)
            if "SIGABRT" in msg or "Connection reset by peer" in msg:
                msg += (" - a rank aborted inside Gloo: most often a receive whose buffer "
                        "has another number of elements than the message sent to it (the "
                        "peers disagree on a chunk's bounds or on which chunk travels)")
            remember_failure(fn, msg)
            raise Fail(msg) from None


def _verify(ctx, name: str, kind: str, plan: list[tuple[int, int, str, str]],
            rng=None) -> str:
    """Check fn on every (p, n, dtype, op) of the plan against the exact result; a wrong
    one is explained from a tagged run of the same p, n and op."""
    fn = ctx.learner(name)
    for p in sorted({c[0] for c in plan}):
        mine = [c for c in plan if c[0] == p]
        cases = [{"x": _tags(p, n) if rng is None else _random(rng, p, n, dt), "op": op,
                  "dtype": dt, "n": n} for _, n, dt, op in mine]
        if rng is None:
            for c in cases:
                c["x"] = c["x"].astype(c["dtype"])
        outs = _run_cases(ctx, fn, name, kind, p, [{"x": c["x"], "op": c["op"]} for c in cases])
        for k, case in enumerate(cases):
            ys = [outs[r][k]["y"] for r in range(p)]
            problem = _compare(case["x"], ys, case["op"])
            if problem is None:
                continue
            why = _explain(kind, p, case["n"], case["op"], ys) if rng is None else None
            if why is None and rng is None:
                why = "compare your chunk bounds and steps with the markdown above"
            if why is None:  # random data: explain from a tagged run of the same shape
                tagged = _run_cases(ctx, fn, name, kind, p,
                                    [{"x": _tags(p, case["n"]), "op": case["op"]}])
                why = _explain(kind, p, case["n"], case["op"],
                               [tagged[r][0]["y"] for r in range(p)])
                if why is None:
                    why = (f"with float64 inputs the same call is right, with {case['dtype']} "
                           f"wrong: do your buffers take the tensor's dtype "
                           "(torch.empty_like(chunk), not torch.empty(k))?")
            if case["op"] == "avg" and not any(
                    k in why for k in ("the SUM, not the average", "divided by p^2")):
                # Is only the division wrong? The same call with op='sum' tells.
                summed = _run_cases(ctx, fn, name, kind, p,
                                    [{"x": case["x"], "op": "sum"}])
                if _compare(case["x"], [summed[r][0]["y"] for r in range(p)], "sum") is None:
                    why = (f"with op='sum' the same call is right, so only the division is "
                           f"wrong: divide the final sum by p = {p} once, at the end (not in "
                           "every step, or per chunk sent)")
            msg = (f"{name}(op={case['op']!r}) on p = {p} ranks, n = {case['n']} "
                   f"{case['dtype']} elements: {problem}; {why}")
            remember_failure(fn, msg)
            raise Fail(msg)
    worlds = sorted({c[0] for c in plan})
    return f"exact on {len(plan)} cases, p = {', '.join(map(str, worlds))}"


def _compare(x: np.ndarray, ys: list[np.ndarray], op: str) -> str | None:
    p = x.shape[0]
    want = x.astype(np.float64).sum(axis=0) if x.dtype.kind == "f" else x.sum(axis=0)
    if op == "avg":
        want = want / p
    for r, y in enumerate(ys):
        if x.dtype.kind in "iu":
            bad = np.flatnonzero(y != want)
        else:
            tol = 1e-5 if x.dtype == np.float32 else 1e-10
            scale = np.abs(x.astype(np.float64)).sum(axis=0)
            bad = np.flatnonzero(np.abs(y - want) > tol * (1 + scale))
        if bad.size:
            i = bad[0]
            return (f"rank {r} is wrong at {bad.size} of {y.size} elements (element {i}: "
                    f"{_num(y[i])}, expected {_num(want[i])})")
    return None


def _structure_ring(outs: list[dict], p: int, n: int, name: str) -> None:
    """Each rank sends 2(p-1) chunks of about n/p elements, all to one neighbour."""
    for r, o in enumerate(outs):
        sends = [(q, k) for q, k in o["sends"] if k]
        total = sum(k for _, k in sends)
        peers = sorted({q for q, _ in sends})
        if not sends:
            raise Fail(f"rank {r} sent nothing: a ring all-reduce sends to a neighbour")
        if len(peers) > 1 or peers[0] not in ((r + 1) % p, (r - 1) % p):
            raise Fail(f"rank {r} sent to ranks {peers}: in a ring every rank sends only to "
                       f"its neighbour (rank {(r + 1) % p})")
        lo, hi = 2 * (p - 1) * (n // p), 2 * (p - 1) * -(-n // p)
        if not lo <= total <= hi:
            ratio = total / n
            raise Fail(f"rank {r} sent {total} elements in {len(sends)} messages = {ratio:.2f}"
                       f" x the tensor; a ring all-reduce sends each rank 2(p-1)/p = "
                       f"{2 * (p - 1) / p:.2f} x it, in 2(p-1) = {2 * (p - 1)} chunks of "
                       f"about n/p = {n / p:g} elements"
                       + (": cut the tensor into p chunks and pass chunks, not the whole "
                          "tensor" if ratio > 2 * (p - 1) / p else
                          ": that is the reduce-scatter's p-1 chunks only - the all-gather is "
                          "missing" if total <= (p - 1) * -(-n // p) else ""))


def _structure_naive(outs: list[dict], p: int, n: int) -> None:
    """Through rank 0: every other rank sends its n elements to rank 0 only and receives n
    back from it; rank 0 receives p-1 tensors and sends one to each other rank."""
    for r, o in enumerate(outs):
        sends = [(q, k) for q, k in o["sends"] if k]
        recvs = [(q, k) for q, k in o["recvs"] if k]
        if r == 0:
            to = sorted(q for q, _ in sends)
            if to != list(range(1, p)) or any(k != n for _, k in sends):
                raise Fail(f"rank 0 sent {len(sends)} messages to ranks {to} (elements "
                           f"{[k for _, k in sends]}): the root sends the reduced tensor "
                           f"({n} elements) once to each other rank, 1..{p - 1}")
            if len(recvs) != p - 1 or any(k != n for _, k in recvs):
                raise Fail(f"rank 0 received {len(recvs)} messages (elements "
                           f"{[k for _, k in recvs]}): the root receives each other rank's "
                           f"tensor once, {p - 1} of {n} elements")
            continue
        peers = sorted({q for q, _ in sends} | {q for q, _ in recvs if q is not None})
        if peers != [0] or len(sends) != 1 or len(recvs) != 1:
            raise Fail(f"rank {r} sent {len(sends)} message(s) to ranks "
                       f"{sorted({q for q, _ in sends})} and received {len(recvs)}: in the "
                       "naive all-reduce only the root (rank 0) adds; every other rank sends "
                       "its tensor to rank 0 once and receives the sum from it once (an "
                       "all-to-all where every rank adds up every tensor sends (p-1) x the "
                       "data from every rank, and is not this step)")


def _structure_rd(outs: list[dict], p: int, n: int) -> None:
    """p a power of two: each rank sends lg p whole tensors, to rank ^ 1, rank ^ 2, ..."""
    lg = p.bit_length() - 1
    for r, o in enumerate(outs):
        sends = [(q, k) for q, k in o["sends"] if k]
        want = [r ^ (1 << k) for k in range(lg)]
        peers = [q for q, _ in sends]
        if sorted(peers) != sorted(want) or any(k != n for _, k in sends):
            raise Fail(f"rank {r} sent {len(sends)} messages to ranks {peers} (elements "
                       f"{[k for _, k in sends]}); recursive doubling on p = {p} sends lg p = "
                       f"{lg} messages of the whole tensor ({n} elements), to partners rank "
                       f"^ step = {want} (step = 1, 2, 4, ...)")


def _alpha_beta(nic: str) -> tuple[float, float]:
    from ..experiments.allreduce_and_topology import alpha_beta

    return alpha_beta(nic)


def _measure(ctx, runs: list[tuple], p: int, nic: str,
             predicted: list[float] | None = None) -> list[float]:
    """Median emulated time (s) of each (fn, name, nbytes) on one p-rank cluster, from the
    last rank's entry (`clusterlab.timing.durations`), under `_dilation(p)`.

    The emulator never delivers early, so a run slower than its prediction is either the
    answer's own cost or this machine's (other tenants, 2 cores for p ranks). Those runs are
    measured again at twice the dilation: the machine's share halves, the answer's stays."""
    from ..timing import durations

    for fn, name, _ in runs:
        _earlier_failure(fn, name, timing=True)

    def medians(todo: list[tuple], dilation: float) -> list[float]:
        out = []
        with ctx.cluster(nodes=p, nic=nic, dilation=dilation, timeout=START_TIMEOUT) as cl:
            cl.start()
            cl.timeout = 20.0 * dilation / _dilation(p)  # a few dilated seconds per run
            for fn, name, nbytes in todo:
                spans = ctx.run(cl, _timed_on_rank, fn, name, nbytes // 4, REPEATS)
                out.append(statistics.median(durations(spans, since="last").tolist()))
        return out

    out = medians(runs, _dilation(p))
    slow = [i for i, t in enumerate(out)
            if predicted is not None and t > (1 + TOLERANCE) * predicted[i]]
    if slow:
        for i, t in zip(slow, medians([runs[i] for i in slow], 2 * _dilation(p))):
            out[i] = t
    return out


def time_on(cl, fn, nbytes: int, repeats: int = REPEATS) -> list[float]:
    """Emulated seconds of `repeats` calls of the all-reduce `fn` on a running Cluster `cl`
    (float32 ones of `nbytes` bytes, each call after a barrier, timed from the last rank's
    entry to the last exit, after one untimed warm-up call), with the same rules as the
    checks: torch.distributed's collectives raise, and a wrong sum is an error."""
    from ..cluster import RankError
    from ..timing import durations

    name = getattr(fn, "__name__", "fn")
    try:
        spans = cl.run(_timed_on_rank, fn, name, nbytes // 4, repeats)
    except RankError as exc:
        if exc.kind == "NotImplementedError":
            raise NotImplementedError(f"{name} is not written yet: fill in its TODO cell, "
                                      "run it, then run this cell again") from None
        raise
    return durations(spans, since="last").tolist()


def measure(runs: list[tuple], predicted: list[float], *, nodes: int = 4, nic: str = NIC,
            dilation: float = 4.0, repeats: int = REPEATS) -> list[dict]:
    """Time each (fn, nbytes) of `runs` on a fresh cluster (`time_on`); a run whose fastest
    repetition is more than 15 % above its prediction is measured again, once, on a cluster
    dilated twice as much (where this machine's own cost showed, it halves; an answer's own
    cost does not). Each result: times (s), median, fastest, and the dilation it ran at."""
    from ..cluster import Cluster

    def batch(todo: list[tuple], k: float) -> list[dict]:
        with Cluster(nodes=nodes, nic=nic, dilation=k, timeout=60) as cl:
            out = []
            for fn, nbytes in todo:
                t = time_on(cl, fn, nbytes, repeats)
                out.append({"times": t, "median": statistics.median(t), "fastest": min(t),
                            "dilation": k})
            return out

    out = batch(runs, dilation)
    slow = [i for i, r in enumerate(out) if r["fastest"] > (1 + TOLERANCE) * predicted[i]]
    if slow:
        for i, r in zip(slow, batch([runs[i] for i in slow], 2 * dilation)):
            out[i] = r
    return out


def _dilation(p: int) -> float:
    """Enough that this machine's own cost (~1 ms per p2p step with 4 ranks on 2 cores,
    more with more ranks) stays a few % of a round of the emulated network."""
    return 3.0 if p <= 4 else 4.0


def _within(name: str, what: str, measured: float, predicted: float, extra: str = "") -> str:
    ratio = measured / predicted
    line = (f"{what}: measured {measured * 1e3:.1f} ms (median of {REPEATS}), alpha-beta "
            f"predicts {predicted * 1e3:.1f} ms, ratio {ratio:.2f}")
    if abs(ratio - 1) > TOLERANCE:
        raise Fail(line + f", more than {TOLERANCE:.0%} off. " + extra)
    return line


def _ring_timing(ctx, p: int, nbytes: int, nic: str) -> str:
    fn = ctx.learner("ring_allreduce")
    a, b = _alpha_beta(nic)
    predicted = models.ring_allreduce(p, nbytes, a, b)
    (measured,) = _measure(ctx, [(fn, "ring_allreduce", nbytes)], p, nic, [predicted])
    serial = 2 * (p - 1) * (2 * a + 2 * nbytes / p * b)
    extra = "Each of the 2(p-1) steps should cost one alpha + (n/p) beta, all ranks at once."
    whole = next((w for w in (p - 1, 2 * (p - 1))
                  if abs(measured / (w * (a + nbytes * b)) - 1) < TOLERANCE), None)
    if whole:
        extra += (f" It took about {whole} (alpha + n beta): every step moves the whole "
                  "tensor, not an n/p chunk.")
    elif abs(measured / serial - 1) < TOLERANCE:
        extra += (" It took about twice the prediction: the send and the receive of a step "
                  "do not overlap (post both, then wait for both).")
    return _within("ring_allreduce", f"ring on {p} ranks, {nbytes / MiB:.2f} MiB, '{nic}'",
                   measured, predicted, extra)


# --- the exercises -----------------------------------------------------------------------------

NAIVE = LAB.exercise(
    "ring_naive", needs=("naive_allreduce",),
    title="Step 1, the naive all-reduce: everyone sends to rank 0, rank 0 sends back",
    hints=(
        "The idea: one rank (rank 0) is the meeting point. Everyone else hands it their tensor "
        "and waits; it adds them all and hands the sum back to each. Count the messages the "
        "root receives and sends: that count is why this step is slow at scale.",
        "On rank 0: post one dist.irecv per other rank into its own buffer "
        "(torch.empty_like(tensor)), wait for all, add them into tensor; then dist.isend the "
        "result to every other rank and wait. On the others: send tensor to 0, then receive "
        "the result into tensor.",
        "op='avg': divide by p once, after the sum (on rank 0 before sending, or everywhere "
        "after receiving - not both).",
    ))


@NAIVE.check("sum and avg on 2 and 4 ranks, through rank 0, point-to-point only", points=2)
def _naive_small(ctx):
    plan = [(p, n, "float64", op) for p in (2, 4) for n, op in ((7, "sum"), (5, "avg"))]
    detail = _verify(ctx, "naive_allreduce", "naive", plan)
    fn = ctx.learner("naive_allreduce")
    p, n = 4, 12
    outs = _run_cases(ctx, fn, "naive_allreduce", "naive", p, [{"x": _tags(p, n), "op": "sum"}])
    _structure_naive([o[0] for o in outs], p, n)
    return detail + "; rank 0 received p-1 tensors and sent the sum back to each"


@NAIVE.check("3 to 8 ranks, random float32/float64/int64 data", points=1, hidden=True)
def _naive_hidden(ctx):
    worlds = sorted(ctx.rng.choice([3, 5, 6, 7, 8], size=2, replace=False).tolist())
    plan = [(int(p), int(ctx.rng.integers(1, 40)), dt, op) for p in worlds
            for dt, op in (("float32", "avg"), ("int64", "sum"), ("float64", "sum"))]
    return _verify(ctx, "naive_allreduce", "naive", plan, rng=ctx.rng)


RING = LAB.exercise(
    "ring_allreduce", needs=("ring_allreduce",),
    title="Step 2, the ring: reduce-scatter, then all-gather",
    hints=(
        "The idea: two phases of p-1 steps, each rank talking only to its two neighbours. "
        "First, chunks travel around the ring and are ADDED on the way, until each rank owns "
        "one chunk that holds the full sum; then the owned chunks travel around once more and "
        "are COPIED, until every rank holds every chunk.",
        "Cut the n elements into p chunks that cover everything even when p does not divide "
        "n: chunk i = tensor[n*i//p : n*(i+1)//p] (some may be empty when n < p).",
        "Reduce-scatter, steps s = 0..p-2: isend chunk (rank - s) % p to the right neighbour, "
        "irecv into a scratch buffer shaped like chunk (rank - s - 1) % p from the left one, "
        "wait for both, add the buffer into that chunk. Afterwards this rank owns the full sum "
        "of chunk (rank + 1) % p.",
        "All-gather, steps s = 0..p-2: isend chunk (rank + 1 - s) % p to the right, irecv "
        "directly INTO chunk (rank - s) % p from the left (copy, do not add), wait for both.",
        "Blocking dist.send on every rank at once deadlocks (each waits for a recv its peer "
        "has not posted yet). Use isend + irecv, then wait() on both.",
    ))


@RING.check("sum on 2, 3 and 4 ranks, n not divisible by p", points=2)
def _ring_sum(ctx):
    plan = [(2, 9, "float64", "sum"), (3, 10, "float64", "sum"), (4, 14, "float64", "sum")]
    return _verify(ctx, "ring_allreduce", "ring", plan)


@RING.check("avg on 3 ranks", points=1)
def _ring_avg(ctx):
    return _verify(ctx, "ring_allreduce", "ring", [(3, 11, "float64", "avg")])


@RING.check("point-to-point only: 2(p-1) chunks of n/p to one neighbour", points=1)
def _ring_bytes(ctx):
    fn = ctx.learner("ring_allreduce")
    p, n = 4, 24
    outs = _run_cases(ctx, fn, "ring_allreduce", "ring", p,
                      [{"x": _tags(p, n), "op": "sum"}])
    _structure_ring([o[0] for o in outs], p, n, "ring_allreduce")
    return f"each rank sent {2 * (p - 1)} chunks of {n // p} elements to its neighbour"


@RING.check("every p from 2 to 8, n < p and uneven n, float32/float64/int32/int64",
            points=3, hidden=True)
def _ring_hidden(ctx):
    plan = []
    for p in range(2, 9):
        n_small = int(ctx.rng.integers(1, p))  # fewer elements than ranks
        n_odd = int(p * ctx.rng.integers(2, 6) + ctx.rng.integers(1, p))
        plan += [(p, n_odd, "float32", "avg"),  # the informative cases first, n < p last
                 (p, n_odd + 1, str(ctx.rng.choice(["int32", "int64"])), "sum"),
                 (p, n_small, "float64", "sum")]
    return _verify(ctx, "ring_allreduce", "ring", plan, rng=ctx.rng)


TIMING = LAB.exercise(
    "ring_timing", needs=("ring_time_model", "ring_allreduce"),
    title="The ring's alpha-beta cost, predicted and measured",
    hints=(
        "2(p-1) steps; in each one every rank sends one chunk of n/p bytes to its neighbour, "
        "all at the same time. One step costs alpha + (n/p) beta.",
        "If the measurement is far above the prediction: does each step send a chunk (not the "
        "whole tensor), and does it post the send and the receive before waiting for either?",
    ))


def _formula_cases(rng=None):
    cases = [(4, 2 * MiB, 2e-3, 8e-9), (8, 64 * 1024, 5e-4, 1e-9), (3, 1000, 1e-3, 1e-8)]
    if rng is not None:
        cases += [(int(rng.integers(2, 64)), float(rng.integers(1, 1 << 26)),
                   float(rng.uniform(1e-6, 1e-2)), float(rng.uniform(1e-11, 1e-7)))
                  for _ in range(5)]
    return cases


@TIMING.check("ring_time_model(p, nbytes, alpha, beta) is 2(p-1)(alpha + nbytes/p beta)",
              points=1)
def _ring_formula(ctx):
    fn = ctx.learner("ring_time_model")
    for p, n, a, b in _formula_cases(ctx.rng):
        got = ctx.call(fn, p, n, a, b)
        want = models.ring_allreduce(p, n, a, b)
        if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-6):
            wrong = {"the latency term counts p-1 steps, not 2(p-1)":
                     (p - 1) * a + 2 * (p - 1) / p * n * b,
                     "the bandwidth term counts p-1 steps, not 2(p-1)":
                     2 * (p - 1) * a + (p - 1) / p * n * b,
                     "each step moves the whole tensor (n beta), not a chunk of n/p":
                     2 * (p - 1) * (a + n * b),
                     "it counts 2p steps, not 2(p-1)": 2 * p * (a + n / p * b)}
            why = next((w for w, v in wrong.items() if isinstance(got, (int, float))
                        and math.isclose(got, v, rel_tol=1e-6)), "")
            raise Fail(f"ring_time_model({p}, {n:g}, {a:g}, {b:g}) = {_shown(got)}, expected "
                       f"{want:.6g} s" + (f": {why}" if why else ""))
    return "equals models.ring_allreduce"


@TIMING.check(f"your ring on 4 ranks, 2 MiB, '{NIC}': within 15% of alpha-beta", points=2)
def _ring_time_visible(ctx):
    ctx.learner("ring_time_model")
    return _ring_timing(ctx, 4, 2 * MiB, NIC)


@TIMING.check("other p and networks: within 15% of alpha-beta", points=2, hidden=True)
def _ring_time_hidden(ctx):
    p = int(ctx.rng.choice([3, 5, 6]))
    nic = str(ctx.rng.choice(["delay 1ms rate 1gbit", "delay 2ms rate 2gbit",
                              "delay 3ms rate 500mbit"]))
    nbytes = int(ctx.rng.choice([1, 2])) * MiB // p * p
    return _ring_timing(ctx, p, nbytes, nic)


RD = LAB.exercise(
    "rd_allreduce", needs=("rd_allreduce",),
    title="Step 3, recursive doubling: lg p rounds, any p",
    hints=(
        "The idea: in round k every rank swaps its whole tensor with a partner and adds, and "
        "the partners double the span they cover each round, so lg p rounds reach everyone. The"
        " partner relation must be symmetric; XOR with a power of two is.",
        "p a power of two: for step = 1, 2, 4, ... < p, swap the WHOLE tensor with partner = "
        "rank ^ step (isend + irecv into a buffer, wait both) and add the buffer.",
        "The partner must be symmetric: with rank + step, rank 1's partner would be 2 while "
        "rank 2's is 3, and rank 1 waits forever. XOR pairs ranks: 1 ^ 1 = 0 and 0 ^ 1 = 1.",
        "Other p: let q be the largest power of two <= p. Each rank r >= q first sends its "
        "tensor to r - q (which adds it), waits; ranks < q run recursive doubling among "
        "themselves; then rank r - q sends the result back to r.",
    ))


@RD.check("sum and avg on 2 and 4 ranks", points=2)
def _rd_pow2(ctx):
    plan = [(2, 5, "float64", "sum"), (4, 6, "float64", "sum"), (4, 3, "float64", "avg")]
    return _verify(ctx, "rd_allreduce", "rd", plan)


@RD.check("3, 5 and 6 ranks (not powers of two)", points=1)
def _rd_other(ctx):
    plan = [(3, 4, "float64", "sum"), (5, 3, "float64", "avg"), (6, 7, "float64", "sum")]
    try:
        return _verify(ctx, "rd_allreduce", "rd", plan)
    except Fail as exc:
        if "raised" in str(exc):  # e.g. a ValueError for p not a power of two
            raise Fail(f"{exc} - a real recursive doubling handles any p: fold the p - q extra "
                       "ranks (q the largest power of two <= p) into partners first, and send "
                       "them the result at the end") from None
        raise


@RD.check("point-to-point only: lg p whole-tensor swaps with rank ^ step", points=1)
def _rd_structure(ctx):
    fn = ctx.learner("rd_allreduce")
    p, n = 4, 6
    outs = _run_cases(ctx, fn, "rd_allreduce", "rd", p, [{"x": _tags(p, n), "op": "sum"}])
    _structure_rd([o[0] for o in outs], p, n)
    return "each rank swapped its whole tensor with rank ^ 1, then rank ^ 2"


@RD.check(f"4 ranks, 1 MiB, '{NIC}': within 15% of lg p (alpha + n beta)", points=1)
def _rd_time(ctx):
    fn = ctx.learner("rd_allreduce")
    p, nbytes = 4, MiB
    a, b = _alpha_beta(NIC)
    predicted = models.recursive_doubling_allreduce(p, nbytes, a, b)
    (measured,) = _measure(ctx, [(fn, "rd_allreduce", nbytes)], p, NIC, [predicted])
    return _within("rd_allreduce", f"recursive doubling on {p} ranks, 1 MiB", measured,
                   predicted, "Each of the lg p rounds should cost alpha + n beta: post the "
                   "send and the receive of a round before waiting for either.")


@RD.check("every p from 2 to 8, n < p and others, float32/float64/int64", points=2,
          hidden=True)
def _rd_hidden(ctx):
    plan = []
    for p in range(2, 9):
        plan += [(p, int(ctx.rng.integers(p, 4 * p)), "float32", "avg"),
                 (p, int(ctx.rng.integers(1, 30)), "float64", "sum"),
                 (p, int(ctx.rng.integers(1, p + 1)), "int64", "sum")]
    return _verify(ctx, "rd_allreduce", "rd", plan, rng=ctx.rng)


CROSS = LAB.exercise(
    "ring_crossover", needs=("predicted_crossover", "measured_crossover", "ring_allreduce",
                             "rd_allreduce"),
    title="Step 4, the crossover: where the ring overtakes recursive doubling",
    hints=(
        "The idea: both costs are straight lines in the message size n: the ring pays more "
        "latency (more steps), recursive doubling more bandwidth (whole tensors). The crossover"
        " is where the lines meet; measured, it is where ring - rd turns from positive to "
        "negative.",
        "Predicted: the ring costs 2(p-1) alpha + 2((p-1)/p) n beta, recursive doubling "
        "L (alpha + n beta) with L = lg p for p a power of two (models.recursive_doubling_"
        "allreduce has the fold for other p: L = lg q + 2). They are equal where "
        "n = (2(p-1) - L) alpha / ((L - 2(p-1)/p) beta); if L <= 2(p-1)/p the ring never wins.",
        "Measured: both times are straight lines in n, so between the two sizes where the "
        "sign of ring - rd flips from + to -, interpolate the difference linearly in n.",
    ))


def _crossover(p: int, alpha: float, beta: float) -> float:
    from ._answers import crossover

    return crossover(p, alpha, beta)


@CROSS.check("predicted_crossover(p, alpha, beta) for p = 4, 8 and 2", points=1)
def _cross_predicted(ctx):
    return _crossover_cases(ctx, [(4, 2e-3, 8e-9), (8, 1e-3, 1e-9), (2, 1e-3, 1e-9)])


@CROSS.check("predicted_crossover for other p (3, 5, 6, 7, 16, ...) and networks", points=1,
             hidden=True)
def _cross_predicted_hidden(ctx):
    cases = [(p, float(ctx.rng.uniform(1e-5, 1e-2)), float(ctx.rng.uniform(1e-11, 1e-7)))
             for p in (3, 5, 6, 7, 16, int(ctx.rng.integers(9, 64)))]
    return _crossover_cases(ctx, cases)


def _lg_crossover(p: int, a: float, b: float) -> float:
    """The crossover with log2(p) rounds taken literally (a non-integer for p = 3, 5, ...)."""
    lg = math.log2(p)
    return (2 * (p - 1) - lg) * a / ((lg - 2 * (p - 1) / p) * b) if lg > 2 * (p - 1) / p \
        else math.inf


def _crossover_cases(ctx, cases) -> str:
    fn = ctx.learner("predicted_crossover")
    for p, a, b in cases:
        got = ctx.call(fn, p, a, b)
        want = _crossover(p, a, b)
        ok = (got is not None and isinstance(got, (int, float)) and
              (math.isinf(want) and math.isinf(got) or math.isclose(got, want, rel_tol=1e-6)))
        if ok:
            continue
        lg = p.bit_length() - 1
        naive = ((2 * (p - 1) - lg) * a / ((lg - 2 * (p - 1) / p) * b)
                 if lg > 2 * (p - 1) / p else math.inf)
        why = ""
        if math.isinf(want):
            why = (f": on p = {p} recursive doubling's bandwidth term is not larger than the "
                   "ring's, so the ring never overtakes it - return math.inf")
        elif isinstance(got, (int, float)) and any(
                math.isclose(got, v, rel_tol=1e-6) for v in (naive, _lg_crossover(p, a, b))):
            why = (f": that is lg p rounds, but p = {p} is not a power of two - recursive "
                   "doubling then folds the extra ranks in and out, two more rounds of "
                   "alpha + n beta (use models.recursive_doubling_allreduce)")
        raise Fail(f"predicted_crossover({p}, {a:g}, {b:g}) = {_shown(got)}, expected {want:.6g} "
                   f"bytes{why}")
    return f"matches the alpha-beta crossover on {len(cases)} (p, alpha, beta)"


@CROSS.check("measured_crossover interpolates where ring - rd changes sign", points=1)
def _cross_measured(ctx):
    fn = ctx.learner("measured_crossover")
    sizes = [1e4, 1e5, 1e6, 1e7]
    cases = [  # (ring times, rd times, expected)
        ([3.0, 4.0, 13.0, 103.0], [1.0, 3.0, 21.0, 201.0], 2e5),  # + + - -: 1 -> -8
        # - + - -: the ring is faster at 1e4 (noise, or a tiny message), slower at 1e5, then
        # faster again: the crossover is where it turns from slower to faster, 3.25e5
        ([1.0, 5.0, 5.0, 5.0], [2.0, 3.0, 11.0, 101.0], 3.25e5),
        ([3.0, 3.0, 3.0, 3.0], [1.0, 1.0, 1.0, 1.0], None),
        ([1.0, 1.0, 1.0, 1.0], [3.0, 3.0, 3.0, 3.0], None),
    ]
    # Lines that cross at 4e5 (between 1e5 and 1e6) and at 4.6e6.
    for x0 in (4e5, 4.6e6):
        ring = [2.0 + 1e-6 * s for s in sizes]
        rd = [2.0 - 1e-6 * x0 + 2e-6 * s for s in sizes]
        cases.append((ring, rd, x0))
    for ring, rd, want in cases:
        got = ctx.call(fn, list(sizes), list(ring), list(rd))
        if want is None and got is None:
            continue
        if want is not None and isinstance(got, (int, float)) and math.isclose(
                got, want, rel_tol=1e-6):
            continue
        raise Fail(f"measured_crossover(sizes={sizes}, ring_times={ring}, rd_times={rd}) = "
                   f"{_shown(got)}, expected {_shown(want)}: "
                   + ("return None when the ring is never slower-then-faster within the sizes"
                      if want is None else
                      "find the first i where ring - rd > 0 at sizes[i] and <= 0 at "
                      "sizes[i+1], and interpolate the difference linearly in size"))
    return "interpolates the sign change; None when the sizes do not bracket one"


@CROSS.check(f"measured: on 4 ranks, '{NIC}', rd wins at n*/3 and the ring at 3 n*",
             points=2)
def _cross_real(ctx):
    ctx.learner("predicted_crossover")
    ring, rd = ctx.learner("ring_allreduce"), ctx.learner("rd_allreduce")
    p = 4
    a, b = _alpha_beta(NIC)
    star = _crossover(p, a, b)
    sizes = [int(star / 3) // 16 * 16, int(star * 3) // 16 * 16]
    model = [f(p, n, a, b) for n in sizes
             for f in (models.ring_allreduce, models.recursive_doubling_allreduce)]
    times = _measure(ctx, [(fn, name, n) for n in sizes for fn, name in
                           ((ring, "ring_allreduce"), (rd, "rd_allreduce"))], p, NIC, model)
    out = []
    for n, t_ring, t_rd in zip(sizes, times[::2], times[1::2]):
        want_ring = n > star
        if (t_ring < t_rd) != want_ring:
            gap = models.ring_allreduce(p, n, a, b) / models.recursive_doubling_allreduce(
                p, n, a, b) - 1
            raise Fail(f"at {n / MiB:.2f} MiB ({'above' if want_ring else 'below'} the "
                       f"predicted crossover {star / MiB:.2f} MiB) your ring took "
                       f"{t_ring * 1e3:.1f} ms and recursive doubling {t_rd * 1e3:.1f} ms: "
                       f"{'the ring' if want_ring else 'recursive doubling'} should win by "
                       f"{abs(gap):.0%} - check that each runs in its alpha-beta time "
                       "(exercises ring_timing and rd_allreduce)")
        out.append(f"{n / MiB:.2f} MiB: ring {t_ring * 1e3:.1f} ms, rd {t_rd * 1e3:.1f} ms")
    return "; ".join(out)
