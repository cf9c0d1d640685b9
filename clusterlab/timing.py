"""Timing an operation that every rank enters: from the last entry to the last exit.

All ranks of a cluster share one clock, so each can stamp its own entry and exit, and the
parent combines them afterwards. Timing each rank from its own entry would add how
unevenly the ranks left whatever came before (a barrier's exit is spread by the network's
jitter and by the ranks' wake-ups on a busy machine), which is not the operation's cost.
"""

from __future__ import annotations

import numpy as np

from . import clock


def all_reduce_spans(sizes, repeats: int) -> dict[int, list[tuple[float, float]]]:
    """On every rank: (entry, exit) emulated times of `repeats` all_reduces of each size,
    each after a barrier, after one untimed warm-up."""
    import torch
    import torch.distributed as dist

    out = {}
    for n in sizes:
        x = torch.ones(max(1, n // 4))
        dist.all_reduce(x)
        spans = []
        for _ in range(repeats):
            dist.barrier()
            t0 = clock.now()
            dist.all_reduce(x)
            spans.append((t0, clock.now()))
        out[n] = spans
    return out


def durations(per_rank_spans, since: str = "last") -> np.ndarray:
    """Per repeat: the last rank's exit minus the `since` ("last" or "first") rank's entry.

    `per_rank_spans[rank][repeat] = (entry, exit)` on one shared clock. "first" never
    undercuts an algorithm's critical path (every message chain starts when some rank
    enters) but counts late barrier exits; "last" is the operation once everyone is in."""
    spans = np.asarray(per_rank_spans, dtype=np.float64)  # rank, repeat, (entry, exit)
    entries = spans[:, :, 0]
    if since not in ("last", "first"):
        raise ValueError(f"since must be 'last' or 'first', got {since!r}")
    start = entries.max(axis=0) if since == "last" else entries.min(axis=0)
    return spans[:, :, 1].max(axis=0) - start
