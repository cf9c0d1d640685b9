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


def durations(per_rank_spans) -> np.ndarray:
    """Per repeat: the last rank's exit minus the last rank's entry.

    `per_rank_spans[rank][repeat] = (entry, exit)` in seconds of one shared clock."""
    spans = np.asarray(per_rank_spans, dtype=np.float64)  # rank, repeat, (entry, exit)
    return spans[:, :, 1].max(axis=0) - spans[:, :, 0].max(axis=0)
