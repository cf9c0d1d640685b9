"""Lab 06: make lock-free updates safe, and measure the price.

It follows notebook 06b (`clusterlab.experiments.races`) and, like it, runs its workers as OS
processes forked from this one (multiprocessing, "fork") that share ONE parameter vector,
placed in shared memory by torch's `share_memory_()`. They are not `clusterlab.Cluster`
ranks: ranks share nothing but messages, and this lab is about writers that meet in memory.

The learner writes one update per step of the staircase, always update(p, idx, step):

    p.x     the shared parameters: a float64 numpy array every worker sees
    p.seq   a shared version counter, p.seq[0] (int64), for the seqlock
    p.lock  a lock shared by every worker (`with p.lock:`, or acquire() / release())
    idx     the coordinates this update touches (an int array)
    step    step(xv) -> the change to add to x[idx], computed from the values xv read:
            the gradient step. Here it does some arithmetic on xv (the "gradient") and
            returns ones, so the parameters count the updates that landed.

Measured, not assumed: a lost update is an increment missing from x (expected - sum(x));
a torn read is a step() called with a dense vector whose coordinates disagree (every
complete update adds 1 to all of them, so a consistent snapshot has one value). Nothing
outlives a run: workers die with this process (PR_SET_PDEATHSIG), are killed when a run
ends, fails or stalls, and torch's shared segments have no name (file-descriptor strategy),
so nothing is left in /dev/shm. A run in which no update finishes for `stall` seconds stops
with a sentence naming each worker, what it holds and what it waits for.

Steps: race_hogwild (no lock: count the lost updates), race_lock (one lock around the
read-modify-write), race_seqlock (readers retry on a version counter, writers add their
delta under a short lock), race_price (the throughput ratio safe / unsafe, measured in
interleaved pairs, reported as a median with its samples).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import time
import traceback
from multiprocessing.connection import wait as wait_any

import numpy as np
import torch

from ..cluster import die_with_parent, stop_processes
from .core import Fail, Lab, NotDone, learner_line, shorten

LAB = Lab("06_safe_lock_free", "Races: make lock-free updates safe, and measure the price",
          follows="06b_lock_free_updates")

DENSE_DIM = 4096  # every update touches all of them: 32 KiB, read in ~3 us, written in ~4 us
SPARSE_DIM, SPARSE_NNZ = 10_000, 4  # notebook 06b's sparse problem
WORK = 4  # rounds of arithmetic in step(): ~20 us on 4096 coordinates, the "gradient"
STALL_S = 4.0  # no update finished for this long: a deadlock, reported by name

# Columns of the shared statistics table, one row per worker (+ one for this process).
DONE, STEPS, TORN, LOCKED_STEPS, OVERLAPS, ACQ, REL, WAITING, IN_STEP = range(9)
HOLDER = 9  # in the last row: which worker holds p.lock (-1: nobody)
READY = 12  # a worker is at the starting line
_COLS = 16  # 128 bytes a row: two cache lines, so workers' counters do not share one


# --- what a worker sees ----------------------------------------------------------------------


class SharedLock:
    """A multiprocessing.Lock that also counts who acquires and releases it (for the checks'
    messages). Use it as `with p.lock:` or with acquire()/release()."""

    def __init__(self, lock, stats: np.ndarray) -> None:
        self._lock, self._st = lock, stats
        self._row = stats.shape[0] - 1  # this process's row; a worker binds its own
        self.held = False  # held by THIS process (each process has its own copy)

    def _bind(self, row: int) -> None:
        self._row, self.held = row, False

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        st = self._st
        st[self._row, WAITING] = 1
        ok = self._lock.acquire(block, timeout)
        st[self._row, WAITING] = 0
        if ok:
            st[self._row, ACQ] += 1
            st[-1, HOLDER] = self._row
            self.held = True
        return ok

    def release(self) -> None:
        if self.held:
            self._st[-1, HOLDER] = -1
            self._st[self._row, REL] += 1
        self.held = False
        self._lock.release()

    def __enter__(self) -> SharedLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return "<p.lock: one lock shared by every worker>"


class Shared:
    """What every worker's update receives as `p`: p.x, p.seq, p.lock (see the module doc)."""

    def __init__(self, x: np.ndarray, seq: np.ndarray, lock: SharedLock) -> None:
        self.x, self.seq, self.lock = x, seq, lock

    def __repr__(self) -> str:
        return f"Shared(x: {self.x.size} float64, seq[0]={int(self.seq[0])}, lock)"


def _shared(shape, dtype) -> np.ndarray:
    """A zeroed numpy view of memory that forked children share (torch's share_memory_)."""
    t = torch.zeros(shape, dtype=dtype).share_memory_()
    return t.numpy()


def _start_worker(parent: int) -> None:
    die_with_parent()  # the launcher's PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before we could ask to die with it
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt stops


def _make_step(w: int, st: np.ndarray, lock: SharedLock, dense: bool, work: int,
               record: list | None = None, fn=None):
    """The step(xv) a worker's update calls: it notes what it was given, does `work` rounds
    of arithmetic (the gradient), and returns the change to add (ones unless `fn`)."""

    def step(xv):
        row = st[w]
        row[IN_STEP] = 1
        row[STEPS] += 1
        xv = np.array(xv, dtype=np.float64)  # a copy: what the update read, frozen
        if dense and xv.size and xv.min() != xv.max():
            row[TORN] += 1
        if lock.held:
            row[LOCKED_STEPS] += 1
        g = xv
        for _ in range(work):
            g = np.sqrt(g * g + 1.0)
        if st[:-1, IN_STEP].sum() > 1:  # another worker is inside step() right now
            row[OVERLAPS] += 1
        row[IN_STEP] = 0
        if record is not None:
            record.append(xv)
        if fn is not None:
            return fn(xv)
        return np.ones_like(g)

    return step


# --- running workers, and stopping them whatever their code does -----------------------------


class WorkerError(RuntimeError):
    """A worker's update raised: kind, message and the worker's traceback."""

    def __init__(self, worker: int, kind: str, message: str, tb: str) -> None:
        super().__init__(f"worker {worker} raised {kind}: {message}")
        self.worker, self.kind, self.message, self.tb = worker, kind, message, tb


class Stalled(TimeoutError):
    """No update finished for `stall` seconds; the message names each worker's state."""


