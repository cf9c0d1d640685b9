"""What the experiments (and the labs' measurements) share to run on real ranks.

* `use_or_open` - the caller's open cluster (left open, its size checked) or a new one for
  the block, closed on exit;
* `preload_ddp` - DDP's lazy imports, loaded once in this process before ranks fork;
* `first_ranks`, `release` - a subgroup of a cluster's first n ranks, for a run on part of it;
* `describe_error` - a launcher error as plain data (type, ranks, one-line message);
* `conclude` - a measured conclusion: asserted, or said to be not shown on this run when the
  machine was demonstrably busy; `beyond_closed_form` - that evidence from runs far above their
  closed form (`load_per_core` - the other evidence, the load average);
* `marked_processes` - the live processes a torchrun job marked in their environment.

Nothing here imports torch at module level: the functions that run on ranks import it.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ..cluster import Cluster, ClusterTimeout, RankDied, RankError
from ..cores import usable_cores


@contextlib.contextmanager
def use_or_open(cluster: Cluster | None = None, *, ranks: int | None = None,
                min_ranks: int | None = None, ddp: bool = False,
                start: Callable[..., Cluster] = Cluster, **options) -> Iterator[Cluster]:
    """`cluster` if given (an open cluster, left open), else `start(**options)` (by default a
    new `Cluster(**options)`), started for the block and closed on exit.

    ranks / min_ranks: how many ranks the run needs, exactly or at least; a given cluster of
    another size is refused (ValueError) before anything runs on it.
    ddp: load DDP's lazy imports (`preload_ddp`) first, so a new cluster's ranks inherit them.
    """
    if cluster is not None:
        have = cluster.world_size
        if ranks is not None and have != ranks:
            raise ValueError(f"this run needs {ranks} ranks, the cluster has {have}")
        if min_ranks is not None and have < min_ranks:
            raise ValueError(f"this run needs at least {min_ranks} ranks, the cluster has "
                             f"{have}")
        yield cluster
        return
    if ddp:
        preload_ddp()
    with start(**options) as cl:
        yield cl


def preload_ddp() -> None:
    """Import what DDP's constructor imports lazily (torch._dynamo, ~1.5 s of CPU), once, in
    this process, before a cluster for DDP starts: ranks start by fork, so they inherit it
    instead of each importing it at the same time on a 2-core machine (several seconds).
    Called before starting a cluster that runs DDP; not at import, because every rank forked
    afterwards carries it (~30 MB each), DDP or not."""
    import torch._dynamo  # noqa: F401
    import torch.distributed.algorithms.ddp_comm_hooks.default_hooks  # noqa: F401
    import torch.distributed.algorithms.join  # noqa: F401
    import torch.nn.parallel  # noqa: F401


def first_ranks(ranks: int | None):
    """(group, members) for a run on the first `ranks` ranks of the cluster: (None, all) for
    the whole world; (False, members) on a rank that is not a member. Every rank must call it
    (creating a group is collective); members call `release(group)` when done."""
    import torch.distributed as dist

    world = dist.get_world_size()
    n = world if ranks is None else int(ranks)
    if not 1 <= n <= world:
        raise ValueError(f"ranks must be in 1..{world}, got {ranks}")
    members = list(range(n))
    if n == world:
        return None, members
    group = dist.new_group(members)
    if dist.get_rank() >= n:
        release(group)
        return False, members
    return group, members


def release(group) -> None:
    """Destroy a subgroup made by `first_ranks` (nothing for the world group)."""
    import torch.distributed as dist

    if group not in (None, False):
        with contextlib.suppress(Exception):
            dist.destroy_process_group(group)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _tidy(message: str) -> str:
    """Shorten torch's collective fingerprints to what a person needs to read, and drop the
    source locations ("[/path/to/pair.cc:537] ") that Gloo puts in its messages."""
    message = re.sub(r", TensorDeviceTypes=TensorOptions\(.*?\)\)\)", ")", message)
    message = re.sub(r"\[?/(?:[\w.-]+/)+[\w.-]+(?::\d+)?\]?\s*", "", message)
    message = re.sub(r"\s+", " ", message)
    message = re.sub(r"(?<=[A-Za-z0-9])vs ", " vs ", message)
    message = re.sub(r"\.(?=Collectives differ)", ". ", message)
    return message.strip()


def describe_error(exc: BaseException) -> dict:
    """A launcher error as plain data: its type, the ranks it names, and a one-line message
    (the remote traceback and the Python stacks are left out: they hold machine paths)."""
    if isinstance(exc, RankError):
        ranks, message = [exc.rank], f"rank {exc.rank} raised {exc.kind}: {_tidy(exc.message)}"
    elif isinstance(exc, ClusterTimeout):
        message = _first_line(str(exc))
        found = re.search(r"ranks still busy: \[([\d, ]*)\]", message)
        ranks = [int(r) for r in found[1].split(",") if r.strip()] if found else []
    elif isinstance(exc, RankDied):
        message = _first_line(str(exc))
        ranks = [int(r) for r in re.findall(r"rank (\d+) died", message)]
    else:
        ranks, message = [], f"{type(exc).__name__}: {_first_line(str(exc))}"
    return {"error": type(exc).__name__, "ranks": ranks, "message": message}


# A run this much slower than its closed form measured the machine, not the network: the
# emulator adds no time beyond the closed form on its own except its own small overheads (the
# notebooks' assertions allow it a few percent), so 30 % more is processes waiting for a core.
BUSY_FACTOR = 1.3

# The 1-minute load average counts the processes running or waiting for a core. Above 2 per
# core, every process that wants a core waits on average at least as long as it runs, so a
# measured time is as much the queue for the CPUs as the emulated network. (The experiments'
# own ranks mostly sleep in the emulator and add little to it.)
BUSY_LOAD_PER_CORE = 2.0


def load_per_core() -> float:
    """This machine's 1-minute load average divided by the cores this process may use (0.0
    where the system does not report one, so that a failing conclusion is then asserted, not
    excused). The load average counts the whole machine, so a kernel pinned to one core or
    limited to one core's quota divides it by one: there, every other busy process competes
    for what the notebook can get, and dividing by all the machine's cores would call a
    crowded core quiet."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0
    return load / usable_cores()


