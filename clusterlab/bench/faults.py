"""`clusterlab bench faults`: the launcher's guarantees under faults, as figures.

A matrix of faults x where they strike, each cell repeated: a rank raises, is SIGKILLed,
rank 0 (the rendezvous store's host) is SIGKILLed, a rank hangs (SIGSTOP), a rank returns
early while the others wait, the ranks call mismatched operations, the caller is
interrupted (SIGINT to this process while `run()` waits, as Ctrl-C or a kernel interrupt),
the Jupyter kernel is restarted (the process group of the process that owns the Cluster
gets SIGTERM, then SIGKILL if it lingers, as jupyter_client does), the parent alone is
SIGKILLed; striking before any
collective, inside a collective, inside point-to-point, inside a DDP backward.

Each repetition records the error's type and message (does it name the rank and the
operation?), the time to the error (target: <= the configured timeout + 2 s), what is left
once it is raised (processes, the cluster's scratch files, /dev/shm segments, listening
ports) and whether the next `run()` on a new cluster succeeds. When the parent itself is
killed there is no error to raise: the time is until every rank is gone and the scratch
directory is removed. Then come the input checks of `faults_input` (generated netem
strings, bad arguments).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from . import bench, check, result, tick

WORLD = 2  # ranks per cluster: the faulty one and one that waits for it
NIC = "delay 1ms"
TIMEOUT = 3.0  # seconds: the cluster's timeout in every cell
SLACK = 2.0  # the error must come within TIMEOUT + SLACK
REPEATS, QUICK_REPEATS = 10, 1  # per cell
STRIKE_AFTER = 0.5  # s: when a fault from outside (interrupt, kill of the parent) strikes
STRIKE_DELAY = 0.02  # s: a rank's own fault waits this long once its peer is inside
INSIDE_WAIT = 5.0  # s: at most this long for the peer to report being inside the operation
PARALLEL = 5  # repetitions of a cell that waits for the timeout run side by side
FAULTS = ("raise", "sigkill", "sigkill_rank0", "sigstop", "return_early", "mismatch",
          "interrupt", "kernel_restart", "parent_sigkill")
WHERES = ("before", "collective", "p2p", "ddp")
PARENT_FAULTS = ("kernel_restart", "parent_sigkill")
WAIT_FOR_TIMEOUT = ("sigstop", "return_early", "mismatch")  # reported by the timeout
CRASHES = (-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGBUS, -signal.SIGILL, -signal.SIGFPE)
# What the error must say about each fault: its type, and the rank it must name.
EXPECTED = {"raise": "RankError", "sigkill": "RankDied", "sigkill_rank0": "RankDied",
            "sigstop": "ClusterTimeout", "return_early": "ClusterTimeout",
            "mismatch": ("ClusterTimeout", "RankError", "RankDied"),
            "interrupt": "KeyboardInterrupt"}
# The operation the message must name, by where the fault struck.
OPERATION = {"before": ("running cell",), "collective": ("allreduce", "broadcast"),
             "p2p": ("send", "recv"), "ddp": ("allreduce", "broadcast", "allgather")}
_EARLY = "clusterlab-bench: return early"


def cells() -> list[tuple[str, str]]:
    """Every (fault, where) of the matrix (a mismatch needs an operation to mismatch)."""
    return [(f, w) for f in FAULTS for w in WHERES if not (f == "mismatch" and w == "before")]


def faulty_rank(fault: str) -> int:
    return 0 if fault == "sigkill_rank0" else 1


# --- what runs on the ranks ----------------------------------------------------------------

def _strike(fault: str) -> None:
    if fault == "raise":
        raise RuntimeError("injected fault")
    if fault in ("sigkill", "sigkill_rank0"):
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if fault == "return_early":
        raise RuntimeError(_EARLY)
    if fault in ("interrupt", *PARENT_FAULTS):
        time.sleep(60)  # stall, so the others wait: what fails is the parent


def cell(fault: str, where: str, faulty: int):
    """One cell's function, on every rank: rank `faulty` meets the fault at `where` while
    the others are inside the operation (a collective, a recv, DDP's bucket all-reduces),
    waiting for it. Before: the fault comes first, the others go into an all-reduce."""
    import torch
    import torch.distributed as dist

    me = dist.get_rank() == faulty
    peer = 1 - faulty
    mismatch = fault == "mismatch" and me

    def strike():  # once the peer reports that it waits inside the operation
        # A fixed sleep was not enough under load: the peer could still be on its way, and
        # the error then named no operation. Its own status says where it is.
        from ..cluster import peer_status

        deadline = time.monotonic() + INSIDE_WAIT
        while (not any(op in peer_status(peer) for op in OPERATION[where])
               and time.monotonic() < deadline):
            time.sleep(0.002)
        time.sleep(STRIKE_DELAY)
        _strike(fault)

    try:
        t = torch.ones(4)
        if where == "before":
            if me:
                _strike(fault)
            dist.all_reduce(t)
        elif where == "collective":
            dist.all_reduce(t)  # one that every rank completes, then one the faulty misses
            if mismatch:
                dist.broadcast(t, src=faulty)
            else:
                if me:
                    strike()
                dist.all_reduce(t)
        elif where == "p2p":
            if not me:  # two messages expected, the faulty rank sends one
                dist.recv(t, src=faulty)
                dist.recv(t, src=faulty)
            else:
                dist.send(t, dst=peer)
                if mismatch:  # both wait to receive: a p2p deadlock
                    dist.recv(t, src=peer)
                else:
                    strike()
                    dist.send(t, dst=peer)
        else:
            from torch.nn.parallel import DistributedDataParallel

            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                        torch.nn.Linear(64, 64))
            ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)  # several buckets

            def hook(grad):  # the first layer's gradient comes last: others are in flight
                if mismatch:
                    dist.broadcast(torch.ones(3), src=faulty)
                elif me:
                    strike()
                return grad

            model[0].weight.register_hook(hook)
            ddp(torch.randn(8, 64)).sum().backward()
    except RuntimeError as exc:
        if _EARLY in str(exc):
            return "returned early"
        raise
    return "done"


def _ok():
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t)


# --- what is left behind -------------------------------------------------------------------

def _alive(pids) -> list[int]:
    import psutil

    left = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
    return left


def _listening_ports(pids) -> set[int]:
    import psutil

    ports = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            ports |= {c.laddr.port for c in psutil.Process(pid).net_connections("inet")
                      if c.status == psutil.CONN_LISTEN}
    return ports


def _still_listening(ports: set[int]) -> list[int]:
    """Which of `ports` some socket on this machine still listens on (/proc/net/tcp*)."""
    bound = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(name) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # TCP_LISTEN
                    bound.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports & bound)


def _scratch(pids) -> set[str]:
    """Scratch entries in the temp dir that belong to clusters of these parents."""
    root = tempfile.gettempdir()
    prefixes = tuple(f"clusterlab-{pid}-" for pid in pids)
    return {n for n in os.listdir(root) if n.startswith(prefixes)}


def _shm() -> set[str]:
    with contextlib.suppress(OSError):
        return set(os.listdir("/dev/shm"))
    return set()


def _wait_gone(pids, path: str | None, limit: float) -> float | None:
    """Seconds until every pid is gone and `path` removed; None if not within `limit`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if not _alive(pids) and not (path and os.path.exists(path)):
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


# --- one repetition ------------------------------------------------------------------------

def _in_process(cl, fault: str, where: str) -> dict:
    """Run the cell in this process's cluster; the fault strikes in a rank or, for an
    interrupt, here."""
    faulty = faulty_rank(fault)
    row: dict = {}
    timer = None
    old_handler = None
    if fault == "interrupt":
        timer = threading.Timer(STRIKE_AFTER, os.kill, (os.getpid(), signal.SIGINT))
        # As a kernel has: a shell starts background jobs with SIGINT ignored, and Python
        # keeps it so (a backgrounded `clusterlab bench faults` measured 0/40 interrupts).
        old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    try:
        if timer:
            timer.start()
        cl.run(cell, fault, where, faulty)
        row.update(error=None, message="run() returned")
    except BaseException as exc:  # noqa: BLE001 - what comes back is the measurement
        t1 = time.monotonic()
        if timer:
            t0 += STRIKE_AFTER  # measured from the interrupt
        notes = "\n".join(getattr(exc, "__notes__", []))
        row.update(error=type(exc).__name__, message=(str(exc) + "\n" + notes).strip(),
                   seconds=round(t1 - t0, 3))
    finally:
        if timer:
            timer.cancel()
        if old_handler is not None:
            signal.signal(signal.SIGINT, old_handler)
    return row


def _parent_main(fault: str, where: str, conn) -> None:
    """A stand-in for a notebook kernel: owns a Cluster, reports it, runs the cell."""
    from ..cluster import Cluster

    os.setpgid(0, 0)  # a process group of its own, as jupyter_client starts a kernel
    cl = Cluster(nodes=WORLD, nic=NIC, timeout=TIMEOUT)
    cl.start()
    cl.run(_ok)
    pids = [p.pid for p in cl._procs] + ([cl._janitor[0]] if cl._janitor else [])
    conn.send((pids, cl._tmp, sorted(_listening_ports(pids))))
    cl.run(cell, fault, where, faulty_rank(fault))


def _killed_parent(fault: str, where: str) -> dict:
    """The process that owns the Cluster is killed from outside while the ranks work."""
    ctx = mp.get_context("fork")
    ours, theirs = ctx.Pipe()
    # Not daemonic: a daemonic process may not start the ranks.
    parent = ctx.Process(target=_parent_main, args=(fault, where, theirs), daemon=False)
    parent.start()
    theirs.close()
    row: dict = {}
    try:
        try:
            if not ours.poll(TIMEOUT * 4):
                raise EOFError
            pids, tmp, ports = ours.recv()
        except (EOFError, OSError):
            return {"error": "ParentFailed", "message": "the parent did not start its cluster",
                    "seconds": None}
        time.sleep(STRIKE_AFTER)
        row.update(pids=pids, tmp=tmp, ports=ports)
        t0 = time.monotonic()
        if fault == "kernel_restart":
            # jupyter_client signals the kernel's whole process group: SIGTERM, then
            # SIGKILL after a grace time (restart_kernel(now=True) sends SIGKILL at once).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(parent.pid, signal.SIGTERM)
            parent.join(1.0)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(parent.pid, signal.SIGKILL)
        parent.kill()
        parent.join(TIMEOUT)
        gone = _wait_gone(pids, tmp, TIMEOUT + SLACK)
        row.update(error=None, message=f"parent ended by {parent.exitcode}",
                   seconds=None if gone is None else round(time.monotonic() - t0, 3))
    finally:
        with contextlib.suppress(Exception):
            parent.kill()
            parent.join(1.0)
        ours.close()
    return row


def _judge(row: dict, fault: str, where: str) -> None:
    """Whether the error is the right one and names the rank and the operation."""
    if fault in PARENT_FAULTS:
        row["named"] = True  # nobody is left to be told; what counts is the cleanup
        row["right_type"] = True
        return
    expected = EXPECTED[fault]
    expected = expected if isinstance(expected, tuple) else (expected,)
    msg = row.get("message") or ""
    row["right_type"] = row.get("error") in expected
    rank_named = f"rank {faulty_rank(fault)}" in msg
    op_named = any(op in msg for op in OPERATION[where])
    row["named"] = bool(rank_named and op_named)


def _children() -> set[int]:
    import psutil

    out = set()
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
    return out


def _machine_state() -> tuple:
    return _children(), _scratch([os.getpid()]), _shm()


def _left_since(state: tuple, exclude=()) -> dict:
    """What appeared since `state` and is still there: processes, scratch, /dev/shm."""
    children, scratch, shm = state
    return {"new_processes": len(_children() - children - set(exclude)),
            "new_files": len(_scratch([os.getpid()]) - scratch),
            "leftover_shm": sorted(_shm() - shm)}


def _repeat(fault: str, where: str, cl_factory, alone: bool = True) -> dict:
    """One repetition of a cell. `alone`: nothing else runs meanwhile, so whatever appears
    on the machine is this repetition's (otherwise the caller diffs around the batch)."""
    row = {"kind": "fault", "fault": fault, "where": where}
    state = _machine_state() if alone else None
    if fault in PARENT_FAULTS:
        row.update(_killed_parent(fault, where))
        pids, ports = row.pop("pids", []), set(row.pop("ports", []))
        tmp = row.pop("tmp", None)
        row["leftover_files"] = int(bool(tmp and os.path.exists(tmp)))
    else:
        cl = cl_factory()
        pids, ports, tmp = [], set(), None
        try:
            cl.start()
            pids = [p.pid for p in cl._procs] + ([cl._janitor[0]] if cl._janitor else [])
            tmp = cl._tmp
            row["next_run_ok_before"] = cl.run(_ok) == [float(WORLD)] * WORLD
            ports = _listening_ports(pids)
            procs = list(cl._procs)
            row.update(_in_process(cl, fault, where))
            for p in procs:
                p.join(1.0)
            # A rank that crashed by itself (not killed by the fault or the teardown).
            row["crashed"] = [p.exitcode for p in procs if p.exitcode in CRASHES]
        except Exception as exc:  # noqa: BLE001 - the warm-up failed: recorded, not fatal
            row.update(next_run_ok_before=False, error=f"warm-up: {type(exc).__name__}",
                       message=str(exc), seconds=None)
        finally:
            cl.close()
        row["leftover_files"] = int(bool(tmp and os.path.exists(tmp)))
    time.sleep(0.05)
    row["leftover_processes"] = len(_alive(pids))
    row["leftover_shm"] = []
    if state is not None:
        extra = _left_since(state, exclude=pids)  # those were counted above
        row["leftover_processes"] += extra["new_processes"]
        row["leftover_files"] += extra["new_files"]
        row["leftover_shm"] = extra["leftover_shm"]
    row["ports_bound"] = _still_listening(ports)
    row["ports_seen"] = len(ports)
    _judge(row, fault, where)
    row["message"] = (row.get("message") or "")[:600]
    tick()  # one cell of the matrix (also from the threads that wait for timeouts)
    return row


def matrix(*, repeats: int, only: list[tuple[str, str]] | None = None) -> list[dict]:
    """Rows of the fault matrix; each row also records whether the NEXT new cluster's first
    run() succeeded."""
    # DistributedDataParallel's first construction imports torch._dynamo (~4 s here): do it
    # once in this process, which the ranks are forked from, not within a cell's timeout.
    import torch._dynamo  # noqa: F401

    from ..cluster import Cluster

    def factory():
        return Cluster(nodes=WORLD, nic=NIC, timeout=TIMEOUT)

    order = only or cells()
    jobs = [(f, w) for f, w in order for _ in range(repeats)]
    # One after another: the next row's first run() is "the next run() on a new cluster".
    rows = [_repeat(f, w, factory) for f, w in jobs if f not in WAIT_FOR_TIMEOUT]
    for prev, row in zip(rows, rows[1:], strict=False):
        prev["next_run_ok"] = row.get("next_run_ok_before")
    # Faults reported by the timeout only wait: PARALLEL of them side by side, then one
    # new cluster must run; what appears on the machine is diffed around each batch.
    waits = [j for j in jobs if j[0] in WAIT_FOR_TIMEOUT]
    for first in range(0, len(waits), PARALLEL):
        chunk = waits[first:first + PARALLEL]
        state = _machine_state()
        with ThreadPoolExecutor(len(chunk)) as pool:
            futures = [pool.submit(_repeat, f, w, factory, alone=False) for f, w in chunk]
            part = [fut.result() for fut in futures]
        time.sleep(0.05)
        extra = _left_since(state)
        part[0]["leftover_processes"] += extra["new_processes"]
        part[0]["leftover_files"] += extra["new_files"]
        part[0]["leftover_shm"] = extra["leftover_shm"]
        fresh = _fresh_run_ok(factory)
        for r in part:
            r.update(parallel=len(chunk), next_run_ok=fresh)
        rows += part
    for row in rows:
        if row.get("next_run_ok") is None:
            row["next_run_ok"] = _fresh_run_ok(factory)
        row.pop("next_run_ok_before", None)
    rank = {c: i for i, c in enumerate(order)}
    rows.sort(key=lambda r: rank[(r["fault"], r["where"])])
    seen: dict = {}
    for row in rows:
        key = (row["fault"], row["where"])
        row["repeat"] = seen[key] = seen.get(key, -1) + 1
    return rows


def _fresh_run_ok(factory) -> bool:
    try:
        with factory() as cl:
            return cl.run(_ok) == [float(WORLD)] * WORLD
    except Exception:  # noqa: BLE001 - a failure is what this records
        return False


def matrix_checks(rows: list[dict]) -> list[dict]:
    faults = [r for r in rows if r.get("kind") == "fault"]
    n = len(faults)
    limit = TIMEOUT + SLACK

    def count(pred):
        return sum(1 for r in faults if pred(r))

    seconds = [r["seconds"] for r in faults if r.get("seconds") is not None]
    reps_of = Counter(f"{r['fault']} x {r['where']}" for r in faults)
    slow = count(lambda r: r.get("seconds") is None or r["seconds"] > limit)
    cells_seen = len({(r["fault"], r["where"]) for r in faults})
    reps = min((sum(1 for r in faults if (r["fault"], r["where"]) == c)
                for c in {(r["fault"], r["where"]) for r in faults}), default=0)
    return [
        check("faults: matrix cells x repetitions", "every cell, each repeated",
              f"{cells_seen} cells x >= {reps} = {n} runs", cells_seen > 0 and reps >= 1),
        check("faults: the expected error type", f"{n}/{n}",
              f"{count(lambda r: r['right_type'])}/{n}", count(lambda r: r["right_type"]) == n),
        check("faults: message names the rank and the operation", f"{n}/{n}",
              f"{count(lambda r: r['named'])}/{n}", count(lambda r: r["named"]) == n),
        check("faults: time to the error", f"<= timeout + {SLACK:g} s = {limit:g} s",
              f"max {max(seconds, default=0):.2f} s, {slow} over", slow == 0),
        check("faults: leftover processes", "0",
              sum(r["leftover_processes"] for r in faults),
              sum(r["leftover_processes"] for r in faults) == 0),
        check("faults: leftover scratch files and /dev/shm segments", "0",
              sum(r["leftover_files"] + len(r["leftover_shm"]) for r in faults),
              sum(r["leftover_files"] + len(r["leftover_shm"]) for r in faults) == 0),
        check("faults: ports still bound", "0", sum(len(r["ports_bound"]) for r in faults),
              sum(len(r["ports_bound"]) for r in faults) == 0),
        check("faults: ranks that crashed by themselves (SIGSEGV, SIGABRT, ...)", "0",
              ", ".join(f"{cell}: {k} of {reps_of[cell]}" for cell, k in sorted(Counter(
                  f"{r['fault']} x {r['where']}" for r in faults if r.get("crashed")).items()))
              or 0,
              not any(r.get("crashed") for r in faults)),
        check("faults: the next run() on a new cluster succeeds", f"{n}/{n}",
              f"{count(lambda r: r['next_run_ok'])}/{n}", count(lambda r: r["next_run_ok"]) == n),
    ]


@bench("faults")
def faults(quick: bool = False) -> dict:
    rows = matrix(repeats=QUICK_REPEATS if quick else REPEATS)
    checks = matrix_checks(rows)
    from . import faults_input

    in_rows, in_checks = faults_input.checks(quick)
    return result("faults", rows + in_rows, checks + in_checks)