def _child(w, body, args, conn, parent):
    """Every worker's entry point: run body, report to the parent, never run its atexit."""
    _start_worker(parent)
    try:
        conn.send(("ok", body(w, *args)))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
        with contextlib.suppress(Exception):
            conn.send(("error", (type(exc).__name__, str(exc), traceback.format_exc())))
    finally:
        os._exit(0)


def _stall_sentence(st: np.ndarray, seq: np.ndarray, updates: int, stall: float) -> str:
    n = st.shape[0] - 1
    progress = ", ".join(f"{w}: {int(st[w, DONE])}/{updates}" for w in range(n))
    parts = [f"no update finished for {stall:g} s (updates done by worker {progress})."]
    holder = int(st[-1, HOLDER])
    waiting = [w for w in range(n) if st[w, WAITING]]
    if holder >= 0:
        who = "this check" if holder == n else f"worker {holder}"
        acq, rel = int(st[holder, ACQ]), int(st[holder, REL])
        parts.append(f"{who.capitalize()} holds p.lock (acquired it {_times(acq)}, released "
                     f"it {_times(rel)})" + (" and is waiting to acquire it again"
                                            if holder in waiting else "") + ".")
    if waiting:
        others = [w for w in waiting if w != holder]
        if others:
            parts.append(f"Worker{'s' if len(others) > 1 else ''} "
                         f"{', '.join(map(str, others))} {'are' if len(others) > 1 else 'is'}"
                         " waiting to acquire it.")
        parts.append("A lock that is not released blocks every worker (and a second "
                     "acquire by its holder blocks that one too): release it on every path - "
                     "`with p.lock:` does.")
    elif int(seq[0]) % 2 and not st[:, ACQ].any():
        parts.append(f"p.seq[0] = {int(seq[0])} is odd and p.lock was never acquired: writers "
                     "that bump p.seq[0] without the lock overwrite each other's bumps (a lost "
                     "update of the version itself), which can leave it odd for good, and "
                     "every reader then retries forever. Write under p.lock.")
    elif int(seq[0]) % 2:
        parts.append(f"Nobody waits for p.lock, and p.seq[0] = {int(seq[0])} is odd: the "
                     "version was made odd and never even again, so every reader retries "
                     "forever. Either a writer adds 1 before the write but not after it, or "
                     "a bump happens outside p.lock, where two writers' bumps can collide and "
                     "one is lost: both bumps go inside the same `with p.lock:` as the write.")
    else:
        parts.append("Nobody waits for p.lock: does your update loop forever (a retry loop "
                     "whose exit condition never holds)?")
    return " ".join(parts)


def _times(n: int) -> str:
    return f"{n} time" + ("" if n == 1 else "s")


def _launch(body, args_of, n: int, st: np.ndarray, seq: np.ndarray, updates: int, *,
            stall: float, timeout: float, on_tick=None) -> tuple[list, dict]:
    """Fork n workers running body(w, *args_of(w)); wait for all of them, watching progress
    (st[:, DONE]). on_tick(t) runs every few ms; while it returns True the workers have not
    started yet, and the stall clock waits. Returns (replies by worker, what the parent
    saw). Raises WorkerError, Stalled or TimeoutError; in every case every worker has ended
    when this returns."""
    ctx = mp.get_context("fork")
    procs, conns = [], []
    seen = {"seq_samples": 0, "seq_odd": 0}
    try:
        for w in range(n):
            ours, theirs = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, name=f"race-worker-{w}", daemon=True,
                               args=(w, body, args_of(w), theirs, os.getpid()))
            proc.start()
            theirs.close()
            procs.append(proc)
            conns.append(ours)
        replies: dict[int, object] = {}
        t0 = time.monotonic()
        last_total, last_change = -1, t0
        while len(replies) < n:
            now = time.monotonic()
            if now - t0 > timeout:
                raise TimeoutError(f"the workers did not finish within {timeout:g} s, though "
                                   "they kept making progress: is the update very slow "
                                   "(printing, sleeping)?")
            pending = [w for w in range(n) if w not in replies]
            ready = wait_any([conns[w] for w in pending] + [procs[w].sentinel for w in pending],
                             0.005)
            for w in pending:
                if conns[w] in ready or (procs[w].sentinel in ready and conns[w].poll()):
                    try:
                        kind, data = conns[w].recv()
                    except (EOFError, OSError):
                        kind, data = "died", None
                    if kind == "error":
                        raise WorkerError(w, *data)
                    if kind == "died":
                        raise RuntimeError(f"worker {w} died (exit code {procs[w].exitcode})")
                    replies[w] = data
                elif procs[w].sentinel in ready:
                    procs[w].join(0.5)
                    raise RuntimeError(f"worker {w} died (exit code {procs[w].exitcode}) - does "
                                       "your code call os._exit, or use too much memory?")
            seen["seq_samples"] += 1
            seen["seq_odd"] += int(seq[0]) & 1
            if on_tick is not None and on_tick(now - t0):
                last_change = now  # not started yet: nothing can stall
            total = int(st[:-1, DONE].sum())
            if total != last_total:
                last_total, last_change = total, now
            elif now - last_change > stall and len(replies) < n:
                raise Stalled(_stall_sentence(st, seq, updates, stall))
        return [replies[w] for w in range(n)], seen
    finally:
        stop_processes(procs)
        for c in conns:
            c.close()


@contextlib.contextmanager
def _unwritten():
    """A worker's NotImplementedError is raised here as itself: the update is unwritten."""
    try:
        yield
    except WorkerError as exc:
        if exc.kind == "NotImplementedError":
            raise NotImplementedError(exc.message) from None
        raise


def _hammer_body(w, update, p, st, tm, idx, dense, work, updates, go):
    p.lock._bind(w)
    step = _make_step(w, st, p.lock, dense, work)
    st[w, READY] = 1
    if not go.wait(30):
        raise TimeoutError("the start signal never came")
    tm[w, 0] = time.monotonic()
    row = st[w]
    for k in range(updates):
        update(p, idx if dense else idx[w, k], step)
        row[DONE] = k + 1
    tm[w, 1] = time.monotonic()
    return None


def _sparse_indices(workers: int, updates: int, dim: int, nnz: int, seed: int) -> np.ndarray:
    """(workers, updates, nnz) distinct coordinates per update, seeded."""
    rng = np.random.default_rng([seed, 6])
    idx = rng.integers(0, dim, (workers, updates, nnz))
    flat = idx.reshape(-1, nnz)
    while True:  # redraw the (rare) updates that name a coordinate twice
        s = np.sort(flat, axis=1)
        dup = (s[:, 1:] == s[:, :-1]).any(axis=1)
        if not dup.any():
            return idx
        flat[dup] = rng.integers(0, dim, (int(dup.sum()), nnz))


