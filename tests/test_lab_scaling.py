"""Lab 07 (gradient scaling): the reference answers pass every check, hidden ones included,
and plausible wrong answers are rejected by the intended check with the sentence that
teaches. Every check runs real DDP on real ranks."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from clusterlab.labs import run_checks

# --- the reference answers (what solutions/07_gradient_scaling.ipynb writes) -----------------


def naive_loss(ddp, x, y):
    return F.mse_loss(ddp(x), y)


def mean_of_means_weights(batch_sizes):
    n, w = sum(batch_sizes), len(batch_sizes)
    return [n / (w * b) for b in batch_sizes]


def _global(count: float) -> float:
    n = torch.tensor([count], dtype=torch.float64)
    dist.all_reduce(n)
    return n.item()


def global_mean_loss(ddp, x, y):
    return F.mse_loss(ddp(x), y, reduction="sum") * dist.get_world_size() / _global(len(x))


def token_loss(ddp, x, y, mask):
    err = (ddp(x) - y).squeeze(-1) ** 2
    tokens = _global(float(mask.sum()))
    return (err * mask).sum() * dist.get_world_size() / tokens


def accumulate(ddp, micro_batches):
    scale = dist.get_world_size() / _global(float(sum(len(x) for x, _ in micro_batches)))
    for i, (x, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else ddp.no_sync():
            (F.mse_loss(ddp(x), y, reduction="sum") * scale).backward()


REFERENCE = {"naive_loss": naive_loss, "mean_of_means_weights": mean_of_means_weights,
             "global_mean_loss": global_mean_loss, "token_loss": token_loss,
             "accumulate": accumulate}

# --- wrong answers ------------------------------------------------------------------------------


def weights_all_ones(batch_sizes):  # "DDP gets it right"
    return [1.0] * len(batch_sizes)


def naive_already_fixed(ddp, x, y):  # skips the measurement step
    return global_mean_loss(ddp, x, y)


def mean_of_means(ddp, x, y):  # the usual mean loss, left as it is
    return F.mse_loss(ddp(x), y)


def world_twice(ddp, x, y):  # divides by N and forgets that DDP divides by W again
    return F.mse_loss(ddp(x), y, reduction="sum") / _global(len(x))


def local_count(ddp, x, y):  # times W, but the local count instead of the global one
    return F.mse_loss(ddp(x), y, reduction="sum") * dist.get_world_size() / len(x)


def empty_rank_skips(ddp, x, y):  # an empty rank returns a constant: DDP needs it too
    if len(x) == 0:
        return torch.zeros((), dtype=x.dtype)
    return global_mean_loss(ddp, x, y)


def per_sequence_mean(ddp, x, y, mask):  # every sequence counts once, not every token
    err = (ddp(x) - y).squeeze(-1) ** 2
    return ((err * mask).sum(1) / mask.sum(1)).mean()


def padding_counted(ddp, x, y, mask):  # the mask forgotten
    return F.mse_loss(ddp(x), y)


def accumulate_divide_by_k(ddp, micro_batches):  # the textbook loss / k
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == k - 1 else ddp.no_sync():
            (F.mse_loss(ddp(x), y) / k).backward()


def accumulate_no_division(ddp, micro_batches):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == k - 1 else ddp.no_sync():
            F.mse_loss(ddp(x), y).backward()


def accumulate_never_sync(ddp, micro_batches):  # no_sync on the last micro-batch too
    scale = dist.get_world_size() / _global(float(sum(len(x) for x, _ in micro_batches)))
    with ddp.no_sync():
        for x, y in micro_batches:
            (F.mse_loss(ddp(x), y, reduction="sum") * scale).backward()


def accumulate_sync_every(ddp, micro_batches):  # right numbers, k all-reduces
    scale = dist.get_world_size() / _global(float(sum(len(x) for x, _ in micro_batches)))
    for x, y in micro_batches:
        (F.mse_loss(ddp(x), y, reduction="sum") * scale).backward()


def accumulate_forward_outside(ddp, micro_batches):  # only backward under no_sync
    scale = dist.get_world_size() / _global(float(sum(len(x) for x, _ in micro_batches)))
    for i, (x, y) in enumerate(micro_batches):
        loss = F.mse_loss(ddp(x), y, reduction="sum") * scale
        with contextlib.nullcontext() if i == len(micro_batches) - 1 else ddp.no_sync():
            loss.backward()


def accumulate_sync_first(ddp, micro_batches):  # the synchronised backward comes first
    scale = dist.get_world_size() / _global(float(sum(len(x) for x, _ in micro_batches)))
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == 0 else ddp.no_sync():
            (F.mse_loss(ddp(x), y, reduction="sum") * scale).backward()


# (exercise, learner name, wrong function, words in the failing check's name, phrase)
WRONG = [
    ("scale_naive", "mean_of_means_weights", weights_all_ones, "N / (W n_r)",
     "1 is the weight every sample SHOULD get"),
    ("scale_naive", "naive_loss", naive_already_fixed, "mean of means your weights",
     "already gives the full-batch gradient"),
    ("scale_uneven", "global_mean_loss", mean_of_means, "8/16/32/64", "this is the mean of means"),
    ("scale_uneven", "global_mean_loss", world_twice, "8/16/32/64", "divides twice"),
    ("scale_uneven", "global_mean_loss", local_count, "8/16/32/64",
     "divided by the local count"),
    ("scale_uneven", "global_mean_loss", empty_rank_skips, "0 samples",
     "an empty rank must still run ddp(x) and backward"),
    ("scale_sum_mean", "token_loss", per_sequence_mean, "padded sequences",
     "this is a per-sequence mean"),
    ("scale_sum_mean", "token_loss", padding_counted, "padded sequences", "padding included"),
    ("scale_accumulate", "accumulate", accumulate_divide_by_k, "full-batch gradient over all",
     "divides each micro-batch's MEAN loss by k"),
    ("scale_accumulate", "accumulate", accumulate_no_division, "full-batch gradient over all",
     "nothing divides by the number of micro-batches"),
    ("scale_accumulate", "accumulate", accumulate_never_sync, "one bucket set",
     "no_sync on the last micro-batch"),
    ("scale_accumulate", "accumulate", accumulate_sync_every, "one bucket set",
     "k all-reduces per step"),
    ("scale_accumulate", "accumulate", accumulate_forward_outside, "one bucket set",
     "DDP decides in forward"),
    ("scale_accumulate", "accumulate", accumulate_sync_first, "full-batch gradient over all",
     "the synchronised backward must be the LAST one"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("exercise", ["scale_naive", "scale_uneven", "scale_sum_mean",
                                      "scale_accumulate"])
def test_reference_passes_visible_checks(exercise, no_leftovers):
    # The hidden checks of the solved notebook run under nbval (test.sh, strict): here the
    # reference only has to pass what the wrong answers below are compared against.
    report = run_checks(exercise, REFERENCE, hidden=False)
    assert report.passed, report.text()
    assert all(o.status in ("pass", "skip") for o in report.outcomes), report.text()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("exercise", "name", "wrong", "check", "phrase"), WRONG,
                         ids=[w[2].__name__ for w in WRONG])
def test_wrong_answer_is_rejected(exercise, name, wrong, check, phrase, no_leftovers):
    report = run_checks(exercise, {**REFERENCE, name: wrong}, hidden=True)
    failed = [o for o in report.outcomes if check in o.check]
    assert failed, f"no check of {exercise} is named like {check!r}"
    assert failed[0].status == "fail", report.text()
    assert phrase in failed[0].message, failed[0].message
    assert not report.passed
    if wrong in (accumulate_sync_every, accumulate_forward_outside):
        # k synchronised backwards still give the right numbers (each adds the mean of the
        # new local gradients to an identical total): only the count rejects them.
        grad = [o for o in report.outcomes if "full-batch gradient over all" in o.check]
        assert grad[0].status == "pass", report.text()




def global_w_hard_coded(ddp, x, y):
    """Probe item 9: `* 4`, the visible world size, instead of dist.get_world_size()."""
    return F.mse_loss(ddp(x), y, reduction="sum") * 4 / _global(len(x))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", [1, 2026, 5])
def test_probe_a_hard_coded_world_size_fails_the_hidden_checks_at_every_seed(seed,
                                                                             no_leftovers):
    """Accepted at grader seed 1 before: the hidden checks drew W = 4, the visible one's."""
    report = run_checks("scale_uneven", {**REFERENCE, "global_mean_loss": global_w_hard_coded},
                        hidden=True, seed=seed)
    status = {o.check.split(",")[0]: o.status for o in report.outcomes}
    assert list(status.values()) == ["pass", "fail", "fail"], report.text()


def test_hidden_world_sizes_avoid_the_visible_one():
    from clusterlab.labs.core import Context
    from clusterlab.labs.scaling import _hidden_world

    for visible in (2, 3, 4):
        drawn = {_hidden_world(Context({}, seed=s, hidden=True), visible) for s in range(40)}
        assert visible not in drawn and len(drawn) == 2, drawn


def global_from_mean(ddp, x, y):  # a correct alternative (probe): NaN loss, zero gradient
    n = _global(len(x))
    return F.mse_loss(ddp(x), y) * len(x) * dist.get_world_size() / n


@pytest.mark.timeout(240)
def test_probe_alternative_mean_times_count_passes_even_with_an_empty_rank(no_leftovers):
    report = run_checks("scale_uneven", {**REFERENCE, "global_mean_loss": global_from_mean},
                        hidden=True, seed=1)
    assert report.passed, report.text()