def beyond_closed_form(pairs: Iterable[tuple[float, float]], *,
                       factor: float = BUSY_FACTOR) -> str | None:
    """The evidence, as a short phrase for `conclude(busy=...)`, that this machine and not the
    emulated network set some of the measured times: the (measured, closed form) pairs, in
    seconds, whose measurement exceeds `factor` times its closed form; None if there is none."""
    if factor <= 1:
        raise ValueError(f"factor must be above 1, got {factor}")
    slow = [f"{measured * 1e3:.0f} ms against {model * 1e3:.0f} ms"
            for measured, model in pairs if measured > factor * model]
    if not slow:
        return None
    return (f"{'runs' if len(slow) > 1 else 'a run'} above {factor:g}x the closed form: "
            + "; ".join(slow))


def conclude(holds: bool, claim: str, *, busy: str | None = None) -> bool:
    """One measured conclusion of a notebook, robust on a busy machine.

    When `holds`, prints "Shown on this run: <claim>." and returns True, so that the learner
    reads each verdict the run reached, not only the failures. Otherwise, when the machine was
    demonstrably busy - `busy`, the caller's own evidence as a short phrase (e.g. from
    `beyond_closed_form`), or, when None, a load average above BUSY_LOAD_PER_CORE - prints one
    plain sentence saying that the claim is not shown on this run and why, and returns False.
    Otherwise (a quiet machine) raises AssertionError naming the claim: there, a conclusion
    that does not hold is a real failure. Only fragile measured comparisons belong here; what
    must hold physically (the emulated network is never early) stays a plain assert."""
    if not isinstance(claim, str) or not claim.strip():
        raise ValueError("claim must be a sentence saying what the run should show")
    if busy is not None and (not isinstance(busy, str) or not busy.strip()):
        raise ValueError("busy must be None or a short phrase giving the evidence")
    if bool(holds):
        print(f"Shown on this run: {claim.strip().rstrip('.')}.")
        return True
    if busy is None:
        load = load_per_core()
        if load <= BUSY_LOAD_PER_CORE:
            raise AssertionError(f"not shown on a quiet machine (load average {load:.1f} per "
                                 f"core): {claim}")
        cores = usable_cores()
        busy = f"load average {load:.1f} per core on {cores} core{'s' if cores > 1 else ''}"
    print(f"Not shown on this run: {claim} ({busy}; processes waiting for a core, not the "
          f"emulated network, set the time here: rerun on a quieter machine).")
    return False


def marked_processes(env: str, value: str) -> list[int]:
    """Live processes other than this one whose environment holds `env=value`: a torchrun
    job marks its agents and workers so, and they are found (and cleaned up) even after the
    launcher that started them is gone."""
    marker = f"{env}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found