def run_workers(update, *, workers: int = 4, updates: int = 2000, kind: str = "dense",
                dim: int | None = None, nnz: int = SPARSE_NNZ, work: int = WORK, seed: int = 0,
                stall: float | None = None, timeout: float = 60.0) -> dict:
    """`workers` processes each call update(p, idx, step) `updates` times on one shared p.x.

    kind "dense": every update touches all `dim` (4096) coordinates; "sparse": `nnz` (4) of
    `dim` (10000), drawn from `seed`. step(xv) does `work` rounds of arithmetic and returns
    ones, so a complete run leaves x[j] = the number of updates that touched j.

    Returns a dict: workers, updates (total), kind, dim, expected (coordinate increments
    that should have landed), counted (sum of x), lost (= expected - counted; negative:
    increments that never should have happened), lost_fraction, exact (x equals the
    expected counts everywhere), steps (step() calls), torn (steps given a dense vector
    whose coordinates disagree: a read of mixed versions), locked_steps (steps run while
    holding p.lock), overlaps (steps that ran while another worker was in step()),
    acquires, releases (of p.lock), seq (p.seq[0] at the end), seq_odd_seen /
    seq_samples (how often this process saw p.seq[0] odd while the workers ran),
    elapsed_s (first start to last finish, CLOCK_MONOTONIC), updates_per_s.
    Raises WorkerError (an update raised), Stalled (no progress for `stall` s, default
    STALL_S: a deadlock, named) or TimeoutError; no worker outlives the call.
    """
    stall = STALL_S if stall is None else stall
    if kind not in ("dense", "sparse"):
        raise ValueError(f"kind must be 'dense' or 'sparse', got {kind!r}")
    if workers < 1 or updates < 1:
        raise ValueError("workers and updates must be at least 1")
    dense = kind == "dense"
    dim = dim or (DENSE_DIM if dense else SPARSE_DIM)
    idx = np.arange(dim) if dense else _sparse_indices(workers, updates, dim, nnz, seed)
    ctx = mp.get_context("fork")
    x = _shared(dim, torch.float64)
    seq = _shared(1, torch.int64)
    st = _shared((workers + 1, _COLS), torch.int64)
    st[-1, HOLDER] = -1
    tm = _shared((workers, 2), torch.float64)
    p = Shared(x, seq, SharedLock(ctx.Lock(), st))
    go = ctx.Event()
    args = (update, p, st, tm, idx, dense, work, updates, go)

    def start_when_ready(t: float) -> bool:
        if not go.is_set() and st[:-1, READY].all():  # everyone at the line: one start
            go.set()
        return not go.is_set()

    with _unwritten():
        _, seen = _launch(_hammer_body, lambda w: args, workers, st, seq, updates,
                          stall=stall, timeout=timeout, on_tick=start_when_ready)
    expected_per = (np.full(dim, workers * updates, dtype=np.int64) if dense
                    else np.bincount(idx.ravel(), minlength=dim))
    expected, counted = int(expected_per.sum()), float(x.sum())
    elapsed = float(tm[:, 1].max() - tm[:, 0].min())
    col = st[:-1].sum(axis=0)
    total = workers * updates
    return {
        "workers": workers, "updates": total, "kind": kind, "dim": dim,
        "expected": expected, "counted": int(round(counted)),
        "lost": expected - int(round(counted)),
        "lost_fraction": (expected - counted) / expected,
        "exact": bool(np.array_equal(x, expected_per.astype(np.float64))),
        "steps": int(col[STEPS]), "torn": int(col[TORN]) if dense else None,
        "locked_steps": int(col[LOCKED_STEPS]), "overlaps": int(col[OVERLAPS]),
        "acquires": int(col[ACQ]), "releases": int(col[REL]), "seq": int(seq[0]),
        "seq_odd_seen": seen["seq_odd"], "seq_samples": seen["seq_samples"],
        "elapsed_s": elapsed, "updates_per_s": total / elapsed if elapsed > 0 else float("inf"),
    }


# --- the one-worker probe: what one update does, step by step --------------------------------

PROBE_DIM = 16
PHASE, GO = 10, 11  # columns: the probe's phase (worker row) and the check's signal (last row)


class _Watched(np.ndarray):
    """p.x in the probe: each read and write tells `hook` (the probe's writer and notes)."""

    def __getitem__(self, key):
        out = np.ndarray.__getitem__(self, key)
        if isinstance(out, np.ndarray):
            out = out.view(np.ndarray)
        hook = self.__dict__.get("hook")
        return hook.on_read(out) if hook else out

    def __setitem__(self, key, value):
        hook = self.__dict__.get("hook")
        if hook:
            hook.on_write()
        np.ndarray.__setitem__(self, key, value)


class _WatchedSeq(np.ndarray):
    """p.seq in the probe: each write (p.seq[0] += 1) tells `hook` whether p.lock was held."""

    def __setitem__(self, key, value):
        hook = self.__dict__.get("hook")
        if hook:
            hook.seq_writes.append(hook.p.lock.held)
        np.ndarray.__setitem__(self, key, value)


class _Hook:
    def __init__(self, p: Shared) -> None:
        self.p = p
        self.reads: list[bool] = []  # lock held at each read of p.x[...]
        self.writes: list[tuple[int, bool]] = []  # (p.seq[0], lock held) at each write
        self.seq_writes: list[bool] = []  # lock held at each write of p.seq
        self.trap = None  # (idx, new values): a writer that completes during the next read
        self.sprung = None

    def on_read(self, out):
        self.reads.append(self.p.lock.held)
        # The staged write can only overlap a reader's copy: a read under p.lock is a
        # writer's own read, which no other writer can overlap.
        if (self.trap is not None and not self.p.lock.held and isinstance(out, np.ndarray)
                and out.ndim == 1):
            idx, new = self.trap
            self.trap = None
            # What a reader sees when a write runs while it copies: the first half of its
            # copy is already new, the rest still old. And the writer is done by now:
            # p.x holds the new values and p.seq[0] went up by 2.
            torn = out.copy()
            half = len(torn) // 2
            if torn.shape == idx.shape:
                torn[:half] = new[idx][:half]
            base = self.p.x.view(np.ndarray)
            base[:] = new
            self.p.seq.view(np.ndarray)[0] += 2  # the staged writer's bumps, not the learner's
            self.sprung = torn
            return torn
        return out

    def on_write(self) -> None:
        self.writes.append((int(self.p.seq[0]), self.p.lock.held))


