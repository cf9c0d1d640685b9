"""What the experiments (and the labs' measurements) share to run on real ranks.

* `use_or_open` - the caller's open cluster (left open, its size checked) or a new one for
  the block, closed on exit;
* `preload_ddp` - DDP's lazy imports, loaded once in this process before ranks fork;
* `first_ranks`, `release` - a subgroup of a cluster's first n ranks, for a run on part of it;
* `describe_error` - a launcher error as plain data (type, ranks, one-line message).

Nothing here imports torch at module level: the functions that run on ranks import it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

from ..cluster import Cluster, ClusterTimeout, RankDied, RankError


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