def _probe_step(r):
    """The probe's step: 0.5·xv + r, a change that depends on the values read."""

    def fn(xv):
        return 0.5 * xv + (r if xv.shape == r.shape else 1.0)

    return fn


def _probe_body(w, update, mode, p, st, plan, traps):
    p.lock._bind(w)
    hook = _Hook(p)
    p.x.hook = hook
    if isinstance(p.seq, _WatchedSeq):
        p.seq.hook = hook
    base = p.x.view(np.ndarray)
    out = {"updates": [], "odd_phase": None, "trap": None}

    def one(idx, r):
        calls: list = []
        seqs: list = []  # p.seq[0] at each step() call: odd means a write was in progress
        inner = _make_step(w, st, p.lock, False, 0, record=calls, fn=_probe_step(r))

        def step(xv):
            seqs.append(int(p.seq[0]))
            return inner(xv)

        hook.reads, hook.writes, hook.seq_writes = [], [], []
        before, seq0 = base.copy(), int(p.seq[0])
        acq0, rel0, locked0 = (int(st[w, c]) for c in (ACQ, REL, LOCKED_STEPS))
        update(p, idx, step)
        st[w, DONE] += 1
        return {"idx": idx, "r": r, "before": before, "after": base.copy(), "calls": calls,
                "seq_at_step": seqs,
                "seq0": seq0, "seq1": int(p.seq[0]), "acquired": int(st[w, ACQ]) - acq0,
                "released": int(st[w, REL]) - rel0,
                "locked_steps": int(st[w, LOCKED_STEPS]) - locked0,
                "reads": list(hook.reads), "writes": list(hook.writes),
                "seq_writes": list(hook.seq_writes),
                "held_after": p.lock.held}

    for idx, r in plan:
        out["updates"].append(one(idx, r))
        if out["updates"][-1]["held_after"] or (mode == "seqlock" and p.seq[0] % 2):
            return out  # a second update would wait for this lock (or version) forever
    if mode != "seqlock":
        return out
    (idx_b, r_b, new_b), (idx_c, r_c, new_c) = traps
    # A write in progress: the check holds p.lock, has made p.seq[0] odd and written half.
    st[w, PHASE] = 1
    deadline = time.monotonic() + 10
    while st[-1, GO] == 0:
        if time.monotonic() > deadline:
            raise TimeoutError("the probe's writer never started")
        time.sleep(0.001)
    out["odd_phase"] = one(idx_b, r_b)
    # A write that starts and completes while the update copies p.x[idx].
    hook.trap = (idx_c, new_c)
    res = one(idx_c, r_c)
    hook.trap = None
    res["torn"], res["new"] = hook.sprung, new_c
    out["trap"] = res
    return out


def probe(update, mode: str, *, seed: int = 0, timeout: float = 20.0,
          stall: float | None = None) -> dict:
    """Run `update` on ONE worker process, a few updates in sequence on PROBE_DIM
    coordinates (each with a random subset idx and a step 0.5·xv + r), then, for the seqlock,
    two races staged on purpose: a write in progress (the check holds p.lock, p.seq[0] odd,
    half the vector new) and a write that completes while the update copies p.x[idx]."""
    rng = np.random.default_rng([seed, 60])
    ctx = mp.get_context("fork")
    x = _shared(PROBE_DIM, torch.float64)
    x[:] = rng.integers(-50, 50, PROBE_DIM)
    seq = _shared(1, torch.int64)
    st = _shared((2, _COLS), torch.int64)
    st[-1, HOLDER] = -1
    p = Shared(x.view(_Watched), seq.view(_WatchedSeq), SharedLock(ctx.Lock(), st))

    def subset():
        k = int(rng.integers(3, PROBE_DIM - 2))
        return np.sort(rng.choice(PROBE_DIM, k, replace=False))

    plan = [(idx, rng.integers(1, 9, len(idx)).astype(np.float64))
            for idx in (subset() for _ in range(4))]
    traps = []
    for _ in range(2):
        idx = subset()
        traps.append((idx, rng.integers(1, 9, len(idx)).astype(np.float64),
                      rng.integers(100, 200, PROBE_DIM).astype(np.float64)))
    writer = {"state": 0, "t": 0.0}
    new_b = traps[0][2]

    def play_writer(t: float) -> None:  # the check's side of the staged write in progress
        if mode != "seqlock":
            return
        if writer["state"] == 0 and st[0, PHASE] == 1:
            if not p.lock.acquire(True, 2.0):  # never block this process on learner code
                raise RuntimeError("the check could not take p.lock to stage a write: your "
                                   "update still holds it after returning")
            seq[0] += 1  # odd: a write is in progress
            half = PROBE_DIM // 2
            x[:half] = new_b[:half]
            writer.update(state=1, t=t)
            st[-1, GO] = 1
        elif writer["state"] == 1 and t - writer["t"] > 0.2:
            x[:] = new_b
            seq[0] += 1  # even: the write is complete
            p.lock.release()
            writer["state"] = 2

    try:
        with _unwritten():
            (out,), _ = _launch(_probe_body, lambda w: (update, mode, p, st, plan, traps), 1,
                                st, seq, len(plan) + 2, stall=stall or STALL_S,
                                timeout=timeout, on_tick=play_writer)
    finally:
        if writer["state"] == 1:
            with contextlib.suppress(Exception):
                p.lock.release()
    out["new_b"] = new_b
    return out


# The reference answers (they calibrate the checks, and the tests use them) live in
# `_answers.py`, out of this module: the lab notebook imports this one as `lab`.


# --- turning runs into the checks' sentences -------------------------------------------------


def _worker_failure(exc: WorkerError) -> Exception:
    if exc.kind == "NotImplementedError":
        return NotDone(exc.message)
    if exc.kind in ("Fail", "AssertionError") and exc.message:
        return Fail(f"worker {exc.worker}: {exc.message}")
    return Fail(f"worker {exc.worker} raised {exc.kind}: {shorten(exc.message)}"
                f"{learner_line(exc.tb)}")


CHECK_RUN_TIMEOUT = 20.0  # a run in a check: ~1 s when right, so 20 s means something is off


def _run(update, **kw) -> dict:
    """run_workers with every failure of the learner's code turned into Fail / NotDone."""
    try:
        return run_workers(update, timeout=CHECK_RUN_TIMEOUT, **kw)
    except NotImplementedError as exc:
        raise NotDone(str(exc)) from None
    except WorkerError as exc:
        raise _worker_failure(exc) from None
    except Stalled as exc:
        raise Fail(f"timed out: {exc}") from None
    except (TimeoutError, RuntimeError) as exc:
        raise Fail(str(exc)) from None


def _probe(update, mode: str, seed: int) -> dict:
    try:
        return probe(update, mode, seed=seed)
    except NotImplementedError as exc:
        raise NotDone(str(exc)) from None
    except WorkerError as exc:
        raise _worker_failure(exc) from None
    except Stalled as exc:
        raise Fail(f"timed out with one worker: {exc}") from None
    except (TimeoutError, RuntimeError) as exc:
        raise Fail(str(exc)) from None


def _values(a: np.ndarray) -> str:
    return "[" + ", ".join(f"{v:g}" for v in np.asarray(a).ravel()[:5]) + (
        ", ...]" if np.asarray(a).size > 5 else "]")


def _first_diff(got: np.ndarray, want: np.ndarray) -> str:
    """'3 of 9 values differ; the first at position 5: 138, expected 171' (the values that
    differ, not the first five, which may all agree)."""
    got, want = np.asarray(got, dtype=float).ravel(), np.asarray(want, dtype=float).ravel()
    if got.shape != want.shape:
        return f"{got.size} values where {want.size} were expected"
    bad = np.flatnonzero(~np.isclose(got, want, rtol=0, atol=1e-9))
    if not bad.size:
        return "the same values"
    i = int(bad[0])
    return (f"{bad.size} of {got.size} values differ; the first at position {i}: "
            f"{got[i]:g}, expected {want[i]:g}")


def _verdict_one(u: dict, mode: str, name: str) -> None:
    """One update, alone: it must add step(p.x[idx]) to p.x[idx], and (lock, seqlock)
    follow its protocol. Raises Fail with the first thing wrong."""
    idx, before, after = u["idx"], u["before"], u["after"]
    n = len(u["calls"])
    if n == 0:
        raise Fail(f"{name} never called step(xv): read xv = p.x[idx], compute d = step(xv) "
                   "(the gradient step), and add d to p.x[idx]")
    if n > 1:
        raise Fail(f"{name} called step() {n} times for one update: call it once, on the "
                   "values it read (each call is one gradient computation)")
    xv = u["calls"][0]
    if xv.shape != idx.shape or not np.array_equal(xv, before[idx]):
        what = (_first_diff(xv, before[idx]) if np.shape(xv) == idx.shape else
                f"{_values(xv)}, shape {np.shape(xv)}")
        raise Fail(f"{name} called step() with other values ({what}) than the "
                   f"{len(idx)} values p.x[idx] = {_values(before[idx])} at the update's "
                   "coordinates")
    d = 0.5 * before[idx] + u["r"]  # what the probe's step returned
    expect = before.copy()
    expect[idx] += d
    if not np.allclose(after, expect, rtol=0, atol=1e-9):
        outside = np.setdiff1d(np.arange(before.size), idx)
        if not np.array_equal(after[outside], before[outside]):
            raise Fail(f"{name} changed coordinates outside idx: an update may only write the "
                       "coordinates it was given")
        a = after[idx]
        if np.array_equal(a, before[idx]):
            raise Fail(f"after {name}, p.x[idx] has not changed: store the result into the "
                       "shared array (p.x[idx] = ...); xv = p.x[idx] is a copy, so changing "
                       "xv changes nothing")
        if np.allclose(a, before[idx] - d):
            raise Fail(f"{name} subtracted the step: step(xv) already returns the change to "
                       "ADD (x[idx] = xv + step(xv))")
        if np.allclose(a, d):
            raise Fail(f"{name} stored the step itself: store the values read plus the step")
        raise Fail(f"after {name}, p.x[idx] is not the values read plus step(values): "
                   f"{_first_diff(a, expect[idx])}")
    if mode == "hogwild":
        return
    if u["held_after"] or u["acquired"] != u["released"]:
        raise Fail(f"{name} returned still holding p.lock (acquired {u['acquired']} time(s), "
                   f"released {u['released']}): every other worker would wait for it forever. "
                   "Release it on every path: `with p.lock:` does")
    if u["acquired"] == 0:
        raise Fail(f"{name} never acquired p.lock. A lock of your own (created inside the "
                   "function, or one per worker) is not shared by the workers and protects "
                   "nothing: use p.lock, the lock they all share")
    if mode == "lock":
        if u["locked_steps"] == 0:
            raise Fail(f"step() ran while {name} did not hold p.lock: the read, the step and "
                       "the write must be ONE critical section. With a lock around the write "
                       "alone, two workers still read the same version and one write "
                       "overwrites the other")
        if not all(u["reads"]):
            raise Fail(f"{name} read p.x before taking p.lock: another worker can write "
                       "between your read and your write (a lost update). Read inside the lock")
        if not all(held for _, held in u["writes"]):
            raise Fail(f"{name} wrote p.x after releasing p.lock: write inside the lock")
        return
    # seqlock
    if u["locked_steps"]:
        raise Fail(f"step() ran while {name} held p.lock: in a seqlock readers take no lock, "
                   "and the step (the long part) runs outside it; only the write is locked")
    if u["seq1"] % 2:
        raise Fail(f"p.seq[0] = {u['seq1']} is odd after {name}: a writer adds 1 before it "
                   "writes (odd: write in progress) and 1 after (even: done)")
    if u["seq1"] - u["seq0"] < 2:
        raise Fail(f"p.seq[0] went from {u['seq0']} to {u['seq1']} during a write: a reader "
                   "cannot tell that x changed. Add 1 before the write and 1 after it")
    if u["writes"]:
        even = [v for v, _ in u["writes"] if v % 2 == 0]
        if even:
            raise Fail(f"{name} stored into p.x while p.seq[0] was even ({even[0]}): a reader "
                       "copying x during this write sees an even, unchanged version and "
                       "accepts a half-written vector. Make the version odd FIRST "
                       "(p.seq[0] += 1), then write, then make it even (p.seq[0] += 1)")
        if not all(held for _, held in u["writes"]):
            raise Fail(f"{name} stored into p.x without holding p.lock: two writers can then "
                       "overwrite each other (the seqlock protects readers, not writers)")
    if not all(u.get("seq_writes", ())):
        outside = u["seq_writes"].count(False)
        raise Fail(f"{name} changed p.seq[0] {outside} time(s) without holding p.lock: "
                   "p.seq[0] += 1 is a read-modify-write too, and two writers bumping at once "
                   "can lose a bump (the version then stays odd forever, or a reader misses a "
                   "write). Both bumps belong inside the same `with p.lock:` as the write")


def _verdict_probe(out: dict, mode: str, name: str) -> str:
    for k, u in enumerate(out["updates"]):
        _verdict_one(u, mode, f"{name} (update {k + 1} of {len(out['updates'])}, alone)")
    n = len(out["updates"])
    if mode != "seqlock":
        return f"{n} updates in sequence, each adds step(p.x[idx]) to p.x[idx] exactly"
    o = out["odd_phase"]
    if any(v % 2 for v in o["seq_at_step"]):
        raise Fail(f"{name} computed its step while p.seq[0] was odd: a write was in progress "
                   "(this check held p.lock and had written half of p.x), so the values it "
                   "read mix two versions. While the version is odd, a reader must retry")
    if len(o["calls"]) == 1 and not np.array_equal(o["calls"][0], out["new_b"][o["idx"]]):
        raise Fail(f"{name} waited for a write in progress, then computed its step from "
                   "values that are not the ones that write left ("
                   f"{_first_diff(o['calls'][0], out['new_b'][o['idx']])}): read p.x[idx] "
                   "again after the wait")
    _verdict_one({**o, "before": out["new_b"]}, "hogwild",
                 f"{name} (after waiting for a write in progress)")
    t = out["trap"]
    if t["torn"] is None:
        staged = " (the torn read could not be staged: read the values as p.x[idx])"
    else:
        staged = ""
        if any(np.array_equal(c, t["torn"]) for c in t["calls"]):
            raise Fail(f"a write ran while {name} copied p.x[idx] (p.seq[0] went up by 2 in "
                       "the meantime) and your update computed its step from that copy: half "
                       "old, half new values, a torn read. Re-read p.seq[0] after the copy and "
                       "retry if it changed")
        _verdict_one({**t, "before": t["new"]}, "hogwild",
                     f"{name} (after a write during its read)")
    return (f"{n} updates in sequence are exact; a reader waits out a write in progress and "
            f"retries a read that a write overlapped{staged}")


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}%" if abs(fraction) >= 0.01 else f"{100 * fraction:.3f}%"


def _lost_sentence(r: dict) -> str:
    return (f"{r['lost']} of {r['expected']} coordinate increments lost "
            f"({_pct(r['lost_fraction'])}) in {r['workers']} workers x "
            f"{r['updates'] // r['workers']} {r['kind']} updates")


_CALIBRATION: dict[tuple, dict] = {}


def _calibration(**kw) -> dict:
    """The lock-free reference in a check's setting, measured once per session: how often
    a race happens there, i.e. how surely a missing lock would show."""
    key = tuple(sorted(kw.items()))
    if key not in _CALIBRATION:
        from ._answers import reference_hogwild

        _CALIBRATION[key] = _run(reference_hogwild, **kw)
    return _CALIBRATION[key]


def _verdict_safe(r: dict, ref: dict, mode: str, name: str, *, ratio: bool = True) -> str:
    """A run of a safe update: nothing lost, nothing extra, no torn read (dense)."""
    race = (f"the lock-free update lost {ref['lost']} ({_pct(ref['lost_fraction'])}) "
            "in the same setting")
    if r["lost"] < 0:
        raise Fail(f"p.x counts {r['counted']} increments, {-r['lost']} more than the "
                   f"{r['expected']} the updates made: does {name} add the step twice?")
    if r["lost"] > 0:
        why = ""
        if r["acquires"] == 0:
            why = (" p.lock was never acquired: a lock of your own (created inside the "
                   "function, or one per worker) is not shared and protects nothing - use "
                   "p.lock.")
        elif mode == "lock" and r["locked_steps"] < r["steps"]:
            why = (" You take p.lock, but step() ran outside it: two workers read the same "
                   "version, and the second write overwrites the first. Hold p.lock across "
                   "the whole read-modify-write.")
        elif mode == "seqlock":
            why = (" The write must add the step to the CURRENT values under p.lock "
                   "(p.x[idx] += d), not store what was read plus the step: a write that "
                   "landed between your read and your lock is overwritten.")
        raise Fail(f"{_lost_sentence(r)} ({race}).{why}")
    if not r["exact"]:
        raise Fail(f"nothing was lost in total, yet p.x differs from the number of updates "
                   f"that touched each coordinate: does {name} write other coordinates?")
    if r["torn"]:
        odd = ""
        if mode == "seqlock" and r["seq_odd_seen"] == 0:
            odd = (f" p.seq[0] was never odd in {r['seq_samples']} looks while the workers "
                   "ran: make it odd before the write.")
        raise Fail(f"{r['torn']} of {r['steps']} steps were computed from a torn read (a "
                   "vector whose coordinates came from different updates): a reader must "
                   f"retry while the version is odd, or if it changed during the copy.{odd}")
    if mode == "seqlock" and r["seq"] % 2:
        raise Fail(f"p.seq[0] = {r['seq']} is odd after every worker finished: each write "
                   "must leave it even. If every write adds 2, a bump was lost: a bump outside "
                   "p.lock can collide with another writer's (both bumps go inside the lock)")
    torn = " and no torn read" if r["torn"] is not None else ""
    out = (f"0 of {r['expected']} increments lost{torn} in {r['workers']} x "
           f"{r['updates'] // r['workers']} {r['kind']} updates, where {race}")
    if ratio:
        out += (f"; throughput {name} / lock-free = "
                f"{r['updates_per_s'] / ref['updates_per_s']:.2f} (one pair of runs; "
                "race_price measures it properly)")
    return out


def _draw(ctx) -> dict:
    """Hidden checks' settings: workers, updates per worker, seed."""
    return {"workers": int(ctx.rng.integers(3, 7)), "updates": int(ctx.rng.integers(1000, 2001)),
            "seed": int(ctx.rng.integers(0, 2**31))}


# --- the exercises -----------------------------------------------------------------------------

VISIBLE = {"workers": 4, "updates": 1500}

HOGWILD = LAB.exercise(
    "race_hogwild", needs=("hogwild_update",),
    title="Step 1: the naive lock-free update, and its lost updates counted",
    hints=("The idea: an update is a read, a step computed from what was read, and a write of "
           "read + step. With no lock, two workers can read the same values, and the later "
           "write erases the earlier: that is the lost update you will count.",
           "Three lines: xv = p.x[idx]; d = step(xv); p.x[idx] = xv + d. No lock.",
           "p.x[idx] with an index array returns a COPY: the result has to be stored back "
           "with p.x[idx] = ... for the other workers to see it.",
           "The check WANTS lost updates: if it finds none, your update is not the naive one "
           "(is there a lock in it?)."))


@HOGWILD.check("one worker: each update adds step(p.x[idx]) to p.x[idx]")
def _hogwild_alone(ctx):
    fn = ctx.learner("hogwild_update")
    return _verdict_probe(_probe(fn, "hogwild", ctx.seed), "hogwild", "hogwild_update")


def _hogwild_lossy(fn, name, **kw) -> dict:
    r = _run(fn, **kw)
    if r["lost"] < 0:
        raise Fail(f"p.x counts {r['counted']} increments, {-r['lost']} more than the "
                   f"{r['expected']} the updates made: does {name} add the step twice?")
    if r["counted"] <= 0:
        raise Fail(f"no increment landed at all (p.x sums to {r['counted']}): the one-worker "
                   f"check says what {name} does instead of adding step(xv) to p.x[idx]")
    if r["kind"] == "dense" and r["lost"] == 0:
        lock = (f" (it acquired p.lock {r['acquires']} times)" if r["acquires"] else "")
        raise Fail(f"no update was lost although {r['workers']} workers x "
                   f"{r['updates'] // r['workers']} updates all rewrote the same {r['dim']} "
                   f"coordinates at the same time{lock}: step 1 is the naive update, with no "
                   "lock (that is step 2). Read, step, write back, nothing else")
    return r


@HOGWILD.check("4 workers x 1500 dense updates: the lost updates are counted (> 0)", points=2)
def _hogwild_dense(ctx):
    r = _hogwild_lossy(ctx.learner("hogwild_update"), "hogwild_update", **VISIBLE,
                       seed=ctx.seed)
    return f"{_lost_sentence(r)}, {r['updates_per_s']:.0f} updates/s"


@HOGWILD.check("3-6 workers, other seeds: dense loses updates, sparse far fewer", points=2,
               hidden=True)
def _hogwild_sparse(ctx):
    fn, kw = ctx.learner("hogwild_update"), _draw(ctx)
    d = _hogwild_lossy(fn, "hogwild_update", kind="dense", **kw)
    s = _hogwild_lossy(fn, "hogwild_update", kind="sparse", **kw)
    if not s["exact"] and s["lost"] == 0:
        raise Fail("on the sparse problem p.x differs from the number of updates that touched "
                   "each coordinate: does hogwild_update write other coordinates than idx?")
    if s["lost_fraction"] * 5 > d["lost_fraction"]:
        raise Fail(f"the sparse problem lost {100 * s['lost_fraction']:.2f}% of its increments "
                   f"and the dense one {100 * d['lost_fraction']:.2f}%: two random sets of "
                   f"{SPARSE_NNZ} of {SPARSE_DIM} coordinates rarely overlap, so sparse updates "
                   "should lose far fewer. Does your update touch more than p.x[idx]?")
    return (f"dense: {_lost_sentence(d)}; sparse: {100 * s['lost_fraction']:.3f}% lost "
            f"({s['lost']} increments)")


LOCK = LAB.exercise(
    "race_lock", needs=("locked_update",),
    title="Step 2: one lock around the read-modify-write",
    hints=("Put the three lines of step 1 inside `with p.lock:`.",
           "The lock must cover the READ as well as the write: if two workers read the same "
           "version, the second write overwrites the first however the write is protected.",
           "Use p.lock itself: a lock created inside your function (or one per worker) is a "
           "different lock in every process and excludes nobody."))


@LOCK.check("one worker: exact updates, p.lock held across read, step and write")
def _lock_alone(ctx):
    fn = ctx.learner("locked_update")
    return _verdict_probe(_probe(fn, "lock", ctx.seed), "lock", "locked_update")


@LOCK.check("4 workers x 1500 dense updates: no update lost, no torn read", points=3)
def _lock_dense(ctx):
    fn = ctx.learner("locked_update")
    ref = _calibration(**VISIBLE, kind="dense")
    return _verdict_safe(_run(fn, **VISIBLE, seed=ctx.seed), ref, "lock", "locked_update")


@LOCK.check("3-6 workers, other seeds, dense and sparse: nothing lost", points=2, hidden=True)
def _lock_hidden(ctx):
    fn, kw = ctx.learner("locked_update"), _draw(ctx)
    out = []
    for kind in ("dense", "sparse"):
        ref = _calibration(kind=kind, **kw)
        out.append(_verdict_safe(_run(fn, kind=kind, **kw), ref, "lock", "locked_update",
                                 ratio=False))
    return "; ".join(out)


SEQLOCK = LAB.exercise(
    "race_seqlock", needs=("seqlock_update",),
    title="Step 3: a seqlock - readers retry, only the write is locked",
    hints=("The idea: a version number tells a reader whether a write overlapped its copy: odd "
           "while a write is under way, and different afterwards. Readers retry instead of "
           "locking; writers still exclude each other, and change the version only under the "
           "lock.",
           "Reader: v = p.seq[0]; if v is odd, retry; xv = p.x[idx]; if p.seq[0] != v, "
           "retry (call os.sched_yield() before each retry). Only then d = step(xv), "
           "outside any lock.",
           "Writer, under p.lock: p.seq[0] += 1 (odd), p.x[idx] += d (the CURRENT values plus "
           "your step, so a write that came in between is kept), p.seq[0] += 1 (even).",
           "Why both checks in the reader: odd means a write is under way; a changed version "
           "means a write started or finished while you were copying."))


@SEQLOCK.check("one worker, and staged races: a write in progress, a write during the read",
               points=2)
def _seqlock_alone(ctx):
    fn = ctx.learner("seqlock_update")
    return _verdict_probe(_probe(fn, "seqlock", ctx.seed), "seqlock", "seqlock_update")


@SEQLOCK.check("4 workers x 1500 dense updates: no update lost, no torn read", points=3)
def _seqlock_dense(ctx):
    fn = ctx.learner("seqlock_update")
    ref = _calibration(**VISIBLE, kind="dense")
    r = _run(fn, **VISIBLE, seed=ctx.seed)
    detail = _verdict_safe(r, ref, "seqlock", "seqlock_update")
    return (f"{detail}; {r['overlaps']} of {r['steps']} steps ran while another worker was "
            "inside step(): the steps ran side by side")


@SEQLOCK.check("3-6 workers, other seeds, dense and sparse: nothing lost, no torn read",
               points=2, hidden=True)
def _seqlock_hidden(ctx):
    fn, kw = ctx.learner("seqlock_update"), _draw(ctx)
    out = []
    for kind in ("dense", "sparse"):
        ref = _calibration(kind=kind, **kw)
        out.append(_verdict_safe(_run(fn, kind=kind, **kw), ref, "seqlock", "seqlock_update",
                                 ratio=False))
    return "; ".join(out)


PRICE = LAB.exercise(
    "race_price", needs=("price",),
    title="Step 4: the price of safety, as a ratio with its samples",
    hints=("The idea: the machine drifts between runs, so compare runs that ran close together:"
           " pair each unsafe run with a safe one, take the ratio per pair, and report a "
           "statistic that one stalled run cannot move.",
           "Loop `repeats` times: call run_unsafe() and run_safe() one after the other, and "
           "keep safe / unsafe of that pair.",
           "Return {'ratio': the median of the pair ratios, 'samples': the list of them}.",
           "Why pairs: the machine drifts (other jobs, CPU frequency, caches), and a pair's "
           "two runs see nearly the same machine. Why the median: one run that stalled "
           "moves a mean a lot and a median hardly at all."))


class _Bench:
    """Fake run_safe / run_unsafe: throughputs that drift by `drift` per run, with one run
    stalled (÷ `stall`); the true ratio safe/unsafe is `ratio`. It notes the order of calls."""

    def __init__(self, ratio: float, drift: float, stalled: int, stall: float = 8.0) -> None:
        self.ratio, self.drift, self.stalled, self.stall = ratio, drift, stalled, stall
        self.calls: list[tuple[str, float]] = []

    def _run(self, kind: str) -> float:
        t = len(self.calls)
        v = 20_000.0 * (self.ratio if kind == "safe" else 1.0) * self.drift ** t
        if t == self.stalled:
            v /= self.stall
        self.calls.append((kind, v))
        return v

    def safe(self) -> float:
        return self._run("safe")

    def unsafe(self) -> float:
        return self._run("unsafe")


def _verdict_price(ctx, fn, ratio: float, drift: float, repeats: int) -> str:
    bench = _Bench(ratio, drift, stalled=2 * (repeats // 2) + 1)
    out = ctx.call(fn, bench.safe, bench.unsafe, repeats)
    kinds = [k for k, _ in bench.calls]
    n_safe, n_unsafe = kinds.count("safe"), kinds.count("unsafe")
    if (n_safe, n_unsafe) != (repeats, repeats):
        raise Fail(f"price(run_safe, run_unsafe, {repeats}) called run_safe {n_safe} and "
                   f"run_unsafe {n_unsafe} times: call each once per repeat")
    pairs = [bench.calls[i:i + 2] for i in range(0, len(kinds), 2)]
    if any({a[0], b[0]} != {"safe", "unsafe"} for a, b in pairs):
        order = " ".join("S" if k == "safe" else "U" for k in kinds)
        raise Fail(f"price ran {order} (S safe, U unsafe): the machine drifts between runs (here "
                   f"{100 * abs(1 - drift):.0f}% per run), and all of that drift between the "
                   "first and the last run lands in your ratio. Interleave them: one unsafe "
                   "and one safe run per repeat, ratio of that pair")
    if not isinstance(out, dict) or not {"ratio", "samples"} <= set(out):
        raise Fail(f"price returned {type(out).__name__} {str(out)[:60]}: return a dict "
                   "{'ratio': median of the pair ratios, 'samples': [one ratio per pair]}")
    samples = np.asarray(out["samples"], dtype=float).ravel()
    got = float(out["ratio"])
    want = np.array([dict(pair)["safe"] / dict(pair)["unsafe"] for pair in pairs])
    if samples.size != repeats:
        raise Fail(f"price returned {samples.size} samples for {repeats} repeats: one ratio "
                   "per pair of runs")
    if np.allclose(samples, 1 / want, rtol=1e-6):
        raise Fail("your samples are unsafe / safe: the price is throughput safe / unsafe "
                   "(below 1 when safety costs throughput)")
    if not np.allclose(samples, want, rtol=1e-6):
        raise Fail(f"your samples {_values(samples)} are not the pairs' safe / unsafe "
                   f"throughputs {_values(want)}: one sample per pair, run_safe() / run_unsafe()")
    if abs(got - np.median(samples)) > 1e-9 * max(1.0, abs(got)):
        mean = float(np.mean(samples))
        how = " - that is their mean" if abs(got - mean) < 1e-9 * max(1.0, mean) else ""
        raise Fail(f"ratio {got:.4f} is not the median of your samples "
                   f"({np.median(samples):.4f}){how}. One run here stalled (another job took "
                   f"the cores): it moves a mean by {100 * abs(mean / ratio - 1):.0f}% and a "
                   "median hardly at all. Report the median, with the samples")
    if abs(got / ratio - 1) > 0.07:
        raise Fail(f"ratio {got:.4f}, but the runs' true ratio is {ratio:.4f}")
    return (f"ratio {got:.3f} against the true {ratio:.3f}, from {repeats} interleaved pairs, "
            f"with a drift of {100 * abs(1 - drift):.0f}% per run and one stalled run")


@PRICE.check("5 pairs on a drifting machine with one stalled run: median of pair ratios",
             points=2)
def _price_visible(ctx):
    return _verdict_price(ctx, ctx.learner("price"), 0.6, 0.97, 5)


@PRICE.check("other repeats, ratios and drifts", points=2, hidden=True)
def _price_hidden(ctx):
    fn, out = ctx.learner("price"), []
    for _ in range(2):
        repeats = int(ctx.rng.integers(5, 10))
        ratio = float(ctx.rng.uniform(0.2, 1.8))
        drift = float(ctx.rng.uniform(0.96, 0.98))
        drift = drift if ctx.rng.random() < 0.5 else 1 / drift
        out.append(_verdict_price(ctx, fn, ratio, drift, repeats))
    return "; ".join(out)
